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

import attrs
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubefakes import FakeAPI, eventually
from test_routing import ROOT, WIDGET, WIDGETS

from criticalsvc import protectionlabels, routing, webhookrouter
from criticalsvc import webhookconfigurations as configs
from criticalsvc.api import LABEL_VALUE, PROTECTED_LABEL, UPDATES_HELD_LABEL, GroupResource, parse_critical_service
from criticalsvc.cache.transport import APIStatusError, TransportError
from criticalsvc.objects import KubeObject
from criticalsvc.restmapper import RESTMapper
from criticalsvc.state import MemoryState
from criticalsvc.webhookrouter import CONFIGURATIONS, WebhookRouter

PROBE = "/api/v1/namespaces/criticalsvc-system/configmaps"


class RoutingAPI(FakeAPI):
    """FakeAPI with the API server's side of the probe: a dry-run CREATE of a shard's probe ConfigMap is denied by the
    probe webhook of that stored criticalsvc-providers shard (naming the digest in its path) once the informer has
    caught up, which takes `lag` probes of that shard after each write of it; before that it passes (201, nothing
    stored)."""

    def __init__(self) -> None:
        super().__init__()
        self.lag = 0
        self._behind: dict[int, int] = {}  # per shard, the probes still to pass

    def put(self, path: str, obj: Any) -> dict[str, Any]:
        if path in SHARD_PATHS:
            self._behind[SHARD_PATHS.index(path)] = self.lag
        return super().put(path, obj)

    def catch_up(self) -> None:
        self.lag, self._behind = 0, {}

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float, params: Any = (),
                   content_type: str = "application/json") -> Any:
        if verb == "POST" and path == PROBE and dict(params).get("dryRun") == "All":
            self.requests.append((verb, path, payload))
            self._fault(verb, path)
            # Only the probe webhook of the shard whose probe ConfigMap this is matches it.
            shard = [configs.probe_configmap(i) for i in range(configs.SHARDS)].index(payload["metadata"]["name"])
            digest = configs.probe_digest(self.objects.get(SHARD_PATHS[shard]))
            if digest is None or self._behind.get(shard, 0) > 0:
                self._behind[shard] = self._behind.get(shard, 0) - 1
                return payload
            raise APIStatusError(403, "Forbidden", f'admission webhook "{routing.PROBE_WEBHOOK}" denied the '
                                 f"request: {configs.probe_answer(digest)}")
        return await super().send(verb, path, payload, timeout=timeout, params=params, content_type=content_type)

SHIPPED = f"{CONFIGURATIONS}/{routing.SHIPPED_CONFIGURATION}"
SHARD_PATHS = [f"{CONFIGURATIONS}/{name}" for name in configs.CONFIGURATION_NAMES]
WIDGET_DELETE = routing.Route("DELETE", WIDGETS, None, "p")
WIDGET_SHARD = configs.shard_of(WIDGET_DELETE)
OWNED = SHARD_PATHS[WIDGET_SHARD]  # the configuration that holds the widget's routes
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
    probes = [p["metadata"]["name"] for p in api.sent("POST", PROBE)]
    assert probes.count(configs.probe_configmap(WIDGET_SHARD)) == 4, probes
    assert router.facts.enforced(widget_service()) and events == [] and router.facts.error is None
    assert routing.DELETE_WEBHOOK in routed(api)


@pytest.mark.anyio
async def test_the_facts_that_say_its_routes_live_already_hold_what_a_critical_service_needs():
    """CREATE -> Enforcing (issue 34): status reads the router's facts each time they change. The change that shows a
    new CriticalService's routes live already holds its needs (set with the routes written, before the probe), so the
    one status pass it starts says Enforcing; needs set only after the probe would make that pass say RoutePending
    ("not computed yet") and a second one, a pause later, Enforcing."""
    api = RoutingAPI()
    api.lag = 2
    api.put(SHIPPED, shipped())
    router, _events, _clock = router_over(api, widget_service())
    seen: list[routing.Routing] = []
    router.on_change = lambda: seen.append(router.facts)
    async with leading(router):
        await eventually(lambda: router.facts.enforced(widget_service()), what="the routes live")
    needed = routing.needed_routes(widget_service(), WIDGET)
    live = [facts for facts in seen if needed <= facts.live]
    assert live and live[0].needs_of(widget_service()) == needed, seen


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
        # Its routes are not live; another shard's (the widgets CRD's DELETE), untouched, stay so.
        await eventually(lambda: WIDGET_DELETE not in router.facts.live, what="its routes not live")
        assert router.facts.live
        api.catch_up()
        await eventually(lambda: WIDGET_DELETE in router.facts.live, what="the routes live again")


@pytest.mark.anyio
async def test_a_conflicting_write_is_read_again_and_written_at_the_next_round_without_an_error():
    """Someone (an older leader) wrote criticalsvc-providers in between: the PUT gets 409; the next round wins."""
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    api.put(OWNED, {**configs.render(frozenset(), {}, api.objects[SHIPPED], probe_namespace="criticalsvc-system",
                                     shard=WIDGET_SHARD).configuration})
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
    assert not set(SHARD_PATHS) & set(api.objects) and api.sent("POST", CONFIGURATIONS) == []
    assert events == [] and router.facts.live == frozenset() and router.facts.error is None


class StaleRoutingAPI(RoutingAPI):
    """An API server whose informer still holds the configuration before the last write: for `lag` probes after
    each write it answers with the older configuration's digest (a 403 from its probe webhook), not a 201."""

    def __init__(self) -> None:
        super().__init__()
        self._older: str | None = None

    def put(self, path: str, obj: Any) -> dict[str, Any]:
        if path in SHARD_PATHS:
            self._older = configs.probe_digest(self.objects.get(path))
        return super().put(path, obj)

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float, params: Any = (),
                   content_type: str = "application/json") -> Any:
        shard = WIDGET_SHARD
        if verb == "POST" and path == PROBE and payload["metadata"]["name"] == configs.probe_configmap(shard) \
                and self._behind.get(shard, 0) > 0 and self._older is not None:
            self.requests.append((verb, path, payload))
            self._behind[shard] -= 1
            raise APIStatusError(403, "Forbidden", f'admission webhook "{routing.PROBE_WEBHOOK}" denied the '
                                 f"request: {configs.probe_answer(self._older)}")
        return await super().send(verb, path, payload, timeout=timeout, params=params, content_type=content_type)


@pytest.mark.anyio
async def test_a_probe_answered_from_an_older_configuration_makes_only_its_routes_live():
    """A second CriticalService is written while the API server still routes the first one's configuration: the
    probe comes back with the older digest, so the first stays live and the second is not (Ready RoutePending)
    until the API server answers with the digest just written."""
    api = StaleRoutingAPI()
    api.put(SHIPPED, shipped())
    first = widget_service()
    # A name whose routes share the first one's configuration (an older version of that object is what lags).
    name = next(n for n in (f"q{i}" for i in range(100))
                if configs.shard_of(routing.Route("DELETE", WIDGETS, None, n)) == WIDGET_SHARD)
    second = parse_critical_service({"metadata": {"name": "w2"}, "spec": {
        "provider": {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": name},
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
        api.catch_up()
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


class OrderedAPI(RoutingAPI):
    """Records, at each write of shard 0 (criticalsvc-providers), which other shards are stored then."""

    def __init__(self) -> None:
        super().__init__()
        self.others_at_shard_0: list[set[str]] = []

    def put(self, path: str, obj: Any) -> dict[str, Any]:
        if path == SHARD_PATHS[0] and "resourceVersion" in (obj.get("metadata") or {}):  # the router's PUT
            self.others_at_shard_0.append({p for p in SHARD_PATHS[1:] if p in self.objects})
        return super().put(path, obj)


@pytest.mark.anyio
async def test_the_one_configuration_of_earlier_versions_drops_a_route_only_once_its_shard_is_stored():
    """Upgrading: criticalsvc-providers holds every route (as earlier versions wrote it). Its routes that belong in
    other shards leave it only once those shards are stored, so an API server holding the narrower one holds them
    too (one watch, in resourceVersion order); a sync whose first write fails leaves it whole."""
    services = [parse_critical_service({"metadata": {"name": f"w{i}"}, "spec": {
        "provider": {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": f"p{i}"},
        "criteria": [{"type": "SpecificResource",
                      "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}})
        for i in range(24)]
    api = OrderedAPI()
    api.put(SHIPPED, shipped())
    router, _events, clock = router_over(api, *services)
    everything = router.desired()
    needed = {SHARD_PATHS[configs.shard_of(r)] for r in everything.routes} - {SHARD_PATHS[0]}
    assert len(needed) >= 5
    api.put(SHARD_PATHS[0], configs.render(everything.routes, everything.types, api.objects[SHIPPED],
                                           probe_namespace="criticalsvc-system").configuration)
    api.faults[("POST", CONFIGURATIONS)] = [TransportError("connection refused")]
    async with leading(router):
        await eventually(lambda: router.syncs >= 1, what="the first sync, whose first write fails")
        clock.now += webhookrouter.RETRY
        await eventually(lambda: all(router.facts.enforced(cs) for cs in services), what="every route live")
    assert api.others_at_shard_0 and api.others_at_shard_0[0] >= needed, api.others_at_shard_0


# --- the router's memo of each CriticalService's routes --------------------------------------------------------
MEMO_NAMESPACES = ("a", "b")
DEPLOYMENTS_GR = GroupResource("apps", "deployments")


def memo_service(name: str, variant: int) -> Any:
    """One of a few CriticalServices named `name`: named or selected providers, built-in or custom, held or not."""
    ns = MEMO_NAMESPACES[variant % 2]
    provider: dict[str, Any] = ({"group": "apps", "resource": "deployments", "namespace": ns, "name": "p"}
                                if variant < 4 else
                                {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": f"w{variant % 2}"}
                                if variant < 6 else
                                {"group": "apps", "resource": "deployments", "namespace": ns,
                                 "selector": {"matchLabels": {"app": "x"}}})
    spec: dict[str, Any] = {"provider": provider, "criteria": [{"type": "SpecificResource", "specificResource": {
        "resource": "configmaps", "namespace": "x", "name": "y"}}]}
    if variant in (2, 3):
        spec["holdUpdates"] = "WhileBlocking"
    return parse_critical_service({"metadata": {"name": name}, "spec": spec})


memo_steps = st.lists(st.one_of(
    st.tuples(st.just("service"), st.sampled_from("stu"), st.integers(0, 7)),
    st.tuples(st.just("forget"), st.sampled_from("stu"), st.just(0)),
    st.tuples(st.just("status"), st.sampled_from("stu"), st.just(0)),
    st.tuples(st.just("label"), st.sampled_from(MEMO_NAMESPACES), st.booleans()),
    st.tuples(st.just("labelled"), st.just(""), st.booleans())), max_size=12)


@settings(max_examples=60, deadline=None)
@given(memo_steps)
@example([("labelled", "", True), ("service", "s", 0), ("label", "a", True), ("label", "a", False)])
def test_the_remembered_routes_are_those_computed_afresh(steps: list[tuple[str, str, Any]]) -> None:
    """After any sequence of CriticalServices created, changed and deleted, providers labelled and unlabelled, and
    the shipped configuration routing the labels or not, the router's desired() (which reuses what did not change)
    is routing.desired computed afresh on the same state (the oracle). A CriticalService's status written (the cache
    holds an equal object anew) leaves it the very same Desired: the round then splits and compares nothing."""
    router, _events, _clock = router_over(RoutingAPI())
    state = source_of(router).state
    for op, name, arg in steps:
        before = router.desired()
        if op == "status":
            stored = next((cs for cs in state.critical_services() if cs.name == name), None)
            if stored is not None:
                state.upsert_critical_service(attrs.evolve(stored))
                assert router.desired() is before
        elif op == "service":
            state.upsert_critical_service(memo_service(name, arg))
        elif op == "forget":
            state.remove_critical_service(name)
        elif op == "label":
            labels = {PROTECTED_LABEL: LABEL_VALUE, UPDATES_HELD_LABEL: LABEL_VALUE} if arg else {}
            state.upsert(KubeObject(DEPLOYMENTS_GR, name, "p", labels=labels))
        else:
            router.facts = attrs.evolve(router.facts, labelled=arg)
        carried = protectionlabels.carried_in(state) if router.facts.labelled else None
        afresh = routing.desired(state.critical_services(), router.mapper.lookup, carried)
        assert router.desired() == afresh, (op, name, arg)


@pytest.mark.anyio
async def test_a_round_that_waited_on_its_probe_does_not_delay_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    """CREATE -> Enforcing (issue 34): the first CriticalService's round waits about 0.8 s for the API server to
    route what it wrote (five probes pass first); a second one created right after is routed within a fraction of
    that, because the pause after a round is paced on the loop time it held, not on its length."""
    monkeypatch.setattr(webhookrouter, "POLL", 60.0)
    api = RoutingAPI()
    api.put(SHIPPED, shipped())
    api.lag = 5
    source = EventSource(widget_service())
    router = WebhookRouter(api, source, RESTMapper(), clock=Clock())
    router.mapper.add(WIDGET)
    second = parse_critical_service({"metadata": {"name": "w2"}, "spec": {
        "provider": {"group": WIDGETS.group, "resource": WIDGETS.resource, "name": "p2"},
        "criteria": [{"type": "SpecificResource",
                      "specificResource": {"resource": "configmaps", "namespace": "x", "name": "y"}}]}})
    async with leading(router):
        await eventually(lambda: router.facts.enforced(widget_service()), timeout=10, what="the first live")
        api.catch_up()
        started = asyncio.get_running_loop().time()
        source.add(second)
        await eventually(lambda: router.facts.enforced(second), timeout=10, what="the second live")
        took = asyncio.get_running_loop().time() - started
    assert took < 0.4, took
