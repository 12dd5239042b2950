"""Routing (criticalsvc/routing.py), pure: only what may concern something protected reaches the gate.

Three layers are checked against each other, each against an independent judge:

* the decision (decision.decide) is the oracle: every request it would deny, or on which a CriticalService
  had a say, must be routed - by the shipped configuration or by a route some CriticalService needs;
* the Python predicate (routing.covers) is what the simulator routes with;
* the rendered configuration is evaluated as the API server evaluates it - rules, objectSelector,
  namespaceSelector and matchConditions, the CEL run by cel-python on the request as the API server
  builds it - and must send the gate exactly what the predicate covers (more only where it says it is
  broad), and never fail to evaluate (an error refuses the request under failurePolicy Fail).

The negative controls: a routing that leaves one provider out is caught by the oracle, and an unguarded
read of an omitempty request field is caught by the evaluator.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies_core import LABEL_VALUES, NAMESPACES, OPERATORS, label_sets, pick

from criticalsvc.admission import AdmissionRequest, parse_review, render_review
from criticalsvc.api import (
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    PROTECTED_LABEL,
    GroupResource,
    HoldUpdates,
    ScaleToZero,
    parse_critical_service,
)
from criticalsvc.decision import Rule, decide
from criticalsvc.labels import parse_label_selector
from criticalsvc.manifests import Manifest
from criticalsvc.objects import KubeObject
from criticalsvc.restmapper import ResourceType, RESTMapper
from criticalsvc.routing import (
    DELETE_WEBHOOK,
    MAX_EXPRESSION_CHARS,
    NAMESPACES_WEBHOOK,
    PROBE_CONFIGMAP,
    PROBE_WEBHOOK,
    PROVIDERS_CONFIGURATION,
    Desired,
    Route,
    Routing,
    call_of,
    covers,
    desired,
    route_key,
)
from criticalsvc.sim import matchconditions
from criticalsvc.sim.webhook_client import webhooks_from_configuration
from criticalsvc.sim.webhooks import ProviderRoutesRule
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status
from criticalsvc.webhookconfigurations import (
    SHARDS,
    Rendered,
    configuration_name,
    digest_in,
    for_update,
    probe_answer,
    probe_configmap,
    probe_digest,
    render,
    render_all,
    same_configuration,
    shard_in,
    shard_of,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIGMAPS = GroupResource("", "configmaps")
DEPLOYMENTS = GroupResource("apps", "deployments")
NAMESPACES_GR = GroupResource("", "namespaces")
WIDGETS = GroupResource("widgets.example.com", "widgets")
WIDGET = ResourceType("widgets.example.com", "v1beta1", "Widget", "widgets", "widget", False)
PROBE_NAMESPACE = "criticalsvc-system"


def shipped() -> dict[str, Any]:
    """deploy/'s configuration as the API server stores it: with a uid (and a caBundle)."""
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy/base/webhook.yaml").read_text())
    config["metadata"].update(uid="5e1f0000-0000-4000-8000-000000000001", resourceVersion="7")
    return config


def service(name: str, gr: GroupResource, *, namespace: str = "app", hold: bool = False, scale: bool = False,
            selector: dict[str, Any] | None = None) -> Any:
    provider: dict[str, Any] = {"group": gr.group, "resource": gr.resource}
    if namespace:
        provider["namespace"] = namespace
    if selector is None:
        provider["name"] = "p"
    else:
        provider["selector"] = selector
    spec: dict[str, Any] = {"provider": provider, "criteria": [
        {"type": "SpecificResource", "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}
    if hold:
        spec["holdUpdates"] = HoldUpdates.WHILE_BLOCKING.value
    if scale:
        spec["scaleToZero"] = ScaleToZero.DENY_WHILE_BLOCKING.value
    return parse_critical_service({"metadata": {"name": name}, "spec": spec})


def mapper() -> RESTMapper:
    m = RESTMapper()
    m.add(WIDGET)
    return m


def wanted(*services: Any, lookup: Callable[[GroupResource], ResourceType | None] | None = None) -> Desired:
    return desired(services, lookup or mapper().lookup)


def render_one(routes: Desired, source: Mapping[str, Any] | None = None) -> Rendered:
    """Every route of `routes` in one configuration (shard 0's): what a webhook looks like does not depend on which
    configuration holds it (test_the_routes_are_spread_over_the_shards_by_namespace checks where each goes)."""
    return render(routes.routes, routes.types, shipped() if source is None else source, probe_namespace=PROBE_NAMESPACE)


def rendered(*services: Any) -> dict[str, Any]:
    return render_one(wanted(*services)).configuration


def named(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in config["webhooks"]}


# --- the API server's side, evaluated -------------------------------------------------------------------------
class _NoStore:
    """webhooks_from_configuration reads the store lazily, for namespace labels and served versions: every
    namespace exists, with the label the API server gives it."""

    def __init__(self, types: RESTMapper) -> None:
        self.mapper = types

    def get(self, _gr: Any, _namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}}}


def api_server_sends(config: Mapping[str, Any], request: AdmissionRequest, *, types: RESTMapper) -> list[str]:
    """The webhooks of `config` the API server would call for `request` (raises on a matchCondition error)."""
    hooks = webhooks_from_configuration(config, store=_NoStore(types),  # type: ignore[arg-type]
                                        hook_factory=lambda *a, **k: (lambda review: review))
    gr = request.group_resource
    matched = GroupResource(gr.group, f"{gr.resource}/{request.sub_resource}") if request.sub_resource else gr
    review = dict(render_review(request))["request"]
    out = []
    for hook in hooks:
        namespace = request.name if gr == NAMESPACES_GR else request.namespace
        if hook.matches(request.operation, matched, namespace, request.object, request.old_object,
                        name=request.name, request=lambda: review):
            out.append(hook.name)
    return out


# --- the shipped configuration ----------------------------------------------------------------------------------
def test_the_shipped_configuration_routes_only_what_is_the_gates_whatever_the_services_say() -> None:
    """Five webhooks: CriticalServices, the CriticalService CRD, objects labelled deletion-protected, and what the
    gate labelled criticalsvc.io/protected; no other namespace, workload or CRD DELETE reaches the gate through
    it."""
    config = shipped()
    assert [w["name"] for w in config["webhooks"]] == [
        "criticalservices.gate.criticalsvc.io", "crds.gate.criticalsvc.io", "labelled.gate.criticalsvc.io",
        "protected.gate.criticalsvc.io", "protected-updates.gate.criticalsvc.io"]
    types = mapper()

    def sent(gr: GroupResource, name: str, namespace: str = "", labels: Mapping[str, str] | None = None,
             collection: bool = False) -> list[str]:
        old = {"metadata": {"name": name, **({"namespace": namespace} if namespace else {}),
                            "labels": dict(labels or {})}}
        return api_server_sends(config, AdmissionRequest(
            uid="u", group_resource=gr, operation="DELETE", name="" if collection else name,
            namespace=name if gr == NAMESPACES_GR else namespace, object=None, old_object=old), types=types)

    assert sent(NAMESPACES_GR, "team") == []
    assert sent(DEPLOYMENTS, "web", "team") == []
    assert sent(CRDS, "widgets.widgets.example.com") == []
    assert sent(CRDS, CRD_NAME) == ["crds.gate.criticalsvc.io"]
    assert sent(CRDS, CRD_NAME, collection=True) == ["crds.gate.criticalsvc.io"]  # the name from oldObject
    assert sent(CRITICAL_SERVICES, "cs") == ["criticalservices.gate.criticalsvc.io"]
    assert sent(DEPLOYMENTS, "web", "team", {DELETION_PROTECTED_LABEL: DELETION_PROTECTED_ALWAYS}) == [
        "labelled.gate.criticalsvc.io"]
    assert sent(DEPLOYMENTS, "web", "team", {PROTECTED_LABEL: "true"}) == ["protected.gate.criticalsvc.io"]
    assert sent(NAMESPACES_GR, "team", labels={PROTECTED_LABEL: "true"}) == ["protected.gate.criticalsvc.io"]
    assert sent(CRDS, "widgets.widgets.example.com", labels={PROTECTED_LABEL: "true"}) == [
        "protected.gate.criticalsvc.io"]
    # Both labels: one webhook answers, the one that always denies.
    assert sent(DEPLOYMENTS, "web", "team", {PROTECTED_LABEL: "true",
                                             DELETION_PROTECTED_LABEL: DELETION_PROTECTED_ALWAYS}) == [
        "labelled.gate.criticalsvc.io"]


# --- what each CriticalService needs ----------------------------------------------------------------------------
def test_a_named_provider_routes_its_own_delete_its_namespace_and_nothing_else() -> None:
    routes = wanted(service("a", DEPLOYMENTS, namespace="team")).routes
    assert routes == {Route("DELETE", DEPLOYMENTS, "team", "p"), Route("DELETE", NAMESPACES_GR, name="team")}
    config = rendered(service("a", DEPLOYMENTS, namespace="team"))
    assert [w["name"] for w in config["webhooks"]] == [NAMESPACES_WEBHOOK, DELETE_WEBHOOK, PROBE_WEBHOOK]
    (rule,) = named(config)[DELETE_WEBHOOK]["rules"]
    assert rule == {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["DELETE"],
                    "resources": ["deployments"], "scope": "Namespaced"}


def test_a_custom_resource_provider_routes_its_crd_in_its_served_version_and_scope() -> None:
    routes = wanted(service("a", WIDGETS, namespace="")).routes
    assert routes == {Route("DELETE", WIDGETS, None, "p"), Route("DELETE", CRDS, name="widgets.widgets.example.com")}
    (rule,) = named(rendered(service("a", WIDGETS, namespace="")))[DELETE_WEBHOOK]["rules"]
    assert (rule["apiVersions"], rule["scope"]) == (["v1beta1"], "Cluster")


def test_held_updates_and_scale_to_zero_route_the_provider_and_its_scale_subresource() -> None:
    routes = wanted(service("a", DEPLOYMENTS, hold=True, scale=True)).routes
    assert Route("UPDATE", DEPLOYMENTS, "app", "p") in routes
    assert Route("UPDATE", GroupResource("apps", "deployments/scale"), "app", "p") in routes
    selected = wanted(service("b", DEPLOYMENTS, scale=True, selector={"matchLabels": {"app": "db"}})).routes
    # A Scale has no labels: a selected provider's scale updates are routed by what they ask for.
    assert Route("UPDATE", GroupResource("apps", "deployments/scale"), "app", to_zero=True) in selected


def test_a_selector_without_a_namespace_routes_every_namespace_delete_and_says_so() -> None:
    """The cause is broad; a named provider whose namespace route it subsumes is not (measured: one such selector
    made all 1,056 CriticalServices of a benchmark report Broad)."""
    cs = service("a", CONFIGMAPS, namespace="", selector={"matchLabels": {"app": "db"}})
    other = service("b", DEPLOYMENTS, namespace="team")
    result = render_one(wanted(cs, other))
    namespaces = named(result.configuration)[NAMESPACES_WEBHOOK]
    assert "matchConditions" not in namespaces
    assert "any namespace" in result.broad[Route("DELETE", NAMESPACES_GR)]
    assert set(result.broad) == {Route("DELETE", NAMESPACES_GR)}


def test_unserved_types_and_webhook_configurations_get_no_route() -> None:
    vwc = GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations")
    services = [service("a", GroupResource("nope.example.com", "things")), service("b", vwc, namespace="")]
    assert wanted(*services).routes == frozenset()
    assert [w["name"] for w in rendered(*services)["webhooks"]] == [PROBE_WEBHOOK]


def test_no_rule_has_a_wildcard() -> None:
    config = rendered(service("a", CONFIGMAPS, hold=True, scale=True), service("b", WIDGETS, namespace=""))
    for webhook in config["webhooks"]:
        for rule in webhook["rules"]:
            assert "*" not in json.dumps(rule), rule


# --- the object ------------------------------------------------------------------------------------------------
def test_the_configuration_is_owned_by_the_shipped_one_and_copies_its_settings() -> None:
    source = shipped()
    template = next(w for w in source["webhooks"] if w["name"] == "labelled.gate.criticalsvc.io")
    template["failurePolicy"] = "Ignore"  # the Helm chart's value follows
    config = render_one(wanted(service("a", CONFIGMAPS)), source).configuration
    assert config["metadata"]["name"] == PROVIDERS_CONFIGURATION
    assert config["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "criticalsvc"
    assert config["metadata"]["ownerReferences"] == [{
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "name": "criticalsvc", "uid": "5e1f0000-0000-4000-8000-000000000001"}]
    webhook = named(config)[DELETE_WEBHOOK]
    assert webhook["clientConfig"] == template["clientConfig"]
    # The template's exclusions, and the one namespace its routes are in: a request elsewhere evaluates no condition.
    assert webhook["namespaceSelector"] == {"matchExpressions": [
        *template["namespaceSelector"]["matchExpressions"],
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["app"]}]}
    assert named(config)[NAMESPACES_WEBHOOK]["namespaceSelector"] == template["namespaceSelector"]
    assert webhook["failurePolicy"] == "Ignore"
    assert (webhook["sideEffects"], webhook["matchPolicy"], webhook["timeoutSeconds"],
            webhook["admissionReviewVersions"]) == ("NoneOnDryRun", "Equivalent", 5, ["v1"])


def test_the_probe_webhook_names_the_digest_of_the_rest_and_matches_only_the_probe() -> None:
    """Its path carries the digest of every other webhook; a change of routes changes it; only a dry-run
    CREATE of the probe ConfigMap in the gate's namespace reaches it, and never fails a request."""
    one = render_one(wanted(service("a", CONFIGMAPS)))
    two = render_one(wanted(service("a", CONFIGMAPS, hold=True)))
    assert one.digest != two.digest
    assert probe_digest(one.configuration) == one.digest
    probe = named(one.configuration)[PROBE_WEBHOOK]
    assert probe["clientConfig"]["service"]["path"] == f"/probe/{one.digest}"
    assert probe["failurePolicy"] == "Ignore"
    assert digest_in(f'admission webhook "probe.gate.criticalsvc.io" denied the request: {probe_answer("abc")}') \
        == "abc"
    assert digest_in("admission webhook denied the request: something else") is None
    types = mapper()

    def create(dry_run: bool, name: str = PROBE_CONFIGMAP) -> list[str]:
        return api_server_sends(one.configuration, AdmissionRequest(
            uid="u", group_resource=CONFIGMAPS, operation="CREATE", name=name, namespace=PROBE_NAMESPACE,
            object={"metadata": {"name": name}}, old_object=None, dry_run=dry_run), types=types)

    assert create(True) == [PROBE_WEBHOOK]
    assert create(False) == [] and create(True, "other") == []


def test_the_routes_are_spread_over_the_shards_by_namespace() -> None:
    """SHARDS configurations, criticalsvc-providers and criticalsvc-providers-1 ..: a provider's routes and its
    namespace's DELETE go to one, chosen by the namespace; a new CriticalService changes that one configuration and
    leaves the others as they were (kube-apiserver compiles and rebuilds only a configuration that changed); each
    shard's probe webhook matches only its own probe ConfigMap, and names a digest no other shard has."""
    many = [service(f"s{i}", DEPLOYMENTS, namespace=f"team-{i}") for i in range(40)]
    before = {r.configuration["metadata"]["name"]: r
              for r in render_all(wanted(*many), shipped(), probe_namespace=PROBE_NAMESPACE)}
    assert set(before) == {configuration_name(i) for i in range(SHARDS)}, "40 namespaces fill every shard"
    assert configuration_name(0) == PROVIDERS_CONFIGURATION
    assert len({r.digest for r in before.values()}) == SHARDS
    for name, result in before.items():
        routes = {str(r) for r in wanted(*many).routes if configuration_name(shard_of(r)) == name}
        expressions = " ".join(c["expression"] for w in result.configuration["webhooks"]
                               for c in w.get("matchConditions", []))
        for i in range(len(many)):
            here = f"'team-{i}/p'" in expressions
            assert here == (f"DELETE deployments.apps team-{i}/p" in routes), (name, i)
            assert here == (f"'team-{i}'" in expressions), "the namespace's DELETE goes with its provider"

        def probed(configmap: str, config: Mapping[str, Any] = result.configuration) -> bool:
            return PROBE_WEBHOOK in api_server_sends(config, AdmissionRequest(
                uid="u", group_resource=CONFIGMAPS, operation="CREATE", name=configmap, namespace=PROBE_NAMESPACE,
                object={"metadata": {"name": configmap}}, old_object=None, dry_run=True), types=mapper())

        assert [i for i in range(SHARDS) if probed(probe_configmap(i))] == [result.shard], name
    added = service("new", DEPLOYMENTS, namespace="team-new")
    after = {r.configuration["metadata"]["name"]: r
             for r in render_all(wanted(*many, added), shipped(), probe_namespace=PROBE_NAMESPACE)}
    changed = {name for name in after if not same_configuration(before[name].configuration,
                                                                after[name].configuration)}
    assert changed == {configuration_name(shard_of(Route("DELETE", NAMESPACES_GR, name="team-new")))}


def test_a_url_client_config_is_copied_with_the_probe_on_its_own_path() -> None:
    source = shipped()
    for w in source["webhooks"]:
        w["clientConfig"] = {"url": "https://127.0.0.1:8443/validate", "caBundle": "bmV3Cg=="}
    config = render_one(wanted(service("a", CONFIGMAPS)), source).configuration
    assert named(config)[DELETE_WEBHOOK]["clientConfig"] == {"url": "https://127.0.0.1:8443/validate",
                                                              "caBundle": "bmV3Cg=="}
    assert named(config)[PROBE_WEBHOOK]["clientConfig"]["url"].startswith("https://127.0.0.1:8443/probe/")
    assert not same_configuration(rendered(service("a", CONFIGMAPS)), config)


def stored(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as the API server returns it: server-set metadata, defaults filled in, others' labels added."""
    out = copy.deepcopy(config)
    out["metadata"].update(uid="u-1", resourceVersion="42", generation=3, creationTimestamp="2026-01-01T00:00:00Z",
                           managedFields=[{"manager": "criticalsvc"}])
    out["metadata"]["labels"]["team"] = "platform"
    out["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] = None
    for webhook in out["webhooks"]:
        webhook.pop("matchPolicy")
    return out


def test_equality_ignores_what_the_server_sets_and_sees_every_change() -> None:
    config = rendered(service("a", CONFIGMAPS))
    assert same_configuration(stored(config), config)
    assert not same_configuration(None, config)
    assert not same_configuration(stored(config), rendered(service("a", CONFIGMAPS, hold=True)))
    assert not same_configuration(stored(config), rendered(service("b", CONFIGMAPS, namespace="other")))
    other_owner = stored(config)
    other_owner["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    assert not same_configuration(other_owner, config)


def test_an_update_carries_the_resource_version_and_keeps_others_labels() -> None:
    config = rendered(service("a", CONFIGMAPS))
    body = for_update(rendered(service("a", CONFIGMAPS, hold=True)), stored(config))
    assert body["metadata"]["resourceVersion"] == "42"
    assert body["metadata"]["labels"]["team"] == "platform"


def test_a_condition_past_the_size_limit_is_split_over_webhooks_and_stays_narrow() -> None:
    """Never broader: routes whose one condition would pass the size the gate writes are split over several
    webhooks (providers.gate, providers-2.gate, ...), each condition under the limit; every provider is named in
    exactly one of them, a name no CriticalService protects in none, and nothing is broad."""
    many = [service(f"s{i}", CONFIGMAPS, namespace=f"namespace-{i:05d}") for i in range(MAX_EXPRESSION_CHARS // 15)]
    result = render_one(wanted(*many))
    shards = [w for w in result.configuration["webhooks"] if w["name"].startswith("providers")]
    assert len(shards) >= 2 and not result.broad
    expressions = [w["matchConditions"][0]["expression"] for w in shards]
    assert all(len(e) <= MAX_EXPRESSION_CHARS for e in expressions)
    for i in (0, len(many) // 2, len(many) - 1):
        assert sum(f"'namespace-{i:05d}/p'" in e for e in expressions) == 1, i
    assert not any("'namespace-99999/p'" in e for e in expressions)
    assert [w["name"] for w in shards][:2] == [DELETE_WEBHOOK, DELETE_WEBHOOK.replace(".gate.", "-2.gate.")]
    few = render_one(wanted(*many[:10]))
    assert [w["name"] for w in few.configuration["webhooks"] if w["name"].startswith("providers")] == [DELETE_WEBHOOK]


# --- the label selector in CEL ------------------------------------------------------------------------------
@st.composite
def selector_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if draw(st.booleans()):
        spec["matchLabels"] = draw(label_sets(("app", "tier")))
    expressions = []
    for _ in range(draw(st.integers(0, 3))):
        key = draw(pick(("app", "tier", "zone")))
        op = draw(pick(OPERATORS))
        entry: dict[str, Any] = {"key": key, "operator": op}
        if op in ("In", "NotIn"):
            entry["values"] = draw(st.lists(pick(("web", "db", "front", "a'b", "x")), min_size=1, max_size=2,
                                            unique=True))
        expressions.append(entry)
    if expressions:
        spec["matchExpressions"] = expressions
    return spec


def test_a_shard_holding_several_namespaces_routes_a_delete_in_each() -> None:
    """A shard's namespaceSelector names every namespace its routes are in ("app" and "team" share one): the API
    server matches it before any condition, so a namespace left out would route nothing there."""
    assert shard_in("app") == shard_in("team")
    config = rendered(service("a", CONFIGMAPS, namespace="app"), service("b", CONFIGMAPS, namespace="team"))
    for namespace in ("app", "team"):
        old = {"metadata": {"name": "p", "namespace": namespace}}
        request = AdmissionRequest(uid="u", group_resource=CONFIGMAPS, operation="DELETE", name="p",
                                   namespace=namespace, object=None, old_object=old)
        assert DELETE_WEBHOOK in api_server_sends(config, request, types=mapper()), namespace


@settings(max_examples=150)
@given(selector_specs(), st.dictionaries(pick(("app", "tier", "zone", "other")),
                                         pick(("web", "db", "front", "a'b", "x")), max_size=3),
       st.booleans())
def test_a_selector_in_cel_selects_what_the_selector_selects(spec: dict[str, Any], labels: dict[str, str],
                                                             unlabelled: bool) -> None:
    """The rendered condition, run by cel-python on a DELETE's oldObject, agrees with LabelSelector.matches
    (the gate's own) on every label set, including an object with no labels at all."""
    cs = service("a", CONFIGMAPS, namespace="team", selector=spec)
    config = rendered(cs)
    old = {"metadata": {"name": "o", "namespace": "team"}}
    if not unlabelled:
        old["metadata"]["labels"] = labels
    request = AdmissionRequest(uid="u", group_resource=CONFIGMAPS, operation="DELETE", name="o", namespace="team",
                               object=None, old_object=old)
    sent = DELETE_WEBHOOK in api_server_sends(config, request, types=mapper())
    assert sent == parse_label_selector(spec, "s").matches({} if unlabelled else labels)


# --- the property: routing covers every request the gate could refuse ------------------------------------------
CRD_GROUP, CRD_PLURAL = "my.crd.group", "coolresources"
COOL = GroupResource(CRD_GROUP, CRD_PLURAL)
KINDS: dict[str, tuple[GroupResource, str, str]] = {  # key: (group/resource, apiVersion, kind)
    "deployments": (DEPLOYMENTS, "apps/v1", "Deployment"),
    "configmaps": (CONFIGMAPS, "v1", "ConfigMap"),
    "coolresources": (COOL, f"{CRD_GROUP}/v1", "CoolResource"),
}
OBJECT_NAMES = ("p0", "p1", "x")
SERVICE_NAMES = ("cs0", "cs1", "cs2")


def crd() -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{CRD_PLURAL}.{CRD_GROUP}"},
            "spec": {"group": CRD_GROUP, "scope": "Namespaced",
                     "names": {"plural": CRD_PLURAL, "singular": "coolresource", "kind": "CoolResource"},
                     "versions": [{"name": "v1", "served": True, "storage": True}]}}


@st.composite
def world_objects(draw: st.DrawFn) -> dict[str, Any]:
    key = draw(pick(tuple(KINDS)))
    _gr, api_version, kind = KINDS[key]
    metadata: dict[str, Any] = {"name": draw(pick(OBJECT_NAMES)), "namespace": draw(pick(NAMESPACES)),
                                "labels": draw(label_sets())}
    if draw(st.integers(0, 3)) == 0:
        metadata["labels"][DELETION_PROTECTED_LABEL] = DELETION_PROTECTED_ALWAYS
    body: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata}
    if key == "deployments":
        body["spec"] = {"replicas": draw(st.integers(0, 2))}
    return body


@st.composite
def guarding_services(draw: st.DrawFn, name: str) -> dict[str, Any]:
    key = draw(pick((*KINDS, "namespaces")))
    provider: dict[str, Any]
    if key == "namespaces":  # a cluster-scoped provider: by name, or every namespace a selector picks
        provider = {"resource": draw(pick(("namespaces", "Namespace")))}
        if draw(st.booleans()):
            provider["name"] = draw(pick(NAMESPACES))
        else:
            provider["selector"] = draw(selector_specs())
    else:
        gr = KINDS[key][0]
        provider = {"group": gr.group, "resource": draw(pick((gr.resource, KINDS[key][2])))}
        namespace = draw(pick((None, *NAMESPACES))) if draw(st.booleans()) else draw(pick(NAMESPACES))
        if namespace is not None:
            provider["namespace"] = namespace
        if namespace is not None and draw(st.booleans()):
            provider["name"] = draw(pick(OBJECT_NAMES))
        else:
            provider["selector"] = draw(selector_specs())
    criterion_ns = draw(pick(NAMESPACES))
    spec: dict[str, Any] = {"provider": provider, "criteria": [
        {"type": "Resources", "resources": {"group": "", "resource": "configmaps", "namespace": criterion_ns,
                                            "selector": {"matchLabels": {"app": draw(pick(LABEL_VALUES["app"]))}}}}]}
    if draw(st.booleans()):
        spec["holdUpdates"] = "WhileBlocking"
    if draw(st.booleans()):
        spec["scaleToZero"] = "DenyWhileBlocking"
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": spec}


@attrs.frozen
class Case:
    manifests: tuple[dict[str, Any], ...]

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m["kind"] in ("Deployment", "ConfigMap", "CoolResource")]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    names = draw(st.lists(pick(SERVICE_NAMES), unique=True, min_size=1, max_size=3))
    services = [draw(guarding_services(n)) for n in names]
    objs = draw(st.lists(world_objects(), max_size=10,
                         unique_by=lambda o: (o["kind"], o["metadata"]["namespace"], o["metadata"]["name"])))
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {**draw(label_sets()), "kubernetes.io/metadata.name": ns}}} for ns in NAMESPACES]
    return Case((*([crd()] if draw(st.booleans()) else []), *namespaces, *objs, *services))


def requests_of(case: Case) -> Iterator[AdmissionRequest]:
    """Every DELETE and UPDATE a teardown (or a controller) could send about the case's objects."""
    seq = iter(range(10**6))

    def uid() -> str:
        return f"u{next(seq)}"

    for obj in case.objects:
        gr = next(g for g, _v, k in KINDS.values() if k == obj["kind"])
        md = obj["metadata"]
        for name in (md["name"], ""):  # "": an item of a deletecollection
            yield AdmissionRequest(uid=uid(), group_resource=gr, operation="DELETE", name=name,
                                   namespace=md["namespace"], object=None, old_object=obj)
        relabelled = copy.deepcopy(obj)
        relabelled["metadata"]["labels"] = {"app": "other"}
        edited = copy.deepcopy(obj)
        edited["metadata"]["annotations"] = {"edited": "yes"}
        for new in (relabelled, edited):
            yield AdmissionRequest(uid=uid(), group_resource=gr, operation="UPDATE", name=md["name"],
                                   namespace=md["namespace"], object=new, old_object=obj)
        if gr == DEPLOYMENTS:
            for replicas in (0, 1):
                scale = {"apiVersion": "autoscaling/v1", "kind": "Scale",
                         "metadata": {"name": md["name"], "namespace": md["namespace"]},
                         "spec": {"replicas": replicas} if replicas else {}}
                before = {**scale, "spec": {"replicas": obj["spec"]["replicas"]} if obj["spec"]["replicas"] else {}}
                yield AdmissionRequest(uid=uid(), group_resource=gr, operation="UPDATE", name=md["name"],
                                       namespace=md["namespace"], object=scale, old_object=before,
                                       sub_resource="scale", kind="Scale")
    for namespace in (m for m in case.manifests if m["kind"] == "Namespace"):
        ns = namespace["metadata"]["name"]
        for name in (ns, ""):
            yield AdmissionRequest(uid=uid(), group_resource=NAMESPACES_GR, operation="DELETE", name=name,
                                   namespace=ns, object=None, old_object=namespace)
    for name in (f"{CRD_PLURAL}.{CRD_GROUP}", "widgets.other.example.com"):
        yield AdmissionRequest(uid=uid(), group_resource=CRDS, operation="DELETE", name=name, namespace="",
                               object=None, old_object={"metadata": {"name": name}})


def statically_routed(request: AdmissionRequest) -> bool:
    """What deploy/base/webhook.yaml sends, read from the issue, not from routing.py."""
    if request.group_resource == CRITICAL_SERVICES:
        return True
    labels = ((request.old_object or {}).get("metadata") or {}).get("labels") or {}
    if request.operation == "DELETE" and labels.get(DELETION_PROTECTED_LABEL) == DELETION_PROTECTED_ALWAYS:
        return True
    name = request.name or ((request.old_object or {}).get("metadata") or {}).get("name")
    return request.operation == "DELETE" and request.group_resource == CRDS and name == CRD_NAME


def routing_mismatch(case: Case, *, leave_out: str | None = None) -> str | None:
    """How routing fails the decision or the API server's evaluation, or None. `leave_out`: render as if that
    CriticalService were not there (the negative control)."""
    state = build_state([Manifest(m, f"generated: document {i}") for i, m in enumerate(case.manifests, 1)])
    services = [cs for cs in state.critical_services() if cs.name != leave_out]
    wanted_routes = desired(services, state.mapper.lookup)
    # Every shard the router would write, as an API server holds them all.
    results = render_all(wanted_routes, shipped(), probe_namespace=PROBE_NAMESPACE)
    broad = {r for result in results for r in result.broad}
    types = state.mapper
    for request in requests_of(case):
        decision = decide(request, state, manages_routes=True)
        gr = request.group_resource
        matched = GroupResource(gr.group, f"{gr.resource}/{request.sub_resource}") if request.sub_resource else gr
        call = call_of(operation=request.operation, group_resource=matched, namespace=request.namespace,
                       name=request.name, obj=request.object, old=request.old_object)
        modelled = any(covers(r, call) for r in wanted_routes.routes)
        if (not decision.allowed or decision.protected) and not (modelled or statically_routed(request)):
            return f"{request.operation} {matched} {request.namespace}/{request.name}: {decision.rule} not routed"
        try:
            sent = [h for result in results for h in api_server_sends(result.configuration, request, types=types)]
        except Exception as exc:
            return f"{request.operation} {matched} {request.namespace}/{request.name}: evaluation failed: {exc}"
        gate_hooks = [h for h in sent if h != PROBE_WEBHOOK]
        labelled = ((request.old_object or {}).get("metadata") or {}).get("labels", {}).get(DELETION_PROTECTED_LABEL)
        if modelled and not gate_hooks and not (request.operation == "DELETE" and labelled == "Always"):
            return f"{request.operation} {matched} {request.name}: covered but the API server sends nothing"
        if gate_hooks and not modelled and not broad:
            return f"{request.operation} {matched} {request.name}: sent by {gate_hooks} though nothing covers it"
    return None


@settings(max_examples=120)
@given(cases())
def test_everything_the_gate_could_refuse_is_routed_and_nothing_else(case: Case) -> None:
    """Every DELETE/UPDATE the decision refuses (or a CriticalService has a say on) reaches the gate; the
    rendered configuration, as the API server evaluates it, sends exactly what the routes cover and never
    fails to evaluate."""
    mismatch = routing_mismatch(case)
    assert mismatch is None, mismatch


def test_the_oracle_catches_a_routing_that_leaves_a_provider_out() -> None:
    """Negative control: the same check fails when one CriticalService's routes are not rendered."""
    cs = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cs0"},
          "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ns-a", "name": "p0"},
                   "criteria": [{"type": "Resources", "resources": {"resource": "configmaps", "namespace": "ns-b"}}]}}
    objs = [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p0", "namespace": "ns-a",
                                                                         "labels": {}}, "spec": {"replicas": 1}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ns-b", "labels": {}}}]
    case = Case((*objs, cs))
    assert routing_mismatch(case) is None
    assert "not routed" in (routing_mismatch(case, leave_out="cs0") or "")


def test_an_unguarded_read_of_an_omitted_request_field_is_an_evaluation_error() -> None:
    """Negative control for 'never fails to evaluate': request.name is absent (not "") for a deletecollection's
    item, as on kube-apiserver, so a condition reading it without has() errors - and the request would be
    refused under failurePolicy Fail."""
    conditions = matchconditions.parse_match_conditions(
        [{"name": "n", "expression": "request.name == 'x'"}], "matchConditions")
    review = dict(render_review(AdmissionRequest(uid="u", group_resource=CONFIGMAPS, operation="DELETE", name="",
                                                 namespace="a", object=None, old_object={"metadata": {"name": "x"}})))
    outcome = matchconditions.evaluate(conditions, request=review["request"])
    assert outcome.error is not None and matchconditions.decide(outcome, "Fail") == "fail"


# --- status ---------------------------------------------------------------------------------------------------
def ready(cs: Any, routing: Routing | None) -> dict[str, Any]:
    state = MemoryState(mapper())
    state.upsert_critical_service(cs)
    status = compute_status(cs, state, now=1_700_000_000, routing=routing)
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def test_ready_says_enforcing_only_once_the_api_server_is_seen_routing_the_provider() -> None:
    cs = service("a", CONFIGMAPS)
    needs = wanted(cs).needs
    assert ready(cs, Routing(managed=False))["reason"] == "ProviderNotRouted"
    assert ready(cs, Routing(managed=True))["reason"] == "RoutePending"
    written = Routing(managed=True, needs=needs, written=needs[route_key(cs)])
    assert ready(cs, written)["reason"] == "RoutePending" and "probe" in ready(cs, written)["message"]
    failed = ready(cs, Routing(managed=True, needs=needs, error="403 Forbidden: cannot create"))
    assert (failed["status"], failed["reason"]) == ("False", "RoutingFailed")
    assert "403 Forbidden: cannot create" in failed["message"]
    routes = needs[route_key(cs)]
    live = Routing(managed=True, needs=needs, written=routes, live=routes)
    assert (ready(cs, live)["status"], ready(cs, live)["reason"]) == ("True", "Enforcing")
    partly = Routing(managed=True, needs=needs, written=routes, live=frozenset(list(routes)[:1]))
    assert ready(cs, partly)["reason"] == "RoutePending"


def test_ready_does_not_flap_when_the_status_writer_records_the_provider_uid() -> None:
    """The cached CriticalService changes with its own status (providerUID): what it needs routed does not, so a
    status write does not turn Enforcing into RoutePending until the router's next round."""
    import attrs

    cs = service("a", CONFIGMAPS)
    needs = wanted(cs).needs
    live = Routing(managed=True, needs=needs, written=needs[route_key(cs)], live=needs[route_key(cs)])
    assert ready(attrs.evolve(cs, provider_uid="uid-1"), live)["reason"] == "Enforcing"
    assert ready(attrs.evolve(cs, hold_updates=HoldUpdates.WHILE_BLOCKING), live)["reason"] == "RoutePending"


def test_a_broadly_routed_service_says_so_in_routed_narrowly() -> None:
    cs = service("a", CONFIGMAPS, namespace="", selector={"matchLabels": {"app": "db"}})
    result = render_one(wanted(cs))
    needs = wanted(cs).needs
    state = MemoryState(mapper())
    state.upsert_critical_service(cs)
    status = compute_status(cs, state, now=0, routing=Routing(managed=True, needs=needs, written=needs[route_key(cs)],
                                                             live=needs[route_key(cs)], broad=result.broad))
    narrow = next(c for c in status["conditions"] if c["type"] == "RoutedNarrowly")
    assert (narrow["status"], narrow["reason"]) == ("False", "Broad")
    assert "every namespace DELETE" in narrow["message"]


# --- decisions --------------------------------------------------------------------------------------------
def test_an_unrouted_warning_only_when_the_gate_does_not_manage_routes() -> None:
    obj = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "a"},
           "spec": {"provider": {"resource": "configmaps", "namespace": "app", "name": "p"},
                    "criteria": [{"type": "SpecificResource",
                                  "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}}
    request = AdmissionRequest(uid="1", group_resource=CRITICAL_SERVICES, operation="CREATE", name="a", namespace="",
                               object=obj, old_object=None)
    state = MemoryState()
    unmanaged = decide(request, state, manages_routes=False)
    assert any("does not manage its routes" in w for w in unmanaged.warnings)
    managed = decide(request, state, manages_routes=True)
    assert managed.allowed and not any("does not manage" in w for w in managed.warnings)


def test_a_provider_type_delete_without_old_object_is_decided_from_the_cache() -> None:
    """Without oldObject the gate reads its cached copy of a provider type's object."""
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
    plain = {"metadata": {"name": "p", "namespace": "app"}}
    other = {"metadata": {"name": "q", "namespace": "app"}}
    labelled = {"metadata": {"name": "p", "labels": {DELETION_PROTECTED_LABEL: DELETION_PROTECTED_ALWAYS}}}
    assert not rule.matches("DELETE", CONFIGMAPS, None, plain, name="p", namespace="app")
    state.upsert_critical_service(service("a", CONFIGMAPS, hold=True))
    assert rule.matches("DELETE", CONFIGMAPS, None, plain, name="p", namespace="app")
    assert not rule.matches("DELETE", CONFIGMAPS, None, other, name="q", namespace="app")  # not the provider
    assert not rule.matches("DELETE", CONFIGMAPS, None, labelled, name="p", namespace="app")  # the labelled rule's
    assert rule.matches("UPDATE", CONFIGMAPS, plain, labelled, name="p", namespace="app")
    assert not rule.matches("DELETE", GroupResource("", "secrets"), None, plain, name="p", namespace="app")


@pytest.mark.parametrize("spelling", ["deployments", "Deployment", "deploy"])
def test_a_kind_or_short_name_is_resolved_to_the_plural_the_rule_names(spelling: str) -> None:
    routes = wanted(service("a", GroupResource("apps", spelling))).routes
    assert Route("DELETE", DEPLOYMENTS, "app", "p") in routes


def test_one_key_selectors_are_one_lookup_per_key_and_route_exactly_their_members() -> None:
    """Many `app=<value>` selectors (the common provider selector), some in a namespace and some in every one, are
    written as one list lookup per key - kube-apiserver took 16 s to admit 1,250 written one by one, 0.15 s as
    lists - and, evaluated as the API server does, send the gate exactly the members of some selector."""
    services = [service(f"n{i}", CONFIGMAPS, namespace=f"team-{i % 3}", selector={"matchLabels": {"app": f"v{i}"}})
                for i in range(30)]
    services.append(service("anywhere", CONFIGMAPS, namespace="", selector={"matchLabels": {"app": "everywhere"}}))
    services.append(service("tier", CONFIGMAPS, namespace="team-0", selector={"matchLabels": {"tier": "v1"}}))
    config = rendered(*services)
    condition = next(m["expression"] for m in named(config)[DELETE_WEBHOOK]["matchConditions"])
    assert condition.count("'app' in l") == 1 and "'team-1/v1'" in condition

    def sent(namespace: str, labels: dict[str, str]) -> bool:
        old = {"metadata": {"name": "o", "namespace": namespace, "labels": labels}}
        request = AdmissionRequest(uid="u", group_resource=CONFIGMAPS, operation="DELETE", name="o",
                                   namespace=namespace, object=None, old_object=old)
        return DELETE_WEBHOOK in api_server_sends(config, request, types=mapper())

    for i in range(30):
        assert sent(f"team-{i % 3}", {"app": f"v{i}"}), i
        assert not sent(f"team-{(i + 1) % 3}", {"app": f"v{i}"}), i  # the same value in another namespace
    assert sent("team-2", {"app": "everywhere"}) and sent("elsewhere", {"app": "everywhere"})
    assert sent("team-0", {"tier": "v1"}) and not sent("team-1", {"tier": "v1"})
    assert not sent("team-0", {"app": "v99"}) and not sent("team-0", {})
