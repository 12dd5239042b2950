"""The simulated control plane: one model of how the API server and the built-in controllers delete
things, with two faces — virtual time in-process (tests, `plan`, `simulate`) and real time behind the
HTTP API stand-in (`serve --embedded`).

    store.py        objects, uid/resourceVersion, finalizers, deletionTimestamp, admission, watch events
    webhooks.py     the registered validating webhooks and which requests each reviews
    controllers/    namespace controller, CRD cleanup, garbage collector, the operators' finalizers
    clients.py      ManifestWork agent, kubectl delete -f, namespace deletion: each with its retries
    timeline.py     what happened, in virtual time; text and JSON
    cluster.py      store + gate + controllers + clients; load, teardown, run, verdict
    apiserver/      the HTTP API stand-in over the store (with schema/, tables.py, jsonpath.py,
                    protobuf.py, webhook_client.py, kubeconfig.py)
"""
