"""Protection carried by the protected object (design/routing.md, "No window, on every API server"), on both clusters
(the stand-in and the real control plane, through the `cluster` fixture): what the design relies on of the API server,
checked where a stand-in that departed from kube-apiserver would make the explorer's model wrong.

* The gate's label write (a JSON merge patch under its own field manager) lands on the provider and its namespace,
  and Ready says Enforcing only then.
* A DELETE is routed by the shipped `protected.gate` on the stored object's labels (a DELETE's object is null, its
  oldObject the stored object: predicates/object/matcher.go at v1.37.2), and refused with the gate's words.
* Every write that would remove the label - a merge patch, `kubectl label ...-`, `kubectl replace` of the manifest
  without it - is routed by `protected-updates.gate` (its objectSelector matches the oldObject) and refused; a write
  that keeps it (another label, a client-side `kubectl apply` of the manifest, whose three-way merge leaves fields it
  never set) is admitted, and the label stays.
* Once nothing protects the namespace any more, the gate removes its label itself.

The real API server is the reference: each refusal is asserted as the exact line kubectl prints.
"""

from __future__ import annotations

import json
from typing import Any

from criticalsvc.api import PROTECTED_LABEL
from tests.backends import Backend, deployment_manifest, unique
from tests.realcluster.teardown import wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
PROTECTED = "protected.gate.criticalsvc.io"
PROTECTED_UPDATES = "protected-updates.gate.criticalsvc.io"


def _ready(cluster: Backend, name: str) -> dict[str, Any]:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}
    return next((c for c in (cs.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def _labels(cluster: Backend, path: str) -> dict[str, str]:
    obj = cluster.admin.get(path) or {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _error(stderr: str) -> str:
    """kubectl's error line (the gate's warnings come before it)."""
    return next((line for line in stderr.splitlines() if line.startswith("Error from server")), stderr)


def _unlabel_refusal(ref: str, service: str) -> str:
    return (f'Error from server (Forbidden): admission webhook "{PROTECTED_UPDATES}" denied the request: {ref}: the '
            f"label {PROTECTED_LABEL} may not be removed while CriticalService {service} protects it: it is what "
            "sends the object's DELETE to the gate on every API server; the gate removes it itself once no "
            "CriticalService protects the object")


def test_the_gates_label_routes_the_delete_and_no_write_removes_it_while_protected(cluster: Backend,
                                                                                  namespace: str) -> None:
    """Labelled, then Enforcing; the DELETE refused by protected.gate; each way of removing the label refused by
    protected-updates.gate, each write that keeps it admitted; the namespace's label gone with the CriticalService."""
    ns = f"/api/v1/namespaces/{namespace}"
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    manifest = deployment_manifest("provider", namespace, replicas=0)
    assert cluster.admin.create(deployments, manifest).status_code == 201
    # The blocker, a Deployment the gate may read, lives elsewhere: a criterion confined to the provider's namespace
    # lets the namespace go (design/criticalservice.md §3a).
    service = unique("carried")
    blocker = f"/apis/apps/v1/namespaces/default/deployments/{service}"
    assert cluster.admin.create("/apis/apps/v1/namespaces/default/deployments",
                                deployment_manifest(service, "default", replicas=0)).status_code == 201
    body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": service},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": namespace,
                                  "name": "provider"},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "group": "apps", "resource": "deployments", "namespace": "default", "name": service}}]}}
    provider = f"{deployments}/provider"
    wait_for(lambda: cluster.admin.create(CRITICAL_SERVICES, body).status_code == 201, timeout=60,
             what=f"CriticalService {service} created")
    try:
        wait_for(lambda: _ready(cluster, service).get("reason") == "Enforcing", timeout=60,
                 what=f"{service} Ready=True/Enforcing")
        # Enforcing means labelled: both labels are stored by then, not merely on their way.
        assert _labels(cluster, provider).get(PROTECTED_LABEL) == "true"
        assert _labels(cluster, ns).get(PROTECTED_LABEL) == "true"

        refused = cluster.kubectl("delete", "-n", namespace, "deployment/provider", "--dry-run=server")
        assert refused.returncode != 0
        assert _error(refused.stderr) == (
            f'Error from server (Forbidden): admission webhook "{PROTECTED}" denied the request: deployments.apps '
            f"{namespace}/provider may not be deleted yet: CriticalService {service} protects it until: "
            f"deployments.apps default/{service} still exists"), refused.stderr
        refused = cluster.kubectl("delete", "namespace", namespace, "--dry-run=server")
        assert refused.returncode != 0 and f'admission webhook "{PROTECTED}" denied the request: namespaces ' \
            f"{namespace} may not be deleted yet" in refused.stderr, refused.stderr

        # Removing the label, three ways: each is an UPDATE whose oldObject carries it.
        ref = f"deployments.apps {namespace}/provider"
        unlabel = cluster.kubectl("label", "-n", namespace, "deployment/provider", f"{PROTECTED_LABEL}-")
        assert unlabel.returncode != 0 and _error(unlabel.stderr) == _unlabel_refusal(ref, service), unlabel.stderr
        patched = cluster.admin.merge_patch(provider, {"metadata": {"labels": {PROTECTED_LABEL: None}}})
        assert patched.status_code == 403, patched.text
        assert f'admission webhook \\"{PROTECTED_UPDATES}\\" denied the request' in patched.text or \
            f'admission webhook "{PROTECTED_UPDATES}" denied the request' in patched.json()["message"], patched.text
        stored = cluster.admin.get(provider) or {}
        bare = {**manifest, "metadata": {**manifest["metadata"],
                                         "resourceVersion": stored["metadata"]["resourceVersion"]}}
        replaced = cluster.kubectl("replace", "-f", "-", input=json.dumps(bare))
        assert replaced.returncode != 0 and _error(replaced.stderr) == _unlabel_refusal(ref, service).replace(
            "(Forbidden): ", '(Forbidden): error when replacing "STDIN": '), replaced.stderr
        unlabel_ns = cluster.kubectl("label", "namespace", namespace, f"{PROTECTED_LABEL}-")
        assert unlabel_ns.returncode != 0 and _error(unlabel_ns.stderr) == \
            _unlabel_refusal(f"namespaces {namespace}", service), unlabel_ns.stderr

        # Writes that keep it: another label; the manifest re-applied client-side (three-way: a label it never set
        # is not its to remove).
        added = cluster.kubectl("label", "-n", namespace, "deployment/provider", "team=payments")
        assert added.returncode == 0, added.stderr
        applied = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        assert applied.returncode == 0, applied.stderr
        applied = cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        assert applied.returncode == 0, applied.stderr
        labels = _labels(cluster, provider)
        assert labels.get(PROTECTED_LABEL) == "true" and labels.get("team") == "payments", labels

        # The criterion met, the provider goes, then its CriticalService (rule 3): nothing protects the namespace
        # any more, and the gate removes its label itself.
        assert cluster.admin.delete(blocker).status_code == 200
        wait_for(lambda: cluster.admin.delete(provider).status_code in (200, 404), timeout=60,
                 what="the provider deleted once its criterion holds")
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{service}").status_code in (200, 404),
                 timeout=60, what=f"CriticalService {service} deleted")
        wait_for(lambda: PROTECTED_LABEL not in _labels(cluster, ns), timeout=60,
                 what="the gate's label removed from the namespace")
    finally:
        cluster.admin.delete(blocker)
        wait_for(lambda: cluster.admin.delete(provider).status_code in (200, 404), timeout=60,
                 what="the provider deleted")
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{service}").status_code in (200, 404),
                 timeout=60, what=f"CriticalService {service} deleted")
