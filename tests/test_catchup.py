"""A Finalizer criterion at any size: its fresh read made from the cache, caught up by a watch (issue 30).

The confirmation of a provider's ALLOW must decide on the cluster as it was after the request arrived.
For a type too large to LIST within the budget, the gate reads its own cache of the type, brought up to a
consistent read's version by a watch from the cache's own version (criticalsvc/cache/catchup.py). These
tests make the cache lag on purpose (`HoldingTransport.hold()`: its watch delivers nothing more) and
write what the lag hides:

* a carrier created in the window is seen: the provider's DELETE, which the lagging cache allows, is
  refused - without a LIST of the type;
* a finalizer removed in the window is seen: the DELETE, which the lagging cache refuses, is allowed;
* a bookmark short of the fresh version opens the watch again; an expired version (410) and versions that
  are not integers fall back to the LIST; a type under the threshold is LISTed as before.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import given
from kubefakes import HoldingTransport, RunningStandIn, ScriptedTransport, eventually, running_standin

from criticalsvc.admission import AdmissionRequest, parse_review
from criticalsvc.api import GroupResource
from criticalsvc.cache import Backoff, CacheState, KubeTransport
from criticalsvc.cache.catchup import CatchUpFailed, MirrorView, catch_up, compare_resource_versions
from criticalsvc.cache.transport import APIStatusError
from criticalsvc.decision import Rule, decide
from criticalsvc.live import LiveReader
from criticalsvc.objects import project
from criticalsvc.restmapper import ResourceType
from criticalsvc.sim.store import Store

pytestmark = pytest.mark.anyio

FINALIZER = "ex.com/cleanup"
CONFIGMAPS = GroupResource("", "configmaps")
CONFIGMAP_TYPE = ResourceType("", "v1", "ConfigMap", "configmaps", "configmap", True, ("cm",))
SERVICE = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "cleaner"},
           "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "n", "name": "cleaner"},
                    "criteria": [{"type": "Finalizer", "finalizer": {
                        "group": "", "resource": "configmaps", "finalizerName": FINALIZER}}]}}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def provider_delete() -> AdmissionRequest:
    return parse_review({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
        "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
        "name": "cleaner", "namespace": "n", "operation": "DELETE", "userInfo": {"username": "alice"},
        "oldObject": {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "cleaner", "namespace": "n"}}}})


def configmap(name: str, *, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "n", "finalizers": list(finalizers)}, "data": {"k": "v"}}


@pytest.fixture
def cluster() -> Iterator[RunningStandIn]:
    store = Store(clock=time.time)
    store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}})
    store.create({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "cleaner", "namespace": "n"},
                  "spec": {"replicas": 1}})
    for i in range(5):
        store.create(configmap(f"plain-{i}"))
    store.create(SERVICE)
    with running_standin(store) as env:
        yield env


@contextlib.asynccontextmanager
async def gate(env: RunningStandIn, **options: Any) -> AsyncIterator[tuple[CacheState, LiveReader, HoldingTransport]]:
    """The cache and the live reader the server runs, over a transport whose watches the test can hold."""
    from kubernetes.aio import client

    api = client.ApiClient(client.Configuration(host=env.url))
    transport = HoldingTransport(KubeTransport(api))
    cache = CacheState(transport, backoff=Backoff(initial=0.01, maximum=0.05))
    reads: list[str] = []
    try:
        await cache.start()
        assert await cache.wait_ready(10)
        await eventually(lambda: cache.carriers(CONFIGMAPS, FINALIZER) is not None, what="configmaps watched")
        reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, **{"catch_up_above": 0, **options},
                            on_finalizer_read=lambda method, _s: reads.append(method))
        reader.reads_by_method = reads  # type: ignore[attr-defined]
        yield cache, reader, transport
    finally:
        await cache.stop()
        await api.close()


def full_lists(transport: HoldingTransport) -> list[dict[str, str]]:
    """LISTs of every ConfigMap that were not the catch-up's one-object read."""
    return [params for kind, path, params in transport.calls
            if kind == "get" and path == "/api/v1/configmaps" and params.get("limit") != "1"]


async def test_a_carrier_created_while_the_cache_lags_is_seen_without_a_list(cluster: RunningStandIn) -> None:
    async with gate(cluster) as (cache, reader, transport):
        transport.hold()
        await cluster.write(lambda: cluster.store.create(configmap("carrier", finalizers=(FINALIZER,))))
        cached = decide(provider_delete(), cache)
        assert cached.allowed and cached.rule == Rule.CRITERIA_MET  # the window: the cache has not seen it
        before = len(full_lists(transport))
        confirmation = await reader.decide(provider_delete())
        assert not confirmation.decision.allowed, confirmation.decision.message
        assert "n/carrier" in confirmation.decision.message and FINALIZER in confirmation.decision.message
        assert len(full_lists(transport)) == before  # read from the cache caught up, not LISTed
        assert reader.reads_by_method == ["watch"]  # type: ignore[attr-defined]
        transport.release()


async def test_a_finalizer_removed_while_the_cache_lags_is_seen(cluster: RunningStandIn) -> None:
    """Liveness: the catch-up also brings good news, so the DELETE the lagging cache refuses is allowed."""
    await cluster.write(lambda: cluster.store.create(configmap("carrier", finalizers=(FINALIZER,))))
    async with gate(cluster) as (cache, reader, transport):
        await eventually(lambda: not decide(provider_delete(), cache).allowed, what="the cache sees the carrier")
        transport.hold()
        before = len(full_lists(transport))  # the cache's own LIST

        def release_finalizer() -> None:
            stored = cluster.store.get(CONFIGMAPS, "n", "carrier")
            assert stored is not None
            stored["metadata"]["finalizers"] = []
            cluster.store.update(stored)

        await cluster.write(release_finalizer)
        assert not decide(provider_delete(), cache).allowed  # still the old view
        confirmation = await reader.decide(provider_delete())
        assert confirmation.decision.allowed, confirmation.decision.message
        assert len(full_lists(transport)) == before
        transport.release()


async def test_a_cache_already_past_the_fresh_version_needs_no_watch(cluster: RunningStandIn) -> None:
    async with gate(cluster) as (_cache, reader, transport):
        streams = sum(1 for kind, *_ in transport.calls if kind == "stream")
        assert (await reader.decide(provider_delete())).decision.allowed
        assert reader.reads_by_method == ["mirror"]  # type: ignore[attr-defined]
        assert sum(1 for kind, *_ in transport.calls if kind == "stream") == streams


async def test_a_type_under_the_threshold_is_listed(cluster: RunningStandIn) -> None:
    async with gate(cluster, catch_up_above=1_000) as (_cache, reader, transport):
        transport.hold()
        before = len(full_lists(transport))
        await cluster.write(lambda: cluster.store.create(configmap("carrier", finalizers=(FINALIZER,))))
        confirmation = await reader.decide(provider_delete())
        assert not confirmation.decision.allowed
        assert reader.reads_by_method == ["list"]  # type: ignore[attr-defined]
        assert len(full_lists(transport)) == before + 1
        transport.release()


async def test_an_expired_version_falls_back_to_the_list(cluster: RunningStandIn) -> None:
    """The cache's version has left the API server's window of events (410): the LIST decides."""
    async with gate(cluster) as (_cache, reader, transport):
        transport.hold()
        before = len(full_lists(transport))
        await cluster.write(lambda: cluster.store.create(configmap("carrier", finalizers=(FINALIZER,))))
        cluster.faults.add(r"/api/v1/configmaps$", watch=True, status=410, times=1)
        confirmation = await reader.decide(provider_delete())
        assert not confirmation.decision.allowed and "n/carrier" in confirmation.decision.message
        assert reader.reads_by_method == ["list"]  # type: ignore[attr-defined]
        assert len(full_lists(transport)) == before + 1
        transport.release()


# --- catch_up against a scripted API server -------------------------------------------------------------------
def _event(kind: str, name: str, version: str, *, finalizers: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": kind, "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": name, "namespace": "n", "resourceVersion": version, "finalizers": list(finalizers)}}}


def _bookmark(version: str) -> dict[str, Any]:
    return {"type": "BOOKMARK", "object": {"kind": "ConfigMap", "metadata": {"resourceVersion": version}}}


def _keep(raw: Any) -> Any:
    obj = project(raw, CONFIGMAPS)
    return obj if FINALIZER in obj.finalizers else None


async def test_a_bookmark_short_of_the_fresh_version_opens_the_watch_again() -> None:
    """Behind a load balancer the watch may reach an API server whose cache is behind the one that answered
    the consistent read: its bookmark is no proof, and the watch is opened again from it."""
    transport = ScriptedTransport()
    transport.gets.append({"metadata": {"resourceVersion": "20"}, "items": []})
    transport.streams.append([_bookmark("15")])
    transport.streams.append([_event("ADDED", "late", "18", finalizers=(FINALIZER,)), _bookmark("21")])
    caught = await catch_up(transport, CONFIGMAP_TYPE, MirrorView("10", {}, 100_000), keep=_keep,
                            accept="application/json", deadline=time.monotonic() + 5)
    assert [o.name for o in caught.objects] == ["late"] and caught.watches == 2 and caught.resource_version == "21"
    first, second = transport.of("stream")
    assert first.params["resourceVersion"] == "10" and second.params["resourceVersion"] == "15"
    assert first.params["allowWatchBookmarks"] == "true" and first.params["timeoutSeconds"] == "3"
    assert transport.of("get")[0].params == {"limit": "1"}


async def test_an_event_past_the_fresh_version_ends_the_wait_and_deletions_count() -> None:
    transport = ScriptedTransport()
    transport.gets.append({"metadata": {"resourceVersion": "20"}, "items": []})
    transport.streams.append([_event("DELETED", "held", "12", finalizers=(FINALIZER,)),
                              _event("MODIFIED", "other", "25", finalizers=("x/y",))])
    held = project(_event("ADDED", "held", "9", finalizers=(FINALIZER,))["object"], CONFIGMAPS)
    caught = await catch_up(transport, CONFIGMAP_TYPE, MirrorView("10", {("n", "held"): held}, 100_000), keep=_keep,
                            accept="application/json", deadline=time.monotonic() + 5)
    assert caught.objects == [] and caught.resource_version == "25"


async def test_an_error_event_other_than_410_is_an_error_not_an_answer() -> None:
    transport = ScriptedTransport()
    transport.gets.append({"metadata": {"resourceVersion": "20"}, "items": []})
    transport.streams.append([{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}])
    with pytest.raises(APIStatusError, match="boom"):
        await catch_up(transport, CONFIGMAP_TYPE, MirrorView("10", {}, 100_000), keep=_keep,
                       accept="application/json", deadline=time.monotonic() + 5)


@given(st.integers(1, 10**30), st.integers(1, 10**30))
def test_resource_versions_compare_as_the_integers_they_are(a: int, b: int) -> None:
    assert compare_resource_versions(str(a), str(b)) == (a > b) - (a < b)


@pytest.mark.parametrize("version", ["", "0", "012", "12a", "-3", "١٢"])
def test_a_version_that_is_not_a_positive_integer_is_not_compared(version: str) -> None:
    with pytest.raises(CatchUpFailed, match="not a positive integer"):
        compare_resource_versions(version, "5")


async def test_a_cache_listing_beside_its_watch_is_not_read_at_a_version(cluster: RunningStandIn) -> None:
    """While a successor LISTs the type again (a condition changed), the store mixes its pages with the
    watched state: no single version describes it, so it is not caught up from (the LIST decides instead)."""
    async with gate(cluster) as (cache, _reader, _transport):
        assert cache.carriers(CONFIGMAPS, FINALIZER) is not None
        cluster.faults.add(r"/api/v1/configmaps$", watch=False, action="hang")

        def add_condition() -> None:
            stored = cluster.store.get(GroupResource("criticalsvc.io", "criticalservices"), "", "cleaner")
            assert stored is not None
            stored["spec"]["criteria"][0]["condition"] = "has(object.data)"
            cluster.store.update(stored)

        await cluster.write(add_condition)
        await eventually(lambda: CONFIGMAPS in cache.watches.successors, what="a successor listing configmaps")
        assert cache.carriers(CONFIGMAPS, FINALIZER) is None
        cluster.faults.clear()
        await eventually(lambda: cache.carriers(CONFIGMAPS, FINALIZER) is not None, timeout=10,
                         what="the successor took over and watches")
