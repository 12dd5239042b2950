"""The garbage collector: ownerReferences, Background / Foreground / Orphan propagation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ...api import ObjectRef
from ..engine import Engine
from ..store import StatusError, Store, WatchEvent
from ..timeline import GONE, REMOVED, Timeline
from .base import delete_outcome, describe_error, ref_of, waits_for
from .workqueue import WorkQueue

FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"
GARBAGE_COLLECTOR_USER = "system:serviceaccount:kube-system:generic-garbage-collector"


@attrs.frozen
class OwnerReference:
    api_version: str
    kind: str
    name: str
    uid: str
    block_owner_deletion: bool = False


def owner_references(obj: Mapping[str, Any]) -> tuple[OwnerReference, ...]:
    out = []
    for o in obj.get("metadata", {}).get("ownerReferences") or []:
        if isinstance(o, Mapping) and o.get("uid") and o.get("name") and o.get("kind"):
            out.append(OwnerReference(str(o.get("apiVersion", "")), str(o["kind"]), str(o["name"]), str(o["uid"]),
                                      bool(o.get("blockOwnerDeletion"))))
    return tuple(out)


class GarbageCollector:
    """kube-controller-manager's garbage collector, for what a teardown exercises [G1][G2].

    Background: once every owner of an object is absent (gone, or replaced under another uid), the
    object is DELETEd through the API — admission sees it — with a UID precondition; a denial is
    retried with 5 ms·2ⁿ ≤ 1000 s [G1][Q1]. An owner that still exists keeps its dependents (absent
    owners' references are dropped instead). Foreground: an owner carrying `foregroundDeletion` gets
    its dependents deleted, and loses the finalizer once no dependent with blockOwnerDeletion remains.
    Orphan: dependents lose their ownerReference to the owner, then the owner its `orphan` finalizer.
    """

    actor = "garbage-collector"
    BASE, CAP = 0.005, 1000.0  # DefaultControllerRateLimiter [G1][Q1]
    REACTION = 0.01  # watch -> graph builder -> work queue, roughly

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline) -> None:
        self.store, self.engine, self.timeline = store, engine, timeline
        self._owners: dict[ObjectRef, tuple[OwnerReference, ...]] = {}
        self._dependents: dict[str, dict[ObjectRef, None]] = {}  # owner uid -> dependents (ordered)
        self.delete_queue: WorkQueue[ObjectRef] = WorkQueue(engine, self._attempt_to_delete,
                                                            base=self.BASE, cap=self.CAP)
        self.owner_queue: WorkQueue[ObjectRef] = WorkQueue(engine, self._process_deleting_owner,
                                                           base=self.BASE, cap=self.CAP)
        self.denied: dict[ObjectRef, str] = {}
        store.subscribe(self._on_event)
        for ref in list(store.refs()):
            obj = store.get(ref.group_resource, ref.namespace, ref.name)
            if obj is not None:
                self._observe("ADDED", ref, obj)

    # --- the dependency graph ---------------------------------------------------------------------
    def _owner_ref(self, o: OwnerReference, namespace: str) -> ObjectRef:
        gr = self.store.mapper.resource_for_kind(o.api_version, o.kind)
        t = self.store.mapper.lookup(gr)
        return ObjectRef(gr, namespace if t is None or t.namespaced else "", o.name)

    def dependents(self, uid: str) -> list[ObjectRef]:
        return [d for d in self._dependents.get(uid, {}) if self.store.state.get(d) is not None]

    def _on_event(self, event: WatchEvent) -> None:
        self._observe(event.type, ref_of(event), event.object)

    def _observe(self, kind: str, ref: ObjectRef, obj: Mapping[str, Any]) -> None:
        md = obj["metadata"]
        old_owners = self._owners.get(ref, ())
        if kind == "DELETED":
            self._owners.pop(ref, None)
            for o in old_owners:
                self._dependents.get(o.uid, {}).pop(ref, None)
                owner = self._owner_ref(o, ref.namespace)
                if self.store.state.get(owner) is not None:
                    self.owner_queue.add_after(owner, self.REACTION)  # a foreground owner may be done now
            for dep in list(self._dependents.get(str(md.get("uid", "")), {})):
                self.delete_queue.add_after(dep, self.REACTION)
            return
        owners = owner_references(obj)
        if owners != old_owners:
            for o in old_owners:
                self._dependents.get(o.uid, {}).pop(ref, None)
            for o in owners:
                self._dependents.setdefault(o.uid, {})[ref] = None
            if owners:
                self._owners[ref] = owners
            else:
                self._owners.pop(ref, None)
            if owners and kind == "ADDED":
                self.delete_queue.add_after(ref, self.REACTION)  # a dangling owner means: delete it
        finalizers = md.get("finalizers") or []
        if md.get("deletionTimestamp") and (FOREGROUND in finalizers or ORPHAN in finalizers):
            self.owner_queue.add_after(ref, self.REACTION)

    # --- attemptToDelete ----------------------------------------------------------------------------
    def _attempt_to_delete(self, ref: ObjectRef) -> None:
        current = self.store.state.get(ref)
        owners = self._owners.get(ref, ())
        if current is None or not owners or current.terminating:
            self.delete_queue.forget(ref)
            return
        solid, absent, waiting = [], [], False
        for o in owners:
            owner = self.store.state.get(self._owner_ref(o, ref.namespace))
            if owner is None or owner.uid != o.uid:
                absent.append(o)
            elif owner.terminating and FOREGROUND in owner.finalizers:
                waiting = True
            else:
                solid.append(o)
        if solid:
            if absent:
                self._drop_owner_references(ref, {o.uid for o in absent}, "owner is gone")
            self.delete_queue.forget(ref)
            return
        policy = "Foreground" if waiting else "Background"
        try:
            result = self.store.delete(ref, user=GARBAGE_COLLECTOR_USER, propagation=policy, uid=current.uid)
        except StatusError as exc:
            if exc.code in (404, 409):  # gone, or replaced under another uid: nothing left to do
                self.delete_queue.forget(ref)
                return
            self.denied[ref] = exc.message
            self.timeline.record(self.actor, "DELETE", ref, describe_error(exc), exc.message)
            self.delete_queue.add_rate_limited(ref)
            return
        self.denied.pop(ref, None)
        outcome, reason = delete_outcome(result)
        self.timeline.record(self.actor, "DELETE", ref, outcome, reason or f"owner gone ({policy})")
        self.delete_queue.forget(ref)

    def _drop_owner_references(self, ref: ObjectRef, uids: set[str], why: str) -> None:
        obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
        if obj is None:
            return
        obj["metadata"]["ownerReferences"] = [o for o in obj["metadata"].get("ownerReferences") or []
                                              if o.get("uid") not in uids]
        obj["metadata"].pop("resourceVersion", None)
        try:
            self.store.update(obj, user=GARBAGE_COLLECTOR_USER)
        except StatusError as exc:
            self.timeline.record(self.actor, "remove ownerReferences", ref, describe_error(exc), exc.message)
            return
        self.timeline.record(self.actor, "remove ownerReferences", ref, "updated", why)

    # --- owners being deleted with Foreground / Orphan ------------------------------------------------
    def _process_deleting_owner(self, ref: ObjectRef) -> None:
        owner = self.store.state.get(ref)
        if owner is None or not owner.terminating:
            return
        if ORPHAN in owner.finalizers:
            for dep in self.dependents(owner.uid):
                self._drop_owner_references(dep, {owner.uid}, "orphaned")
            self._remove_finalizer(ref, ORPHAN)
        elif FOREGROUND in owner.finalizers:
            blocking = [d for d in self.dependents(owner.uid)
                        if any(o.uid == owner.uid and o.block_owner_deletion for o in self._owners.get(d, ()))]
            for dep in self.dependents(owner.uid):
                self.delete_queue.add_after(dep, self.REACTION)
            if not blocking:
                self._remove_finalizer(ref, FOREGROUND)

    def _remove_finalizer(self, ref: ObjectRef, finalizer: str) -> None:
        try:
            result = self.store.remove_finalizer(ref, finalizer, user=GARBAGE_COLLECTOR_USER)
        except StatusError as exc:
            self.timeline.record(self.actor, f"remove finalizer {finalizer}", ref, describe_error(exc), exc.message)
            self.owner_queue.add_rate_limited(ref)
            return
        gone = not self.store.exists(ref.group_resource, ref.namespace, ref.name)
        self.timeline.record(self.actor, f"remove finalizer {finalizer}", ref, GONE if gone else REMOVED,
                             "" if gone or result is None else waits_for(result))
        self.owner_queue.forget(ref)
