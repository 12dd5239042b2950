"""Keeps the gate's own webhook configuration `criticalsvc-providers` current: the I/O around routing.py.

Only the leader writes (the status writer's Lease: `run(lambda: writer.leading)`, as the replayer). Every
POLL it computes the desired rules from the cached CriticalServices and the REST mapper (no request:
routing.desired_routes is a pure function of the cache), and syncs when they changed, when the last sync
failed (after RETRY), and otherwise every RESYNC, because the shipped configuration's caBundle or
clientConfig may have changed (a renewed certificate, cert-manager's CA injection).

A sync GETs the shipped configuration (`--webhook-configuration`, default criticalsvc) and the owned one,
renders the owned one from the rules and the shipped one's settings, and writes only when they differ
(routing.same_configuration): a POST when it does not exist yet (and some route is needed), else a PUT
carrying the resourceVersion it read, so a concurrent writer makes it fail with 409 Conflict and the next
round reads again. The shipped configuration is only read, never written: what the user applies stays
exactly as applied (no drift for a GitOps tool).

`facts` (routing.RoutingFacts) is what status shows: the routes the owned configuration holds as last read
or written, and the last sync's error. A failure is logged, counted and reported once per distinct error
as a Warning Event on the shipped configuration.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from . import routing
from .cache.transport import APIError, APIStatusError, Sender
from .errors import StateUnavailable
from .events import object_event
from .logs import get_logger
from .metrics import Metrics
from .restmapper import RESTMapper
from .server import StateSource

log = get_logger("criticalsvc.routing")

POLL = 1.0  # how often the leader recomputes the desired rules from the cache (no request)
RESYNC = 10.0  # ... and reads both configurations even when the rules did not change
RETRY = 3.0  # ... after a failed sync
REQUEST_TIMEOUT = 5.0
CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


class WebhookRouter:
    def __init__(self, transport: Sender, source: StateSource, mapper: RESTMapper, *,
                 shipped: str = routing.SHIPPED_CONFIGURATION, metrics: Metrics | None = None,
                 post_event: Callable[[dict[str, Any]], None] = lambda event: None,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic) -> None:
        self.transport, self.source, self.mapper = transport, source, mapper
        self.shipped = shipped
        self.metrics = metrics if metrics is not None else Metrics()
        self.post_event, self.on_change, self.clock = post_event, on_change, clock
        self.facts = routing.RoutingFacts(managed=True)
        self.syncs = 0
        self._synced_rules: frozenset[routing.RouteRule] | None = None  # None: sync at the next round
        self._next_sync = 0.0
        self._reported: str | None = None  # the error last reported as an Event
        self._seen: frozenset[routing.Route] = frozenset()  # what the owned configuration held when last read

    def desired(self) -> frozenset[routing.RouteRule]:
        return routing.desired_routes(self.source.state.critical_services(), self.mapper.lookup)

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading() and self.source.ready:
                try:
                    rules = self.desired()
                    if rules != self._synced_rules or self.clock() >= self._next_sync:
                        await self.sync(rules)
                except StateUnavailable:
                    pass  # the cache is re-syncing; the next round computes again
                except Exception:  # a round must never end the loop; the next one retries
                    log.exception("webhook route sync failed unexpectedly")
                    self._synced_rules = None
            else:
                self._synced_rules = None  # a new leader reads before trusting anything
            await asyncio.sleep(POLL)

    async def sync(self, rules: frozenset[routing.RouteRule]) -> str:
        """Make the owned configuration route exactly `rules`; returns the outcome (a metric label)."""
        self.syncs += 1
        self._seen = frozenset()
        try:
            outcome, stored = await self._write(rules)
        except APIError as exc:
            conflict = isinstance(exc, APIStatusError) and exc.code == 409
            outcome = "conflict" if conflict else "failed"
            # The rules count as tried, so only the clock (or a change of rules) starts the next attempt: a
            # conflict at the next round, any other failure after RETRY rather than at every POLL.
            self._synced_rules, self._next_sync = rules, self.clock() + (0.0 if conflict else RETRY)
            self.metrics.webhook_route_syncs.labels(outcome).inc()
            if conflict:  # someone wrote in between: read again next round, no error to report
                log.info("webhook configuration changed while syncing; retried next round",
                         configuration=routing.PROVIDERS_CONFIGURATION, error=exc.message)
                return outcome
            log.warning("could not sync the provider routes", configuration=routing.PROVIDERS_CONFIGURATION,
                        error=exc.message, routes=[str(r.route) for r in sorted(rules)])
            # Routed is what this round could read of the owned configuration (nothing if it could not): status
            # says Enforcing only for routes the API server is seen to hold.
            self._set_facts(attrs.evolve(self.facts, routed=self._seen, error=exc.message))
            self.metrics.provider_routes.set(len(self._seen))
            self._report(exc.message)
            return outcome
        self._synced_rules, self._next_sync = rules, self.clock() + RESYNC
        self.metrics.webhook_route_syncs.labels(outcome).inc()
        routed = routing.routes_of(stored)
        self.metrics.provider_routes.set(len(routed))
        if outcome != "unchanged":
            log.info("provider routes written", configuration=routing.PROVIDERS_CONFIGURATION, outcome=outcome,
                     routes=sorted(str(r) for r in routed))
        self._reported = None
        self._set_facts(routing.RoutingFacts(managed=True, routed=routed))
        return outcome

    async def _write(self, rules: frozenset[routing.RouteRule]) -> tuple[str, Mapping[str, Any] | None]:
        path = f"{CONFIGURATIONS}/{routing.PROVIDERS_CONFIGURATION}"
        try:
            stored: Mapping[str, Any] | None = await self.transport.get(path, timeout=REQUEST_TIMEOUT)
        except APIStatusError as exc:
            if not exc.not_found:
                raise
            stored = None
        self._seen = routing.routes_of(stored)
        # Read second: when the shipped configuration is gone (deleted to end an outage, or at uninstall), the
        # owned one has gone with it, and status must say so rather than keep the routes last written.
        shipped = await self.transport.get(f"{CONFIGURATIONS}/{self.shipped}", timeout=REQUEST_TIMEOUT)
        if stored is None and not rules:
            return "unchanged", None  # created only once some route is needed (routing.py)
        try:
            desired = routing.render(rules, shipped)
        except ValueError as exc:
            raise APIError(str(exc)) from exc
        if routing.same_configuration(stored, desired):
            return "unchanged", stored
        if stored is None:
            written = await self.transport.send("POST", CONFIGURATIONS, desired, timeout=REQUEST_TIMEOUT)
            return "created", written
        written = await self.transport.send("PUT", path, routing.for_update(desired, stored), timeout=REQUEST_TIMEOUT)
        return "updated", written

    def _set_facts(self, facts: routing.RoutingFacts) -> None:
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
            message=f"criticalsvc could not write ValidatingWebhookConfiguration {routing.PROVIDERS_CONFIGURATION}, "
                    f"so DELETEs (and held UPDATEs) of some providers do not reach the gate: {error}"))
