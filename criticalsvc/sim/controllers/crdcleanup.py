"""The CRD cleanup: deletes a Terminating CRD's instances WITHOUT admission, then lets the CRD go."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...api import CRDS, GroupResource, ObjectRef
from ...restmapper import resource_type_from_crd
from ...timestamps import format_rfc3339
from ..engine import Engine
from ..store import CRD_CLEANUP_FINALIZER, StatusError, Store, WatchEvent
from ..timeline import DELETED, GONE, MARKED, REMOVED, STATUS, Timeline
from .base import waits_for
from .workqueue import WorkQueue

APISERVER_USER = "system:apiserver"  # the CRD finalizer runs inside kube-apiserver (apiextensions)


class CRDCleanupController:
    """apiextensions-apiserver's CRD finalizer [C1]: the cleanup of a Terminating CRD.

    Sets Terminating=True/InstanceDeletionInProgress, deletes all instances per namespace straight in
    storage — no admission, the gate never sees these DELETEs [C1] — then polls every 5 s for up to
    a minute until none is left (instances held by their own finalizers keep it waiting). Success:
    Terminating=False/InstanceDeletionCompleted and the cleanup finalizer is dropped, so the CRD goes.
    Timeout: InstanceDeletionCheck, and a retry after 5 ms·2ⁿ ≤ 1000 s [Q1]. Updates that only touch
    the Terminating condition do not requeue (the controller would hot-loop on its own writes) [C1].
    """

    actor = "crd-cleanup"
    POLL, POLL_TIMEOUT = 5.0, 60.0  # wait.PollUntilContextTimeout(5 s, 1 min) in crd_finalizer.go (v1.37.2) [C1]
    BASE, CAP = 0.005, 1000.0  # DefaultControllerRateLimiter [Q1]

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline) -> None:
        self.store, self.engine, self.timeline = store, engine, timeline
        self.queue: WorkQueue[str] = WorkQueue(engine, self.sync, base=self.BASE, cap=self.CAP)
        self._busy: set[str] = set()
        self._seen: dict[str, tuple[Any, ...]] = {}
        store.subscribe(self._on_event)
        for crd in store.list(CRDS):
            self._consider(crd)

    def _on_event(self, event: WatchEvent) -> None:
        if event.group_resource != CRDS:
            return
        if event.type == "DELETED":
            self._seen.pop(event.object["metadata"]["name"], None)
            return
        self._consider(event.object)

    def _consider(self, crd: Mapping[str, Any]) -> None:
        md = crd["metadata"]
        # Everything but status: a change of the Terminating condition alone does not requeue [C1].
        signature = (md.get("deletionTimestamp"), tuple(md.get("finalizers") or ()), repr(crd.get("spec")))
        if self._seen.get(md["name"]) == signature:
            return
        self._seen[md["name"]] = signature
        if md.get("deletionTimestamp") and CRD_CLEANUP_FINALIZER in (md.get("finalizers") or []):
            self.queue.add(md["name"])

    def _set_terminating(self, name: str, status: str, reason: str, message: str) -> None:
        crd = self.store.get(CRDS, "", name)
        if crd is None:
            return
        st = dict(crd.get("status") or {})
        conditions = [c for c in st.get("conditions") or [] if c.get("type") != "Terminating"]
        prev = next((c for c in st.get("conditions") or [] if c.get("type") == "Terminating"), None)
        if prev is not None and (prev.get("status"), prev.get("reason"), prev.get("message")) == \
                (status, reason, message):
            return
        conditions.append({"type": "Terminating", "status": status, "reason": reason, "message": message,
                           "lastTransitionTime": format_rfc3339(self.engine.now())})
        st["conditions"] = conditions
        self.store.set_status(ObjectRef(CRDS, "", name), st)
        self.timeline.record(self.actor, STATUS, ObjectRef(CRDS, "", name), STATUS,
                             f"Terminating={status} {reason}: {message}")

    def instances(self, crd: Mapping[str, Any]) -> list[ObjectRef]:
        t = resource_type_from_crd(crd)
        return [] if t is None else list(self.store.refs(t.group_resource))

    def sync(self, name: str) -> None:
        if name in self._busy:
            return  # the worker is still polling for this CRD
        crd = self.store.get(CRDS, "", name)
        md = crd["metadata"] if crd is not None else {}
        if crd is None or not md.get("deletionTimestamp") or CRD_CLEANUP_FINALIZER not in (md.get("finalizers") or []):
            self.queue.forget(name)
            return
        self._set_terminating(name, "True", "InstanceDeletionInProgress", "CustomResource deletion is in progress")
        established = any(c.get("type") == "Established" and c.get("status") == "True"
                          for c in (crd.get("status") or {}).get("conditions") or [])
        t = resource_type_from_crd(crd)
        if not established or t is None:
            self._finish(name, "NeverEstablished", "resource was never established")
            return
        errors: list[str] = []
        namespaces: dict[str, None] = {}
        for ref in self.store.refs(t.group_resource):
            namespaces.setdefault(ref.namespace, None)
        for ns in namespaces:
            refs = list(self.store.refs(t.group_resource, ns))
            before = {r: self.store.state.get(r) for r in refs}
            if all(o is not None and o.terminating for o in before.values()):
                continue  # a second pass over terminating instances changes nothing (no admission here)
            try:
                # Straight to storage with an allow-all validator: no admission webhook sees these [C1].
                self.store.delete_collection(t.group_resource, ns, user=APISERVER_USER, admission=False)
            except StatusError as exc:
                errors.append(exc.message)
            for r in refs:
                old, now = before[r], self.store.state.get(r)
                if now is None and old is not None:
                    self.timeline.record(self.actor, "DELETE (no admission)", r, DELETED)
                elif now is not None and now.terminating and old is not None and not old.terminating:
                    self.timeline.record(self.actor, "DELETE (no admission)", r, MARKED,
                                         "waits for " + ", ".join(now.finalizers))
        if errors:
            self._set_terminating(name, "True", "InstanceDeletionFailed",
                                  f"could not issue all deletes: {', '.join(errors)}")
            self.queue.add_rate_limited(name)
            return
        self._busy.add(name)
        self._poll(name, t.group_resource, self.engine.now() + self.POLL_TIMEOUT)

    def _poll(self, name: str, gr: GroupResource, deadline: float) -> None:
        if next(iter(self.store.state.objects(gr)), None) is None:
            self._busy.discard(name)
            self._finish(name, "InstanceDeletionCompleted", "removed all instances")
            return
        if self.engine.now() >= deadline:
            self._busy.discard(name)
            self._set_terminating(name, "True", "InstanceDeletionCheck",
                                  "could not confirm zero CustomResources remaining: context deadline exceeded")
            self.queue.add_rate_limited(name)
            return
        self.engine.schedule(self.POLL, lambda: self._poll(name, gr, deadline))

    def _finish(self, name: str, reason: str, message: str) -> None:
        self._set_terminating(name, "False", reason, message)
        ref = ObjectRef(CRDS, "", name)
        result = self.store.remove_finalizer(ref, CRD_CLEANUP_FINALIZER, user=APISERVER_USER)
        gone = not self.store.exists(CRDS, "", name)
        self.timeline.record(self.actor, f"remove finalizer {CRD_CLEANUP_FINALIZER}", ref,
                             GONE if gone else REMOVED, "" if gone or result is None else waits_for(result))
        self.queue.forget(name)
