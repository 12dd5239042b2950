"""Dependency graphs: "X must be gone before Y may be deleted".

Two granularities, both networkx DiGraphs whose edges point from what must go first to what waits:

* `service_graph` — one node per CriticalService. B -> A when a criterion of A covers something in
  B's *teardown set*: B's provider, the CriticalService B itself, the namespace of B's provider
  (that namespace cannot go while B's criteria are unmet), the CRD of B's provider type and the
  CriticalServices' own CRD (rule 4: a CRD's DELETE is refused as its instances' would be). A cycle (a
  self-loop included: a
  criterion covering one's own provider, own namespace or oneself) is a teardown that can never
  finish; `check_no_cycle` rejects the spec that would close one.

  A provider selector (spec.provider.selector) makes B's provider a set, including objects created
  or labelled into it later, so it cannot be listed: B -> A when a criterion of A *may* count a member
  of the set (`_may_cover`: the same type, compatible namespaces, and label selectors some labels meet
  both, which `labels.may_overlap` decides exactly; a Finalizer criterion may count any member, and a
  condition may be true for any). Without a namespace the set may live in any namespace, and each
  namespace hosting a member waits for B's criteria, so B's teardown set holds every namespace then.
  This is sound - no cycle through a selector is missed - and may refuse a spec whose overlap no object
  will ever realise.

* `teardown_graph` — one node per object of a bundle. Content goes before its namespace, instances
  before their CRD, objects a criterion covers before the provider and (unless the CriticalService is
  confined to it, criticalsvc/nsorder.py) the provider's namespace, and the provider (and its namespace)
  before the CriticalService. A provider selector makes each object of the bundle it selects a provider
  there, each waiting for the criteria. `phases` are the topological
  generations: the order in which things are gone when everything is deleted at once.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import networkx as nx

from . import criteria, nsorder
from .api import (
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    NAMESPACES,
    Criterion,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ProviderSelector,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from .errors import DependencyCycle, StateUnavailable
from .labels import LabelSelector, may_overlap
from .objects import KubeObject
from .state import ClusterState

# Types whose objects live in no namespace, so a provider selector over them holds no namespace back.
_CLUSTER_SCOPED = frozenset({NAMESPACES, CRDS, CRITICAL_SERVICES})


@attrs.frozen
class _Unread:
    """A named provider whose type the state cannot read now (403, not synced): its labels and finalizers are
    unknown, so a criterion that could cover it adds an edge marked `unverified` with the reason."""

    ref: ObjectRef
    why: str

    @property
    def group_resource(self) -> GroupResource:
        return self.ref.group_resource


_Member = KubeObject | ProviderSelector | _Unread


def _teardown_set(cs: CriticalService, state: ClusterState) -> list[tuple[_Member, str]]:
    """What goes away as part of tearing `cs` down, each with the word used in messages; a set a provider
    selector may select is a (resolved) ProviderSelector, a provider that cannot be read an _Unread."""
    gr = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
    out: list[tuple[_Member, str]] = []
    namespace = cs.provider.namespace
    if isinstance(cs.provider, ProviderSelector):
        out.append((attrs.evolve(cs.provider, group_resource=gr), f"its provider set ({cs.provider})"))
        if namespace is None and gr not in _CLUSTER_SCOPED:
            out.append((ProviderSelector(NAMESPACES, None, LabelSelector()), "the namespaces its provider set may "
                        "live in"))
    else:
        ref = attrs.evolve(cs.provider, group_resource=gr)
        try:
            provider: _Member = state.get(ref) or KubeObject(gr, ref.namespace, ref.name)
        except StateUnavailable as exc:
            # Another team's missing grant must not refuse every CriticalService's CREATE: only a cycle that
            # needs this provider's labels is unknowable (check_no_cycle).
            provider = _Unread(ref, str(exc))
        out.append((provider, f"its provider {ref}"))
    out.append((KubeObject(CRITICAL_SERVICES, "", cs.name, labels=cs.labels), f"CriticalService {cs.name}"))
    # Rule 4 (design/criticalservice.md §3): a CRD's DELETE is refused as its instances' would be, because CRD
    # cleanup deletes them without admission. So the CriticalServices' own CRD waits for every CriticalService,
    # and the CRD of a custom-resource provider waits for this one's criteria: both are part of the teardown.
    out.append((_crd(CRITICAL_SERVICES, state), f"the CRD {CRD_NAME} (deleted only after every CriticalService)"))
    if gr.group and gr != CRITICAL_SERVICES:
        out.append((_crd(gr, state), f"its provider's CRD {gr.resource}.{gr.group}"))
    if namespace:
        ns_ref = ObjectRef(NAMESPACES, "", namespace)
        ns = state.get(ns_ref) or KubeObject(NAMESPACES, "", namespace,
                                             labels={"kubernetes.io/metadata.name": namespace})
        out.append((ns, f"its provider's namespace {namespace}"))
    return out


def _crd(gr: GroupResource, state: ClusterState) -> KubeObject:
    """The CRD that would serve `gr` (`<plural>.<group>`, which the API server enforces): the stored one when
    it exists (its labels and finalizers decide a Resources or Finalizer criterion), else its name. A built-in
    type with a group (apps) has no CRD; a criterion naming one covers nothing real, and the decision refuses
    such a CRD's DELETE alike (decision._instances_of), so the edge is the decision's, not an over-approximation."""
    ref = ObjectRef(CRDS, "", f"{gr.resource}.{gr.group}")
    return state.get(ref) or KubeObject(CRDS, "", ref.name)


def _may_cover(criterion: Criterion, members: ProviderSelector, state: ClusterState) -> bool:
    """May `criterion` count some object of the set `members` (now or later)? Sound, from types, namespaces
    and selectors only: labels and finalizers of objects to come are unknown (module docstring)."""
    if state.resolve(criteria.named_resource(criterion)) != members.group_resource:
        return False
    if isinstance(criterion, FinalizerCriterion):
        return True
    namespace = criterion.namespace if isinstance(criterion, ResourcesCriterion) else criterion.target.namespace
    if namespace and members.namespace is not None and namespace != members.namespace:
        return False
    return not isinstance(criterion, ResourcesCriterion) or may_overlap(criterion.selector, members.selector)


def _may_cover_unread(criterion: Criterion, unread: _Unread) -> bool:
    """May `criterion` cover the provider `unread` whatever its labels and finalizers (its type matches)?"""
    if isinstance(criterion, ResourcesCriterion):
        return criterion.namespace is None or criterion.namespace == unread.ref.namespace
    if isinstance(criterion, FinalizerCriterion):
        return True
    return (criterion.target.namespace, criterion.target.name) == (unread.ref.namespace, unread.ref.name)


def service_graph(services: Iterable[CriticalService], state: ClusterState) -> nx.DiGraph:
    """CriticalService-level graph; edge B -> A carries `why` (which criterion covers what), and `unverified`
    (the reason) when it rests on a provider the state cannot read now: such an edge may not exist."""
    edges = ServiceEdges(services, state)
    graph = nx.DiGraph()
    graph.add_nodes_from(cs.name for cs in edges.services)
    for b in edges.services:
        for a_name, data in edges.out(b.name).items():
            graph.add_edge(b.name, a_name, **data)
    return graph


_Naming = tuple[int, int, CriticalService, Criterion]


class ServiceEdges:
    """The edges of `service_graph`, found per CriticalService B when asked: the criteria are indexed by the type
    they name, so B's out-edges cost what B's teardown set meets, not a pass over every pair. A CREATE's cycle
    check only needs what its candidate reaches (`_reachable`); over every pair it grew with the square of the
    CriticalServices - 0.6 s of the event loop per CREATE at 1,000, and the CREATE reviews of a population of
    10,000 timed out (`python -m benchmarks realcluster --services 10,1000`)."""

    def __init__(self, services: Iterable[CriticalService], state: ClusterState) -> None:
        self.services = list(services)
        self.state = state
        self.by_name = {cs.name: cs for cs in self.services}
        # type -> (a's position, criterion index, a, criterion), in service_graph's order of a, then i; a
        # SpecificResource criterion also under its object's name: only that object can be covered by it
        # (projection.candidate), which saves a pass over every named criterion of a common type
        self.naming: dict[GroupResource, list[_Naming]] = defaultdict(list)
        self.unnamed: dict[GroupResource, list[_Naming]] = defaultdict(list)
        self.named: dict[tuple[GroupResource, str, str], list[_Naming]] = defaultdict(list)
        # Each type as spelt resolved once: every CREATE of a CriticalService builds this over all of them (at 10,000
        # resolving each criterion's type was a quarter of the review, in-process).
        resolved: dict[GroupResource, GroupResource | None] = {}
        for position, a in enumerate(self.services):
            for i, criterion in enumerate(a.criteria):
                spelt = criteria.named_resource(criterion)
                gr = resolved[spelt] if spelt in resolved else resolved.setdefault(spelt, state.resolve(spelt))
                if gr is None:
                    continue
                entry = (position, i, a, criterion)
                self.naming[gr].append(entry)
                if isinstance(criterion, SpecificResourceCriterion):
                    self.named[gr, criterion.target.namespace or "", criterion.target.name].append(entry)
                else:
                    self.unnamed[gr].append(entry)
        self._out: dict[str, dict[str, dict[str, str]]] = {}

    def out(self, b_name: str) -> dict[str, dict[str, str]]:
        """B's out-edges: A's name -> the edge's data, in the order service_graph adds them."""
        known = self._out.get(b_name)
        if known is not None:
            return known
        b = self.by_name[b_name]
        members = _teardown_set(b, self.state)
        types = {obj.group_resource for obj, _word in members}
        lists: list[list[_Naming]] = []
        for gr in types:
            objects = [obj for obj, _word in members if obj.group_resource == gr]
            named = [obj for obj in objects if isinstance(obj, KubeObject)]
            if len(named) == len(objects):
                lists.append(self.unnamed.get(gr, []))
                lists += [self.named.get((gr, obj.namespace or "", obj.name), []) for obj in named]
            else:
                lists.append(self.naming.get(gr, []))
        met = list(heapq.merge(*lists, key=lambda x: (x[0], x[1])))  # each list is in that order already
        edges: dict[str, dict[str, str]] = {}
        for _position, i, a, criterion in met:
            named_type = self.state.resolve(criteria.named_resource(criterion))
            for obj, word in members:
                if obj.group_resource != named_type:
                    continue
                if a.name in edges and "unverified" not in edges[a.name]:
                    break
                if isinstance(obj, _Unread):
                    if _may_cover_unread(criterion, obj) and a.name not in edges:
                        edges[a.name] = {"why": f"{a.name}.spec.criteria[{i}] may wait for {word} of {b_name}",
                                         "unverified": obj.why}
                elif isinstance(obj, ProviderSelector):
                    if _may_cover(criterion, obj, self.state):
                        edges.pop(a.name, None)  # a certain edge replaces an unverified one
                        edges[a.name] = {"why": f"{a.name}.spec.criteria[{i}] may wait for {word} of {b_name}"}
                elif criteria.covers(criterion, obj, self.state):
                    edges.pop(a.name, None)
                    edges[a.name] = {"why": f"{a.name}.spec.criteria[{i}] waits for {word} of {b_name}"}
        self._out[b_name] = edges
        return edges


def _reachable(start: str, out: Callable[[str], Mapping[str, Mapping[str, str]]]) -> nx.DiGraph:
    """The part of a graph reachable from `start`, out-edges found by `out`: every cycle through `start` is in it."""
    graph = nx.DiGraph()
    graph.add_node(start)
    todo, seen = [start], {start}
    while todo:
        b = todo.pop()
        for a, data in out(b).items():
            graph.add_edge(b, a, **data)
            if a not in seen:
                seen.add(a)
                todo.append(a)
    return graph


def find_service_cycle(graph: nx.DiGraph, start: str | None = None) -> list[str] | None:
    """A cycle (as node names in order) through `start`, or anywhere when start is None."""
    try:
        edges = nx.find_cycle(graph, source=start) if start is not None else nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    nodes: list[str] = [u for u, _v, *_ in edges]
    if start is not None and start not in nodes:
        # find_cycle from a source may return a cycle reachable from it, not through it.
        for cycle in nx.simple_cycles(graph):
            if start in cycle:
                i = cycle.index(start)
                return [str(n) for n in cycle[i:] + cycle[:i]]
        return None
    return nodes


def with_candidate(candidate: CriticalService, state: ClusterState) -> ServiceEdges:
    """The edges among the stored CriticalServices with `candidate` added (or replacing its namesake)."""
    return ServiceEdges([*(cs for cs in state.critical_services() if cs.name != candidate.name), candidate], state)


def check_no_cycle(candidate: CriticalService, state: ClusterState, edges: ServiceEdges | None = None) -> None:
    """Raise DependencyCycle if adding (or replacing with) `candidate` closes a cycle through it; `edges`: those
    of with_candidate, when the caller has them already."""
    graph = _reachable(candidate.name, (edges or with_candidate(candidate, state)).out)
    certain = nx.subgraph_view(graph, filter_edge=lambda u, v: "unverified" not in graph.edges[u, v])
    cycle = find_service_cycle(certain, candidate.name)
    if cycle is None:
        maybe = find_service_cycle(graph, candidate.name)
        if maybe is None:
            return
        # A cycle only through a provider that cannot be read: neither refuse it as a cycle nor allow it.
        reasons = sorted({graph.edges[u, v]["unverified"] for u, v in zip(maybe, [*maybe[1:], maybe[0]], strict=True)
                          if "unverified" in graph.edges[u, v]})
        raise StateUnavailable(f"whether CriticalService {candidate.name} closes a dependency cycle through "
                               f"{', '.join(maybe)} depends on a provider the gate cannot read: {'; '.join(reasons)}")
    # Present the cycle in waiting order: a waits for b waits for ... a.
    waiting = list(reversed(cycle))
    i = waiting.index(candidate.name)
    order = waiting[i:] + waiting[:i]
    # Edge b -> a means a waits for b: a's step is the edge from the next name in waiting order.
    steps = [str(certain.edges[b, a]["why"]) for a, b in zip(order, [*order[1:], order[0]], strict=True)]
    raise DependencyCycle(order, steps)


NAMESPACE_STEP = "which goes only with namespace"


def namespace_deletion_cycle(candidate: CriticalService, state: ClusterState,
                             edges: ServiceEdges | None = None) -> DependencyCycle | None:
    """A cycle through `candidate` that only a teardown by namespace deletion meets, or None.

    Deleting a namespace N is refused while a CriticalService B whose provider lives in N is unmet and not
    confined to N (rule 2), and N's content is deleted only after that DELETE, by the namespace controller.
    So when namespaces alone are deleted (`kubectl delete namespace`, a tenant cleanup), a criterion of A
    counting an object in N waits for B's teardown too: edge B -> A. With the edges of `service_graph` such a
    cycle can never finish that way, while every deleter that deletes objects itself finishes it; the spec is
    admitted with a warning (design/criticalservice.md §6, found by `criticalsvc verify`). Objects that exist
    now are looked at; B == A is left to the warning of the provider's own namespace (decision.py)."""
    edges = edges or with_candidate(candidate, state)
    services = edges.services
    # Criteria whose objects may lie in a given namespace: confined to it, or to none.
    scoped: dict[str | None, list[tuple[int, int, CriticalService, Criterion]]] = defaultdict(list)
    for position, a in enumerate(services):
        for i, c in enumerate(a.criteria):
            scoped[criteria.criterion_namespace(c)].append((position, i, a, c))
    blocking: dict[tuple[int, int], list[KubeObject] | None] = {}

    def blocking_of(position: int, i: int, c: Criterion) -> list[KubeObject] | None:
        if (position, i) not in blocking:
            try:
                blocking[position, i] = list(criteria.blocking_objects(c, state))
            except StateUnavailable:
                blocking[position, i] = None  # advice only: a type the gate cannot read now adds no warning
        return blocking[position, i]

    def out(b_name: str) -> dict[str, dict[str, str]]:
        found = {a: data for a, data in edges.out(b_name).items() if "unverified" not in data}
        b = edges.by_name[b_name]
        ns = b.provider.namespace
        if not ns or nsorder.confined(b):
            return found
        met = sorted([*scoped.get(ns, ()), *scoped.get(None, ())], key=lambda x: (x[0], x[1]))
        for position, i, a, c in met:
            if a.name == b_name or a.name in found:
                continue
            inside = next((o for o in blocking_of(position, i, c) or () if o.namespace == ns), None)
            if inside is not None:
                found[a.name] = {"why": f"{a.name}.spec.criteria[{i}] waits for {inside.ref}, {NAMESPACE_STEP} {ns} "
                                        f"({b_name}'s provider's)"}
        return found

    extended = _reachable(candidate.name, out)
    cycle = find_service_cycle(extended, candidate.name)
    if cycle is None:
        return None
    waiting = list(reversed(cycle))
    i = waiting.index(candidate.name)
    order = waiting[i:] + waiting[:i]
    steps = [str(extended.edges[b, a]["why"]) for a, b in zip(order, [*order[1:], order[0]], strict=True)]
    return DependencyCycle(order, steps)


# --- object level ---------------------------------------------------------------------------------
@attrs.frozen
class Plan:
    graph: nx.DiGraph
    phases: tuple[tuple[ObjectRef, ...], ...]
    cycle: tuple[ObjectRef, ...] | None = None


def teardown_graph(objects: Sequence[KubeObject], services: Iterable[CriticalService],
                   state: ClusterState) -> nx.DiGraph:
    """Object-level graph over `objects` (a bundle); edge u -> v: u is gone before v can be gone."""
    graph = nx.DiGraph()
    present = {o.ref: o for o in objects}
    for o in objects:
        graph.add_node(o.ref)
    crd_of: dict[GroupResource, ObjectRef] = {}
    for o in objects:
        if o.group_resource == CRDS:
            t = state.resolve(GroupResource(o.name.partition(".")[2], o.name.partition(".")[0]))
            if t is not None:
                crd_of[t] = o.ref
    for o in objects:
        if o.namespace:
            ns = ObjectRef(NAMESPACES, "", o.namespace)
            if ns in present:
                graph.add_edge(o.ref, ns, why="content goes before its namespace")
        crd = crd_of.get(o.group_resource)
        if crd is not None:
            graph.add_edge(o.ref, crd, why="instances go before their CRD")
    for cs in services:
        waits = [w for w in _waiting(cs, objects, state) if w in present]
        for o in objects:
            for i, criterion in enumerate(cs.criteria):
                if criteria.covers(criterion, o, state):
                    for w in waits:
                        if w != o.ref:
                            graph.add_edge(o.ref, w, why=f"{cs.name}.spec.criteria[{i}]")
        if cs.ref in present:
            for w in waits:
                graph.add_edge(w, cs.ref, why=f"{cs.name} goes after what it protects")
    return graph


def _waiting(cs: CriticalService, objects: Sequence[KubeObject], state: ClusterState) -> list[ObjectRef]:
    """What of a bundle waits for `cs`'s criteria: its provider, or every object its provider selector
    selects, and the namespaces they live in."""
    provider_gr = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
    p = cs.provider
    # A confined CriticalService does not hold its namespace back (criticalsvc/nsorder.py): the namespace
    # waits for its content as any namespace does, and its provider for the criteria.
    holds_namespace = not nsorder.confined(cs)
    if isinstance(p, ObjectRef):
        provider = attrs.evolve(p, group_resource=provider_gr)
        return [provider, *((ObjectRef(NAMESPACES, "", provider.namespace),)
                            if provider.namespace and holds_namespace else ())]
    members = [o.ref for o in objects if o.group_resource == provider_gr and p.matches(o.namespace, o.labels)]
    namespaces = sorted({m.namespace for m in members if m.namespace} | ({p.namespace} if p.namespace else set()))
    return [*members, *(ObjectRef(NAMESPACES, "", ns) for ns in namespaces if holds_namespace)]


def plan(objects: Sequence[KubeObject], services: Iterable[CriticalService], state: ClusterState) -> Plan:
    graph = teardown_graph(objects, services, state)
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        phases = tuple(tuple(sorted(gen)) for gen in nx.topological_generations(graph))
        return Plan(graph, phases)
    return Plan(graph, (), tuple(u for u, _v, *_ in cycle))


def _dot_id(value: object) -> str:
    # Some kinds allow '"' and '\\' in names (RBAC: anything but '/' and '%'); DOT needs them escaped.
    return str(value).replace("\\", "\\\\").replace('"', '\\"')


def to_dot(graph: nx.DiGraph, *, name: str = "teardown") -> str:
    lines = [f"digraph {name} {{", "  rankdir=LR;"]
    for n in sorted(graph.nodes, key=str):
        lines.append(f'  "{_dot_id(n)}";')
    for u, v, data in sorted(graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
        label = data.get("why", "")
        lines.append(f'  "{_dot_id(u)}" -> "{_dot_id(v)}"' + (f' [label="{_dot_id(label)}"]' if label else "") + ";")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(graph: nx.DiGraph) -> str:
    ids = {n: f"n{i}" for i, n in enumerate(sorted(graph.nodes, key=str))}
    lines = ["flowchart LR"]
    for n, i in ids.items():
        lines.append(f'  {i}["{str(n).replace(chr(34), "#quot;")}"]')  # mermaid's entity for '"'
    for u, v in sorted(graph.edges, key=lambda e: (str(e[0]), str(e[1]))):
        lines.append(f"  {ids[u]} --> {ids[v]}")
    return "\n".join(lines) + "\n"
