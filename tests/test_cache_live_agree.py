"""The cache-backed and the live-read state decide alike (issue 14), and so does the caught-up cache (issue 37).

The webhook decides a DELETE with `decide(request, cache.state)` on its watch caches and confirms a
protected ALLOW with `LiveReader.decide(request)`, the same `decide` on a LiveState filled by fresh
reads in rounds. On the same, quiet cluster the two must give the same answer: same `allowed`, rule,
blocking services and message (compared here: the whole Decision). Otherwise a confirmation would
turn ALLOWs into denials (or the reverse) for no reason but a difference between two readers of one
API server.

Each example puts a random world (tests/strategies_core.py) into a sim Store served over HTTP by the
API-server stand-in (tests/kubefakes.py), starts a CacheState on it, waits until it is ready, then
decides 3-5 DELETEs (providers, namespaces, CriticalServices, the CoolResource and CriticalService CRDs)
both ways; half the worlds carry criteria with conditions. The negative control makes the cache stale
on purpose and checks the comparison catches it. One disagreement is known and pinned at the end.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubefakes import RunningStandIn, eventually, running_standin, started_cache
from strategies_core import (
    CRD_NAME,
    NAMESPACES,
    PROVIDER_NAMES,
    PROVIDER_NAMESPACES,
    PROVIDER_TYPES,
    SERVICE_NAMES,
    TYPES,
    Target,
    World,
    condition_pods,
    namespace_deletes,
    pick,
    provider_deletes,
    restricted_conditions,
)
from test_properties import delete_review

from criticalsvc.admission import AdmissionRequest, parse_review
from criticalsvc.api import CRD_NAME as CRITICAL_SERVICES_CRD
from criticalsvc.api import GroupResource, ObjectRef
from criticalsvc.cache import Backoff, CacheState
from criticalsvc.caughtup import CaughtUpReader
from criticalsvc.decision import Decision, decide
from criticalsvc.live import LiveReader
from criticalsvc.sim.store import StatusError, Store

FAST = Backoff(initial=0.01, maximum=0.05)
READY_TIMEOUT = 20.0
# The webhook's confirmation budget is 2 s; on a loaded 2-core machine a slow round would become an
# UNVERIFIABLE denial and show up as a disagreement that has nothing to do with what is compared.
LIVE_TIMEOUT = 15.0
CRD_NAMES = (CRD_NAME, CRITICAL_SERVICES_CRD)
_ORDER = {"Namespace": 0, "CustomResourceDefinition": 1, "CriticalService": 3}  # as kubefakes.story_store


# --- the cluster ------------------------------------------------------------------------------------------
def world_store(world: World) -> tuple[Store, list[str]]:
    """A Store holding the world, and what it refused (with why).

    Namespaces first (the world's, then any an object lives in that the world lacks: the API server
    refuses objects in a missing namespace, and the world does not promise its namespaces exist),
    CRDs next, then the rest, CriticalServices last, as kubefakes.story_store orders them.
    """
    store = Store(clock=time.time)
    manifests = sorted(world.manifests(), key=lambda m: _ORDER.get(m["kind"], 2))
    present = {m["metadata"]["name"] for m in manifests if m["kind"] == "Namespace"}
    for m in manifests:
        if m["kind"] == "Namespace":
            store.create(m)
    for ns in sorted({m["metadata"]["namespace"] for m in manifests if m["metadata"].get("namespace")} - present):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    refused = []
    for m in manifests:
        if m["kind"] == "Namespace":
            continue
        try:
            store.create(m)
        except StatusError as exc:
            # A CoolResource in a world without the CRD: the generator lets the type be "guessed from its
            # instances", but a real API server serves no instances of a type it does not serve (404 no
            # matches for kind), so such an object cannot exist on a cluster and is left out.
            refused.append(f"{m['kind']} {m['metadata'].get('namespace', '')}/{m['metadata']['name']}: {exc}")
    return store, refused


# --- the requests -----------------------------------------------------------------------------------------
@st.composite
def more_targets(draw: st.DrawFn, world: World) -> Target:
    """Another DELETE in the same world: a provider, a namespace, a CriticalService or a CRD."""
    what = draw(pick(("provider", "provider", "namespace", "service", "service", "crd")))
    item = draw(st.booleans())
    if what == "provider":
        t = TYPES[draw(pick(PROVIDER_TYPES))]
        return Target(t.group, t.plural, draw(pick(PROVIDER_NAMESPACES)), draw(pick(PROVIDER_NAMES)), item)
    if what == "namespace":
        name = draw(pick(NAMESPACES))
        return Target("", "namespaces", name, name, item)
    if what == "service":
        names = tuple(s["metadata"]["name"] for s in world.services)
        name = draw(pick(names) if names and draw(st.integers(0, 3)) > 0 else pick(SERVICE_NAMES))
        return Target("criticalsvc.io", "criticalservices", "", name, item)
    # The CriticalService CRD is gated (not while a CriticalService exists); the CoolResource CRD is not.
    return Target("apiextensions.k8s.io", "customresourcedefinitions", "", draw(pick(CRD_NAMES)), item)


# Conditions on metadata hold or not on every object of the world (the restricted ones need a status
# or spec.replicas, which only the condition pods have; elsewhere they error, and errors count).
METADATA_CONDITIONS = ("object.metadata.name != 'p0'", "has(object.metadata.finalizers)")
conditions = st.one_of(restricted_conditions.map(lambda c: c.expression), pick(METADATA_CONDITIONS))


@st.composite
def with_conditions(draw: st.DrawFn, world: World) -> World:
    """Half the time: some criteria get a condition, and pods of every shape a condition meets join ns-a.

    Conditions change how both sides read (whole objects instead of metadata, outcomes evaluated as
    objects arrive, evaluation errors shown in the message), so they are worth agreeing on too.

    Criteria about CriticalServices too: the live read once never evaluated a condition on them
    (test_a_condition_on_critical_services_is_decided_alike below pins that case).
    """
    if not draw(st.booleans()):
        return world
    services = copy.deepcopy(list(world.services))
    for service in services:
        for criterion in service["spec"]["criteria"]:
            if draw(st.integers(0, 1)):
                criterion["condition"] = draw(conditions)
    return attrs.evolve(world, objects=(*world.objects, *draw(condition_pods())), services=tuple(services))


@st.composite
def cases(draw: st.DrawFn) -> tuple[World, list[Target]]:
    """A world (with a first DELETE from the oracle tests' strategies) and 2-4 more DELETEs in it."""
    world, first = draw(st.one_of(provider_deletes(), namespace_deletes()))
    world = draw(with_conditions(world))
    return world, [first, *draw(st.lists(more_targets(world), min_size=2, max_size=4))]


def request_for(world: World, target: Target) -> AdmissionRequest:
    return parse_review(delete_review(world, target))


# --- deciding both ways -----------------------------------------------------------------------------------
def verdict(d: Decision) -> dict[str, Any]:
    """What must agree: allowed, rule, blocking services and message, and the rest of the Decision too
    (warnings carry the Warn-only blocks, `protected` says whether a CriticalService had a say)."""
    return {**attrs.asdict(d), "rule": str(d.rule)}


Stale = Callable[[RunningStandIn, CacheState], Awaitable[None]]


async def decide_both(env: RunningStandIn, requests: list[AdmissionRequest], *,
                      stale: Stale | None = None) -> list[tuple[Decision, Decision, Decision, Decision]]:
    """(cache decision, live decision, caught-up decision, live decision with the questions foreseen by the cache)
    per request; `stale` runs once the cache is ready,
    before deciding. The third is the confirmation on the cache caught up to one consistent read
    (criticalsvc/caughtup.py), falling back to the fresh reads (their questions foreseen by the cache) where it
    cannot answer, as `serve` runs it."""
    async with started_cache(env) as (cache, transport):
        assert await cache.wait_ready(READY_TIMEOUT), f"the cache did not sync: {cache.unsynced()}"
        # Ready as the webhook counts it, but a type may still be listed again for the conditions the
        # CriticalServices put on it; until then its objects' outcomes are "not evaluated yet" and count, a
        # denial the fresh read does not share. The same state, not the same moment, is what is compared.
        await eventually(lambda: not cache.watches.successors, what="no type listed again for its conditions")
        if stale is not None:
            await stale(env, cache)
        reader = LiveReader(transport, mapper=cache.mapper, timeout=LIVE_TIMEOUT)
        caught_up = LiveReader(transport, mapper=cache.mapper, timeout=LIVE_TIMEOUT, mirror=cache, catch_up_above=0,
                               catch_up_timeout=LIVE_TIMEOUT, caught_up=CaughtUpReader(transport, cache),
                               predict_from=cache)
        foreseeing = LiveReader(transport, mapper=cache.mapper, timeout=LIVE_TIMEOUT, predict_from=cache)
        out = []
        for request in requests:
            cached = decide(request, cache.state)
            live = await reader.decide(request)
            out.append((cached, live.decision, (await caught_up.decide(request)).decision,
                        (await foreseeing.decide(request)).decision))
        return out


def disagreements(world: World, targets: list[Target], *, stale: Stale | None = None) -> list[str]:
    """Every request on which the cache and the live read decide differently, described in full."""
    store, refused = world_store(world)
    requests = [request_for(world, t) for t in targets]
    with running_standin(store) as env:
        pairs = asyncio.run(decide_both(env, requests, stale=stale))
    found = []
    for target, request, (cached, live, caught, foreseen) in zip(targets, requests, pairs, strict=True):
        if verdict(cached) != verdict(live):
            found.append(f"world: {world}\nrefused by the store: {refused}\ntarget: {target}\nrequest: {request}\n"
                         f"cache decision: {verdict(cached)}\nlive decision:  {verdict(live)}")
        for name, other in (("caught-up", caught), ("foreseen", foreseen)):
            if verdict(other) != verdict(live):
                found.append(f"world: {world}\nrefused by the store: {refused}\ntarget: {target}\n"
                             f"request: {request}\n{name} decision: {verdict(other)}\nlive decision:  {verdict(live)}")
    return found


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cases())
def test_cache_and_live_reads_decide_alike(case: tuple[World, list[Target]]) -> None:
    """For any world and DELETEs in it, the watch caches and the fresh reads give the same decision."""
    world, targets = case
    found = disagreements(world, targets)
    assert not found, "the cache and the live read disagree:\n\n" + "\n\n".join(found)


# --- negative control ------------------------------------------------------------------------------------
CONFIGMAPS = GroupResource("", "configmaps")
CONTROL = World(
    crd_present=False,
    objects=({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p0", "namespace": "ns-a"}},
             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ns-b"}}),
    # The criterion's object lives in another namespace: one in ns-a would confine cs0 to ns-a, and ns-a's
    # deletion would not wait for it (criticalsvc/nsorder.py), so only the provider's DELETE could disagree.
    services=({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cs0"},
               "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ns-a", "name": "p0"},
                        "criteria": [{"type": "SpecificResource", "specificResource": {
                            "group": "", "resource": "configmaps", "namespace": "ns-b", "name": "x"}}]}},),
)
CONTROL_TARGETS = [Target("apps", "deployments", "ns-a", "p0", False), Target("", "namespaces", "ns-a", "ns-a", False)]


async def _miss_a_deletion(env: RunningStandIn, cache: CacheState) -> None:
    """Pause the cache's watches, then delete the ConfigMap the criterion waits for: the cache misses it."""
    def watching() -> list[bool]:
        return [r.watching for r in map(cache.reflector, cache.watched()) if r is not None]

    await eventually(lambda: all(watching()), what="every reflector watching")
    env.faults.add(r".*", watch=True, status=500)  # from now on the cache hears nothing
    env.drop_watches()
    await eventually(lambda: not any(watching()), what="every watch broken off")
    await env.write(lambda: env.store.delete(ObjectRef(CONFIGMAPS, "ns-b", "x")))


def test_the_comparison_catches_a_stale_cache() -> None:
    """A cache that missed a deletion blocks what the fresh read allows; the comparison reports it."""
    assert disagreements(CONTROL, CONTROL_TARGETS) == []  # in sync, the control world agrees
    found = disagreements(CONTROL, CONTROL_TARGETS, stale=_miss_a_deletion)
    assert len(found) == 2, found
    assert "'allowed': False, 'rule': 'blocked'" in found[0].split("cache decision:")[1].split("\n")[0]
    assert "'allowed': True, 'rule': 'criteria-met'" in found[0].split("live decision:")[1]


def test_the_store_holds_the_world() -> None:
    """world_store creates the namespaces objects live in and refuses nothing in the control world."""
    store, refused = world_store(CONTROL)
    assert refused == []
    assert store.exists(CONFIGMAPS, "ns-b", "x") and store.exists(GroupResource("", "namespaces"), "", "ns-b")


# --- a known disagreement --------------------------------------------------------------------------------
def _guarded_by_a_condition_on(condition: str) -> World:
    """cs1 protects deployment ns-a/p0 until CriticalService cs0 is gone, counting cs0 only where `condition`."""
    return World(
        crd_present=False,
        objects=({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "p0", "namespace": "ns-a"}},),
        services=(
            {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cs0"},
             "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ns-b", "name": "p1"},
                      "criteria": [{"type": "SpecificResource", "specificResource": {
                          "group": "", "resource": "configmaps", "namespace": "ns-b", "name": "y"}}]}},
            {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cs1"},
             "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "ns-a", "name": "p0"},
                      "criteria": [{"type": "SpecificResource", "condition": condition, "specificResource": {
                          "group": "criticalsvc.io", "resource": "criticalservices", "name": "cs0"}}]}},
        ))


@pytest.mark.parametrize("condition", ["object.metadata.name == 'nobody'", "object.spec.replicas > 3"])
def test_a_condition_on_critical_services_is_decided_alike(condition: str) -> None:
    """A condition on a criterion naming a CriticalService: cache and fresh read both evaluate it on cs0 (false:
    criteria met, ALLOW; or the same evaluation error in the denial). The fresh read used to skip it and deny
    with '(not evaluated yet)', wrongly refusing what the cache allowed."""
    found = disagreements(_guarded_by_a_condition_on(condition), [Target("apps", "deployments", "ns-a", "p0", False)])
    assert not found, "\n\n".join(found)
