"""Keeps the gate's own webhook configuration `criticalsvc-providers` current and live: the I/O around routing.py.

Only the leader writes (the status writer's Lease: `run(lambda: writer.leading)`, as the replayer). Every
POLL it computes the desired routes from the cached CriticalServices and the REST mapper (no request:
routing.desired is a pure function of the cache), and syncs when they changed, when the last sync failed
(after RETRY), and otherwise every RESYNC, because the shipped configuration's caBundle or clientConfig may
have changed (a renewed certificate, cert-manager's CA injection).

A sync GETs the shipped configuration (`--webhook-configuration`, default criticalsvc) and the owned one,
renders the owned one from the routes and the shipped one's settings, and writes only when they differ
(routing.same_configuration): a POST when it does not exist yet (and some route is needed), else a PUT
carrying the resourceVersion it read, so a concurrent writer makes it fail with 409 Conflict and the next
round reads again. The shipped configuration is only read, never written: what the user applies stays
exactly as applied (no drift for a GitOps tool).

Then it probes: a dry-run CREATE of routing.PROBE_CONFIGMAP in the gate's namespace, which only the
configuration's probe webhook matches; the gate answers it with a denial naming the digest in the path it
was called on (criticalsvc/server.py). The digest of the configuration just written coming back means the
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
MIN_PAUSE = 0.1  # between two rounds: a burst of events is one round, and a stream of them no busy loop
RESYNC = 10.0  # ... and reads both configurations even when the routes did not change
RETRY = 3.0  # ... after a failed sync
REQUEST_TIMEOUT = 5.0
# After a write, the probe is sent again after each of these (about 1.5 s in all), then at every POLL: the
# API server's informer usually delivers the new configuration within milliseconds of the write.
PROBE_BACKOFF = (0.02, 0.05, 0.1, 0.2, 0.4, 0.8)
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
REMEMBERED = 8  # digests of configurations this leader rendered, with their routes (a probe may name an older one)


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
        self._synced: frozenset[routing.Route] | None = None  # None: sync at the next round
        self._next_sync = 0.0
        self._reported: str | None = None  # the error last reported as an Event
        self._written: tuple[str, frozenset[routing.Route]] | None = None  # (digest, routes) stored now
        self._rendered: dict[str, frozenset[routing.Route]] = {}  # digest -> routes, newest last
        self._broad_logged: Mapping[routing.Route, str] = {}
        self._stored_digest: str | None = None  # the probe digest of the owned configuration as last read
        # Each CriticalService's routes, by what they were computed from (`needed` in desired()): at 10,000,
        # computing them all took 0.1-0.35 s of the event loop (`python -m benchmarks protection`), once a second
        # while the router polled.
        self._routes: dict[Any, frozenset[routing.Route]] = {}
        self._inputs: Any = None  # what the last desired() read, as one comparable value (`_inputs_now`)
        self._wanted: routing.Desired | None = None
        self._provider_types: list[GroupResource] = []
        self._rounded: routing.Desired | None = None  # what the last round started from

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
        kept: dict[Any, frozenset[routing.Route]] = {}

        def needed(cs: CriticalService, t: ResourceType) -> frozenset[routing.Route]:
            stamp: Any = None
            if carried is not None:
                if not callable(writes):
                    return routing.needed_routes(cs, t, carried)
                # What `carried` reads for cs: its provider (among its type's objects in its namespace), its
                # namespace, its CRD. The same counts of writes there, the same labels stored.
                stamp = (writes(t.group_resource, cs.provider.namespace or ""), writes(NAMESPACES, ""),
                         writes(CRDS, ""))
            key = (routing.route_key(cs), t, stamp)
            found = self._routes.get(key)
            if found is None:
                found = routing.needed_routes(cs, t, carried)
            kept[key] = found
            return found

        services = state.critical_services()
        wanted = routing.desired(services, self.mapper.lookup, carried, needed=needed)
        self._routes, self._inputs, self._wanted = kept, inputs, wanted
        self._provider_types = sorted({cs.provider.group_resource for cs in services}, key=str)
        return wanted

    def _inputs_now(self, state: Any) -> Any:
        """Everything desired() reads, as counts of writes; None when the state does not count them."""
        writes = getattr(state, "writes", None)
        if not callable(writes) or self._wanted is None:
            return None
        # A provider type as spelt (served or not yet: a CRD created later) and as served; the clock's RESYNC
        # bucket for anything the counts miss.
        served = sorted(self._wanted.types, key=str)
        return (self.facts.labelled, writes(CRITICAL_SERVICES, None), writes(NAMESPACES, None), writes(CRDS, None),
                tuple(writes(gr, None) for gr in served), tuple(self.mapper.lookup(gr) for gr in self._provider_types),
                self.clock() // RESYNC)

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading() and self.source.ready:
                started, seen = time.perf_counter(), getattr(self.source, "changes", None)
                try:
                    await self.round()
                except StateUnavailable:
                    pass  # the cache is re-syncing; the next round computes again
                except Exception:  # a round must never end the loop; the next one retries
                    log.exception("webhook route sync failed unexpectedly")
                    self._synced = None
                # Driven by the cache's events, not a poll: a CriticalService created wakes the next round at once,
                # so its routes are written within a watch event of its creation (issue 34: CREATE -> Enforcing).
                # Paced to at most half the loop under a steady stream of events.
                await self.sleep(max(MIN_PAUSE, time.perf_counter() - started))
                wait_event = getattr(self.source, "wait_event", None)
                settled = self._written is None or self._written[1] <= self.facts.live
                if callable(wait_event) and settled and getattr(self.source, "changes", None) == seen:
                    await wait_event(POLL)
                elif callable(wait_event) and settled:
                    pass  # something changed during the round: the next one at once (an event then is not missed)
                else:
                    await self.sleep(POLL)  # a probe is due at every POLL until the routes are seen live
            else:
                self._synced, self._written = None, None  # a new leader reads and probes before trusting anything
                self._inputs = self._wanted = None
                if self.facts.live or self.facts.needs:
                    self._set_facts(routing.Routing(managed=True))
                await self.sleep(POLL)

    async def round(self) -> None:
        """One leader round: sync when due, probe while what is written is not seen live."""
        wanted = self.desired()
        settled = self._written is None or self._written[1] <= self.facts.live
        if wanted is self._rounded and self._synced is not None and self.clock() < self._next_sync and settled:
            return  # nothing changed since the last round: no comparison of 10,000 CriticalServices' routes either
        self._rounded = wanted
        if wanted.routes != self._synced or self.clock() >= self._next_sync:
            await self.sync(wanted)
        elif self._written is not None and not self._written[1] <= self.facts.live:
            await self.probe()
        if wanted.needs != self.facts.needs:
            self._set_facts(attrs.evolve(self.facts, needs=dict(wanted.needs)))

    async def sync(self, wanted: routing.Desired) -> str:
        """Make the owned configuration route exactly `wanted`, then probe; returns the outcome (a metric label)."""
        self.syncs += 1
        self._stored_digest = None
        try:
            outcome, rendered = await self._write(wanted)
        except APIError as exc:
            conflict = isinstance(exc, APIStatusError) and exc.code == 409
            outcome = "conflict" if conflict else "failed"
            # The routes count as tried, so only the clock (or a change of routes) starts the next attempt: a
            # conflict at the next round, any other failure after RETRY rather than at every POLL.
            self._synced, self._next_sync = wanted.routes, self.clock() + (0.0 if conflict else RETRY)
            self.metrics.webhook_route_syncs.labels(outcome).inc()
            if conflict:  # someone wrote in between: read again next round, no error to report
                log.info("webhook configuration changed while syncing; retried next round",
                         configuration=routing.PROVIDERS_CONFIGURATION, error=exc.message)
                return outcome
            log.warning("could not sync the provider routes", configuration=routing.PROVIDERS_CONFIGURATION,
                        error=exc.message, routes=[str(r) for r in sorted(wanted.routes, key=routing.Route.sort_key)])
            self._fail(exc.message, wanted)
            return outcome
        self._synced, self._next_sync = wanted.routes, self.clock() + RESYNC
        self.metrics.webhook_route_syncs.labels(outcome).inc()
        self.metrics.provider_routes.set(len(wanted.routes))
        if rendered is None:  # nothing needed and nothing stored: nothing to route, nothing to probe
            self._written = None
            self._set_facts(routing.Routing(managed=True, needs=dict(wanted.needs), labelled=self.facts.labelled))
            return outcome
        self._written = (rendered.digest, wanted.routes)
        self._rendered.pop(rendered.digest, None)
        self._rendered[rendered.digest] = wanted.routes
        while len(self._rendered) > REMEMBERED:
            self._rendered.pop(next(iter(self._rendered)))
        if outcome != "unchanged":
            log.info("provider routes written", configuration=routing.PROVIDERS_CONFIGURATION, outcome=outcome,
                     digest=rendered.digest, routes=len(wanted.routes))
        self._note_broad(rendered.broad)
        self._reported = None
        live = self.facts.live & wanted.routes  # narrowing is immediate; widening waits for the probe
        self._set_facts(routing.Routing(managed=True, needs=dict(wanted.needs), written=wanted.routes, live=live,
                                        labelled=self.facts.labelled,
                                        broad=dict(rendered.broad)))
        if outcome == "unchanged" and wanted.routes <= live:
            return outcome  # a resync that found the configuration seen live: nothing new to probe
        for delay in (0.0, *PROBE_BACKOFF):
            if delay:
                await self.sleep(delay)
            if await self.probe():
                break
        return outcome

    async def _write(self, wanted: routing.Desired) -> tuple[str, routing.Rendered | None]:
        path = f"{CONFIGURATIONS}/{routing.PROVIDERS_CONFIGURATION}"
        try:
            stored: Mapping[str, Any] | None = await self.transport.get(path, timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if not exc.not_found:
                raise
            stored = None
        # Someone else's edit (or a deletion) makes what was seen live unknown: it is probed again.
        self._stored_digest = routing.probe_digest(stored)
        if self._written is None or self._stored_digest != self._written[0]:
            self._set_facts(attrs.evolve(self.facts, live=frozenset()))
        # Read second: when the shipped configuration is gone (deleted to end an outage, or at uninstall), the
        # owned one has gone with it, and status must say so rather than keep the routes last written.
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
        if stored is None and not wanted.routes:
            return "unchanged", None  # created only once some route is needed (routing.py)
        try:
            rendered = routing.render(wanted, shipped, probe_namespace=self.namespace)
        except ValueError as exc:
            raise APIError(str(exc)) from exc
        if routing.same_configuration(stored, rendered.configuration):
            return "unchanged", rendered
        if stored is None:
            await self.transport.send("POST", CONFIGURATIONS, rendered.configuration, timeout=REQUEST_TIMEOUT)
            return "created", rendered
        await self.transport.send("PUT", path, routing.for_update(rendered.configuration, stored),
                                  timeout=REQUEST_TIMEOUT)
        return "updated", rendered

    async def probe(self) -> bool:
        """One probe; True once the API server routes what was last written."""
        if self._written is None:
            return False
        self.probes += 1
        body = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": routing.PROBE_CONFIGMAP, "namespace": self.namespace}}
        try:
            await self.transport.send("POST", f"/api/v1/namespaces/{self.namespace}/configmaps", body,
                                      params=[("dryRun", "All")], timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            digest = routing.digest_in(exc.message)
            if digest is None:
                self.metrics.routing_probes.labels("failed").inc()
                self._fail(f"the routing probe (a dry-run CREATE of ConfigMap {self.namespace}/"
                           f"{routing.PROBE_CONFIGMAP}) failed: {exc.message}", None)
                return False
        except APIError as exc:
            self.metrics.routing_probes.labels("failed").inc()
            self._fail(f"the routing probe failed: {exc.message}", None)
            return False
        else:
            self.metrics.routing_probes.labels("pending").inc()
            return False  # passed without reaching the gate: the API server does not route it yet
        seen = self._rendered.get(digest)
        if seen is None:
            self.metrics.routing_probes.labels("other").inc()
            return False  # a configuration this leader did not render (another writer): wait for ours
        self.metrics.routing_probes.labels("live").inc()
        written = self._written[1]
        live = seen & written
        if live != self.facts.live or self.facts.error:
            log.info("provider routes live", configuration=routing.PROVIDERS_CONFIGURATION, digest=digest,
                     current=digest == self._written[0], routes=len(live))
            self._set_facts(attrs.evolve(self.facts, live=live, error=None))
        return digest == self._written[0]

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
