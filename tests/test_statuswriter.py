"""The status writer against the API-server stand-in: one leader writes status, denials become Events."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import httpx
import pytest
from kubefakes import Unreadable
from kubernetes.aio import client as aclient

from criticalsvc.admission import parse_review
from criticalsvc.api import CRITICAL_SERVICES, GroupResource, parse_critical_service
from criticalsvc.decision import Rule, decide
from criticalsvc.manifests import load_path
from criticalsvc.objects import KubeObject
from criticalsvc.routing import Routing
from criticalsvc.server import StaticStateSource
from criticalsvc.sim.apiserver.server import ServerThread
from criticalsvc.sim.apiserver.standin import StandIn
from criticalsvc.sim.store import Store
from criticalsvc.statuswriter import StatusWriter

CS_PATH = "/apis/criticalsvc.io/v1alpha1/criticalservices/for-finalizer-deployment"


@pytest.fixture
def cluster():
    store = Store(clock=time.time)
    manifests = load_path("api/examples/reference-story.yaml")
    manifests.sort(key=lambda m: (m.kind != "Namespace", m.kind != "CustomResourceDefinition"))
    with ServerThread(StandIn(store)) as url:
        for m in manifests:
            httpx.post(f"{url}{_collection(store, m.obj)}", json=dict(m.obj)).raise_for_status()
        httpx.post(f"{url}/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": "criticalsvc-system"}}).raise_for_status()
        yield store, url


def _collection(store: Store, obj: dict[str, Any]) -> str:
    gr = store.gr_for(obj)
    t = store.mapper.lookup(gr)
    assert t is not None
    base = f"/api/{t.version}" if not gr.group else f"/apis/{gr.group}/{t.version}"
    ns = obj["metadata"].get("namespace")
    return f"{base}/namespaces/{ns}/{gr.resource}" if t.namespaced and ns else f"{base}/{gr.resource}"


def _poll(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


async def _run_for(coros: list[Any], until: Callable[[], Any], timeout: float = 15.0) -> Any:
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = await asyncio.to_thread(until)
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError("condition not reached in time")
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _RoutesAll(dict):  # type: ignore[type-arg]
    """Every CriticalService needs nothing beyond what is live: the writer's router as if the API server routed
    everything (tests/test_webhookrouter.py tests the real router)."""

    def get(self, key: Any, default: Any = None) -> frozenset[Any]:
        return frozenset()


class _Router:
    facts = Routing(managed=True, needs=_RoutesAll())


def _writer(store: Store, url: str, identity: str) -> StatusWriter:
    api = aclient.ApiClient(aclient.Configuration(host=url))
    return StatusWriter(api_client=api, source=StaticStateSource(store.state), identity=identity, interval=0.2,
                        router=_Router())


def _events_written(store: Store, url: str, review: Any, request: Any, decision: Any) -> list[Any]:
    """The Events a leader writes for `decision` (its dry-run twin first: it must write none)."""
    def events() -> list[Any]:
        return httpx.get(f"{url}/api/v1/namespaces/default/events").json()["items"]

    async def main() -> Any:
        writer = _writer(store, url, "replica-a")
        dry = parse_review({**review, "request": {**review["request"], "dryRun": True, "uid": "dry"}})
        writer.record(dry, decide(dry, store.state))
        assert writer._events.empty()
        writer.record(request, decision)
        try:
            return await _run_for([writer.run_events()], events)
        finally:
            await writer.api_client.close()

    result: list[Any] = asyncio.run(main())
    return result


def test_elected_writer_publishes_blocking_status(cluster):
    """The leader writes Ready/Blocking conditions, blockers and providerUID; the Lease names it."""
    store, url = cluster

    def status() -> Any:
        return httpx.get(f"{url}{CS_PATH}").json().get("status")

    async def main() -> Any:
        writer = _writer(store, url, "replica-a")
        try:
            return await _run_for([writer.run_elected()], status)
        finally:
            await writer.api_client.close()

    written = asyncio.run(main())
    conditions = {c["type"]: c for c in written["conditions"]}
    assert conditions["Blocking"]["status"] == "True" and conditions["Ready"]["status"] == "True"
    assert written["blockers"][0]["count"] == 3
    assert written["providerUID"]
    lease = httpx.get(f"{url}/apis/coordination.k8s.io/v1/namespaces/criticalsvc-system/leases/criticalsvc-status")
    assert lease.json()["spec"]["holderIdentity"] == "replica-a"


def test_only_the_leader_writes(cluster):
    """With two replicas campaigning, exactly one leads and the other writes nothing."""
    store, url = cluster

    async def main() -> tuple[StatusWriter, StatusWriter]:
        a, b = _writer(store, url, "replica-a"), _writer(store, url, "replica-b")
        try:
            await _run_for([a.run_elected(), b.run_elected()],
                           lambda: (a.writes or b.writes) and (a.leading or b.leading))
        finally:
            await a.api_client.close()
            await b.api_client.close()
        return a, b

    a, b = asyncio.run(main())
    assert (a.writes > 0) != (b.writes > 0)


def test_denial_becomes_an_event_and_dry_run_does_not(cluster):
    """A denied DELETE records a DeletionBlocked Event on the CriticalService; a dry-run denial records none."""
    store, url = cluster
    review = store.admission_review(
        "DELETE", store.gr_for({"apiVersion": "apps/v1", "kind": "Deployment"}), None,
        store.get(store.gr_for({"apiVersion": "apps/v1", "kind": "Deployment"}), "finalizer-namespace",
                  "finalizer-deployment"),
        name="finalizer-deployment", namespace="finalizer-namespace", user="alice", dry_run=False)
    request = parse_review(review)
    decision = decide(request, store.state)
    assert not decision.allowed

    (event,) = _events_written(store, url, review, request, decision)
    assert event["reason"] == "DeletionBlocked" and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "for-finalizer-deployment"
    assert "requested by alice" in event["message"]


def test_a_recreated_critical_service_gets_a_status_of_its_own(cluster):
    """Deleted and re-created under the same name: the new object is written a status (it has none, the
    old one's equal status must not make the writer skip it), with conditions no older than itself."""
    store, url = cluster
    cs = httpx.get(f"{url}{CS_PATH}").json()

    def status() -> Any:
        return httpx.get(f"{url}{CS_PATH}").json().get("status")

    async def main() -> None:
        writer = _writer(store, url, "replica-a")
        try:
            assert await writer.sync_once() >= 1
            first = await asyncio.to_thread(status)
            assert first and first["conditions"]
            await asyncio.to_thread(lambda: httpx.delete(f"{url}{CS_PATH}").raise_for_status())
            assert await asyncio.to_thread(lambda: httpx.get(f"{url}{CS_PATH}").status_code) == 404
            await asyncio.sleep(1.1)  # creationTimestamp has a resolution of one second
            fresh = {k: v for k, v in cs.items() if k != "status"}
            fresh["metadata"] = {"name": cs["metadata"]["name"]}
            await asyncio.to_thread(lambda: httpx.post(f"{url}/apis/criticalsvc.io/v1alpha1/criticalservices",
                                                       json=fresh).raise_for_status())
            assert await writer.sync_once() >= 1, "the re-created object was skipped"
        finally:
            await writer.api_client.close()

    asyncio.run(main())
    recreated = httpx.get(f"{url}{CS_PATH}").json()
    assert recreated["metadata"]["uid"] != cs["metadata"]["uid"]
    created = recreated["metadata"]["creationTimestamp"]
    assert recreated["status"]["conditions"], recreated
    assert all(c["lastTransitionTime"] >= created for c in recreated["status"]["conditions"])


def test_a_failed_event_write_does_not_stop_later_events(cluster):
    """An Event the API server refuses (its namespace is gone) is logged and skipped; the next one is written.
    (The writer's task used to end at the first failure, and no Event was written after it.)"""
    from criticalsvc.events import object_event

    store, url = cluster

    def replayed() -> list[Any]:
        return [e for e in httpx.get(f"{url}/api/v1/namespaces/default/events").json()["items"]
                if e["reason"] == "DeletionReplayed"]

    async def main() -> Any:
        writer = _writer(store, url, "replica-a")
        lost = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x", "uid": "u1", "namespace": "no-such-ns"}
        kept = {"apiVersion": "v1", "kind": "Namespace", "name": "finalizer-namespace", "uid": "u2"}
        writer.post_event(object_event(involved=lost, reason="DeletionReplayed", message="lost", now=time.time()))
        writer.post_event(object_event(involved=kept, reason="DeletionReplayed", message="kept", now=time.time()))
        try:
            return await _run_for([writer.run_events()], replayed)
        finally:
            await writer.api_client.close()

    (event,) = asyncio.run(main())
    assert event["message"] == "kept"


def test_a_type_the_gate_cannot_read_is_written_as_blocking_unknown(cluster):
    """The status is written, not skipped, while a criterion's type is unreadable: Blocking Unknown with the
    webhook's reason, no Unmet count (it used to keep whatever was written last, "may go" included)."""
    store, url = cluster

    def status() -> Any:
        return httpx.get(f"{url}{CS_PATH}").json().get("status")

    async def main() -> Any:
        api = aclient.ApiClient(aclient.Configuration(host=url))
        source = StaticStateSource(Unreadable(store.state, GroupResource("my.crd.group", "coolresources")))
        writer = StatusWriter(api_client=api, source=source, identity="replica-a", interval=0.2)
        try:
            return await _run_for([writer.run_elected()], status)
        finally:
            await api.close()

    written = asyncio.run(main())
    blocking = next(c for c in written["conditions"] if c["type"] == "Blocking")
    assert (blocking["status"], blocking["reason"]) == ("Unknown", "CannotVerify")
    assert "the gate may not list coolresources.my.crd.group (403 Forbidden)" in blocking["message"]
    assert "unmetCriteria" not in written and written["providerUID"]


# --- a pass over many CriticalServices lets reviews in (issue 21, real scale) ----------------------------------
def _many_services(count: int) -> Any:
    from criticalsvc.manifests import Manifest
    from criticalsvc.snapshot import build_state

    docs: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}}]
    for i in range(count):
        docs.append({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"p{i}", "namespace": "apps"}})
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}", "namespace": "apps"}})
        docs.append({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": f"s{i}"},
                     "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "apps",
                                           "name": f"p{i}"},
                              "criteria": [{"type": "SpecificResource", "specificResource": {
                                  "group": "", "resource": "configmaps", "namespace": "apps", "name": f"c{i}"}}]}})
    for n, doc in enumerate(docs):
        doc["metadata"]["uid"] = f"uid-{n}"
    return build_state([Manifest(d, f"document {n}") for n, d in enumerate(docs)])


@pytest.mark.parametrize("loop_slice", [0.002, float("inf")])
def test_a_status_pass_over_many_critical_services_lets_reviews_in_between(loop_slice, monkeypatch):
    """50 CriticalServices whose status takes 1 ms each to compute, none changed (no PATCH, so nothing
    awaited): the pass lets other tasks (reviews) run every couple of milliseconds instead of holding the
    loop for all 50 ms (the negative control, with no slice, holds it)."""
    import criticalsvc.statuswriter as statuswriter

    state = _many_services(50)
    writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                          source=StaticStateSource(state), identity="a", loop_slice=loop_slice)
    real = statuswriter.compute_status
    for cs in state.critical_services():  # as after a first pass: every status written, nothing to PATCH
        writer._written[cs.name, cs.uid] = real(cs, state, now=time.time(), routing=statuswriter.UNMANAGED)
    computed = [0]

    def slow(*args: Any, **kwargs: Any) -> Any:
        computed[0] += 1
        until = time.perf_counter() + 0.001
        while time.perf_counter() < until:  # CPU, as the real computation at 1,000 CriticalServices
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(statuswriter, "compute_status", slow)
    seen: list[int] = []  # how many statuses were computed each time another task got to run

    async def review_in_waiting() -> None:
        while computed[0] < 50:
            seen.append(computed[0])
            await asyncio.sleep(0)

    async def both() -> None:
        waiting = asyncio.create_task(review_in_waiting())
        await asyncio.sleep(0)
        assert await writer.sync_once() == 0
        await asyncio.wait_for(waiting, 10)

    asyncio.run(both())
    between = [n for n in seen if 0 < n < 50]
    if loop_slice == float("inf"):
        assert not between, seen
    else:
        assert len(set(between)) >= 5, seen  # ran at least every ~10 statuses, not once after all 50


def test_a_new_leader_rewrites_no_status_that_is_already_right(cluster):
    """A restarted gate (a new writer) takes the stored statuses as written: its first pass PATCHes nothing,
    and the stored lastTransitionTimes stand. The negative control, a writer not seeded, PATCHes the status
    again with every lastTransitionTime moved to its own clock."""
    store, url = cluster

    def stored() -> Any:
        return httpx.get(f"{url}{CS_PATH}").json().get("status")

    async def first_writer() -> None:
        writer = _writer(store, url, "replica-a")
        try:
            assert await writer.sync_once() == 1
        finally:
            await writer.api_client.close()

    async def restarted(seeded: bool) -> tuple[int, int]:
        writer = _writer(store, url, "replica-b")
        writer.clock = lambda: time.time() + 3600  # an hour later
        try:
            taken = await writer.seed() if seeded else 0
            return taken, await writer.sync_once()
        finally:
            await writer.api_client.close()

    asyncio.run(first_writer())
    before = stored()
    assert asyncio.run(restarted(seeded=True)) == (1, 0)
    assert stored() == before
    assert asyncio.run(restarted(seeded=False)) == (0, 1)
    moved = {c["type"]: c["lastTransitionTime"] for c in stored()["conditions"]}
    assert all(moved[c["type"]] != c["lastTransitionTime"] for c in before["conditions"]), (before, moved)


class CountingSource:
    """A state source that counts its changes, as CacheState does (`changes`)."""

    def __init__(self, state: Any) -> None:
        self.state, self.ready, self.changes = state, True, 0


@pytest.mark.parametrize("full_pass_every", [60.0, 0.0])
def test_an_idle_leader_skips_its_status_pass_until_something_it_reads_changes(full_pass_every, monkeypatch):
    """With every status written and no cache change since, a pass computes nothing (at 1,000
    CriticalServices each pass was 34 ms of CPU every 5 s); a change makes the next pass compute the statuses
    that read what changed, and a write that failed is tried again. The negative control (a full pass every
    time) computes on every pass."""
    import criticalsvc.statuswriter as statuswriter

    state = _many_services(20)
    source = CountingSource(state)
    real = statuswriter.compute_status
    computed = [0]

    def counting(*args: Any, **kwargs: Any) -> Any:
        computed[0] += 1
        return real(*args, **kwargs)

    async def scenario() -> None:
        writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                              source=source, identity="a", full_pass_every=full_pass_every)
        for cs in state.critical_services():
            writer._written[cs.name, cs.uid] = real(cs, state, now=time.time(), routing=statuswriter.UNMANAGED)
        monkeypatch.setattr(statuswriter, "compute_status", counting)

        async def passes(n: int) -> int:
            before = computed[0]
            for _ in range(n):
                await writer.sync_once()
            return computed[0] - before

        try:
            assert await passes(1) == 20
            if full_pass_every == 0.0:
                assert await passes(3) == 60
                return
            # Skipped, but for the first: what the statuses read is known (and compared) once their keys are taken.
            assert await passes(3) == 0 and writer.skipped == 2
            source.changes += 1
            skipped = writer.skipped
            assert await passes(2) == 0  # a change no status reads (the cache moved for another type) ...
            state.upsert(KubeObject(GroupResource("", "configmaps"), "elsewhere", "another"))
            source.changes += 1
            assert await passes(2) == 0  # ... or a write where none reads: no pass at all
            assert writer.skipped == skipped + 4
            # A change to the type every criterion names recomputes each status once, then idle again.
            state.upsert(KubeObject(GroupResource("", "configmaps"), "apps", "another"))
            source.changes += 1
            assert await passes(2) == 20
            # A new CriticalService's status is computed alone (issue 34: its Ready does not wait for 10,000 others).
            state.upsert_critical_service(parse_critical_service({"metadata": {"name": "new", "uid": "u-new"}, "spec": {
                "provider": {"group": "apps", "resource": "deployments", "namespace": "apps", "name": "p0"},
                "criteria": [{"type": "SpecificResource", "specificResource": {
                    "resource": "secrets", "namespace": "apps", "name": "s"}}]}}))
            source.changes += 1
            assert await passes(1) == 1
            # A status to write that cannot be written (nothing listens there) is tried on every pass.
            del writer._written[next(iter(writer._written))]
            source.changes += 1
            assert await passes(3) == 3 + 3  # that one, and the new one (never written: nothing listens)
        finally:
            await writer.api_client.close()

    asyncio.run(scenario())


class _Routes:
    """The writer's router as status reads it: its facts (set by the test) and the REST mapper."""

    def __init__(self, facts: Routing, mapper: Any) -> None:
        self.facts, self.mapper = facts, mapper


@pytest.mark.parametrize("shortcut", [True, False])
def test_a_pass_takes_a_status_as_standing_without_recomputing_it_only_when_nothing_it_reads_moved(
        shortcut, monkeypatch):
    """At 10,000 CriticalServices working out what each status stands on held the leader's loop ~0.2 s per cache
    event (issue 34: CREATE -> Enforcing). A pass takes it as standing, unworked, when nothing it reads moved: a
    write in another namespace, more routes live. What it reads moving still works it out and rewrites it: a write
    in its namespace, one of its routes no longer live, a type learnt. Oracle: each time the shortcut holds, the
    whole key, worked out anyway, is the one stored. Negative control: a writer whose router has no REST mapper
    (the shortcut cannot tell when a name resolves otherwise) works every key out on every pass."""
    import criticalsvc.statuswriter as statuswriter
    from criticalsvc import routing
    from criticalsvc.restmapper import ResourceType

    state = _many_services(20)
    services = sorted(state.critical_services(), key=lambda c: c.name)
    mapper = state.mapper
    needs = {routing.route_key(cs): routing.needed_routes(cs, mapper.lookup(GroupResource("apps", "deployments")))
             for cs in services}
    everything = frozenset().union(*needs.values())
    router = _Routes(Routing(managed=True, needs=needs, written=everything, live=everything), mapper)
    source = CountingSource(state)
    writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                          source=source, identity="a", router=router if shortcut else _Routes(router.facts, None))
    writer.router.mapper = writer.router.mapper or type("NoGeneration", (), {"lookup": mapper.lookup})()
    for cs in services:
        writer._written[cs.name, cs.uid] = statuswriter.compute_status(
            cs, state, now=time.time(), routing=router.facts, lookup=mapper.lookup)
    worked = []
    real_key, real_still = writer._key, writer._still

    def key(cs: Any, *args: Any) -> Any:
        worked.append(cs.name)
        return real_key(cs, *args)

    def still(cs: Any, *args: Any) -> bool:
        held = real_still(cs, *args)
        if held:  # the oracle: the key worked out in full is the one the shortcut took as standing
            assert real_key(cs, state, {"labels": None}) == writer._keys[cs.name, cs.uid], cs.name
        return held

    monkeypatch.setattr(writer, "_key", key)
    monkeypatch.setattr(writer, "_still", still)
    sent: list[str] = []

    class Accepting:  # the API server, taking every status PATCH
        def __init__(self, _client: Any) -> None:
            pass

        async def send(self, method: str, path: str, *args: Any, **kwargs: Any) -> None:
            sent.append(path.split("/")[-2])

    monkeypatch.setattr(statuswriter, "KubeTransport", Accepting)

    async def passes() -> list[str]:
        worked.clear()
        sent.clear()
        source.changes += 1
        await writer.sync_once()
        return sorted(set(worked))

    async def scenario() -> None:
        try:
            assert len(await passes()) == 20  # the first pass works every key out
            everyone = sorted(cs.name for cs in services)
            if not shortcut:
                assert await passes() == everyone
                return
            assert await passes() == []
            state.upsert(KubeObject(GroupResource("", "configmaps"), "elsewhere", "probe"))
            assert await passes() == []  # a write in another namespace: no status reads there
            other = parse_critical_service({"metadata": {"name": "other", "uid": "u-other"}, "spec": {
                "provider": {"group": "apps", "resource": "deployments", "namespace": "elsewhere", "name": "p"},
                "criteria": [{"type": "SpecificResource", "specificResource": {
                    "resource": "secrets", "namespace": "apps", "name": "s"}}]}})
            more = routing.needed_routes(other, mapper.lookup(GroupResource("apps", "deployments")))
            router.facts = attrs.evolve(router.facts, written=everything | more, live=everything | more)
            assert await passes() == []  # as many routes live as before, or more
            state.upsert(KubeObject(GroupResource("", "configmaps"), "apps", "another"))
            assert await passes() == everyone  # the criteria's type written in their namespace
            s0 = services[0]
            router.facts = attrs.evolve(router.facts, live=router.facts.live - needs[routing.route_key(s0)])
            assert await passes() == everyone  # fewer routes live: every key is worked out
            assert sorted(sent) == everyone  # each written again: RoutePending (they share s0's routes)
            router.facts = attrs.evolve(router.facts, live=everything)
            await passes()
            mapper.add(ResourceType("ex.com", "v1", "Widget", "widgets", "widget", True, ()))
            assert await passes() == everyone  # a type learnt: a name may resolve otherwise
            assert await passes() == []
        finally:
            await writer.api_client.close()

    asyncio.run(scenario())


def test_the_cache_counts_every_change_a_status_could_read() -> None:
    """CacheState.changes grows with each object event, and stays put while nothing happens."""
    asyncio.run(_cache_counts_changes())


async def _cache_counts_changes() -> None:
    from kubefakes import running_standin, started_cache, story_store

    with running_standin(story_store()) as env:
        async with started_cache(env) as (cache, _transport):
            assert await cache.wait_ready(10)
            await asyncio.sleep(0.2)
            quiet = cache.changes
            await asyncio.sleep(0.3)
            assert cache.changes == quiet
            await env.write(lambda: env.store.create({"apiVersion": "v1", "kind": "Namespace",
                                                      "metadata": {"name": "another"}}))
            deadline = time.monotonic() + 5
            while cache.changes == quiet and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert cache.changes > quiet


def test_the_writer_shows_a_refused_confirmation_until_one_succeeds(cluster):
    """Criteria met in the caches, but the replica's last confirmation of the provider's DELETE failed: the
    written status says Blocking Unknown (CannotConfirm), not "may go", and CriteriaMet again once a
    confirmation succeeds - without a cache change in between (the idle skip must see it)."""
    from criticalsvc.api import CRDS, ObjectRef
    from criticalsvc.live import RefusedConfirmation
    from criticalsvc.snapshot import build_state

    _store, url = cluster
    state = build_state(load_path("api/examples/reference-story.yaml"))
    for obj in list(state.objects()):
        if obj.group_resource.group == "my.crd.group" or obj.group_resource == CRDS:
            state.remove(obj.ref)
    provider = ObjectRef(GroupResource("apps", "deployments"), "finalizer-namespace", "finalizer-deployment")

    class Reader:
        def __init__(self) -> None:
            self.refused: dict[Any, Any] = {}
            self.refused_changes = 0

    def blocking() -> tuple[str, str]:
        status = httpx.get(f"{url}{CS_PATH}").json()["status"]
        found = next(c for c in status["conditions"] if c["type"] == "Blocking")
        return found["reason"], found["message"]

    async def scenario() -> list[tuple[str, str]]:
        writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host=url)),
                              source=CountingSource(state), identity="a")
        writer.reader = reader = Reader()
        seen = []
        try:
            await writer.sync_once()
            seen.append(await asyncio.to_thread(blocking))
            reader.refused = {provider: RefusedConfirmation(time.time(), "a fresh read of configmaps got no answer "
                                                                         "within 2 s")}
            reader.refused_changes = 1
            await writer.sync_once()
            seen.append(await asyncio.to_thread(blocking))
            reader.refused, reader.refused_changes = {}, 2
            await writer.sync_once()
            seen.append(await asyncio.to_thread(blocking))
        finally:
            await writer.api_client.close()
        return seen

    met, refused, met_again = asyncio.run(scenario())
    assert met[0] == "CriteriaMet" and met_again[0] == "CriteriaMet"
    assert refused[0] == "CannotConfirm" and "no answer within 2 s" in refused[1]


@contextlib.asynccontextmanager
async def _writing(writer: StatusWriter) -> AsyncIterator[None]:
    """`writer` leading (its `_lead` loop) for the block; then stopped and its client closed."""
    leading = asyncio.create_task(writer._lead())
    try:
        yield
    finally:
        leading.cancel()
        await asyncio.gather(leading, return_exceptions=True)
        await writer.api_client.close()


def _leading(interval: float, one_pass: Callable[[StatusWriter], Any], drive: Callable[[StatusWriter], Any]) -> None:
    """A leading writer over two CriticalServices whose passes are `one_pass(writer)` (no seed), while `drive(writer)`
    runs beside it; then stopped."""
    writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                          source=CountingSource(_many_services(2)), identity="a", interval=interval)

    async def seeded() -> int:
        return 0

    writer.sync_once = lambda: one_pass(writer)  # type: ignore[method-assign]
    writer.seed = seeded  # type: ignore[method-assign]

    async def lead() -> None:
        async with _writing(writer):
            await drive(writer)

    asyncio.run(lead())


@pytest.mark.parametrize("interval", [5.0, 0.01])
def test_a_burst_of_denials_costs_one_status_pass_a_second(interval):
    """A teardown pokes the writer with every denial; passes follow the pokes, but at most one a second
    (MIN_PASS_INTERVAL), where they ran back to back. The negative control, a writer whose interval is
    shorter than that (as the tests' writers), passes as often as its interval lets it."""
    from criticalsvc import statuswriter

    passes: list[float] = []

    async def counting_pass(_writer: StatusWriter) -> int:
        passes.append(time.monotonic())
        return 0

    async def burst(writer: StatusWriter) -> None:
        for _ in range(150):  # 1.5 s of denials, one every 10 ms
            writer.poke()
            await asyncio.sleep(0.01)

    _leading(interval, counting_pass, burst)
    if interval < statuswriter.MIN_PASS_INTERVAL:
        assert len(passes) > 20, passes
    else:
        assert 2 <= len(passes) <= 3, passes  # at once, then once the second is over
        assert all(b - a >= 0.95 for a, b in itertools.pairwise(passes)), passes


@pytest.mark.parametrize("held", [0.0, 1.0])
def test_a_pass_that_waited_on_its_writes_does_not_delay_the_next(held):
    """A pass that spends 1.2 s waiting for its PATCHes (the API server slow, reviews in between) and holds the
    loop `held` seconds: a Ready that turns right after it is written in the next pass, which follows at once,
    where the pause used to be twice the pass's length (at 10,000 CriticalServices, 11 minutes without a status
    written). The negative control holds the loop for a second: the pause is paced on that, and the next pass
    waits for it."""
    passes: list[float] = []

    async def slow_pass(writer: StatusWriter) -> int:
        passes.append(time.monotonic())
        if len(passes) == 1:
            time.sleep(held)  # computing: the loop held
            writer.busy = held
            await asyncio.sleep(1.2)  # awaiting writes: the loop free
        return 0

    async def ready_turns(writer: StatusWriter) -> None:
        while not passes:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        writer.poke_soon()  # a route went live during the pass: a Ready turns
        deadline = time.monotonic() + 5
        while len(passes) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    _leading(30.0, slow_pass, ready_turns)
    assert len(passes) == 2, passes
    after = passes[1] - passes[0] - 1.2 - held  # from the end of the first pass to the start of the next
    if held:
        assert after >= 1.5, after  # paced at twice the loop time the pass held
    else:
        assert after < 0.5, after


@pytest.mark.parametrize("pause", [1.0, 0.0])
def test_a_retried_denial_updates_its_event_once_per_batch(cluster, pause, monkeypatch):
    """Twenty denials of the same DELETE while the writer writes: one Event whose count is 20, written in two
    requests (created, then its latest count) rather than twenty; the negative control, a writer that writes
    each one as it comes (no pause between batches), sends more."""
    from kubernetes.aio.client import CoreV1Api

    store, url = cluster
    deployments = store.gr_for({"apiVersion": "apps/v1", "kind": "Deployment"})
    review = store.admission_review(
        "DELETE", deployments, None, store.get(deployments, "finalizer-namespace", "finalizer-deployment"),
        name="finalizer-deployment", namespace="finalizer-namespace", user="alice", dry_run=False)
    request = parse_review(review)
    decision = decide(request, store.state)
    writes: list[str] = []
    for method in ("create_namespaced_event", "patch_namespaced_event"):
        real = getattr(CoreV1Api, method)

        async def counted(self: Any, *args: Any, _real: Any = real, _method: str = method, **kwargs: Any) -> Any:
            writes.append(_method)
            return await _real(self, *args, **kwargs)

        monkeypatch.setattr(CoreV1Api, method, counted)

    def counted_to(n: int) -> Callable[[], bool]:
        def check() -> bool:
            items = httpx.get(f"{url}/api/v1/namespaces/default/events").json()["items"]
            return bool(items) and items[0]["count"] == n
        return check

    async def main() -> None:
        writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host=url)),
                              source=StaticStateSource(store.state), identity="a", event_batch_pause=pause)
        writer.record(request, decision)

        async def denials() -> None:
            await asyncio.sleep(0.05)  # the first Event is being written
            for _ in range(19):
                writer.record(request, decision)
                await asyncio.sleep(0.01)

        try:
            await _run_for([writer.run_events(), denials()], counted_to(20))
        finally:
            await writer.api_client.close()

    asyncio.run(main())
    if pause:
        assert writes == ["create_namespaced_event", "patch_namespaced_event"], writes
    else:
        assert len(writes) > 2, writes


def test_setting_spec_recreated_provider_becomes_an_event_naming_who_set_it(cluster):
    """The UPDATE that sets the orphan intent is recorded on the CriticalService as a Warning Event with the user
    (design/criticalservice.md §6); a dry run records none."""
    store, url = cluster
    old = httpx.get(f"{url}{CS_PATH}").json()
    new = {**old, "spec": {**old["spec"], "recreatedProvider": "Orphan"}}
    review = store.admission_review("UPDATE", CRITICAL_SERVICES, new, old, name=old["metadata"]["name"],
                                    namespace="", user="alice", dry_run=False)
    request = parse_review(review)
    decision = decide(request, store.state)
    assert decision.allowed and decision.rule == Rule.RECREATED_PROVIDER_INTENT

    (event,) = _events_written(store, url, review, request, decision)
    assert event["reason"] == "RecreatedProviderIntent" and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == old["metadata"]["name"]
    assert "set to Orphan by alice" in event["message"]


class EventingSource(CountingSource):
    """A state source whose waiters wake at each change, as CacheManager.wait_event does."""

    def __init__(self, state: Any) -> None:
        super().__init__(state)
        self.changed = asyncio.Event()

    async def wait_event(self, timeout: float) -> bool:
        self.changed.clear()
        try:
            async with asyncio.timeout(timeout):
                await self.changed.wait()
        except TimeoutError:
            return False
        return True


@pytest.mark.parametrize("pending", [True, False])
def test_a_pending_ready_is_shown_at_the_cache_event_that_stores_its_label(pending):
    """CREATE -> Enforcing (issue 34): while a Ready waits for a label or a route (LabelPending, RoutePending), the
    cache event that stores it runs the next status pass at once, not at the next interval (here a minute) nor
    after the denials' one-a-second pause. The negative control: with no Ready pending, a cache event waits."""
    writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                          source=EventingSource(_many_services(2)), identity="a", interval=60.0)
    source = writer.source
    assert isinstance(source, EventingSource)
    passes: list[float] = []

    async def counting_pass() -> int:
        passes.append(time.monotonic())
        writer._pending = pending
        return 0

    async def seeded() -> int:
        return 0

    writer.sync_once = counting_pass  # type: ignore[method-assign]
    writer.seed = seeded  # type: ignore[method-assign]

    async def scenario() -> float | None:
        async with _writing(writer):
            while not passes:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.2)  # the writer waits now
            stored = time.monotonic()
            source.changed.set()  # the label stored
            deadline = stored + 2.0
            while len(passes) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
            return passes[1] - stored if len(passes) > 1 else None

    took = asyncio.run(scenario())
    if pending:
        assert took is not None and took < 0.5, took
    else:
        assert took is None, took


@pytest.mark.parametrize("pending_passes", [True, False])
def test_a_new_critical_service_is_written_during_the_pause_after_a_whole_pass(pending_passes, monkeypatch):
    """A whole pass over 40 CriticalServices that holds the loop 0.2 s (at 10,000 it was 0.2-0.3 s) is followed by a
    pause of twice that. A CriticalService created and routed just after it (the router's poke_soon) has its status
    computed at once by a pass over the pending ones alone, not after the pause and the next whole pass. The
    negative control, a pause with no pending pass, computes it only after both."""
    import criticalsvc.statuswriter as statuswriter

    state = _many_services(40)
    real_compute, real_key = statuswriter.compute_status, StatusWriter._key
    computed: dict[str, float] = {}

    def timed_compute(cs: Any, *args: Any, **kwargs: Any) -> Any:
        computed.setdefault(cs.name, time.monotonic())
        return real_compute(cs, *args, **kwargs)

    def slow_key(self: StatusWriter, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.005)  # computing what a status reads: the loop held
        return real_key(self, *args, **kwargs)

    monkeypatch.setattr(statuswriter, "compute_status", timed_compute)
    monkeypatch.setattr(StatusWriter, "_key", slow_key)
    if not pending_passes:
        async def plain_pause(self: StatusWriter, until: float) -> None:
            await asyncio.sleep(until - asyncio.get_running_loop().time())

        monkeypatch.setattr(StatusWriter, "_pending_passes", plain_pause)
    source = CountingSource(state)
    writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                          source=source, identity="a", interval=60.0)
    for cs in state.critical_services():
        writer._written[cs.name, cs.uid] = real_compute(cs, state, now=time.time(), routing=statuswriter.UNMANAGED)
    whole_passes: list[float] = []
    whole = writer.sync_once

    async def counted_whole() -> int:
        written = await whole()
        whole_passes.append(time.monotonic())
        return written

    async def seeded() -> int:
        return 0

    writer.sync_once = counted_whole  # type: ignore[method-assign]
    writer.seed = seeded  # type: ignore[method-assign]

    async def scenario() -> float:
        async with _writing(writer):
            while not whole_passes:
                await asyncio.sleep(0.001)
            assert writer.busy >= 0.2, writer.busy  # the pause after it: twice that
            state.upsert_critical_service(parse_critical_service({"metadata": {"name": "new", "uid": "u-new"}, "spec": {
                "provider": {"group": "apps", "resource": "deployments", "namespace": "apps", "name": "p0"},
                "criteria": [{"type": "SpecificResource", "specificResource": {
                    "resource": "configmaps", "namespace": "apps", "name": "c0"}}]}}))
            source.changes += 1
            created = time.monotonic()
            writer.poke_soon()  # the router: its route is live
            while "new" not in computed and time.monotonic() < created + 5:
                await asyncio.sleep(0.001)
            return computed.get("new", math.inf) - created

    took = asyncio.run(scenario())
    if pending_passes:
        assert took < 0.1, took
    else:
        assert took >= 0.35, took  # the pause (0.4 s), then the whole pass that reaches it


def test_statuses_are_computed_again_all_the_same_spread_over_the_minute(monkeypatch):
    """What a missed input could cost is bounded by computing each status again after FULL_PASS_EVERY all the same,
    but not all in one pass (at 10,000 that pass took 2-7 s, and new CriticalServices' Ready waited behind it): 45 s
    after they were computed some statuses are computed again and others not yet; after 60 s every one is."""
    import criticalsvc.statuswriter as statuswriter

    state = _many_services(20)
    source = CountingSource(state)
    real = statuswriter.compute_status
    computed: list[str] = []

    def counting(cs: Any, *args: Any, **kwargs: Any) -> Any:
        computed.append(cs.name)
        return real(cs, *args, **kwargs)

    monkeypatch.setattr(statuswriter, "compute_status", counting)

    async def scenario() -> tuple[set[str], set[str]]:
        writer = StatusWriter(api_client=aclient.ApiClient(aclient.Configuration(host="http://127.0.0.1:9")),
                              source=source, identity="a", full_pass_every=60.0)
        for cs in state.critical_services():
            writer._written[cs.name, cs.uid] = real(cs, state, now=time.time(), routing=statuswriter.UNMANAGED)
        try:
            await writer.sync_once()  # computes every status (none was computed by this writer)
            ages = []
            for age in (45.0, 60.0):
                writer._computed = {k: time.monotonic() - age for k in writer._computed}
                writer._last_pass = time.monotonic() - age  # as long ago: a pass is due whatever changed
                computed.clear()
                source.changes += 1  # something changed that no status reads: only the age recomputes
                await writer.sync_once()
                ages.append(set(computed))
            return ages[0], ages[1]
        finally:
            await writer.api_client.close()

    at_45, at_60 = asyncio.run(scenario())
    every = {cs.name for cs in state.critical_services()}
    assert set() < at_45 < every, at_45
    assert at_60 == every
