"""Providers by selector (issue 11) as a user meets them, on both clusters (the stand-in and the real
control plane, through the `cluster` fixture): a CriticalService protects every namespace labelled
team=payments while a worker pod runs; a labelled namespace is refused, an unlabelled one goes, and one
relabelled out of the set goes too. The pod's phase is set through the status subresource, as a kubelet
would (on the real control plane kwok, which runs the pod, sets the same Running).

A selector over ConfigMaps protects each labelled ConfigMap itself once DELETEs of configmaps reach the
gate: the shipped webhook configuration routes namespaces and apps workloads (deploy/base/webhook.yaml), and
the gate's leader adds configmaps to its own configuration criticalsvc-providers (design/routing.md) on both
clusters. That test waits for the route and fails if it does not appear.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from criticalsvc.api import DELETION_PROTECTED_LABEL
from tests.backends import Backend, unique
from tests.realcluster.teardown import wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
NAMESPACES = "/api/v1/namespaces"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
RUNNING = "object.status.phase == 'Running'"


def _service(name: str, provider: Mapping[str, Any], criterion: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": dict(provider), "criteria": [dict(criterion)]}}


def _namespace(cluster: Backend, name: str, labels: Mapping[str, str]) -> None:
    created = cluster.admin.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": name, "labels": dict(labels)}})
    assert created.status_code == 201, created.text


def _running_pod(cluster: Backend, namespace: str) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker"},
           "spec": {"containers": [{"name": "c", "image": "registry.example.com/worker:1"}]}}
    assert cluster.admin.create(f"{NAMESPACES}/{namespace}/pods", pod).status_code == 201
    running = cluster.admin.merge_patch(f"{NAMESPACES}/{namespace}/pods/worker/status",
                                        {"status": {"phase": "Running"}})
    assert running.status_code == 200, running.text


@pytest.fixture
def readable(cluster: Backend) -> Iterator[str]:
    """A ClusterRole that lets the gate read pods and configmaps (deploy/base/rbac.yaml aggregates it)."""
    name = unique("read-selector")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]}]}
    assert cluster.admin.create(CLUSTERROLES, role).status_code == 201
    yield name
    cluster.admin.delete(f"{CLUSTERROLES}/{name}")


def _delete_all(cluster: Backend, *paths: str) -> None:
    for path in paths:
        wait_for(lambda p=path: cluster.admin.delete(p).status_code in (200, 202, 404), timeout=60,
                 what=f"DELETE {path}")


def test_namespaces_labelled_into_the_set_wait_for_the_criteria(cluster: Backend, namespace: str,
                                                                 readable: str) -> None:
    """Provider: every namespace labelled team=payments; criterion: no running pod in `namespace`."""
    service, paid, free = unique("payments"), unique("pay"), unique("free")
    _running_pod(cluster, namespace)
    _namespace(cluster, paid, {"team": "payments"})
    _namespace(cluster, free, {"team": "search"})
    provider = {"resource": "namespaces", "selector": {"matchLabels": {"team": "payments"}}}
    criterion = {"type": "Resources", "resources": {"resource": "pods", "namespace": namespace}, "condition": RUNNING}
    try:
        neither = cluster.admin.create(CRITICAL_SERVICES, _service(service, {"resource": "namespaces"}, criterion))
        assert neither.status_code == 422, neither.text
        assert "spec.provider" in neither.text and "set exactly one of name and selector" in neither.text

        assert cluster.admin.create(CRITICAL_SERVICES, _service(service, provider, criterion)).status_code == 201

        def answer(name: str) -> Any:
            return cluster.admin.delete(f"{NAMESPACES}/{name}", params={"dryRun": "All"})

        why = f"CriticalService {service} selects it by its labels (every namespaces matching team=payments)"
        wait_for(lambda: answer(paid).status_code == 403 and why in answer(paid).json()["message"], timeout=60,
                 what="the gate to refuse the labelled namespace")
        assert f"pods {namespace}/worker in namespace {namespace} still exists" in answer(paid).json()["message"]
        assert answer(free).status_code == 200, answer(free).text
        assert cluster.admin.delete(f"{NAMESPACES}/{free}").status_code == 200

        stays = cluster.admin.delete(f"{CRITICAL_SERVICES}/{service}", params={"dryRun": "All"})
        assert stays.status_code == 403 and f"still has 1 object (first: {paid})" in stays.json()["message"]

        relabelled = cluster.admin.merge_patch(f"{NAMESPACES}/{paid}", {"metadata": {"labels": {"team": "billing"}}})
        assert relabelled.status_code == 200, relabelled.text
        wait_for(lambda: answer(paid).status_code == 200, timeout=60,
                 what="the relabelled namespace to be deletable")
        assert cluster.admin.delete(f"{NAMESPACES}/{paid}").status_code == 200
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{service}").status_code in (200, 404),
                 timeout=60, what="the CriticalService to go once nothing is selected")
    finally:
        _delete_all(cluster, f"{CRITICAL_SERVICES}/{service}", f"{NAMESPACES}/{paid}", f"{NAMESPACES}/{free}")


def _routes(webhook: Mapping[str, Any], group: str, resource: str) -> bool:
    """Does this webhook send every DELETE of group/resource (not only labelled objects') to the gate?"""
    selector = webhook.get("objectSelector") or {}
    if DELETION_PROTECTED_LABEL in (selector.get("matchLabels") or {}) or any(
            e.get("key") == DELETION_PROTECTED_LABEL and e.get("operator") in ("In", "Exists")
            for e in selector.get("matchExpressions") or ()):
        return False  # the labelled-objects webhook: rule 5 only
    return any(set(r.get("operations") or ()) & {"DELETE", "*"} and set(r.get("apiGroups") or ()) & {group, "*"}
               and set(r.get("resources") or ()) & {resource, "*"} for r in webhook.get("rules") or ())


def _routed(cluster: Backend, group: str, resource: str) -> bool:
    """Whether some gate webhook of the ValidatingWebhookConfigurations routes DELETEs of the type now."""
    configs = cluster.admin.get(WEBHOOKS) or {}
    return any(w.get("name", "").endswith("criticalsvc.io") and _routes(w, group, resource)
               for c in configs.get("items") or () for w in c.get("webhooks") or ())


def test_configmaps_labelled_into_the_set_are_refused_once_routed(cluster: Backend, namespace: str,
                                                                   readable: str) -> None:
    """Provider: every ConfigMap labelled keep=db in `namespace`; criterion: no running pod in another one."""
    service, workers = unique("keep"), unique("workers")
    _namespace(cluster, workers, {})
    _running_pod(cluster, workers)
    for name, labels in (("kept", {"keep": "db"}), ("loose", {"keep": "no"})):
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}}
        assert cluster.admin.create(f"{NAMESPACES}/{namespace}/configmaps", cm).status_code == 201
    provider = {"resource": "configmaps", "namespace": namespace, "selector": {"matchLabels": {"keep": "db"}}}
    criterion = {"type": "Resources", "resources": {"resource": "pods", "namespace": workers}, "condition": RUNNING}
    try:
        assert cluster.admin.create(CRITICAL_SERVICES, _service(service, provider, criterion)).status_code == 201
        # The leader writes the route within a round (webhookrouter.POLL) of seeing the CriticalService.
        wait_for(lambda: _routed(cluster, "", "configmaps"), timeout=30,
                 what="a gate webhook routing DELETEs of configmaps (criticalsvc-providers)")

        def answer(name: str) -> Any:
            return cluster.admin.delete(f"{NAMESPACES}/{namespace}/configmaps/{name}", params={"dryRun": "All"})

        why = f"CriticalService {service} selects it by its labels"
        wait_for(lambda: answer("kept").status_code == 403 and why in answer("kept").json()["message"], timeout=60,
                 what="the gate to refuse the labelled ConfigMap")
        assert answer("loose").status_code == 200, answer("loose").text
        relabelled = cluster.admin.merge_patch(f"{NAMESPACES}/{namespace}/configmaps/kept",
                                               {"metadata": {"labels": {"keep": None}}})
        assert relabelled.status_code == 200, relabelled.text
        wait_for(lambda: answer("kept").status_code == 200, timeout=60,
                 what="the relabelled ConfigMap to be deletable")
    finally:
        # In waiting order: the pod (then the criteria hold), the selected ConfigMaps, the CriticalService.
        ns = f"{NAMESPACES}/{namespace}"
        _delete_all(cluster, f"{NAMESPACES}/{workers}/pods/worker", f"{ns}/configmaps/kept", f"{ns}/configmaps/loose",
                    f"{CRITICAL_SERVICES}/{service}", f"{NAMESPACES}/{workers}")
