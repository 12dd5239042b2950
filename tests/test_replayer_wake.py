"""When the leader's replayer runs a round (criticalsvc/replayer.py `run`): on what can change a decision, not on
a poll. What a user notices: a teardown the gate refused goes on the moment its criteria hold, and a gate
with nothing to replay does no work on a busy cluster.

No wall clock: the fallback poll is set to an hour, so a round that happens here was woken by something,
and "at once" means within a few turns of the event loop (`settle`), with no timer in between. The old
loop (a round every 250 ms while intents waited, every 1 s otherwise) fails the first test: its replay
waits for a timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kubefakes import FakeAPI, state_with
from test_replayer import NOW, SERVICE, UID  # the same CriticalService and clock as the replayer tests

from criticalsvc import replay
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef
from criticalsvc.cache.manager import next_signal
from criticalsvc.decision import decide
from criticalsvc.objects import KubeObject
from criticalsvc.replayer import LiveReplayer
from criticalsvc.restmapper import RESTMapper
from criticalsvc.state import MemoryState

DEPLOYMENTS = GroupResource("apps", "deployments")
CONFIGMAPS = GroupResource("", "configmaps")
PROVIDER = ObjectRef(DEPLOYMENTS, "op-system", "controller")
BLOCKER = ObjectRef(CONFIGMAPS, "data", "x")
OBJECT = "/apis/apps/v1/namespaces/op-system/deployments/controller"
GATE_NAMESPACE = "criticalsvc"
RECORDS = f"/api/v1/namespaces/{GATE_NAMESPACE}/configmaps"
HOUR = 3600.0  # the fallback poll: never reached here


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class WatchedSource:
    """What the replayer reads of CacheState: `state`, `ready`, `changes` and `wait_event` (woken by `event`)."""

    def __init__(self, state: MemoryState) -> None:
        self.state = state
        self.ready = True
        self.changes = 0
        self._waiters: list[asyncio.Future[None]] = []

    async def wait_event(self, timeout: float) -> bool:
        return await next_signal(self._waiters, timeout)

    def event(self, change: Callable[[], Any]) -> None:
        """A watch event: the state changes, then whoever waits is woken."""
        change()
        self.changes += 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


def cluster_state(*, blocker_terminating: bool) -> MemoryState:
    """The provider, its namespace, and the ConfigMap the criterion waits for (being deleted, or not)."""
    return state_with(SERVICE, objects=[
        KubeObject(NAMESPACES, "", "op-system", uid="ns-uid"),
        KubeObject(DEPLOYMENTS, "op-system", "controller", uid=UID),
        KubeObject(CONFIGMAPS, "data", "x", uid="cm-uid", labels={"app": "x"},
                   deletion_timestamp="2026-01-01T00:00:00Z" if blocker_terminating else None)])


async def settle() -> None:
    """A few turns of the event loop: what is woken now has run (a round against FakeAPI awaits no timer)."""
    for _ in range(200):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def leading(replayer: LiveReplayer) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(replayer.run(lambda: True)), asyncio.create_task(replayer.run_recorder())]
    try:
        await settle()
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def leader(api: FakeAPI, source: WatchedSource) -> LiveReplayer:
    return LiveReplayer(api, source, RESTMapper(), namespace=GATE_NAMESPACE, clock=lambda: NOW, interval=HOUR,
                        min_round_gap=0.0)


def lists(api: FakeAPI) -> int:
    return sum(1 for verb, path, _body in api.requests if verb == "GET" and path == RECORDS)


@pytest.mark.anyio
async def test_a_replay_is_sent_on_the_watch_event_that_makes_its_criteria_hold() -> None:
    api = FakeAPI({OBJECT: {"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "controller", "namespace": "op-system", "uid": UID}}})
    armed = replay.DeletionIntent(PROVIDER, UID, "alice", NOW - 10, "Background", ("op",), armed_at=NOW - 5)
    record = replay.to_record(armed, namespace=GATE_NAMESPACE)
    api.put(f"{RECORDS}/{record['metadata']['name']}", record)
    source = WatchedSource(cluster_state(blocker_terminating=True))
    replayer = leader(api, source)
    async with leading(replayer):
        assert replayer.intents and api.sent("DELETE", OBJECT) == [], "the ConfigMap still blocks it"
        rounds = replayer.rounds
        source.event(lambda: source.state.remove(BLOCKER))  # the criteria hold from this event on
        await settle()
        assert api.sent("DELETE", OBJECT) == [{"apiVersion": "v1", "kind": "DeleteOptions",
                                               "preconditions": {"uid": UID}, "propagationPolicy": "Background"}]
        assert replayer.rounds == rounds + 1, "one round, started by the event"


@pytest.mark.anyio
async def test_an_idle_leader_is_not_woken_by_cache_events_but_by_an_intent_recorded_here() -> None:
    api = FakeAPI({OBJECT: {"apiVersion": "apps/v1", "kind": "Deployment",
                            "metadata": {"name": "controller", "namespace": "op-system", "uid": UID}}})
    source = WatchedSource(cluster_state(blocker_terminating=False))
    replayer = leader(api, source)
    async with leading(replayer):
        rounds, listed = replayer.rounds, lists(api)
        assert rounds == 1 and replayer.intents == []
        for i in range(50):  # a busy cluster: objects come and go, nothing waits to be replayed
            source.event(lambda i=i: source.state.upsert(KubeObject(CONFIGMAPS, "other", f"cm-{i}", uid=f"u{i}")))
            await settle()
        assert (replayer.rounds, lists(api)) == (rounds, listed), "an idle leader ran rounds on cache events"
        # A refused DELETE of the provider, recorded by this replica: the next round lists it at once.
        old = {"metadata": {"name": "controller", "namespace": "op-system", "uid": UID}}
        request = AdmissionRequest(uid="r1", group_resource=DEPLOYMENTS, operation="DELETE", name="controller",
                                   namespace="op-system", username="alice", old_object=old)
        replayer.record(request, decide(request, source.state))
        await settle()
        assert replayer.rounds == rounds + 1
        assert [i.uid for i in replayer.intents] == [UID]
        # Now an intent waits: a cache event wakes the leader (it may make the criteria hold).
        source.event(lambda: source.state.upsert(KubeObject(CONFIGMAPS, "other", "one-more", uid="u-more")))
        await settle()
        assert replayer.rounds == rounds + 2
