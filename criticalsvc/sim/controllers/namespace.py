"""The namespace controller: empties a Terminating namespace, per resource type, through admission."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ...api import NAMESPACES, GroupResource, ObjectRef
from ...objects import KubeObject
from ...timestamps import format_rfc3339
from ..engine import Engine
from ..store import NAMESPACE_FINALIZER, StatusError, Store, WatchEvent
from ..timeline import DELETED, GONE, MARKED, REMOVED, STATUS, Timeline
from .base import describe_error, waits_for
from .workqueue import WorkQueue

PODS = GroupResource("", "pods")
NAMESPACE_CONTROLLER_USER = "system:serviceaccount:kube-system:namespace-controller"


def is_noop(store: Store, gr: GroupResource, namespace: str, objects: Iterable[KubeObject | None]) -> bool:
    """A deletecollection over items that are all terminating, which no webhook sees, changes nothing:
    each DELETE returns the object as it is [S1]. Skipping it keeps a stuck 10,000-object teardown cheap."""
    objects = list(objects)
    if not all(o is not None and o.terminating for o in objects):
        return False
    # A webhook that would see one of these calls (a repeated DELETE runs admission again, §4) makes the
    # pass observable; objectSelectors are matched on each item's labels, as for its DELETE (oldObject).
    return not any(w.matches("DELETE", gr, namespace, None, {"metadata": {"labels": dict(o.labels)}})
                   for o in objects if o is not None for w in store.webhooks)



# [N3] condition types, in the order the controller writes them, and their "all is well" variants.
_OK_CONDITIONS: dict[str, tuple[str, str]] = {
    "NamespaceDeletionDiscoveryFailure": ("ResourcesDiscovered", "All resources successfully discovered"),
    "NamespaceDeletionGroupVersionParsingFailure": ("ParsedGroupVersions",
                                                    "All legacy kube types successfully parsed"),
    "NamespaceDeletionContentFailure": ("ContentDeleted",
                                        "All content successfully deleted, may be waiting on finalization"),
    "NamespaceContentRemaining": ("ContentRemoved", "All content successfully removed"),
    "NamespaceFinalizersRemaining": ("ContentHasNoFinalizers", "All content-preserving finalizers finished"),
}


@attrs.define
class _Totals:
    """deleteAllContent's bookkeeping: instances and finalizers left per resource, and the errors."""

    estimate: int = 0
    remaining: dict[GroupResource, int] = attrs.field(factory=dict)
    finalizers: dict[str, int] = attrs.field(factory=dict)
    errors: list[str] = attrs.field(factory=list)
    # False when a pass ended early because pods remain: kube-controller-manager then writes the
    # conditions without the remaining content (ProcessContentTotals is skipped), so ContentRemaining
    # and FinalizersRemaining read "all removed" while pods terminate (v1.37.2,
    # https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/namespace/deletion/namespaced_resources_deleter.go#L551-L560).
    counted: bool = True


class NamespaceController:
    """kube-controller-manager's namespace controller [N2][N3][N4], with KEP-5080 ordering [E1][E2].

    For a namespace with a deletionTimestamp, 5 s after it sees the deletion [N4]: for every namespaced
    resource type (in Go map order, i.e. shuffled), a deletecollection through the API — admission runs
    once per item with name "" [N2][R1], one worker stops at the first denial [S1][S2]. With ordered
    deletion (default, Kubernetes ≥ 1.33) pods go first and nothing else is touched while pods remain
    [E2]. Errors are aggregated into NamespaceDeletionContentFailure and retried with 5 ms·2ⁿ ≤ 60 s;
    content held by finalizers is rechecked after 15/2+1 = 8 s [N2][N4]; when nothing is left the
    namespace is finalized (spec.finalizers emptied) and disappears [N1].
    """

    actor = "namespace-controller"
    GRACE = 5.0  # namespaceDeletionGracePeriod [N4]
    FINALIZER_ESTIMATE = 15  # finalizerEstimateSeconds [N2]: requeue after 15/2+1 = 8 s
    BASE, CAP = 0.005, 60.0  # nsControllerRateLimiter [N4]

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline, rng: random.Random,
                 ordered: bool = True) -> None:
        self.store, self.engine, self.timeline, self.rng = store, engine, timeline, rng
        self.ordered = ordered
        self.queue: WorkQueue[str] = WorkQueue(engine, self.sync, base=self.BASE, cap=self.CAP)
        self._types: tuple[frozenset[GroupResource], list[GroupResource]] = (frozenset(), [])
        store.subscribe(self._on_event)
        for ref in store.refs(NAMESPACES):
            self._enqueue(store.state.get(ref))

    def _on_event(self, event: WatchEvent) -> None:
        if event.group_resource == NAMESPACES and event.type != "DELETED" \
                and event.object["metadata"].get("deletionTimestamp"):
            # Every add/update of a deleted namespace is delayed by the grace period [N4].
            self.queue.add_after(event.object["metadata"]["name"], self.GRACE)

    def _enqueue(self, ns: KubeObject | None) -> None:
        if ns is not None and ns.terminating:
            self.queue.add_after(ns.name, self.GRACE)

    def sync(self, name: str) -> None:
        ns = self.store.get(NAMESPACES, "", name)
        if ns is None or not ns["metadata"].get("deletionTimestamp"):
            self.queue.forget(name)
            return
        if NAMESPACE_FINALIZER not in ((ns.get("spec") or {}).get("finalizers") or []):
            self.queue.forget(name)  # already finalized; other finalizers are someone else's
            return
        totals = self._delete_all_content(name)
        self._update_conditions(ns, totals)
        if totals.errors:
            self.queue.add_rate_limited(name)
            return
        if totals.estimate > 0:
            self.queue.add_after(name, totals.estimate // 2 + 1)  # ResourcesRemainingError [N4]
            return
        result = self.store.finalize_namespace(name)
        gone = not self.store.exists(NAMESPACES, "", name)
        self.timeline.record(self.actor, "finalize", ObjectRef(NAMESPACES, "", name), GONE if gone else REMOVED,
                             "" if gone or result is None else waits_for(result))
        self.queue.forget(name)

    def _resource_types(self) -> list[GroupResource]:
        found = frozenset(t.group_resource for t in self.store.mapper.types() if t.namespaced)
        if found != self._types[0]:
            self._types = (found, sorted(found, key=lambda gr: (gr.group, gr.resource)))
        grs = list(self._types[1])
        self.rng.shuffle(grs)  # discovery returns a Go map: no order to rely on [E1]
        return grs

    def _delete_all_content(self, namespace: str) -> _Totals:
        totals = _Totals()
        grs = self._resource_types()
        if self.ordered and PODS in grs:
            # KEP-5080: pods first; while any pod remains, nothing else is deleted [E1][E2].
            self._delete_resource(PODS, namespace, totals)
            if totals.remaining.get(PODS):
                totals.counted = False
                return totals
            # A refused or failed pods deletecollection counts no remaining pods, so the pass goes on to
            # the other types (the same lines: the error is kept, numRemaining stays 0).
            grs.remove(PODS)
        for gr in grs:
            self._delete_resource(gr, namespace, totals)  # an error is kept; the others still go [N2]
        return totals

    def _delete_resource(self, gr: GroupResource, namespace: str, totals: _Totals) -> None:
        objs = self.store.state.select(gr, namespace=namespace, selector=None)
        if not objs:
            return
        if is_noop(self.store, gr, namespace, objs):
            remaining = objs  # nothing to delete, nothing can change: count what is held [N2]
        else:
            before = {o.ref: o for o in objs}
            error: StatusError | None = None
            try:
                self.store.delete_collection(gr, namespace, user=NAMESPACE_CONTROLLER_USER)
            except StatusError as exc:
                error = exc
            denied_recorded = False
            for r in sorted(before, key=lambda ref: ref.name):  # the order the one worker went in [S2]
                old, now = before[r], self.store.state.get(r)
                if now is None:
                    self.timeline.record(self.actor, "deletecollection", r, DELETED)
                elif now.terminating and not old.terminating:
                    self.timeline.record(self.actor, "deletecollection", r, MARKED,
                                         "waits for " + ", ".join(now.finalizers))
                elif error is not None and not now.terminating and not denied_recorded:
                    # One worker stops at the first error: the first untouched item is the one refused [S2].
                    self.timeline.record(self.actor, "deletecollection", r, describe_error(error), error.message)
                    denied_recorded = True
            if error is not None:
                totals.errors.append(error.message)
                return  # [N2]: an erroring resource type reports no remaining counts
            remaining = self.store.state.select(gr, namespace=namespace, selector=None)
        if not remaining:
            return
        totals.remaining[gr] = len(remaining)
        with_finalizers = 0
        for obj in remaining:
            for f in obj.finalizers:
                totals.finalizers[f] = totals.finalizers.get(f, 0) + 1
            with_finalizers += bool(obj.finalizers)
        if with_finalizers:
            totals.estimate = max(totals.estimate, self.FINALIZER_ESTIMATE)
        else:
            totals.errors.append(f"unexpected items still remain in namespace: {namespace} for gvr: {gr}")

    def _update_conditions(self, ns: Mapping[str, Any], totals: _Totals) -> None:
        """[N3]: write the five deletion conditions when any of them changed."""
        new: dict[str, tuple[str, str, str]] = {}
        if totals.errors:
            msgs = sorted(totals.errors)
            new["NamespaceDeletionContentFailure"] = (
                "True", "ContentDeletionFailed",
                f"Failed to delete all resource types, {len(msgs)} remaining: {', '.join(msgs)}")
        if totals.remaining and totals.counted:
            parts = sorted(f"{gr.resource}.{gr.group} has {n} resource instances" for gr, n in totals.remaining.items())
            new["NamespaceContentRemaining"] = ("True", "SomeResourcesRemain",
                                                f"Some resources are remaining: {', '.join(parts)}")
        if totals.finalizers and totals.counted:
            parts = sorted(f"{f} in {n} resource instances" for f, n in totals.finalizers.items())
            new["NamespaceFinalizersRemaining"] = (
                "True", "SomeFinalizersRemain",
                f"Some content in the namespace has finalizers remaining: {', '.join(parts)}")
        name = ns["metadata"]["name"]
        if not self.store.exists(NAMESPACES, "", name):
            return
        status = dict(ns.get("status") or {})
        old = {c.get("type"): c for c in status.get("conditions") or []}
        conditions, changed, now = [], False, format_rfc3339(self.engine.now())
        ref = ObjectRef(NAMESPACES, "", name)
        for ctype, (ok_reason, ok_message) in _OK_CONDITIONS.items():
            cstatus, reason, message = new.get(ctype, ("False", ok_reason, ok_message))
            prev = old.get(ctype)
            if prev is not None and (prev.get("status"), prev.get("reason"), prev.get("message")) == \
                    (cstatus, reason, message):
                conditions.append(prev)
                continue
            changed = True
            transition = now if prev is None or prev.get("status") != cstatus else prev.get("lastTransitionTime", now)
            conditions.append({"type": ctype, "status": cstatus, "lastTransitionTime": transition,
                               "reason": reason, "message": message})
            if cstatus == "True":
                self.timeline.record(self.actor, STATUS, ref, STATUS, f"{ctype}={cstatus} {reason}: {message}")
        for ctype, c in old.items():
            if ctype not in _OK_CONDITIONS:
                conditions.append(c)
        if changed:
            status["conditions"] = conditions
            self.store.set_status(ref, status)
