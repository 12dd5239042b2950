"""Gate any kind (issue 11), on both clusters: a CriticalService whose provider is a ConfigMap, a PVC, a
Service or a custom resource is enforced once the gate has written its route into its own webhook
configuration criticalsvc-providers (criticalsvc/routing.py, criticalsvc/webhookrouter.py); the
shipped configuration `criticalsvc` is never written; the owned configuration is garbage-collected with
the shipped one (kube-controller-manager's garbage collector, the simulator's on the stand-in). On the
real control plane only (the stand-in has no RBAC): without the RBAC to write it, status says
RoutingFailed."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from criticalsvc.api import PROTECTED_LABEL
from criticalsvc.routing import DELETE_WEBHOOK
from tests.backends import Backend, gate_configurations, gate_webhooks, unique, widget_crd
from tests.realcluster.teardown import wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _service(name: str, group: str, resource: str, namespace: str, provider: str, blocker: str) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": group, "resource": resource, "namespace": namespace, "name": provider},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "resource": "configmaps", "namespace": namespace, "name": blocker}}]}}


def _create(cluster: Backend, service: dict[str, Any]) -> None:
    """Create a CriticalService; the gate refuses it (fail closed) until the caches of the types the previous
    one named have synced - or, when an earlier test left a type unreadable, until its watch has retried
    since the reader ClusterRole was aggregated - so this is retried until then."""
    def created() -> bool:
        response = cluster.admin.create(CRITICAL_SERVICES, service)
        assert response.status_code == 201 or "has not synced" in response.text or "may not list" in response.text, \
            response.text
        return response.status_code == 201

    wait_for(created, timeout=60, what=f"CriticalService {service['metadata']['name']} created")


def _ready(cluster: Backend, name: str) -> dict[str, Any]:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}
    return next((c for c in (cs.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"), {})


def _routed_types(cluster: Backend) -> set[tuple[str, str]]:
    """(group, resource) of every DELETE rule of the providers webhook in the gate's configurations."""
    return {(g, r) for w in gate_webhooks(cluster.admin) if w["name"] == DELETE_WEBHOOK for rule in w["rules"]
            for g in rule["apiGroups"] for r in rule["resources"]}


def _shipped_version(cluster: Backend) -> str:
    shipped = cluster.admin.get(f"{CONFIGURATIONS}/criticalsvc")
    assert shipped is not None
    return str(shipped["metadata"]["resourceVersion"])


@pytest.fixture
def widgets(cluster: Backend) -> Iterator[str]:
    """A CRD of its own (a unique group) and a ClusterRole that lets the gate read what these tests name."""
    group = f"{unique('w')}.example.com"
    reader = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
              "metadata": {"name": f"read-{group}", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
              "rules": [{"apiGroups": [""], "resources": ["configmaps", "persistentvolumeclaims", "services"],
                         "verbs": ["get", "list", "watch"]},
                        {"apiGroups": [group], "resources": ["widgets"], "verbs": ["get", "list", "watch"]}]}
    assert cluster.admin.create(CLUSTERROLES, reader).status_code == 201
    assert cluster.admin.create(CRDS, widget_crd(group)).status_code == 201
    wait_for(lambda: cluster.admin.get(f"/apis/{group}/v1") is not None, timeout=60, what=f"{group}/v1 served")
    try:
        yield group
    finally:
        cluster.admin.delete(f"{CRDS}/widgets.{group}")
        cluster.admin.delete(f"{CLUSTERROLES}/read-{group}")


def test_providers_of_any_kind_are_gated_once_routed(cluster: Backend, namespace: str, widgets: str) -> None:
    """ConfigMap, PVC, Service and custom-resource providers with an unmet criterion: kubectl delete is refused
    by the providers webhook, Ready says Enforcing; once the CriticalServices go, so do their routes; the shipped
    configuration is never written."""
    shipped_version = _shipped_version(cluster)
    ns = f"/api/v1/namespaces/{namespace}"
    assert cluster.admin.create(f"{ns}/configmaps", {"metadata": {"name": "blocker"}}).status_code == 201
    assert cluster.admin.create(f"{ns}/configmaps", {"metadata": {"name": "cfg"}}).status_code == 201
    claim = {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                                                   "resources": {"requests": {"storage": "1Gi"}}}}
    assert cluster.admin.create(f"{ns}/persistentvolumeclaims", claim).status_code == 201
    svc = {"metadata": {"name": "api"}, "spec": {"ports": [{"port": 80}], "selector": {"app": "api"}}}
    assert cluster.admin.create(f"{ns}/services", svc).status_code == 201
    widget = {"apiVersion": f"{widgets}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert cluster.admin.create(f"/apis/{widgets}/v1/namespaces/{namespace}/widgets", widget).status_code == 201

    providers = {  # CriticalService -> (group, resource as written, kubectl's name of the provider)
        unique("cm"): ("", "ConfigMap", "configmap/cfg"),
        unique("pvc"): ("", "persistentvolumeclaims", "pvc/data"),
        unique("svc"): ("", "svc", "service/api"),
        unique("widget"): (widgets, "widgets", f"widgets.{widgets}/w"),
    }
    try:
        for name, (group, resource, target) in providers.items():
            _create(cluster, _service(name, group, resource, namespace, target.split("/")[1], "blocker"))
        labelled_by_name: dict[str, bool] = {}
        for name, (_, _, target) in providers.items():
            # Enforcing once the gate's label is stored (the stand-in has no RBAC); on the real control plane the
            # gate may not patch ConfigMaps or the widgets (criticalsvc-labeller grants neither): EnforcingByRoute.
            wait_for(lambda n=name: _ready(cluster, n).get("status") == "True", timeout=60,
                     what=f"{name} Ready=True")
            found = cluster.kubectl("get", "-n", namespace, target, "-o", "jsonpath={.metadata.labels}")
            labelled = labelled_by_name[name] = PROTECTED_LABEL in found.stdout
            assert _ready(cluster, name)["reason"] == ("Enforcing" if labelled else "EnforcingByRoute"), found.stdout
            refused = cluster.kubectl("delete", "-n", namespace, target, "--wait=false")
            assert refused.returncode != 0, refused.stdout
            webhook = "protected.gate.criticalsvc.io" if labelled else DELETE_WEBHOOK
            assert f'admission webhook "{webhook}" denied the request' in refused.stderr
            assert f"CriticalService {name} protects it until: configmaps {namespace}/blocker still exists" \
                in refused.stderr
        widget_route = (widgets, "widgets")
        # A widget the gate could not label is routed by name; a labelled one needs no route of its own (the leader
        # drops it at its next round once the label is stored).
        widget = next(n for n, (_, _, target) in providers.items() if target.startswith("widgets."))
        if labelled_by_name[widget]:
            wait_for(lambda: widget_route not in _routed_types(cluster), timeout=30,
                     what="the labelled widget's route by name dropped")
        else:
            assert widget_route in _routed_types(cluster)

        assert cluster.admin.delete(f"{ns}/configmaps/blocker").status_code == 200
        for _name, (_, _, target) in providers.items():
            wait_for(lambda t=target: cluster.kubectl("delete", "-n", namespace, t, "--wait=false").returncode == 0,
                     timeout=60, what=f"{target} deletable once the criterion holds")
        # The real control plane runs no PVC-protection controller: its finalizer is removed as that would.
        cluster.admin.merge_patch(f"{ns}/persistentvolumeclaims/data", {"metadata": {"finalizers": None}})
        for name in providers:
            wait_for(lambda n=name: cluster.admin.delete(f"{CRITICAL_SERVICES}/{n}").status_code in (200, 404),
                     timeout=60, what=f"CriticalService {name} deleted")
        wait_for(lambda: widget_route not in _routed_types(cluster), timeout=60,
                 what="the widgets route removed with its CriticalService")
        assert _shipped_version(cluster) == shipped_version
    finally:
        for name in providers:
            cluster.admin.delete(f"{CRITICAL_SERVICES}/{name}")


def _widget_service(cluster: Backend, namespace: str, group: str) -> str:
    ns = f"/api/v1/namespaces/{namespace}"
    assert cluster.admin.create(f"{ns}/configmaps", {"metadata": {"name": "blocker"}}).status_code == 201
    widget = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert cluster.admin.create(f"/apis/{group}/v1/namespaces/{namespace}/widgets", widget).status_code == 201
    name = unique("widget")
    _create(cluster, _service(name, group, "widgets", namespace, "w", "blocker"))
    return name


def _release(cluster: Backend, namespace: str, group: str, name: str) -> None:
    """Let the widget go (its criterion met), then its CriticalService (which goes after its provider)."""
    cluster.admin.delete(f"/api/v1/namespaces/{namespace}/configmaps/blocker")
    widget = f"/apis/{group}/v1/namespaces/{namespace}/widgets/w"
    wait_for(lambda: cluster.admin.delete(widget).status_code in (200, 404), timeout=60, what="the widget deleted")
    wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{name}").status_code in (200, 404), timeout=60,
             what="the CriticalService deleted")


def test_the_owned_configuration_goes_with_the_shipped_one(cluster: Backend, namespace: str, widgets: str) -> None:
    """The owned configuration names the shipped one as its owner; deleting the shipped one (the way out of an
    outage) lets kube-controller-manager's garbage collector delete it. The shipped one is put back after."""
    name = _widget_service(cluster, namespace, widgets)
    # A provider that does not exist yet: routed by name (a label carries what exists), so the owned configuration
    # holds a route.
    absent = unique("absent")
    _create(cluster, _service(absent, "", "configmaps", namespace, "not-yet", "blocker"))
    shipped = cluster.admin.get(f"{CONFIGURATIONS}/criticalsvc")
    assert shipped is not None
    try:
        wait_for(lambda: _ready(cluster, absent).get("reason") == "Enforcing", timeout=60, what="Ready=True")
        owned = gate_configurations(cluster.admin)
        assert owned
        for each in owned:
            (owner,) = each["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"]) == ("ValidatingWebhookConfiguration", "criticalsvc",
                                                                     shipped["metadata"]["uid"])
        assert cluster.admin.delete(f"{CONFIGURATIONS}/criticalsvc").status_code == 200
        wait_for(lambda: not gate_configurations(cluster.admin), timeout=60,
                 what="the garbage collector to delete every criticalsvc-providers configuration")
        for each in (name, absent):  # with the shipped configuration gone, no label routes anything either
            wait_for(lambda n=each: _ready(cluster, n).get("reason") == "RoutingFailed", timeout=60,
                     what=f"{each} Ready=False/RoutingFailed while the shipped configuration is gone")
    finally:
        if not cluster.admin.exists(f"{CONFIGURATIONS}/criticalsvc"):
            again = copy.deepcopy(shipped)
            again["metadata"] = {k: v for k, v in shipped["metadata"].items() if k in ("name", "labels", "annotations")}
            assert cluster.admin.create(CONFIGURATIONS, again).status_code == 201
        wait_for(lambda: _ready(cluster, absent).get("reason") == "Enforcing", timeout=60,
                 what="the route written again, owned by the new shipped configuration")
        _release(cluster, namespace, widgets, name)
        wait_for(lambda: cluster.admin.delete(f"{CRITICAL_SERVICES}/{absent}").status_code in (200, 404), timeout=60,
                 what="the CriticalService of the absent provider deleted")


@pytest.mark.realcluster
@pytest.mark.parametrize("cluster", ["real"], indirect=True)  # the stand-in has no RBAC
def test_without_rbac_for_webhook_configurations_ready_says_routing_failed(
        cluster: Backend, namespace: str, widgets: str) -> None:
    """The gate's binding to criticalsvc-webhook-router removed: Ready=False/RoutingFailed naming the API's
    answer; put back: Enforcing."""
    bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    binding = cluster.admin.get(f"{bindings}/criticalsvc-webhook-router")
    assert binding is not None
    assert cluster.admin.delete(f"{bindings}/criticalsvc-webhook-router").status_code == 200
    name = ""
    try:
        name = _widget_service(cluster, namespace, widgets)
        wait_for(lambda: _ready(cluster, name).get("reason") == "RoutingFailed", timeout=60,
                 what="Ready=False/RoutingFailed without the grant")
        message = _ready(cluster, name)["message"]
        assert "forbidden" in message.lower() and f"widgets.{widgets}" in message, message
    finally:
        if not cluster.admin.exists(f"{bindings}/criticalsvc-webhook-router"):
            again = {**binding, "metadata": {"name": binding["metadata"]["name"],
                                             "labels": binding["metadata"].get("labels") or {}}}
            assert cluster.admin.create(bindings, again).status_code == 201
    # Ready=True: Enforcing where the gate may label the widget, EnforcingByRoute where it may not (the real
    # control plane: criticalsvc-labeller grants no patch on a custom type).
    wait_for(lambda: _ready(cluster, name).get("reason") in ("Enforcing", "EnforcingByRoute"), timeout=60,
             what="Ready=True once the grant is back")
    _release(cluster, namespace, widgets, name)
