"""The cluster state the gate decides on: a read-only protocol, and an indexed in-memory store.

`ClusterState` is the only thing the criteria and the decision ask, so the same decision code runs
on the live service's watch caches, on the simulator's store, on a snapshot file and on a test dict.
Each question is answerable from an index, never by a scan of the cluster:

    resolve(gr)                   the canonical plural group/resource, None when not served
    get(ref)                      one object or None
    with_finalizer(gr, f)         objects of gr whose metadata.finalizers contain f
    select(gr, namespace, sel)    objects of gr (in namespace) whose labels match sel
        (both take `condition=`: only the objects whose stored outcome of it is not False, i.e. those
        a criterion with that condition counts; criticalsvc/condition.py)
    critical_services()           every parsed CriticalService
    protecting(ref, labels)       CriticalServices whose provider is ref, or whose provider selector
                                  (spec.provider.selector) matches ref's namespace and `labels`
    hosted_in(namespace)          CriticalServices whose provider lives in namespace, or whose provider
                                  selector may select objects there (it names that namespace, or none)

A state that cannot answer (cache not synced, live read failed) raises StateUnavailable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Iterator, Mapping
from typing import Protocol, TypeVar

from sortedcontainers import SortedList

from .api import CRITICAL_SERVICES, CriticalService, GroupResource, ObjectRef, ProviderSelector
from .condition import Condition
from .labels import LabelSelector
from .objects import KubeObject
from .restmapper import RESTMapper


class ClusterState(Protocol):
    """What the criteria and the decision ask of a cluster.

    `with_finalizer` and `select` answer with collections that iterate in (namespace, name) order,
    the order a Kubernetes LIST returns (etcd key order), so "the first 3 blocking objects" of a
    message is a prefix, not a sort; `len()` of the answer is the exact count.
    """

    def resolve(self, gr: GroupResource) -> GroupResource | None: ...

    def get(self, ref: ObjectRef) -> KubeObject | None: ...

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]: ...

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
        condition: Condition | None = None,
    ) -> Collection[KubeObject]: ...

    def critical_services(self) -> Collection[CriticalService]: ...

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        """`labels`: the object's, matched against provider selectors (the decision passes the request's
        oldObject's); None: the state's own copy's, if it holds the object."""
        ...

    def hosted_in(self, namespace: str) -> Collection[CriticalService]: ...


def provider_objects(provider: ProviderSelector, state: ClusterState, *,
                     namespace: str | None = None) -> Collection[KubeObject]:
    """The existing objects a provider selector selects (only those in `namespace`, when given), in
    (namespace, name) order; none while its type is not served."""
    if namespace is not None and provider.namespace is not None and namespace != provider.namespace:
        return ()
    gr = state.resolve(provider.group_resource)
    if gr is None:
        return ()
    return state.select(gr, namespace=namespace if namespace is not None else provider.namespace,
                        selector=provider.selector)


class Matches(Collection[KubeObject]):
    """A read-only view of indexed objects, in (namespace, name) order, with an O(1) length.

    A view, not a copy: taking one costs nothing whatever the number of matches (10,000 CRs with one
    finalizer used to cost a protected DELETE ~1 ms to copy). It is valid until the next write to the
    state; code that writes while iterating takes `list()` of it first.
    """

    __slots__ = ("_size",)

    def __init__(self, size: int) -> None:
        self._size = size

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[KubeObject]:
        return iter(())

    def __contains__(self, obj: object) -> bool:
        return any(o == obj for o in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


_NONE = Matches(0)


_Key = tuple[str, str]  # (namespace, name)


class _Keyed(Matches):
    """Objects named by a slice of a sorted key list, read from their group/resource's store."""

    __slots__ = ("_keys", "_objects")

    def __init__(self, keys: SortedList, objects: dict[_Key, KubeObject], size: int) -> None:
        super().__init__(size)
        self._keys, self._objects = keys, objects

    def __iter__(self) -> Iterator[KubeObject]:
        objects = self._objects
        for key in self._keys:
            yield objects[key]


class _Range(Matches):
    """Objects whose keys are positions lo..hi of a sorted key list (one namespace's, say)."""

    __slots__ = ("_hi", "_lo", "_objects", "_order")

    def __init__(self, order: SortedList, lo: int, hi: int, objects: dict[_Key, KubeObject]) -> None:
        super().__init__(hi - lo)
        self._order, self._lo, self._hi, self._objects = order, lo, hi, objects

    def __iter__(self) -> Iterator[KubeObject]:
        objects = self._objects
        for key in self._order.islice(self._lo, self._hi):  # a fresh iterator each time: views are re-read
            yield objects[key]


class _Store:
    """Objects of one group/resource: (namespace, name) -> object, plus the keys in sorted order.

    Flat, keyed by tuples, rather than nested by namespace: a cluster spreads most resources thinly
    over many namespaces (10 CRs of an operator in 10 tenant namespaces), and a sorted container per
    namespace cost ~1.9 KB each, 1.1 KB per cached object in total at 10,000 operators. One sorted
    key list per resource costs a pointer per object; a namespace is a range of it, found by bisection.
    """

    __slots__ = ("objects", "order")

    def __init__(self) -> None:
        self.objects: dict[_Key, KubeObject] = {}
        self.order = SortedList()  # of the keys of `objects` (the same tuple objects)

    @property
    def count(self) -> int:
        return len(self.objects)

    def get(self, namespace: str, name: str) -> KubeObject | None:
        return self.objects.get((namespace, name))

    def put(self, key: _Key, obj: KubeObject) -> KubeObject | None:
        old = self.objects.get(key)
        if old is None:
            self.order.add(key)
            self.objects[key] = obj
        else:
            self.objects[key] = obj  # the dict keeps its key object, which `order` holds too
        return old

    def pop(self, namespace: str, name: str) -> KubeObject | None:
        key = (namespace, name)
        old = self.objects.pop(key, None)
        if old is not None:
            self.order.remove(key)
        return old

    def all(self) -> Matches:
        return _Keyed(self.order, self.objects, len(self.objects))

    def in_namespace(self, namespace: str) -> Matches:
        # (ns,) sorts before every (ns, name), and (ns + "\0",) after them and before any later namespace.
        lo = self.order.bisect_left((namespace,))
        hi = self.order.bisect_left((namespace + "\0",))
        if lo == hi:
            return _NONE
        return _Range(self.order, lo, hi, self.objects)


class _Finalized:
    """Which objects of one group/resource carry one finalizer: their keys, sorted (a pointer each)."""

    __slots__ = ("keys",)

    def __init__(self) -> None:
        self.keys = SortedList()

    def view(self, store: _Store) -> Matches:
        return _Keyed(self.keys, store.objects, len(self.keys))


class _ByOutcome:
    """Keys of the objects of one group/resource (or of those of them carrying one finalizer) by one
    condition's outcome, each sorted: `counting` (True, or an error: fail closed) and `excluded` (False).

    So a conditioned criterion is counted and its first objects reached by bisection, as an
    unconditioned one is (walking 10,000 matching objects to filter them cost a protected DELETE 3.4 ms
    at p99: benchmarks/scale.py, conditions sweep).
    """

    __slots__ = ("counting", "excluded")

    def __init__(self) -> None:
        self.counting = SortedList()
        self.excluded = SortedList()

    def side(self, outcome: object) -> SortedList:
        return self.excluded if outcome is False else self.counting


def _bounds(keys: SortedList, namespace: str | None) -> tuple[int, int]:
    if namespace is None:
        return 0, len(keys)
    return keys.bisect_left((namespace,)), keys.bisect_left((namespace + "\0",))


_K = TypeVar("_K")


def _discard(index: dict[_K, dict[str, CriticalService]], key: _K, name: str) -> None:
    # Emptied buckets go too: a cluster that keeps creating and tearing down stacks (each with its own
    # namespace and CriticalService) would otherwise keep an empty dict per stack forever.
    bucket = index.get(key)
    if bucket is not None:
        bucket.pop(name, None)
        if not bucket:
            del index[key]


class MemoryState:
    """An indexed, mutable ClusterState. The simulator's store, snapshots and the caches build on it.

    Writes (`upsert`, `remove`, `upsert_critical_service`, ...) keep every index current, so reads
    are O(1) to count and O(log n) to reach the first match, whatever the cluster's size; only a
    label selector costs O(objects in its namespace). Resolution of CriticalService provider names
    (which may be Kinds) happens at read time: a CRD created after the CriticalService is honoured at once.
    """

    def __init__(self, mapper: RESTMapper | None = None) -> None:
        self.mapper = mapper or RESTMapper()
        self._objects: dict[GroupResource, _Store] = {}
        self._writes: dict[tuple[GroupResource, str | None], int] = {}
        self._finalized: dict[tuple[GroupResource, str], _Finalized] = {}
        # (gr, condition expression, finalizer or "" for every object of gr) -> keys by outcome.
        self._by_outcome: dict[tuple[GroupResource, str, str], _ByOutcome] = {}
        self._services: dict[str, CriticalService] = {}
        # Providers are indexed by (group, namespace, name): the resource may be written as a Kind and
        # is compared after resolution, so the index must not depend on its spelling.
        self._by_provider: dict[tuple[str, str, str], dict[str, CriticalService]] = defaultdict(dict)
        self._by_provider_ns: dict[str, dict[str, CriticalService]] = defaultdict(dict)
        # Provider selectors by (group, namespace) - None for those that name no namespace - (the resource
        # may be a Kind, as above): a DELETE matches the labels of the selectors of its own group and
        # namespace, and of its group's namespace-less ones, never every CriticalService (benchmarks/scale.py,
        # selectors sweep: keyed by group alone, 1,000 selectors in one group tripled the p99). Those that
        # name no namespace may select objects in any, so every namespace DELETE looks at them.
        self._by_selector: dict[tuple[str, str | None], dict[str, CriticalService]] = defaultdict(dict)
        self._selector_groups: Counter[str] = Counter()
        self._selectors_anywhere: dict[str, CriticalService] = {}

    # --- writes ---------------------------------------------------------------------------------
    def upsert(self, obj: KubeObject) -> None:
        gr = obj.group_resource
        store = self._objects.get(gr)
        if store is None:
            store = self._objects[gr] = _Store()
        # One key tuple per object, shared by the store, its order and the finalizer indexes.
        key = (obj.namespace, obj.name)
        if store.objects.get(key) == obj:
            # Nothing the gate reads of it changed (a status update: a CriticalService's own, a Deployment's rollout):
            # the stored object stays, and no write is counted, so what was worked out from these objects stands (the
            # router's, the labeller's and the status writer's memos; at 10,000 CriticalServices each counted write
            # of their type made each of them walk all 10,000 again).
            return
        self._count_write(gr, obj.namespace)
        old = store.put(key, obj)
        same_finalizers = old is not None and old.finalizers == obj.finalizers
        if (obj.outcomes or (old is not None and old.outcomes)) and \
                not (same_finalizers and old is not None and old.outcomes == obj.outcomes):
            if old is not None:
                self._unindex_outcomes(old)
            self._index_outcomes(key, obj)
        if same_finalizers:
            return  # the common update (status, labels): the finalizer indexes already hold the key
        if old is not None:
            self._unindex_finalizers(old)
        for f in obj.finalizers:
            index = self._finalized.get((gr, f))
            if index is None:
                index = self._finalized[(gr, f)] = _Finalized()
            index.keys.add(key)

    def _index_outcomes(self, key: _Key, obj: KubeObject) -> None:
        outcomes, gr = obj.outcomes, obj.group_resource
        for i in range(0, len(outcomes), 2):
            for f in ("", *obj.finalizers):
                index = self._by_outcome.get((gr, outcomes[i], f))
                if index is None:
                    index = self._by_outcome[(gr, outcomes[i], f)] = _ByOutcome()
                index.side(outcomes[i + 1]).add(key)

    def _unindex_outcomes(self, obj: KubeObject) -> None:
        outcomes, gr, key = obj.outcomes, obj.group_resource, (obj.namespace, obj.name)
        for i in range(0, len(outcomes), 2):
            for f in ("", *obj.finalizers):
                index = self._by_outcome.get((gr, outcomes[i], f))
                if index is not None:
                    index.side(outcomes[i + 1]).discard(key)
                    if not index.counting and not index.excluded:
                        del self._by_outcome[(gr, outcomes[i], f)]

    def remove(self, ref: ObjectRef) -> KubeObject | None:
        store = self._objects.get(ref.group_resource)
        if store is None:
            return None
        old = store.pop(ref.namespace, ref.name)
        if old is not None:
            self._count_write(ref.group_resource, ref.namespace)
            self._unindex_finalizers(old)
            self._unindex_outcomes(old)
            if not store.count:
                del self._objects[ref.group_resource]
        return old

    def _unindex_finalizers(self, obj: KubeObject) -> None:
        for f in obj.finalizers:
            index = self._finalized.get((obj.group_resource, f))
            if index is not None:
                index.keys.discard((obj.namespace, obj.name))
                if not index.keys:
                    del self._finalized[(obj.group_resource, f)]

    def critical_service(self, name: str) -> CriticalService | None:
        """The CriticalService stored under `name`, if any."""
        return self._services.get(name)

    def upsert_critical_service(self, cs: CriticalService) -> None:
        old = self._services.get(cs.name)
        if old is not None and old == cs and old.labels == cs.labels:
            return  # its status written (conditions): the same CriticalService, kept as the same object (upsert)
        self.remove_critical_service(cs.name)
        self._count_write(CRITICAL_SERVICES, "")
        self._services[cs.name] = cs
        p = cs.provider
        if isinstance(p, ProviderSelector):
            self._by_selector[(p.group_resource.group, p.namespace)][cs.name] = cs
            self._selector_groups[p.group_resource.group] += 1
            if p.namespace is None:
                self._selectors_anywhere[cs.name] = cs
            else:
                self._by_provider_ns[p.namespace][cs.name] = cs
            return
        self._by_provider[(p.group_resource.group, p.namespace, p.name)][cs.name] = cs
        self._by_provider_ns[p.namespace][cs.name] = cs

    def remove_critical_service(self, name: str) -> CriticalService | None:
        old = self._services.pop(name, None)
        if old is None:
            return None
        self._count_write(CRITICAL_SERVICES, "")
        p = old.provider
        if isinstance(p, ProviderSelector):
            _discard(self._by_selector, (p.group_resource.group, p.namespace), name)
            self._selector_groups[p.group_resource.group] -= 1
            if not self._selector_groups[p.group_resource.group]:
                del self._selector_groups[p.group_resource.group]
            self._selectors_anywhere.pop(name, None)
            if p.namespace is not None:
                _discard(self._by_provider_ns, p.namespace, name)
        else:
            _discard(self._by_provider, (p.group_resource.group, p.namespace, p.name), name)
            _discard(self._by_provider_ns, p.namespace, name)
        return old

    def _count_write(self, gr: GroupResource, namespace: str) -> None:
        self._writes[gr, namespace] = self._writes.get((gr, namespace), 0) + 1
        self._writes[gr, None] = self._writes.get((gr, None), 0) + 1

    def writes(self, gr: GroupResource, namespace: str | None) -> int:
        """How many objects of gr (in `namespace`; None: anywhere) were stored or removed so far: equal at two
        moments, the same objects (what a caller that derives something from them may skip recomputing)."""
        return self._writes.get((gr, namespace), 0)

    def clear_resource(self, gr: GroupResource) -> None:
        """Forget every object of gr (a relist replaces them; a deleted CRD takes them away)."""
        store = self._objects.get(gr)
        for obj in list(store.all()) if store is not None else ():
            self.remove(obj.ref)

    # --- ClusterState -----------------------------------------------------------------------------
    def resolve(self, gr: GroupResource) -> GroupResource | None:
        return self.mapper.resolve(gr)

    def get(self, ref: ObjectRef) -> KubeObject | None:
        gr = self.resolve(ref.group_resource) or ref.group_resource
        store = self._objects.get(gr)
        return store.get(ref.namespace, ref.name) if store is not None else None

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]:
        index = self._finalized.get((gr, finalizer))
        if index is None:
            return _NONE
        view = index.view(self._objects[gr])
        return view if condition is None else self._counting(gr, condition, finalizer, view, None)

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
        condition: Condition | None = None,
    ) -> Collection[KubeObject]:
        store = self._objects.get(gr)
        if store is None:
            return _NONE
        candidates = store.all() if namespace is None else store.in_namespace(namespace)
        if selector is None or selector.is_empty:
            return candidates if condition is None else self._counting(gr, condition, "", candidates, namespace)
        return [o for o in candidates if selector.matches(o.labels)
                and (condition is None or o.outcome(condition) is not False)]

    def _counting(self, gr: GroupResource, condition: Condition, finalizer: str, candidates: Matches,
                  namespace: str | None) -> Collection[KubeObject]:
        """The `candidates` (every object of gr, or those carrying `finalizer`; in `namespace` when given)
        that `condition` lets count, from the outcome index: O(log n) to count and to reach the first."""
        index = self._by_outcome.get((gr, condition.expression, finalizer))
        if index is None:
            lo = hi = excluded = 0
        else:
            lo, hi = _bounds(index.counting, namespace)
            elo, ehi = _bounds(index.excluded, namespace)
            excluded = ehi - elo
        if (hi - lo) + excluded != len(candidates):
            # Some candidates were stored before the condition existed and carry no outcome of it: they
            # count (fail closed), so this answer is filtered one by one until the state re-reads them.
            return [o for o in candidates if o.outcome(condition) is not False]
        if index is None or hi == lo:
            return _NONE
        return _Range(index.counting, lo, hi, self._objects[gr].objects)

    def critical_services(self) -> Collection[CriticalService]:
        return list(self._services.values())

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        key = (provider.group_resource.group, provider.namespace, provider.name)
        candidates = list(self._by_provider.get(key, {}).values())
        group = provider.group_resource.group
        if group in self._selector_groups:
            selectors = [*self._by_selector.get((group, None), {}).values(),
                         *(self._by_selector.get((group, provider.namespace), {}).values() if provider.namespace
                           else ())]
            if selectors and labels is None:
                stored = self.get(provider)
                labels = stored.labels if stored is not None else {}
            candidates += [cs for cs in selectors if isinstance(cs.provider, ProviderSelector)
                           and cs.provider.matches(provider.namespace, labels or {})]
        if not candidates:
            return ()
        target = self.resolve(provider.group_resource) or provider.group_resource
        return [cs for cs in candidates
                if (self.resolve(cs.provider.group_resource) or cs.provider.group_resource) == target]

    def selects_in(self, group: str) -> bool:
        """Does some CriticalService select its provider by labels in API group `group`?"""
        return group in self._selector_groups

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        here = list(self._by_provider_ns.get(namespace, {}).values())
        if not self._selectors_anywhere:
            return here
        # A selector over a cluster-scoped type (namespaces, say) selects nothing inside a namespace.
        return [*here, *(cs for cs in self._selectors_anywhere.values()
                         if getattr(self.mapper.lookup(cs.provider.group_resource), "namespaced", True))]

    # --- conveniences -----------------------------------------------------------------------------
    def objects(self, gr: GroupResource | None = None) -> Iterator[KubeObject]:
        if gr is not None:
            store = self._objects.get(gr)
            if store is not None:
                yield from store.all()
            return
        for store in self._objects.values():
            yield from store.all()

    def count(self, gr: GroupResource | None = None) -> int:
        """Objects held (of gr, or in all)."""
        if gr is not None:
            store = self._objects.get(gr)
            return store.count if store is not None else 0
        return sum(store.count for store in self._objects.values())


__all__ = ["ClusterState", "Matches", "MemoryState"]
