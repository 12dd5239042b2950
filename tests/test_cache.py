"""The watch caches (reflectors, discovery, CacheState): on a scripted transport, over HTTP against the
stand-in, and as a state machine following a store through outages, compactions and CRD churn."""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from kubefakes import (
    RunningStandIn,
    ScriptedTransport,
    StoreTransport,
    eventually,
    running_standin,
    started_cache,
    story_objects,
    story_store,
)

from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import CRDS, CRITICAL_SERVICES, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.cache import (
    APIStatusError,
    Backoff,
    CacheState,
    KubeTransport,
    Reflector,
    TransportError,
    connect,
    discover,
)
from criticalsvc.cache.discovery import parse_resource_list, sync_mapper
from criticalsvc.criteria import named_resource
from criticalsvc.decision import Rule, decide
from criticalsvc.errors import InvalidInput, StateUnavailable
from criticalsvc.restmapper import ResourceType, RESTMapper
from criticalsvc.sim.kubeconfig import write_kubeconfig
from criticalsvc.sim.store import StatusError, Store

pytestmark = pytest.mark.anyio

FAST = Backoff(initial=0.01, maximum=0.05)
COOL = GroupResource("my.crd.group", "coolresources")
DEPLOYMENTS = GroupResource("apps", "deployments")
PROVIDER = ObjectRef(DEPLOYMENTS, "finalizer-namespace", "finalizer-deployment")
FINALIZER = "my.crd.group/super-important"
COOL_TYPE = ResourceType("my.crd.group", "v1", "CoolResource", "coolresources", "coolresource", True, ("cool",))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiohttp (under kubernetes.aio) runs on asyncio only


def delete_request(ref: ObjectRef, old: dict[str, Any] | None, *, name: str | None = None) -> AdmissionRequest:
    namespace = ref.name if ref.group_resource == NAMESPACES else ref.namespace
    return AdmissionRequest(uid="u1", group_resource=ref.group_resource, operation="DELETE",
                            name=ref.name if name is None else name, namespace=namespace, old_object=old)


def cool(name: str, *, finalizers: tuple[str, ...] = (FINALIZER,)) -> dict[str, Any]:
    return {"apiVersion": "my.crd.group/v1", "kind": "CoolResource",
            "metadata": {"name": name, "namespace": "cool-apps", "finalizers": list(finalizers)}}


# --- unit: a reflector on a scripted transport ----------------------------------------------------------
class DictSink:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.replaced = 0

        self.listing: dict[str, dict[str, Any]] = {}
        self.largest_page = 0  # the most raw objects handed over at once

    def list_page(self, gr: GroupResource, items: Any, *, first: bool) -> None:
        if first:
            self.listing = {}
        self.listing.update({i["metadata"]["name"]: i for i in items})
        self.largest_page = max(self.largest_page, len(items))

    def list_done(self, gr: GroupResource) -> None:
        self.replaced += 1
        self.objects, self.listing = self.listing, {}

    def upsert(self, gr: GroupResource, obj: Any) -> None:
        self.objects[obj["metadata"]["name"]] = obj

    def delete(self, gr: GroupResource, obj: Any) -> None:
        self.objects.pop(obj["metadata"]["name"], None)


def obj(name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


def page(rv: int, *names: str, cont: str = "") -> dict[str, Any]:
    metadata: dict[str, Any] = {"resourceVersion": str(rv)}
    if cont:
        metadata["continue"] = cont
    return {"metadata": metadata, "items": [obj(n, rv) for n in names]}


def event(kind: str, name: str, rv: int) -> dict[str, Any]:
    return {"type": kind, "object": obj(name, rv)}


@contextlib.asynccontextmanager
async def reflecting(transport: ScriptedTransport, sink: DictSink) -> AsyncIterator[Reflector]:
    reflector = Reflector(transport=transport, resource=COOL_TYPE, sink=sink, backoff=FAST, rng=random.Random(1))
    reflector.start()
    try:
        yield reflector
    finally:
        await reflector.stop()


async def test_reflector_lists_all_pages_then_watches_from_the_list_version() -> None:
    """The LIST follows continue tokens, and the watch starts at its resourceVersion asking for bookmarks."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.extend([page(7, "a", "b", cont="tok"), page(7, "c")])
    t.streams.append([event("ADDED", "d", 8), {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}}])
    async with reflecting(t, sink) as r:
        await eventually(lambda: r.resource_version == "12", what="the bookmark's version")
        assert sorted(sink.objects) == ["a", "b", "c", "d"]
        # Handed over a page at a time, never the whole LIST at once (a replica held 3.4 KB per raw object of
        # a 100,000-object LIST until its last page: design/operations.md, "Real scale").
        assert sink.largest_page == 2
        assert r.synced.is_set()
        assert t.of("get")[1].params["continue"] == "tok"
        watch = t.of("stream")[0].params
        assert watch["resourceVersion"] == "7" and watch["allowWatchBookmarks"] == "true"
        assert "resourceVersion" not in t.of("get")[0].params  # a consistent LIST, not "0"
        assert r.restarts == 0


async def test_reflector_relists_after_410_gone_in_the_stream() -> None:
    """An ERROR event with code 410 makes the reflector LIST again and replace what it holds."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.extend([page(5, "a", "b"), page(9, "b", "c")])
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}}
    t.streams.extend([[gone], []])
    async with reflecting(t, sink) as r:
        await eventually(lambda: r.lists == 2, what="a second LIST")
        assert sorted(sink.objects) == ["b", "c"]
        assert r.restarts == 1
        await eventually(lambda: len(t.of("stream")) == 2)
        assert t.of("stream")[1].params["resourceVersion"] == "9"


async def test_reflector_relists_after_a_410_answer_to_the_watch_request() -> None:
    """A 410 status for the watch request itself (no event) also leads to a fresh LIST."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.extend([page(5, "a"), page(20, "z")])
    t.streams.extend([APIStatusError(410, "Gone", "too old"), []])
    async with reflecting(t, sink) as r:
        await eventually(lambda: r.lists == 2)
        assert sorted(sink.objects) == ["z"] and r.restarts == 1


async def test_reflector_resumes_a_dropped_stream_from_the_last_event_without_listing() -> None:
    """A stream broken off mid-way is re-opened from the last event's resourceVersion; no LIST is needed."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.append(page(5, "a"))
    t.streams.extend([[event("ADDED", "b", 6), TransportError("connection reset")], [event("DELETED", "a", 7)]])
    async with reflecting(t, sink) as r:
        await eventually(lambda: len(t.of("stream")) == 2 and "a" not in sink.objects,
                         what="the event after the reconnect")
        assert sorted(sink.objects) == ["b"]
        assert t.of("stream")[1].params["resourceVersion"] == "6"
        assert r.lists == 1 and r.restarts == 1


async def test_reflector_is_not_synced_until_a_list_succeeds() -> None:
    """A failing LIST is retried with backoff; `synced` is set only by the first successful LIST."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.extend([APIStatusError(500, "InternalError", "etcd down"), TransportError("refused")])
    async with reflecting(t, sink) as r:
        await eventually(lambda: r.restarts == 2)
        assert not r.synced.is_set()
        assert "refused" in (r.last_error or "")
        t.gets.append(page(3, "a"))
        await asyncio.wait_for(r.synced.wait(), 5)
        assert list(sink.objects) == ["a"]


async def test_reflector_treats_an_instantly_closed_empty_stream_as_a_failure() -> None:
    """A server that closes every watch at once without an event makes the loop back off, not spin."""
    t, sink = ScriptedTransport(), DictSink()
    t.gets.append(page(3, "a"))
    t.streams.extend([[], [], [event("ADDED", "b", 4)]])
    async with reflecting(t, sink) as r:
        await eventually(lambda: "b" in sink.objects)
        assert r.restarts == 2 and r.lists == 1


async def test_reflector_backs_off_when_410_repeats_without_events() -> None:
    """A first 410 relists at once; 410s in a row without an event in between wait, doubling."""
    t, sink = ScriptedTransport(), DictSink()
    gone = {"type": "ERROR", "object": {"code": 410, "reason": "Expired", "message": "too old"}}
    t.gets.extend([page(1, "a"), page(2, "a"), page(3, "a"), page(4, "a"), page(5, "a")])
    t.streams.extend([[gone], [gone], [gone], [event("ADDED", "b", 6), gone], []])
    waits: list[float] = []

    async def record(delay: float) -> None:
        waits.append(delay)

    reflector = Reflector(transport=t, resource=COOL_TYPE, sink=sink, backoff=Backoff(1.0, 8.0), rng=random.Random(1))
    reflector.sleep = record
    reflector.start()
    try:
        await eventually(lambda: reflector.lists == 5, what="five LISTs")
    finally:
        await reflector.stop()
    assert reflector.restarts == 4
    assert len(waits) == 2 and 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0  # none after the event


# --- unit: discovery -------------------------------------------------------------------------------------
def test_resource_lists_keep_listable_top_level_resources() -> None:
    """Subresources and resources that cannot be listed and watched are not served types for the gate."""
    doc = {"resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True, "kind": "Deployment",
         "verbs": ["get", "list", "watch", "delete"], "shortNames": ["deploy"]},
        {"name": "deployments/status", "namespaced": True, "kind": "Deployment", "verbs": ["get"]},
        {"name": "tokenreviews", "namespaced": False, "kind": "TokenReview", "verbs": ["create"]},
    ]}
    (t,) = parse_resource_list(doc, "apps", "v1")
    assert (t.plural, t.kind, t.namespaced, t.short_names) == ("deployments", "Deployment", True, ("deploy",))


async def test_discovery_reports_groups_it_could_not_read() -> None:
    """A group whose version document fails is listed in failed_groups; the other groups are served."""
    t = ScriptedTransport()
    core = {"resources": [{"name": "namespaces", "kind": "Namespace", "namespaced": False}]}
    t.gets.extend([
        {"groups": [{"name": "metrics.k8s.io", "versions": [{"version": "v1beta1"}]}]},  # /apis
        {"versions": ["v1"]},  # /api
    ])
    answers = {"/api/v1": core, "/apis/metrics.k8s.io/v1beta1": APIStatusError(503, "ServiceUnavailable", "down")}

    async def get(path: str, params: Any = (), **kw: Any) -> Any:
        if path in answers:
            if isinstance(answers[path], Exception):
                raise answers[path]
            return answers[path]
        return await ScriptedTransport.get(t, path, params, **kw)

    t.get = get  # type: ignore[method-assign]
    result = await discover(t)
    assert [x.plural for x in result.types] == ["namespaces"]
    assert result.failed_groups == {"metrics.k8s.io"}


def test_sync_mapper_forgets_vanished_types_and_learns_new_ones() -> None:
    """After sync_mapper the mapper resolves exactly the given types, by every spelling."""
    mapper = RESTMapper([COOL_TYPE])
    ns = ResourceType("", "v1", "Namespace", "namespaces", "namespace", False, ("ns",))
    assert sync_mapper(mapper, [ns])
    assert mapper.resolve(GroupResource("my.crd.group", "cool")) is None
    assert mapper.resolve(GroupResource("", "Namespace")) == NAMESPACES
    assert not sync_mapper(mapper, [ns])


# --- against the stand-in ---------------------------------------------------------------------------------
@pytest.fixture
def env() -> Any:
    with running_standin(story_store()) as e:
        yield e


@contextlib.asynccontextmanager
async def live_cache(env: RunningStandIn, tmp_path: Path, **options: Any) -> AsyncIterator[CacheState]:
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", env.url)
    api = await connect(kubeconfig=str(kubeconfig))
    cache = CacheState(KubeTransport(api), backoff=FAST, **options)
    try:
        await cache.start()
        yield cache
    finally:
        await cache.stop()
        await api.close()


async def all_watching(cache: CacheState) -> None:
    """Wait until every reflector's watch stream is open (so the stand-in can end it)."""
    assert await cache.wait_ready(5)
    await eventually(lambda: all(r.watching for r in map(cache.reflector, cache.watched()) if r is not None),
                     what="every watch open")


def every_delete(store: Store) -> list[AdmissionRequest]:
    requests = []
    for ref in store.refs():
        old = store.get(ref.group_resource, ref.namespace, ref.name)
        requests.append(delete_request(ref, old))
        requests.append(delete_request(ref, old, name=""))  # an item of a deletecollection
    return requests


async def test_caches_sync_from_the_stand_in_and_decide_as_the_store_does(env: RunningStandIn, tmp_path: Path) -> None:
    """Synced caches give the same decision as the store itself for the deletion of every object."""
    async with live_cache(env, tmp_path) as cache:
        assert await cache.wait_ready(5)
        assert set(cache.watched()) == {CRITICAL_SERVICES, NAMESPACES, CRDS, DEPLOYMENTS, COOL}
        requests = every_delete(env.store)
        assert len(requests) > 20
        for request in requests:
            assert decide(request, cache) == decide(request, env.store.state), request
        assert decide(delete_request(PROVIDER, None), cache).rule == Rule.BLOCKED
        assert cache.counts()["coolresources.my.crd.group"] == 3
        assert cache.counts()["namespaces"] == sum(1 for _ in env.store.refs(NAMESPACES))


async def test_state_is_unavailable_and_not_ready_until_every_needed_cache_synced(
        env: RunningStandIn, tmp_path: Path) -> None:
    """While one needed resource cannot be listed, questions about it raise and the provider stays protected."""
    env.faults.add(r"^/apis/my\.crd\.group/v1/coolresources$", watch=False)
    async with live_cache(env, tmp_path) as cache:
        with pytest.raises(StateUnavailable):
            cache.resolve(DEPLOYMENTS)
        await eventually(lambda: cache.unsynced() == ["coolresources.my.crd.group"], what="all but one synced")
        assert not cache.ready
        with pytest.raises(StateUnavailable, match=r"coolresources\.my\.crd\.group cache has not synced"):
            cache.with_finalizer(COOL, FINALIZER)
        denied = decide(delete_request(PROVIDER, env.store.get(DEPLOYMENTS, PROVIDER.namespace, PROVIDER.name)),
                        cache)
        assert not denied.allowed and denied.rule == Rule.UNVERIFIABLE
        assert cache.get(ObjectRef(NAMESPACES, "", "cool-apps")) is not None  # synced resources answer
        env.faults.clear()
        assert await cache.wait_ready(5)
        assert decide(delete_request(PROVIDER, None), cache).rule == Rule.BLOCKED


async def test_resync_after_a_dropped_watch_reflects_changes_made_meanwhile(
        env: RunningStandIn, tmp_path: Path) -> None:
    """Watches broken off and refused for a while resume from their version and catch up on the gap."""
    restarted: list[str] = []
    async with live_cache(env, tmp_path, on_watch_restart=restarted.append) as cache:
        await all_watching(cache)
        watches = env.faults.seen("coolresources", watch=True)
        env.faults.add(r"/coolresources$", watch=True, action="abort")
        env.drop_watches()
        await eventually(lambda: env.faults.seen("coolresources", watch=True) >= watches + 2,
                         what="reconnects that break off")
        await env.write(lambda: env.store.remove_finalizer(ObjectRef(COOL, "cool-apps", "alpha"), FINALIZER))
        await env.write(lambda: env.store.create(cool("delta")))
        env.faults.clear()
        await eventually(lambda: cache.get(ObjectRef(COOL, "cool-apps", "delta")) is not None, what="delta")
        alpha = cache.get(ObjectRef(COOL, "cool-apps", "alpha"))
        assert alpha is not None and alpha.finalizers == ()
        assert {o.name for o in cache.with_finalizer(COOL, FINALIZER)} == {"beta", "gamma", "delta"}
        reflector = cache.reflector(COOL)
        assert reflector is not None and reflector.lists == 1  # resumed, not re-listed
        assert cache.watch_restarts["coolresources.my.crd.group"] >= 2
        assert "coolresources.my.crd.group" in restarted


async def test_resync_after_410_gone_relists_and_reflects_the_gap(env: RunningStandIn, tmp_path: Path) -> None:
    """When the watch's version was compacted away, the cache lists again and shows what changed."""
    async with live_cache(env, tmp_path) as cache:
        await all_watching(cache)
        env.faults.add(r"/coolresources$", watch=True, status=500)
        env.drop_watches()
        reflector = cache.reflector(COOL)
        assert reflector is not None
        await eventually(lambda: reflector.restarts >= 1, what="a refused reconnect")
        await env.write(lambda: env.store.remove_finalizer(ObjectRef(COOL, "cool-apps", "beta"), FINALIZER))

        def compact() -> None:
            env.store.events.clear()  # etcd compaction: the versions the watch knows are gone
            env.store.create(cool("epsilon", finalizers=()))

        await env.write(compact)
        env.faults.clear()
        await eventually(lambda: reflector.lists == 2, what="a second LIST after 410")
        assert {o.name for o in cache.with_finalizer(COOL, FINALIZER)} == {"alpha", "gamma"}
        assert cache.get(ObjectRef(COOL, "cool-apps", "epsilon")) is not None
        for request in every_delete(env.store):
            assert decide(request, cache) == decide(request, env.store.state), request


async def test_a_criterion_type_that_appears_later_is_watched_and_blocks(tmp_path: Path) -> None:
    """CriticalService first, CRD and finalized CRs later: the new type is watched and blocks the provider."""
    with running_standin(story_store(skip_kinds=("CustomResourceDefinition", "CoolResource"))) as env:
        async with live_cache(env, tmp_path) as cache:
            assert await cache.wait_ready(5)
            assert COOL not in cache.watched()
            assert cache.resolve(COOL) is None
            allowed = decide(delete_request(PROVIDER, None), cache)
            assert allowed.allowed and allowed.rule == Rule.CRITERIA_MET  # nothing of an unserved type exists
            (crd,) = story_objects("CustomResourceDefinition")
            await env.write(lambda: env.store.create(crd))
            await eventually(lambda: COOL in cache.watched() and not cache.unsynced(), what="coolresources synced")
            await env.write(lambda: env.store.create(cool("alpha")))
            await eventually(lambda: cache.with_finalizer(COOL, FINALIZER), what="alpha in the cache")
            denied = decide(delete_request(PROVIDER, None), cache)
            assert not denied.allowed and denied.rule == Rule.BLOCKED
            assert f"coolresources.my.crd.group cool-apps/alpha still carries finalizer {FINALIZER}" in denied.message


async def test_a_newly_named_type_syncing_refuses_only_what_needs_it(tmp_path: Path) -> None:
    """Once synced, the gate stays ready while the cache of a type a CriticalService names only now is still
    syncing (here: cannot be listed): only decisions that need the type are refused. (Readiness used to
    drop, so every replica answered 503 to every review at once.)"""
    with running_standin(story_store(skip_kinds=("CustomResourceDefinition", "CoolResource"))) as env:
        env.faults.add(r"^/apis/my\.crd\.group/v1/coolresources$", watch=False)
        async with live_cache(env, tmp_path) as cache:
            assert await cache.wait_ready(5)
            (crd,) = story_objects("CustomResourceDefinition")
            await env.write(lambda: env.store.create(crd))
            await eventually(lambda: COOL in cache.watched(), what="coolresources watched")
            assert cache.unsynced() == ["coolresources.my.crd.group"]
            assert cache.ready
            denied = decide(delete_request(PROVIDER, None), cache)
            assert not denied.allowed and denied.rule == Rule.UNVERIFIABLE
            assert "coolresources.my.crd.group cache has not synced" in denied.message
            unrelated = decide(delete_request(ObjectRef(NAMESPACES, "", "cool-apps"), None), cache)
            assert unrelated.allowed, unrelated.message
            env.faults.clear()
            await eventually(lambda: not cache.unsynced(), what="coolresources synced")
            blocked = decide(delete_request(PROVIDER, None), cache)  # now for what it is: the CRD exists
            assert blocked.rule == Rule.BLOCKED and "coolresources.my.crd.group still exists" in blocked.message


async def test_a_resource_no_critical_service_names_is_no_longer_watched(env: RunningStandIn, tmp_path: Path) -> None:
    """Deleting the only CriticalService stops the watches of its provider and criteria types (once
    unwatch_after has passed; 0 here)."""
    async with live_cache(env, tmp_path, unwatch_after=0) as cache:
        assert await cache.wait_ready(5)
        await env.write(lambda: env.store.delete(ObjectRef(CRITICAL_SERVICES, "", "for-finalizer-deployment")))
        await eventually(lambda: set(cache.watched()) == {CRITICAL_SERVICES, NAMESPACES, CRDS}, what="unwatched")
        assert "coolresources.my.crd.group" not in cache.counts()
        assert cache.critical_services() == [] and cache.ready
        assert decide(delete_request(PROVIDER, None), cache).rule == Rule.UNPROTECTED


async def test_a_cache_outlives_its_last_critical_service_for_a_while(env: RunningStandIn, tmp_path: Path) -> None:
    """The next stack of a create/teardown cycle finds its types still watched: a CriticalService deleted
    and created again is decided on the same, synced caches, with no new LIST and no refusal meanwhile."""
    async with live_cache(env, tmp_path, unwatch_after=0.5) as cache:
        assert await cache.wait_ready(5)
        reflector = cache.reflector(COOL)
        service = env.store.get(CRITICAL_SERVICES, "", "for-finalizer-deployment")
        await env.write(lambda: env.store.delete(ObjectRef(CRITICAL_SERVICES, "", "for-finalizer-deployment")))
        await eventually(lambda: cache.critical_services() == [], what="the CriticalService gone from the cache")
        assert cache.reflector(COOL) is reflector and str(COOL) in cache.counts()  # still watched
        fresh = {k: v for k, v in service.items() if k != "status"}
        fresh["metadata"] = {"name": service["metadata"]["name"]}
        await env.write(lambda: env.store.create(fresh))
        await eventually(lambda: cache.critical_services() != [], what="the new CriticalService in the cache")
        assert cache.reflector(COOL) is reflector and not cache.unsynced()
        assert decide(delete_request(PROVIDER, None), cache).rule == Rule.BLOCKED
        await env.write(lambda: env.store.delete(ObjectRef(CRITICAL_SERVICES, "", "for-finalizer-deployment")))
        await eventually(lambda: COOL not in cache.watched(), what="unwatched after unwatch_after")


@pytest.mark.parametrize("form", ["aggregated", "legacy"])
async def test_a_failed_discovery_group_makes_its_names_unanswerable(env: RunningStandIn, tmp_path: Path,
                                                                    form: str) -> None:
    """If a group's discovery fails, a name in it is neither served nor not served: the state refuses to say.
    Aggregated discovery marks such a group `Stale` (its APIService's backend did not answer); the legacy
    walk gets an error for the group's document."""
    if form == "aggregated":
        env.standin.stale_groups.add("work.open-cluster-management.io")
    else:
        env.standin.aggregated_discovery = False
        env.faults.add(r"^/apis/work\.open-cluster-management\.io(/v1)?$", watch=False)
    async with live_cache(env, tmp_path) as cache:
        assert await cache.wait_ready(5)
        with pytest.raises(StateUnavailable, match=r"discovery of API group work\.open-cluster-management\.io"):
            cache.resolve(GroupResource("work.open-cluster-management.io", "ManifestWork"))
        assert cache.resolve(GroupResource("apps", "Deployment")) == DEPLOYMENTS


async def test_transport_maps_errors_to_status_and_transport_errors(env: RunningStandIn, tmp_path: Path) -> None:
    """An error answer keeps the server's code and reason; no answer at all is a TransportError."""
    from kubernetes.aio import client

    env.faults.add(r"^/api/v1/namespaces$", status=500, times=1)
    api = client.ApiClient(client.Configuration(host=env.url))
    try:
        transport = KubeTransport(api)
        with pytest.raises(APIStatusError) as caught:
            await transport.get("/api/v1/namespaces", timeout=5)
        assert (caught.value.code, caught.value.reason) == (500, "InternalError")
        with pytest.raises(APIStatusError) as missing:
            await transport.get("/api/v1/namespaces/nope", timeout=5)
        assert missing.value.not_found and missing.value.details.get("name") == "nope"
    finally:
        await api.close()
    closed = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # discard port: nothing listens
    try:
        with pytest.raises(TransportError):
            await KubeTransport(closed).get("/api", timeout=2)
    finally:
        await closed.close()


async def test_connect_names_the_kubeconfig_it_cannot_use(tmp_path: Path) -> None:
    """A missing or broken kubeconfig is one clear InvalidInput naming the file, not a traceback."""
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\ncurrent-context: nowhere\n")
    with pytest.raises(InvalidInput, match=str(broken)):
        await connect(kubeconfig=str(broken))


# --- property: whatever the API server does, a settled cache decides as the store does --------------------
CR_NAMES = ("alpha", "beta", "gamma", "delta")
FINALIZERS = (FINALIZER, "other.example/keep")
CRD_NAME = "coolresources.my.crd.group"
SERVICE = "for-finalizer-deployment"
CRITERIA = {
    "finalizer": {"type": "Finalizer", "finalizer": {"group": "my.crd.group", "resource": "coolresources",
                                                     "finalizerName": FINALIZER}},
    "kind": {"type": "Finalizer", "finalizer": {"group": "my.crd.group", "resource": "CoolResource",
                                                "finalizerName": "other.example/keep"}},
    "selected": {"type": "Resources", "resources": {"group": "my.crd.group", "resource": "cool",
                                                    "namespace": "cool-apps",
                                                    "selector": {"matchLabels": {"tier": "db"}}}},
    "crd": {"type": "SpecificResource", "specificResource": {
        "group": "apiextensions.k8s.io", "resource": "CustomResourceDefinition", "name": CRD_NAME}},
}


class CacheFollowsTheStore(RuleBasedStateMachine):
    """Random writes, dropped watches, compactions and CRD churn; after each, the settled cache agrees.
    Caches are dropped as soon as nothing names their type (the subclass below keeps them a while)."""

    UNWATCH_AFTER = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.store = story_store()
        self.transport = StoreTransport(self.store)
        self.cache = CacheState(self.transport, backoff=FAST, rng=random.Random(0), unwatch_after=self.UNWATCH_AFTER)
        self.loop.run_until_complete(self.cache.start())
        self.settle()

    def teardown(self) -> None:
        self.loop.run_until_complete(self.cache.stop())
        self.loop.close()

    def settle(self) -> None:
        """Run the loop until the cache has caught up (or, during an outage, until it has tried)."""
        async def settled() -> None:
            quiet = 0
            for _ in range(5000):
                reflectors = [self.cache.reflector(gr) for gr in self.cache.watched()]
                caught_up = self.cache.ready and all(r is not None and r.watching for r in reflectors)
                if (self.transport.down or caught_up) and self.transport.idle() and not self.cache.discovery_pending:
                    quiet += 1
                    if quiet > 3:
                        return
                else:
                    quiet = 0
                await asyncio.sleep(0 if quiet else 0.0005)
            raise AssertionError(f"the cache did not settle: unsynced {self.cache.unsynced()}")

        self.loop.run_until_complete(settled())

    def attempt(self, write: Any) -> None:
        with contextlib.suppress(StatusError):  # e.g. no such CRD (404), or it is terminating (403)
            write()
        self.settle()

    @rule(name=st.sampled_from(CR_NAMES), finalizers=st.sets(st.sampled_from(FINALIZERS)), db=st.booleans())
    def put_resource(self, name: str, finalizers: set[str], db: bool) -> None:
        def write() -> None:
            manifest = cool(name, finalizers=tuple(sorted(finalizers)))
            manifest["metadata"]["labels"] = {"tier": "db" if db else "web"}
            if self.store.exists(COOL, "cool-apps", name):
                self.store.update(manifest)
            else:
                self.store.create(manifest)

        self.attempt(write)

    @rule(name=st.sampled_from(CR_NAMES))
    def delete_resource(self, name: str) -> None:
        self.attempt(lambda: self.store.delete(ObjectRef(COOL, "cool-apps", name)))

    @rule(name=st.sampled_from(CR_NAMES), finalizer=st.sampled_from(FINALIZERS))
    def finalize_resource(self, name: str, finalizer: str) -> None:
        self.attempt(lambda: self.store.remove_finalizer(ObjectRef(COOL, "cool-apps", name), finalizer))

    @rule(criteria=st.lists(st.sampled_from(sorted(CRITERIA)), min_size=1, max_size=3, unique=True))
    def put_service(self, criteria: list[str]) -> None:
        def write() -> None:
            manifest = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                        "metadata": {"name": SERVICE},
                        "spec": {"provider": {"group": "apps", "resource": "deployments",
                                              "namespace": "finalizer-namespace", "name": "finalizer-deployment"},
                                 "criteria": [CRITERIA[c] for c in criteria]}}
            if self.store.exists(CRITICAL_SERVICES, "", SERVICE):
                self.store.update(manifest)
            else:
                self.store.create(manifest)

        self.attempt(write)

    @rule()
    def delete_service(self) -> None:
        self.attempt(lambda: self.store.delete(ObjectRef(CRITICAL_SERVICES, "", SERVICE)))

    @rule()
    def remove_crd(self) -> None:
        """The CRD goes, with its instances (as the CRD's cleanup would do it)."""
        def write() -> None:
            for ref in list(self.store.refs(COOL)):
                self.store.delete(ref)
                for f in FINALIZERS:
                    self.store.remove_finalizer(ref, f)
            crd = ObjectRef(CRDS, "", CRD_NAME)
            self.store.delete(crd)
            self.store.remove_finalizer(crd, "customresourcecleanup.apiextensions.k8s.io")

        self.attempt(write)

    @rule()
    def create_crd(self) -> None:
        (crd,) = story_objects("CustomResourceDefinition")
        self.attempt(lambda: self.store.create(crd))

    @rule()
    def drop_watches(self) -> None:
        self.transport.drop_watches()
        self.settle()

    @precondition(lambda self: not self.transport.down)
    @rule()
    def outage(self) -> None:
        """The API server is unreachable: watches break, reconnects fail; writes go on meanwhile."""
        self.transport.down = True
        self.transport.drop_watches()
        self.settle()

    @precondition(lambda self: self.transport.down)
    @rule(compacted=st.booleans())
    def recover(self, compacted: bool) -> None:
        """Back again; if etcd compacted meanwhile, resuming watches get 410 and must list again."""
        if compacted:
            del self.store.events[:-1]
        self.transport.down = False
        self.settle()

    @invariant()
    def decides_as_the_store(self) -> None:
        if self.transport.down:
            return  # a cache cut off from its API server is behind by design; the live read covers it
        named = {self.store.mapper.resolve(gr) for cs in self.store.state.critical_services()
                 for gr in [cs.provider.group_resource, *map(named_resource, cs.criteria)]}
        needed = {CRITICAL_SERVICES, NAMESPACES, CRDS} | (named - {None})
        if self.UNWATCH_AFTER:  # lingering caches of types named before (and still served) may remain
            assert needed <= set(self.cache.watched())
        else:
            assert set(self.cache.watched()) == needed
        for request in [*every_delete(self.store), delete_request(PROVIDER, None)]:
            assert decide(request, self.cache) == decide(request, self.store.state), request
        served = self.store.mapper.lookup(COOL) is not None
        assert (self.cache.resolve(COOL) is not None) == served
        if served and COOL in self.cache.watched():  # watched exactly while a CriticalService names it
            assert {o.name for o in self.cache.with_finalizer(COOL, FINALIZER)} == {
                o.name for o in self.store.state.with_finalizer(COOL, FINALIZER)}


# A quarter of the profile's examples (25 in dev and ci, ~1 s), so the deep `big` profile runs it deeply too.
CacheFollowsTheStore.TestCase.settings = settings(
    max_examples=max(25, settings.default.max_examples // 4), stateful_step_count=12, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_cache_follows_the_store = CacheFollowsTheStore.TestCase


class LingeringCacheFollowsTheStore(CacheFollowsTheStore):
    """The same, with the shipped unwatch_after: a cache kept after its last CriticalService went (and
    still following its watch) must decide exactly as a fresh one would."""

    UNWATCH_AFTER = 300.0


LingeringCacheFollowsTheStore.TestCase.settings = CacheFollowsTheStore.TestCase.settings
test_lingering_cache_follows_the_store = LingeringCacheFollowsTheStore.TestCase


class _BurstTransport:
    """A LIST of nothing, then one watch read that hands over `count` events at once, without awaiting in
    between (as KubeTransport does with the events of one 64 KiB read), then a quiet stream."""

    def __init__(self, count: int) -> None:
        self.count = count

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "") -> dict[str, Any]:
        return page(1)

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Any = (), *, timeout: float,
                     accept: str = "") -> AsyncIterator[AsyncIterator[Any]]:
        async def events() -> AsyncIterator[Any]:
            for i in range(self.count):
                yield event("ADDED", f"o{i}", 2 + i)
            await asyncio.Event().wait()

        yield events()


class _SlowSink(DictSink):
    """Each upsert holds the loop for 1 ms on the CPU (a projection and a CEL evaluation, say)."""

    def upsert(self, gr: GroupResource, obj: Any) -> None:
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            pass
        super().upsert(gr, obj)


@pytest.mark.parametrize("loop_slice", [0.002, math.inf], ids=["sliced", "unsliced-negative-control"])
async def test_a_burst_of_watch_events_lets_reviews_in_between(loop_slice: float) -> None:
    """50 events of 1 ms each arrive in one read: the reflector lets other tasks (reviews) run every
    couple of milliseconds instead of holding the loop for all 50 ms (the negative control, with no
    slice, holds it)."""
    sink = _SlowSink()
    reflector = Reflector(transport=_BurstTransport(50), resource=COOL_TYPE, sink=sink,  # type: ignore[arg-type]
                          backoff=FAST, rng=random.Random(1), loop_slice=loop_slice)
    seen: list[int] = []  # how many events were applied each time another task got to run

    async def review_in_waiting() -> None:
        while len(sink.objects) < 50:
            seen.append(len(sink.objects))
            await asyncio.sleep(0)

    reflector.start()
    try:
        await asyncio.wait_for(review_in_waiting(), 10)
    finally:
        await reflector.stop()
    between = [n for n in seen if 0 < n < 50]
    if loop_slice == math.inf:
        assert not between, seen
    else:
        assert len(set(between)) >= 5, seen  # ran at least every ~10 events, not once after all 50


# --- syncing() and wait_changed(): what a CriticalService's CREATE waits for (server.DEFAULT_SYNC_WAIT) ---------
COOL_LIST = r"/apis/my\.crd\.group/v1/coolresources$"


async def test_a_cache_whose_list_hangs_is_syncing_and_its_sync_wakes_a_waiter() -> None:
    with running_standin(story_store()) as env:
        env.faults.add(COOL_LIST, action="hang", watch=False)
        async with started_cache(env) as (cache, _transport):
            while cache.reflector(COOL) is None:
                assert await cache.wait_changed(10), "the watch set's change woke no waiter"
            assert cache.syncing()
            env.faults.clear()  # the hanging list fails; the reflector lists again, and syncs
            while cache.syncing():
                assert await cache.wait_changed(10), "the sync woke no waiter"
            assert cache.reflector(COOL).synced.is_set()


async def test_an_object_event_wakes_wait_event_and_the_cache_holds_it_when_it_does() -> None:
    """The replayer waits on `wait_event` while intents wait: an object's watch event must wake it, with the
    change already in the cache (a finalizer removed is what lets a provider go)."""
    with running_standin(story_store()) as env:
        async with started_cache(env) as (cache, _transport):
            assert await cache.wait_ready(10)
            await all_watching(cache)
            for _ in range(3):  # not the first event only
                before = cache.changes
                waiting = asyncio.create_task(cache.wait_event(10))
                await asyncio.sleep(0)  # registered
                name = f"woken-{before}"
                await env.write(lambda name=name: env.store.create(cool(name)))
                assert await waiting, "the watch event woke no waiter"
                while cache.get(ObjectRef(COOL, "cool-apps", name)) is None:  # woken by another event first
                    assert await cache.wait_event(10), "the watch event woke no waiter"
                assert cache.changes > before


async def test_a_cache_the_gate_may_not_list_is_not_syncing() -> None:
    """A 403 waits for a grant, not for time: a CREATE is not held for it."""
    with running_standin(story_store()) as env:
        env.faults.add(COOL_LIST, status=403, watch=False)
        async with started_cache(env) as (cache, _transport):
            await eventually(lambda: (r := cache.reflector(COOL)) is not None and r.forbidden, timeout=10,
                             what="the coolresources reflector to meet the 403")
            await eventually(lambda: not cache.syncing(), timeout=10, what="nothing left syncing")
            assert not cache.reflector(COOL).synced.is_set()


def test_answers_decode_with_orjson_and_what_it_refuses_with_json() -> None:
    """The transport decodes with orjson; a document orjson refuses but JSON allows (a lone surrogate
    escape) still decodes as the json module does, and what is not a JSON object stays a clear error."""
    from criticalsvc.cache.transport import TransportError, _json_object

    assert _json_object(b'{"kind": "ConfigMap", "data": {"n": 1}}', "x") == {"kind": "ConfigMap", "data": {"n": 1}}
    assert _json_object(b'{"note": "\\ud800"}', "x") == {"note": "\ud800"}
    with pytest.raises(TransportError, match="LIST /api/v1/pods is not JSON"):
        _json_object(b"{not json", "LIST /api/v1/pods")
    with pytest.raises(TransportError, match="is not a JSON object"):
        _json_object(b"[1, 2]", "LIST /api/v1/pods")


@pytest.mark.parametrize("spacing", [1.0, 0.0])
def test_crd_churn_reads_discovery_at_most_once_a_second(spacing: float) -> None:
    """Every CRD change asks for discovery again; a teardown deleting dozens of CRDs made the gate read it
    back to back. Asked 150 times in 1.5 s, it reads at most once a second (REFRESH_SPACING). The negative
    control, no spacing, reads again as soon as each read ends."""
    from kubefakes import running_standin, started_cache, story_store

    async def churn() -> int:
        with running_standin(story_store()) as env:
            async with started_cache(env) as (cache, _transport):
                cache.served.spacing = spacing
                assert await cache.wait_ready(10)
                await asyncio.sleep(spacing + 0.1)  # the start-up read's spacing is over
                before = env.faults.seen(r"^/apis$")
                for _ in range(150):
                    cache.refresh_discovery()
                    await asyncio.sleep(0.01)
                return env.faults.seen(r"^/apis$") - before

    reads = asyncio.run(churn())
    if spacing:
        assert 1 <= reads <= 2, reads
    else:
        assert reads > 5, reads
