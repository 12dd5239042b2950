"""The gate's own webhook configuration for provider types (criticalsvc/routing.py), pure: the rules each
CriticalService needs, the rendered object, reading it back, comparing it with what the API server stores;
and what status and decisions make of the routing facts."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from criticalsvc.admission import AdmissionRequest, parse_review, render_review
from criticalsvc.api import (
    CRITICAL_SERVICES,
    GroupResource,
    HoldUpdates,
    ScaleToZero,
    parse_critical_service,
)
from criticalsvc.decision import Rule, decide
from criticalsvc.objects import KubeObject
from criticalsvc.restmapper import ResourceType, RESTMapper
from criticalsvc.routing import (
    DELETE_WEBHOOK,
    PROVIDERS_CONFIGURATION,
    STATIC_ROUTES,
    UPDATE_WEBHOOK,
    Route,
    RoutingFacts,
    desired_routes,
    for_update,
    render,
    routes_of,
    same_configuration,
)
from criticalsvc.sim.webhooks import ProviderRoutesRule
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

ROOT = Path(__file__).resolve().parents[1]
CONFIGMAPS = GroupResource("", "configmaps")
DEPLOYMENTS = GroupResource("apps", "deployments")
WIDGETS = GroupResource("widgets.example.com", "widgets")
WIDGET = ResourceType("widgets.example.com", "v1beta1", "Widget", "widgets", "widget", False)


def shipped() -> dict[str, Any]:
    """deploy/'s configuration as the API server stores it: with a uid (and a caBundle)."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy/base/webhook.yaml").read_text())
    config["metadata"].update(uid="5e1f0000-0000-4000-8000-000000000001", resourceVersion="7")
    return config


def service(name: str, gr: GroupResource, *, namespace: str = "app", hold: bool = False,
            scale: bool = False) -> Any:
    spec: dict[str, Any] = {
        "provider": {"group": gr.group, "resource": gr.resource, "namespace": namespace, "name": "p"},
        "criteria": [{"type": "SpecificResource", "specificResource": {"resource": "configmaps", "namespace": "x",
                                                                       "name": "y"}}]}
    if hold:
        spec["holdUpdates"] = HoldUpdates.WHILE_BLOCKING.value
    if scale:
        spec["scaleToZero"] = ScaleToZero.DENY_WHILE_BLOCKING.value
    return parse_critical_service({"metadata": {"name": name}, "spec": spec})


def mapper() -> RESTMapper:
    m = RESTMapper()
    m.add(WIDGET)
    return m


def rendered(*services: Any) -> dict[str, Any]:
    return render(desired_routes(services, mapper().lookup), shipped())


# --- the rules --------------------------------------------------------------------------------------
def test_the_static_routes_are_what_the_shipped_configuration_routes() -> None:
    """STATIC_ROUTES is deploy/'s configuration read back, but for the labelled-objects rule (any type, by label)."""
    assert routes_of(shipped()) - {Route("DELETE", GroupResource("*", "*"))} == STATIC_ROUTES


def test_a_configmap_provider_gets_one_narrow_delete_rule() -> None:
    config = rendered(service("a", CONFIGMAPS))
    (webhook,) = config["webhooks"]
    assert webhook["name"] == DELETE_WEBHOOK
    assert webhook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"],
                                 "resources": ["configmaps"], "scope": "Namespaced"}]
    assert webhook["objectSelector"] == {"matchExpressions": [
        {"key": "criticalsvc.io/deletion-protected", "operator": "NotIn", "values": ["Always"]}]}


def test_a_custom_resource_provider_is_routed_in_its_served_version_and_scope() -> None:
    (webhook,) = rendered(service("a", WIDGETS, namespace=""))["webhooks"]
    assert webhook["rules"] == [{"apiGroups": ["widgets.example.com"], "apiVersions": ["v1beta1"],
                                 "operations": ["DELETE"], "resources": ["widgets"], "scope": "Cluster"}]


def test_a_kind_is_resolved_and_statically_routed_types_get_no_rule() -> None:
    """`Deployment` resolves to deployments.apps, which the shipped configuration routes already; an
    unserved type gets nothing (no request for it can come)."""
    services = [service("a", GroupResource("apps", "Deployment")), service("b", GroupResource("", "namespaces")),
                service("c", GroupResource("nope.example.com", "things"))]
    assert desired_routes(services, mapper().lookup) == frozenset()
    assert rendered(*services)["webhooks"] == []


def test_hold_updates_and_scale_to_zero_route_updates_and_the_scale_subresource() -> None:
    config = rendered(service("a", CONFIGMAPS, hold=True), service("b", DEPLOYMENTS, scale=True))
    assert [w["name"] for w in config["webhooks"]] == [DELETE_WEBHOOK, UPDATE_WEBHOOK]
    assert routes_of(config) == {Route("DELETE", CONFIGMAPS), Route("UPDATE", CONFIGMAPS),
                                 Route("UPDATE", DEPLOYMENTS),
                                 Route("UPDATE", GroupResource("apps", "deployments/scale"))}
    updates = config["webhooks"][1]
    assert updates["objectSelector"] == {}  # a labelled provider's UPDATE has no other webhook
    assert all(len(r["resources"]) == len(r["apiGroups"]) == len(r["operations"]) == 1 for r in updates["rules"])


def test_no_rule_has_a_wildcard() -> None:
    config = rendered(service("a", CONFIGMAPS, hold=True, scale=True), service("b", WIDGETS, namespace=""))
    for webhook in config["webhooks"]:
        for rule in webhook["rules"]:
            assert "*" not in json.dumps(rule), rule


def test_webhook_configurations_are_never_routed() -> None:
    """The API server never sends them to webhooks; a rule would route nothing."""
    vwc = GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations")
    assert desired_routes([service("a", vwc, namespace="")], mapper().lookup) == frozenset()


# --- the object -----------------------------------------------------------------------------------------
def test_the_configuration_is_owned_by_the_shipped_one_and_copies_its_settings() -> None:
    source = shipped()
    template = next(w for w in source["webhooks"] if w["name"] == "workloads.gate.criticalsvc.io")
    template["failurePolicy"] = "Ignore"  # the Helm chart's value follows
    config = render(desired_routes([service("a", CONFIGMAPS)], mapper().lookup), source)
    assert config["metadata"]["name"] == PROVIDERS_CONFIGURATION
    assert config["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "criticalsvc"
    assert config["metadata"]["ownerReferences"] == [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "name": "criticalsvc", "uid": "5e1f0000-0000-4000-8000-000000000001"}]
    (webhook,) = config["webhooks"]
    assert webhook["clientConfig"] == template["clientConfig"]
    assert webhook["namespaceSelector"] == template["namespaceSelector"]
    assert webhook["failurePolicy"] == "Ignore"
    assert (webhook["sideEffects"], webhook["matchPolicy"], webhook["timeoutSeconds"],
            webhook["admissionReviewVersions"]) == ("NoneOnDryRun", "Equivalent", 5, ["v1"])


def test_a_url_client_config_and_a_new_ca_bundle_are_copied() -> None:
    source = shipped()
    for w in source["webhooks"]:
        w["clientConfig"] = {"url": "https://127.0.0.1:8443/validate", "caBundle": "bmV3Cg=="}
    first = render(desired_routes([service("a", CONFIGMAPS)], mapper().lookup), shipped())
    again = render(desired_routes([service("a", CONFIGMAPS)], mapper().lookup), source)
    assert again["webhooks"][0]["clientConfig"] == {"url": "https://127.0.0.1:8443/validate", "caBundle": "bmV3Cg=="}
    assert not same_configuration(first, again)


def stored(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as the API server returns it: server-set metadata, defaults filled in, others' labels added."""
    out = copy.deepcopy(config)
    out["metadata"].update(uid="u-1", resourceVersion="42", generation=3, creationTimestamp="2026-01-01T00:00:00Z",
                           managedFields=[{"manager": "criticalsvc"}])
    out["metadata"]["labels"]["team"] = "platform"
    out["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = None
    for webhook in out["webhooks"]:
        for rule in webhook["rules"]:
            rule.pop("scope")
            rule["scope"] = "Namespaced" if rule["resources"] == ["configmaps"] else rule.get("scope", "*")
        webhook.pop("matchPolicy")
    return out


def test_equality_ignores_what_the_server_sets_and_sees_every_change() -> None:
    config = rendered(service("a", CONFIGMAPS))
    assert same_configuration(stored(config), config)
    assert not same_configuration(None, config)
    assert not same_configuration(stored(config), rendered(service("a", CONFIGMAPS, hold=True)))
    other_owner = stored(config)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert not same_configuration(other_owner, config)
    emptied = rendered()
    assert emptied["webhooks"] == [] and not same_configuration(stored(config), emptied)


def test_an_update_carries_the_resource_version_and_keeps_others_labels() -> None:
    config = rendered(service("a", CONFIGMAPS))
    body = for_update(rendered(service("a", CONFIGMAPS, hold=True)), stored(config))
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["labels"]["team"] == "platform"
    assert body["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "criticalsvc"


def test_read_back_is_what_was_rendered() -> None:
    rules = desired_routes([service("a", CONFIGMAPS, hold=True, scale=True), service("b", WIDGETS, namespace="")],
                           mapper().lookup)
    assert routes_of(render(rules, shipped())) == {r.route for r in rules}
    assert routes_of(None) == frozenset()


# --- property: the routed set is the provider types' needs, minus what is routed already -------------------
TYPES = [CONFIGMAPS, DEPLOYMENTS, WIDGETS, GroupResource("", "persistentvolumeclaims"), GroupResource("", "Service"),
         GroupResource("networking.k8s.io", "netpol"), GroupResource("", "namespaces"), CRITICAL_SERVICES,
         GroupResource("nope.example.com", "things")]
# An oracle written from the issue, independent of routing.py's code: canonical names by hand.
CANONICAL = {CONFIGMAPS: CONFIGMAPS, DEPLOYMENTS: DEPLOYMENTS, WIDGETS: WIDGETS,
             GroupResource("", "persistentvolumeclaims"): GroupResource("", "persistentvolumeclaims"),
             GroupResource("", "Service"): GroupResource("", "services"),
             GroupResource("networking.k8s.io", "netpol"): GroupResource("networking.k8s.io", "networkpolicies"),
             GroupResource("", "namespaces"): GroupResource("", "namespaces"), CRITICAL_SERVICES: CRITICAL_SERVICES}
SHIPPED_DELETES = {"namespaces", "deployments", "statefulsets", "daemonsets", "customresourcedefinitions",
                   "criticalservices"}


@given(st.lists(st.tuples(st.sampled_from(TYPES), st.booleans(), st.booleans()), max_size=6))
def test_the_routed_set_is_what_the_providers_need(picks: list[tuple[GroupResource, bool, bool]]) -> None:
    services = [service(f"s{i}", gr, hold=hold, scale=scale) for i, (gr, hold, scale) in enumerate(picks)]
    expected: set[Route] = set()
    for gr, hold, scale in picks:
        canonical = CANONICAL.get(gr)
        if canonical is None:
            continue
        if canonical.resource not in SHIPPED_DELETES:
            expected.add(Route("DELETE", canonical))
        if (hold or scale) and canonical != CRITICAL_SERVICES:
            expected.add(Route("UPDATE", canonical))
        if scale:
            expected.add(Route("UPDATE", GroupResource(canonical.group, canonical.resource + "/scale")))
    assert routes_of(render(desired_routes(services, mapper().lookup), shipped())) == expected


# --- status ---------------------------------------------------------------------------------------------------
def ready(cs: Any, routing: RoutingFacts | None) -> dict[str, Any]:
    state = MemoryState(mapper())
    state.upsert_critical_service(cs)
    status = compute_status(cs, state, now=1_700_000_000, routing=routing)
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_ready_says_whether_and_why_not_the_provider_is_enforced() -> None:
    cs = service("a", CONFIGMAPS)
    assert ready(cs, None)["reason"] == "ProviderNotRouted"
    assert "add configmaps" in ready(cs, None)["message"]
    assert ready(cs, RoutingFacts(managed=True))["reason"] == "RoutePending"
    failed = ready(cs, RoutingFacts(managed=True, error="403 Forbidden: cannot create"))
    assert (failed["status"], failed["reason"]) == ("False", "RoutingFailed")
    assert "403 Forbidden: cannot create" in failed["message"]
    enforcing = ready(cs, RoutingFacts(managed=True, routed=frozenset({Route("DELETE", CONFIGMAPS)})))
    assert (enforcing["status"], enforcing["reason"]) == ("True", "Enforcing")


def test_ready_needs_the_update_routes_a_spec_asks_for() -> None:
    plain, held = service("a", DEPLOYMENTS), service("b", DEPLOYMENTS, hold=True, scale=True)
    assert ready(plain, None)["reason"] == "Enforcing"  # deployments' DELETEs are routed statically
    assert ready(held, None)["reason"] == "ProviderNotRouted"
    partly = RoutingFacts(managed=True, routed=frozenset({Route("UPDATE", DEPLOYMENTS)}))
    assert "UPDATE deployments.apps/scale" in ready(held, partly)["message"]
    scale = GroupResource("apps", "deployments/scale")
    whole = RoutingFacts(managed=True, routed=frozenset({Route("UPDATE", DEPLOYMENTS), Route("UPDATE", scale)}))
    assert ready(held, whole)["reason"] == "Enforcing"


# --- decisions --------------------------------------------------------------------------------------------
def test_no_unrouted_warning_when_the_gate_manages_routes() -> None:
    obj = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "a"},
           "spec": {"provider": {"resource": "configmaps", "namespace": "app", "name": "p"},
                    "criteria": [{"type": "SpecificResource",
                                  "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}}
    request = AdmissionRequest(uid="1", group_resource=CRITICAL_SERVICES, operation="CREATE", name="a", namespace="",
                               object=obj, old_object=None)
    state = MemoryState()
    unmanaged = decide(request, state)
    assert any("sends no DELETE of configmaps" in w for w in unmanaged.warnings)
    managed = decide(request, state, manages_routes=True)
    assert managed.allowed and not any("sends no DELETE" in w for w in managed.warnings)


def test_a_provider_type_delete_without_old_object_is_decided_from_the_cache() -> None:
    """The providers webhook routes configmaps by type: without oldObject the gate reads its cached copy."""
    state = MemoryState()
    cs = service("a", CONFIGMAPS)
    state.upsert_critical_service(cs)
    state.upsert(KubeObject(CONFIGMAPS, "app", "p"))
    state.upsert(KubeObject(CONFIGMAPS, "x", "y"))
    request = AdmissionRequest(uid="1", group_resource=CONFIGMAPS, operation="DELETE", name="p", namespace="app",
                               object=None, old_object=None)
    decision = decide(parse_review(render_review(request)), state)
    assert decision.rule is Rule.BLOCKED and "CriticalService a protects it" in decision.message
    secret = AdmissionRequest(uid="2", group_resource=GroupResource("", "secrets"), operation="DELETE", name="s",
                              namespace="app", object=None, old_object=None)
    assert decide(secret, state).rule is Rule.UNIDENTIFIED  # only the label can have sent it


# --- the simulator's dynamic rule -------------------------------------------------------------------------------
def test_the_simulator_routes_what_the_router_would_write() -> None:
    state = MemoryState(mapper())
    rule = ProviderRoutesRule(state)
    plain = {"metadata": {"name": "p"}}
    labelled = {"metadata": {"name": "p", "labels": {"criticalsvc.io/deletion-protected": "Always"}}}
    assert not rule.matches("DELETE", CONFIGMAPS, None, plain)
    state.upsert_critical_service(service("a", CONFIGMAPS, hold=True))
    assert rule.matches("DELETE", CONFIGMAPS, None, plain)
    assert not rule.matches("DELETE", CONFIGMAPS, None, labelled)  # the labelled-objects rule has it
    assert rule.matches("UPDATE", CONFIGMAPS, plain, labelled)
    assert not rule.matches("DELETE", GroupResource("", "secrets"), None, plain)
