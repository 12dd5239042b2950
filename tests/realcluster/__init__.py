"""The real Kubernetes control plane for the `realcluster` tests: built from the Go modules beside
this file (`build`), started on loopback (`controlplane`), with the gate installed as a user installs
it (`gate`). `python -m tests.realcluster up` runs the same for people; `build` only builds."""
