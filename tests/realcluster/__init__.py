"""The real Kubernetes control plane for the `realcluster` tests: built from the Go modules beside
this file (`build`), started on loopback (`controlplane`: one kube-apiserver, or several over the one
etcd behind a balancer, `loadbalancer`, as an HA control plane runs them, any of them made to lag on
webhook configurations), with the gate installed as a user installs it (`gate`).
`python -m tests.realcluster up [--apiservers N]` runs the same for people; `build` only builds."""
