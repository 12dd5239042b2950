"""The gate's replay of refused deletions, in the simulator (criticalsvc/replay.py decides).

The gate hook hands every decision to `record`; a refused DELETE that criticalsvc.replay.intent_for
accepts becomes an intent. After every change in the store (the live leader learns of changes through
its watch caches) a round runs LAG later: `replay.plan` says what to do with each intent, and a Replay is
a DELETE through the store's admission - the gate decides on it again, like on any other request -
with the intent's UID as precondition and its propagation policy. Rounds also run at the next deadline
(an intent's arming window or time to live), so a Waiting intent is dropped on time in a quiet store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from .. import replay
from ..admission import AdmissionRequest
from ..decision import Decision
from .controllers.base import delete_outcome
from .engine import Engine
from .store import StatusError, Store, WatchEvent
from .timeline import Timeline

ACTOR = "criticalsvc-replay"
# The gate's identity for the replayed DELETE (the live gate uses its ServiceAccount).
USER = "system:serviceaccount:criticalsvc-system:criticalsvc"
# From a change in the store to the leader acting on it: the watch event's delivery plus a round. The live
# leader wakes on the same event (criticalsvc/replayer.py `_until_woken`), no sooner than MIN_ROUND_GAP
# (100 ms) after its previous round; a round against the API server takes tens of milliseconds.
LAG = 0.05


class Replayer:
    def __init__(self, store: Store, engine: Engine, timeline: Timeline, *,
                 arm_window: float = replay.ARM_WINDOW, time_to_live: float = replay.TIME_TO_LIVE,
                 check_uid: bool = True, check_teardown: bool = True,
                 plan: Callable[..., list[replay.Outcome]] = replay.plan) -> None:
        self.store, self.engine, self.timeline = store, engine, timeline
        self.arm_window, self.time_to_live = arm_window, time_to_live
        # Negative controls for the property tests: a replay without the UID precondition, or one
        # that does not wait for the teardown to be in progress. Never switched off outside tests.
        self.check_uid, self.check_teardown = check_uid, check_teardown
        self._plan = plan
        self.intents: dict[str, replay.DeletionIntent] = {}  # by target uid: one per object incarnation
        self.replayed: list[replay.DeletionIntent] = []
        self.dropped: list[replay.Drop] = []
        self._scheduled = False
        store.subscribe(self._changed)

    # --- recording (every gate decision) ------------------------------------------------------------
    def record(self, request: AdmissionRequest, decision: Decision) -> None:
        intent = replay.intent_for(request, decision, self.store.state, now=self.engine.now())
        if intent is None or intent.uid in self.intents:
            return
        self.intents[intent.uid] = intent
        self._soon()
        self.engine.schedule(self.arm_window + LAG, self._round)

    # --- rounds (the leader) ------------------------------------------------------------------------
    def _changed(self, event: WatchEvent) -> None:
        if self.intents:
            self._soon()

    def _soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.engine.schedule(LAG, self._round)

    def _round(self) -> None:
        self._scheduled = False
        if not self.intents:
            return
        state = self.store.state
        intents = list(self.intents.values())
        if not self.check_uid:  # negative control: an intent that follows the name, not the incarnation
            intents = [_by_name(i, state) for i in intents]
        outcomes = self._plan(intents, state, now=self.engine.now(), arm_window=self.arm_window,
                              time_to_live=self.time_to_live)
        for outcome in outcomes:
            if not self.check_teardown and isinstance(outcome, replay.Drop) and outcome.reason in _TEARDOWN_DROPS:
                outcome = replay.Wait(outcome.intent, "kept: the negative control ignores the teardown")
            if isinstance(outcome, replay.Wait):
                self.intents[outcome.intent.uid] = outcome.intent
            elif isinstance(outcome, replay.Drop):
                self._drop(outcome)
            else:
                self._replay(outcome.intent)

    def _replay(self, intent: replay.DeletionIntent) -> None:
        try:
            result = self.store.delete(intent.target, user=USER, propagation=intent.propagation_policy or "Background",
                                       uid=intent.uid if self.check_uid else None)
        except StatusError as exc:
            if exc.code == 404:
                self._drop(replay.Drop(intent, replay.DropReason.GONE, f"{intent.target} is gone"))
            elif exc.code == 409:
                self._drop(replay.Drop(intent, replay.DropReason.RECREATED, exc.message))
            else:  # refused again (the state moved on between the round and the call): the next round decides
                self.timeline.record(ACTOR, "DELETE", intent.target, "denied", exc.message)
            return
        self.intents = {k: v for k, v in self.intents.items() if v.target != intent.target}
        self.replayed.append(intent)
        self.timeline.record(ACTOR, "DELETE", intent.target, delete_outcome(result)[0],
                             f"replayed the deletion {intent.user or 'someone'} asked for at "
                             f"+{intent.requested_at - self.timeline.start:.1f}s")

    def _drop(self, drop: replay.Drop) -> None:
        self.intents = {k: v for k, v in self.intents.items() if v.target != drop.intent.target}
        self.dropped.append(drop)
        self.timeline.record(ACTOR, "DROP", drop.intent.target, drop.reason.value, drop.message)


_TEARDOWN_DROPS = frozenset({replay.DropReason.NOT_STARTED, replay.DropReason.ABANDONED})


def _by_name(intent: replay.DeletionIntent, state: Any) -> replay.DeletionIntent:
    obj = state.get(intent.target)
    return attrs.evolve(intent, uid=obj.uid) if obj is not None else intent
