"""A protected ALLOW confirmed on the cache caught up to one consistent read (issue 37).

The confirmation reads one fresh resourceVersion (`LIST criticalservices?limit=1`) and decides on the gate's
own cache once every type the decision reads is proven to hold the state at that version or later
(criticalsvc/caughtup.py, criticalsvc/cache/current.py). These tests make one type's cache lag on purpose
(`HoldingTransport.hold(path)`: its reflector's watch delivers nothing more) and write what the lag hides,
for every criterion kind and for the CriticalServices themselves: the DELETE the lagging cache allows is
refused, on the caught-up cache, with no LIST of the type. Then the cases the one read opens: a type
already past the version needs no watch; a 410, a cache holding no single version and a successor listing
beside the cache fall back to the fresh reads; a CriticalService written after the consistent read that
names a lagging type gets that type proven too; each confirmation reads its own version; and, against a
scripted API server, a cache that re-lists to a version older than what the probe saw is waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubefakes import HoldingTransport, RunningStandIn, ScriptedTransport, eventually, running_standin

from criticalsvc.admission import AdmissionRequest, parse_review
from criticalsvc.api import CRITICAL_SERVICES, GroupResource
from criticalsvc.cache import Backoff, CacheState, KubeTransport
from criticalsvc.cache.catchup import MirrorExpired
from criticalsvc.cache.current import NoSingleVersion, prove_current
from criticalsvc.caughtup import CaughtUpReader
from criticalsvc.decision import decide
from criticalsvc.live import LiveReader
from criticalsvc.restmapper import ResourceType
from criticalsvc.sim.store import Store

pytestmark = pytest.mark.anyio

FINALIZER = "ex.com/cleanup"
CONFIGMAPS = GroupResource("", "configmaps")
CONFIGMAP_TYPE = ResourceType("", "v1", "ConfigMap", "configmaps", "configmap", True, ("cm",))
CONFIGMAPS_PATH = "/api/v1/configmaps"
SECRETS_PATH = "/api/v1/secrets"
SERVICES_PATH = "/apis/criticalsvc.io/v1alpha1/criticalservices"
PROVIDER = {"group": "apps", "resource": "deployments", "namespace": "n", "name": "cleaner"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def service(name: str, *criteria: dict[str, Any], provider: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider or PROVIDER, "criteria": list(criteria)}}


def configmap(name: str, *, namespace: str = "n", finalizers: tuple[str, ...] = (),
              labels: dict[str, str] | None = None, data: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": namespace, "finalizers": list(finalizers), "labels": labels or {}},
        "data": data or {"k": "v"}}


def provider_delete() -> AdmissionRequest:
    return parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": "cleaner", "namespace": "n", "operation": "DELETE", "userInfo": {"username": "alice"},
        "oldObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "cleaner", "namespace": "n"}}}})


FINALIZER_CRITERION = {"type": "Finalizer", "finalizer": {"group": "", "resource": "configmaps",
                                                         "finalizerName": FINALIZER}}


def base_store(*services: dict[str, Any]) -> Store:
    store = Store(clock=time.time)
    for ns in ("n", "work"):
        store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cleaner", "namespace": "n"},
                  "spec": {"replicas": 1}})
    for i in range(3):
        store.create(configmap(f"plain-{i}"))
    for s in services:
        store.create(s)
    return store


@contextlib.contextmanager
def cluster_of(*services: dict[str, Any]) -> Iterator[RunningStandIn]:
    with running_standin(base_store(*services)) as env:
        yield env


@contextlib.asynccontextmanager
async def gate(env: RunningStandIn) -> AsyncIterator[tuple[CacheState, LiveReader, HoldingTransport]]:
    """The cache and the reader `serve` runs, confirming every protected ALLOW on the caught-up cache."""
    from kubernetes.aio import client

    api = client.ApiClient(client.Configuration(host=env.url))
    transport = HoldingTransport(KubeTransport(api))
    cache = CacheState(transport, backoff=Backoff(initial=0.01, maximum=0.05))
    try:
        await cache.start()
        assert await cache.wait_ready(10)
        await eventually(lambda: all(cache.exact_version(gr) is not None for gr in cache.watched()),
                         what="every type watched")
        reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=0,
                            caught_up=CaughtUpReader(transport, cache))
        yield cache, reader, transport
    finally:
        transport.release()
        await cache.stop()
        await api.close()


def probes(transport: HoldingTransport, path: str, since: int = 0) -> list[dict[str, str]]:
    """The short watches of `path` (timeoutSeconds 3: the proof's, not a reflector's) sent after call `since`."""
    return [params for kind, at, params in transport.calls[since:]
            if kind == "stream" and at == path and params.get("timeoutSeconds") == "3"]


def reads_of(transport: HoldingTransport, word: str, since: int) -> list[tuple[str, dict[str, str]]]:
    """GETs and LISTs whose path names `word`, sent after call `since`."""
    return [(at, params) for kind, at, params in transport.calls[since:] if kind == "get" and word in at]


@contextlib.asynccontextmanager
async def meanwhile(work: Any) -> AsyncIterator[asyncio.Task[None]]:
    """Run `work` beside the block; cancelled if the block ends first (its assertions say why)."""
    task = asyncio.create_task(work)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def release_at_probe(transport: HoldingTransport, path: str, since: int) -> None:
    """Let the held reflector go on once a probe of its type is open: the cache must apply what the probe saw."""
    await eventually(lambda: probes(transport, path, since), timeout=10, what=f"a probe of {path}")
    transport.release()


# --- every criterion kind, and the CriticalServices ----------------------------------------------------------
def _modify(env: RunningStandIn, name: str, change: Callable[[dict[str, Any]], None]) -> None:
    stored = env.store.get(CONFIGMAPS, "n", name)
    assert stored is not None
    change(stored)
    env.store.update(stored)


KINDS: dict[str, tuple[dict[str, Any], str, Callable[[RunningStandIn], Any], str]] = {
    # kind: (criterion, the path of the type that lags, the write the lag hides, what the denial names)
    "Finalizer": (FINALIZER_CRITERION, CONFIGMAPS_PATH,
                  lambda env: env.store.create(configmap("carrier", finalizers=(FINALIZER,))), "n/carrier"),
    "SpecificResource": ({"type": "SpecificResource", "specificResource": {
        "group": "", "resource": "configmaps", "namespace": "n", "name": "lock"}}, CONFIGMAPS_PATH,
        lambda env: env.store.create(configmap("lock")), "lock"),
    "Resources": ({"type": "Resources", "resources": {"group": "", "resource": "configmaps", "namespace": "work"}},
                  CONFIGMAPS_PATH, lambda env: env.store.create(configmap("job", namespace="work")), "work/job"),
    "Resources with a selector": ({"type": "Resources", "resources": {
        "group": "", "resource": "configmaps", "namespace": "n", "selector": {"matchLabels": {"app": "web"}}}},
        CONFIGMAPS_PATH, lambda env: env.store.create(configmap("web", labels={"app": "web"})), "n/web"),
    "a condition": ({"type": "Resources", "condition": "has(object.data.busy)", "resources": {
        "group": "", "resource": "configmaps", "namespace": "n"}}, CONFIGMAPS_PATH,
        lambda env: _modify(env, "plain-1", lambda cm: cm["data"].update(busy="yes")), "n/plain-1"),
    "a CriticalService": (FINALIZER_CRITERION, SERVICES_PATH, lambda env: env.store.create(service("second", {
        "type": "SpecificResource", "specificResource": {
            "group": "", "resource": "configmaps", "namespace": "n", "name": "plain-0"}})), "second"),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_a_write_the_lagging_cache_missed_is_seen_without_a_list(kind: str) -> None:
    """The cache of one type lags; the write it missed makes the criteria unmet: the DELETE the cache allows is
    refused, decided on the cache once it caught up, with no GET or LIST of the type."""
    criterion, path, write, named = KINDS[kind]
    with cluster_of(service("cleaner", criterion)) as env:
        async with gate(env) as (cache, reader, transport):
            transport.hold(path)
            await env.write(lambda: write(env))
            assert decide(provider_delete(), cache).allowed  # the window: the cache has not seen it
            since = len(transport.calls)
            async with meanwhile(release_at_probe(transport, path, since)):
                confirmation = await reader.decide(provider_delete())
            assert not confirmation.decision.allowed, confirmation.decision.message
            assert named in confirmation.decision.message
            assert confirmation.caught_up is not None and confirmation.caught_up.watches >= 1
            word = "criticalservices" if path == SERVICES_PATH else "configmaps"
            fresh = [(at, p) for at, p in reads_of(transport, word, since) if p.get("limit") != "1"]
            assert fresh == [], fresh  # the one consistent read is the only GET or LIST


async def test_a_cache_behind_only_by_version_is_confirmed_on_a_bookmark() -> None:
    """Writes to another type move the version on; the cache of the criterion's type has missed nothing: the
    probe's bookmark proves it and the DELETE is allowed on the cache. The type is read only with `?limit=1`,
    which wakes kube-apiserver's watch cache of it (without it that cache sends no bookmark past its last event)."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (_cache, reader, transport):
            await env.write(lambda: env.store.create({"apiVersion": "v1", "kind": "Secret",
                                                      "metadata": {"name": "other", "namespace": "n"}}))
            since = len(transport.calls)
            confirmation = await reader.decide(provider_delete())
            assert confirmation.decision.allowed, confirmation.decision.message
            assert confirmation.caught_up is not None and confirmation.caught_up.watches >= 1
            woken = reads_of(transport, "configmaps", since)
            assert woken == [(CONFIGMAPS_PATH, {"limit": "1"})], woken  # and before the probe opened
            assert transport.calls.index(("get", CONFIGMAPS_PATH, {"limit": "1"}), since) < \
                transport.calls.index(("stream", CONFIGMAPS_PATH, probes(transport, CONFIGMAPS_PATH, since)[0]), since)


async def test_a_cache_already_past_the_version_needs_no_watch() -> None:
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (cache, reader, transport):
            target = str(env.store.resource_version)
            await eventually(lambda: all(cache.exact_version(gr) == target for gr in cache.watched()),
                             what="every cache at the store's version (each watch's first bookmark)")
            since = len(transport.calls)
            confirmation = await reader.decide(provider_delete())
            assert confirmation.decision.allowed and confirmation.caught_up is not None
            assert confirmation.caught_up.watches == 0 and confirmation.caught_up.target == target
            assert [kind for kind, *_ in transport.calls[since:]] == ["get"]  # the one consistent read, nothing else


# --- what the one read opens --------------------------------------------------------------------------------
async def test_an_expired_version_falls_back_to_the_fresh_reads() -> None:
    """A 410 on the probe: the cache cannot be caught up; the fresh reads decide (and see the carrier)."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (cache, reader, transport):
            transport.hold(CONFIGMAPS_PATH)
            await env.write(lambda: env.store.create(configmap("carrier", finalizers=(FINALIZER,))))
            assert decide(provider_delete(), cache).allowed
            env.faults.add(r"/api/v1/configmaps$", watch=True, status=410, times=1)
            confirmation = await reader.decide(provider_delete())
            assert not confirmation.decision.allowed and "n/carrier" in confirmation.decision.message
            assert confirmation.caught_up is None  # decided by the fresh reads


async def test_a_cache_listing_beside_its_watch_falls_back_to_the_fresh_reads() -> None:
    """A successor listing the type again (a condition changed) mixes its pages into the store: no single
    version describes it, so it is not caught up from; the fresh reads decide."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (cache, reader, transport):
            env.faults.add(r"/api/v1/configmaps$", watch=False, action="hang")  # the successor's LIST hangs
            transport.hold(CONFIGMAPS_PATH)

            def add_condition_and_carrier() -> None:
                stored = env.store.get(CRITICAL_SERVICES, "", "cleaner")
                assert stored is not None
                stored["spec"]["criteria"][0]["condition"] = "has(object.data)"
                env.store.update(stored)
                env.store.create(configmap("carrier", finalizers=(FINALIZER,)))

            await env.write(add_condition_and_carrier)
            await eventually(lambda: CONFIGMAPS in cache.watches.successors, what="a successor listing configmaps")
            assert cache.exact_version(CONFIGMAPS) is None
            env.faults.clear()
            confirmation = await reader.decide(provider_delete())
            assert not confirmation.decision.allowed and "n/carrier" in confirmation.decision.message
            assert confirmation.caught_up is None


async def test_a_service_written_after_the_consistent_read_gets_its_types_proven() -> None:
    """After the one read, while the cache is caught up, a CriticalService is created that protects the provider
    with a Finalizer criterion over secrets, whose cache lags with a carrier written before the read: the next
    round reads secrets, proves them, and refuses (never an ALLOW on the lagging secrets)."""
    watcher = service("watcher", {"type": "Finalizer", "finalizer": {
        "group": "", "resource": "secrets", "finalizerName": FINALIZER}},
        provider={"group": "apps", "resource": "deployments", "namespace": "work", "name": "other"})
    with cluster_of(service("cleaner", FINALIZER_CRITERION), watcher) as env:
        async with gate(env) as (cache, reader, transport):
            transport.hold(SECRETS_PATH)
            transport.hold(CONFIGMAPS_PATH)
            await env.write(lambda: env.store.create({"apiVersion": "v1", "kind": "Secret", "metadata": {
                "name": "carrier", "namespace": "n", "finalizers": [FINALIZER]}}))
            # A change the configmaps cache has not applied either: its probe waits for it, which keeps the first
            # round open while the late CriticalService is written.
            await env.write(lambda: env.store.create(configmap("noise")))
            since = len(transport.calls)
            late = service("late", {"type": "Finalizer", "finalizer": {
                "group": "", "resource": "secrets", "finalizerName": FINALIZER}})

            async def write_late_service_at_the_configmaps_probe() -> None:
                await eventually(lambda: probes(transport, CONFIGMAPS_PATH, since), timeout=10, what="configmaps probe")
                await env.write(lambda: env.store.create(late))
                await eventually(lambda: any(cs.name == "late" for cs in cache.memory.critical_services()),
                                 what="the cache shows the late CriticalService")
                transport.release(CONFIGMAPS_PATH)
                await eventually(lambda: probes(transport, SECRETS_PATH, since), timeout=10, what="secrets probe")
                transport.release()

            async with meanwhile(write_late_service_at_the_configmaps_probe()):
                confirmation = await reader.decide(provider_delete())
            assert not confirmation.decision.allowed, confirmation.decision.message
            assert "late" in confirmation.decision.message and "n/carrier" in confirmation.decision.message
            assert confirmation.caught_up is not None and confirmation.caught_up.rounds >= 2


async def test_each_confirmation_reads_its_own_version() -> None:
    """A write between one confirmation and the next is seen by the next: the version is read per request."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (_cache, reader, transport):
            assert (await reader.decide(provider_delete())).decision.allowed
            transport.hold(CONFIGMAPS_PATH)
            await env.write(lambda: env.store.create(configmap("carrier", finalizers=(FINALIZER,))))
            since = len(transport.calls)
            async with meanwhile(release_at_probe(transport, CONFIGMAPS_PATH, since)):
                confirmation = await reader.decide(provider_delete())
            assert not confirmation.decision.allowed and "n/carrier" in confirmation.decision.message


# --- prove_current against a scripted API server ---------------------------------------------------------------
def _event(kind: str, name: str, version: str) -> dict[str, Any]:
    return {"type": kind, "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": "n", "resourceVersion": version}}}


def _bookmark(version: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": version}}}


class Versions:
    """A cache's exact version, moved on by the test; `changed` waits for the next move."""

    def __init__(self, *versions: str | None) -> None:
        self.versions = list(versions)
        self.looks = 0

    def exact(self) -> str | None:
        self.looks += 1
        return self.versions[0]

    async def changed(self, timeout: float) -> bool:
        await asyncio.sleep(0)
        if len(self.versions) > 1:
            self.versions.pop(0)
        return True


async def test_a_cache_relisted_below_what_the_probe_saw_is_waited_for() -> None:
    """The probe saw a change at 15 (before the target 20); the cache meanwhile re-listed at 12 (a successor
    taking over with an older LIST): it does not hold the state at 20 until it reaches 15."""
    transport = ScriptedTransport()
    transport.streams.append([_event("ADDED", "late", "15"), _bookmark("21")])
    versions = Versions("10", "12", "16")
    proof = await prove_current(transport, CONFIGMAP_TYPE, exact=versions.exact, changed=versions.changed,
                                target="20", deadline=time.monotonic() + 5)
    assert proof.floor == "15" and versions.versions == ["16"]
    assert not proof.holds("12") and not proof.holds(None) and proof.holds("15")


async def test_a_change_past_the_target_ends_the_probe_without_being_waited_for() -> None:
    """A write after the consistent read (25 > 20) need not be in the cache: the state at 20 is the answer."""
    transport = ScriptedTransport()
    transport.streams.append([_event("ADDED", "early", "14"), _event("MODIFIED", "after", "25")])
    versions = Versions("10", "14")
    proof = await prove_current(transport, CONFIGMAP_TYPE, exact=versions.exact, changed=versions.changed,
                                target="20", deadline=time.monotonic() + 5)
    assert proof.floor == "14" and proof.watches == 1


async def test_a_bookmark_short_of_the_target_opens_the_probe_again() -> None:
    transport = ScriptedTransport()
    transport.streams.append([_bookmark("15")])
    transport.streams.append([_bookmark("20")])
    versions = Versions("10")
    proof = await prove_current(transport, CONFIGMAP_TYPE, exact=versions.exact, changed=versions.changed,
                                target="20", deadline=time.monotonic() + 5)
    assert proof.floor == "10" and proof.watches == 2
    first, second = transport.of("stream")
    assert first.params["resourceVersion"] == "10" and second.params["resourceVersion"] == "15"


async def test_an_expired_version_and_no_single_version_are_failures() -> None:
    transport = ScriptedTransport()
    transport.streams.append([{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}])
    with pytest.raises(MirrorExpired):
        await prove_current(transport, CONFIGMAP_TYPE, exact=Versions("10").exact, changed=Versions().changed,
                            target="20", deadline=time.monotonic() + 5)
    with pytest.raises(NoSingleVersion):
        await prove_current(transport, CONFIGMAP_TYPE, exact=Versions(None).exact, changed=Versions().changed,
                            target="20", deadline=time.monotonic() + 5)



# --- one etcd, or a version of its own -----------------------------------------------------------------------
async def test_a_type_in_another_etcd_is_caught_up_to_a_version_of_its_own() -> None:
    """A type kube-apiserver stores in another etcd (--etcd-servers-overrides, told by `serve --separate-storage`)
    counts its versions apart: it is caught up to its own consistent read, never to the CriticalServices'."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        async with gate(env) as (cache, _reader, transport):
            reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=0,
                                caught_up=CaughtUpReader(transport, cache, separate_storage=frozenset({CONFIGMAPS})))
            assert reader.caught_up is not None
            assert reader.caught_up.shares_target(CRITICAL_SERVICES) and not reader.caught_up.shares_target(CONFIGMAPS)
            since = len(transport.calls)
            confirmation = await reader.decide(provider_delete())
            assert confirmation.decision.allowed and confirmation.caught_up is not None
            assert ("get", CONFIGMAPS_PATH, {"limit": "1"}) in transport.calls[since:]


async def test_only_kube_apiserver_types_and_custom_resources_share_the_version() -> None:
    """A group no CRD defines and kube-apiserver does not serve itself is an aggregated API server's, with its own
    storage; a group from a CRD the cache holds is stored with the CriticalServices."""
    with cluster_of(service("cleaner", FINALIZER_CRITERION)) as env:
        env.store.create({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                          "metadata": {"name": "widgets.ex.com"}, "spec": {
                              "group": "ex.com", "scope": "Namespaced",
                              "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                              "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                                  "openAPIV3Schema": {"type": "object"}}}]}})
        async with gate(env) as (cache, _reader, transport):
            await eventually(lambda: cache.defined_by_crd(GroupResource("ex.com", "widgets")), what="the CRD cached")
            reader = CaughtUpReader(transport, cache)
            assert reader.shares_target(GroupResource("ex.com", "widgets"))
            assert reader.shares_target(GroupResource("apps", "deployments")) and reader.shares_target(CONFIGMAPS)
            assert not reader.shares_target(GroupResource("metrics.k8s.io", "pods"))


def test_separate_storage_is_given_as_kube_apiserver_writes_its_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    from criticalsvc.cli import build_parser

    args = build_parser().parse_args(["serve", "--separate-storage", "/pods", "--separate-storage", "apps/deployments"])
    assert args.separate_storage == [GroupResource("", "pods"), GroupResource("apps", "deployments")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--separate-storage", "apps/v1/deployments"])
    assert "--separate-storage: expected GROUP/RESOURCE (as /pods or apps/deployments), got 'apps/v1/deployments'" \
        in capsys.readouterr().err


# --- which confirmation ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("criterion", "caught_up"), [
    (FINALIZER_CRITERION, True),  # a LIST of every ConfigMap: 3 objects, at the threshold
    ({"type": "Resources", "condition": "has(object.data.busy)",  # none is: met, over a LIST of 3
      "resources": {"group": "", "resource": "configmaps", "namespace": "n"}}, True),
    ({"type": "SpecificResource", "specificResource": {"group": "", "resource": "configmaps", "namespace": "n",
                                                       "name": "lock"}}, False),  # one GET, at any size of the type
    ({"type": "Resources", "resources": {"group": "", "resource": "configmaps", "namespace": "work"}}, False),
])
async def test_the_caught_up_cache_is_taken_only_where_a_fresh_read_would_be_large(criterion: dict[str, Any],
                                                                                   caught_up: bool) -> None:
    """Where the fresh read is small (a GET, an empty namespace) it is quicker than a lagging type's bookmark and
    decides; where it would bring --catch-up-above objects or more, the caught-up cache decides."""
    with cluster_of(service("cleaner", criterion)) as env:
        async with gate(env) as (cache, _reader, transport):
            reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=3,
                                caught_up=CaughtUpReader(transport, cache))
            confirmation = await reader.decide(provider_delete())
            assert confirmation.decision.allowed, confirmation.decision.message
            assert (confirmation.caught_up is not None) is caught_up
