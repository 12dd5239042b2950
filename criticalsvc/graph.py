"""Dependency graphs: "X must be gone before Y may be deleted".

Two granularities, both networkx DiGraphs whose edges point from what must go first to what waits:

* `service_graph` — one node per CriticalService. B -> A when a criterion of A covers something in
  B's *teardown set*: B's provider, the CriticalService B itself, or the namespace of B's provider
  (that namespace cannot go while B's criteria are unmet). A cycle (a self-loop included: a
  criterion covering one's own provider, own namespace or oneself) is a teardown that can never
  finish; `check_no_cycle` rejects the spec that would close one.

* `teardown_graph` — one node per object of a bundle. Content goes before its namespace, instances
  before their CRD, objects a criterion covers before the provider and (unless the CriticalService is
  confined to it, criticalsvc/nsorder.py) the provider's namespace, and
  the provider (and its namespace) before the CriticalService. `phases` are the topological
  generations: the order in which things are gone when everything is deleted at once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import attrs
import networkx as nx

from . import criteria, nsorder
from .api import CRDS, CRITICAL_SERVICES, NAMESPACES, CriticalService, GroupResource, ObjectRef
from .errors import DependencyCycle
from .objects import KubeObject
from .state import ClusterState


def _teardown_set(cs: CriticalService, state: ClusterState) -> list[tuple[KubeObject, str]]:
    """What goes away as part of tearing `cs` down, each with the word used in messages."""
    gr = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
    ref = attrs.evolve(cs.provider, group_resource=gr)
    provider = state.get(ref) or KubeObject(gr, ref.namespace, ref.name)
    out = [(provider, f"its provider {ref}")]
    out.append((KubeObject(CRITICAL_SERVICES, "", cs.name, labels=cs.labels), f"CriticalService {cs.name}"))
    if ref.namespace:
        ns_ref = ObjectRef(NAMESPACES, "", ref.namespace)
        ns = state.get(ns_ref) or KubeObject(NAMESPACES, "", ref.namespace,
                                             labels={"kubernetes.io/metadata.name": ref.namespace})
        out.append((ns, f"its provider's namespace {ref.namespace}"))
    return out


def service_graph(services: Iterable[CriticalService], state: ClusterState) -> nx.DiGraph:
    """CriticalService-level graph; edge B -> A carries `why` (which criterion covers what)."""
    services = list(services)
    graph = nx.DiGraph()
    by_gr: dict[GroupResource, list[tuple[KubeObject, str, str]]] = defaultdict(list)
    for b in services:
        graph.add_node(b.name)
        for obj, word in _teardown_set(b, state):
            by_gr[obj.group_resource].append((obj, word, b.name))
    for a in services:
        for i, criterion in enumerate(a.criteria):
            gr = state.resolve(criteria.named_resource(criterion))
            if gr is None:
                continue
            for obj, word, b_name in by_gr.get(gr, ()):
                if criteria.covers(criterion, obj, state) and not graph.has_edge(b_name, a.name):
                    graph.add_edge(b_name, a.name, why=f"{a.name}.spec.criteria[{i}] waits for {word} of {b_name}")
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


def check_no_cycle(candidate: CriticalService, state: ClusterState) -> None:
    """Raise DependencyCycle if adding (or replacing with) `candidate` closes a cycle through it."""
    services = [cs for cs in state.critical_services() if cs.name != candidate.name]
    graph = service_graph([*services, candidate], state)
    cycle = find_service_cycle(graph, candidate.name)
    if cycle is None:
        return
    # Present the cycle in waiting order: a waits for b waits for ... a.
    waiting = list(reversed(cycle))
    i = waiting.index(candidate.name)
    raise DependencyCycle(waiting[i:] + waiting[:i])


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
        provider_gr = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
        provider = attrs.evolve(cs.provider, group_resource=provider_gr)
        waits = [provider]
        if provider.namespace and not nsorder.confined(cs):
            # A confined CriticalService does not hold its namespace back (criticalsvc/nsorder.py): the
            # namespace waits for its content as any namespace does, and its provider for the criteria.
            waits.append(ObjectRef(NAMESPACES, "", provider.namespace))
        waits = [w for w in waits if w in present]
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
