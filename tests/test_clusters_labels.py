"""The `criticalsvc.io/deletion-protected: Always` label on objects of any type, on both clusters (the
stand-in and the real control plane, through the `cluster` fixture).

deploy/'s labelled-objects webhook (`labelled.gate.criticalsvc.io`) routes DELETE of every top-level
resource to the gate, with an objectSelector so that the API server calls it only for objects whose
oldObject carries the label; the gate denies from oldObject alone (it has no cache of, and no read
access to, ConfigMaps, Services, PVCs, ClusterRoles or custom resources). Objects without the label,
or with another value, are deleted without the gate being asked; `kube-system` is excluded by the
namespaceSelector like every other webhook's. The real API server is the reference: each test asserts
the exact line kubectl prints, so a stand-in that matches selectors differently fails.

Names are unique per test, and every test removes what it made: a labelled object left behind would
keep its namespace Terminating forever on the session's shared real cluster.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from tests.backends import Backend, deployment_manifest, ok, unique
from tests.realcluster.teardown import wait_for

LABEL = "criticalsvc.io/deletion-protected"
WEBHOOK = "labelled.gate.criticalsvc.io"


def _refusal(shown: str) -> str:
    """The line kubectl prints for a DELETE the gate refuses because of the label."""
    return (f'Error from server (Forbidden): admission webhook "{WEBHOOK}" denied the request: {shown} is '
            f"labelled {LABEL}=Always; remove the label to delete it")


def _labels(value: str | None) -> dict[str, Any]:
    return {"labels": {LABEL: value, "app": "labels-test"}} if value else {"labels": {"app": "labels-test"}}


def _configmap(name: str, value: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **_labels(value)},
            "data": {"k": "v"}}


def _service(name: str, value: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, **_labels(value)},
            "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}


def _pvc(name: str, value: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, **_labels(value)},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}


def _clusterrole(name: str, value: str | None) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, **_labels(value)}, "rules": []}


class Made:
    """Objects a test created: (kubectl kind, namespace or "", name, API path)."""

    def __init__(self, cluster: Backend) -> None:
        self.cluster = cluster
        self.paths: list[str] = []

    def create(self, path: str, body: dict[str, Any]) -> str:
        created = self.cluster.admin.create(path, body)
        assert created.status_code == 201, created.text
        self.paths.append(f"{path}/{body['metadata']['name']}")
        return self.paths[-1]

    def cleanup(self) -> None:
        """Drop the label from whatever is left, then delete it and wait until it is gone."""
        for path in self.paths:
            if self.cluster.admin.exists(path):
                self.cluster.admin.merge_patch(path, {"metadata": {"labels": {LABEL: None}}})
                self.cluster.admin.delete(path)
        for path in self.paths:
            _gone(self.cluster, path)


@contextlib.contextmanager
def made(cluster: Backend) -> Iterator[Made]:
    objects = Made(cluster)
    try:
        yield objects
    finally:
        objects.cleanup()


def _delete(cluster: Backend, kind: str, name: str, namespace: str = "") -> Any:
    where = ["-n", namespace] if namespace else []
    return cluster.kubectl("delete", kind, name, *where, "--wait=false")


def _assert_refused(cluster: Backend, kind: str, name: str, namespace: str, shown: str, path: str) -> None:
    done = _delete(cluster, kind, name, namespace)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert _refusal(shown) in done.stderr.splitlines(), done.stderr
    after = cluster.admin.get(path) or {}
    assert after and "deletionTimestamp" not in after["metadata"], f"{path} was touched by the refused DELETE"


# Finalizers the API server adds at create and a controller removes once nothing uses the object: the
# real API server's StorageObjectInUseProtection admission adds kubernetes.io/pvc-protection to every
# PVC; the test control plane does not run its controller (pvc-protection), and the stand-in adds none.
CONTROLLER_FINALIZERS = frozenset({"kubernetes.io/pvc-protection"})


def _gone(cluster: Backend, path: str) -> None:
    """Wait until `path` is gone; an object held only by CONTROLLER_FINALIZERS is released as their
    controller would release it (nothing uses it)."""
    def done() -> bool:
        obj = cluster.admin.get(path)
        if obj is None:
            return True
        finalizers = set(obj["metadata"].get("finalizers") or ())
        if obj["metadata"].get("deletionTimestamp") and finalizers and finalizers <= CONTROLLER_FINALIZERS:
            cluster.admin.merge_patch(path, {"metadata": {"finalizers": None}})
        return False

    wait_for(done, timeout=60, what=f"{path} to be gone")


def _assert_deleted(cluster: Backend, kind: str, name: str, namespace: str, path: str) -> None:
    ok(_delete(cluster, kind, name, namespace))
    _gone(cluster, path)


# kubectl kind, collection path (formatted with the namespace), manifest, how the gate names the object.
NAMESPACED = [
    ("configmap", "/api/v1/namespaces/{ns}/configmaps", _configmap, "configmaps {ns}/{name}"),
    ("service", "/api/v1/namespaces/{ns}/services", _service, "services {ns}/{name}"),
    ("persistentvolumeclaim", "/api/v1/namespaces/{ns}/persistentvolumeclaims", _pvc,
     "persistentvolumeclaims {ns}/{name}"),
]
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"


def test_labelled_objects_of_any_type_are_refused_until_the_label_is_removed(cluster: Backend,
                                                                            namespace: str) -> None:
    """A labelled ConfigMap, Service, PersistentVolumeClaim (namespaced) and ClusterRole (cluster-scoped):
    `kubectl delete` is refused at once with the gate's label message and the object is left untouched;
    the same kinds without the label, or labelled with another value, are deleted; after `kubectl label
    ... criticalsvc.io/deletion-protected-` the labelled ones are deleted too."""
    role = unique("labels-keep")
    with made(cluster) as objects:
        locked: list[tuple[str, str, str, str, str]] = []  # kind, namespace, name, shown, path
        unlocked: list[tuple[str, str, str, str]] = []  # kind, namespace, name, path
        for kind, collection, manifest, shown in NAMESPACED:
            path = collection.format(ns=namespace)
            locked.append((kind, namespace, "keep", shown.format(ns=namespace, name="keep"),
                           objects.create(path, manifest("keep", "Always"))))
            unlocked.append((kind, namespace, "open", objects.create(path, manifest("open", None))))
            unlocked.append((kind, namespace, "never", objects.create(path, manifest("never", "Never"))))
        locked.append(("clusterrole", "", role, f"clusterroles.rbac.authorization.k8s.io {role}",
                       objects.create(CLUSTERROLES, _clusterrole(role, "Always"))))
        open_role = unique("labels-open")
        unlocked.append(("clusterrole", "", open_role, objects.create(CLUSTERROLES, _clusterrole(open_role, None))))

        # The gate reads the label from oldObject: refused from the first DELETE, no cache to wait for.
        for kind, ns, name, shown, path in locked:
            _assert_refused(cluster, kind, name, ns, shown, path)
        for kind, ns, name, path in unlocked:
            _assert_deleted(cluster, kind, name, ns, path)
        for kind, ns, name, _, path in locked:
            where = ["-n", ns] if ns else []
            ok(cluster.kubectl("label", kind, name, *where, f"{LABEL}-"))
            _assert_deleted(cluster, kind, name, ns, path)


def test_a_labelled_namespace_and_deployment_are_refused_by_the_labelled_objects_webhook(
        cluster: Backend, namespace: str) -> None:
    """Kinds that have a webhook of their own are refused by the labelled-objects webhook when labelled
    (the kind-specific webhooks select NotIn [Always], so exactly one webhook reviews each DELETE and the
    name in the message is deterministic on the real API server, which calls webhooks in parallel)."""
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    with made(cluster) as objects:
        body = deployment_manifest("keep", namespace, replicas=0)
        body["metadata"]["labels"] = {LABEL: "Always"}
        deployment = objects.create(deployments, body)
        _assert_refused(cluster, "deployment", "keep", namespace, f"deployments.apps {namespace}/keep", deployment)
        # The namespace itself, labelled: refused, and it stays Active.
        ok(cluster.kubectl("label", "namespace", namespace, f"{LABEL}=Always"))
        try:
            _assert_refused(cluster, "namespace", namespace, "", f"namespaces {namespace}",
                            f"/api/v1/namespaces/{namespace}")
        finally:
            ok(cluster.kubectl("label", "namespace", namespace, f"{LABEL}-"))


def test_a_labelled_object_in_kube_system_is_not_gated(cluster: Backend) -> None:
    """The labelled-objects webhook excludes kube-system (and the gate's namespace) by
    kubernetes.io/metadata.name, as every webhook of the gate does: a labelled ConfigMap there goes."""
    name = unique("labels-kube-system")
    with made(cluster) as objects:
        path = objects.create("/api/v1/namespaces/kube-system/configmaps", _configmap(name, "Always"))
        _assert_deleted(cluster, "configmap", name, "kube-system", path)


def _crd(group: str) -> dict[str, Any]:
    spec = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    schema = {"type": "object", "properties": {"spec": spec}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}


def test_a_labelled_custom_resource_is_refused_until_the_label_is_removed(cluster: Backend, namespace: str) -> None:
    """A CR of a CRD made just now (no CriticalService names it; the gate may not read it): refused when
    labelled, deleted once the label is removed; an unlabelled one of the same type goes at once."""
    group = f"{unique('labels')}.example.com"
    widgets = f"/apis/{group}/v1/namespaces/{namespace}/widgets"
    with made(cluster) as crds:
        crds.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", _crd(group))
        with made(cluster) as objects:
            def widget(name: str, value: str | None) -> dict[str, Any]:
                return {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": name, **_labels(value)},
                        "spec": {}}

            deadline = time.monotonic() + 60
            while cluster.admin.create(widgets, widget("probe", None)).status_code != 201:  # until established
                assert time.monotonic() < deadline, "the CRD was never served"
                time.sleep(0.2)
            objects.paths.append(f"{widgets}/probe")
            keep = objects.create(widgets, widget("keep", "Always"))
            kind = f"widgets.{group}"
            # kubectl's discovery cache may not know the new type yet: retry until it resolves the name.
            wait_for(lambda: cluster.kubectl("get", kind, "-n", namespace).returncode == 0, timeout=60,
                     what=f"kubectl to discover {kind}")
            _assert_refused(cluster, kind, "keep", namespace, f"widgets.{group} {namespace}/keep", keep)
            _assert_deleted(cluster, kind, "probe", namespace, f"{widgets}/probe")
            ok(cluster.kubectl("label", kind, "keep", "-n", namespace, f"{LABEL}-"))
            _assert_deleted(cluster, kind, "keep", namespace, keep)


def test_explain_reads_the_label_of_a_type_no_critical_service_names(cluster: Backend, namespace: str) -> None:
    """`criticalsvc explain configmap/keep` against the live cluster answers as the gate does: refused for
    the label (a ConfigMap is not in the caches, so explain reads the object itself); allowed once the
    label is gone."""
    import subprocess
    import sys

    def explain() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "criticalsvc", "explain", "configmap/keep", "-n", namespace,
                               "--kubeconfig", str(cluster.kubeconfig)], capture_output=True, text=True,
                              timeout=120, check=False)

    with made(cluster) as objects:
        objects.create(f"/api/v1/namespaces/{namespace}/configmaps", _configmap("keep", "Always"))
        refused = explain()
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert f"configmaps {namespace}/keep is labelled {LABEL}=Always" in refused.stdout, refused.stdout
        ok(cluster.kubectl("label", "configmap", "keep", "-n", namespace, f"{LABEL}-"))
        allowed = explain()
        assert allowed.returncode == 0, (allowed.stdout, allowed.stderr)
