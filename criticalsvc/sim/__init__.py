"""The simulated control plane: one model of how the API server and the built-in controllers delete
things, with two faces — virtual time in-process (tests, `plan`, `simulate`) and real time behind the
HTTP API stand-in (`serve --embedded`).

    store.py       objects, uid/resourceVersion, finalizers, deletionTimestamp, admission, watch events
"""
