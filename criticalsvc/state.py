"""The cluster state the gate decides on: a read-only protocol, and an indexed in-memory store.

`ClusterState` is the only thing the criteria and the decision ask, so the same decision code runs
on the live service's watch caches, on the simulator's store, on a snapshot file and on a test dict.
Each question is answerable from an index in O(matching objects), never O(cluster):

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
from collections.abc import Collection, Iterable, Iterator
from typing import Protocol

from .api import CriticalService, GroupResource, ObjectRef
from .labels import LabelSelector
from .objects import KubeObject
from .restmapper import RESTMapper


class ClusterState(Protocol):
    def resolve(self, gr: GroupResource) -> GroupResource | None: ...

    def get(self, ref: ObjectRef) -> KubeObject | None: ...

    def with_finalizer(self, gr: GroupResource, finalizer: str) -> Collection[KubeObject]: ...

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None
    ) -> Collection[KubeObject]: ...

    def critical_services(self) -> Collection[CriticalService]: ...

    def protecting(self, provider: ObjectRef) -> Collection[CriticalService]: ...

    def hosted_in(self, namespace: str) -> Collection[CriticalService]: ...


_Key = tuple[str, str]  # (namespace, name)


class MemoryState:
    """An indexed, mutable ClusterState. The simulator's store, snapshots and the caches build on it.

    Writes (`upsert`, `remove`, `upsert_critical_service`, ...) keep every index current, so reads
    stay O(matching). Resolution of CriticalService provider names (which may be Kinds) happens at
    read time: a CRD created after the CriticalService is honoured at once.
    """

    def __init__(self, mapper: RESTMapper | None = None) -> None:
        self.mapper = mapper or RESTMapper()
        self._objects: dict[GroupResource, dict[_Key, KubeObject]] = defaultdict(dict)
        self._by_namespace: dict[tuple[GroupResource, str], dict[str, KubeObject]] = defaultdict(dict)
        self._finalized: dict[tuple[GroupResource, str], dict[_Key, KubeObject]] = defaultdict(dict)
        self._services: dict[str, CriticalService] = {}
        # Providers are indexed by (group, namespace, name): the resource may be written as a Kind and
        # is compared after resolution, so the index must not depend on its spelling.
        self._by_provider: dict[tuple[str, str, str], dict[str, CriticalService]] = defaultdict(dict)
        self._by_provider_ns: dict[str, dict[str, CriticalService]] = defaultdict(dict)

    # --- writes ---------------------------------------------------------------------------------
    def upsert(self, obj: KubeObject) -> None:
        key = (obj.namespace, obj.name)
        old = self._objects[obj.group_resource].get(key)
        if old is not None:
            self._unindex(old)
        self._objects[obj.group_resource][key] = obj
        self._by_namespace[(obj.group_resource, obj.namespace)][obj.name] = obj
        for f in obj.finalizers:
            self._finalized[(obj.group_resource, f)][key] = obj

    def remove(self, ref: ObjectRef) -> KubeObject | None:
        old = self._objects.get(ref.group_resource, {}).pop((ref.namespace, ref.name), None)
        if old is not None:
            self._unindex(old)
        return old

    def _unindex(self, obj: KubeObject) -> None:
        key = (obj.namespace, obj.name)
        ns_index = self._by_namespace.get((obj.group_resource, obj.namespace))
        if ns_index is not None:
            ns_index.pop(obj.name, None)
            if not ns_index:
                del self._by_namespace[(obj.group_resource, obj.namespace)]
        for f in obj.finalizers:
            index = self._finalized.get((obj.group_resource, f))
            if index is not None:
                index.pop(key, None)
                if not index:
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
        for obj in list(self._objects.get(gr, {}).values()):
            self.remove(obj.ref)

    # --- ClusterState -----------------------------------------------------------------------------
    def resolve(self, gr: GroupResource) -> GroupResource | None:
        return self.mapper.resolve(gr)

    def get(self, ref: ObjectRef) -> KubeObject | None:
        gr = self.resolve(ref.group_resource) or ref.group_resource
        return self._objects.get(gr, {}).get((ref.namespace, ref.name))

    def with_finalizer(self, gr: GroupResource, finalizer: str) -> Collection[KubeObject]:
        return list(self._finalized.get((gr, finalizer), {}).values())

    def select(
        self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None
    ) -> Collection[KubeObject]:
        if namespace is None:
            candidates: Iterable[KubeObject] = self._objects.get(gr, {}).values()
        else:
            candidates = self._by_namespace.get((gr, namespace), {}).values()
        if selector is None or selector.is_empty:
            return list(candidates)
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
            yield from self._objects.get(gr, {}).values()
            return
        for per_gr in self._objects.values():
            yield from per_gr.values()

    def count(self) -> int:
        return sum(len(v) for v in self._objects.values())


__all__ = ["ClusterState", "MemoryState"]
