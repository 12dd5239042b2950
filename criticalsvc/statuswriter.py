"""Keeps CriticalService status current and posts denial Events (the service's only writes).

Every replica serves admission; only the leader writes status, elected through a
coordination.k8s.io Lease with kubernetes.aio's LeaseLock (lease 15 s, renew deadline 10 s, retry
2 s — client-go's defaults for controllers). On losing the lease the writer stops and campaigns
again. Status PATCHes go to the /status subresource as merge patches and are skipped when nothing
but timestamps would change (status.same_status), so a steady cluster costs no writes.

Events need no leader: the replica that denied a deletion records it, through the rate-limited
EventRecorder, so a retry loop produces one Event with a growing count. A dry-run denial records
nothing (no side effects on dry run; the webhook declares sideEffects: None).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import structlog

from . import criteria, protectionlabels, routing
from .admission import AdmissionRequest
from .api import (
    API_VERSION,
    CRDS,
    CRITICAL_SERVICES,
    GROUP,
    KIND,
    NAMESPACES,
    PLURAL,
    VERSION,
    CriticalService,
    GroupResource,
    ObjectRef,
    ResourcesCriterion,
    SpecificResourceCriterion,
)
from .cache.transport import KubeTransport
from .decision import Decision, Rule
from .deleters import Deleter, of_request
from .errors import StateUnavailable
from .events import EventRecorder, object_event
from .routing import Routing
from .server import StateSource
from .state import ClusterState
from .status import CONFIRM_FAILURE_SHOWN, compute_status, same_status

# The gate does not write routes (serve --no-manage-provider-webhooks): status says what is not routed.
UNMANAGED = Routing(managed=False)

log = structlog.get_logger("criticalsvc.status")

LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD = 15, 10, 2
# A status pass computes every CriticalService's status on the event loop, and awaits nothing while
# nothing changed (no PATCH to send): with 1,000 CriticalServices that held the loop for 34 ms of CPU per
# pass (python -m benchmarks realscale, in-process; more on a busy machine) every `interval` and after every
# denial, and every review arriving meanwhile waited it out (design/operations.md, "Real scale"). So a
# pass lets other tasks run every LOOP_SLICE seconds of computing, as the watch loop does
# (criticalsvc/cache/reflector.py).
LOOP_SLICE = 0.002
# Even so, a pass over 1,000 CriticalServices every 5 s kept an idle leader at 4.3 % of a core (2 % at
# 100), the one idle cost that grew with the cluster (design/operations.md, "Real scale"). A pass is skipped
# when nothing it reads changed since the last pass that wrote all it had to: the caches (`changes`, when the
# state source counts them), the provider routes and every replay fact. FULL_PASS_EVERY bounds what a missed
# input could cost: a pass runs at least this often all the same.
FULL_PASS_EVERY = 60.0
# ... but not all at once: each status is computed again between half that and that after it last was (by a hash
# of its name), so at 10,000 the 2-7 s of recomputing every status is spread over the passes of a minute instead of
# holding up, once a minute, the new CriticalServices' Ready behind it (issue 34: CREATE -> Enforcing). An idle
# writer passes at least every half of it, so a status is recomputed within 1.5 x FULL_PASS_EVERY at most.
# A denial pokes the writer so that status shows it at once; in a teardown that is a pass after every denial,
# back to back (14 % of a replica's CPU in the 50-stack teardown, py-spy). At most one pass a second then.
MIN_PASS_INTERVAL = 1.0
MAX_IN_FLIGHT = 8  # status PATCHes sent at once
STATUS_TIMEOUT = 10.0  # a status PATCH that takes longer is retried on a later pass
# What may turn a Ready (the routes or the labels changed, or a cache event while a Ready is pending) runs the
# next pass after this pause instead (issue 34: CREATE -> Enforcing under a second).
# The passes over the pending ones are paced on twice the loop time they held, so this only bounds a stream of
# tiny ones; each pause is on the path of a new CriticalService's Enforcing (its RoutePending pass, then the
# one its routes seen live start).
SOON_PAUSE = 0.02
PENDING_REASONS = frozenset({"LabelPending", "RoutePending"})
# The generated client sets no timeout of its own: one hung write would stop every later Event.
EVENT_TIMEOUT = 5.0
# A retried denial bumps its Event's count, in a teardown many times a second, and each write through the
# generated client costs more CPU than the denial did (pydantic validation, ~10 % of a replica in the
# 50-stack teardown, py-spy). Events are written in batches at most this often, each Event once per batch
# with its latest count (client-go's own recorder also sends a series' count late, not each repeat).
EVENT_BATCH_PAUSE = 1.0


def _pending(status: Mapping[str, Any] | None) -> bool:
    """Is this written status (None: none yet) waiting for a label to be stored or a route to be seen live?"""
    ready, reason = _ready(status)
    return not ready or (ready != "True" and reason in PENDING_REASONS)


def _ready(status: Mapping[str, Any] | None) -> tuple[str, str]:
    """(status, reason) of a written status' Ready condition; ("", "") when it has none."""
    for c in (status or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == "Ready":
            return str(c.get("status") or ""), str(c.get("reason") or "")
    return "", ""


def _reads(cs: CriticalService, provider_type: GroupResource | None,
           named: tuple[GroupResource | None, ...]) -> tuple[Any, ...]:
    """Where cs's status reads objects: its provider's type in its namespace (None: any), and each criterion's type
    in the namespace it names (None: any); the namespaces and CRDs anywhere. By namespace, so that a write elsewhere
    (the router's probe ConfigMap, written on every route change) leaves a key standing for every CriticalService of
    a named ConfigMap provider or criterion."""
    where = []
    for c, gr in zip(cs.criteria, named, strict=True):
        ns = c.target.namespace if isinstance(c, SpecificResourceCriterion) else \
            c.namespace if isinstance(c, ResourcesCriterion) else None
        where.append((gr, ns))
    return ("stamps", (provider_type or cs.provider.group_resource, cs.provider.namespace), tuple(where))


def _stamps(state: ClusterState, shared: dict[Any, Any], at: tuple[Any, ...]) -> Any:
    """The counts of writes and readability of where a status reads (`_reads`), with the namespaces and CRDs. Worked
    out once per pass for each `at` (memo `shared`)."""
    found = shared.get(at)
    if found is None:
        writes = state.writes  # type: ignore[attr-defined]  # _key checked that the state counts them
        stamps = []
        for gr, ns in sorted({at[1], (NAMESPACES, None), (CRDS, None), *((gr, ns) for gr, ns in at[2] if gr)},
                             key=str):
            if (gr, ns) not in shared:
                shared[gr, ns] = writes(gr, ns)
            if gr not in shared:
                shared[gr] = _readable(state, gr)
            stamps.append((shared[gr, ns], shared[gr]))
        found = shared[at] = tuple(stamps)
    return found


def _readable(state: ClusterState, gr: GroupResource) -> str | None:
    """Why `gr` cannot be read now (a 403, a cache not synced), or None."""
    try:
        state.get(ObjectRef(gr, "", ""))  # no object has an empty name: only whether the cache may be asked
    except StateUnavailable as exc:
        return str(exc)
    return None


class StatusWriter:
    def __init__(self, *, api_client: Any, source: StateSource, identity: str,
                 namespace: str = "criticalsvc-system", lease_name: str = "criticalsvc-status",
                 interval: float = 5.0, clock: Callable[[], float] = time.time,
                 recorder: EventRecorder | None = None, replayer: Any = None, router: Any = None,
                 loop_slice: float = LOOP_SLICE, full_pass_every: float = FULL_PASS_EVERY,
                 event_batch_pause: float = EVENT_BATCH_PAUSE) -> None:
        self.event_batch_pause = event_batch_pause
        self.api_client = api_client
        self.loop_slice = loop_slice
        # The LiveReplayer (criticalsvc/replayer.py) when replay is on: its intents and permission checks
        # go into status.deletionIntents and the ReplayPermitted condition.
        self.replayer = replayer
        # The WebhookRouter (criticalsvc/webhookrouter.py) when the gate manages provider routes: its facts
        # decide whether Ready says Enforcing, RoutePending or RoutingFailed.
        self.router = router
        # The LiveReader (criticalsvc/live.py) when DELETEs are confirmed with fresh reads: its refused
        # confirmations make Blocking say CannotConfirm where the caches alone would say CriteriaMet.
        self.reader: Any = None
        # The Labeller (criticalsvc/labeller.py) with the router: its failed label writes make Ready say
        # EnforcingByRoute (protected where criticalsvc-providers is held) rather than Enforcing everywhere.
        self.labeller: Any = None
        # The CoverageWatch (criticalsvc/discover/read.py) when serve --check-coverage-every is set: what each provider
        # serves, for the Covered condition.
        self.coverage: Any = None
        self.source = source
        self.identity = identity
        self.namespace = namespace
        self.lease_name = lease_name
        self.interval = interval
        self.clock = clock
        self.recorder = recorder or EventRecorder()
        self.leading = False
        self.writes = 0
        # Keyed by (name, uid), not name alone: a CriticalService deleted and re-created under the same name is a new
        # object with no status; it must get its own, not inherit (or be skipped as equal to) the old one's.
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=1000)
        # Who was last refused, per CriticalService (name, uid), as far as the request showed
        # (criticalsvc/deleters.py): Stuck says when that deleter never deletes what a criterion waits for.
        # What this replica saw: the leader writes the status, any replica may have answered the DELETE.
        self._deleters: dict[tuple[str, str], Deleter] = {}
        self._wake = asyncio.Event()
        self._soon = asyncio.Event()
        self._pending = False  # some CriticalService's written Ready is not True yet (or none is written)
        self._pending_keys: set[tuple[str, str]] = set()  # ... which ones, as (name, uid)
        self._soon_pending = asyncio.Event()  # poke_soon for the pending passes (sync_pending) during a pause
        self.full_pass_every = full_pass_every
        self.skipped = 0  # passes skipped as unchanged
        self.busy = 0.0  # seconds of the event loop the last pass held (its computing, not its awaiting)
        self._last_inputs: Any = None
        self._last_pass = -math.inf  # time.monotonic() of the last pass that ran
        self._computed: dict[tuple[str, str], float] = {}  # time.monotonic() each status was last computed
        self._refresh: dict[str, float] = {}  # _refresh_after by name
        self._keys: dict[tuple[str, str], Any] = {}  # per CriticalService, what its status written was computed from
        # ... and the pass's world (`_world`) and router facts that key was taken under: a pass whose world is that
        # one takes the key as still true without computing it again when cs and its types' stamps are (`_still`).
        self._taken: dict[tuple[str, str], tuple[Any, Routing, Any]] = {}
        self._world: Any = None
        self._ats: dict[Any, Any] = {}  # each `_reads` value once: equal ones are the same object
        self._pairs: tuple[Any, ...] | None = None  # every (type, namespace) in `_ats`, sorted (None: to work out)
        self._deleters_changed = 0  # counts changes of `_deleters` (a pass reads them)
        self._needs: dict[tuple[str, str], Any] = {}  # ... and the routes its Ready needs live, with their inputs

    # --- status (leader only) ---------------------------------------------------------------------
    async def sync_once(self) -> int:
        """Write every CriticalService's status that changed; returns the number of PATCHes."""
        return await self._sync(pending_only=False)

    async def sync_pending(self) -> int:
        """Write the status of the CriticalServices whose Ready is pending (LabelPending, RoutePending) or not written
        yet, and of no other: what a route seen live or a label stored may turn, at a cost that grows with them, not
        with every CriticalService (at 10,000 a whole pass held the loop 0.2-0.3 s, and a new CriticalService's
        Enforcing waited for it and for the pause after it: issue 34, CREATE -> Enforcing)."""
        return await self._sync(pending_only=True)

    async def _sync(self, *, pending_only: bool) -> int:
        self.busy = 0.0  # the loop's time this pass holds: the pause after it is paced on this, not its length
        if not self.source.ready:
            return 0
        state = self.source.state
        services = list(state.critical_services())
        keys: dict[tuple[str, str], Any] = {}
        # Per pass, what every key shares: each type's count of writes and readability, the labeller's errors, and
        # (worked out once) each provider type's stamps and replay permissions.
        shared: dict[Any, Any] = {"labels": tuple(sorted((str(k), v) for k, v in self.labeller.errors.items()))
                                    if self.labeller else None}
        world = self._world_now(shared)
        facts = self.router.facts if self.router is not None else UNMANAGED
        grown: dict[int, bool] = {}  # per router facts a key was taken under: are today's those plus more live?
        if pending_only:
            services = sorted((cs for cs in services if (cs.name, cs.uid) in self._pending_keys
                               or (cs.name, cs.uid) not in self._written), key=lambda c: c.name)
            inputs = None
        else:
            inputs = self._inputs(services, state)
            if (inputs is not None and inputs == self._last_inputs
                    and time.monotonic() - self._last_pass < self.full_pass_every / 2):
                self.skipped += 1
                return 0
            self._last_pass = time.monotonic()
            services.sort(key=lambda c: c.name)
            present = {(cs.name, cs.uid) for cs in services}
            for kept in (self._written, self._deleters):
                for gone in kept.keys() - present:
                    del kept[gone]
        # Up to MAX_IN_FLIGHT PATCHes at a time: one after the other, 1,000 new CriticalServices' statuses took 45 s
        # to write on the real control plane (`python -m benchmarks realcluster --services 10,1000`).
        gate = asyncio.Semaphore(MAX_IN_FLIGHT)
        transport = KubeTransport(self.api_client)
        sends: list[asyncio.Future[bool]] = []

        async def send(cs: CriticalService, status: dict[str, Any], key: Any) -> bool:
            try:
                # null removes a list that emptied (a merge patch keeps what it does not mention). Through the
                # gate's own transport, not the generated client: its models cost more CPU than the write (1,000
                # new statuses took 35 s to write at eight in flight through it, on the real control plane).
                await transport.send("PATCH", f"/apis/{GROUP}/{VERSION}/{PLURAL}/{cs.name}/status",
                                     {"status": {"deletionIntents": None, **status}}, timeout=STATUS_TIMEOUT,
                                     content_type="application/merge-patch+json")
            except Exception as exc:  # a failed write is retried on the next round
                log.warning("status write failed", critical_service=cs.name, error=str(exc))
                return False
            else:
                was, now = _ready(self._written.get((cs.name, cs.uid))), _ready(status)
                if was != now:  # what `kubectl wait --for=condition=Ready` waits for, when the API server has it
                    log.info("Ready changed", critical_service=cs.name, status=now[0], reason=now[1],
                             was=was[1] or None)
                self._written[cs.name, cs.uid] = status
                self._keep(cs, key, world, facts)
                if _pending(status):
                    self._pending_keys.add((cs.name, cs.uid))
                else:
                    self._pending_keys.discard((cs.name, cs.uid))
                return True
            finally:
                gate.release()

        sliced = time.perf_counter()
        for cs in services:
            if time.perf_counter() - sliced > self.loop_slice:
                # Each status is computed on the state as it is then; one whose CriticalService went meanwhile
                # fails its PATCH (404), which is logged and not recorded, as any failed write.
                self.busy += time.perf_counter() - sliced
                await asyncio.sleep(0)
                sliced = time.perf_counter()
            # Skipped when nothing it is computed from changed since its status was last written (`_key`): at
            # 10,000 CriticalServices computing every status took ~1 s of the loop per pass, and a new
            # CriticalService's Ready waited for it (issue 34: CREATE -> Enforcing). Never skipped for a type the
            # gate cannot read (the key then says so, or is None): the status then says Blocking Unknown
            # (CannotVerify), where skipping it left the last status written standing, "may go" included, while
            # the webhook refused the provider's DELETE as unverifiable.
            ident = (cs.name, cs.uid)
            now = time.monotonic()
            fresh = now - self._computed.get(ident, -math.inf) < self._refresh_after(cs.name)
            if ident not in self._written:
                self._pending_keys.add(ident)  # no Ready written yet
            elif fresh and world is not None and self._still(cs, state, shared, world, facts, grown):
                keys[ident] = self._keys[ident]
                continue
            key = keys[ident] = self._key(cs, state, shared)
            if fresh and key is not None and self._keys.get(ident) == key and ident in self._written:
                self._keep(cs, key, world, facts)  # the objects of now: the next pass compares them by identity first
                continue
            self._computed[cs.name, cs.uid] = now
            status = compute_status(cs, state, now=self.clock(), previous=self._written.get((cs.name, cs.uid)),
                                    routing=self.router.facts if self.router is not None else UNMANAGED,
                                    refused_confirmation=self._refused(cs, state),
                                    **self._replay_facts(cs, state, shared),
                                    lookup=getattr(getattr(self.router, "mapper", None), "lookup", None),
                                    label_errors=self.labeller.errors if self.labeller is not None else None,
                                    served=self.coverage.served(cs) if self.coverage is not None else None,
                                    deleter=self._deleters.get((cs.name, cs.uid)))
            if (cs.name, cs.uid) in self._written and same_status(self._written[cs.name, cs.uid], status):
                self._keep(cs, key, world, facts)
                continue
            if gate.locked():
                self.busy += time.perf_counter() - sliced
                await gate.acquire()
                sliced = time.perf_counter()
            else:
                await gate.acquire()
            sends.append(asyncio.ensure_future(send(cs, status, key)))
        self.busy += time.perf_counter() - sliced
        results = await asyncio.gather(*sends)
        written, failed = sum(results), not all(results)
        self.writes += written
        if pending_only:
            self._pending = bool(self._pending_keys)
            return written  # the whole pass still runs: what it reads changed (the next one compares, not skips)
        self._pending_keys &= keys.keys()
        self._pending = bool(self._pending_keys)
        # What the CriticalServices gone left behind (a difference of key sets: rebuilding these five maps on every
        # pass was a fifth of a pass at 10,000).
        for memo in (self._keys, self._taken, self._computed, self._needs):
            for gone in memo.keys() - keys.keys():
                del memo[gone]
        if len(self._ats) > 2 * len(keys):  # where CriticalServices gone read
            self._ats, self._pairs = {taken[2]: taken[2] for taken in self._taken.values()}, None
        if len(self._refresh) > 2 * len(keys):  # names of CriticalServices gone
            names = {name for name, _uid in keys}
            self._refresh = {name: v for name, v in self._refresh.items() if name in names}
        # Taken before the pass: a change during it makes the next pass run. A failed write must be retried.
        self._last_inputs = None if failed else inputs
        return written

    def _inputs(self, services: list[Any], state: ClusterState) -> Any:
        """What a pass reads besides the clock, as one comparable value; None when the source cannot say."""
        changes = getattr(self.source, "changes", None)
        if not isinstance(changes, int):
            return None
        routing = self.router.facts if self.router is not None else UNMANAGED
        # The replayer's own summary when it has one; computing every CriticalService's replay facts for this
        # (on every pass, a pass after every denial in a teardown) was 5 % of a replica's CPU in the 50-stack
        # teardown (py-spy).
        replay: Any = getattr(self.replayer, "facts", None)
        if self.replayer is not None and replay is None:
            memo: dict[Any, Any] = {}
            replay = [(cs.name, cs.uid, repr(self._replay_facts(cs, state, memo))) for cs in services]
        refused = getattr(self.reader, "refused_changes", None)
        labels = tuple(sorted((str(k), v) for k, v in self.labeller.errors.items())) if self.labeller else None
        coverage = getattr(self.coverage, "changes", None)
        # Where the statuses read, by counts of writes, in place of every cache event (`changes`): an event elsewhere
        # (an unprotected Deployment deleted, a CriticalService's own status written) then runs no pass over 10,000.
        reads = self._reads_now(state, len(services))
        if reads is not None:
            return (reads, routing, refused, labels, None, replay, coverage, self._deleters_changed)
        return (changes, routing, refused, labels, sorted((cs.name, cs.uid) for cs in services), replay, coverage,
                self._deleters_changed)

    def _reads_now(self, state: ClusterState, count: int) -> Any:
        """Where every status written read, as counts of writes and readability (the CriticalServices, the REST
        mapper, each type in each namespace a key was taken from: `_ats`); None when some CriticalService has no key
        taken (any event may then change what it reads)."""
        writes = getattr(state, "writes", None)
        if len(self._taken) != count or not callable(writes):
            return None
        if self._pairs is None:
            found = {(NAMESPACES, None), (CRDS, None)}
            for at in self._ats:
                found.update(p for p in (at[1], *at[2]) if p[0] is not None)
            self._pairs = tuple(sorted(found, key=str))
        return (writes(CRITICAL_SERVICES, None), getattr(getattr(self.router, "mapper", None), "generation", None),
                tuple((writes(gr, ns), _readable(state, gr)) for gr, ns in self._pairs))

    def _key(self, cs: CriticalService, state: ClusterState, shared: dict[Any, Any]) -> Any:
        """What cs's status is computed from, as one comparable value; None when it cannot be told. The types it
        reads (its provider's and criteria's, namespaces, CRDs: the labels and Stuck read those) by their counts of
        writes and whether they can be read now; its routes as the router sees them; the other facts as passed to
        compute_status. Each status is computed again all the same after _refresh_after."""
        try:
            provider_type = state.resolve(cs.provider.group_resource)
            named = tuple(state.resolve(criteria.named_resource(c)) for c in cs.criteria)
        except StateUnavailable:
            return None
        writes = getattr(state, "writes", None)
        if not callable(writes):
            return None
        at = _reads(cs, provider_type, named)
        facts = self.router.facts if self.router is not None else UNMANAGED
        lookup = getattr(getattr(self.router, "mapper", None), "lookup", None)
        resource_type = lookup(provider_type) if callable(lookup) and provider_type is not None else None
        served = self.coverage.served(cs) if self.coverage is not None else None
        base = (cs, provider_type, named, _stamps(state, shared, at), resource_type, facts.labelled, facts.managed,
                self._refused(cs, state), repr(self._replay_facts(cs, state, shared)), shared["labels"],
                repr(served),
                self._deleters.get((cs.name, cs.uid)))
        # The routes Ready checks are live are computed as status.py does (with the labels stored now), which the
        # base determines; only whether they are live (or written) changes with the router's rounds.
        known = self._needs.get((cs.name, cs.uid))
        if known is not None and known[0] == base:
            needs = known[1]
            if known[0][0] is not cs:  # an equal object the cache read again (a relist): compared once, not every pass
                self._needs[cs.name, cs.uid] = (base, needs)
        else:
            if resource_type is None:
                needs = facts.needs_of(cs)
            else:
                needs = routing.needed_routes(cs, resource_type,
                                              protectionlabels.carried_in(state) if facts.labelled else None)
            self._needs[cs.name, cs.uid] = (base, needs)
        router_needs = facts.needs_of(cs)
        route = (needs, needs is not None and needs <= facts.live, needs is not None and needs <= facts.written,
                 router_needs, facts.error,
                 tuple(sorted(str(r) for r in router_needs or () if r in facts.broad)) if facts.broad else ())
        return base, route

    def _world_now(self, shared: dict[Any, Any]) -> Any:
        """What every key of a pass shares besides its types' stamps and the router's facts, as one value (the same
        object as the last pass's when equal); None when a key must be computed whatever it holds: a confirmation
        refused lately (shown for a while: the clock counts), or a collaborator that cannot say when it changed."""
        if getattr(self.reader, "refused", None):
            return None
        generation = getattr(getattr(self.router, "mapper", None), "generation", None)
        replay = getattr(self.replayer, "facts", None) if self.replayer is not None else ()
        coverage = getattr(self.coverage, "changes", None) if self.coverage is not None else ()
        if not isinstance(generation, int) or replay is None or coverage is None:
            return None
        facts = self.router.facts if self.router is not None else UNMANAGED
        world = (generation, shared["labels"], replay, coverage, facts.labelled, facts.managed, facts.error,
                 dict(facts.broad))
        if world != self._world:
            self._world = world
        return self._world

    def _keep(self, cs: CriticalService, key: Any, world: Any, facts: Routing) -> None:
        """Remember `key` as what cs's status written stands on, taken under `world` and the router's `facts`."""
        self._keys[cs.name, cs.uid] = key
        if key is not None:  # with where its stamps were read, which holds as long as cs and the world do
            at = _reads(cs, key[0][1], key[0][2])
            if at not in self._ats:
                self._ats[at], self._pairs = at, None
            self._taken[cs.name, cs.uid] = (world, facts, self._ats[at])

    def _still(self, cs: CriticalService, state: ClusterState, shared: dict[Any, Any], world: Any, facts: Routing,
               grown: dict[int, bool]) -> bool:
        """Is cs's key, taken in an earlier pass, still what _key would compute, told without computing it? So when
        the pass's world is the one it was taken under (the same object), cs is the same object, its types' stamps and
        last deleter are those of then, and the router's facts are those of then, or those plus more routes written
        and live while every route cs needs was both already. At 10,000 CriticalServices computing every key held the
        leader's loop ~0.2 s per cache event (a new CriticalService's several), and its Enforcing waited behind it
        (issue 34: CREATE -> Enforcing); this check is a few lookups."""
        taken, key = self._taken.get((cs.name, cs.uid)), self._keys.get((cs.name, cs.uid))
        if taken is None or key is None or taken[0] is not world:
            return False
        base, route = key
        if base[0] is not cs or base[-1] is not self._deleters.get((cs.name, cs.uid)):
            return False
        if base[1] is None or None in base[2]:
            return False  # a type not served (yet): whether its group's discovery failed is read by resolving it
        # By the identity of `at` (one object for equal ones, `_ats`): hashing the nested tuple for each of 10,000
        # CriticalServices was a sixth of a pass.
        stamps = shared.get(id(taken[2]))
        if stamps is None:
            stamps = shared[id(taken[2])] = _stamps(state, shared, taken[2])
        if stamps != base[3]:
            return False
        then = taken[1]
        if then is facts:
            return True
        more = grown.get(id(then))
        if more is None:
            more = grown[id(then)] = then.live <= facts.live and then.written <= facts.written
        return more and route[1] and route[2] and facts.needs_of(cs) == route[3]

    def _refresh_after(self, name: str) -> float:
        """How long a status computed stands before it is computed again all the same (FULL_PASS_EVERY): between half
        of it and all of it, by a hash of the name (blake2b: crc32's low bits cluster for names like pop-1, pop-2)."""
        found = self._refresh.get(name)
        if found is None:
            spread = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=2).digest(), "big") / 65536
            found = self._refresh[name] = self.full_pass_every * (0.5 + spread / 2)
        return found

    def _refused(self, cs: Any, state: ClusterState) -> str | None:
        """Why the last confirmation of a DELETE of cs's (named) provider failed, if it did lately."""
        refused = getattr(self.reader, "refused", None)
        if not refused or not isinstance(cs.provider, ObjectRef):
            return None
        try:
            provider_type = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
        except StateUnavailable:
            provider_type = cs.provider.group_resource
        found = refused.get(attrs.evolve(cs.provider, group_resource=provider_type))
        if found is None or self.clock() - found.at > CONFIRM_FAILURE_SHOWN:
            return None
        return str(found.message)

    def _replay_facts(self, cs: Any, state: ClusterState, memo: dict[Any, Any] | None = None) -> dict[str, Any]:
        """The replayer's facts for cs's status; `memo`: a pass's, where the permissions are worked out once per type
        (sorting each CriticalService's replay types was a tenth of the leader's CPU at 10,000, py-spy)."""
        if self.replayer is None:
            return {}
        from .replayer import replay_types

        try:
            provider_type = state.resolve(cs.provider.group_resource) or cs.provider.group_resource
        except StateUnavailable:
            provider_type = cs.provider.group_resource  # as spelt: unchecked permissions show as NotChecked
        namespaced = cs.provider.namespace != ""  # None: any namespace
        at = ("replay", provider_type, namespaced)
        if memo is None or at not in memo:
            types = sorted(replay_types(provider_type, namespaced=namespaced))
            checked = all(self.replayer.checked(gr) for gr in types)
            forbidden = self.replayer.missing_permissions(types) if checked else None
            if memo is None:
                return {"intents": self.replayer.intents_of(cs.name), "replay_forbidden": forbidden}
            memo[at] = forbidden
        return {"intents": self.replayer.intents_of(cs.name), "replay_forbidden": memo[at]}

    def post_event(self, event: dict[str, Any]) -> None:
        """Queue an Event to create (never blocks; drops when the queue is full)."""
        with contextlib.suppress(asyncio.QueueFull):
            self._events.put_nowait(event)

    def poke(self) -> None:
        """Something changed (a denial, a cache event): write status soon rather than next interval."""
        self._wake.set()

    async def seed(self) -> int:
        """Take the statuses stored now as written (what a reader sees), so that a new leader PATCHes only
        the ones that differ from what it computes, and carries their lastTransitionTimes on. Without it every
        start or failover re-wrote every CriticalService's status (1,000 PATCHes at 1,000 CriticalServices,
        python -m benchmarks realscale) and reset each condition's lastTransitionTime to the restart. One
        paged LIST; returns the statuses taken. A failed LIST seeds nothing (every status is written, as before).
        """
        from kubernetes.aio import client

        api = client.CustomObjectsApi(self.api_client)
        seeded, token = 0, None
        try:
            while True:
                page = await api.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=500, _continue=token)
                if not isinstance(page, dict):
                    raise TypeError(f"a LIST of {PLURAL} answered {type(page).__name__}, not an object")
                for item in page.get("items") or []:
                    metadata, status = item.get("metadata") or {}, item.get("status")
                    if isinstance(status, dict) and metadata.get("name") and metadata.get("uid"):
                        self._written.setdefault((metadata["name"], metadata["uid"]), status)
                        seeded += 1
                token = (page.get("metadata") or {}).get("continue")
                if not token:
                    return seeded
        except Exception as exc:
            log.warning("could not read the stored statuses; writing every status", error=str(exc))
            return seeded

    async def _lead(self) -> None:
        self.leading = True
        log.info("leading: writing CriticalService status", identity=self.identity)
        try:
            await self.seed()
            pause = min(MIN_PASS_INTERVAL, self.interval)
            loop = asyncio.get_running_loop()
            while True:
                self._wake.clear()  # a poke during the pass or the pause below runs the next pass after the pause
                self._soon.clear()
                self._soon_pending.clear()
                started = loop.time()
                await self.sync_once()
                # A denial's poke waits out `pause`; a Ready still to show (`_pending`) does not: the next pass
                # follows the routes' or labels' change, or the cache event that stores a label, after SOON_PAUSE
                # (paced to a third of the loop), so Ready says Enforcing within a watch event of the truth.
                # Paced on the loop time the pass held, never its length: a pass that waited for its PATCHes and
                # for the reviews in between took minutes while 10,000 CriticalServices were created, and
                # pausing twice that left 6,720 of them without a status for 11 minutes.
                # During that pause, what may turn a pending Ready runs a pass over the pending ones alone.
                until = loop.time() + pause
                await self._pending_passes(loop.time() + min(self.interval, max(SOON_PAUSE, 2 * self.busy)))
                await self._next_pass(until, started + self.interval)
        finally:
            self.leading = False

    async def _next_pass(self, pause_until: float, interval_until: float) -> None:
        """Wait for the next pass: a poke after pause_until, a soon poke or (while a Ready is pending) a cache
        event at once, and interval_until at the latest."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if self._soon.is_set() or now >= interval_until or (self._wake.is_set() and now >= pause_until):
                return
            timeout = min(interval_until, pause_until if self._wake.is_set() else interval_until) - now
            if await self._wait([self._soon] if self._wake.is_set() else [self._soon, self._wake], timeout):
                return  # a cache event while a Ready is pending: it may be the label stored

    async def _pending_passes(self, until: float) -> None:
        """Pause until `until`; meanwhile a soon poke, or a cache event while a Ready is pending, runs sync_pending,
        each paced (as a whole pass is) on the loop time it held."""
        loop = asyncio.get_running_loop()
        while (now := loop.time()) < until:
            stored = await self._wait([self._soon_pending], until - now)
            if not (self._soon_pending.is_set() or stored):
                continue
            self._soon_pending.clear()
            await self.sync_pending()
            await asyncio.sleep(max(SOON_PAUSE, 2 * self.busy))

    async def _wait(self, events: list[asyncio.Event], timeout: float) -> bool:
        """Wait up to `timeout` for one of `events`, or (while a Ready is pending) a cache event: whether that came."""
        wait_event = getattr(self.source, "wait_event", None)
        waits = [asyncio.ensure_future(e.wait()) for e in events]
        event = asyncio.ensure_future(wait_event(timeout)) \
            if callable(wait_event) and self._pending else None
        if event is not None:
            waits.append(event)
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        return bool(event is not None and event.done() and not event.cancelled() and event.result())

    def poke_soon(self) -> None:
        """The routes or the labels changed: a Ready may turn, so the next pass runs without the denials' pause (and,
        during the pause after a pass, a pass over the pending ones at once)."""
        self._soon.set()
        self._soon_pending.set()

    async def run_elected(self) -> None:
        """Campaign for the Lease forever; write status while leading."""
        from kubernetes.aio.leaderelection import electionconfig, leaderelection

        while True:
            lock = _lease_lock(self.lease_name, self.namespace, self.identity, self.api_client)
            config = electionconfig.Config(lock, LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD,
                                           self._lead, lambda: log.info("lost the status lease"))
            try:
                await leaderelection.LeaderElection(config).run()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("leader election failed", error=str(exc))
            await asyncio.sleep(RETRY_PERIOD)

    # --- events (every replica) -------------------------------------------------------------------
    def record(self, request: AdmissionRequest, decision: Decision) -> None:
        """Queue Events for a denial, and for spec.recreatedProvider set or letting a CriticalService go (never
        blocks the admission path; drops when the queue is full)."""
        if decision.allowed and decision.recreated_provider and not request.dry_run:
            self._recreated_provider_event(request, decision)
            return
        if decision.allowed or request.dry_run or not decision.blocking:
            return
        state = self.source.state
        uids = {cs.name: cs.uid for cs in state.critical_services()}
        old = request.old_object if isinstance(request.old_object, Mapping) else {}
        deleter = of_request(request.username, old.get("metadata") if isinstance(old.get("metadata"), Mapping)
                             else None)
        for service in decision.blocking:
            if request.operation == "DELETE":  # the last refused deleter counts; one without evidence clears it
                key = (service, uids.get(service, ""))
                if self._deleters.get(key) != deleter:
                    self._deleters_changed += 1
                if deleter is None:
                    self._deleters.pop(key, None)
                else:
                    self._deleters[key] = deleter
            event = self.recorder.denial(service=service, service_uid=uids.get(service, ""), target=request.ref,
                                         message=decision.message, now=self.clock(), user=request.username,
                                         operation=request.operation)
            if event is not None:
                with contextlib.suppress(asyncio.QueueFull):
                    self._events.put_nowait(event)
        self.poke()

    def _recreated_provider_event(self, request: AdmissionRequest, decision: Decision) -> None:
        # Who set the intent, and when it let a CriticalService go, on the CriticalService itself (the audit
        # annotation says the same to whoever reads the audit log).
        cs = next((c for c in self.source.state.critical_services() if c.name == request.name), None)
        involved = {"apiVersion": API_VERSION, "kind": KIND, "name": request.name, "uid": cs.uid if cs else ""}
        orphaned = decision.rule == Rule.RECREATED_PROVIDER_ORPHANED
        who = request.username or "someone"
        message = (f"deleted by {who}: " if orphaned else "") + "; ".join(decision.warnings)
        event = object_event(involved=involved, reason="RecreatedProviderOrphaned" if orphaned else
                             "RecreatedProviderIntent", message=message or str(decision.recreated_provider),
                             now=self.clock(), warning=True, name_hint=request.name)
        self.post_event(event)

    async def run_events(self) -> None:
        from kubernetes.aio import client

        core = client.CoreV1Api(self.api_client)
        while True:
            batch = [await self._events.get()]
            while not self._events.empty():
                batch.append(self._events.get_nowait())
            for event, create in _coalesced(batch):
                await self._write_event(core, event, create=create)
            await asyncio.sleep(self.event_batch_pause)

    async def _write_event(self, core: Any, event: dict[str, Any], *, create: bool) -> None:
        from kubernetes.aio import client

        ns, name = event["metadata"]["namespace"], event["metadata"]["name"]
        try:
            if not create:
                await core.patch_namespaced_event(
                    name, ns, {"count": event["count"], "lastTimestamp": event["lastTimestamp"],
                               "message": event["message"]},
                    _content_type="application/merge-patch+json", _request_timeout=EVENT_TIMEOUT)
            else:
                model = client.CoreV1Event.from_dict(event)
                assert model is not None  # from_dict returns None only for None input
                await core.create_namespaced_event(ns, model, _request_timeout=EVENT_TIMEOUT)
        except Exception as exc:
            # Not `event=`: structlog's first argument is the event, and a clash raised TypeError here,
            # which ended this task - after the first failed write no Event was ever written again.
            log.warning("event write failed", event_name=name, namespace=ns, error=str(exc))


def _coalesced(batch: list[dict[str, Any]]) -> list[tuple[dict[str, Any], bool]]:
    """One write per Event of `batch`, in order of first appearance: (its latest state, the highest count;
    whether to create it, as when any of the batch's was its first)."""
    latest: dict[tuple[str, str], tuple[dict[str, Any], bool]] = {}
    for event in batch:
        key = (event["metadata"]["namespace"], event["metadata"]["name"])
        create = event["count"] == 1 or (key in latest and latest[key][1])
        latest[key] = (event, create)
    return list(latest.values())


def _lease_lock(name: str, namespace: str, identity: str, api_client: Any) -> Any:
    """kubernetes.aio's LeaseLock, with `create` fixed.

    kubernetes 37.0.2's LeaseLock.create passes `pretty=True`, which the generated (pydantic) client
    rejects as a non-string, so the first candidate can never create the Lease and nobody ever leads.
    """
    from kubernetes.aio import client
    from kubernetes.aio.client.exceptions import ApiException
    from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

    class _LeaseLock(LeaseLock):
        async def create(self, name: str, namespace: str, election_record: Any) -> bool:
            body = client.V1Lease(metadata=client.V1ObjectMeta(name=name), spec=self.update_lease(election_record))
            try:
                await self.api_instance.create_namespaced_lease(namespace, body)
            except ApiException as exc:
                log.warning("could not create the status lease", lease=name, error=str(exc))
                return False
            return True

    return _LeaseLock(name, namespace, identity, api_client)
