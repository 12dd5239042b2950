"""The cluster state the gate decides on: a read-only protocol, and an indexed in-memory store.

`ClusterState` is the only thing the criteria and the decision ask, so the same decision code runs
on the live service's watch caches, on the simulator's store, on a snapshot file and on a test dict.
Each question is answerable from an index, never by a scan of the cluster:

    resolve(gr)                   the canonical plural group/resource, None when not served
    get(ref)                      one object or None
    with_finalizer(gr, f)         objects of gr whose metadata.finalizers contain f
    select(gr, namespace, sel)    objects of gr (in namespace) whose labels match sel
    critical_services()           every parsed CriticalService
    protecting(ref)               CriticalServices whose provider is ref
    hosted_in(namespace)          CriticalServices whose provider lives in namespace

A state that cannot answer (cache not synced, live read failed) raises StateUnavailable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterator
from typing import Protocol

from sortedcontainers import SortedDict, SortedList

from .api import CriticalService, GroupResource, ObjectRef
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

    def with_finalizer(self, gr: GroupResource, finalizer: str) -> Collection[KubeObject]: ...

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None
    ) -> Collection[KubeObject]: ...

    def critical_services(self) -> Collection[CriticalService]: ...

    def protecting(self, provider: ObjectRef) -> Collection[CriticalService]: ...

    def hosted_in(self, namespace: str) -> Collection[CriticalService]: ...


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


class _Bucket(Matches):
    """The objects of one namespace (a name -> object SortedDict)."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket: SortedDict) -> None:
        super().__init__(len(bucket))
        self._bucket = bucket

    def __iter__(self) -> Iterator[KubeObject]:
        bucket = self._bucket
        for name in bucket:
            yield bucket[name]


class _AllNamespaces(Matches):
    """Every object of a group/resource, namespace by namespace."""

    __slots__ = ("_namespaces",)

    def __init__(self, namespaces: SortedDict, size: int) -> None:
        super().__init__(size)
        self._namespaces = namespaces

    def __iter__(self) -> Iterator[KubeObject]:
        namespaces = self._namespaces
        for namespace in namespaces:
            bucket = namespaces[namespace]
            for name in bucket:
                yield bucket[name]


class _Carrying(Matches):
    """The objects named by a finalizer index, read from their group/resource's store."""

    __slots__ = ("_names", "_store")

    def __init__(self, names: SortedDict, store: SortedDict, size: int) -> None:
        super().__init__(size)
        self._names, self._store = names, store

    def __iter__(self) -> Iterator[KubeObject]:
        names, store = self._names, self._store
        for namespace in names:
            bucket = store[namespace]
            for name in names[namespace]:
                yield bucket[name]


class _ByNamespace:
    """Objects of one group/resource: namespace -> (name -> object), both levels sorted, count kept.

    Nested by namespace rather than keyed by (namespace, name) tuples: a tuple key would cost ~56
    bytes per cached object, the nested sorted dicts cost a pointer (and a namespace costs its bucket).
    """

    __slots__ = ("count", "namespaces")

    def __init__(self) -> None:
        self.namespaces: SortedDict = SortedDict()  # str -> SortedDict[str, KubeObject]
        self.count = 0

    def get(self, namespace: str, name: str) -> KubeObject | None:
        bucket = self.namespaces.get(namespace)
        return bucket.get(name) if bucket is not None else None

    def put(self, obj: KubeObject) -> KubeObject | None:
        bucket = self.namespaces.get(obj.namespace)
        if bucket is None:
            bucket = self.namespaces[obj.namespace] = SortedDict()
        old: KubeObject | None = bucket.get(obj.name)
        bucket[obj.name] = obj
        self.count += old is None
        return old

    def pop(self, namespace: str, name: str) -> KubeObject | None:
        bucket = self.namespaces.get(namespace)
        if bucket is None:
            return None
        old: KubeObject | None = bucket.pop(name, None)
        if old is not None:
            self.count -= 1
            if not bucket:
                del self.namespaces[namespace]
        return old

    def all(self) -> Matches:
        return _AllNamespaces(self.namespaces, self.count)

    def in_namespace(self, namespace: str) -> Matches:
        bucket = self.namespaces.get(namespace)
        return _Bucket(bucket) if bucket is not None else _NONE


class _Finalized:
    """Which objects of one group/resource carry one finalizer: namespace -> sorted names, count kept.

    Names only (a pointer each): the objects themselves are read from the group/resource's store.
    """

    __slots__ = ("count", "namespaces")

    def __init__(self) -> None:
        self.namespaces: SortedDict = SortedDict()  # str -> SortedList[str]
        self.count = 0

    def add(self, namespace: str, name: str) -> None:
        names = self.namespaces.get(namespace)
        if names is None:
            names = self.namespaces[namespace] = SortedList()
        names.add(name)
        self.count += 1

    def discard(self, namespace: str, name: str) -> None:
        names = self.namespaces.get(namespace)
        if names is not None and name in names:
            names.remove(name)
            self.count -= 1
            if not names:
                del self.namespaces[namespace]

    def view(self, store: _ByNamespace) -> Matches:
        return _Carrying(self.namespaces, store.namespaces, self.count)


class MemoryState:
    """An indexed, mutable ClusterState. The simulator's store, snapshots and the caches build on it.

    Writes (`upsert`, `remove`, `upsert_critical_service`, ...) keep every index current, so reads
    are O(1) to count and O(log n) to reach the first match, whatever the cluster's size; only a
    label selector costs O(objects in its namespace). Resolution of CriticalService provider names
    (which may be Kinds) happens at read time: a CRD created after the CriticalService is honoured at once.
    """

    def __init__(self, mapper: RESTMapper | None = None) -> None:
        self.mapper = mapper or RESTMapper()
        self._objects: dict[GroupResource, _ByNamespace] = {}
        self._finalized: dict[tuple[GroupResource, str], _Finalized] = {}
        self._services: dict[str, CriticalService] = {}
        # Providers are indexed by (group, namespace, name): the resource may be written as a Kind and
        # is compared after resolution, so the index must not depend on its spelling.
        self._by_provider: dict[tuple[str, str, str], dict[str, CriticalService]] = defaultdict(dict)
        self._by_provider_ns: dict[str, dict[str, CriticalService]] = defaultdict(dict)

    # --- writes ---------------------------------------------------------------------------------
    def upsert(self, obj: KubeObject) -> None:
        gr = obj.group_resource
        store = self._objects.get(gr)
        if store is None:
            store = self._objects[gr] = _ByNamespace()
        old = store.put(obj)
        if old is not None and old.finalizers == obj.finalizers:
            return  # the common update (status, labels): the finalizer indexes already hold the name
        if old is not None:
            self._unindex_finalizers(old)
        for f in obj.finalizers:
            index = self._finalized.get((gr, f))
            if index is None:
                index = self._finalized[(gr, f)] = _Finalized()
            index.add(obj.namespace, obj.name)

    def remove(self, ref: ObjectRef) -> KubeObject | None:
        store = self._objects.get(ref.group_resource)
        if store is None:
            return None
        old = store.pop(ref.namespace, ref.name)
        if old is not None:
            self._unindex_finalizers(old)
            if not store.count:
                del self._objects[ref.group_resource]
        return old

    def _unindex_finalizers(self, obj: KubeObject) -> None:
        for f in obj.finalizers:
            index = self._finalized.get((obj.group_resource, f))
            if index is not None:
                index.discard(obj.namespace, obj.name)
                if not index.count:
                    del self._finalized[(obj.group_resource, f)]

    def upsert_critical_service(self, cs: CriticalService) -> None:
        self.remove_critical_service(cs.name)
        self._services[cs.name] = cs
        p = cs.provider
        self._by_provider[(p.group_resource.group, p.namespace, p.name)][cs.name] = cs
        self._by_provider_ns[p.namespace][cs.name] = cs

    def remove_critical_service(self, name: str) -> CriticalService | None:
        old = self._services.pop(name, None)
        if old is not None:
            p = old.provider
            self._by_provider[(p.group_resource.group, p.namespace, p.name)].pop(name, None)
            self._by_provider_ns[p.namespace].pop(name, None)
        return old

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

    def with_finalizer(self, gr: GroupResource, finalizer: str) -> Collection[KubeObject]:
        index = self._finalized.get((gr, finalizer))
        return index.view(self._objects[gr]) if index is not None else _NONE

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None
    ) -> Collection[KubeObject]:
        store = self._objects.get(gr)
        if store is None:
            return _NONE
        candidates = store.all() if namespace is None else store.in_namespace(namespace)
        if selector is None or selector.is_empty:
            return candidates
        return [o for o in candidates if selector.matches(o.labels)]

    def critical_services(self) -> Collection[CriticalService]:
        return list(self._services.values())

    def protecting(self, provider: ObjectRef) -> Collection[CriticalService]:
        key = (provider.group_resource.group, provider.namespace, provider.name)
        candidates = self._by_provider.get(key, {})
        target = self.resolve(provider.group_resource) or provider.group_resource
        return [
            cs
            for cs in candidates.values()
            if (self.resolve(cs.provider.group_resource) or cs.provider.group_resource) == target
        ]

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        return list(self._by_provider_ns.get(namespace, {}).values())

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
