"""Keeps the gate's labels on the objects CriticalServices protect: the I/O around protectionlabels.py.

Only the leader writes (the status writer's Lease, as the router and the replayer). A round computes, from the
cache alone, which protected objects lack their labels (protectionlabels.to_add) and PATCHes each with a JSON
merge patch of its labels: one request per object, MAX_IN_FLIGHT at a time, sent as the gate's ServiceAccount
(its ClusterRole criticalsvc-labeller grants `patch`, per type, as the reader role grants reads). It removes
the labels no CriticalService wants any more (protectionlabels.stale) when the CriticalServices changed and
every SWEEP otherwise, on the types it ever labelled.

Rounds are driven by the cache's events, not a poll: a CriticalService created, a provider created or
relabelled into a selector, wakes the next round at once (at most one round every MIN_PAUSE), so a new
CriticalService's provider carries its label - and the CriticalService says Enforcing - within a watch event
and one PATCH of its creation, however many CriticalServices exist. A PATCH is not sent again for the same
labels until the cache has had RESEND to show it.

A write that fails is counted, kept in `errors` (status shows it on the CriticalServices that protect the
object: the protection then rests on the route by name alone, criticalsvc/status.py) and reported once per
distinct error as a Warning Event. A 404 means the object went first: nothing to label.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from . import protectionlabels
from .api import CRDS, CRITICAL_SERVICES, NAMESPACES, ObjectRef
from .cache.transport import APIError, APIStatusError, Sender
from .errors import StateUnavailable
from .events import object_event
from .logs import get_logger
from .metrics import Metrics
from .restmapper import RESTMapper
from .server import StateSource

log = get_logger("criticalsvc.labels")

MIN_PAUSE = 0.02  # between two rounds: a burst of events is one round, not one per event
SWEEP = 30.0  # how often stale labels are looked for when no CriticalService changed
IDLE = 10.0  # a round at least this often, events or not (a failed write is retried then)
RESEND = 5.0  # a label PATCHed is not PATCHed again before the cache had this long to show it
RETRY_FAILED = 60.0  # ... and a refused one (403: a grant to add) not before this long
MAX_IN_FLIGHT = 8
LOOP_SLICE = 0.01  # at most this long on the event loop before yielding to the reviews
REQUEST_TIMEOUT = 5.0
MERGE_PATCH = "application/merge-patch+json"
FIELD_MANAGER = "criticalsvc"


class Labeller:
    def __init__(self, transport: Sender, source: StateSource, mapper: RESTMapper, *, metrics: Metrics | None = None,
                 post_event: Callable[[dict[str, Any]], None] = lambda event: None,
                 on_change: Callable[[], None] = lambda: None, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.transport, self.source, self.mapper = transport, source, mapper
        self.metrics = metrics if metrics is not None else Metrics()
        self.post_event, self.on_change, self.clock, self.sleep = post_event, on_change, clock, sleep
        self.errors: dict[ObjectRef, str] = {}  # the last failed write per object, until one succeeds
        self.writes = 0
        self._types: set[Any] = set()  # the types it ever labelled: where stale labels can be
        self._sent: dict[tuple[ObjectRef, frozenset[str], frozenset[str]], float] = {}
        self._services: frozenset[str] | None = None
        self._next_sweep = 0.0
        self._reported: set[str] = set()
        # Per CriticalService name: (it, what it read by counts of writes, the objects it protects with their labels).
        self._protects: dict[str, tuple[Any, Any, dict[ObjectRef, frozenset[str]]]] = {}
        # Where the last round read the providers (each served type as spelt, and namespace; None: any), and what it
        # read, as counts of writes: an equal count at the next round, and it is skipped (`_inputs_now`).
        self._stamped: list[tuple[Any, str | None]] = []
        self._inputs: Any = None
        # The last round's union of what they protect, the labels it lacked, and the labelled types' counts of writes.
        self._wanted: tuple[dict[ObjectRef, frozenset[str]], Mapping[ObjectRef, frozenset[str]], Any] | None = None

    async def run(self, leading: Callable[[], bool]) -> None:
        while True:
            if leading() and self.source.ready:
                started, seen = time.perf_counter(), getattr(self.source, "changes", None)
                try:
                    await self.round()
                except StateUnavailable:
                    pass  # a cache is re-syncing; the next round computes again
                except Exception:  # a round must never end the loop
                    log.exception("labelling protected objects failed unexpectedly")
                # At most half the loop's time under a steady stream of events: a warm round over 10,000
                # CriticalServices takes ~0.2 s of CPU (`python -m benchmarks protection`).
                await self.sleep(max(MIN_PAUSE, time.perf_counter() - started))
                wait_event = getattr(self.source, "wait_event", None)
                if callable(wait_event) and isinstance(seen, int) and getattr(self.source, "changes", None) != seen:
                    pass  # an event came during the round or the pause: the next round at once, not after IDLE
                elif callable(wait_event):
                    await wait_event(IDLE)
                else:
                    await self.sleep(IDLE)
            else:
                self._services, self._sent, self._wanted, self._inputs = None, {}, None, None  # a new leader sweeps
                await self.sleep(1.0)

    async def round(self) -> int:
        """Add the labels protected objects lack and remove the ones nothing wants; returns the writes sent."""
        state = self.source.state
        writes = getattr(state, "writes", None)
        inputs = self._inputs_now(writes)
        if inputs is not None and inputs == self._inputs and not self._sent and not self.errors \
                and self.clock() < self._next_sweep:
            # Nothing it reads was written where it read it, nothing is waiting to be seen or retried, no sweep due:
            # a cache event elsewhere (a Deployment deleted in another namespace, a CriticalService's status) costs no
            # walk over every CriticalService (at 10,000, 20-60 ms of the leader's loop per event).
            return 0
        services = list(state.critical_services())
        want: dict[ObjectRef, frozenset[str]] = {}
        protects: dict[str, tuple[Any, Any, dict[ObjectRef, frozenset[str]]]] = {}
        namespaces_crds = (writes(NAMESPACES, ""), writes(CRDS, "")) if callable(writes) else None
        stamps: dict[tuple[Any, str | None], Any] = {}  # per provider type as spelt and namespace, this round
        same = len(services) == len(self._protects)  # ... and every CriticalService protects what it did last round
        readable = True  # ... and every CriticalService's types could be read (else the next round tries again)
        sliced = time.perf_counter()
        for cs in services:
            if time.perf_counter() - sliced > LOOP_SLICE:
                await asyncio.sleep(0)  # the event loop serves the reviews too: a round never holds it long
                sliced = time.perf_counter()
            try:
                # What cs protects is kept while what it reads was not written: its provider's type there (a selector's
                # members are found by scanning it), the namespaces and the CRDs; at 10,000 working it all out again
                # took a fifth of the leader's CPU while CriticalServices were created one by one (py-spy).
                where = (cs.provider.group_resource, cs.provider.namespace)
                stamp = stamps.get(where)
                if stamp is None and callable(writes):
                    gr = state.resolve(where[0])
                    stamp = stamps[where] = (gr, writes(gr or where[0], where[1]), namespaces_crds)
                known = self._protects.get(cs.name)
                if known is not None and stamp is not None and known[1] == stamp and (known[0] is cs or known[0] == cs):
                    protected = known[2]
                else:
                    protected = protectionlabels.protected_objects(cs, state,
                                                                   protectionlabels.provider_members(cs, state))
                    same = same and known is not None and known[2] == protected and known[0].uid == cs.uid
                protects[cs.name] = (cs, stamp, protected)
            except StateUnavailable:
                same = readable = False
                continue  # that CriticalService's types cannot be read now; the others are labelled
        labelled = inputs[4] if inputs is not None else None  # the labelled types' counts of writes
        if same and len(protects) == len(self._protects) and self._wanted is not None and labelled is not None:
            # Nothing any CriticalService protects changed (the CriticalServices' own writes are mostly their status):
            # the union of 10,000 and the check of each object's labels are last round's while no label was written.
            want = self._wanted[0]
            adds = self._wanted[1] if self._wanted[2] == labelled else protectionlabels.to_add(want, state)
            names = self._services or frozenset()
        else:
            for _cs, _stamp, protected in protects.values():
                for ref, labels in protected.items():
                    want[ref] = want.get(ref, frozenset()) | labels
            adds = protectionlabels.to_add(want, state)
            names = frozenset(f"{cs.name}/{cs.uid}" for cs in services)
        self._protects = protects
        self._stamped = [(stamp[0] or where[0], where[1]) for where, stamp in stamps.items()]
        self._inputs = inputs if readable else None
        self._types |= {ref.group_resource for ref in want}
        self._wanted = (want, adds, labelled)
        removes: Mapping[ObjectRef, frozenset[str]] = {}
        if names != self._services or self.clock() >= self._next_sweep:
            removes = protectionlabels.stale(want, state, self._types)
            self._services, self._next_sweep = names, self.clock() + SWEEP
        self.metrics.unlabelled_objects.set(len(adds))
        now = self.clock()
        self._sent = {k: t for k, t in self._sent.items() if now - t < RESEND}
        empty: frozenset[str] = frozenset()
        work = [(ref, keys, empty) for ref, keys in adds.items()] + \
            [(ref, empty, keys) for ref, keys in removes.items()]
        work = [w for w in work if w not in self._sent]
        for ref in [r for r in self.errors if r not in adds and r not in removes]:
            del self.errors[ref]  # carried now, or nothing wants it: the error is history
        if not work:
            return 0
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)

        async def one(item: tuple[ObjectRef, frozenset[str], frozenset[str]]) -> None:
            async with gate:
                self._sent[item] = self.clock()
                await self._write(*item)
                if item[0] in self.errors:  # refused (a missing grant, another webhook): not again for a while
                    self._sent[item] = self.clock() + RETRY_FAILED - RESEND

        await asyncio.gather(*(one(w) for w in work))
        self.on_change()  # status recomputes Ready now, not at its next interval
        return len(work)

    def _inputs_now(self, writes: Any) -> Any:
        """What the last round read, as counts of writes (None when the state does not count them): the
        CriticalServices, the namespaces and CRDs, the providers' types where it read them, the labelled types (the
        labels it found lacking), and the REST mapper (what a type name resolves to)."""
        if not callable(writes):
            return None
        return (writes(CRITICAL_SERVICES, None), writes(NAMESPACES, ""), writes(CRDS, ""),
                tuple(writes(gr, ns) for gr, ns in self._stamped),
                tuple(writes(gr, None) for gr in sorted(self._types, key=str)), self.mapper.generation)

    async def _write(self, ref: ObjectRef, add: frozenset[str], remove: frozenset[str]) -> None:
        t = self.mapper.lookup(ref.group_resource)
        if t is None:
            return  # not served any more: nothing to label
        path = t.path(namespace=ref.namespace or None, name=ref.name)
        self.writes += 1
        try:
            # Under a field manager of its own: server-side appliers (Flux, Argo CD's server-side diff) see the two
            # labels as another manager's fields, neither drift nor theirs to remove.
            await self.transport.send("PATCH", path, protectionlabels.merge_patch(add=add, remove=remove),
                                      timeout=REQUEST_TIMEOUT, content_type=MERGE_PATCH,
                                      params=[("fieldManager", FIELD_MANAGER)])
        except APIStatusError as exc:
            if exc.not_found:
                self.metrics.protection_labels.labels("gone").inc()
                return
            self._fail(ref, add, exc.message)
            return
        except APIError as exc:
            self._fail(ref, add, exc.message)
            return
        self.metrics.protection_labels.labels("added" if add else "removed").inc()
        self.errors.pop(ref, None)
        log.info("protection labels written", object=str(ref), added=sorted(add), removed=sorted(remove))

    def _fail(self, ref: ObjectRef, add: frozenset[str], error: str) -> None:
        self.metrics.protection_labels.labels("failed").inc()
        verb = "label" if add else "unlabel"
        if add:
            self.errors[ref] = error
        log.warning(f"could not {verb} a protected object", object=str(ref), error=error)
        if error in self._reported:
            return
        self._reported.add(error)
        involved = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                    "name": "criticalsvc"}
        self.post_event(object_event(
            involved=involved, reason="ProtectionLabelFailed", warning=True, now=time.time(),
            message=f"criticalsvc could not {verb} {ref} (criticalsvc.io/protected): {error}; until it can, that "
                    "object's DELETE reaches the gate only through criticalsvc-providers, which an API server may "
                    "hold late"))
