// The Open Cluster Management API module, for its ManifestWork and AppliedManifestWork CRDs
// (work/v1/*.crd.yaml), which the realcluster tests install on the test control plane. Nothing is
// built from it: tests/realcluster/ocmcrds.py runs `go mod download` here (go.sum checks the module)
// and copies the two CRD files into the realcluster cache. No Go file imports it, so `go mod tidy`
// would drop the requirement: edit this file and go.sum by hand (`go mod download -json
// open-cluster-management.io/api@VERSION` prints both sums).
module criticalsvc.io/realcluster/ocm-api-1.3

go 1.26.0

require open-cluster-management.io/api v1.3.0
