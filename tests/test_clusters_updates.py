"""UPDATEs of providers (issue 11) as a user meets them, on both clusters (the `cluster` fixture): an
object lock (spec.holdUpdates: WhileBlocking) refuses `kubectl label/patch/apply` of the locked ConfigMap
naming the lock, never the removal of a finalizer, and lets updates through once the lock is deleted; a
Deployment with spec.scaleToZero: DenyWhileBlocking refuses `kubectl scale --replicas=0` (a write of the
`scale` subresource, whose objects are autoscaling/v1 Scales) but not `--replicas=1`.

The UPDATE routes are the gate's own: its leader writes the ValidatingWebhookConfiguration ROUTES
(criticalsvc/routing.py) for the provider types of CriticalServices that hold updates or scaling to zero.
The tests wait for that route (ROUTES naming UPDATE of the type) and then for the gate to answer through
it, so they hold whichever replica writes it and however long the API server takes to see it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.backends import Backend, deployment_manifest, gate_webhooks, ok, unique
from tests.realcluster.teardown import wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
CLUSTERROLES = "/apis/rbac.authorization.k8s.io/v1/clusterroles"
WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
# The gate-owned configuration that routes UPDATEs of provider types (criticalsvc/routing.py).
ROUTES = "criticalsvc-providers"  # and its shards, -1 .. -7 (tests.backends.gate_webhooks)
ROUTE_TIMEOUT = 90


def routed(cluster: Backend, group: str, resource: str) -> bool:
    """Whether ROUTES has a rule sending UPDATEs of group/resource (e.g. "deployments/scale") to the gate."""
    for webhook in gate_webhooks(cluster.admin):
        for rule in webhook.get("rules") or []:
            if ({"UPDATE", "*"} & set(rule.get("operations") or []) and {group, "*"} & set(rule.get("apiGroups") or [])
                    and resource in (rule.get("resources") or [])):
                return True
    return False


def _ready_status(cluster: Backend, service: str) -> str:
    cs = cluster.admin.get(f"{CRITICAL_SERVICES}/{service}") or {}
    ready = [c for c in (cs.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return str(ready[0].get("status")) if ready else ""


def wait_for_route(cluster: Backend, group: str, resource: str) -> None:
    wait_for(lambda: routed(cluster, group, resource), timeout=ROUTE_TIMEOUT,
             what=f"{ROUTES} to route UPDATE of {resource} (API group {group or 'core'}) to the gate")


def denied_naming(result: Any, *parts: str) -> bool:
    return bool(result.returncode != 0 and "denied the request" in result.stderr
                and all(p in result.stderr for p in parts))


def critical_service(name: str, provider: dict[str, str], lock: dict[str, str], **spec: str) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider, "criteria": [{"type": "SpecificResource", "specificResource": lock}],
                     **spec}}


@pytest.fixture
def configmap_reader(cluster: Backend) -> Iterator[None]:
    """ConfigMaps are not among the types the gate reads by default: grant it, as a user would."""
    name = unique("read-configmaps")
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    assert cluster.admin.create(CLUSTERROLES, role).status_code == 201
    yield
    cluster.admin.delete(f"{CLUSTERROLES}/{name}")


def test_an_object_lock_holds_updates_but_never_a_finalizer_removal(
        cluster: Backend, namespace: str, configmap_reader: None) -> None:
    service = unique("lock")
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    locked = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "settings", "namespace": namespace, "finalizers": ["example.com/cleanup"]},
              "data": {"mode": "a"}}
    assert cluster.admin.create(configmaps, locked).status_code == 201
    lock = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "lock-settings", "namespace": namespace}}
    assert cluster.admin.create(configmaps, lock).status_code == 201
    created = cluster.admin.create(CRITICAL_SERVICES, critical_service(
        service, {"resource": "configmaps", "namespace": namespace, "name": "settings"},
        {"resource": "configmaps", "namespace": namespace, "name": "lock-settings"}, holdUpdates="WhileBlocking"))
    assert created.status_code == 201, created.text
    held = (f"configmaps {namespace}/settings may not be updated yet: CriticalService {service} holds updates of "
            f"it until: configmaps {namespace}/lock-settings still exists")
    try:
        # Routed by the gate's label where it may write it (the stand-in: protected-updates.gate sends every UPDATE of
        # an object labelled updates-held), else by name in criticalsvc-providers (the real control plane grants no
        # patch on ConfigMaps): either way Ready is True once the API server is known to send them.
        wait_for(lambda: _ready_status(cluster, service) == "True", timeout=ROUTE_TIMEOUT,
                 what=f"{service} Ready=True (its held updates routed)")
        wait_for(lambda: denied_naming(cluster.kubectl("label", "configmap", "settings", "-n", namespace, "team=a",
                                                       "--dry-run=server"), held),
                 timeout=60, what="the gate to hold updates of the locked ConfigMap")

        labelled = cluster.kubectl("label", "configmap", "settings", "-n", namespace, "team=a")
        assert denied_naming(labelled, held, "criticalsvc.io/break-glass=<reason>"), labelled.stderr
        patched = cluster.kubectl("patch", "configmap", "settings", "-n", namespace, "--type=merge",
                                  "-p", '{"data": {"mode": "b"}}')
        assert denied_naming(patched, held), patched.stderr
        applied = cluster.kubectl("apply", "-f", "-", input=json.dumps({**locked, "data": {"mode": "c"}}))
        assert denied_naming(applied, held), applied.stderr
        current = cluster.admin.get(f"{configmaps}/settings")
        assert current is not None and current["data"] == {"mode": "a"}
        assert "team" not in (current["metadata"].get("labels") or {})  # the gate's own labels may be there

        # What a finalizer controller does last is never held (else the lock would wedge a teardown).
        ok(cluster.kubectl("patch", "configmap", "settings", "-n", namespace, "--type=json",
                           "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]'))
        current = cluster.admin.get(f"{configmaps}/settings")
        assert current is not None and not current["metadata"].get("finalizers")

        ok(cluster.kubectl("delete", "configmap", "lock-settings", "-n", namespace))
        wait_for(lambda: cluster.kubectl("label", "configmap", "settings", "-n", namespace, "team=a").returncode == 0,
                 timeout=60, what="updates of the ConfigMap to pass once its lock is gone")
    finally:
        for path in (f"{configmaps}/lock-settings", f"{configmaps}/settings", f"{CRITICAL_SERVICES}/{service}"):
            wait_for(lambda p=path: cluster.admin.delete(p).status_code in (200, 202, 404), timeout=60,
                     what=f"DELETE {path}")


def test_scale_to_zero_is_refused_while_blocking_and_scaling_down_is_not(
        cluster: Backend, namespace: str, configmap_reader: None) -> None:
    service = unique("scale")
    deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    assert cluster.admin.create(deployments, deployment_manifest("web", namespace, replicas=2)).status_code == 201
    lock = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "clients", "namespace": namespace}}
    assert cluster.admin.create(configmaps, lock).status_code == 201
    created = cluster.admin.create(CRITICAL_SERVICES, critical_service(
        service, {"group": "apps", "resource": "deployments", "namespace": namespace, "name": "web"},
        {"resource": "configmaps", "namespace": namespace, "name": "clients"}, scaleToZero="DenyWhileBlocking"))
    assert created.status_code == 201, created.text
    refused = (f"deployments.apps {namespace}/web may not be scaled to 0 replicas yet: CriticalService {service} "
               f"forbids scaling it to 0 replicas until: configmaps {namespace}/clients still exists")

    def scale(replicas: int, *extra: str) -> Any:
        return cluster.kubectl("scale", "deployment", "web", "-n", namespace, f"--replicas={replicas}", *extra)

    try:
        wait_for_route(cluster, "apps", "deployments/scale")
        wait_for(lambda: denied_naming(scale(0, "--dry-run=server"), refused), timeout=60,
                 what="the gate to refuse scaling the Deployment to zero")
        assert denied_naming(scale(0), refused), scale(0).stderr
        assert ok(scale(1)).strip() == "deployment.apps/web scaled"
        current = cluster.admin.get(f"{deployments}/web")
        assert current is not None and current["spec"]["replicas"] == 1

        ok(cluster.kubectl("delete", "configmap", "clients", "-n", namespace))
        wait_for(lambda: scale(0).returncode == 0, timeout=60, what="scaling to zero to pass once the criteria hold")
        current = cluster.admin.get(f"{deployments}/web")
        assert current is not None and current["spec"]["replicas"] == 0
    finally:
        for path in (f"{configmaps}/clients", f"{deployments}/web", f"{CRITICAL_SERVICES}/{service}"):
            wait_for(lambda p=path: cluster.admin.delete(p).status_code in (200, 202, 404), timeout=60,
                     what=f"DELETE {path}")
