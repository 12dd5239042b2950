"""The service's Prometheus metrics, in one registry per `Metrics` object.

Each server (and each test) builds its own `Metrics`, so two apps in one process never collide in
prometheus-client's global registry. The server counts decisions, rejected requests and live
confirmations (around the callback); object counts are read from the state source at scrape time
(`observe_cache_objects`, wired by the server when the source has `counts()`); the watch caches report
restarts by incrementing `watch_restarts` (e.g. CacheState's `on_watch_restart` callback).

    criticalsvc_decisions_total{resource,operation,result,rule}   every AdmissionReview answered (resource
                                                                  with its subresource: deployments.apps/scale)
    criticalsvc_decision_duration_seconds                         request handled -> response ready
    criticalsvc_cache_decision_duration_seconds                   for reviews answered from the caches alone (no
                                                                  live confirmation, access review or wait for a
                                                                  syncing cache): from the body read to the answer
    criticalsvc_cache_decision_cpu_seconds                        of those, the serving thread's CPU time
    criticalsvc_cache_objects{resource}                           read from the state source per scrape
    criticalsvc_watch_restarts_total{resource}                    a watch that had to start over
    criticalsvc_live_confirmations_total{result}                  allowed | denied | failed
    criticalsvc_live_confirmation_failures_total{reason}          timeout | error
    criticalsvc_finalizer_read_seconds{method}                    each fresh read of a Finalizer criterion's
                                                                  objects: list | mirror | watch (caught up)
    criticalsvc_protection_labels_total{outcome}                  the leader's label writes: added | removed | gone |
                                                                  failed (criticalsvc/labeller.py)
    criticalsvc_unlabelled_protected_objects                      protected objects not carrying their labels yet
    criticalsvc_caught_up_confirmation_seconds{caught_up}         each confirmation decided on the cache caught up to
                                                                  one consistent read: already (no watch) | watch
    criticalsvc_break_glass_total{resource}                       deletions and updates let through by break-glass
    criticalsvc_requests_rejected_total{reason}                   malformed | too-large (body or head) | not-ready
    criticalsvc_decision_errors_total                             unexpected exceptions (answered DENY)
    criticalsvc_certificate_reloads_total{result}                 serving certificate reloads
    criticalsvc_event_loop_lag_seconds                            how late a periodic timer ran (probe_event_loop_lag)
    criticalsvc_event_loop_lag_cpu_seconds                        the part of each lag spent on the CPU (ours)
    criticalsvc_gc_pause_seconds{generation}                      each garbage collection (time_garbage_collections)

The event loop serves every review, every watch event and every status write of the process: while one
of them holds it (a big watch list decoded, a garbage collection, a slow log handler) every review
waits. `probe_event_loop_lag` measures that directly, as Node's `monitorEventLoopDelay` does: a timer
due every LAG_PROBE_INTERVAL records how late it fired. Its p99 is the tail a review can meet in the
queue before its handler runs, whatever caused it. One cause it cannot name is timed on its own: a
garbage collection stops everything while it runs, and a full one (generation 2) walks every tracked
object of the process, so `time_garbage_collections` records each collection's pause by generation.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

# Measured here on the reference story: `decide` ~50 µs, the whole handler ~100-500 µs; a live
# confirmation is a round trip to the API server, and the API server gives up after its webhook timeout
# (10 s by default). So the buckets span 100 µs to 10 s.
DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)

# How late the probe's timer fired: 0.5 ms (a loop doing nothing else) to 2.5 s (a stall the API
# server's webhook timeout would turn into a failed call).
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# 50 wake-ups a second cost ~1 ms of CPU a second (a timer, a clock read, one histogram observation)
# and catch any stall longer than 20 ms; shorter ones are caught in proportion to their length.
LAG_PROBE_INTERVAL = 0.02

# Reasons for requests answered without a decision (label values of requests_rejected_total).
REJECT_MALFORMED = "malformed"    # HTTP 400: not a decodable AdmissionReview v1 (or not JSON at all)
REJECT_TOO_LARGE = "too-large"    # HTTP 413: body over --max-body-bytes
REJECT_NOT_READY = "not-ready"    # HTTP 503: the cluster state is not synced yet


class _CacheObjectsCollector(Collector):
    """criticalsvc_cache_objects, read from the state source at scrape time (no bookkeeping on writes)."""

    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("criticalsvc_cache_objects", "Objects held in the cluster-state cache, "
                                   "by resource.", labels=["resource"])
        try:
            counts = dict(self._counts())
        except Exception:  # a failing source must not take the whole /metrics page down with it
            counts = {}
        for resource, count in sorted(counts.items()):
            family.add_metric([resource], count)
        yield family


class Metrics:
    """Every metric of the service, registered in `registry` (a fresh one unless given)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "criticalsvc_decisions_total", "AdmissionReviews answered, by resource, operation, result "
            "(allowed/denied) and deciding rule.", ["resource", "operation", "result", "rule"], registry=r)
        self.decision_duration = Histogram(
            "criticalsvc_decision_duration_seconds", "Time to answer an AdmissionReview: reading the body, "
            "deciding and any live confirmation.", buckets=DURATION_BUCKETS, registry=r)
        self.cache_decision_duration = Histogram(
            "criticalsvc_cache_decision_duration_seconds", "Time from an AdmissionReview's body read to its "
            "answer, for reviews decided from the caches alone, without a live confirmation, an access review "
            "or a wait for a syncing cache: the gate's own time, no API server round trip in it.",
            buckets=DURATION_BUCKETS, registry=r)
        self.cache_decision_cpu = Histogram(
            "criticalsvc_cache_decision_cpu_seconds", "Of each cache-only decision, the time the serving "
            "thread was on the CPU; the rest of its duration is time the OS did not run the process.",
            buckets=DURATION_BUCKETS, registry=r)
        self.watch_restarts = Counter(
            "criticalsvc_watch_restarts_total", "Watches that had to start over (dropped, 410 Gone, error), "
            "by resource.", ["resource"], registry=r)
        self.live_confirmations = Counter(
            "criticalsvc_live_confirmations_total", "Fresh reads from the API server before allowing a "
            "protected deletion, by outcome (allowed, denied, failed).", ["result"], registry=r)
        self.live_confirmation_failures = Counter(
            "criticalsvc_live_confirmation_failures_total", "Live confirmations that could not be completed "
            "(the deletion was denied), by reason (timeout, error).", ["reason"], registry=r)
        self.finalizer_reads = Histogram(
            "criticalsvc_finalizer_read_seconds", "Fresh reads of the objects carrying a Finalizer criterion's "
            "finalizer, by method: list (a LIST of the whole type), mirror (the cache was already past a consistent "
            "read's version), watch (the cache caught up to it by a watch and its bookmark).", ["method"],
            buckets=DURATION_BUCKETS, registry=r)
        self.caught_up_confirmations = Histogram(
            "criticalsvc_caught_up_confirmation_seconds", "Confirmations decided on the cache caught up to one "
            "consistent read (criticalsvc/caughtup.py), by how: already (every type read was past the read's "
            "version: the read alone), watch (a type lagged and a watch proved it current).", ["caught_up"],
            buckets=DURATION_BUCKETS, registry=r)
        self.break_glass = Counter(
            "criticalsvc_break_glass_total", "Deletions and updates allowed by the break-glass annotation "
            "although criteria were unmet, by resource.", ["resource"], registry=r)
        self.requests_rejected = Counter(
            "criticalsvc_requests_rejected_total", "Requests answered without a decision (400 malformed, "
            "413 or 431 too-large, 503 not-ready), by reason.", ["reason"], registry=r)
        self.decision_errors = Counter(
            "criticalsvc_decision_errors_total", "Unexpected exceptions while deciding; each was answered with "
            "a denial (fail closed).", registry=r)
        self.certificate_reloads = Counter(
            "criticalsvc_certificate_reloads_total", "Reloads of the serving certificate after its files "
            "changed, by result (ok, failed).", ["result"], registry=r)
        self.deletion_intents = Counter(
            "criticalsvc_deletion_intents_total", "Refused deletions recorded as intents to replay "
            "(spec.replayDeletion: WhenTearingDown), by resource.", ["resource"], registry=r)
        self.deletion_replays = Counter(
            "criticalsvc_deletion_replays_total", "Deletion intents the leader ended, by outcome: replayed, or "
            "the reason it was dropped (ObjectGone, TeardownAbandoned, Forbidden, ...).", ["outcome"], registry=r)
        self.provider_routes = Gauge(
            "criticalsvc_provider_routes", "Routes (an operation on one object, or on the objects a selector "
            "picks) the gate's own webhook configuration criticalsvc-providers holds, as last written by the leader.",
            registry=r)
        self.routing_probes = Counter(
            "criticalsvc_routing_probes_total", "Routing probes sent by the leader (a dry-run CREATE only the probe "
            "webhook of criticalsvc-providers matches), by outcome: live (the API server routes the configuration "
            "just written), pending (not yet), other (an older configuration), failed.", ["outcome"], registry=r)
        self.broad_routes = Gauge(
            "criticalsvc_broad_routes", "Routes of criticalsvc-providers sent more broadly than they need (a "
            "provider selector without a namespace, or a condition too large to write): each makes the API server "
            "send the gate requests that concern nothing protected.", registry=r)
        self.protection_labels = Counter(
            "criticalsvc_protection_labels_total", "Label writes of the leader on protected objects (the labels "
            "criticalsvc.io/protected and updates-held, which route their DELETEs and UPDATEs on every API server), "
            "by outcome: added, removed, gone (the object went first), failed.", ["outcome"], registry=r)
        self.unlabelled_objects = Gauge(
            "criticalsvc_unlabelled_protected_objects", "Objects some CriticalService protects that do not carry the "
            "gate's labels yet, as the leader last counted them (0 in a steady state).", registry=r)
        self.webhook_route_syncs = Counter(
            "criticalsvc_webhook_route_syncs_total", "Syncs of the webhook configuration criticalsvc-providers by "
            "the leader, by outcome (unchanged, created, updated, conflict, failed).", ["outcome"], registry=r)
        self.event_loop_lag = Histogram(
            "criticalsvc_event_loop_lag_seconds", "How late a timer due every 20 ms ran on the event loop that "
            "serves reviews: the time a review waits behind other work before its handler starts.",
            buckets=LAG_BUCKETS, registry=r)
        self.event_loop_lag_cpu = Histogram(
            "criticalsvc_event_loop_lag_cpu_seconds", "Of each event-loop lag sample, the part the serving thread "
            "was on the CPU (work holding the loop, garbage collection included); the rest of the lag is time "
            "the OS did not run the process.", buckets=LAG_BUCKETS, registry=r)
        self.gc_pause = Histogram(
            "criticalsvc_gc_pause_seconds", "Garbage collections and how long each stopped the process, by "
            "generation (2: a full collection, which walks every tracked object).", ["generation"],
            buckets=LAG_BUCKETS, registry=r)
        self._cache_collector: _CacheObjectsCollector | None = None

    def observe_cache_objects(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Report criticalsvc_cache_objects{resource} from `counts()` at every scrape (replaces a previous one)."""
        if self._cache_collector is not None:
            self.registry.unregister(self._cache_collector)
        self._cache_collector = _CacheObjectsCollector(counts)
        self.registry.register(self._cache_collector)

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of the registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


async def probe_event_loop_lag(metrics: Metrics, *, interval: float = LAG_PROBE_INTERVAL) -> None:
    """Until cancelled: sleep `interval`, observe how much later than that the loop woke us up, and how
    much of that lateness the loop's thread spent on the CPU (its CPU time over the sleep, at most the
    lag): work of ours that held the loop (a long step, a garbage collection). The rest of a lag is time
    the OS did not run the process at all - a machine with more runnable threads than cores."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        cpu = time.thread_time()
        await asyncio.sleep(interval)
        lag = max(0.0, loop.time() - due)
        metrics.event_loop_lag.observe(lag)
        metrics.event_loop_lag_cpu.observe(min(lag, time.thread_time() - cpu))


def time_garbage_collections(metrics: Metrics) -> Callable[[], None]:
    """Observe every garbage collection's pause in metrics.gc_pause from now on; returns the undo.

    gc.callbacks is global to the process, so the serving loop installs it once and removes it when it
    stops (a test that builds many servers in one process does not pile them up)."""
    started = [0.0]

    def callback(phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            metrics.gc_pause.labels(str(info["generation"])).observe(time.perf_counter() - started[0])

    gc.callbacks.append(callback)

    def remove() -> None:
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)

    return remove


__all__ = ["DURATION_BUCKETS", "LAG_BUCKETS", "LAG_PROBE_INTERVAL", "REJECT_MALFORMED", "REJECT_NOT_READY",
           "REJECT_TOO_LARGE", "Metrics", "probe_event_loop_lag", "time_garbage_collections"]
