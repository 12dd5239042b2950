"""The "coming from X" examples of api/examples/ (README, "Coming from another tool"), applied as a user
applies them, on both clusters (the stand-in and the real control plane, through the `cluster` fixture).

Each test runs the commands the example's header comment shows and asserts what kubectl answers, then
removes everything it made in an order the gate allows (the real cluster is shared by the session, and
a protected object left behind would keep its namespace Terminating). The object-lock and the
NetworkPolicies-outlive-pods examples have their own modules (tests/test_clusters_updates.py,
tests/test_clusters_namespace_order.py); the reference story is tests/test_clusters_teardown.py's.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from tests.backends import Backend, ok
from tests.realcluster.teardown import wait_for

EXAMPLES = Path(__file__).resolve().parents[1] / "api" / "examples"
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
LABEL = "criticalsvc.io/deletion-protected"


def _apply(cluster: Backend, example: str, *, without: Iterable[str] = ()) -> None:
    """`kubectl apply -f` until it succeeds: custom resources in the same file need their CRD established
    first (kubectl's "ensure CRDs are installed first"), so a user applies such a file twice. Documents
    named in `without` are left out."""
    path = EXAMPLES / example
    text = path.read_text(encoding="utf-8")
    if without:
        docs = [d for d in yaml.safe_load_all(text) if d and d["metadata"]["name"] not in without]
        text = yaml.safe_dump_all(docs)
    last: list[subprocess.CompletedProcess[str]] = []

    def applied() -> bool:
        last[:] = [cluster.kubectl("apply", "-f", "-", input=text)]
        return last[0].returncode == 0

    wait_for(applied, timeout=60, what=f"kubectl apply -f {example} to succeed ({last and last[0].stderr})",
             interval=0.5)


def _refused(result: subprocess.CompletedProcess[str], *needles: str) -> bool:
    return result.returncode != 0 and "denied the request" in result.stderr and all(n in result.stderr
                                                                                    for n in needles)


def _dry_delete(cluster: Backend, *target: str) -> subprocess.CompletedProcess[str]:
    # --dry-run=server: the API server runs admission (the gate) and deletes nothing.
    return cluster.kubectl("delete", *target, "--dry-run=server", "--wait=false")


def _wait_refused(cluster: Backend, target: tuple[str, ...], *needles: str, what: str, timeout: float = 60) -> None:
    """Poll a server-side dry-run DELETE of `target` until the gate refuses it with every needle; a timeout
    names the last answer."""
    last: list[str] = [""]

    def refused() -> bool:
        answer = _dry_delete(cluster, *target)
        last[0] = answer.stderr.strip() or answer.stdout.strip()
        return _refused(answer, *needles)

    try:
        wait_for(refused, timeout=timeout, what=what, interval=0.5)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last answer to kubectl delete {' '.join(target)}: {last[0]}") from None


def _remove(cluster: Backend, paths: Iterable[str], timeout: float = 120) -> None:
    """DELETE each path in turn until it is gone (the gate may refuse it until what came before is)."""
    for path in paths:
        wait_for(lambda p=path: cluster.admin.delete(p).status_code == 404 and not cluster.admin.exists(p),
                 timeout=timeout, what=f"{path} to be gone", interval=0.5)


def test_labelled_objects_example(cluster: Backend) -> None:
    """Karmada / OpenKruise `Always`: each labelled object (and its Namespace) is refused, by the label."""
    _apply(cluster, "labelled-objects.yaml")
    ns = "protected-demo"
    try:
        for kind, name in (("configmap", "settings"), ("service", "frontend"),
                           ("persistentvolumeclaim", "data")):
            refused = cluster.kubectl("delete", kind, name, "-n", ns, "--wait=false")
            assert _refused(refused, f"{ns}/{name} is labelled {LABEL}=Always; remove the label to delete it"), \
                refused.stderr
        refused = cluster.kubectl("delete", "namespace", ns, "--wait=false")
        assert _refused(refused, f"namespaces {ns} is labelled {LABEL}=Always"), refused.stderr
        ok(cluster.kubectl("label", "configmap", "settings", "-n", ns, f"{LABEL}-"))
        ok(cluster.kubectl("delete", "configmap", "settings", "-n", ns, "--wait=false"))
    finally:
        for target in (("service", "frontend", "-n", ns), ("persistentvolumeclaim", "data", "-n", ns),
                       ("configmap", "settings", "-n", ns), ("namespace", ns)):
            cluster.kubectl("label", *target, f"{LABEL}-", "--overwrite")
        ok(cluster.kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found"))
        wait_for(lambda: not cluster.admin.exists(f"/api/v1/namespaces/{ns}"), timeout=120,
                 what=f"namespace {ns} to be gone")


def test_openkruise_cascading_example(cluster: Backend) -> None:
    """OpenKruise `Cascading`: the namespace waits for its workloads with replicas > 0 (and their active
    Pods), the CRD for its custom resources; scaling to zero and deleting the Widget lift both."""
    _apply(cluster, "openkruise-cascading.yaml")
    ns, crd = "kruise-demo", "widgets.kruise-demo.example.com"
    try:
        _wait_refused(cluster, ("namespace", ns), "CriticalService kruise-demo-cascading", "deployments.apps",
                      what="the namespace to be refused for its Deployment with replicas > 0")
        _wait_refused(cluster, ("crd", crd), "CriticalService widgets-crd-cascading", "kruise-demo/first",
                      what="the CRD to be refused while a Widget exists")
        ok(cluster.kubectl("scale", "deployment", "worker", "-n", ns, "--replicas=0"))
        # Its Pods (Running on the real control plane, Pending on the stand-in: active either way) go with the
        # scale-down, gracefully where they run.
        wait_for(lambda: _dry_delete(cluster, "namespace", ns).returncode == 0, timeout=90,
                 what="the namespace to be deletable once nothing in it is active")
        ok(cluster.kubectl("delete", "widget", "first", "-n", ns))
        wait_for(lambda: _dry_delete(cluster, "crd", crd).returncode == 0, timeout=60,
                 what="the CRD to be deletable once no Widget exists")
    finally:
        ok(cluster.kubectl("scale", "deployment", "worker", "-n", ns, "--replicas=0"))
        _remove(cluster, (f"/apis/kruise-demo.example.com/v1/namespaces/{ns}/widgets/first",
                          f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}",
                          f"/api/v1/namespaces/{ns}",
                          f"{CRITICAL_SERVICES}/kruise-demo-cascading", f"{CRITICAL_SERVICES}/widgets-crd-cascading",
                          f"{CLUSTERROLES}/criticalsvc-read-kruise-demo"))


def test_appcat_example(cluster: Backend) -> None:
    """VSHN AppCat: the instance's namespace and its labelled PVCs wait for the composite; on the real
    control plane, a composite the gate may not read makes it refuse, naming the missing grant."""
    ns, pvc = "vshn-postgresql-pg1", "data-pg1-0"
    composite = "/apis/appcat.example.io/v1/xpostgresqls/pg1"
    if cluster.name == "real":
        # The composite type unreadable: the gate does not guess that pg1 is gone.
        _apply(cluster, "appcat.yaml", without={"criticalsvc-read-xpostgresqls"})
        missing = "the gate may not list xpostgresqls.appcat.example.io (403 Forbidden)"
        _wait_refused(cluster, ("namespace", ns), missing,
                      what="the namespace to be refused, naming the missing grant, while the composite type cannot "
                      "be read")
    _apply(cluster, "appcat.yaml")
    gone = "xpostgresqls.appcat.example.io pg1 still exists"
    try:
        _wait_refused(cluster, ("namespace", ns), "CriticalService appcat-pg1-namespace", gone,
                      what="the namespace to be refused while the composite exists")
        _wait_refused(cluster, ("pvc", pvc, "-n", ns), "CriticalService appcat-pg1-data", gone,
                      what="the labelled PVC to be refused while the composite exists")
        # An unlabelled PVC in the same namespace is not the selector's.
        ok(cluster.kubectl("create", "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "scratch", "namespace": ns},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})))
        ok(_dry_delete(cluster, "pvc", "scratch", "-n", ns))
        ok(cluster.kubectl("delete", "xpostgresql", "pg1"))
        wait_for(lambda: _dry_delete(cluster, "namespace", ns).returncode == 0
                 and _dry_delete(cluster, "pvc", pvc, "-n", ns).returncode == 0,
                 timeout=60, what="the namespace and the PVC to be deletable once the composite is gone")
    finally:
        _remove(cluster, (composite, f"/api/v1/namespaces/{ns}",
                          "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/xpostgresqls.appcat.example.io",
                          f"{CRITICAL_SERVICES}/appcat-pg1-namespace", f"{CRITICAL_SERVICES}/appcat-pg1-data",
                          f"{CLUSTERROLES}/criticalsvc-read-xpostgresqls",
                          f"{CLUSTERROLES}/criticalsvc-read-persistentvolumeclaims"))


def test_crossplane_usage_example(cluster: Backend) -> None:
    """Crossplane Usage with replayDeletion: the used Cluster is refused while the Release exists, and the
    gate deletes it itself once the Release is gone."""
    _apply(cluster, "crossplane-usage.yaml")
    used = "/apis/compute.example.org/v1/clusters/prod-cluster"
    try:
        _wait_refused(cluster, ("clusters.compute.example.org", "prod-cluster"),
                      "CriticalService prod-cluster-used-by-app-release",
                      "releases.helm.example.org app-release still exists", timeout=90,
                      what="the used Cluster to be refused (its type routed to the gate)")
        if cluster.name == "real":
            wait_for(lambda: _condition(cluster, "prod-cluster-used-by-app-release", "ReplayPermitted") == "True",
                     timeout=90, what="the gate to be permitted to replay")
        refused = cluster.kubectl("delete", "clusters.compute.example.org", "prod-cluster", "--wait=false")
        assert _refused(refused, "may not be deleted yet"), refused.stderr
        ok(cluster.kubectl("delete", "releases.helm.example.org", "app-release"))
        wait_for(lambda: not cluster.admin.exists(used), timeout=90,
                 what="the gate to replay the refused deletion of the Cluster")
    finally:
        _remove(cluster, ("/apis/helm.example.org/v1/releases/app-release", used,
                          f"{CRITICAL_SERVICES}/prod-cluster-used-by-app-release",
                          "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/clusters.compute.example.org",
                          "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/releases.helm.example.org",
                          f"{CLUSTERROLES}/criticalsvc-read-crossplane-usage",
                          f"{CLUSTERROLES}/criticalsvc-replay-crossplane-usage"))


def _condition(cluster: Backend, service: str, type_: str) -> str | None:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{service}") or {}
    return next((c.get("status") for c in (cs.get("status") or {}).get("conditions") or []
                 if c.get("type") == type_), None)


@pytest.mark.parametrize(("example", "first", "then"), [
    ("openkruise-cascading.yaml", "Deployment kruise-demo/worker", "Namespace kruise-demo"),
    ("openkruise-cascading.yaml", "Widget kruise-demo/first",
     "CustomResourceDefinition widgets.kruise-demo.example.com"),
    ("appcat.yaml", "XPostgreSQL pg1", "Namespace vshn-postgresql-pg1"),
    ("appcat.yaml", "XPostgreSQL pg1", "PersistentVolumeClaim vshn-postgresql-pg1/data-pg1-0"),
    ("crossplane-usage.yaml", "Release app-release", "Cluster prod-cluster"),
])
def test_each_example_plans_offline_in_the_order_it_promises(example: str, first: str, then: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`criticalsvc plan -f <example> -o json` (offline, no cluster) puts what must go first in an earlier phase."""
    from criticalsvc.cli import main

    assert main(["plan", "-f", str(EXAMPLES / example), "-o", "json"]) == 0
    phases = json.loads(capsys.readouterr().out)["phases"]

    def phase_of(shown: str) -> int:
        kind, key = shown.split(" ", 1)
        return next(i for i, phase in enumerate(phases) for o in phase
                    if o["kind"] == kind and (f"{o['namespace']}/{o['name']}" if o["namespace"] else o["name"]) == key)

    assert phase_of(first) < phase_of(then)
