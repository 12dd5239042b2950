"""The gate against brute-force oracles on random clusters: provider and namespace DELETEs, and the cycle check.

Each oracle reads the generated JSON directly: it resolves resource spellings from the generator's own
table, walks every object for every criterion (no indexes) and builds the dependency graph pair by
pair. It shares nothing with criticalsvc.criteria, .state or .graph, so a bug there shows up as a
disagreement. The negative controls prove the comparison has teeth: a gate that forgets one criterion
type, or the existing CriticalServices, is caught on some generated example.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs
from hypothesis import Phase, find, given, settings
from strategies_core import (
    CANDIDATE,
    NS_NAME_LABEL,
    TYPES,
    Target,
    World,
    namespace_deletes,
    provider_deletes,
    service_creates,
)

from criticalsvc.admission import AdmissionRequest, parse_review, render_review
from criticalsvc.api import CRITICAL_SERVICES, VERSION, CriticalService, FinalizerCriterion, GroupResource
from criticalsvc.decision import Decision, Rule, decide
from criticalsvc.manifests import Manifest
from criticalsvc.snapshot import build_state
from criticalsvc.state import ClusterState, MemoryState

Decide = Callable[[Any, ClusterState], Decision]


# --- the oracle -------------------------------------------------------------------------------------
@attrs.frozen
class Obj:
    """What the oracle knows of an object: its type key, namespace, name, labels and finalizers."""

    type: str
    namespace: str
    name: str
    labels: Mapping[str, str] = attrs.field(factory=dict)
    finalizers: tuple[str, ...] = ()


def type_of_kind(kind: str) -> str:
    return next(key for key, t in TYPES.items() if t.kind == kind)


def all_objects(world: World) -> list[Obj]:
    """Every object of the snapshot, CriticalServices included (they are objects too)."""
    out = []
    for m in [*world.objects, *world.services]:
        md = m["metadata"]
        out.append(Obj(type_of_kind(m["kind"]), md.get("namespace", ""), md["name"], md.get("labels") or {},
                       tuple(md.get("finalizers") or ())))
    return out


def served(world: World, key: str) -> bool:
    t = TYPES[key]
    if t.builtin:
        return True
    # A CRD, or an instance in the snapshot, proves the type is served.
    return key == "coolresources" and (world.crd_present or any(o["kind"] == t.kind for o in world.objects))


def resolve(world: World, group: str, spelling: str) -> str | None:
    """The type key a (group, resource) spelling names, None when nothing serving it is known."""
    for key, t in TYPES.items():
        # Short names come from discovery / the CRD; a type only guessed from its instances has none.
        names = {t.plural, t.kind.lower(), *(t.short_names if t.builtin or world.crd_present else ())}
        if t.group == group and spelling.lower() in names and served(world, key):
            return key
    return None


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for e in selector.get("matchExpressions") or []:
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {"In": present and value in e.get("values", []), "NotIn": not present or value not in e.get("values", []),
              "Exists": present, "DoesNotExist": not present}[e["operator"]]
        if not ok:
            return False
    return True


def covers(world: World, criterion: Mapping[str, Any], obj: Obj) -> bool:
    """Is `obj` one of the objects that must be gone for `criterion` to hold?"""
    body = next(v for k, v in criterion.items() if k != "type")
    if resolve(world, body.get("group", ""), body["resource"]) != obj.type:
        return False
    if criterion["type"] == "Finalizer":
        return body["finalizerName"] in obj.finalizers
    if criterion["type"] == "SpecificResource":
        return (body.get("namespace", ""), body["name"]) == (obj.namespace, obj.name)
    if "namespace" in body and body["namespace"] != obj.namespace:
        return False
    return selector_matches(body.get("selector"), obj.labels)


def holds(world: World, criterion: Mapping[str, Any]) -> bool:
    return not any(covers(world, criterion, o) for o in all_objects(world))


def provider_key(world: World, service: Mapping[str, Any]) -> tuple[str | None, str, str]:
    p = service["spec"]["provider"]
    return resolve(world, p["group"], p["resource"]), p["namespace"], p["name"]


def exists(world: World, key: tuple[str | None, str, str]) -> Obj | None:
    return next((o for o in all_objects(world) if (o.type, o.namespace, o.name) == key), None)


@attrs.frozen
class Expected:
    allowed: bool
    blocking: tuple[str, ...]  # every guarding service with an unmet criterion, Warn ones included
    enforced: tuple[str, ...]  # the Enforce ones among them: these deny


def expected_for(world: World, guarding: Iterable[Mapping[str, Any]]) -> Expected:
    unmet = [s for s in guarding if not all(holds(world, c) for c in s["spec"]["criteria"])]
    enforced = [s for s in unmet if s["spec"].get("enforcement", "Enforce") == "Enforce"]
    return Expected(not enforced, tuple(sorted(s["metadata"]["name"] for s in unmet)),
                    tuple(sorted(s["metadata"]["name"] for s in enforced)))


def oracle_provider_delete(world: World, target: Target) -> Expected:
    """ALLOW iff every Enforce CriticalService whose provider is the target has all criteria holding."""
    key = (target.resource, target.namespace, target.name)
    return expected_for(world, [s for s in world.services if provider_key(world, s) == key])


def confined(service: Mapping[str, Any]) -> bool:
    """Every criterion names objects in the provider's own namespace (a Finalizer criterion never does)."""
    ns = service["spec"]["provider"]["namespace"]
    return bool(ns) and all(c["type"] != "Finalizer" and next(v for k, v in c.items() if k != "type")
                            .get("namespace") == ns for c in service["spec"]["criteria"])


def wedged(world: World, services: list[Mapping[str, Any]]) -> set[str]:
    """The confined Enforce services on a cycle of the namespace controller's order (design/criticalservice.md
    "Order inside a namespace"): a provider waits for what its criteria cover; an object of a provider's type
    that sorts after it is tried only once that provider may go; nothing but pods while a provider pod waits."""
    Key = tuple[str, str, str]  # (type, namespace, name): Obj holds a dict, so it is no dict key
    waits: dict[Key, set[Key]] = {}
    mine: list[tuple[str, Key, set[Key]]] = []  # (service, its provider, what its own criteria cover)
    for s in services:
        if s["spec"].get("enforcement", "Enforce") != "Enforce":
            continue
        p = exists(world, provider_key(world, s))
        if p is not None:
            key = (p.type, p.namespace, p.name)
            covered = {(o.type, o.namespace, o.name) for o in all_objects(world)
                       for c in s["spec"]["criteria"] if covers(world, c, o)}
            mine.append((s["metadata"]["name"], key, covered))
            # A provider goes once every service protecting it may let it: it waits for all they cover.
            waits.setdefault(key, set()).update(covered)
    after: dict[Key, set[Key]] = {}  # object -> the objects it cannot go before
    for p, covered in waits.items():
        after.setdefault(p, set()).update(covered)
    for o in {o for covered in waits.values() for o in covered}:
        for p, covered in waits.items():
            if (p[0] == o[0] and p[2] < o[2]) or (p[0] == "pods" and o[0] != "pods"):
                after.setdefault(o, set()).update(covered | {p})
    out = set()
    for name, p, covered in mine:  # DFS from what this service's own criteria cover: back to its provider?
        seen: set[Key] = set()
        stack = list(covered)
        while stack:
            n = stack.pop()
            if n == p:
                out.add(name)
                break
            if n not in seen:
                seen.add(n)
                stack.extend(after.get(n, ()))
    return out


def oracle_namespace_delete(world: World, target: Target) -> Expected:
    """ALLOW iff no Enforce CriticalService whose existing provider lives in the namespace has unmet criteria,
    not counting those confined to it - unless they are on a cycle of the namespace controller's order."""
    hosted = [s for s in world.services if s["spec"]["provider"]["namespace"] == target.name
              and exists(world, provider_key(world, s)) is not None]
    stuck = wedged(world, [s for s in hosted if confined(s)])
    return expected_for(world, [s for s in hosted if not confined(s) or s["metadata"]["name"] in stuck])


# --- running the gate ----------------------------------------------------------------------------------
def state_of(world: World) -> MemoryState:
    return build_state([Manifest(m, f"generated: document {i}") for i, m in enumerate(world.manifests(), 1)])


def delete_review(world: World, target: Target) -> dict[str, Any]:
    """The DELETE as the API server sends it: oldObject is the stored object, name "" for a collection item."""
    stored = exists(world, (target.resource, "" if target.resource == "namespaces" else target.namespace, target.name))
    metadata: dict[str, Any] = {"name": target.name}
    if target.resource != "namespaces":
        metadata["namespace"] = target.namespace
    if stored is not None:
        metadata["labels"] = dict(stored.labels)
    return dict(render_review(AdmissionRequest(
        uid="u", group_resource=GroupResource(target.group, target.resource), operation="DELETE",
        name="" if target.collection_item else target.name, namespace=target.namespace,
        old_object={"metadata": metadata})))


def delete_mismatch(world: World, target: Target, expected: Expected, gate: Decide = decide) -> str | None:
    """How the gate's answer differs from the oracle's, or None when they agree."""
    d = gate(parse_review(delete_review(world, target)), state_of(world))
    if d.allowed != expected.allowed:
        return f"allowed={d.allowed} ({d.rule}: {d.message}), oracle says {expected.allowed}"
    if d.blocking != expected.blocking:
        return f"blocking={d.blocking}, oracle says {expected.blocking}"
    if not d.allowed:
        if (d.code, d.reason, d.rule) != (403, "Forbidden", Rule.BLOCKED):
            return f"denial rendered as {d.code}/{d.reason}/{d.rule}"
        if f"CriticalService {expected.enforced[0]} " not in d.message:
            return f"message does not name {expected.enforced[0]}: {d.message}"
    elif len(d.warnings) != len(expected.blocking):  # each Warn-only service that would deny warns once
        return f"{len(d.warnings)} warnings for {len(expected.blocking)} warn-only blockers"
    return None


@settings(max_examples=300)
@given(provider_deletes())
def test_provider_delete_matches_the_oracle(case):
    """A provider DELETE is allowed iff every Enforce service protecting it has all criteria met."""
    world, target = case
    assert delete_mismatch(world, target, oracle_provider_delete(world, target)) is None


@settings(max_examples=200)
@given(namespace_deletes())
def test_namespace_delete_matches_the_oracle(case):
    """A namespace DELETE is allowed iff no Enforce service with an existing provider there has unmet criteria."""
    world, target = case
    assert delete_mismatch(world, target, oracle_namespace_delete(world, target)) is None


# --- the cycle check ---------------------------------------------------------------------------------------
def teardown_set(world: World, service: Mapping[str, Any]) -> list[Obj]:
    """What goes when `service` is torn down: its provider, itself, and its provider's namespace."""
    key = provider_key(world, service)
    assert key[0] is not None  # providers are always built-in types here
    provider = exists(world, key) or Obj(key[0], key[1], key[2])
    itself = Obj("criticalservices", "", service["metadata"]["name"], service["metadata"].get("labels") or {})
    namespace = exists(world, ("namespaces", "", key[1])) or Obj("namespaces", "", key[1], {NS_NAME_LABEL: key[1]})
    return [provider, itself, namespace]


def waits_for(world: World, services: list[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Naive graph: a -> {b, ...} when a criterion of a covers something in b's teardown set."""
    return {a["metadata"]["name"]: {b["metadata"]["name"] for b in services
                                    if any(covers(world, c, o) for c in a["spec"]["criteria"]
                                           for o in teardown_set(world, b))}
            for a in services}


def on_a_cycle(graph: dict[str, set[str]], start: str) -> bool:
    """DFS: can `start` reach itself in one or more steps?"""
    seen: set[str] = set()
    stack = list(graph[start])
    while stack:
        node = stack.pop()
        if node == start:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(graph[node])
    return False


def create_review(candidate: Mapping[str, Any]) -> dict[str, Any]:
    return dict(render_review(AdmissionRequest(uid="u", group_resource=CRITICAL_SERVICES, operation="CREATE",
                                               name=CANDIDATE, namespace="", object=candidate), version=VERSION))


def cycle_mismatch(world: World, candidate: Mapping[str, Any], gate: Decide = decide) -> str | None:
    graph = waits_for(world, [*world.services, candidate])
    expected = on_a_cycle(graph, CANDIDATE)
    d = gate(parse_review(create_review(candidate)), state_of(world))
    if (d.rule is Rule.CYCLE) != expected or d.allowed == expected:
        return f"{d.rule} ({d.message}), oracle says cycle={expected}: {graph}"
    if expected:
        # The message names a real cycle through the candidate, in waiting order.
        named = d.message.split("dependency cycle: ")[1].split(";")[0].split(" -> ")
        if named[0] != CANDIDATE or named[-1] != CANDIDATE:
            return f"cycle {named} does not start and end at the candidate"
        if not all(b in graph[a] for a, b in itertools.pairwise(named)):
            return f"cycle {named} is not a cycle of {graph}"
    return None


@settings(max_examples=200)
@given(service_creates())
def test_create_is_rejected_exactly_when_it_closes_a_cycle(case):
    """A new CriticalService is rejected iff it lies on a cycle of the naive graph, and the message names one."""
    world, candidate = case
    assert cycle_mismatch(world, candidate) is None


# --- negative controls ----------------------------------------------------------------------------------------
class _Without:
    """A ClusterState view whose CriticalServices lose something: a broken gate to test the tests with."""

    def __init__(self, inner: MemoryState, *, drop_finalizers: bool = False, hide_services: bool = False) -> None:
        self._inner, self._drop, self._hide = inner, drop_finalizers, hide_services

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _edit(self, services: Collection[CriticalService]) -> list[CriticalService]:
        if self._hide:
            return []
        if not self._drop:
            return list(services)
        return [attrs.evolve(s, criteria=tuple(c for c in s.criteria if not isinstance(c, FinalizerCriterion)))
                for s in services]

    def critical_services(self) -> list[CriticalService]:
        return self._edit(self._inner.critical_services())

    def protecting(self, ref: Any, labels: Any = None) -> list[CriticalService]:
        return self._edit(self._inner.protecting(ref, labels))

    def hosted_in(self, namespace: str) -> list[CriticalService]:
        return self._edit(self._inner.hosted_in(namespace))


def _decide_ignoring_finalizers(request: Any, state: ClusterState) -> Decision:
    assert isinstance(state, MemoryState)
    return decide(request, _Without(state, drop_finalizers=True))


def _decide_without_existing_services(request: Any, state: ClusterState) -> Decision:
    assert isinstance(state, MemoryState)
    return decide(request, _Without(state, hide_services=True))


_SEARCH = settings(max_examples=2000, phases=[Phase.generate], database=None)


def test_oracle_catches_a_gate_that_ignores_finalizer_criteria():
    """A gate that skips Finalizer criteria disagrees with the provider oracle on some generated example."""
    world, target = find(provider_deletes(), lambda c: delete_mismatch(
        c[0], c[1], oracle_provider_delete(c[0], c[1]), _decide_ignoring_finalizers) is not None, settings=_SEARCH)
    assert delete_mismatch(world, target, oracle_provider_delete(world, target)) is None  # the real gate agrees


def test_oracle_catches_a_gate_that_ignores_finalizer_criteria_on_namespaces():
    """The same broken gate is caught by the namespace oracle too."""
    world, target = find(namespace_deletes(), lambda c: delete_mismatch(
        c[0], c[1], oracle_namespace_delete(c[0], c[1]), _decide_ignoring_finalizers) is not None, settings=_SEARCH)
    assert delete_mismatch(world, target, oracle_namespace_delete(world, target)) is None


def test_cycle_oracle_catches_a_check_blind_to_existing_services():
    """A cycle check that only looks at the candidate misses a longer cycle on some generated example."""
    world, candidate = find(service_creates(), lambda c: cycle_mismatch(
        c[0], c[1], _decide_without_existing_services) is not None, settings=_SEARCH)
    assert on_a_cycle(waits_for(world, [*world.services, candidate]), CANDIDATE)
    assert cycle_mismatch(world, candidate) is None
