"""Only what is protected reaches the gate, on the real control plane (design/routing.md).

* **No window**: `kubectl wait --for=condition=Ready csvc/x`, then at once a DELETE of the provider: refused,
  every time, for a Deployment and for a ConfigMap provider (Ready says Enforcing only once the routing probe
  came back from kube-apiserver).
* **The outage**: every gate replica stopped with SIGSTOP (a hung node: connections are accepted by nobody, so
  the API server waits for its timeout). DELETEs of Deployments in a namespace no CriticalService mentions, of
  that namespace, of a CRD nobody protects, and an UPDATE of another ConfigMap while one ConfigMap's updates
  are held, all go through at once; the protected DELETE and the held UPDATE are refused ("failed calling
  webhook"). While the gate runs, the unprotected requests do not even reach it (its decision counter stays).
* **The negative controls**, in the same outage: the owned configuration edited by hand to be broad (its
  matchConditions removed, Deployments added), an unprotected DELETE fails; the shipped `protected.gate` edited
  to select another label than the one the gate wrote on the provider, the protected DELETE (dry run) goes
  through - so each assertion above can fail.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest

from criticalsvc.api import PROTECTED_LABEL
from criticalsvc.routing import DELETE_WEBHOOK, LABELS_WEBHOOK, SHIPPED_CONFIGURATION
from criticalsvc.webhookconfigurations import NAMESPACE_NAME_LABEL, configuration_name, shard_in
from tests.backends import deployment_manifest, unique, widget_crd
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import wait_for

pytestmark = pytest.mark.realcluster

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
# Well under the webhooks' timeoutSeconds (5): a request that waited for the stopped gate takes 5 s.
AT_ONCE = 2.0


def _namespace(cluster: RealCluster, name: str) -> None:
    assert cluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": name}}).status_code == 201


def _configmap(cluster: RealCluster, namespace: str, name: str) -> None:
    assert cluster.admin.create(f"/api/v1/namespaces/{namespace}/configmaps", {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}}).status_code == 201


def _service(cluster: RealCluster, name: str, provider: dict[str, Any], blocker_namespace: str, *,
             blocker: tuple[str, str] = ("", "configmaps"), **spec: Any) -> None:
    """A CriticalService whose one criterion (an object `blocker` of group/resource `blocker` exists) is unmet;
    created once the gate's caches can read what it names (it refuses a CREATE it cannot check, fail closed)."""
    body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider, "criteria": [{"type": "SpecificResource", "specificResource": {
                "group": blocker[0], "resource": blocker[1], "namespace": blocker_namespace, "name": "blocker"}}],
                **spec}}

    def created() -> bool:
        answer = cluster.admin.create(CRITICAL_SERVICES, body)
        assert answer.status_code in (201, 403), answer.text
        return answer.status_code == 201

    wait_for(created, timeout=60, what=f"CriticalService {name} created")


def _wait_ready(cluster: RealCluster, name: str) -> None:
    waited = cluster.kubectl("wait", "--for=condition=Ready", f"csvc/{name}", "--timeout=60s", timeout=70)
    assert waited.returncode == 0, waited.stderr


def _decisions(cluster: RealCluster) -> float:
    return sum(r.metric("criticalsvc_decisions_total") for r in cluster.gate.replicas)


def _timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    answer = call()
    took = time.monotonic() - started
    print(f"outage: {answer.request.method} {answer.request.url.path} -> {answer.status_code} in {took * 1000:.0f} ms")
    return answer, took


@pytest.fixture
def readable(realcluster: RealCluster) -> Iterator[RealCluster]:
    """The gate may read ConfigMaps (what these CriticalServices name), by a ClusterRole aggregated into its
    reader role, as a user grants it (api/examples/rbac/)."""
    name = unique("read-configmaps")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    assert realcluster.admin.create(CLUSTERROLES, role).status_code == 201
    try:
        yield realcluster
    finally:
        realcluster.admin.delete(f"{CLUSTERROLES}/{name}")


@pytest.mark.parametrize("kind", ["deployment", "configmap"])
def test_ready_then_delete_at_once_is_refused_every_time(readable: RealCluster, kind: str) -> None:
    """The window the probe closes: Ready is Enforcing only once the API server routes the provider."""
    cluster = readable
    ns = unique(f"wait-{kind}")
    _namespace(cluster, ns)
    _configmap(cluster, ns, "blocker")
    names = []
    try:
        for attempt in range(3):
            provider_name = f"p{attempt}"
            if kind == "deployment":
                path = f"/apis/apps/v1/namespaces/{ns}/deployments/{provider_name}"
                assert cluster.admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                                            deployment_manifest(provider_name, ns, replicas=0)).status_code == 201
                provider = {"group": "apps", "resource": "deployments", "namespace": ns, "name": provider_name}
            else:
                path = f"/api/v1/namespaces/{ns}/configmaps/{provider_name}"
                _configmap(cluster, ns, provider_name)
                provider = {"resource": "configmaps", "namespace": ns, "name": provider_name}
            name = unique(f"wait-{kind}-{attempt}")
            names.append(name)
            _service(cluster, name, provider, ns)
            _wait_ready(cluster, name)
            refused = cluster.admin.delete(path)
            assert refused.status_code == 403, f"attempt {attempt}: {refused.status_code} {refused.text}"
            assert f"CriticalService {name}" in refused.json()["message"]
    finally:
        cluster.admin.delete(f"/api/v1/namespaces/{ns}/configmaps/blocker")
        for name in names:
            wait_for(lambda n=name: cluster.admin.delete(f"{CRITICAL_SERVICES}/{n}").status_code in (200, 404)
                     or cluster.admin.delete(f"/api/v1/namespaces/{ns}").status_code == 403, timeout=60,
                     what=f"{name} released")
        cluster.admin.delete(f"/api/v1/namespaces/{ns}")


def test_a_label_that_selects_an_object_protects_it_the_moment_it_is_written(readable: RealCluster) -> None:
    """A selected provider: the API server evaluates the selector on the stored labels, so an object labelled into
    the set is protected at once - its DELETE right after the label's PATCH is refused, every time - and one
    labelled out of it is not routed at all."""
    cluster = readable
    ns = unique("selected")
    _namespace(cluster, ns)
    # The criterion names a Deployment: a ConfigMap there could be labelled into the set it waits on (a cycle the
    # CREATE refuses).
    assert cluster.admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments",
                                deployment_manifest("blocker", ns, replicas=0)).status_code == 201
    name = unique("selects-db")
    _service(cluster, name, {"resource": "configmaps", "namespace": ns, "selector": {"matchLabels": {"app": "db"}}},
             ns, blocker=("apps", "deployments"))
    _wait_ready(cluster, name)
    try:
        for attempt in range(3):
            path = f"/api/v1/namespaces/{ns}/configmaps/c{attempt}"
            _configmap(cluster, ns, f"c{attempt}")
            labelled = cluster.admin.merge_patch(path, {"metadata": {"labels": {"app": "db"}}})
            assert labelled.status_code == 200, labelled.text
            refused = cluster.admin.delete(path)
            assert refused.status_code == 403, f"attempt {attempt}: {refused.status_code} {refused.text}"
            assert f"CriticalService {name} selects it by its labels" in refused.json()["message"]
        before = _decisions(cluster)
        unlabelled = cluster.admin.merge_patch(f"/api/v1/namespaces/{ns}/configmaps/c0",
                                               {"metadata": {"labels": {"app": None}}})
        assert unlabelled.status_code == 200, unlabelled.text
        assert cluster.admin.delete(f"/api/v1/namespaces/{ns}/configmaps/c0").status_code == 200
        assert _decisions(cluster) == before  # not routed: the gate was not asked
    finally:
        cluster.admin.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/blocker")
        for i in range(3):  # a CriticalService goes after its provider set
            wait_for(lambda i=i: cluster.admin.delete(f"/api/v1/namespaces/{ns}/configmaps/c{i}").status_code
                     in (200, 404), timeout=60, what=f"c{i} deleted once the criterion holds")
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{name}").status_code in (200, 404), timeout=60,
                 what=f"{name} deleted")
        cluster.admin.delete(f"/api/v1/namespaces/{ns}")


def test_an_outage_refuses_only_what_is_protected(readable: RealCluster) -> None:
    cluster = readable
    guarded, free = unique("guarded"), unique("free")
    group = f"{unique('unrelated')}.example.com"
    for ns in (guarded, free):
        _namespace(cluster, ns)
    _configmap(cluster, guarded, "blocker")
    _configmap(cluster, guarded, "locked")
    assert cluster.admin.create(f"/apis/apps/v1/namespaces/{guarded}/deployments",
                                deployment_manifest("provider", guarded, replicas=0)).status_code == 201
    free_deployments = [f"app-{i}" for i in range(5)]
    for name in free_deployments:
        assert cluster.admin.create(f"/apis/apps/v1/namespaces/{free}/deployments",
                                    deployment_manifest(name, free, replicas=0)).status_code == 201
    _configmap(cluster, free, "settings")
    assert cluster.admin.create(CRDS, widget_crd(group)).status_code == 201
    protects, holds = unique("outage-provider"), unique("outage-lock")
    _service(cluster, protects, {"group": "apps", "resource": "deployments", "namespace": guarded,
                                 "name": "provider"}, guarded)
    _service(cluster, holds, {"resource": "configmaps", "namespace": guarded, "name": "locked"}, guarded,
             holdUpdates="WhileBlocking")
    _wait_ready(cluster, protects)
    _wait_ready(cluster, holds)
    provider = f"/apis/apps/v1/namespaces/{guarded}/deployments/provider"
    locked = f"/api/v1/namespaces/{guarded}/configmaps/locked"
    settings = f"/api/v1/namespaces/{free}/configmaps/settings"

    def label(path: str, value: str) -> Any:
        return cluster.admin.request("PATCH", path, json={"metadata": {"labels": {"touched": value}}},
                                     headers={"Content-Type": "application/merge-patch+json"})

    owned_path = f"{CONFIGURATIONS}/{configuration_name(shard_in(guarded))}"  # the shard of guarded's routes
    owned = cluster.admin.get(owned_path)
    assert owned is not None
    shipped_path = f"{CONFIGURATIONS}/{SHIPPED_CONFIGURATION}"
    shipped = cluster.admin.get(shipped_path)
    try:
        # While the gate runs, what it does not protect never reaches it.
        before = _decisions(cluster)
        assert label(settings, "running").status_code == 200
        assert cluster.admin.delete(f"/apis/apps/v1/namespaces/{free}/deployments/{free_deployments[0]}"
                                    ).status_code == 200
        assert cluster.admin.delete(provider).status_code == 403  # ... and what it protects does
        assert _decisions(cluster) - before == 1

        with cluster.gate.frozen():
            for name in free_deployments[1:4]:
                answer, took = _timed(lambda n=name: cluster.admin.delete(
                    f"/apis/apps/v1/namespaces/{free}/deployments/{n}"))
                assert answer.status_code == 200 and took < AT_ONCE, (name, answer.status_code, took, answer.text)
            answer, took = _timed(lambda: label(settings, "outage"))
            assert answer.status_code == 200 and took < AT_ONCE, (took, answer.text)
            answer, took = _timed(lambda: cluster.admin.delete(f"{CRDS}/widgets.{group}"))
            assert answer.status_code == 200 and took < AT_ONCE, (took, answer.text)
            for path in (provider, locked):
                answer, _took = _timed(lambda p=path: cluster.admin.delete(p) if p == provider
                                       else label(locked, "outage"))
                assert answer.status_code == 500, (path, answer.status_code, answer.text)
                assert "failed calling webhook" in answer.json()["message"], answer.text

            # Negative control 1: the same routes, broad (no namespaceSelector or matchConditions, and Deployments
            # among its rules): an unprotected DELETE now waits and fails. The leader is stopped, so nothing
            # rewrites it meanwhile.
            broad = copy.deepcopy(cluster.admin.get(owned_path))
            assert broad is not None
            for webhook in broad["webhooks"]:
                if webhook["name"] == DELETE_WEBHOOK:
                    assert {"key": NAMESPACE_NAME_LABEL, "operator": "In", "values": [guarded]} in \
                        webhook["namespaceSelector"]["matchExpressions"], webhook
                    webhook.pop("namespaceSelector", None)
                    webhook.pop("matchConditions", None)
                    webhook["rules"].append({"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["DELETE"],
                                             "resources": ["deployments"], "scope": "Namespaced"})
            assert cluster.admin.request("PUT", owned_path, json=broad).status_code == 200
            wait_for(lambda: cluster.admin.delete(f"/apis/apps/v1/namespaces/{free}/deployments/"
                                                  f"{free_deployments[4]}", params={"dryRun": "All"}
                                                  ).status_code == 500, timeout=30,
                     what="an unprotected DELETE failing once the routes are broad")

            # Negative control 2: the provider is labelled criticalsvc.io/protected, and the shipped protected.gate
            # selecting that label is what sends its DELETE: with the selector pointed elsewhere, its DELETE (a dry
            # run) goes through.
            assert cluster.admin.get(provider)["metadata"]["labels"].get(PROTECTED_LABEL) == "true"
            back = copy.deepcopy(owned)  # the first control's broad routes undone
            back["metadata"]["resourceVersion"] = cluster.admin.get(owned_path)["metadata"]["resourceVersion"]
            assert cluster.admin.request("PUT", owned_path, json=back).status_code == 200
            elsewhere = copy.deepcopy(cluster.admin.get(shipped_path))
            for webhook in elsewhere["webhooks"]:
                if webhook["name"] == LABELS_WEBHOOK:
                    webhook["objectSelector"]["matchExpressions"][0]["key"] = "criticalsvc.io/nowhere"
            assert cluster.admin.request("PUT", shipped_path, json=elsewhere).status_code == 200
            wait_for(lambda: cluster.admin.delete(provider, params={"dryRun": "All"}).status_code == 200, timeout=30,
                     what="the protected DELETE going through once the label selects nothing")

            # The namespace nobody protects goes at once too (last: the first control needs its Deployment).
            answer, took = _timed(lambda: cluster.admin.delete(f"/api/v1/namespaces/{free}"))
            assert answer.status_code == 200 and took < AT_ONCE, (took, answer.text)
    finally:
        restored = copy.deepcopy(shipped)
        restored["metadata"]["resourceVersion"] = cluster.admin.get(shipped_path)["metadata"]["resourceVersion"]
        assert cluster.admin.request("PUT", shipped_path, json=restored).status_code == 200
        # The leader rewrites its own configuration at its next resync (it differs from what it renders).
        wait_for(lambda: cluster.admin.delete(provider, params={"dryRun": "All"}).status_code == 403, timeout=60,
                 what="the gate's own routes back")
        cluster.admin.delete(f"/api/v1/namespaces/{guarded}/configmaps/blocker")
        for path in (provider, locked):  # a CriticalService goes after its provider
            wait_for(lambda p=path: cluster.admin.delete(p).status_code in (200, 404), timeout=60,
                     what=f"{path} deleted once its criterion holds")
        for name in (protects, holds):
            wait_for(lambda n=name: cluster.admin.delete(f"{CRITICAL_SERVICES}/{n}").status_code in (200, 404),
                     timeout=60, what=f"{name} deleted")
        cluster.admin.delete(f"/api/v1/namespaces/{guarded}")
        cluster.admin.delete(f"/api/v1/namespaces/{free}")
        cluster.admin.delete(f"{CRDS}/widgets.{group}")
