"""Providers by selector (issue 11): spec.provider.selector protects every object of a type whose labels match.

Parser, decisions (the object's own DELETE, its namespace's, the CriticalService's), the state's index, status,
explain, plan, the cycle check (labels.may_overlap against brute force), live confirmation and the cache over
the stand-in, a simulated teardown, and a property against an oracle written here.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubefakes import running_standin, started_cache, state_with

from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import (
    CRITICAL_SERVICES,
    NAMESPACES,
    GroupResource,
    ObjectRef,
    ProviderSelector,
    parse_critical_service,
)
from criticalsvc.decision import Decision, Rule, decide
from criticalsvc.errors import DependencyCycle, InvalidSpec
from criticalsvc.explain import explain, render_text
from criticalsvc.graph import check_no_cycle, plan, service_graph
from criticalsvc.labels import LabelSelector, Requirement, may_overlap
from criticalsvc.live import LiveReader
from criticalsvc.manifests import load_path
from criticalsvc.objects import KubeObject
from criticalsvc.routing import Routing
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.store import Store
from criticalsvc.sim.timeline import DELETED, GONE
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

EXAMPLE = Path(__file__).parent.parent / "api" / "examples" / "protect-by-selector.yaml"
PVCS = GroupResource("", "persistentvolumeclaims")
PODS = GroupResource("", "pods")
DEPLOYMENTS = GroupResource("apps", "deployments")
XDATABASES = GroupResource("platform.example.com", "xdatabases")


# --- builders -------------------------------------------------------------------------------------------
def cs_obj(name: str, provider: Mapping[str, Any], *criteria: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": dict(provider), "criteria": [dict(c) for c in criteria]}}


def resources(resource: str, namespace: str = "", group: str = "", **match: str) -> dict[str, Any]:
    body: dict[str, Any] = {"group": group, "resource": resource}
    if namespace:
        body["namespace"] = namespace
    if match:
        body["selector"] = {"matchLabels": match}
    return {"type": "Resources", "resources": body}


def selected(resource: str, namespace: str | None = None, *, group: str = "", **match: str) -> dict[str, Any]:
    out: dict[str, Any] = {"group": group, "resource": resource, "selector": {"matchLabels": match}}
    if namespace:
        out["namespace"] = namespace
    return out


def obj(gr: GroupResource, namespace: str, name: str, labels: Mapping[str, str] | None = None, *,
        terminating: bool = False) -> KubeObject:
    return KubeObject(gr, namespace, name, labels=dict(labels or {}),
                      deletion_timestamp="2026-01-01T00:00:00Z" if terminating else None)


def state_of(*objects: KubeObject, services: tuple[dict[str, Any], ...] = ()) -> MemoryState:
    return state_with(*services, objects=objects)


def delete(state: Any, gr: GroupResource, namespace: str, name: str, labels: Mapping[str, str] | None = None, *,
           old: bool = True) -> Decision:
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
    if namespace and gr != NAMESPACES:
        metadata["namespace"] = namespace
    return decide(AdmissionRequest(uid="u", group_resource=gr, operation="DELETE", name=name,
                                   namespace=name if gr == NAMESPACES else namespace,
                                   old_object={"metadata": metadata} if old else None), state)


DB_VOLUMES = cs_obj("db-volumes", selected("persistentvolumeclaims", "shop", app="db"),
                    resources("pods", "batch", app="backup"))
BACKUP = obj(PODS, "batch", "backup-1", {"app": "backup"})


# --- the parser -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("provider", "error"), [
    ({"resource": "pvc"}, "spec.provider: set exactly one of name and selector"),
    ({"resource": "pvc", "name": "x", "selector": {"matchLabels": {"app": "db"}}},
     "spec.provider: set exactly one of name and selector"),
    ({"resource": "pvc", "name": None, "selector": None}, "spec.provider: set exactly one of name and selector"),
    ({"resource": "pvc", "selector": "app=db"},
     "spec.provider.selector: must be an object with matchLabels and/or matchExpressions"),
    ({"resource": "pvc", "selector": {"matchLabels": {"app": 1}}}, "spec.provider.selector.matchLabels: must be a "
     "map of strings"),
    ({"resource": "pvc", "selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
     "spec.provider.selector.matchExpressions[0].values: must be a non-empty list of strings for In"),
    ({"resource": "pvc", "selector": {"matchFields": {}}}, "spec.provider.selector.matchFields: unknown field"),
    ({"resource": "pvc", "namespace": "Shop", "selector": {}}, "spec.provider.namespace: 'Shop' is not a valid "
     "namespace name"),
    ({"selector": {}}, "spec.provider.resource: required"),
], ids=["neither", "both", "both-null", "string", "non-string-value", "in-without-values", "unknown",
        "bad-namespace", "no-resource"])
def test_the_parser_names_the_field(provider: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        parse_critical_service(cs_obj("x", provider, resources("pods")))
    assert str(info.value) == error


def test_a_selector_parses_to_a_provider_selector_and_an_empty_one_selects_all() -> None:
    cs = parse_critical_service(DB_VOLUMES)
    assert cs.provider == ProviderSelector(PVCS, "shop", LabelSelector((Requirement("app", "In", frozenset({"db"})),)))
    assert str(cs.provider) == "every persistentvolumeclaims in namespace shop matching app=db"
    everything = parse_critical_service(cs_obj("all", {"resource": "persistentvolumeclaims", "selector": {}},
                                               resources("pods")))
    assert isinstance(everything.provider, ProviderSelector) and everything.provider.namespace is None
    assert everything.provider.matches("any", {}) and everything.provider.matches("", {"x": "y"})


def test_an_empty_cluster_wide_selector_is_accepted_with_a_warning() -> None:
    request = AdmissionRequest(uid="u", group_resource=CRITICAL_SERVICES, operation="CREATE", name="all", namespace="",
                               object=cs_obj("all", {"resource": "persistentvolumeclaims", "selector": {}},
                                             resources("pods", "batch")))
    decision = decide(request, build_state(load_path(str(EXAMPLE))))
    assert decision.allowed and decision.rule == Rule.VALID_SPEC
    assert any("an empty selector without a namespace selects every persistentvolumeclaims" in w
               for w in decision.warnings), decision.warnings


# --- decisions --------------------------------------------------------------------------------------------
def test_a_matching_object_is_gated_and_a_non_matching_one_is_not() -> None:
    state = state_of(BACKUP, obj(PVCS, "shop", "data-0", {"app": "db"}), services=(DB_VOLUMES,))
    denied = delete(state, PVCS, "shop", "data-0", {"app": "db", "tier": "x"})
    assert not denied.allowed and denied.rule == Rule.BLOCKED and denied.blocking == ("db-volumes",)
    assert "CriticalService db-volumes selects it by its labels (every persistentvolumeclaims in namespace shop " \
           "matching app=db) and protects it until: pods batch/backup-1 in namespace batch matching app=backup still " \
           "exists" \
           in denied.message
    assert delete(state, PVCS, "shop", "cache-0", {"app": "cache"}).rule == Rule.UNPROTECTED
    assert delete(state, PVCS, "other", "data-0", {"app": "db"}).rule == Rule.UNPROTECTED, "another namespace"
    assert delete(state, PODS, "shop", "data-0", {"app": "db"}).rule == Rule.UNPROTECTED, "another type"


def test_the_requests_labels_decide_and_without_old_object_the_cached_ones() -> None:
    """The oldObject's labels are the object's at the DELETE; without one (a routed type: Deployments), the
    cache's copy speaks."""
    workers = cs_obj("workers", selected("deployments", "ops", group="apps", role="worker"),
                     resources("pods", "batch", app="backup"))
    state = state_of(BACKUP, obj(DEPLOYMENTS, "ops", "w-0", {"role": "worker"}), services=(workers,))
    assert delete(state, DEPLOYMENTS, "ops", "w-0", {"role": "other"}).allowed, "relabelled out of the set"
    assert delete(state, DEPLOYMENTS, "ops", "w-0", old=False).rule == Rule.BLOCKED, "the cached labels match"
    state.upsert(obj(DEPLOYMENTS, "ops", "w-0", {"role": "other"}))
    assert delete(state, DEPLOYMENTS, "ops", "w-0", old=False).rule == Rule.UNPROTECTED


def test_met_criteria_allow_but_a_confirmation_is_due() -> None:
    state = state_of(obj(PVCS, "shop", "data-0", {"app": "db"}), services=(DB_VOLUMES,))
    decision = delete(state, PVCS, "shop", "data-0", {"app": "db"})
    assert decision.allowed and decision.rule == Rule.CRITERIA_MET and decision.protected


def test_a_namespace_is_refused_while_a_selected_object_in_it_is_protected() -> None:
    cluster_wide = cs_obj("db-anywhere", selected("persistentvolumeclaims", app="db"),
                          resources("pods", "batch", app="backup"))
    state = state_of(BACKUP, obj(PVCS, "shop", "data-0", {"app": "db"}), obj(PVCS, "web", "cache-0", {"app": "c"}),
                     obj(NAMESPACES, "", "shop"), obj(NAMESPACES, "", "web"), obj(NAMESPACES, "", "empty"),
                     services=(DB_VOLUMES, cluster_wide))
    shop = delete(state, NAMESPACES, "", "shop")
    assert not shop.allowed and shop.blocking == ("db-anywhere", "db-volumes")
    assert "protects every persistentvolumeclaims in namespace shop matching app=db: 1 object (first: " \
           "shop/data-0) in this namespace, until" in shop.message
    assert delete(state, NAMESPACES, "", "web").rule == Rule.UNPROTECTED, "nothing selected lives there"
    assert delete(state, NAMESPACES, "", "empty").rule == Rule.UNPROTECTED
    state.remove(BACKUP.ref)
    assert delete(state, NAMESPACES, "", "shop").rule == Rule.CRITERIA_MET


def test_the_critical_service_waits_for_every_selected_object_and_their_namespace() -> None:
    state = state_of(BACKUP, obj(PVCS, "shop", "data-0", {"app": "db"}, terminating=True),
                     obj(PVCS, "shop", "data-1", {"app": "db"}), obj(NAMESPACES, "", "shop"), services=(DB_VOLUMES,))
    first = delete(state, CRITICAL_SERVICES, "", "db-volumes", old=False)
    assert not first.allowed
    assert "its provider set (every persistentvolumeclaims in namespace shop matching app=db) still has 2 objects " \
           "(first: shop/data-0, shop/data-1)" in first.message
    state.remove(ObjectRef(PVCS, "shop", "data-1"))
    assert not delete(state, CRITICAL_SERVICES, "", "db-volumes", old=False).allowed, "a terminating one counts"
    state.remove(ObjectRef(PVCS, "shop", "data-0"))
    state.upsert(obj(NAMESPACES, "", "shop", terminating=True))
    waiting = delete(state, CRITICAL_SERVICES, "", "db-volumes", old=False)
    assert not waiting.allowed and "namespace shop is still terminating" in waiting.message
    state.remove(ObjectRef(NAMESPACES, "", "shop"))
    assert delete(state, CRITICAL_SERVICES, "", "db-volumes", old=False).allowed


def test_namespaces_selected_by_label() -> None:
    """The real-cluster scenario, offline: every namespace labelled team=payments waits for running pods."""
    payments = cs_obj("payments", selected("namespaces", team="payments"),
                      {**resources("pods", "workers"), "condition": "object.status.phase == 'Running'"})
    state = build_state([])
    state.upsert_critical_service(parse_critical_service(payments))
    for o in (obj(NAMESPACES, "", "pay-1", {"team": "payments"}), obj(NAMESPACES, "", "other"),
              obj(PODS, "workers", "w-1")):
        state.upsert(o)
    assert not delete(state, NAMESPACES, "", "pay-1", {"team": "payments"}).allowed
    assert delete(state, NAMESPACES, "", "other", {}).allowed
    assert delete(state, NAMESPACES, "", "pay-1", {"team": "billing"}).allowed, "relabelled"


# --- the state's index -----------------------------------------------------------------------------------
def test_protecting_matches_labels_by_group_and_forgets_removed_services() -> None:
    state = state_of(obj(PVCS, "shop", "data-0", {"app": "db"}), services=(DB_VOLUMES,))
    ref = ObjectRef(PVCS, "shop", "data-0")
    assert [cs.name for cs in state.protecting(ref, {"app": "db"})] == ["db-volumes"]
    assert [cs.name for cs in state.protecting(ref)] == ["db-volumes"], "the stored labels by default"
    assert not state.protecting(ref, {"app": "web"})
    assert not state.protecting(ObjectRef(PVCS, "web", "data-0"), {"app": "db"})
    assert [cs.name for cs in state.hosted_in("shop")] == ["db-volumes"] and not state.hosted_in("web")
    assert state.selects_in("")
    state.remove_critical_service("db-volumes")
    assert not state.protecting(ref, {"app": "db"}) and not state.hosted_in("shop") and not state.selects_in("")
    assert not state._by_selector and not state._by_provider_ns and not state._selectors_anywhere


# --- status, explain, plan, graph -----------------------------------------------------------------------
def test_status_counts_the_selected_objects_instead_of_a_provider_uid() -> None:
    example = build_state(load_path(str(EXAMPLE)))
    (cs,) = example.critical_services()
    status = compute_status(cs, example, now=0.0, routing=Routing(managed=False))
    assert status["providers"] == 2 and status["selector"] == "app=db" and "providerUID" not in status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "ProviderNotRouted", "without the gate's routes nothing sends PVC DELETEs"


def test_explain_names_the_service_that_selects_the_object() -> None:
    example = build_state(load_path(str(EXAMPLE)))
    text = render_text(explain(ObjectRef(PVCS, "shop", "data-db-0"), example))
    assert "DENIED" in text
    assert "CriticalService shop-db-volumes (Enforce) selects it by its labels (spec.provider.selector: every " \
           "persistentvolumeclaims in namespace shop matching app=db) and protects it:" in text
    assert "No CriticalService" in render_text(explain(ObjectRef(PVCS, "shop", "scratch"), example))
    namespace = render_text(explain(ObjectRef(NAMESPACES, "", "shop"), example))
    assert "of which 2 live in this namespace (first: shop/data-db-0, shop/data-db-1)" in namespace


def test_plan_deletes_each_selected_object_after_the_criteria_objects() -> None:
    manifests = load_path(str(EXAMPLE))
    state = build_state(manifests)
    objects = [o for o in (state.get(ObjectRef(gr, ns, n)) for gr, ns, n in (
        (PVCS, "shop", "data-db-0"), (PVCS, "shop", "data-db-1"), (PVCS, "shop", "scratch"),
        (XDATABASES, "", "shop-db"), (NAMESPACES, "", "shop"))) if o is not None]
    objects.append(KubeObject(CRITICAL_SERVICES, "", "shop-db-volumes"))
    phases = plan(objects, state.critical_services(), state).phases
    phase = {ref: i for i, refs in enumerate(phases) for ref in refs}
    xdb = ObjectRef(XDATABASES, "", "shop-db")
    for name in ("data-db-0", "data-db-1"):
        assert phase[ObjectRef(PVCS, "shop", name)] > phase[xdb]
    assert phase[ObjectRef(PVCS, "shop", "scratch")] == 0
    assert phase[ObjectRef(NAMESPACES, "", "shop")] > phase[ObjectRef(PVCS, "shop", "data-db-1")]
    assert phase[ObjectRef(CRITICAL_SERVICES, "", "shop-db-volumes")] == len(phases) - 1


# --- the cycle check --------------------------------------------------------------------------------------
def test_a_criterion_that_may_count_its_own_provider_set_is_a_self_loop() -> None:
    state = MemoryState()
    loop = parse_critical_service(cs_obj("loop", selected("persistentvolumeclaims", "shop", app="db"),
                                         resources("persistentvolumeclaims", "shop", tier="hot")))
    with pytest.raises(DependencyCycle, match="loop -> loop"):
        check_no_cycle(loop, state)
    for fine in (resources("persistentvolumeclaims", "shop", app="cache"),  # app=db and app=cache never meet
                 resources("persistentvolumeclaims", "web", app="db"),  # another namespace
                 resources("pods", "shop", app="db")):  # another type
        check_no_cycle(parse_critical_service(cs_obj("fine", selected("persistentvolumeclaims", "shop", app="db"),
                                                     fine)), state)


def test_two_services_whose_sets_meet_each_others_criteria_are_a_cycle() -> None:
    """A protects PVCs app=db until no ConfigMap role=config exists; B protects those ConfigMaps until no PVC
    app=db exists. Neither set is listed; the selectors decide."""
    state = MemoryState()
    a = cs_obj("a", selected("persistentvolumeclaims", app="db"), resources("configmaps", role="config"))
    state.upsert_critical_service(parse_critical_service(a))
    b = parse_critical_service(cs_obj("b", selected("configmaps", "shop", role="config"),
                                      resources("persistentvolumeclaims", "shop")))
    with pytest.raises(DependencyCycle, match="b -> a -> b"):
        check_no_cycle(b, state)
    graph = service_graph([*state.critical_services(), b], state)
    assert "may wait for its provider set (every configmaps in namespace shop matching role=config) of b" in \
        graph.edges["b", "a"]["why"]
    disjoint = parse_critical_service(cs_obj("b", selected("configmaps", "shop", role="config"),
                                             resources("persistentvolumeclaims", "shop", app="web")))
    check_no_cycle(disjoint, state)


def test_a_cluster_wide_set_holds_every_namespace_back() -> None:
    """Without a namespace, a selected object may live in any namespace, and that namespace waits too."""
    state = MemoryState()
    state.upsert_critical_service(parse_critical_service(
        cs_obj("a", selected("persistentvolumeclaims", app="db"), resources("configmaps", "ops"))))
    b = parse_critical_service(cs_obj("b", selected("configmaps", "ops"),
                                      {"type": "SpecificResource", "specificResource": {"resource": "namespaces",
                                                                                        "name": "anything"}}))
    with pytest.raises(DependencyCycle):
        check_no_cycle(b, state)


_KEYS, _VALUES = ("a", "b"), ("x", "y")
requirements = st.builds(
    lambda key, op, values: Requirement(key, op, frozenset(values) if op in ("In", "NotIn") else frozenset()),
    st.sampled_from(_KEYS), st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]),
    st.frozensets(st.sampled_from(_VALUES), min_size=1))
selectors = st.builds(lambda rs: LabelSelector(tuple(rs)), st.lists(requirements, max_size=3))


@given(selectors, selectors)
def test_may_overlap_is_exact_against_brute_force(a: LabelSelector, b: LabelSelector) -> None:
    """Every label set over the keys, with each value, a value no selector names ("z") or none, is tried."""
    choices = [*_VALUES, "z", None]
    label_sets = [{k: v for k, v in zip(_KEYS, values, strict=True) if v is not None}
                  for values in itertools.product(choices, repeat=len(_KEYS))]
    assert may_overlap(a, b) == any(a.matches(ls) and b.matches(ls) for ls in label_sets)


# --- the property: denied iff a matching selector provider has unmet criteria ---------------------------------
def oracle_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """An independent reading of metav1.LabelSelector on the raw spec (not criticalsvc.labels)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or ():
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", ()), "NotIn": not present or value not in e.get("values", ()),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


_LABEL_KEYS, _LABEL_VALUES, _NAMESPACES = ("app", "tier"), ("db", "web"), ("shop", "web")
labelsets = st.dictionaries(st.sampled_from(_LABEL_KEYS), st.sampled_from(_LABEL_VALUES), max_size=2)
raw_selectors = st.fixed_dictionaries({}, optional={
    "matchLabels": st.dictionaries(st.sampled_from(_LABEL_KEYS), st.sampled_from(_LABEL_VALUES), max_size=1),
    "matchExpressions": st.lists(st.one_of(
        st.builds(lambda k, op, vs: {"key": k, "operator": op, "values": vs}, st.sampled_from(_LABEL_KEYS),
                  st.sampled_from(["In", "NotIn"]), st.lists(st.sampled_from(_LABEL_VALUES), min_size=1, max_size=2,
                                                              unique=True)),
        st.builds(lambda k, op: {"key": k, "operator": op}, st.sampled_from(_LABEL_KEYS),
                  st.sampled_from(["Exists", "DoesNotExist"]))), max_size=2)})
providers = st.tuples(st.sampled_from([None, *_NAMESPACES]), raw_selectors, st.booleans())  # (ns, selector, unmet)


def _world(specs: list[tuple[str | None, dict[str, Any], bool]]) -> MemoryState:
    state = MemoryState()
    for i, (namespace, selector, unmet) in enumerate(specs):
        provider: dict[str, Any] = {"resource": "persistentvolumeclaims", "selector": selector}
        if namespace:
            provider["namespace"] = namespace
        state.upsert_critical_service(parse_critical_service(
            cs_obj(f"cs-{i}", provider, resources("configmaps", "criteria", need=f"cs-{i}"))))
        if unmet:
            state.upsert(obj(GroupResource("", "configmaps"), "criteria", f"needed-by-{i}", {"need": f"cs-{i}"}))
    return state


def _check(specs: list[tuple[str | None, dict[str, Any], bool]], namespace: str, labels: dict[str, str],
           state: Any) -> None:
    decision = delete(state, PVCS, namespace, "target", labels)
    expected = any(unmet and (ns is None or ns == namespace) and oracle_matches(sel, labels)
                   for ns, sel, unmet in specs)
    assert decision.allowed is not expected, (specs, namespace, labels, decision.message)


@settings(max_examples=200, deadline=None)
@given(st.lists(providers, max_size=4), st.sampled_from(_NAMESPACES), labelsets)
def test_denied_iff_a_matching_selector_provider_has_unmet_criteria(
        specs: list[tuple[str | None, dict[str, Any], bool]], namespace: str, labels: dict[str, str]) -> None:
    _check(specs, namespace, labels, _world(specs))


class _IgnoresLabels:
    """A broken state (the negative control): it matches provider selectors against no labels."""

    def __init__(self, inner: MemoryState) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def protecting(self, ref: ObjectRef, labels: Any = None) -> Any:
        return self._inner.protecting(ref, {})


def test_the_property_catches_a_state_that_ignores_labels() -> None:
    """Negative control: the same check fails on a state whose index does not look at the labels."""
    specs: list[tuple[str | None, dict[str, Any], bool]] = [("shop", {"matchLabels": {"app": "db"}}, True)]
    _check(specs, "shop", {"app": "db"}, _world(specs))
    with pytest.raises(AssertionError):
        _check(specs, "shop", {"app": "db"}, _IgnoresLabels(_world(specs)))


# --- live confirmation and the cache, over the stand-in ---------------------------------------------------
def example_store(*, skip: tuple[str, ...] = ()) -> Store:
    store = Store(clock=time.time)
    order = {"Namespace": 0, "CustomResourceDefinition": 1}
    for m in sorted(load_path(str(EXAMPLE)), key=lambda m: order.get(m.kind, 2)):
        if m.kind not in skip:
            store.create(copy.deepcopy(dict(m.obj)))
    return store


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
@pytest.mark.parametrize(("skip", "allowed"), [((), False), (("XDatabase",), True)], ids=["unmet", "met"])
async def test_live_reads_and_the_cache_decide_selected_objects_alike(skip: tuple[str, ...], allowed: bool) -> None:
    """The cache watches the provider type with its labels; a fresh read LISTs by selector; both agree."""
    with running_standin(example_store(skip=skip)) as env:
        async with started_cache(env) as (cache, transport):
            assert await cache.wait_ready(5)
            assert PVCS in cache.watched()
            reader = LiveReader(transport, mapper=cache.mapper)
            for gr, namespace, name, labels in ((PVCS, "shop", "data-db-0", {"app": "db"}),
                                                (NAMESPACES, "", "shop", {})):
                request = AdmissionRequest(uid="u", group_resource=gr, operation="DELETE", name=name,
                                           namespace=namespace or name,
                                           old_object={"metadata": {"name": name, "labels": labels}})
                cached = decide(request, cache)
                confirmed = await reader.decide(request)
                assert cached.allowed is allowed and confirmed.decision.allowed is allowed, confirmed
                assert confirmed.decision.protected and confirmed.confirmed
                unlabelled = attrs.evolve(request, old_object={"metadata": {"name": name}})
                if gr == PVCS:
                    assert (await reader.decide(unlabelled)).decision.rule == Rule.UNPROTECTED


# --- a simulated teardown ---------------------------------------------------------------------------------
SIM_BUNDLE = """
apiVersion: v1
kind: Namespace
metadata: {name: data}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: criticalsvc.io/v1alpha1
kind: CriticalService
metadata: {name: databases}
spec:
  provider: {group: apps, resource: deployments, namespace: data, selector: {matchLabels: {role: db}}}
  criteria:
  - type: Resources
    resources: {group: apps, resource: deployments, namespace: shop, selector: {matchLabels: {uses: db}}}
""" + "".join(f"""---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {ns}, labels: {labels}}}
spec:
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec: {{containers: [{{name: c, image: registry.example.com/{name}:1}}]}}
""" for name, ns, labels in (("pg-0", "data", "{role: db}"), ("pg-1", "data", "{role: db}"),
                             ("cache", "data", "{role: cache}"), ("cart", "shop", "{uses: db}"),
                             ("orders", "shop", "{uses: db}")))


@pytest.mark.parametrize("client", ["manifestwork", "namespace"])
def test_a_simulated_teardown_deletes_every_selected_object_after_its_criteria_objects(
        tmp_path: Path, client: str) -> None:
    bundle = tmp_path / "bundle.yaml"
    bundle.write_text(SIM_BUNDLE, encoding="utf-8")
    cluster = Cluster(seed=3)
    cluster.load(load_path(str(bundle)))
    cluster.teardown(client)
    verdict = cluster.run()
    assert verdict.completed, verdict.summary()
    gone: dict[ObjectRef, int] = {}
    for e in cluster.timeline.events:
        if e.outcome in (GONE, DELETED) and e.ref is not None:
            gone.setdefault(e.ref, e.seq)
    clients = [gone[ObjectRef(DEPLOYMENTS, "shop", n)] for n in ("cart", "orders")]
    for name in ("pg-0", "pg-1"):
        assert gone[ObjectRef(DEPLOYMENTS, "data", name)] > max(clients), name
    assert gone[ObjectRef(NAMESPACES, "", "data")] > max(clients)
    assert gone[ObjectRef(CRITICAL_SERVICES, "", "databases")] == max(gone.values())
    if client == "manifestwork":
        assert verdict.denials > 0, "the gate had to hold something back"
