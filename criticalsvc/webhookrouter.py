"""Keeps the gate's own webhook configurations `criticalsvc-providers` (and its shards `-1` .. `-7`, configs.SHARDS)
current and live: the I/O around routing.py.

Only the leader writes (the status writer's Lease: `run(lambda: writer.leading)`, as the replayer). Every
POLL it computes the desired routes from the cached CriticalServices and the REST mapper (no request:
routing.desired is a pure function of the cache), and syncs when they changed, when the last sync failed
(after RETRY), and otherwise every RESYNC, because the shipped configuration's caBundle or clientConfig may
have changed (a renewed certificate, cert-manager's CA injection).

A sync GETs the owned shards whose routes changed (every shard at a resync) and the shipped configuration
(`--webhook-configuration`, default criticalsvc), renders each from its routes and the shipped one's settings,
and writes only those that differ (configs.same_configuration): a POST when it does not exist yet (and some
route is needed), else a PUT carrying the resourceVersion it read, so a concurrent writer makes it fail with
409 Conflict and the next round reads again. Shard 0 is written after the others (sync says why). The
shipped configuration is only read, never written: what the user applies stays exactly as applied (no drift
for a GitOps tool).

Then it probes each shard written: a dry-run CREATE of its configs.probe_configmap in the gate's namespace,
which only that configuration's probe webhook matches; the gate answers it with a denial naming the digest in
the path it was called on (criticalsvc/server.py). The digest of the shard just written coming back means the
API server routes all of it: its routes become `live`, and the CriticalServices they cover Enforcing. Until
then the probe is repeated (PROBE_BACKOFF, then every POLL): the API server's configuration informer is
usually a few milliseconds behind the write. A 2xx answer means "not routed yet" (the dry-run CREATE
passed without the gate); an error answer that is no probe's denial is reported like a failed sync.

`facts` (routing.Routing) is what status shows. A failure is logged, counted and reported once per distinct
error as a Warning Event on the shipped configuration; routes sent more broadly than needed are logged once
per change and counted (criticalsvc_broad_routes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from . import protectionlabels, routing
from . import webhookconfigurations as configs
from .api import CRDS, CRITICAL_SERVICES, NAMESPACES, CriticalService, GroupResource
from .cache.transport import APIError, APIStatusError, Sender
from .errors import StateUnavailable
from .events import object_event
from .logs import get_logger
from .metrics import Metrics
from .restmapper import ResourceType, RESTMapper
from .server import StateSource

log = get_logger("criticalsvc.routing")

POLL = 1.0  # the longest the leader waits between two rounds; a cache event (a CriticalService created) wakes it
# Between two rounds: a burst of events is one round, and a stream of them no busy loop (the pause is at least the
# loop time the round held, `busy`). At 0.1 s a new CriticalService whose ADD came just after a round (its
# predecessor's status written is an event too) waited it out before its routes were written (issue 34).
MIN_PAUSE = 0.02
RESYNC = 10.0  # ... and reads both configurations even when the routes did not change
RETRY = 3.0  # ... after a failed sync
REQUEST_TIMEOUT = 5.0
# After a write, the probe is sent again after each of these (about 1.5 s in all), then at every POLL: the
# API server's informer usually delivers the new configuration within milliseconds of the write.
PROBE_BACKOFF = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
REMEMBERED = 8  # digests of configurations this leader rendered, with their routes (a probe may name an older one)


@attrs.frozen
class _Remembered:
    """A CriticalService's routes, with what they were computed from (WebhookRouter.desired)."""

    service: CriticalService
    type: ResourceType
    stamp: Any
    key: routing.RouteKey
    routes: frozenset[routing.Route]


class WebhookRouter:
    def __init__(self, transport: Sender, source: StateSource, mapper: RESTMapper, *,
                 shipped: str = routing.SHIPPED_CONFIGURATION, namespace: str = "criticalsvc-system",
                 metrics: Metrics | None = None,
                 post_event: Callable[[dict[str, Any]], None] = lambda event: None,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.transport, self.source, self.mapper = transport, source, mapper
        self.shipped, self.namespace = shipped, namespace
        self.metrics = metrics if metrics is not None else Metrics()
        self.post_event, self.on_change, self.clock, self.sleep = post_event, on_change, clock, sleep
        self.facts = routing.Routing(managed=True)
        self.syncs = 0
        self.probes = 0
        # Per shard (configs.SHARDS configurations): the routes last synced (None: sync every shard at the next
        # round), (digest, routes) stored now, the routes seen live, the routes sent broadly, the probe digest as
        # last read.
        self._synced: tuple[frozenset[routing.Route], ...] | None = None
        self._next_sync = 0.0
        self._reported: str | None = None  # the error last reported as an Event
        self._written: dict[int, tuple[str, frozenset[routing.Route]]] = {}
        self._live: dict[int, frozenset[routing.Route]] = {}
        self._broad: dict[int, Mapping[routing.Route, str]] = {}
        self._stored_digest: dict[int, str | None] = {}
        self._rendered: dict[str, tuple[int, frozenset[routing.Route]]] = {}  # digest -> (shard, routes), newest last
        self._parted: tuple[routing.Desired, tuple[frozenset[routing.Route], ...]] | None = None
        self._broad_logged: Mapping[routing.Route, str] = {}
        # Each CriticalService's routes, by what they were computed from (`needed` in desired()): at 10,000,
        # computing them all took 0.1-0.35 s of the event loop (`python -m benchmarks protection`), once a second
        # while the router polled.
        self._routes: dict[str, _Remembered] = {}
        self._inputs: Any = None  # what the last desired() read, as one comparable value (`_inputs_now`)
        self._wanted: routing.Desired | None = None
        self._provider_types: list[GroupResource] = []
        self._stamped: list[tuple[GroupResource, str]] = []  # where desired() read the providers' labels (_inputs_now)
        self._rounded: routing.Desired | None = None  # what the last round started from
        self.busy = 0.0  # seconds of the event loop the last round held (its computing, not its awaiting)

    def desired(self) -> routing.Desired:
        state = self.source.state
        inputs = self._inputs_now(state)
        if inputs is not None and inputs == self._inputs and self._wanted is not None:
            return self._wanted  # not a CriticalService, a label, a provider type nor the mapper changed
        # Routes by name are dropped for the objects whose label is stored only once the shipped configuration
        # that routes the labels was read stored: an API server's webhook configurations arrive through one
        # watch, in resourceVersion order, so one that holds the narrower criticalsvc-providers written after
        # that read holds the shipped webhooks too, whatever its lag (design/routing.md, "No window").
        carried: routing.Carried | None = None
        if self.facts.labelled:
            carried = protectionlabels.carried_in(state)
        writes = getattr(state, "writes", None)
        counted = carried is not None and callable(writes)
        shared = (writes(NAMESPACES, ""), writes(CRDS, "")) if counted else None  # type: ignore[misc]
        # routing.desired, remembering each CriticalService's routes with what they were computed from: the same
        # object (the cache replaces a CriticalService it changes), the same served type, and the same counts of
        # writes where `carried` looks for its labels (its type in its namespace, namespaces, CRDs); a state that
        # does not count writes gets no memo where labels count. At 10,000 computing every route took 0.1-0.35 s of
        # the event loop (`python -m benchmarks protection`), and building and hashing a key per CriticalService
        # 0.1-0.2 s more, on the path of every new CriticalService to Enforcing.
        lookups: dict[GroupResource, ResourceType | None] = {}
        stamps: dict[tuple[GroupResource, str], Any] = {}
        stamped: list[tuple[GroupResource, str]] = []  # each served provider type and namespace labels were read in
        needs: dict[routing.RouteKey, frozenset[routing.Route]] = {}
        types: dict[GroupResource, ResourceType] = {}
        kept: dict[str, _Remembered] = {}
        services = state.critical_services()
        same = True  # ... and each CriticalService's routes are last round's
        for cs in services:
            gr = cs.provider.group_resource
            t = lookups[gr] if gr in lookups else lookups.setdefault(gr, self.mapper.lookup(gr))
            if t is None:
                continue  # not served: no request for it can come (routing.desired)
            stamp: Any = None
            if counted:
                where = (gr, cs.provider.namespace or "")
                stamp = stamps.get(where)
                if stamp is None:
                    stamp = stamps[where] = (writes(t.group_resource, where[1]), shared)  # type: ignore[misc]
                    stamped.append((t.group_resource, where[1]))
            known = self._routes.get(cs.name) if carried is None or counted else None
            if known is not None and (known.service is cs or known.service == cs) and \
                    (known.type is t or known.type == t) and known.stamp == stamp:
                # An equal object the cache read again (a relist) is remembered as itself: compared once, not at every
                # round from then on.
                kept[cs.name] = known if known.service is cs and known.type is t else \
                    attrs.evolve(known, service=cs, type=t)
            else:
                kept[cs.name] = _Remembered(cs, t, stamp, routing.route_key(cs), routing.needed_routes(cs, t, carried))
                same = same and known is not None and known.key == kept[cs.name].key and \
                    known.routes == kept[cs.name].routes
            types[t.group_resource] = t
            needs[kept[cs.name].key] = kept[cs.name].routes
        if same and len(kept) == len(self._routes) and self._wanted is not None and types == self._wanted.types:
            # The same routes as last time (a CriticalService's status written is a write of its type, every new one's
            # twice): the same Desired, so the round compares nothing and splits nothing into shards again.
            wanted = self._wanted
        else:
            wanted = routing.Desired(needs, types)
        self._routes, self._inputs, self._wanted = kept, inputs, wanted
        self._provider_types = sorted(lookups, key=str)
        self._stamped = stamped
        return wanted

    def _inputs_now(self, state: Any) -> Any:
        """Everything desired() reads, as counts of writes; None when the state does not count them."""
        writes = getattr(state, "writes", None)
        if not callable(writes) or self._wanted is None:
            return None
        # A provider type as spelt (served or not yet: a CRD created later) and as served; the labels on providers
        # only where the last desired() read them (its type in its namespace: a DELETE stream elsewhere, as of the
        # unprotected Deployments of a busy cluster, leaves the round alone instead of walking every CriticalService
        # once per event); the clock's RESYNC bucket for anything the counts miss.
        return (self.facts.labelled, writes(CRITICAL_SERVICES, None), writes(NAMESPACES, None), writes(CRDS, None),
                tuple(writes(gr, ns) for gr, ns in self._stamped),
                tuple(self.mapper.lookup(gr) for gr in self._provider_types), self.clock() // RESYNC)

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading() and self.source.ready:
                seen = getattr(self.source, "changes", None)
                try:
                    await self.round()
                except StateUnavailable:
                    pass  # the cache is re-syncing; the next round computes again
                except Exception:  # a round must never end the loop; the next one retries
                    log.exception("webhook route sync failed unexpectedly")
                    self._synced = None
                # Driven by the cache's events, not a poll: a CriticalService created wakes the next round at once,
                # so its routes are written within a watch event of its creation (issue 34: CREATE -> Enforcing).
                # Paced to at most half the loop under a steady stream of events: on the loop time the round held
                # (`busy`), not its length, which is mostly the API server's answers and the probe's backoff (at
                # 10,000 a new CriticalService then waited out the pause after the previous one's round).
                await self.sleep(max(MIN_PAUSE, self.busy))
                wait_event = getattr(self.source, "wait_event", None)
                settled = self._settled()
                if callable(wait_event) and settled and getattr(self.source, "changes", None) == seen:
                    await wait_event(POLL)
                elif callable(wait_event) and settled:
                    pass  # something changed during the round: the next one at once (an event then is not missed)
                else:
                    await self.sleep(POLL)  # a probe is due at every POLL until the routes are seen live
            else:
                self._synced = None  # a new leader reads and probes before trusting anything
                self._written, self._live, self._stored_digest = {}, {}, {}
                self._inputs = self._wanted = None
                if self.facts.live or self.facts.needs:
                    self._set_facts(routing.Routing(managed=True))
                await self.sleep(POLL)

    def _settled(self) -> bool:
        """Is everything written seen live (nothing to probe)?"""
        return all(routes <= self._live.get(shard, frozenset()) for shard, (_d, routes) in self._written.items())

    def _parts(self, wanted: routing.Desired) -> tuple[frozenset[routing.Route], ...]:
        if self._parted is None or self._parted[0] is not wanted:
            self._parted = (wanted, configs.partition(wanted.routes))
        return self._parted[1]

    async def round(self) -> None:
        """One leader round: sync when due, probe while what is written is not seen live."""
        held = time.perf_counter()
        wanted = self.desired()
        self.busy = time.perf_counter() - held  # the loop's time this round holds (the render adds its own)
        settled = self._settled()
        if wanted is self._rounded and self._synced is not None and self.clock() < self._next_sync and settled:
            return  # nothing changed since the last round: no comparison of 10,000 CriticalServices' routes either
        self._rounded = wanted
        if self._parts(wanted) != self._synced or self.clock() >= self._next_sync:
            await self.sync(wanted)
        elif not settled:
            await self._probe_unsettled(once=True)
        if wanted.needs != self.facts.needs:
            self._set_facts(attrs.evolve(self.facts, needs=dict(wanted.needs)))

    async def sync(self, wanted: routing.Desired) -> str:
        """Make the owned configurations route exactly `wanted`, then probe; returns the outcome (a metric label).

        Only the shards whose routes changed are read and written, every shard at each RESYNC. Shard 0 is written
        last: earlier versions kept every route in it (criticalsvc-providers), so it drops the routes another shard
        now holds only once that shard's write has committed. An API server's configurations arrive through one
        watch in resourceVersion order, so one that holds the narrower shard 0 holds them elsewhere, whatever its
        lag (design/routing.md, "No window")."""
        self.syncs += 1
        parts = self._parts(wanted)
        started = self.clock()  # the next RESYNC counts from the reads, not from the end of the writes and probes
        resync = self._synced is None or started >= self._next_sync
        due = [i for i in range(configs.SHARDS) if resync or parts[i] != self._synced[i]]  # type: ignore[index]
        try:
            outcome, rendered = await self._write(wanted, parts, due)
        except APIError as exc:
            conflict = isinstance(exc, APIStatusError) and exc.code == 409
            outcome = "conflict" if conflict else "failed"
            # The routes count as tried, so only the clock (or a change of routes) starts the next attempt: a
            # conflict at the next round, any other failure after RETRY rather than at every POLL. Every shard is
            # read again then, as at any resync (a shard written before the failure is found unchanged).
            self._synced, self._next_sync = parts, started + (0.0 if conflict else RETRY)
            self.metrics.webhook_route_syncs.labels(outcome).inc()
            if conflict:  # someone wrote in between: read again next round, no error to report
                log.info("webhook configuration changed while syncing; retried next round",
                         configuration=routing.PROVIDERS_CONFIGURATION, error=exc.message)
                return outcome
            log.warning("could not sync the provider routes", configuration=routing.PROVIDERS_CONFIGURATION,
                        error=exc.message, routes=[str(r) for r in sorted(wanted.routes, key=routing.Route.sort_key)])
            self._fail(exc.message, wanted)
            return outcome
        self._synced, self._next_sync = parts, started + RESYNC
        self.metrics.webhook_route_syncs.labels(outcome).inc()
        routes = sum(len(part) for part in parts)  # the shards hold each route once (Desired.routes is a union)
        self.metrics.provider_routes.set(routes)
        for r in rendered:
            self._written[r.shard] = (r.digest, parts[r.shard])
            self._rendered.pop(r.digest, None)
            self._rendered[r.digest] = (r.shard, parts[r.shard])
            self._broad[r.shard] = r.broad
            # Narrowing is immediate; widening waits for the probe.
            self._live[r.shard] = self._live.get(r.shard, frozenset()) & parts[r.shard]
        while len(self._rendered) > REMEMBERED * configs.SHARDS:
            self._rendered.pop(next(iter(self._rendered)))
        if not self._written:  # nothing needed and nothing stored: nothing to route, nothing to probe
            self._set_facts(routing.Routing(managed=True, needs=dict(wanted.needs), labelled=self.facts.labelled))
            return outcome
        if outcome != "unchanged":
            log.info("provider routes written", configuration=routing.PROVIDERS_CONFIGURATION, outcome=outcome,
                     shards=sorted(r.shard for r in rendered if r.digest != self._stored_digest.get(r.shard)),
                     digests={configs.configuration_name(r.shard): r.digest for r in rendered},
                     routes=routes)
        broad: dict[routing.Route, str] = {}
        for shard in self._written:
            broad.update(self._broad.get(shard, {}))
        self._note_broad(broad)
        self._reported = None
        self._set_facts(routing.Routing(managed=True, needs=dict(wanted.needs), written=self._all_written(),
                                        live=self._all_live(), labelled=self.facts.labelled, broad=broad))
        await self._probe_unsettled(once=False)
        return outcome

    def _all_written(self) -> frozenset[routing.Route]:
        return frozenset().union(*(routes for _d, routes in self._written.values()))

    def _all_live(self) -> frozenset[routing.Route]:
        return frozenset().union(*self._live.values())

    async def _write(self, wanted: routing.Desired, parts: tuple[frozenset[routing.Route], ...],
                     due: list[int]) -> tuple[str, list[configs.Rendered]]:
        """Read the `due` shards and the shipped configuration, write the shards that differ (shard 0 last):
        ("created" | "updated" | "unchanged", each due shard rendered, stored now or found so)."""

        async def read(shard: int) -> Mapping[str, Any] | None:
            try:
                return await self.transport.get(f"{CONFIGURATIONS}/{configs.configuration_name(shard)}",
                                                 timeout=REQUEST_TIMEOUT)
            except APIStatusError as exc:
                if not exc.not_found:
                    raise
                return None

        stored = dict(zip(due, await asyncio.gather(*(read(i) for i in due)), strict=True))
        for shard, found in stored.items():
            # Someone else's edit (or a deletion) makes what was seen live unknown: it is probed again.
            self._stored_digest[shard] = configs.probe_digest(found)
            written = self._written.get(shard)
            if written is None or self._stored_digest[shard] != written[0]:
                if self._live.pop(shard, None):
                    self._set_facts(attrs.evolve(self.facts, live=self._all_live()))
                self._written.pop(shard, None)
        # Read second: when the shipped configuration is gone (deleted to end an outage, or at uninstall), the
        # owned ones have gone with it, and status must say so rather than keep the routes last written.
        try:
            shipped = await self.transport.get(f"{CONFIGURATIONS}/{self.shipped}", timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if exc.not_found and self.facts.labelled:
                # Deleted (the way out of an outage, or the uninstall): its label webhooks went with it, so no label
                # routes anything now - status must not say Enforcing on their account.
                self._set_facts(attrs.evolve(self.facts, labelled=False))
            raise
        if routing.routes_labels(shipped) != self.facts.labelled:
            log.info("the shipped configuration routes the gate's labels" if not self.facts.labelled else
                     "the shipped configuration no longer routes the gate's labels", configuration=self.shipped)
            # Either way the routes change at the next round: narrower once the labels are routed, wider (every
            # name again) when an older shipped configuration was applied back.
            self._set_facts(attrs.evolve(self.facts, labelled=not self.facts.labelled))
        rendered: list[configs.Rendered] = []
        writes: list[tuple[int, str, dict[str, Any]]] = []
        held = time.perf_counter()
        for shard in due:
            if stored[shard] is None and not parts[shard]:
                self._written.pop(shard, None)
                continue  # created only once some route is needed (routing.py)
            try:
                r = configs.render(parts[shard], wanted.types, shipped, probe_namespace=self.namespace, shard=shard)
            except ValueError as exc:
                raise APIError(str(exc)) from exc
            rendered.append(r)
            if configs.same_configuration(stored[shard], r.configuration):
                continue
            found = stored[shard]
            if found is None:
                writes.append((shard, "created", r.configuration))
            else:
                writes.append((shard, "updated", configs.for_update(r.configuration, found)))
        self.busy += time.perf_counter() - held

        async def write(shard: int, verb: str, body: dict[str, Any]) -> str:
            if verb == "created":
                await self.transport.send("POST", CONFIGURATIONS, body, timeout=REQUEST_TIMEOUT)
            else:
                await self.transport.send("PUT", f"{CONFIGURATIONS}/{configs.configuration_name(shard)}", body,
                                          timeout=REQUEST_TIMEOUT)
            return verb

        # Every other shard at once, then shard 0 once they all committed (sync's docstring says why).
        outcomes = list(await asyncio.gather(*(write(*w) for w in writes if w[0] != 0)))
        outcomes += [await write(*w) for w in writes if w[0] == 0]
        outcome = "created" if "created" in outcomes else "updated" if outcomes else "unchanged"
        return outcome, rendered

    async def _probe_unsettled(self, *, once: bool) -> None:
        """Probe every shard whose written routes are not all seen live: once each, or (after a write) again after
        each PROBE_BACKOFF until it is."""

        async def until_live(shard: int) -> None:
            for delay in (0.0,) if once else (0.0, *PROBE_BACKOFF):
                if delay:
                    await self.sleep(delay)
                if await self.probe(shard):
                    return

        unsettled = [shard for shard, (_d, routes) in self._written.items()
                     if not routes <= self._live.get(shard, frozenset())]
        await asyncio.gather(*(until_live(shard) for shard in sorted(unsettled)))

    async def probe(self, shard: int = 0) -> bool:
        """One probe of `shard`; True once the API server routes what was last written there."""
        current = self._written.get(shard)
        if current is None:
            return False
        self.probes += 1
        configmap = configs.probe_configmap(shard)
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": configmap, "namespace": self.namespace}}
        try:
            await self.transport.send("POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body,
                                      params=[("dryRun", "All")], timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            digest = configs.digest_in(exc.message)
            if digest is None:
                self.metrics.routing_probes.labels("failed").inc()
                # One message for every shard's probe (one Event for one cause): their ConfigMaps share a prefix.
                self._fail(f"the routing probe (a dry-run CREATE of ConfigMap {self.namespace}/"
                           f"{routing.PROBE_CONFIGMAP}*) failed: {exc.message}", None)
                return False
        except APIError as exc:
            self.metrics.routing_probes.labels("failed").inc()
            self._fail(f"the routing probe failed: {exc.message}", None)
            return False
        else:
            self.metrics.routing_probes.labels("pending").inc()
            return False  # passed without reaching the gate: the API server does not route it yet
        found = self._rendered.get(digest)
        if found is None or found[0] != shard:
            self.metrics.routing_probes.labels("other").inc()
            return False  # a configuration this leader did not render (another writer): wait for ours
        self.metrics.routing_probes.labels("live").inc()
        seen, written = found[1], current[1]
        live = seen & written
        if live != self._live.get(shard, frozenset()) or self.facts.error:
            self._live[shard] = live
            log.info("provider routes live", configuration=configs.configuration_name(shard), digest=digest,
                     current=digest == current[0], routes=len(live))
            self._set_facts(attrs.evolve(self.facts, live=self._all_live(), error=None))
        return digest == current[0]

    def _fail(self, error: str, wanted: routing.Desired | None) -> None:
        # Live is what the API server was last seen routing of what is now stored: a failed write changes
        # nothing stored, so it stays; status says Enforcing only for routes seen live.
        facts = attrs.evolve(self.facts, error=error)
        if wanted is not None:
            facts = attrs.evolve(facts, needs=dict(wanted.needs))
        self._set_facts(facts)
        self._report(error)

    def _note_broad(self, broad: Mapping[routing.Route, str]) -> None:
        self.metrics.broad_routes.set(len(broad))
        if dict(broad) != dict(self._broad_logged):
            self._broad_logged = dict(broad)
            if broad:
                log.warning("some routes are sent more broadly than they need",
                            configuration=routing.PROVIDERS_CONFIGURATION,
                            broad={str(r): why for r, why in list(broad.items())[:10]}, count=len(broad))

    def _set_facts(self, facts: routing.Routing) -> None:
        if facts != self.facts:
            self.facts = facts
            self.on_change()  # the status writer shows it now, not at its next interval

    def _report(self, error: str) -> None:
        if error == self._reported:
            return
        self._reported = error
        involved = {"apiVersion": routing.ADMISSION_API_VERSION, "kind": routing.KIND, "name": self.shipped}
        self.post_event(object_event(
            involved=involved, reason="ProviderRoutingFailed", warning=True, now=time.time(),
            message=f"criticalsvc could not route its providers through ValidatingWebhookConfiguration "
                    f"{routing.PROVIDERS_CONFIGURATION}, so the DELETEs (and held UPDATEs) of some providers may "
                    f"not reach the gate: {error}"))
