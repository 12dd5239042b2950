"""The leader's webhook router (criticalsvc/webhookrouter.py) against a fake API server: what it writes and when.

test_routing.py checks the pure part (which rules, the rendered object); these drive the router's own
rounds (`run`, with POLL shortened and a hand-moved clock) over kubefakes.FakeAPI, which answers a PUT
carrying a stale resourceVersion with 409 Conflict as kube-apiserver does. What a user notices:

    a concurrent writer (409)      the routes are written at the next round; no Warning Event, no error in status
    a renewed caBundle             copied into criticalsvc-providers at the next resync, without a rule change
    a failing API server           one Warning Event per distinct error, not one per round
    no provider needing a route    criticalsvc-providers is never created
    the probe                      routes are live (and Ready may say Enforcing) only once a probe comes back
                                   with the digest of what was written; a configuration edited or deleted by
                                   someone else is probed again before it counts

`python -m tests.mutants` is the negative control: with any one of these behaviours removed, a test here fails.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from kubefakes import FakeAPI, eventually
from test_routing import ROOT, WIDGET, WIDGETS

from criticalsvc import routing, webhookrouter
from criticalsvc.api import parse_critical_service
from criticalsvc.cache.transport import APIStatusError, TransportError
from criticalsvc.restmapper import RESTMapper
from criticalsvc.state import MemoryState
from criticalsvc.webhookrouter import CONFIGURATIONS, WebhookRouter

PROBE = "/api/v1/namespaces/criticalsvc-system/configmaps"


class RoutingAPI(FakeAPI):
    """FakeAPI with the API server's side of the probe: a dry-run CREATE of the probe ConfigMap is denied by the
    probe webhook of the stored criticalsvc-providers (naming the digest in its path) once the informer has
    caught up, which takes `lag` probes after each write; before that it passes (201, nothing stored)."""

    def __init__(self) -> None:
        super().__init__()
        self.lag = 0
        self._behind = 0

    def put(self, path: str, obj: Any) -> dict[str, Any]:
        if path == OWNED:
            self._behind = self.lag
        return super().put(path, obj)

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float, params: Any = (),
                   content_type: str = "application/json") -> Any:
        if verb == "POST" and path == PROBE and dict(params).get("dryRun") == "All":
            self.requests.append((verb, path, payload))
            self._fault(verb, path)
            digest = routing.probe_digest(self.objects.get(OWNED))
            if digest is None or self._behind > 0:
                self._behind -= 1
                return payload
            raise APIStatusError(403, "Forbidden", f'admission webhook "{routing.PROBE_WEBHOOK}" denied the '
                                 f"request: {routing.probe_answer(digest)}")
        return await super().send(verb, path, payload, timeout=timeout, params=params, content_type=content_type)

SHIPPED = f"{CONFIGURATIONS}/{routing.SHIPPED_CONFIGURATION}"
OWNED = f"{CONFIGURATIONS}/{routing.PROVIDERS_CONFIGURATION}"
OLD_CA, NEW_CA = "b2xkLWNh", "bmV3LWNh"


def shipped(ca: str = OLD_CA) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((ROOT / "deploy/base/webhook.yaml").read_text())
    for webhook in config["webhooks"]:
        webhook["clientConfig"]["caBundle"] = ca
    return config


def widget_service() -> Any:
    """A CriticalService whose provider is a custom resource: its DELETEs need a route of the gate's own."""
    return parse_critical_service({"metadata": {"name": "w"}, "spec": {
        "provider": {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": "p"},
        "criteria": [{"type": "SpecificResource",
                      "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}})


def unserved_service() -> Any:
    """... and one whose provider's type is not served: no request for it can come, nothing to route."""
    return parse_critical_service({"metadata": {"name": "d"}, "spec": {
        "provider": {"group": "nope.example.com", "resource": "things", "namespace": "app", "name": "p"},
        "criteria": [{"type": "SpecificResource",
                      "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}})


class Source:
    """The cache; `rounds` counts the router's rounds (each asks `ready` once)."""

    def __init__(self, *services: Any) -> None:
        self.state = MemoryState()
        for cs in services:
            self.state.upsert_critical_service(cs)
        self.rounds = 0

    @property
    def ready(self) -> bool:
        self.rounds += 1
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def fast_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhookrouter, "POLL", 0.005)


@contextlib.asynccontextmanager
async def leading(router: Any) -> AsyncIterator[None]:
    """`router` (or any leader-only loop with `run(leading)`: the labeller too) running as the leader."""
    task = asyncio.create_task(router.run(lambda: True))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def router_over(api: RoutingAPI, *services: Any) -> tuple[WebhookRouter, list[dict[str, Any]], Clock]:
    mapper = RESTMapper()
    mapper.add(WIDGET)
    events: list[dict[str, Any]] = []
    clock = Clock()
    return WebhookRouter(api, Source(*services), mapper, post_event=events.append, clock=clock), events, clock


def source_of(router: WebhookRouter) -> Source:
    assert isinstance(router.source, Source)
    return router.source


def routed(api: FakeAPI) -> list[str]:
    """The webhooks stored in criticalsvc-providers, by name."""
    return [w["name"] for w in (api.objects.get(OWNED) or {}).get("webhooks") or []]


WIDGET_DELETE = routing.Route("DELETE", WIDGETS, None, "p")


@pytest.mark.anyio
async def test_routes_are_live_only_once_the_probe_returns_the_digest_written():
    """The API server's informer lags the write by three probes: until then nothing is live (Ready says
    RoutePending); then the widget's routes are, with no error and no Event."""
    api = RoutingAPI()
    api.lag = 3
    api.put(SHIPPED, shipped())
    router, events, _clock = router_over(api, widget_service())
    async with leading(router):
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes live")
    probes = api.sent("POST", PROBE)
    assert len(probes) == 4 and all(p["metadata"]["name"] == routing.PROBE_CONFIGMAP for p in probes)
    assert router.facts.enforced(widget_service()) and events == [] and router.facts.error is None
    assert routing.DELETE_WEBHOOK in routed(api)


@pytest.mark.anyio
async def test_a_resync_of_a_configuration_seen_live_sends_no_probe():
    """Idle cost: once live, a resync that finds the configuration unchanged reads it and probes nothing."""
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    router, _events, clock = router_over(api, widget_service())
    async with leading(router):
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes live")
        probes, syncs = len(api.sent("POST", PROBE)), router.syncs
        for n in range(1, 4):
            clock.now += webhookrouter.RESYNC
            await eventually(lambda n=n: router.syncs >= syncs + n, what=f"resync {n}")
    assert len(api.sent("POST", PROBE)) == probes and WIDGET_DELETE in router.facts.live


@pytest.mark.anyio
async def test_a_probe_that_cannot_be_sent_is_an_error_and_nothing_is_live():
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    api.faults[("POST", PROBE)] = [APIStatusError(403, "Forbidden", "cannot create configmaps")] * 1000
    router, events, _clock = router_over(api, widget_service())
    async with leading(router):
        await eventually(lambda: router.facts.error is not None, what="the probe's failure")
    assert "cannot create configmaps" in (router.facts.error or "") and router.facts.live == frozenset()
    assert [e["reason"] for e in events] == ["ProviderRoutingFailed"]


@pytest.mark.anyio
async def test_a_configuration_deleted_by_someone_else_is_not_live_until_written_and_probed_again():
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    router, _events, clock = router_over(api, widget_service())
    async with leading(router):
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes live")
        api.lag = 1000  # the informer stops catching up
        del api.objects[OWNED]
        clock.now += webhookrouter.RESYNC
        await eventually(lambda: OWNED in api.objects, what="the configuration written again")
        await eventually(lambda: router.facts.live == frozenset(), what="nothing live")
        api.lag = 0
        api._behind = 0
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes live again")


@pytest.mark.anyio
async def test_a_conflicting_write_is_read_again_and_written_at_the_next_round_without_an_error():
    """Someone (an older leader) wrote criticalsvc-providers in between: the PUT gets 409; the next round wins."""
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    api.put(OWNED, {**routing.render(routing.Desired({}, {}), api.objects[SHIPPED],
                                     probe_namespace="criticalsvc-system").configuration})
    api.faults[("PUT", OWNED)] = [APIStatusError(409, "Conflict", "the object has been modified")]
    router, events, _clock = router_over(api, widget_service())
    facts: list[routing.Routing] = []
    router.on_change = lambda: facts.append(router.facts)
    async with leading(router):
        await eventually(lambda: routing.DELETE_WEBHOOK in routed(api), what="the routes written after the conflict")
    assert len(api.sent("PUT", OWNED)) == 2
    assert events == [] and router.facts.error is None
    assert all(f.error is None for f in facts), facts  # status never showed the conflict as a failure


@pytest.mark.anyio
async def test_a_renewed_ca_bundle_is_copied_at_the_next_resync_though_no_rule_changed():
    api = RoutingAPI()
    api.put(SHIPPED, shipped(OLD_CA))
    router, events, clock = router_over(api, widget_service())
    source = source_of(router)
    async with leading(router):
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the first write, live")
        assert {w["clientConfig"]["caBundle"] for w in api.objects[OWNED]["webhooks"]} == {OLD_CA}
        api.put(SHIPPED, shipped(NEW_CA))  # cert-manager's CA injector, or `criticalsvc manifests` re-applied
        reads, rounds = len(api.sent("GET", SHIPPED)), source.rounds
        await eventually(lambda: source.rounds >= rounds + 10, what="ten more rounds")
        assert len(api.sent("GET", SHIPPED)) == reads  # before RESYNC nothing is read (the routes did not change)
        clock.now += webhookrouter.RESYNC
        await eventually(lambda: {w["clientConfig"]["caBundle"] for w in api.objects[OWNED]["webhooks"]} == {NEW_CA},
                         what="the new caBundle in criticalsvc-providers")
    assert events == []


@pytest.mark.anyio
async def test_a_failing_api_server_is_reported_by_one_event_per_distinct_error():
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    down = TransportError(f"GET {OWNED}: connection refused")
    forbidden = APIStatusError(403, "Forbidden", "cannot get validatingwebhookconfigurations")
    api.faults[("GET", OWNED)] = [down] * 5 + [forbidden] * 5 + [down] * 5
    router, events, clock = router_over(api, widget_service())
    async with leading(router):
        for attempt in range(1, 16):  # each failure waits RETRY (on the test's clock) before the next read
            await eventually(lambda n=attempt: router.syncs >= n, what=f"attempt {attempt}")
            clock.now += webhookrouter.RETRY
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes once the API server answers")
    assert len(api.sent("GET", OWNED)) >= 16  # every failed attempt read again
    assert [(e["reason"], e["type"]) for e in events] == [("ProviderRoutingFailed", "Warning")] * 3
    assert ["connection refused" in e["message"] for e in events] == [True, False, True]
    assert "cannot get validatingwebhookconfigurations" in events[1]["message"]
    assert router.facts.error is None


@pytest.mark.anyio
async def test_a_failed_sync_is_tried_again_after_retry_not_at_every_round():
    """An API server that refuses is read once per RETRY, not once per POLL (20 reads a minute, not 60)."""
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    api.faults[("GET", OWNED)] = [TransportError(f"GET {OWNED}: connection refused")] * 100
    router, _events, clock = router_over(api, widget_service())
    async with leading(router):
        await eventually(lambda: router.syncs >= 1, what="a first attempt")
        rounds = source_of(router).rounds
        await eventually(lambda: source_of(router).rounds >= rounds + 20, what="twenty more rounds")
        assert router.syncs == 1, "a failed sync was tried again before RETRY passed"
        clock.now += webhookrouter.RETRY
        await eventually(lambda: router.syncs >= 2, what="the attempt after RETRY")


@pytest.mark.anyio
async def test_nothing_is_created_while_no_provider_needs_a_route():
    """A provider whose type is not served needs no route: no criticalsvc-providers object appears."""
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    router, events, clock = router_over(api, unserved_service())
    async with leading(router):
        await eventually(lambda: router.syncs >= 1, what="a first sync")
        clock.now += webhookrouter.RESYNC
        await eventually(lambda: router.syncs >= 2, what="a resync")
    assert OWNED not in api.objects and api.sent("POST", CONFIGURATIONS) == [] and api.sent("PUT", OWNED) == []
    assert events == [] and router.facts.live == frozenset() and router.facts.error is None


class StaleRoutingAPI(RoutingAPI):
    """An API server whose informer still holds the configuration before the last write: for `lag` probes after
    each write it answers with the older configuration's digest (a 403 from its probe webhook), not a 201."""

    def __init__(self) -> None:
        super().__init__()
        self._older: str | None = None

    def put(self, path: str, obj: Any) -> dict[str, Any]:
        if path == OWNED:
            self._older = routing.probe_digest(self.objects.get(OWNED))
        return super().put(path, obj)

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float, params: Any = (),
                   content_type: str = "application/json") -> Any:
        if verb == "POST" and path == PROBE and self._behind > 0 and self._older is not None:
            self.requests.append((verb, path, payload))
            self._behind -= 1
            raise APIStatusError(403, "Forbidden", f'admission webhook "{routing.PROBE_WEBHOOK}" denied the '
                                 f"request: {routing.probe_answer(self._older)}")
        return await super().send(verb, path, payload, timeout=timeout, params=params, content_type=content_type)


@pytest.mark.anyio
async def test_a_probe_answered_from_an_older_configuration_makes_only_its_routes_live():
    """A second CriticalService is written while the API server still routes the first one's configuration: the
    probe comes back with the older digest, so the first stays live and the second is not (Ready RoutePending)
    until the API server answers with the digest just written."""
    api = StaleRoutingAPI()
    api.put(SHIPPED, shipped())
    first = widget_service()
    second = parse_critical_service({"metadata": {"name": "w2"}, "spec": {
        "provider": {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": "q"},
        "criteria": [{"type": "SpecificResource",
                      "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}})
    router, _events, _clock = router_over(api, first)
    async with leading(router):
        await eventually(lambda: router.facts.enforced(first), what="the first CriticalService's routes live")
        api.lag = 1000  # from now on the API server answers with the configuration before each write
        source_of(router).state.upsert_critical_service(second)
        await eventually(lambda: len(router.facts.written) == 2, what="the second written")
        probes = len(api.sent("POST", PROBE))
        await eventually(lambda: len(api.sent("POST", PROBE)) >= probes + 3, what="three more probes")
        assert router.facts.enforced(first) and not router.facts.enforced(second)
        api.lag, api._behind = 0, 0
        await eventually(lambda: router.facts.enforced(second), what="the second live once the digest is its own")


class EventSource(Source):
    """A cache that wakes its waiters on each change, as CacheManager.wait_event does."""

    def __init__(self, *services: Any) -> None:
        super().__init__(*services)
        self._changed = asyncio.Event()
        self.changes = 0
        self.waits = 0  # how often a waiter waited for the next change

    def add(self, cs: Any) -> None:
        self.state.upsert_critical_service(cs)
        self.changes += 1
        self._changed.set()

    async def wait_event(self, timeout: float) -> bool:
        self.waits += 1
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
                return True
        return False


@pytest.mark.anyio
async def test_a_new_critical_service_is_routed_at_its_cache_event_not_at_the_next_poll(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CREATE -> Enforcing (issue 34): the router's round follows the cache event of a new CriticalService. With
    the poll stretched to a minute, its route is written and live within seconds only because the event woke it."""
    monkeypatch.setattr(webhookrouter, "POLL", 60.0)
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    source = EventSource(unserved_service())
    router = WebhookRouter(api, source, RESTMapper(), clock=Clock())
    router.mapper.add(WIDGET)
    async with leading(router):
        await eventually(lambda: router.syncs >= 1 and source.waits >= 1, what="the first round, then a wait")
        source.add(widget_service())
        await eventually(lambda: WIDGET_DELETE in router.facts.live, timeout=10, what="the new route live")
    assert routing.DELETE_WEBHOOK in routed(api)
