"""Replaying refused deletions on a live cluster: the I/O around criticalsvc/replay.py.

    every replica   `record` (the webhook's on_decision hook) turns a refused DELETE into an intent when
                    replay.intent_for says so, and a background task stores it as a ConfigMap in the
                    gate's namespace (replay.to_record); AlreadyExists means it is recorded already.
                    Dry runs are never recorded: the webhooks declare sideEffects: NoneOnDryRun.
    the leader      a round whenever something may change a decision, and at least every INTERVAL: it
                    lists the records, asks replay.plan what to do, and does it: arms (records armedAt),
                    drops (deletes the record, posts an Event on the object saying why), or replays. A
                    round reads nothing unless some CriticalService asks for replay or records exist (one
                    sweep for leftovers when it begins to lead). What wakes it (`_until_woken`): an intent
                    this replica just recorded, and, while intents wait, any event of the watch caches
                    (CacheState.wait_event) - the criteria can only come to hold through one - so a replay
                    is sent in the round the event starts, not up to a poll later. Idle (no intent), cache
                    events do not wake it. INTERVAL stays as the fallback for what no event here announces:
                    a record another replica wrote, the arming window and time to live running out.

A replay first reads the object fresh (gone, another UID, or annotated criticalsvc.io/replay-deletion:
Never: dropped), then sends DELETE with `preconditions.uid` and the recorded propagationPolicy as the
gate's ServiceAccount. The API server runs admission on it like on any DELETE, so the gate decides on
it once more (with its live confirmation); authorization is the gate's own, which the operator grants
through the aggregated ClusterRole criticalsvc-replay (deploy/base/rbac.yaml). Whether that grant is
there is checked with SelfSubjectAccessReviews, so status can say so before anything is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from . import replay
from .admission import AdmissionRequest
from .api import (
    CRITICAL_SERVICES,
    NAMESPACES,
    REPLAY_DELETION_ANNOTATION,
    GroupResource,
    ObjectRef,
    ReplayDeletion,
)
from .cache.transport import APIError, APIStatusError, Sender
from .decision import Decision
from .errors import InvalidInput, StateUnavailable
from .events import object_event
from .logs import get_logger
from .metrics import Metrics
from .restmapper import RESTMapper
from .server import StateSource
from .state import ClusterState

log = get_logger("criticalsvc.replay")

INTERVAL = 1.0  # the fallback round; replay.plan is cheap and the list is one request
# Between two rounds at least this long: a burst of cache events (a LIST of thousands of objects, a namespace
# emptied) while intents wait costs at most 10 rounds (10 LISTs of the records) a second, and a replay
# waits at most this long behind the round before it.
MIN_ROUND_GAP = 0.1
REQUEST_TIMEOUT = 5.0
ACCESS_TTL = 60.0  # how long a SelfSubjectAccessReview's "allowed" is trusted
DENIED_TTL = 5.0  # ... and a "denied": an operator who just added the grant should see it soon
AGGREGATE_LABEL = "criticalsvc.io/aggregate-to-replay"


class LiveReplayer:
    def __init__(self, transport: Sender, source: StateSource, mapper: RESTMapper, *, namespace: str,
                 post_event: Callable[[dict[str, Any]], None] = lambda event: None,
                 on_change: Callable[[], None] = lambda: None, metrics: Metrics | None = None,
                 clock: Callable[[], float] = time.time, arm_window: float = replay.ARM_WINDOW,
                 time_to_live: float = replay.TIME_TO_LIVE, interval: float = INTERVAL,
                 min_round_gap: float = MIN_ROUND_GAP) -> None:
        self.transport, self.source, self.mapper = transport, source, mapper
        self.namespace = namespace
        self.post_event, self.on_change, self.clock = post_event, on_change, clock
        self.metrics = metrics if metrics is not None else Metrics()
        self.arm_window, self.time_to_live = arm_window, time_to_live
        self.interval, self.min_round_gap = interval, min_round_gap
        self.rounds = 0  # rounds run while leading (read by tests and nothing else)
        # Set when this replica recorded an intent: the leader's next round should see it now.
        self._wake = asyncio.Event()
        self.intents: list[replay.DeletionIntent] = []  # as of the leader's last round
        self.replays = 0
        self._queue: asyncio.Queue[replay.DeletionIntent] = asyncio.Queue(maxsize=1000)
        self._access: dict[GroupResource, tuple[float, bool, str]] = {}
        # One sweep for leftover records when leadership begins (a CriticalService switched replay off while
        # intents waited); otherwise a cluster that uses no replay costs no read at all.
        self._sweep_pending = True

    # --- recording (every replica) -----------------------------------------------------------------
    def record(self, request: AdmissionRequest, decision: Decision) -> None:
        if decision.allowed or request.dry_run or request.operation != "DELETE" or not self.source.ready:
            return
        try:
            intent = replay.intent_for(request, decision, self.source.state, now=self.clock())
        except StateUnavailable:
            return
        if intent is not None:
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(intent)

    async def run_recorder(self) -> None:
        while True:
            intent = await self._queue.get()
            try:
                record = replay.to_record(intent, namespace=self.namespace)
                await self.transport.send("POST", self._records_path(), record, timeout=REQUEST_TIMEOUT)
                self.metrics.deletion_intents.labels(str(intent.target.group_resource)).inc()
                self._wake.set()
                log.info("deletion intent recorded", object=str(intent.target), uid=intent.uid, user=intent.user,
                         propagation_policy=intent.propagation_policy)
            except APIStatusError as exc:
                if exc.code != 409:  # 409: recorded already (another replica, or a retry of the same DELETE)
                    log.warning("could not record a deletion intent", object=str(intent.target), error=str(exc))
            except APIError as exc:
                log.warning("could not record a deletion intent", object=str(intent.target), error=str(exc))

    # --- rounds (the leader) ------------------------------------------------------------------------
    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            self._wake.clear()  # before the round: a recording during it wakes the next one
            seen = self._changes()
            if leading() and self.source.ready:
                self.rounds += 1
                try:
                    await self.round()
                except Exception:  # a round must never end the loop; the next one retries
                    log.exception("replay round failed")
            else:
                self.intents = []
                self._sweep_pending = True
            await asyncio.sleep(self.min_round_gap)
            await self._until_woken(seen)

    def _changes(self) -> int | None:
        changes = getattr(self.source, "changes", None)  # CacheState's; a snapshot or a test's state has none
        return changes if isinstance(changes, int) else None

    async def _until_woken(self, seen: int | None) -> None:
        """Wait until something may change a decision: an intent recorded here; while intents wait, any event of
        the caches (one that came during the round, `seen` being their count before it, or the next); at the
        latest `interval` seconds."""
        waiting = bool(self.intents)
        if waiting and seen is not None and self._changes() != seen:
            return
        wakers: list[asyncio.Future[Any]] = [asyncio.ensure_future(self._wake.wait())]
        wait_event = getattr(self.source, "wait_event", None)
        if waiting and callable(wait_event):
            wakers.append(asyncio.ensure_future(wait_event(self.interval)))
        try:
            await asyncio.wait(wakers, timeout=self.interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waker in wakers:
                waker.cancel()

    def _wanted(self) -> bool:
        try:
            asking = any(cs.replay_deletion == ReplayDeletion.WHEN_TEARING_DOWN
                         for cs in self.source.state.critical_services())
        except StateUnavailable:
            return False
        return asking or bool(self.intents) or self._sweep_pending

    async def round(self) -> None:
        """One leader round: list the records, plan, act."""
        if not self._wanted():
            return
        self._sweep_pending = False
        page = await self.transport.get(self._records_path(), (("labelSelector", f"{replay.RECORD_LABEL}=true"),),
                                        timeout=REQUEST_TIMEOUT)
        intents: list[replay.DeletionIntent] = []
        for item in page.get("items") or []:
            try:
                intents.append(replay.from_record(item))
            except InvalidInput as exc:
                log.warning("dropping an unreadable deletion intent record", error=str(exc))
                await self._forget(str((item.get("metadata") or {}).get("name") or ""))
        state = self.source.state
        outcomes = replay.plan(intents, state, now=self.clock(), arm_window=self.arm_window,
                               time_to_live=self.time_to_live)
        due: list[replay.DeletionIntent] = []
        for outcome, before in zip(outcomes, intents, strict=True):
            if isinstance(outcome, replay.Wait):
                if outcome.intent.armed_at is not None and before.armed_at is None:
                    await self._arm(outcome.intent)
            elif isinstance(outcome, replay.Drop):
                await self._drop(outcome)
            else:
                due.append(outcome.intent)
        # The due replays at once, as a deleter sends what may go: each DELETE is still admitted on its own (the
        # gate decides it again), so sending them together lets through nothing one at a time would not. One after
        # the other, each waited for the earlier ones' read, DELETE, record and Event: a provider's namespace
        # replayed ~0.3 s after the provider, which its finalization then started late (design/replay.md, "Argo
        # CD, timed").
        settled = await asyncio.gather(*(self._replay(i) for i in due))
        unsettled = {i.uid for i, done in zip(due, settled, strict=True) if not done}
        kept = [o.intent for o in outcomes
                if isinstance(o, replay.Wait) or (not isinstance(o, replay.Drop) and o.intent.uid in unsettled)]
        changed = [(i.uid, i.armed_at) for i in kept] != [(i.uid, i.armed_at) for i in self.intents]
        self.intents = kept
        await self._check_access(state)
        if changed:
            self.on_change()  # the status writer shows the new intents now, not at its next interval

    async def _arm(self, intent: replay.DeletionIntent) -> None:
        patch = {"data": {"armedAt": repr(intent.armed_at)}}
        with contextlib.suppress(APIError):
            await self.transport.send("PATCH", self._records_path(replay.record_name(intent.uid)), patch,
                                      timeout=REQUEST_TIMEOUT, content_type="application/merge-patch+json")
        log.info("deletion intent armed", object=str(intent.target), uid=intent.uid)

    async def _replay(self, intent: replay.DeletionIntent) -> bool:
        """True when the intent is settled (replayed or dropped); False to keep it for the next round."""
        t = self.mapper.lookup(intent.target.group_resource)
        if t is None:
            return False  # discovery will know the type again, or the object is gone (next round drops it)
        path = t.path(namespace=intent.target.namespace or None, name=intent.target.name)
        try:
            fresh = await self.transport.get(path, timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if exc.not_found:
                await self._drop(replay.Drop(intent, replay.DropReason.GONE, f"{intent.target} is gone"))
                return True
            return False
        except APIError:
            return False
        metadata = fresh.get("metadata") or {}
        if metadata.get("uid") != intent.uid:
            await self._drop(replay.Drop(intent, replay.DropReason.RECREATED,
                                         f"{intent.target} was re-created (uid {metadata.get('uid')})"))
            return True
        if (metadata.get("annotations") or {}).get(REPLAY_DELETION_ANNOTATION) == replay.NEVER:
            await self._drop(replay.Drop(intent, replay.DropReason.CANCELLED,
                                         f"{intent.target} is annotated {REPLAY_DELETION_ANNOTATION}={replay.NEVER}"))
            return True
        options: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": intent.uid}}
        if intent.propagation_policy:
            options["propagationPolicy"] = intent.propagation_policy
        try:
            await self.transport.send("DELETE", path, options, timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if exc.not_found:
                await self._drop(replay.Drop(intent, replay.DropReason.GONE, f"{intent.target} is gone"))
                return True
            if exc.code == 409:
                await self._drop(replay.Drop(intent, replay.DropReason.RECREATED, exc.message))
                return True
            if exc.code == 403 and "admission webhook" not in exc.message:
                self._access[intent.target.group_resource] = (self.clock(), False, exc.message)
                await self._drop(replay.Drop(intent, replay.DropReason.FORBIDDEN, _forbidden(intent, exc.message)))
                return True
            log.info("replay refused; retried next round", object=str(intent.target), error=exc.message)
            return False
        except APIError as exc:
            log.warning("replay failed; retried next round", object=str(intent.target), error=str(exc))
            return False
        self.replays += 1
        self.metrics.deletion_replays.labels("Replayed").inc()
        await self._forget(replay.record_name(intent.uid))
        message = (f"criticalsvc replayed the deletion {intent.user or 'someone'} asked for at "
                   f"{_stamp(intent.requested_at)} (propagationPolicy "
                   f"{intent.propagation_policy or 'default'}): the criteria of "
                   f"{', '.join(intent.services)} now hold")
        log.info("deletion replayed", object=str(intent.target), uid=intent.uid, user=intent.user,
                 propagation_policy=intent.propagation_policy)
        self._event(intent, "DeletionReplayed", message, warning=False)
        return True

    async def _drop(self, drop: replay.Drop) -> None:
        await self._forget(replay.record_name(drop.intent.uid))
        self.metrics.deletion_replays.labels(drop.reason.value).inc()
        log.info("deletion intent dropped", object=str(drop.intent.target), uid=drop.intent.uid,
                 reason=drop.reason.value, why=drop.message)
        if drop.reason in (replay.DropReason.GONE,):
            return  # nothing left to put an Event on
        self._event(drop.intent, f"DeletionIntentDropped{drop.reason.value}",
                    f"criticalsvc will not replay the deletion {drop.intent.user or 'someone'} asked for at "
                    f"{_stamp(drop.intent.requested_at)}: {drop.message}",
                    warning=drop.reason in (replay.DropReason.ABANDONED, replay.DropReason.FORBIDDEN))

    async def _forget(self, name: str) -> None:
        if not name:
            return
        try:
            await self.transport.send("DELETE", self._records_path(name), timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if not exc.not_found:
                log.warning("could not delete a deletion intent record", record=name, error=str(exc))
        except APIError as exc:
            log.warning("could not delete a deletion intent record", record=name, error=str(exc))

    def _event(self, intent: replay.DeletionIntent, reason: str, message: str, *, warning: bool) -> None:
        t = self.mapper.lookup(intent.target.group_resource)
        if t is None or self._namespace_going(intent.target.namespace):
            return  # an Event in a terminating namespace is refused, and would go with it anyway
        involved = {"apiVersion": f"{t.group}/{t.version}" if t.group else t.version, "kind": t.kind,
                    "name": intent.target.name, "uid": intent.uid}
        if intent.target.namespace:
            involved["namespace"] = intent.target.namespace
        self.post_event(object_event(involved=involved, reason=reason, message=message, now=self.clock(),
                                     warning=warning))

    def _namespace_going(self, namespace: str) -> bool:
        if not namespace:
            return False
        try:
            obj = self.source.state.get(ObjectRef(NAMESPACES, "", namespace))
        except StateUnavailable:
            return False
        return obj is None or obj.terminating

    # --- may the gate delete what it would replay? --------------------------------------------------
    async def _check_access(self, state: ClusterState) -> None:
        wanted: set[GroupResource] = set()
        with contextlib.suppress(StateUnavailable):
            for cs in state.critical_services():
                if cs.replay_deletion == ReplayDeletion.WHEN_TEARING_DOWN:
                    provider_type = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
                    # A selector without a namespace ("" is cluster-scoped, None is any) may select objects in any.
                    wanted |= replay_types(provider_type, namespaced=cs.provider.namespace != "")
        now = self.clock()
        for gr in sorted(wanted):
            checked = self._access.get(gr)
            if checked is not None and now - checked[0] < (ACCESS_TTL if checked[1] else DENIED_TTL):
                continue
            review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                      "spec": {"resourceAttributes": {"verb": "delete", "group": gr.group, "resource": gr.resource}}}
            try:
                answer = await self.transport.send("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                                   review, timeout=REQUEST_TIMEOUT)
            except APIError as exc:
                log.warning("could not check the replay permission", resource=str(gr), error=str(exc))
                continue
            status = answer.get("status") or {}
            self._access[gr] = (now, bool(status.get("allowed")), str(status.get("reason") or ""))

    @property
    def facts(self) -> tuple[Any, ...]:
        """What status shows of the replayer (its intents, which types it may delete), comparable: equal at two
        moments, no status it contributes to changed (the status writer's idle skip reads this)."""
        return (tuple(self.intents), tuple(sorted(((str(gr), allowed) for gr, (_at, allowed, _why)
                                                   in self._access.items()))))

    def missing_permissions(self, types: Sequence[GroupResource]) -> list[GroupResource]:
        """Of `types`, those the gate was last told it may not delete (unknown ones are not listed)."""
        return [gr for gr in types if gr in self._access and not self._access[gr][1]]

    def checked(self, gr: GroupResource) -> bool:
        return gr in self._access

    def intents_of(self, service: str) -> list[replay.DeletionIntent]:
        return [i for i in self.intents if service in i.services]

    def _records_path(self, name: str = "") -> str:
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        return f"{path}/{name}" if name else path


def replay_types(provider_type: GroupResource, *, namespaced: bool) -> set[GroupResource]:
    """What a CriticalService's replays may delete: its provider, the provider's namespace, itself."""
    return {provider_type, CRITICAL_SERVICES, *((NAMESPACES,) if namespaced else ())}


def _forbidden(intent: replay.DeletionIntent, message: str) -> str:
    gr = intent.target.group_resource
    return (f"the gate may not delete {gr} ({message}); grant it with a ClusterRole labelled "
            f"{AGGREGATE_LABEL}=\"true\" allowing delete on {gr.resource} in group \"{gr.group}\"")


def _stamp(t: float) -> str:
    from .timestamps import format_rfc3339

    return format_rfc3339(t)
