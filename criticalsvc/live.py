"""Live confirmation: before an ALLOW of a protected deletion stands, decide again on fresh reads.

The caches may lag the API server by a few events; a denial from a slightly stale cache is safe
(the deleter retries), an ALLOW is not. So an ALLOW that a CriticalService had a say in is decided
again by the same pure `decide`, on a `LiveState` whose every answer comes from a read made for this
confirmation, without `resourceVersion` (a consistent, quorum read; "0" could be served from the
API server's own watch cache and be just as stale as ours):

    get(ref)                 GET  .../<resource>/<name>
    select(gr, ns, sel)      LIST .../<resource>?labelSelector=<sel> (and again filtered here)
    with_finalizer(gr, f)    LIST .../<resource>, filtered here (no field selector exists for it); for a
                             type of CATCH_UP_ABOVE objects or more, the gate's own cache of it brought up
                             to a consistent read's version by a watch (criticalsvc/cache/catchup.py)
    critical_services()      LIST of criticalservices
    protecting(o), hosted_in(ns)
                             LIST of criticalservices?fieldSelector=spec.provider.namespace=<ns>, and =""
                             (a provider with no namespace: cluster-scoped, or a selector over all of them),
                             for `protecting` with ,spec.provider.group=<the object's group>; filtered here
                             again; a provider selector is matched against the request's labels,
                             or a fresh GET's. The whole list when this confirmation read it anyway
    resolve(gr)              the cache's mapper when it knows the name; otherwise the group's fresh
                             discovery documents, so a type whose CRD appeared a moment ago is seen

How a synchronous `decide` reads asynchronously. `decide` is pure and synchronous; a blocking read
inside it would stall the event loop (and every other review with it), and worker threads are few
(~6 on 2 cores). So the LiveState (criticalsvc/livestate.py) is a memo of answers, filled between runs of
`decide`: a run that asks a question not yet answered records it, gets an empty placeholder answer and carries on (to
collect the other questions of that path); its decision is thrown away, the recorded questions are
read concurrently, and `decide` runs again. A run that asked nothing new is the answer, built from
fresh reads only. A typical provider deletion takes three rounds (the CriticalService list, then
the criteria's objects, then the final run) — two round trips to the API server.

One read per question at a time. In a teardown many confirmations ask the same questions at once (every
one begins with the LIST of CriticalServices), and at 1,000 CriticalServices those LISTs were most of what
the gate asked of the API server (design/operations.md, "Real scale"). A fresh read is shared, but only
with confirmations that began before it was sent, so each still decides on a read made after its request
arrived: a question whose read is in flight, sent before this confirmation began, waits for the next read,
which is sent when that one ends and shared by everyone who asked meanwhile. So reads of one question never
overlap, the API server sees at most one per read's duration, and a confirmation waits at most two reads.

Failure is a denial. Any read that fails or is not answered within the budget is memoised as
`LiveReadFailed` (a StateUnavailable; `LiveReadTimeout` is also a TimeoutError); when the final path
reaches it, `decide` turns it into its "could not verify" denial. `LiveReader.decide` returns that
denial; `LiveReader.confirm`, the webhook's callback, raises the failure instead, so the webhook
counts it (criticalsvc_live_confirmation_failures_total{reason="timeout"|"error"}) and denies with
"could not verify". The budget is 2 s for the whole confirmation: the API server gives the webhook
10 s by default (deploy/ sets timeoutSeconds: 5) and the webhook bounds its callback at 3 s
(server.DEFAULT_CONFIRM_TIMEOUT); finishing first means the denial names the read that failed rather
than a bare timeout, and 2 s still leaves the API server's own client time to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

import attrs
import structlog

from . import criteria
from .admission import AdmissionRequest
from .api import (
    CRITICAL_SERVICES,
    NAMESPACES,
    VERSION,
    Criterion,
    CriticalService,
    GroupResource,
    ObjectRef,
)
from .cache.catchup import CatchUpFailed, MirrorView, catch_up
from .cache.discovery import discover_group
from .cache.transport import (
    ACCEPT_METADATA,
    ACCEPT_METADATA_LIST,
    APIError,
    APIStatusError,
    Transport,
    TransportError,
    list_items,
)
from .caughtup import CaughtUpDecision, CaughtUpReader
from .decision import Decision, Rule, decide, deny
from .errors import InvalidInput, StateUnavailable
from .livestate import (
    FailureReason,
    LiveReadFailed,
    LiveReadTimeout,
    LiveState,
    Question,
    describe,
    predict_questions,
    provided_in,
)
from .objects import KubeObject
from .restmapper import ResourceType, RESTMapper
from .state import ClusterState

log = structlog.get_logger("criticalsvc.live")

# The whole confirmation's budget; see the module docstring for the arithmetic.
CONFIRM_TIMEOUT = 2.0
# Rounds are bounded by the number of distinct questions a decision can ask (a handful per
# CriticalService involved); 8 covers a namespace hosting several protected providers.
MAX_ROUNDS = 8
PAGE_SIZE = 500
# A Finalizer criterion over a type the cache holds this many objects of is read from the cache, caught
# up to a fresh version (criticalsvc/cache/catchup.py), instead of LISTed: a LIST costs ~20-45 us an object
# (design/operations.md, "Real scale"), so at 20,000 it takes about what the catch-up's bookmark does (~1 s).
CATCH_UP_ABOVE = 20_000
# A catch-up's budget: its bookmark comes up to 2.25 s after its watch opens (criticalsvc/cache/catchup.py),
# after one small LIST. Within the webhook's outer bound (server.DEFAULT_CONFIRM_TIMEOUT, 4 s) and the
# API server's timeoutSeconds (5 s).
CATCH_UP_TIMEOUT = 3.5

# The CRD's selectable field (api/criticalservices.criticalsvc.io.yaml) a LIST of CriticalServices may filter on:
# the API server then serializes only the CriticalServices that could protect an object in one namespace.
PROVIDER_NAMESPACE_FIELD = "spec.provider.namespace"
PROVIDER_GROUP_FIELD = "spec.provider.group"


@attrs.define
class _Flights:
    """The reads of one question: the one in flight (sent at `sent`, monotonic) and the next, which waits
    for it to end and is shared by every confirmation that began after `sent`."""

    current: asyncio.Task[Any] | None = None
    sent: float = 0.0
    queued: asyncio.Task[Any] | None = None


class Mirror(Protocol):
    """The gate's own cache, as far as a catch-up reads it (CacheState)."""

    def carriers(self, gr: GroupResource, finalizer: str) -> MirrorView | None: ...


# How a Finalizer criterion's objects were read, for criticalsvc_finalizer_read_seconds{method}.
ReadMethod = Literal["list", "mirror", "watch"]


def _retrieve(task: asyncio.Task[Any]) -> None:
    """A shared read whose every waiter gave up keeps its outcome to itself (no "never retrieved" warning)."""
    if not task.cancelled():
        task.exception()


def _version_key(item: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, resourceVersion) of a stored object, or None when it lacks either."""
    metadata = item.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    uid, version = metadata.get("uid"), metadata.get("resourceVersion")
    return (uid, version) if isinstance(uid, str) and uid and isinstance(version, str) and version else None


@attrs.frozen
class RefusedConfirmation:
    """A DELETE (or UPDATE) the caches would allow but a fresh read could not confirm: when, and why."""

    at: float  # time.time()
    message: str


# What the reader remembers of refused confirmations, for status (criticalsvc/status.py, CannotConfirm).
MAX_REFUSED = 1000


@attrs.frozen
class Confirmation:
    """What a confirmation did, for metrics and logs."""

    decision: Decision
    confirmed: bool  # False when no fresh read was needed
    rounds: int = 0
    # The read that made `decision` a "could not verify" denial, if one did.
    error: LiveReadFailed | None = None
    # Set when the decision was made on the cache caught up to one consistent read (criticalsvc/caughtup.py).
    caught_up: CaughtUpDecision | None = None

    @property
    def failure(self) -> FailureReason | None:
        return self.error.reason if self.error is not None else None


class LiveReader:
    """Fresh reads from the API server; `confirm` is the server's async confirmation callback."""

    def __init__(self, transport: Transport, *, mapper: RESTMapper | None = None, timeout: float = CONFIRM_TIMEOUT,
                 max_rounds: int = MAX_ROUNDS, confirm_unprotected: bool = False,
                 on_failure: Callable[[FailureReason], None] | None = None, mirror: Mirror | None = None,
                 catch_up_above: int = CATCH_UP_ABOVE, catch_up_timeout: float = CATCH_UP_TIMEOUT,
                 on_finalizer_read: Callable[[ReadMethod, float], None] | None = None,
                 caught_up: CaughtUpReader | None = None,
                 on_caught_up: Callable[[CaughtUpDecision, float], None] | None = None,
                 predict_from: ClusterState | None = None) -> None:
        self.transport = transport
        # With it, a confirmation whose decision reads a type of catch_up_above objects or more is made on the
        # cache caught up to one consistent read (criticalsvc/caughtup.py); the fresh reads below if that fails.
        self.caught_up = caught_up
        self.on_caught_up = on_caught_up  # (what it took, seconds) after each decision on the caught-up cache
        # With it, the questions the cache foresees are read in the first round, together (predict_questions).
        self.predict_from = predict_from
        self.mapper = mapper
        self.timeout = timeout
        # Without a mirror every Finalizer criterion is read by LIST.
        self.mirror = mirror
        self.catch_up_above = catch_up_above
        self.catch_up_timeout = catch_up_timeout
        self.on_finalizer_read = on_finalizer_read
        self.max_rounds = max_rounds
        self.confirm_unprotected = confirm_unprotected
        self.on_failure = on_failure
        # Every confirmation LISTs all CriticalServices; parsing one (its criteria, its conditions) costs
        # ~225 us, so at 1,000 of them a confirmation spent ~0.2 s of CPU on parsing alone and a 100-stack
        # teardown never finished (python -m benchmarks realscale, design/operations.md "Real scale").
        # A stored object's resourceVersion changes with every write to it, so (uid, resourceVersion)
        # names one parse exactly; each memo keeps only what its latest LIST held.
        # One memo per read: the whole list (None), or a narrow one by (provider namespace, group or None).
        self._parsed: dict[tuple[str, str | None] | None, dict[tuple[str, str], CriticalService | None]] = {}
        self._flights: dict[Question, _Flights] = {}
        self.reads = 0  # fresh reads sent, shared ones once
        # The object of each request whose confirmation failed, until one of it succeeds: the caches may see a
        # provider's criteria met while every fresh read of them fails (a Finalizer criterion over a type too
        # large to LIST within the budget), and then its status must not say "may go" (StatusWriter reads this).
        self.refused: dict[ObjectRef, RefusedConfirmation] = {}
        self.refused_changes = 0

    def needs_confirmation(self, request: AdmissionRequest, decision: Decision) -> bool:
        """Only ALLOWs are confirmed; among them, those a CriticalService had a say in.

        Also the ALLOW of a namespace deletion nothing protects by the cache: a stale cache that
        missed a provider in it would otherwise let the whole namespace go (one LIST of
        CriticalServices settles it). Break-glass is not confirmed: it allows whatever the state.
        """
        if not decision.allowed or decision.rule in (Rule.BREAK_GLASS, Rule.ALREADY_TERMINATING, Rule.NOT_GATED):
            return False
        if decision.protected or decision.rule in (Rule.CRITERIA_MET, Rule.WARN_ONLY):
            return True
        if decision.rule == Rule.UNPROTECTED and request.operation == "DELETE":
            return self.confirm_unprotected or request.group_resource == NAMESPACES
        return False

    async def confirm(self, request: AdmissionRequest, decision: Decision) -> Decision:
        """`decision` (from the cache) if it needs no confirmation, else the decision on fresh reads.

        Raises LiveReadFailed (LiveReadTimeout for a timeout) when a read the decision needed failed:
        the webhook then denies with "could not verify" and counts the failure by its reason.
        """
        confirmation = await self.confirmation(request, decision)
        if confirmation.confirmed:
            self._remember(request.ref, confirmation.error)
        if confirmation.error is not None:
            raise confirmation.error
        return confirmation.decision

    def _remember(self, ref: ObjectRef, error: LiveReadFailed | None) -> None:
        if error is None:
            if self.refused.pop(ref, None) is not None:
                self.refused_changes += 1
            return
        self.refused.pop(ref, None)  # re-inserted last: the dict stays oldest first
        self.refused[ref] = RefusedConfirmation(time.time(), str(error))
        while len(self.refused) > MAX_REFUSED:
            del self.refused[next(iter(self.refused))]
        self.refused_changes += 1

    async def confirmation(self, request: AdmissionRequest, decision: Decision) -> Confirmation:
        if not self.needs_confirmation(request, decision):
            return Confirmation(decision, confirmed=False)
        return await self.decide(request)

    def _on_caught_up_cache(self, foreseen: set[Question]) -> bool:
        """Whether to confirm on the caught-up cache: some fresh read the decision needs would bring catch_up_above
        objects or more (as the cache counts them). Below that the fresh reads are quicker: a type nobody changed
        lags the caught-up cache's version at almost every request and costs a bookmark, 1-2.25 s
        (design/kubernetes-semantics.md §13.1), where a GET of one object, a LIST of a namespace or a selector
        costs milliseconds at any size of the type."""
        if self.caught_up is None:
            return False
        cache = self.caught_up.cache
        if self.catch_up_above == 0:
            return True
        for q in foreseen:
            match q:
                case ("services",):
                    size = cache.count(CRITICAL_SERVICES)
                case ("services-in", *_):
                    size = 1  # the API server sends only those in one namespace (PROVIDER_NAMESPACE_FIELD)
                case ("carriers", GroupResource() as gr, *_):
                    size = cache.count(gr)  # no selector exists for finalizers: the LIST is of the whole type
                case ("list", GroupResource() as gr, namespace, *_):
                    size = 1
                    with contextlib.suppress(StateUnavailable):
                        size = len(cache.state.select(gr, namespace=namespace if isinstance(namespace, str) else None,
                                                      selector=None))
                case _:
                    size = 1
            if size >= self.catch_up_above:
                return True
        return False

    async def decide(self, request: AdmissionRequest) -> Confirmation:
        """`decide(request, <fresh reads>)`; a read that fails or times out makes it a denial."""
        began = time.monotonic()
        # What the cache foresees chooses the confirmation and is read first; one run of `decide` on the cache.
        source = self.predict_from or (self.caught_up.cache.state if self.caught_up is not None else None)
        foreseen = predict_questions(request, source, mapper=self.mapper) if source is not None else set()
        if self.caught_up is not None and self._on_caught_up_cache(foreseen):
            try:
                caught = await self.caught_up.decide(request, deadline=began + self.catch_up_timeout)
            except (CatchUpFailed, TimeoutError, APIError) as exc:
                # Never an ALLOW: the fresh reads decide instead, within what is left of the budget.
                log.info("the caught-up cache could not decide; reading fresh", error=str(exc) or type(exc).__name__)
            else:
                if self.on_caught_up is not None:
                    self.on_caught_up(caught, time.monotonic() - began)
                return Confirmation(caught.decision, confirmed=True, rounds=caught.rounds, caught_up=caught)
        memo: dict[Question, Any] = {}
        if self.predict_from is not None and foreseen:
            await self._fetch(foreseen, memo, began)
        for round_ in range(1, self.max_rounds + 1):
            live = LiveState(memo, mapper=self.mapper)
            decision = decide(request, live)
            if not live.missing:
                error = live.failure if decision.rule == Rule.UNVERIFIABLE else None
                if error is not None and self.on_failure is not None:
                    self.on_failure(error.reason)
                return Confirmation(decision, confirmed=True, rounds=round_, error=error)
            await self._fetch(live.missing, memo, began)
        error = LiveReadFailed(f"the fresh read needed more than {self.max_rounds} rounds")
        if self.on_failure is not None:
            self.on_failure(error.reason)
        return Confirmation(deny(Rule.UNVERIFIABLE, "criticalsvc could not verify the cluster state, so it does "
                                 f"not allow this yet: {error}", protected=True),
                            confirmed=True, rounds=self.max_rounds, error=error)

    # --- reads ----------------------------------------------------------------------------------------
    def _budget(self, q: Question) -> float:
        """How long a read of `q` may take: a Finalizer question may need a catch-up, which waits for a bookmark."""
        return max(self.timeout, self.catch_up_timeout) if q[0] == "carriers" and self.mirror is not None \
            else self.timeout

    async def _fetch(self, questions: set[Question], memo: dict[Question, Any], began: float) -> None:
        tasks = {self._shared(q, began): q for q in questions}
        budget = max(self._budget(q) for q in questions)
        remaining = max(0.0, began + budget - time.monotonic())
        # A read still running when this confirmation's budget is spent is left to end within its own
        # (others may be waiting for it); here it counts as a timeout.
        _done, pending = await asyncio.wait(tasks, timeout=remaining)
        for task, q in tasks.items():
            if task in pending or task.cancelled():
                memo[q] = LiveReadTimeout(f"a fresh read of {describe(q)} got no answer within {budget:g} s")
                continue
            exc = task.exception()
            if isinstance(exc, TimeoutError) or (isinstance(exc, TransportError) and "timed out" in str(exc)):
                memo[q] = LiveReadTimeout(f"a fresh read of {describe(q)} timed out: {exc}")
            elif isinstance(exc, APIError | InvalidInput):
                memo[q] = LiveReadFailed(f"a fresh read of {describe(q)} from the API server failed: {exc}",
                                         reason="error")
            elif exc is not None:
                raise exc
            else:
                memo[q] = task.result()

    def _shared(self, q: Question, began: float) -> asyncio.Task[Any]:
        """The read answering `q` for a confirmation that began at `began`: the one in flight if it was sent
        after that, else the next one (started now if nothing is in flight)."""
        flights = self._flights.setdefault(q, _Flights())
        if flights.current is not None and flights.sent >= began:
            return flights.current
        if flights.queued is None:
            flights.queued = asyncio.ensure_future(self._flight(q, flights, after=flights.current))
            flights.queued.add_done_callback(_retrieve)
        return flights.queued

    async def _flight(self, q: Question, flights: _Flights, *, after: asyncio.Task[Any] | None) -> Any:
        me = asyncio.current_task()
        if after is not None:
            await asyncio.wait([after])
        flights.current, flights.sent, flights.queued = me, time.monotonic(), None
        self.reads += 1
        try:
            # Its own budget: the confirmations sharing it began at different moments and each waits only
            # as long as its own allows. The memo is this read's alone (discovery it needed on the way).
            return await self._read(q, {}, time.monotonic() + self._budget(q))
        finally:
            if flights.current is me:
                flights.current = None
            if flights.current is None and flights.queued is None and self._flights.get(q) is flights:
                del self._flights[q]

    async def _read(self, q: Question, memo: Mapping[Question, Any], deadline: float) -> Any:
        match q:
            case ("group", str(group)):
                types = await discover_group(self.transport, group, timeout=self._left(deadline))
                return RESTMapper(types) if types is not None else None
            case ("services",):
                return await self._services(memo, deadline)
            case ("services-in", str(namespace), group):
                return await self._services(memo, deadline, provider_namespace=namespace,
                                            provider_group=group if isinstance(group, str) else None)
            case ("get", GroupResource() as gr, str(namespace), str(name), frozenset() as conditioned):
                return await self._get(gr, namespace, name, conditioned, memo, deadline)
            case ("list", GroupResource() as gr, namespace, str(selector), frozenset() as conditioned):
                return await self._list(gr, namespace if isinstance(namespace, str) else None, selector, conditioned,
                                        memo, deadline)
            case ("carriers", GroupResource() as gr, str(finalizer), frozenset() as conditioned):
                return await self._carriers(gr, finalizer, conditioned, memo, deadline)
        raise TypeError(f"unknown question {q!r}")

    def _left(self, deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the confirmation budget is spent")
        return left

    async def _type(self, gr: GroupResource, memo: Mapping[Question, Any], deadline: float, *,
                    fresh: bool = False) -> ResourceType | None:
        if not fresh and self.mapper is not None:
            t = self.mapper.lookup(gr)
            if t is not None:
                return t
        group = memo.get(("group", gr.group))
        if fresh or not isinstance(group, RESTMapper):
            types = await discover_group(self.transport, gr.group, timeout=self._left(deadline))
            group = RESTMapper(types) if types is not None else None
        return group.lookup(gr) if isinstance(group, RESTMapper) else None

    async def _with_type(self, gr: GroupResource, memo: Mapping[Question, Any], deadline: float,
                         read: Callable[[ResourceType], Any], empty: Any) -> Any:
        """Run `read(type)`; a 404 for a type known only from the cache is checked against fresh discovery."""
        t = await self._type(gr, memo, deadline)
        if t is None:
            return empty
        try:
            return await read(t)
        except APIStatusError as exc:
            if not exc.not_found:
                raise
            if exc.details.get("name"):
                return empty  # the object is not there (the resource is)
        fresh = await self._type(gr, memo, deadline, fresh=True)
        if fresh is None or fresh.version == t.version:
            return empty  # not served (any more): no such object can exist
        try:
            return await read(fresh)
        except APIStatusError as exc:
            if exc.not_found:
                return empty
            raise

    async def _get(self, gr: GroupResource, namespace: str, name: str, conditioned: frozenset[Criterion],
                   memo: Mapping[Question, Any], deadline: float) -> KubeObject | None:
        async def read(t: ResourceType) -> KubeObject | None:
            if t.namespaced != bool(namespace):
                return None  # a namespaced object named without namespace (or the reverse) cannot exist
            # A condition reads spec and status: only then is the whole object worth its bytes.
            obj = await self.transport.get(t.path(namespace=namespace, name=name), timeout=self._left(deadline),
                                           accept="application/json" if conditioned else ACCEPT_METADATA)
            return criteria.project_for(obj, t.group_resource, conditioned)

        result: KubeObject | None = await self._with_type(gr, memo, deadline, read, None)
        return result

    async def _list(self, gr: GroupResource, namespace: str | None, selector: str, conditioned: frozenset[Criterion],
                    memo: Mapping[Question, Any], deadline: float) -> list[KubeObject]:
        async def read(t: ResourceType) -> list[KubeObject]:
            items = await self._list_items(t.path(namespace=namespace), selector, deadline,
                                           accept="application/json" if conditioned else ACCEPT_METADATA_LIST)
            return [criteria.project_for(i, t.group_resource, conditioned) for i in items]

        result: list[KubeObject] = await self._with_type(gr, memo, deadline, read, [])
        return result

    async def _carriers(self, gr: GroupResource, finalizer: str, conditioned: frozenset[Criterion],
                        memo: Mapping[Question, Any], deadline: float) -> list[KubeObject]:
        """The objects of gr carrying `finalizer`, as of a version read after this read began."""
        accept = "application/json" if conditioned else ACCEPT_METADATA_LIST

        def keep(raw: Mapping[str, Any], t: ResourceType) -> KubeObject | None:
            obj = criteria.project_for(raw, t.group_resource, conditioned)
            return obj if finalizer in obj.finalizers else None

        async def read(t: ResourceType) -> list[KubeObject]:
            started = time.monotonic()
            view = self.mirror.carriers(t.group_resource, finalizer) if self.mirror is not None else None
            if view is not None and view.total >= self.catch_up_above:
                try:
                    caught = await catch_up(self.transport, t, view, keep=lambda raw: keep(raw, t), deadline=deadline,
                                            accept="application/json" if conditioned else ACCEPT_METADATA)
                except CatchUpFailed as exc:
                    # Rare: the cache's version left the API server's window of events (410: its watch is itself
                    # about to see it and list again), or versions that do not compare. The LIST may not fit what
                    # is left of the budget; then it is a denial, never an ALLOW.
                    log.info("catch-up failed; listing instead", resource=str(t.group_resource), error=str(exc))
                else:
                    self._finalizer_read("watch" if caught.watches else "mirror", started)
                    return caught.objects
            items = await self._list_items(t.path(), "", deadline, accept=accept)
            held = [obj for obj in (keep(i, t) for i in items) if obj is not None]
            self._finalizer_read("list", started)
            return held

        result: list[KubeObject] = await self._with_type(gr, memo, deadline, read, [])
        return result

    def _finalizer_read(self, method: ReadMethod, started: float) -> None:
        if self.on_finalizer_read is not None:
            self.on_finalizer_read(method, time.monotonic() - started)

    async def _services(self, memo: Mapping[Question, Any], deadline: float, *, provider_namespace: str | None = None,
                        provider_group: str | None = None) -> list[CriticalService]:
        """Every CriticalService; with `provider_namespace`, those whose provider is in it ("": names none), and
        with `provider_group` too, of that API group."""
        narrow = None if provider_namespace is None else (provider_namespace, provider_group)
        from .api import parse_critical_service

        async def read(t: ResourceType) -> list[CriticalService]:
            fields = "" if provider_namespace is None else f"{PROVIDER_NAMESPACE_FIELD}={provider_namespace}"
            if fields and provider_group is not None:
                fields += f",{PROVIDER_GROUP_FIELD}={provider_group}"
            try:
                items = await self._list_items(t.path(), "", deadline, accept="application/json", fields=fields)
            except APIStatusError as exc:
                # A CRD installed before its selectableFields (an upgrade under way): the whole list, filtered here.
                if not fields or exc.code != 400:
                    raise
                items = await self._list_items(t.path(), "", deadline, accept="application/json")
            previous = self._parsed.get(narrow, {})
            out: list[CriticalService] = []
            parsed: dict[tuple[str, str], CriticalService | None] = {}
            for item in items:
                key = _version_key(item)
                if key is not None and key in previous:
                    cs = previous[key]
                else:
                    try:
                        cs = parse_critical_service(item, lenient_conditions=True)
                    except InvalidInput:
                        cs = None  # as in the cache: an invalid spec protects nothing
                if key is not None:
                    parsed[key] = cs
                # Filtered here too: the answer must not depend on the server honouring the field selector.
                if cs is not None and provided_in(cs, provider_namespace, provider_group):
                    out.append(cs)
            self._parsed[narrow] = parsed
            return out

        if self.mapper is None or self.mapper.lookup(CRITICAL_SERVICES) is None:
            # Without a hint the CRD's version is known: it is ours.
            t = ResourceType("criticalsvc.io", VERSION, "CriticalService", "criticalservices", "criticalservice",
                             False, ("csvc",))
            try:
                return await read(t)
            except APIStatusError as exc:
                if exc.not_found:
                    return []  # the CRD is not installed: no CriticalService exists
                raise
        result: list[CriticalService] = await self._with_type(CRITICAL_SERVICES, memo, deadline, read, [])
        return result

    async def _list_items(self, path: str, selector: str, deadline: float, *, accept: str,
                          fields: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        base: list[tuple[str, str]] = [("limit", str(PAGE_SIZE))]
        if selector:
            base.append(("labelSelector", selector))
        if fields:
            base.append(("fieldSelector", fields))
        params = base
        while True:
            # No resourceVersion: a consistent read, the point of confirming.
            page = await self.transport.get(path, params, timeout=self._left(deadline), accept=accept)
            page_items = list_items(page)
            if page_items is None:
                raise TransportError(f"LIST {path}: the answer has no items")
            items.extend(i for i in page_items if isinstance(i, dict))
            metadata: Mapping[str, Any] = page["metadata"] if isinstance(page.get("metadata"), Mapping) else {}
            token = metadata.get("continue")
            if not token:
                return items
            params = [*base, ("continue", str(token))]


__all__ = ["CONFIRM_TIMEOUT", "MAX_ROUNDS", "Confirmation", "LiveReader", "RefusedConfirmation"]
