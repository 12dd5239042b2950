"""Order inside a namespace (issue 11): when a namespace may go although CriticalServices there are unmet.

The idea is KEP-5080's (https://github.com/kubernetes/enhancements/issues/5080): a namespace being deleted
is emptied in an order, so that what guards its content outlives the content. A CriticalService is
*confined* to its provider's namespace when every criterion's objects live there: a `Resources`
criterion whose `namespace` is the provider's, or a `SpecificResource` whose target is in it. A
`Finalizer` criterion spans all namespaces, so it never is. (A criterion with that namespace on a
cluster-scoped type matches nothing - cluster-scoped objects have no namespace - so it holds forever
and cannot hold anything up: it counts as confined.)

Deleting the namespace of a confined CriticalService cannot take its provider down out of order: the
namespace controller deletes everything in it and retries what is refused, the provider's own DELETE is
refused until its criteria hold, and every object its criteria count is in that namespace, so the same
controller deletes it - nothing outside has to act. The namespace is therefore allowed to go
(criticalsvc/decision.py), unless the namespace controller's own order would wedge it. It deletes one
resource type at a time with a deletecollection that visits the items in name order and stops at the
first refusal (one worker: design/kubernetes-semantics.md §2), and since Kubernetes 1.33 it deletes pods
first and touches nothing else while a pod remains (§3.4). So a ConfigMap `a` that waits for ConfigMap
`b` keeps `b` from ever being tried: `b` sorts after the refused `a`. `find_wedge` looks for such a cycle
among the objects there now: edges "x cannot be gone before y is gone", from three sources -

    criteria      provider p waits for every object its confined, enforced criteria count (a condition
                  is ignored: its outcome may change, so every candidate is assumed to count)
    name order    an object of p's type that sorts after p is tried only once p is allowed
    pods first    no object but a pod is tried while a pod remains

A cycle means the namespace controller could never finish; the decision then keeps refusing the
namespace DELETE, the only moment the gate is asked (design/criticalservice.md §3, rule 2), and names the
cycle. Without a cycle every object goes: by induction over the acyclic graph, each object's
prerequisites go first, and the controller retries forever (namespace_controller.go's rate limiter,
design/kubernetes-semantics.md §3.3). Pure: reads the state, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import networkx as nx

from .api import (
    Criterion,
    CriticalService,
    Enforcement,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from .criteria import named_resource
from .objects import KubeObject
from .state import ClusterState, provider_objects

PODS = GroupResource("", "pods")


def confined_criterion(criterion: Criterion, namespace: str) -> bool:
    """Do all of `criterion`'s objects live in `namespace`?"""
    if isinstance(criterion, FinalizerCriterion):
        return False  # the finalizer is looked for in every namespace
    if isinstance(criterion, SpecificResourceCriterion):
        return criterion.target.namespace == namespace
    return criterion.namespace == namespace


def confined(cs: CriticalService) -> bool:
    """Is `cs` confined to its provider's namespace (see the module docstring)?"""
    ns = cs.provider.namespace
    return bool(ns) and all(confined_criterion(c, ns) for c in cs.criteria if ns)


@attrs.frozen
class Wedge:
    """A cycle of "cannot be gone before" among a namespace's objects, each step a sentence."""

    steps: tuple[str, ...]
    services: tuple[str, ...]  # the CriticalServices whose criteria are on the cycle

    def describe(self) -> str:
        return "; ".join(self.steps)


# Virtual nodes: "provider p is allowed" and "no pod remains".
@attrs.frozen
class _Allowed:
    provider: ObjectRef


_NO_PODS = "no pod remains"


def _waited_for(criterion: Criterion, state: ClusterState) -> Sequence[KubeObject]:
    """Every object `criterion` looks at now, whatever its condition says (it may change)."""
    gr = state.resolve(named_resource(criterion))
    if gr is None:
        return ()  # no object of an unserved type exists
    if isinstance(criterion, SpecificResourceCriterion):
        obj = state.get(ObjectRef(gr, criterion.target.namespace, criterion.target.name))
        return () if obj is None else (obj,)
    assert isinstance(criterion, ResourcesCriterion)
    return list(state.select(gr, namespace=criterion.namespace, selector=criterion.selector))


def _protected(cs: CriticalService, namespace: str, state: ClusterState) -> Sequence[KubeObject]:
    if isinstance(cs.provider, ObjectRef):
        gr = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
        provider = state.get(attrs.evolve(cs.provider, group_resource=gr))
        return () if provider is None else (provider,)
    return list(provider_objects(cs.provider, state, namespace=namespace))


def find_wedge(namespace: str, services: Iterable[CriticalService], state: ClusterState) -> Wedge | None:
    """A cycle that would keep the namespace controller from ever emptying `namespace`, given the
    confined, enforced CriticalServices among `services` whose providers exist there; None if there is none."""
    graph = nx.DiGraph()
    waited: dict[ObjectRef, KubeObject] = {}
    providers: dict[ObjectRef, KubeObject] = {}
    for cs in services:
        if not confined(cs) or cs.enforcement != Enforcement.ENFORCE or cs.provider.namespace != namespace:
            continue  # a Warn CriticalService never refuses its provider's DELETE
        # Every object the CriticalService protects here: its provider, or what its selector selects.
        for provider in _protected(cs, namespace, state):
            providers[provider.ref] = provider
            allowed = _Allowed(provider.ref)
            graph.add_edge(provider.ref, allowed, why="")  # goes only once its DELETE is allowed
            for i, c in enumerate(cs.criteria):
                for obj in _waited_for(c, state):
                    waited[obj.ref] = obj
                    if graph.has_edge(allowed, obj.ref):  # another CriticalService waits for it too: both are on it
                        graph.edges[allowed, obj.ref]["services"].add(cs.name)
                        continue
                    graph.add_edge(allowed, obj.ref, services={cs.name}, why=(
                        f"{provider.ref} may go only once {obj.ref} is gone ({cs.name}.spec.criteria[{i}])"))
    for ref in waited:
        for p in providers:
            if p.group_resource == ref.group_resource and p.name < ref.name:
                graph.add_edge(ref, _Allowed(p), why=(
                    f"the namespace controller tries {ref} only after {p} is allowed (its deletecollection of "
                    f"{p.group_resource} goes in name order and stops at the first refusal)"))
    pods = [r for r in [*waited, *providers] if r.group_resource == PODS]
    for ref in waited if pods else ():
        if ref.group_resource != PODS:
            graph.add_edge(ref, _NO_PODS, why=f"{ref} is tried only once no pod remains (pods go first)")
    for pod in pods:
        graph.add_edge(_NO_PODS, pod, why="")  # the next step names the pod
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        return None
    steps = tuple(why for u, v in cycle if (why := graph.edges[u, v]["why"]))
    # Every CriticalService with a wait on some cycle is wedged, not only those on the one cycle described:
    # an edge lies on a cycle exactly when both its ends are in one strongly connected component.
    component = {node: i for i, nodes in enumerate(nx.strongly_connected_components(graph)) for node in nodes}
    return Wedge(steps, tuple(sorted({name for u, v, names in graph.edges(data="services", default=())
                                      if component[u] == component[v] for name in names})))
