"""The controllers that delete things: Kubernetes' built-in ones and the operators' finalizers.

    NamespaceController    empties a Terminating namespace, per resource type, through admission
    CRDCleanupController   deletes a Terminating CRD's instances WITHOUT admission, then lets it go
    GarbageCollector       ownerReferences: deletes orphaned dependents through admission;
                           Foreground / Orphan propagation finalizers
    FinalizerController    one operator: removes its finalizer from objects being deleted, but only
                           while its provider workload runs (a controller that is gone leaves the
                           finalizer forever: the stuck teardown the gate exists to prevent)

Every controller watches the store (`store.subscribe`), acts through the store's API calls, and
waits only through `engine.schedule` / `engine.now`; nothing sleeps. The same objects therefore run
in virtual time (tests, `criticalsvc simulate`) and in real time behind the HTTP stand-in.

Timings are Kubernetes' own (design/kubernetes-semantics.md §3, §5, §6): the namespace controller
starts 5 s after it sees a deletion [N4], requeues ~8 s while finalizers hold content and backs off
5 ms·2ⁿ up to 60 s on errors [N4]; the CRD cleanup polls every 5 s for a minute and backs off 5 ms·2ⁿ up to 1000 s [C1][Q1];
so does the garbage collector [G1][Q1]. client-go's work queue is modelled by `WorkQueue`: one
pending run per key (the earliest wins) and a per-key failure count; the 10 qps token bucket that
client-go adds on top is left out (teardowns here stay far below 10 syncs per second).

Randomness (the Go map order of resource types, an operator's reconcile delay) comes from one
seeded `random.Random`, so a seed replays a run exactly.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

import attrs

from ...api import (
    CRDS,
    CRITICAL_SERVICES,
    NAMESPACES,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    parse_critical_service,
)
from ...backoff import Backoff
from ...errors import InvalidInput
from ...objects import KubeObject
from ...restmapper import resource_type_from_crd
from ...timestamps import format_rfc3339
from ..engine import Engine
from ..store import CRD_CLEANUP_FINALIZER, NAMESPACE_FINALIZER, DeleteResult, StatusError, Store, WatchEvent
from ..timeline import DELETED, DENIED, FAILED, GONE, MARKED, NOT_RUNNING, REMOVED, STATUS, Timeline

K = TypeVar("K", bound=Hashable)

PODS = GroupResource("", "pods")
FOREGROUND = "foregroundDeletion"
ORPHAN = "orphan"

NAMESPACE_CONTROLLER_USER = "system:serviceaccount:kube-system:namespace-controller"
GARBAGE_COLLECTOR_USER = "system:serviceaccount:kube-system:generic-garbage-collector"
APISERVER_USER = "system:apiserver"  # the CRD finalizer runs inside kube-apiserver (apiextensions)


class WorkQueue(Generic[K]):
    """client-go's rate-limited delaying queue, as much of it as a single-threaded model needs.

    `add_after` keeps one pending run per key, the earliest; `add_rate_limited` waits base·2ⁿ (n =
    failures so far) and counts a failure; `forget` resets the count, as a successful sync does.
    """

    def __init__(self, engine: Engine, process: Callable[[K], None], *, base: float, cap: float) -> None:
        self._engine = engine
        self._process = process
        self.backoff = Backoff(initial=base, maximum=cap)  # client-go's ItemExponentialFailureRateLimiter [Q1]
        self._due: dict[K, float] = {}
        self._failures: dict[K, int] = {}

    def add(self, key: K) -> None:
        self.add_after(key, 0.0)

    def add_after(self, key: K, delay: float) -> None:
        delay = max(0.0, delay)
        due = self._engine.now() + delay
        current = self._due.get(key)
        if current is not None and current <= due:
            return
        self._due[key] = due
        self._engine.schedule(delay, lambda: self._fire(key, due))

    def add_rate_limited(self, key: K) -> float:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def pending(self, key: K) -> bool:
        return key in self._due

    def _fire(self, key: K, due: float) -> None:
        if self._due.get(key) != due:
            return  # superseded by an earlier run
        del self._due[key]
        self._process(key)


def _ref_of(event: WatchEvent) -> ObjectRef:
    md = event.object["metadata"]
    return ObjectRef(event.group_resource, md.get("namespace", "") or "", md["name"])


def _waits_for(obj: Mapping[str, Any]) -> str:
    finalizers = list(obj["metadata"].get("finalizers") or [])
    finalizers += [f"spec.finalizers: {f}" for f in (obj.get("spec") or {}).get("finalizers") or []
                   if obj.get("kind") == "Namespace"]
    return "waits for " + ", ".join(finalizers) if finalizers else ""


def _outcome(result: DeleteResult) -> tuple[str, str]:
    if result.outcome == "deleted":
        return DELETED, ""
    if result.outcome == "marked":
        return MARKED, _waits_for(result.object)
    return "unchanged", "already terminating"


def describe_error(exc: StatusError) -> str:
    """DENIED for an admission denial, FAILED for anything else (a webhook that cannot be called, ...)."""
    return DENIED if exc.message.startswith("admission webhook") else FAILED


def _is_noop(store: Store, gr: GroupResource, namespace: str, objects: Iterable[KubeObject | None]) -> bool:
    """A deletecollection over items that are all terminating, which no webhook sees, changes nothing:
    each DELETE returns the object as it is [S1]. Skipping it keeps a stuck 10,000-object teardown cheap."""
    objects = list(objects)
    if not all(o is not None and o.terminating for o in objects):
        return False
    # A webhook that would see one of these calls (a repeated DELETE runs admission again, §4) makes the
    # pass observable; objectSelectors are matched on each item's labels, as for its DELETE (oldObject).
    return not any(w.matches("DELETE", gr, namespace, None, {"metadata": {"labels": dict(o.labels)}})
                   for o in objects if o is not None for w in store.webhooks)


# --- namespace controller -------------------------------------------------------------------------
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
                             "" if gone or result is None else _waits_for(result))
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
            if totals.remaining.get(PODS) or totals.errors:
                return totals
            grs.remove(PODS)
        for gr in grs:
            self._delete_resource(gr, namespace, totals)  # an error is kept; the others still go [N2]
        return totals

    def _delete_resource(self, gr: GroupResource, namespace: str, totals: _Totals) -> None:
        objs = self.store.state.select(gr, namespace=namespace, selector=None)
        if not objs:
            return
        if _is_noop(self.store, gr, namespace, objs):
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
        if totals.remaining:
            parts = sorted(f"{gr.resource}.{gr.group} has {n} resource instances" for gr, n in totals.remaining.items())
            new["NamespaceContentRemaining"] = ("True", "SomeResourcesRemain",
                                                f"Some resources are remaining: {', '.join(parts)}")
        if totals.finalizers:
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


# --- CRD cleanup ----------------------------------------------------------------------------------
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
                             GONE if gone else REMOVED, "" if gone or result is None else _waits_for(result))
        self.queue.forget(name)


# --- garbage collector ----------------------------------------------------------------------------
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
        self._observe(event.type, _ref_of(event), event.object)

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
        outcome, reason = _outcome(result)
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
                             "" if gone or result is None else _waits_for(result))
        self.owner_queue.forget(ref)


# --- the operators: one finalizer controller per Finalizer criterion --------------------------------
class FinalizerController:
    """The operator behind a CriticalService's Finalizer criterion: its provider runs it.

    When an object of the criterion's resource that carries the finalizer is being deleted, the
    operator cleans up and removes the finalizer after a reconcile delay (seeded, 0.5-2 s) — but only
    if, at that moment, its provider exists, is not terminating, and the provider's namespace is not
    terminating (Kubernetes ≥ 1.33 deletes a Terminating namespace's pods first [E1], so its workload
    is as good as gone). A controller that is not running never comes back here: the finalizer stays.
    """

    DELAY = (0.5, 2.0)

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline, rng: random.Random,
                 provider: ObjectRef, criterion: FinalizerCriterion, service: str = "",
                 delay: tuple[float, float] = DELAY) -> None:
        self.store, self.engine, self.timeline, self.rng = store, engine, timeline, rng
        self.provider, self.criterion, self.service = provider, criterion, service
        self.delay = delay
        self.actor = provider.key
        self.user = f"system:serviceaccount:{provider.namespace or 'default'}:{provider.name}"
        self._pending: dict[ObjectRef, None] = {}
        self._reported: dict[ObjectRef, None] = {}
        gr = store.state.resolve(criterion.group_resource)
        if gr is not None:
            for obj in list(store.state.with_finalizer(gr, criterion.finalizer_name)):
                self.observe(obj.ref, obj.finalizers, obj.terminating)

    @property
    def finalizer(self) -> str:
        return self.criterion.finalizer_name

    def running(self) -> tuple[bool, str]:
        """Is the operator's workload up? (False, why) when it is not."""
        provider = self.store.state.get(self.provider)
        if provider is None:
            return False, f"{self.provider}, which runs its controller, is gone"
        if provider.terminating:
            return False, f"{self.provider}, which runs its controller, is being deleted"
        if self.provider.namespace:
            ns = self.store.state.get(ObjectRef(NAMESPACES, "", self.provider.namespace))
            if ns is not None and ns.terminating:
                return False, (f"the namespace {self.provider.namespace} of {self.provider}, which runs its "
                               "controller, is terminating")
        return True, "running"

    def handles(self, gr: GroupResource) -> bool:
        return self.store.state.resolve(self.criterion.group_resource) == gr

    def observe(self, ref: ObjectRef, finalizers: Iterable[str], terminating: bool) -> None:
        if not terminating or self.finalizer not in finalizers or ref in self._pending:
            return
        self._pending[ref] = None
        self.engine.schedule(self.rng.uniform(*self.delay), lambda: self._reconcile(ref))

    def _reconcile(self, ref: ObjectRef) -> None:
        self._pending.pop(ref, None)
        obj = self.store.state.get(ref)
        if obj is None or self.finalizer not in obj.finalizers:
            return
        up, why = self.running()
        if not up:
            if ref not in self._reported:
                self._reported[ref] = None
                self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, NOT_RUNNING,
                                     f"the finalizer stays: {why}")
            return
        try:
            result = self.store.remove_finalizer(ref, self.finalizer, user=self.user)
        except StatusError as exc:
            self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, describe_error(exc),
                                 exc.message)
            self._pending[ref] = None
            self.engine.schedule(self.delay[1], lambda: self._reconcile(ref))
            return
        gone = not self.store.exists(ref.group_resource, ref.namespace, ref.name)
        self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, GONE if gone else REMOVED,
                             "" if gone or result is None else _waits_for(result))


class FinalizerControllers:
    """Starts a FinalizerController for each distinct (provider, resource, finalizer) that any
    CriticalService names in a Finalizer criterion, as CriticalServices appear. Deleting the
    CriticalService does not stop the operator: its provider workload is what runs it."""

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline, rng: random.Random,
                 delay: tuple[float, float] = FinalizerController.DELAY) -> None:
        self.store, self.engine, self.timeline, self.rng, self.delay = store, engine, timeline, rng, delay
        self.controllers: dict[tuple[ObjectRef, GroupResource, str], FinalizerController] = {}
        self._by_finalizer: dict[str, list[FinalizerController]] = {}
        store.subscribe(self._on_event)
        for cs in list(store.state.critical_services()):
            self.start(cs)

    def start(self, cs: CriticalService) -> list[FinalizerController]:
        started = []
        for c in cs.criteria:
            if not isinstance(c, FinalizerCriterion):
                continue
            key = (cs.provider, c.group_resource, c.finalizer_name)
            if key in self.controllers:
                continue
            ctrl = FinalizerController(store=self.store, engine=self.engine, timeline=self.timeline, rng=self.rng,
                                       provider=cs.provider, criterion=c, service=cs.name, delay=self.delay)
            self.controllers[key] = ctrl
            self._by_finalizer.setdefault(c.finalizer_name, []).append(ctrl)
            started.append(ctrl)
        return started

    def for_finalizer(self, gr: GroupResource, finalizer: str) -> list[FinalizerController]:
        return [c for c in self._by_finalizer.get(finalizer, ()) if c.handles(gr)]

    def _on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            return
        if event.group_resource == CRITICAL_SERVICES:
            with contextlib.suppress(InvalidInput):  # an invalid CriticalService names no operator
                self.start(parse_critical_service(event.object))
            return
        md = event.object["metadata"]
        if not md.get("deletionTimestamp"):
            return
        finalizers = md.get("finalizers") or []
        for f in finalizers:
            for ctrl in self.for_finalizer(event.group_resource, f):
                ctrl.observe(_ref_of(event), finalizers, True)


# --- all of them ------------------------------------------------------------------------------------
@attrs.define
class Controllers:
    namespace: NamespaceController
    crd_cleanup: CRDCleanupController
    garbage_collector: GarbageCollector
    finalizers: FinalizerControllers
    timeline: Timeline  # every call the controllers made


def start_controllers(store: Store, engine: Engine, *, timeline: Timeline | None = None,
                      rng: random.Random | None = None, ordered_namespace_deletion: bool = True,
                      finalizer_delay: tuple[float, float] = FinalizerController.DELAY) -> Controllers:
    """Start every controller on `store`; they act as events arrive and as `engine` runs timers."""
    if timeline is None:
        timeline = Timeline(engine.now, seq=lambda: store.resource_version)
    if rng is None:
        rng = random.Random(0)
    return Controllers(
        namespace=NamespaceController(store=store, engine=engine, timeline=timeline, rng=rng,
                                      ordered=ordered_namespace_deletion),
        crd_cleanup=CRDCleanupController(store=store, engine=engine, timeline=timeline),
        garbage_collector=GarbageCollector(store=store, engine=engine, timeline=timeline),
        finalizers=FinalizerControllers(store=store, engine=engine, timeline=timeline, rng=rng,
                                        delay=finalizer_delay),
        timeline=timeline,
    )


__all__ = [
    "CRDCleanupController", "Controllers", "FinalizerController", "FinalizerControllers", "GarbageCollector",
    "NamespaceController", "OwnerReference", "WorkQueue", "owner_references", "start_controllers",
]
