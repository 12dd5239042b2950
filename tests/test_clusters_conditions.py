"""Conditions on criteria (issue 11) as a user meets them, on both clusters (the stand-in and the real
control plane, through the `cluster` fixture): the webhook refuses a condition that does not compile,
and a criterion's condition decides which objects block. The pod's phase is set through the status
subresource, as a kubelet would; on the real control plane, which runs pods (kube-scheduler, kwok), the
pod asks for a node none has, so nothing but the test writes its phase. Phases the system sets are
tests/test_realcluster_workloads.py's."""

from __future__ import annotations

from typing import Any

from tests.backends import Backend, unique
from tests.realcluster.teardown import wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
ACTIVE = "object.status.phase in ['Pending', 'Running']"


def _guarding(name: str, namespace: str, condition: str | None) -> dict[str, Any]:
    """A CriticalService whose provider is the namespace itself, until no pod of it counts."""
    criterion: dict[str, Any] = {"type": "Resources", "resources": {"resource": "pods", "namespace": namespace}}
    if condition is not None:
        criterion["condition"] = condition
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"resource": "namespaces", "name": namespace}, "criteria": [criterion]}}


def test_a_namespace_whose_only_pod_succeeded_is_deletable_only_with_a_phase_condition(
        cluster: Backend, namespace: str) -> None:
    """Without a condition the Succeeded pod keeps its namespace; with `phase in [Pending, Running]` it no
    longer counts and the namespace goes. A condition that does not compile is refused naming its field."""
    service = unique("cond")
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": {"name": f"read-pods-{service}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
              "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]}
    assert cluster.admin.create(CLUSTERROLES, reader).status_code == 201
    ns_path = f"/api/v1/namespaces/{namespace}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job"},
           "spec": {"restartPolicy": "Never", "nodeSelector": {"criticalsvc.io/test-no-node": "true"},
                    "containers": [{"name": "c", "image": "registry.example.com/c:1"}]}}
    assert cluster.admin.create(f"{ns_path}/pods", pod).status_code == 201
    finished = cluster.admin.merge_patch(f"{ns_path}/pods/job/status", {"status": {"phase": "Succeeded"}})
    assert finished.status_code == 200, finished.text
    try:
        typo = cluster.admin.create(CRITICAL_SERVICES, _guarding(service, namespace, "objekt.status.phase == 'x'"))
        assert typo.status_code == 422, typo.text
        assert typo.json()["message"] == (
            f'admission webhook "criticalservices.gate.criticalsvc.io" denied the request: CriticalService '
            f'"{service}" is invalid: spec.criteria[0].condition: undeclared reference to \'objekt\'')

        assert cluster.admin.create(CRITICAL_SERVICES, _guarding(service, namespace, None)).status_code == 201
        refused = f"pods {namespace}/job in namespace {namespace} still exists"

        def answer() -> Any:
            return cluster.admin.delete(ns_path, params={"dryRun": "All"})

        wait_for(lambda: answer().status_code == 403 and refused in answer().json()["message"], timeout=60,
                 what="the gate to refuse the namespace for its Succeeded pod")

        def with_condition() -> int:
            """GET, then PUT with the condition: a status the gate writes in between is a 409, read again (as
            `kubectl edit` does)."""
            current = cluster.admin.get(f"{CRITICAL_SERVICES}/{service}")
            assert current is not None
            current["spec"]["criteria"][0]["condition"] = ACTIVE
            updated = cluster.admin.request("PUT", f"{CRITICAL_SERVICES}/{service}", json=current)
            assert updated.status_code in (200, 409), updated.text
            return int(updated.status_code)
        wait_for(lambda: with_condition() == 200, timeout=30, what="the condition written")
        wait_for(lambda: answer().status_code == 200, timeout=60,
                 what="the namespace to be deletable once the condition excludes the Succeeded pod")
        assert cluster.admin.delete(ns_path).status_code == 200
        wait_for(lambda: not cluster.admin.exists(ns_path), timeout=90, what=f"namespace {namespace} to be gone")
    finally:
        for path in (f"{CRITICAL_SERVICES}/{service}", f"{CLUSTERROLES}/read-pods-{service}"):
            wait_for(lambda p=path: cluster.admin.delete(p).status_code in (200, 202, 404), timeout=60,
                     what=f"DELETE {path}")
