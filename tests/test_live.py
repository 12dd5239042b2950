"""Live confirmation: an ALLOW stands only if a fresh read from the API server also allows."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubefakes import RunningStandIn, eventually, running_standin, started_cache, story_objects, story_store

from criticalsvc.admission import AdmissionRequest, parse_review
from criticalsvc.api import NAMESPACES, GroupResource, ObjectRef
from criticalsvc.cache import Backoff, CacheState, KubeTransport
from criticalsvc.decision import Rule, allow, decide
from criticalsvc.errors import StateUnavailable
from criticalsvc.live import LiveReader
from criticalsvc.livestate import LiveReadFailed, LiveState
from criticalsvc.restmapper import RESTMapper
from criticalsvc.server import Webhook

pytestmark = pytest.mark.anyio

FAST = Backoff(initial=0.01, maximum=0.05)
DEPLOYMENTS = GroupResource("apps", "deployments")
PROVIDER = ObjectRef(DEPLOYMENTS, "finalizer-namespace", "finalizer-deployment")
REVIEW = json.loads(Path("api/examples/reviews/delete-provider.json").read_text())
# Everything but the CRD and its finalized CRs: the provider's criteria are met.
MET = ("CustomResourceDefinition", "CoolResource")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def provider_delete() -> AdmissionRequest:
    return parse_review(REVIEW)


@pytest.fixture
def met() -> Iterator[RunningStandIn]:
    with running_standin(story_store(skip_kinds=MET)) as env:
        yield env


@contextlib.asynccontextmanager
async def reader_for(env: RunningStandIn, **options: Any) -> AsyncIterator[LiveReader]:
    from kubernetes.aio import client

    api = client.ApiClient(client.Configuration(host=env.url))
    try:
        yield LiveReader(KubeTransport(api), **options)
    finally:
        await api.close()


@contextlib.asynccontextmanager
async def cache_and_reader(env: RunningStandIn, **options: Any) -> AsyncIterator[tuple[CacheState, LiveReader]]:
    async with started_cache(env) as (cache, transport):
        yield cache, LiveReader(transport, mapper=cache.mapper, **options)


# --- the memo ---------------------------------------------------------------------------------------------
def test_live_state_collects_the_questions_a_decision_asks() -> None:
    """A run on an empty memo records what it needed and decides nothing final; a filled memo answers."""
    live = LiveState(mapper=RESTMapper())
    decide(provider_delete(), live)
    # Only the CriticalServices that could protect an object of that namespace, never the whole list.
    narrow = {("services-in", PROVIDER.namespace, "apps"), ("services-in", "", "apps")}
    assert live.missing == narrow
    answered = LiveState({key: [] for key in narrow}, mapper=RESTMapper())
    decision = decide(provider_delete(), answered)
    assert not answered.missing and decision.rule == Rule.UNPROTECTED


def test_a_failed_read_in_the_memo_makes_the_decision_unverifiable() -> None:
    """When the deciding path reaches a read that failed, the decision is the 'could not verify' denial."""
    failed = LiveReadFailed("a fresh read of the CriticalServices from the API server failed: 500", reason="error")
    live = LiveState({("services-in", "", "apps"): failed, ("services-in", PROVIDER.namespace, "apps"): []},
                     mapper=RESTMapper())
    decision = decide(provider_delete(), live)
    assert not decision.allowed and decision.rule == Rule.UNVERIFIABLE
    assert "could not verify" in decision.message and "500" in decision.message
    assert live.failure is failed and isinstance(failed, StateUnavailable)


# --- against the stand-in -------------------------------------------------------------------------------------
async def test_confirmation_allows_when_the_fresh_read_agrees(met: RunningStandIn) -> None:
    """With the criteria met on the API server too, the ALLOW stands, read without resourceVersion."""
    cached = decide(provider_delete(), met.store.state)
    assert cached.allowed and cached.protected
    async with reader_for(met) as reader:
        confirmation = await reader.confirmation(provider_delete(), cached)
    assert confirmation.confirmed and confirmation.decision.allowed
    assert confirmation.decision.rule == Rule.CRITERIA_MET and confirmation.rounds >= 2
    # Two narrow LISTs, each the CriticalServices of one provider namespace (the CRD's selectable field).
    lists = sorted(query for _m, path, query in met.faults.requests if path.endswith("/criticalservices"))
    assert [q for q in lists if "fieldSelector=spec.provider.namespace%3D" in q and "finalizer-namespace" in q]
    assert len(lists) == 2 and all("fieldSelector=spec.provider.namespace" in q for q in lists), lists
    assert all("resourceVersion" not in query for _m, _p, query in met.faults.requests)


async def test_a_critical_service_is_parsed_once_per_version_and_a_change_is_read(
        met: RunningStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each confirmation LISTs every CriticalService, but parses only those whose resourceVersion it has not
    seen (a parse is ~225 us, a real scale has 1,000 of them); an edited one is parsed again and decides."""
    from criticalsvc import api

    parses: list[str] = []
    real = api.parse_critical_service

    def counting(obj: Any, **kw: Any) -> Any:
        parses.append(obj["metadata"]["name"])
        return real(obj, **kw)

    monkeypatch.setattr(api, "parse_critical_service", counting)
    cached = decide(provider_delete(), met.store.state)
    assert cached.allowed and cached.protected
    async with reader_for(met) as reader:
        assert (await reader.confirm(provider_delete(), cached)).allowed
        assert parses == ["for-finalizer-deployment"]
        assert (await reader.confirm(provider_delete(), cached)).allowed
        assert parses == ["for-finalizer-deployment"]  # the same version: not parsed again
        edited = met.store.get(GroupResource("criticalsvc.io", "criticalservices"), "", "for-finalizer-deployment")
        assert edited is not None
        edited["spec"]["criteria"].append({"type": "SpecificResource", "specificResource": {
            "resource": "namespaces", "name": "finalizer-namespace"}})
        await met.write(lambda: met.store.update(edited))
        confirmed = await reader.confirm(provider_delete(), cached)
    assert parses == ["for-finalizer-deployment"] * 2
    assert not confirmed.allowed and "namespaces finalizer-namespace still exists" in confirmed.message


async def test_a_stale_cache_allow_becomes_a_deny_after_confirmation(met: RunningStandIn) -> None:
    """The cache missed a new CRD and its finalized CRs; the fresh read finds them and denies."""
    async with cache_and_reader(met) as (cache, reader):
        assert await cache.wait_ready(5)
        await eventually(lambda: all(r.watching for r in map(cache.reflector, cache.watched()) if r is not None))
        met.faults.add(r".*", watch=True, status=500)  # from now on the cache hears nothing
        met.drop_watches()
        await eventually(lambda: not any(r.watching for r in map(cache.reflector, cache.watched()) if r is not None))
        (crd,) = story_objects("CustomResourceDefinition")
        await met.write(lambda: met.store.create(crd))
        for cr in story_objects("CoolResource"):
            await met.write(lambda cr=cr: met.store.create(cr))
        stale = decide(provider_delete(), cache)
        assert stale.allowed and stale.protected  # the cache still believes the criteria are met
        confirmed = await reader.confirm(provider_delete(), stale)
    assert not confirmed.allowed and confirmed.rule == Rule.BLOCKED
    assert "still carry finalizer my.crd.group/super-important (3 objects" in confirmed.message
    assert met.faults.seen(r"^/apis/my\.crd\.group/v1$", watch=False) >= 1  # learned by fresh discovery


async def test_the_questions_the_cache_foresees_are_read_in_one_round(met: RunningStandIn) -> None:
    """With the cache to foresee them, the CriticalServices and their criteria's objects are read at once: one
    round of reads, where without it the criteria wait for the CriticalServices; the same decision."""
    async with cache_and_reader(met) as (cache, plain):
        assert await cache.wait_ready(5)
        foreseeing = LiveReader(plain.transport, mapper=cache.mapper, predict_from=cache)
        first = await plain.decide(provider_delete())
        reads = plain.reads
        foreseen = await foreseeing.decide(provider_delete())
    assert foreseen.decision == first.decision and foreseen.decision.allowed
    assert first.rounds >= 3 and foreseen.rounds == 1  # every question answered before the first run of decide
    assert foreseeing.reads == reads  # the same reads, sent together


async def test_a_stale_cache_foresees_too_little_and_the_rounds_ask_the_rest(met: RunningStandIn) -> None:
    """The cache missed a CRD and its finalized CRs: what it foresees is read first, the rounds read what it did
    not (the new type's discovery and objects), and the decision is the fresh one, a denial."""
    async with cache_and_reader(met) as (cache, _plain):
        assert await cache.wait_ready(5)
        reader = LiveReader(_plain.transport, mapper=cache.mapper, predict_from=cache)
        await eventually(lambda: all(r.watching for r in map(cache.reflector, cache.watched()) if r is not None))
        met.faults.add(r".*", watch=True, status=500)
        met.drop_watches()
        await eventually(lambda: not any(r.watching for r in map(cache.reflector, cache.watched()) if r is not None))
        (crd,) = story_objects("CustomResourceDefinition")
        await met.write(lambda: met.store.create(crd))
        for cr in story_objects("CoolResource"):
            await met.write(lambda cr=cr: met.store.create(cr))
        assert decide(provider_delete(), cache).allowed
        confirmation = await reader.decide(provider_delete())
    assert not confirmation.decision.allowed and confirmation.decision.rule == Rule.BLOCKED
    assert confirmation.rounds >= 2


async def test_confirmation_fails_closed_when_the_api_server_errors(met: RunningStandIn) -> None:
    """A 500 on a confirmation read raises StateUnavailable; decided live, it is the 'could not verify' denial."""
    failures: list[str] = []
    cached = decide(provider_delete(), met.store.state)
    met.faults.add(r"/criticalservices$", watch=False, status=500)
    async with reader_for(met, on_failure=failures.append) as reader:
        with pytest.raises(LiveReadFailed) as caught:
            await reader.confirm(provider_delete(), cached)
        assert caught.value.reason == "error" and "500 InternalError" in str(caught.value)
        live = await reader.decide(provider_delete())
    assert not live.decision.allowed and live.decision.rule == Rule.UNVERIFIABLE
    assert "could not verify" in live.decision.message
    assert failures == ["error", "error"]


async def test_confirmation_gives_up_within_its_budget(met: RunningStandIn) -> None:
    """An API server that does not answer makes the confirmation fail as a timeout within the budget."""
    cached = decide(provider_delete(), met.store.state)
    met.faults.add(r"/criticalservices$", watch=False, action="hang")
    async with reader_for(met, timeout=0.3) as reader:
        started = time.monotonic()
        with pytest.raises(LiveReadFailed) as caught:
            await reader.confirm(provider_delete(), cached)
        elapsed = time.monotonic() - started
    assert caught.value.reason == "timeout" and 0.25 <= elapsed < 1.5


async def test_only_allows_a_critical_service_had_a_say_in_are_read_again(met: RunningStandIn) -> None:
    """Denials and ALLOWs of unprotected objects come from the cache alone; nothing is read."""
    other = AdmissionRequest(uid="u2", group_resource=DEPLOYMENTS, operation="DELETE", name="web",
                             namespace="default", old_object={"metadata": {"name": "web", "namespace": "default"}})
    denial = decide(parse_review({**REVIEW, "request": {**REVIEW["request"], "oldObject": {"metadata": {
        "name": "finalizer-deployment", "labels": {"criticalsvc.io/deletion-protected": "Always"}}}}}),
        met.store.state)
    assert not denial.allowed
    async with reader_for(met) as reader:
        before = len(met.faults.requests)
        assert await reader.confirm(provider_delete(), denial) is denial
        unprotected = decide(other, met.store.state)
        assert unprotected.rule == Rule.UNPROTECTED
        assert await reader.confirm(other, unprotected) is unprotected
        assert len(met.faults.requests) == before
        namespace = AdmissionRequest(uid="u3", group_resource=NAMESPACES, operation="DELETE", name="default",
                                     namespace="default")
        assert reader.needs_confirmation(namespace, allow(Rule.UNPROTECTED))


# --- wired into the webhook --------------------------------------------------------------------------------
async def test_the_webhook_answers_503_before_sync_and_the_confirmed_decision_after(met: RunningStandIn) -> None:
    """Served by the real Webhook: 503 until the caches sync, then a fresh-read denial of a stale ALLOW."""
    met.faults.add(r"^/api/v1/namespaces$", watch=False, status=500)
    async with cache_and_reader(met) as (cache, reader):
        webhook = Webhook(cache, confirm=reader.confirm, needs_confirmation=reader.needs_confirmation)
        transport = httpx.ASGITransport(app=webhook.webhook_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as http:
            await eventually(lambda: cache.unsynced() == ["namespaces"], what="all but namespaces synced")
            first = await http.post("/validate", json=REVIEW)
            assert first.status_code == 503 and "namespaces" in first.json()["error"]
            met.faults.clear()
            assert await cache.wait_ready(5)
            assert (await http.post("/validate", json=REVIEW)).json()["response"]["allowed"] is True
            met.faults.add(r"/criticalservices$", watch=False, status=500)
            failed = (await http.post("/validate", json=REVIEW)).json()["response"]
            assert failed["allowed"] is False and "could not verify" in failed["status"]["message"]
            metrics = (await http.get("/metrics")).text
        assert 'criticalsvc_live_confirmation_failures_total{reason="error"} 1.0' in metrics
        assert 'criticalsvc_cache_objects{resource="namespaces"}' in metrics


async def test_a_selector_criterion_is_read_fresh_from_its_namespace_with_the_selector() -> None:
    """A Resources criterion is confirmed by a LIST of its namespace with labelSelector; a match denies."""
    store = story_store(skip_kinds=("CriticalService",))
    service = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "db"},
               "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                                     "name": "finalizer-deployment"},
                        "criteria": [{"type": "Resources", "resources": {
                            "group": "my.crd.group", "resource": "cool", "namespace": "cool-apps",
                            "selector": {"matchLabels": {"tier": "db"}}}}]}}
    store.create(service)
    stale = decide(provider_delete(), store.state)
    assert stale.allowed  # no CoolResource is labelled tier=db yet
    store.create({"apiVersion": "my.crd.group/v1", "kind": "CoolResource",
                  "metadata": {"name": "db-0", "namespace": "cool-apps", "labels": {"tier": "db"}}})
    with running_standin(store) as env:
        async with reader_for(env) as reader:
            confirmed = await reader.confirm(provider_delete(), stale)
        collection = "/apis/my.crd.group/v1/namespaces/cool-apps/coolresources"
        lists = [q for _m, p, q in env.faults.requests if p == collection]
    assert not confirmed.allowed and "coolresources.my.crd.group cool-apps/db-0" in confirmed.message
    assert lists and all("labelSelector=tier%3Ddb" in q for q in lists)


async def test_the_criticalservices_read_fresh_are_those_of_the_namespace_and_those_naming_none(
        met: RunningStandIn) -> None:
    """The fresh read asks the API server only for the CriticalServices whose provider is in the object's namespace
    or names none (the CRD's selectable field spec.provider.namespace): one selecting Deployments in every
    namespace, written after the cache decided, still refuses; one in another namespace is never sent."""
    cached = decide(provider_delete(), met.store.state)
    assert cached.allowed and cached.protected
    everywhere = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                  "metadata": {"name": "every-deployment"},
                  "spec": {"provider": {"group": "apps", "resource": "deployments", "selector": {}},
                           "criteria": [{"type": "SpecificResource", "specificResource": {
                               "resource": "namespaces", "name": "finalizer-namespace"}}]}}
    elsewhere = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "elsewhere"},
                 "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "cool-apps",
                                       "name": "other"},
                          "criteria": [{"type": "Finalizer", "finalizer": {
                              "group": "my.crd.group", "resource": "cool", "finalizer": "x.io/f"}}]}}
    for service in (everywhere, elsewhere):
        await met.write(lambda s=service: met.store.create(s))
    async with reader_for(met) as reader:
        confirmed = await reader.confirm(provider_delete(), cached)
    assert not confirmed.allowed and "every-deployment" in confirmed.message, confirmed.message
    lists = [q for _m, p, q in met.faults.requests if p == SERVICES_PATH]
    assert sorted(lists) == ["limit=500&fieldSelector=spec.provider.namespace%3D,spec.provider.group%3Dapps",
                             "limit=500&fieldSelector=spec.provider.namespace%3Dfinalizer-namespace,"
                             "spec.provider.group%3Dapps"], lists


async def test_a_crd_without_the_selectable_field_is_read_whole_and_filtered_here(met: RunningStandIn) -> None:
    """An API server holding the CRD from before its selectableFields answers the field selector 400 ("field label
    not supported"): the whole list is read instead, and the decision is the same."""
    cached = decide(provider_delete(), met.store.state)
    met.faults.add(r"/criticalservices$", watch=False, status=400, times=2)
    async with reader_for(met) as reader:
        confirmed = await reader.confirm(provider_delete(), cached)
    assert confirmed.allowed
    lists = [q for _m, p, q in met.faults.requests if p == SERVICES_PATH]
    assert sorted(lists) == ["limit=500", "limit=500",
                             "limit=500&fieldSelector=spec.provider.namespace%3D,spec.provider.group%3Dapps",
                             "limit=500&fieldSelector=spec.provider.namespace%3Dfinalizer-namespace,"
                             "spec.provider.group%3Dapps"], lists


# --- one read per question at a time --------------------------------------------------------------------
SERVICES_PATH = "/apis/criticalsvc.io/v1alpha1/criticalservices"
HELD_PATH = "/api/v1/namespaces/finalizer-namespace/configmaps/held"


def _service_waiting_for_held() -> dict[str, Any]:
    """A CriticalService on the reviewed provider, waiting for a ConfigMap that exists."""
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
            "metadata": {"name": "waits", "uid": "u-waits", "resourceVersion": "7"},
            "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                                  "name": "finalizer-deployment"},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "resource": "configmaps", "namespace": "finalizer-namespace", "name": "held"}}]}}


class HeldListTransport:
    """An API server whose LIST of CriticalServices answers with what was stored when the request came in,
    but only once the test releases it: a read in flight while the store changes."""

    def __init__(self) -> None:
        self.services: list[dict[str, Any]] = []
        self.lists = 0
        self.released = asyncio.Event()

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "") -> dict[str, Any]:
        if path == SERVICES_PATH:
            wanted = dict(f.partition("=")[::2] for f in dict(params).get("fieldSelector", "").split(",") if f)
            assert set(wanted) <= {"spec.provider.namespace", "spec.provider.group"}, wanted
            stored = [s for s in self.services if all(
                (s["spec"]["provider"].get(field.rsplit(".", 1)[1]) or "") == value for field, value in wanted.items())]
            answer = {"items": json.loads(json.dumps(stored)), "metadata": {}}  # as stored now
            self.lists += 1
            await self.released.wait()
            return answer
        if path == HELD_PATH:
            return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": "held", "namespace": "finalizer-namespace", "uid": "u-held", "resourceVersion": "3"}}
        raise AssertionError(f"unexpected read of {path}")

    def stream(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a confirmation does not watch")


async def _until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("timed out")


async def test_confirmations_asking_at_once_share_one_read_sent_after_they_began() -> None:
    """Eight confirmations that begin while a LIST of CriticalServices is in flight do not send eight more:
    they share the next one, sent when the first ends (a 100-stack teardown at 1,000 CriticalServices was
    held by such LISTs). Every confirmation decides, on a read sent after it began."""
    transport = HeldListTransport()
    transport.services = [_service_waiting_for_held()]
    reader = LiveReader(transport, mapper=RESTMapper())  # type: ignore[arg-type]
    first = asyncio.ensure_future(reader.decide(provider_delete()))
    await _until(lambda: transport.lists == 2)  # the two narrow LISTs (provider namespace, and none)
    rest = [asyncio.ensure_future(reader.decide(provider_delete())) for _ in range(8)]
    await asyncio.sleep(0.01)
    assert transport.lists == 2, "a read was sent while the same read was in flight"
    transport.released.set()
    confirmations = await asyncio.gather(first, *rest)
    assert transport.lists == 4 and reader.reads <= 6  # each LIST twice; the ConfigMap GETs shared likewise
    assert all(not c.decision.allowed and "still exists" in c.decision.message for c in confirmations)


async def test_a_confirmation_never_takes_a_read_sent_before_it_began() -> None:
    """A LIST in flight shows the cluster as it was when it was sent; a confirmation that began after a
    CriticalService appeared must not be answered by it, and refuses the deletion the new one protects."""
    transport = HeldListTransport()
    reader = LiveReader(transport, mapper=RESTMapper())  # type: ignore[arg-type]
    before = asyncio.ensure_future(reader.decide(provider_delete()))
    await _until(lambda: transport.lists == 2)
    transport.services = [_service_waiting_for_held()]  # written after the first LIST was answered
    after = asyncio.ensure_future(reader.decide(provider_delete()))
    await asyncio.sleep(0.01)
    transport.released.set()
    early, late = await asyncio.gather(before, after)
    assert early.decision.allowed and early.decision.rule == Rule.UNPROTECTED
    assert not late.decision.allowed and "still exists" in late.decision.message
    assert transport.lists == 4


async def test_a_refused_confirmation_is_remembered_for_status_until_one_succeeds(met: RunningStandIn) -> None:
    """A confirmation that fails is kept under the object whose DELETE it refused, with the read's error (the
    status writer shows it as Blocking CannotConfirm); the next one that succeeds forgets it."""
    cached = decide(provider_delete(), met.store.state)
    met.faults.add(r"/criticalservices$", watch=False, status=500)
    async with reader_for(met) as reader:
        with pytest.raises(LiveReadFailed):
            await reader.confirm(provider_delete(), cached)
        assert list(reader.refused) == [PROVIDER]
        assert "500" in reader.refused[PROVIDER].message and "CriticalServices" in reader.refused[PROVIDER].message
        met.faults.clear()
        assert (await reader.confirm(provider_delete(), cached)).allowed
        assert reader.refused == {} and reader.refused_changes == 2
