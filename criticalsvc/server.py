"""The webhook's HTTP layer: a starlette app that answers AdmissionReviews with the pure `decide`.

    POST /validate   AdmissionReview v1 in, AdmissionReview out (every gated DELETE, the routed
                     UPDATEs of providers and the CriticalService CREATE/UPDATE share this one path:
                     `decide` tells them apart)
    GET  /healthz    200 while the process serves at all
    GET  /readyz     200 when the state source is ready, else 503 with the reason
    GET  /metrics    Prometheus text (criticalsvc.metrics)

`Webhook.webhook_app()` serves all four (the TLS listener); `Webhook.ops_app()` serves only the last
three (the plain-HTTP ops listener, so probes and scrapes work when client certificates are required).

Where the state comes from is not this module's business: a `StateSource` says whether it is
`ready` and hands out a `ClusterState` (`state`). `serve --state` uses `StaticStateSource`; the live
service plugs in its watch caches (`criticalsvc.cache.CacheState`: ready = every cache synced) and a
`Confirm` callback that decides again on fresh reads from the API server. Which cache decisions are
sent to it is `needs_confirmation`'s call (default: every ALLOW a CriticalService had a say in); the
live reader's own `needs_confirmation` can be passed to also confirm, e.g., unprotected namespaces.

Answers, in the order they are checked:

    413  body over max_body_bytes (Content-Length, or counted while streaming; never read in full)
    400  not an AdmissionReview v1: wrong Content-Type, not JSON, not an object, bad apiVersion/kind,
         no request.uid ... ; the JSON body {"error": "<field path>: <problem>"} names the field
    503  the state source is not ready; the API server then applies the webhook's failurePolicy
         (design/kubernetes-semantics.md §1.5) - the gate does not guess on unsynced data
    200  an AdmissionReview response; an unexpected exception while deciding becomes a DENY (fail
         closed) with the exception logged, never a 500

The decision runs in the event loop: `decide` is pure and takes well under a millisecond (it reads
indexes, O(matching CriticalServices)), so a thread hop would cost more than it saves. Only the
confirmation awaits I/O, bounded by `confirm_timeout`.

Each answered review produces one log line (`event="decision"`) with the request's identity and the
outcome, never object contents: at info for every decision a CriticalService had a say in (denials,
protected ALLOWs, warnings), at warning for a break-glass deletion, and at debug only for the routine
ALLOWs of objects nothing protects (ROUTINE_RULES; they are still counted in the metrics).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from structlog.typing import FilteringBoundLogger

from . import criteria
from .admission import AdmissionRequest, parse_review, render_response
from .api import CRITICAL_SERVICES, GroupResource, parse_critical_service
from .cache.access import grant_hint
from .decision import WARNING_LIMIT, Decision, Rule, decide, deny
from .errors import InvalidSpec, MalformedReview, StateUnavailable
from .logs import get_logger
from .metrics import REJECT_MALFORMED, REJECT_NOT_READY, REJECT_TOO_LARGE, Metrics
from .routing import PROBE_PATH
from .state import ClusterState, MemoryState
from .webhookconfigurations import probe_answer

# ALLOWs no CriticalService had a say in: the webhook's rules send it every Deployment (and
# StatefulSet, DaemonSet) DELETE of the cluster, and almost all of those are not providers. They are
# counted (criticalsvc_decisions_total{rule}) and carry the rule as an audit annotation, but get a log
# line only at --log-level debug: at info a busy cluster's log would be mostly these, and the line cost
# ~10 % of the gate's CPU per answer under load (benchmarks/latency.py, workload "unprotected").
# An UPDATE a lock never holds (Rule.UPDATE_EXEMPT: a finalizer removed, status) is routine the same way:
# no CriticalService had a say in it.
ROUTINE_RULES = frozenset({Rule.UNPROTECTED, Rule.NOT_GATED, Rule.UPDATE_EXEMPT})

# The API server refuses to decode a write request body over 3 MiB (MaxRequestBodyBytes in
# k8s.io/apiserver/pkg/server/config.go: twice etcd's recommended 1.5 MB request size, because JSON is
# bigger than the stored protobuf), so no object it sends us in a review can be bigger; Kubernetes' own
# pod-security-admission webhook caps AdmissionReview bodies at the same 3 MiB. A DELETE review
# carries one object (oldObject), a CriticalService UPDATE two small ones.
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
# An outer bound on the live confirmation. The callback should keep its own, shorter budget (the live
# reader uses 2 s, 3.5 s for a Finalizer criterion caught up by a watch: criticalsvc/live.py) so that its
# more precise denial is the usual one; this one catches a callback that hangs. The API server waits
# timeoutSeconds for the whole call (v1 default 10 s, design/kubernetes-semantics.md §7; deploy/base/webhook.yaml
# and the routed webhooks set 5 s), so 4 s still leaves room for the rest of the request.
DEFAULT_CONFIRM_TIMEOUT = 4.0

# A CriticalService's CREATE or UPDATE that meets a cache still syncing (a type a CriticalService has just
# named: usually milliseconds) waits for the caches, at most this long, instead of being refused, so one
# `kubectl apply -f` of a bundle works first time. The API server gives a webhook call timeoutSeconds in
# all (ValidatingWebhook.TimeoutSeconds, "Default to 10 seconds": https://github.com/kubernetes/api/blob/
# v0.37.2/admissionregistration/v1/types.go#L904-L910; deploy/base/webhook.yaml sets 5 s), so 2 s
# leaves room for the rest of the request. A type the gate may not list (403) is not waited for.
DEFAULT_SYNC_WAIT = 2.0
# How long the read-access check of a CriticalService's CREATE may take in all; unanswered, no warning.
ACCESS_CHECK_TIMEOUT = 1.0

JSON = "application/json"
ERROR_LIMIT = 300  # characters of a 400/413/503 error line


class StateSource(Protocol):
    """Where the webhook reads the cluster from: the live watch caches, a snapshot, a test's state.

    `ready` is read on every review and must be cheap; `state` is what `decide` reads (its questions
    may raise StateUnavailable, which `decide` turns into a denial). `criticalsvc.cache.CacheState`
    fits as it is. Two optional methods are used when present:

        unsynced() -> Sequence[str]       what is not ready yet (for /readyz and 503 bodies)
        counts() -> Mapping[str, int]     objects held per resource (criticalsvc_cache_objects)
    """

    @property
    def ready(self) -> bool: ...

    @property
    def state(self) -> ClusterState: ...


@runtime_checkable
class ExplainsReadiness(Protocol):
    def unsynced(self) -> Sequence[str]: ...


@runtime_checkable
class WaitsForSync(Protocol):
    """A source whose caches may be syncing (criticalsvc.cache.CacheState)."""

    def syncing(self) -> bool: ...

    async def wait_changed(self, timeout: float) -> bool: ...


class ChecksReadAccess(Protocol):
    """criticalsvc.cache.access.ReadAccess: the types the gate may not list, as the API server answers."""

    async def unlistable(self, types: Sequence[GroupResource], *, timeout: float) -> list[GroupResource]: ...


@runtime_checkable
class CountsObjects(Protocol):
    def counts(self) -> Mapping[str, int]: ...


# The live confirmation: given the request and the cache's decision (an ALLOW that needs_confirmation
# picked), read the deciding facts fresh from the API server and return the decision to send (ALLOW or
# DENY). Raising, or not answering within confirm_timeout, makes the webhook DENY ("could not verify").
Confirm = Callable[[AdmissionRequest, Decision], Awaitable[Decision]]
# Which cache decisions go to `confirm`; the default asks for every ALLOW a CriticalService had a say in.
NeedsConfirmation = Callable[[AdmissionRequest, Decision], bool]


def allowed_and_protected(request: AdmissionRequest, decision: Decision) -> bool:
    """The default NeedsConfirmation: an ALLOW of something a CriticalService protects."""
    return decision.allowed and decision.protected


class StaticStateSource:
    """A state that needs no syncing (a snapshot file, a test's MemoryState); readiness can be set."""

    def __init__(self, state: ClusterState, *, ready: bool = True, waiting_for: str = "") -> None:
        self._state = state
        self._ready, self._waiting_for = ready, waiting_for

    def set_readiness(self, ready: bool, waiting_for: str = "") -> None:
        self._ready, self._waiting_for = ready, waiting_for

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def state(self) -> ClusterState:
        return self._state

    def unsynced(self) -> list[str]:
        return [] if self._ready or not self._waiting_for else [self._waiting_for]

    def counts(self) -> dict[str, int]:
        if not isinstance(self._state, MemoryState):
            return {}
        return dict(Tally(str(obj.group_resource) for obj in self._state.objects()))


class _WebhookFront:
    """The TLS listener's ASGI app: POST /validate straight to `Webhook.review`, the rest to starlette.

    A review is the one hot path (the API server sends every gated DELETE here), and starlette's
    layers around it - error and exception middleware, routing, a Request object and its header
    parsing - are CPU spent on every review for nothing a review uses (measured against the code
    before with `python -m benchmarks latency --baseline`: design/operations.md, "The tail"). Once the
    webhook is terminating, every HTTP answer carries `Connection: close` (Webhook.begin_termination).
    """

    def __init__(self, app: Any, *, webhook: Webhook) -> None:
        self.app, self.webhook = app, webhook

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.webhook.terminating:
            send = _closing(send)
        if scope["path"] == "/validate" and scope["method"] == "POST":
            response = await self.webhook.review(scope["headers"], receive)
            await response(scope, receive, send)
        elif scope["path"].startswith(PROBE_PATH) and scope["method"] == "POST":
            response = await self.webhook.probe(scope["path"][len(PROBE_PATH):], scope["headers"], receive)
            await response(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def _closing(send: Any) -> Any:
    """An ASGI `send` that adds `Connection: close` to the response's head."""

    async def send_closing(message: Any) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
        await send(message)

    return send_closing


class _TooLarge(Exception):
    """The body passed max_body_bytes while it was read."""


class Webhook:
    """The request handlers and what they need; `webhook_app()` / `ops_app()` wrap them as ASGI apps."""

    def __init__(
        self,
        source: StateSource,
        *,
        confirm: Confirm | None = None,
        needs_confirmation: NeedsConfirmation = allowed_and_protected,
        metrics: Metrics | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        on_decision: Callable[[AdmissionRequest, Decision], None] | None = None,
        manages_routes: bool = False,
        sync_wait: float = DEFAULT_SYNC_WAIT,
        read_access: ChecksReadAccess | None = None,
    ) -> None:
        if max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        self.source = source
        self.confirm = confirm
        self.needs_confirmation = needs_confirmation
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_body_bytes = max_body_bytes
        self.confirm_timeout = confirm_timeout
        # Called with every final decision (e.g. the status writer's Event recorder); must not block.
        self.on_decision = on_decision
        # The gate writes the routes of provider types (criticalsvc/webhookrouter.py): decide() does not warn
        # that a CriticalService's provider type is not routed.
        self.manages_routes = manages_routes
        self.sync_wait = sync_wait
        # Asked on an admitted CriticalService CREATE/UPDATE: a type it names that the gate may not list
        # becomes a warning naming the grant (its DELETEs would be refused as unverifiable until then).
        self.read_access = read_access
        self.log: FilteringBoundLogger = get_logger("criticalsvc.server")
        # Set by `begin_termination()` (SIGTERM): /readyz fails, so the Service stops sending new
        # connections here, while reviews are still answered - each with `Connection: close`.
        self.terminating = False
        if isinstance(source, CountsObjects):
            self.metrics.observe_cache_objects(source.counts)

    def begin_termination(self) -> None:
        """The first step of a graceful stop: leave the Service's endpoints, keep answering.

        Between SIGTERM and the moment the Service (kube-proxy, a load balancer) stops routing here,
        reviews keep arriving, some on keep-alive connections the API server already holds. Closing an
        idle connection races with a review being sent on it, and the API server does not re-send a
        POST that met a closed connection (Go's net/http retries only idempotent requests): the review
        fails with `EOF`, a failed admission call. So for a while (serve --shutdown-delay) the gate still
        answers, reports not ready, and marks every answer `Connection: close`: the client, not the
        gate, ends each connection after its answer, and opens the next one to a ready replica.
        """
        self.terminating = True

    # --- apps -------------------------------------------------------------------------------------
    def webhook_app(self) -> Any:
        """/validate plus the ops endpoints, as an ASGI app: what the TLS listener serves."""
        return _WebhookFront(self._app([Route("/validate", self.validate, methods=["POST"]), *self._ops_routes()]),
                             webhook=self)

    def ops_app(self) -> Starlette:
        """/healthz, /readyz and /metrics only: what the plain-HTTP ops listener serves."""
        return self._app(self._ops_routes())

    def _ops_routes(self) -> list[Route]:
        return [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
        ]

    def _app(self, routes: list[Route]) -> Starlette:
        app = Starlette(routes=routes)
        app.state.webhook = self
        return app

    # --- ops endpoints ------------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        return Response(b"ok\n", media_type="text/plain")

    async def readyz(self, request: Request) -> Response:
        if self.terminating:
            return _json({"ready": False, "reason": "shutting down"}, status=503)
        if self.source.ready:
            return _json({"ready": True})
        return _json({"ready": False, "reason": self._not_ready_reason()}, status=503)

    def _not_ready_reason(self) -> str:
        if isinstance(self.source, ExplainsReadiness):
            waiting = list(self.source.unsynced())
            if waiting:
                return "waiting for " + ", ".join(waiting)
        return "the cluster state is not synced yet"

    async def metrics_endpoint(self, request: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, headers={"content-type": content_type})

    # --- /validate ----------------------------------------------------------------------------------
    async def validate(self, request: Request) -> Response:
        """POST /validate as a starlette endpoint (webhook_app() sends reviews to `review` directly)."""
        return await self.review(request.scope["headers"], request.receive)

    async def review(self, headers: Sequence[tuple[bytes, bytes]], receive: Any) -> Response:
        """One AdmissionReview: the request's ASGI headers and `receive` in, the HTTP answer out."""
        started = time.perf_counter()
        uid = ""
        try:
            rejected, review = await self._read_review(headers, receive)
            if rejected is not None:
                return rejected
            # The decision's own clock starts with the body in hand: a body that comes in two reads (the API
            # server's Go client writes a large one apart from its head) waits for the second, and that wait
            # is the client's and the event loop's (criticalsvc_event_loop_lag_seconds), not the decision's.
            received = (time.perf_counter(), time.thread_time())
            uid = _uid_of(review)
            try:
                admission = parse_review(review)
            except MalformedReview as exc:
                return self._reject(400, REJECT_MALFORMED, str(exc))
            if not self.source.ready:
                return self._reject(503, REJECT_NOT_READY, f"not ready: {self._not_ready_reason()}")
            return await self._answer(admission, self.source.state, started, received)
        except Exception as exc:  # a bug of ours: still a well-formed answer, and a denial when possible
            self.metrics.decision_errors.inc()
            self.log.exception("request failed", uid=uid)
            if uid:
                return _json(render_response(uid, _internal_error_decision(exc)))
            return self._reject(400, REJECT_MALFORMED, f"the request could not be processed ({type(exc).__name__})")

    async def probe(self, digest: str, headers: Sequence[tuple[bytes, bytes]], receive: Any) -> Response:
        """The routing probe (criticalsvc/webhookrouter.py): denied, naming the digest in the path it came on,
        so the leader's dry-run CREATE learns which configuration the API server routes. Not a review: it
        decides nothing and is counted apart (criticalsvc_routing_probes_total, on the leader)."""
        rejected, review = await self._read_review(headers, receive)
        if rejected is not None:
            return rejected
        uid = _uid_of(review)
        if not uid or not digest.isalnum() or len(digest) > 64:
            return self._reject(400, REJECT_MALFORMED, "a routing probe needs a request uid and a digest in its path")
        return _json(render_response(uid, deny(Rule.ROUTING_PROBE, probe_answer(digest), code=403)))

    async def _read_review(self, headers: Sequence[tuple[bytes, bytes]], receive: Any) -> tuple[Response | None, Any]:
        length = content_type = None
        for name, value in headers:  # ASGI header names are lower case; the first of a repeated one counts
            if name == b"content-length" and length is None:
                length = value.decode("latin-1")
            elif name == b"content-type" and content_type is None:
                content_type = value.decode("latin-1")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large(f"{length} bytes"), None  # answered before a byte of the body is read
        content_type = content_type or ""
        if content_type.split(";", 1)[0].strip().lower() != JSON:
            return self._reject(400, REJECT_MALFORMED,
                                f"Content-Type: expected {JSON}, got {content_type or 'none'}"), None
        try:
            body = await self._receive_body(receive)
        except ClientDisconnect:
            return self._reject(400, REJECT_MALFORMED, "body: the client disconnected before sending it all"), None
        except _TooLarge:
            # Within a declared Content-Length the HTTP layer (h11) holds the body to it, so this is a body
            # without one (chunked) - or a framing that misbehaved: the limit holds either way.
            return self._too_large(f"more than {self.max_body_bytes} bytes"), None
        return self._decode(body)

    async def _receive_body(self, receive: Any) -> bytes:
        """The request body from ASGI `receive`, stopping (_TooLarge) as soon as it passes max_body_bytes."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.max_body_bytes:
                    raise _TooLarge()
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _decode(self, body: bytes) -> tuple[Response | None, Any]:
        if not body:
            return self._reject(400, REJECT_MALFORMED, "body: empty; expected an AdmissionReview"), None
        try:
            review = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return self._reject(400, REJECT_MALFORMED, f"body: not valid JSON: {exc}"), None
        if not isinstance(review, dict):
            return self._reject(400, REJECT_MALFORMED,
                                f"body: an AdmissionReview must be a JSON object, got {_json_type(review)}"), None
        return None, review

    def _decide(self, admission: AdmissionRequest, state: ClusterState) -> Decision:
        try:
            return decide(admission, state, manages_routes=self.manages_routes)
        except Exception as exc:  # decide is pure and total by design; if it fails anyway, fail closed
            self.metrics.decision_errors.inc()
            self.log.exception("decision failed", uid=admission.uid)
            return _internal_error_decision(exc)

    async def _answer(self, admission: AdmissionRequest, state: ClusterState, started: float,
                      received: tuple[float, float]) -> Response:
        """The answer to a parsed review; `started` when the review came in, `received` (wall, thread CPU)
        when its body had been read."""
        decision = self._decide(admission, state)
        source = self.source
        waited = False  # on a cache still syncing, or on an access review
        if (decision.rule == Rule.UNVERIFIABLE and admission.operation in ("CREATE", "UPDATE")
                and admission.group_resource == CRITICAL_SERVICES and isinstance(source, WaitsForSync)):
            # Decided again on each change of the caches until it no longer needs one that is syncing: the
            # refusal stands only for what cannot be known within DEFAULT_SYNC_WAIT (a 403 is not waited for).
            while decision.rule == Rule.UNVERIFIABLE and source.syncing() \
                    and (remaining := started + self.sync_wait - time.perf_counter()) > 0:
                waited = True
                await source.wait_changed(remaining)
                decision = self._decide(admission, source.state)
        if decision.allowed and decision.rule == Rule.VALID_SPEC and self.read_access is not None:
            waited = True
            decision = await self._warn_unreadable(admission, decision)
        live = ""
        if self.confirm is not None and self.needs_confirmation(admission, decision):
            decision, live = await self._confirmed(admission, decision)
        body = orjson.dumps(render_response(admission.uid, decision))
        cpu = time.thread_time() - received[1]
        now = time.perf_counter()
        elapsed = now - started
        if not live and not waited:  # decided from the caches alone: the gate's own time, no waiting on I/O
            decision_time = now - received[0]
            self.metrics.cache_decision_duration.observe(decision_time)
            self.metrics.cache_decision_cpu.observe(min(cpu, decision_time))
        self._record(admission, decision, live, elapsed)
        return Response(body, media_type=JSON)

    async def _warn_unreadable(self, admission: AdmissionRequest, decision: Decision) -> Decision:
        """The admitted CriticalService with a warning per named type the gate may not list."""
        assert self.read_access is not None
        try:
            cs = parse_critical_service(admission.object)
        except InvalidSpec:
            return decision
        named = [("spec.provider", cs.provider.group_resource),
                 *((f"spec.criteria[{i}]", criteria.named_resource(c)) for i, c in enumerate(cs.criteria))]
        resolved: list[tuple[str, GroupResource]] = []
        for where, gr in named:
            try:
                served = self.source.state.resolve(gr)
            except StateUnavailable:
                served = None
            if served is not None:  # an unserved type is warned about by decide()
                resolved.append((where, served))
        try:
            async with asyncio.timeout(ACCESS_CHECK_TIMEOUT):
                unlistable = await self.read_access.unlistable([gr for _, gr in resolved],
                                                               timeout=ACCESS_CHECK_TIMEOUT)
        except TimeoutError:
            return decision
        extra = [f"{where}: the gate may not list {gr}; what depends on it is refused as unverifiable until "
                 f"{grant_hint(gr)}"[:WARNING_LIMIT] for where, gr in resolved if gr in unlistable]
        return attrs.evolve(decision, warnings=(*decision.warnings, *dict.fromkeys(extra))) if extra else decision

    async def _confirmed(self, admission: AdmissionRequest, decision: Decision) -> tuple[Decision, str]:
        """The confirm callback's verdict on the cache's decision; a DENY when it cannot give one."""
        assert self.confirm is not None
        budget = asyncio.timeout(self.confirm_timeout)
        try:
            async with budget:
                result = await self.confirm(admission, decision)
            if not isinstance(result, Decision):
                raise TypeError(f"the confirmation returned {type(result).__name__}, not a Decision")
        except Exception as exc:
            # Our own budget or the reader's tighter one (LiveReadTimeout is a TimeoutError): both are timeouts.
            timed_out = isinstance(exc, TimeoutError)
            self.metrics.live_confirmations.labels("failed").inc()
            self.metrics.live_confirmation_failures.labels("timeout" if timed_out else "error").inc()
            why = f"no answer within {self.confirm_timeout:g} s" if budget.expired() else _one_line(exc)
            self.log.warning("live confirmation failed", uid=admission.uid, error=why)
            return _unverified(admission, decision, why), "failed"
        outcome = "allowed" if result.allowed else "denied"
        self.metrics.live_confirmations.labels(outcome).inc()
        return result, outcome

    def _record(self, admission: AdmissionRequest, decision: Decision, live: str, elapsed: float) -> None:
        # A subresource is part of the resource label (`deployments.apps/scale`), as in the API server's own
        # apiserver_admission_webhook_* metrics, so a held `kubectl scale` is told apart from a held edit.
        resource = str(admission.group_resource)
        if admission.sub_resource:
            resource = f"{resource}/{admission.sub_resource}"
        result = "allowed" if decision.allowed else "denied"
        self.metrics.decisions.labels(resource, admission.operation, result, decision.rule.value).inc()
        self.metrics.decision_duration.observe(elapsed)
        if self.on_decision is not None:
            try:
                self.on_decision(admission, decision)
            except Exception:  # a side channel must never change or break the answer
                self.log.exception("on_decision hook failed", uid=admission.uid)
        routine = decision.allowed and decision.rule in ROUTINE_RULES and not decision.warnings
        if routine and not self.log.is_enabled_for(logging.DEBUG):
            return  # counted above; not worth a line at info (see ROUTINE_RULES)
        fields: dict[str, Any] = {
            "uid": admission.uid,
            "user": admission.username,
            "operation": admission.operation,
            "resource": resource,
            "namespace": admission.namespace,
            "name": admission.name or _old_name(admission),
            "dry_run": admission.dry_run,
            "result": result,
            "rule": decision.rule.value,
            "latency_ms": round(elapsed * 1000, 3),
        }
        if admission.sub_resource:
            fields["subresource"] = admission.sub_resource
        if not decision.allowed:
            fields["code"] = decision.code
            fields["message"] = decision.message
        if decision.warnings:
            fields["warnings"] = list(decision.warnings)
        if decision.blocking:
            fields["blocking"] = list(decision.blocking)
        if decision.recreated_provider:
            fields["recreated_provider"] = decision.recreated_provider  # who set the intent (design §6)
        if live:
            fields["live_confirmation"] = live
        if decision.allowed and decision.break_glass:
            self.metrics.break_glass.labels(resource).inc()
            self.log.warning("decision", break_glass=decision.break_glass, **fields)
        elif routine:
            self.log.debug("decision", **fields)
        else:
            self.log.info("decision", **fields)

    # --- rejections ---------------------------------------------------------------------------------
    def _reject(self, status: int, reason: str, error: str, *, headers: Mapping[str, str] | None = None) -> Response:
        # Errors quote what was sent (an apiVersion, a Content-Type): keep a hostile value from
        # filling the log or the reply.
        error = error if len(error) <= ERROR_LIMIT else error[: ERROR_LIMIT - 1] + "…"
        self.metrics.requests_rejected.labels(reason).inc()
        self.log.warning("request rejected", status=status, reason=reason, error=error)
        return _json({"error": error}, status=status, headers=headers)

    def _too_large(self, size: str) -> Response:
        # The rest of the body stays unread, so the connection cannot carry another request: say so.
        return self._reject(413, REJECT_TOO_LARGE,
                            f"body: {size} is over the limit of {self.max_body_bytes} bytes",
                            headers={"connection": "close"})


def create_app(source: StateSource, **options: Any) -> Any:
    """The full webhook app (/validate and the ops endpoints) for `source`; options as for `Webhook`."""
    return Webhook(source, **options).webhook_app()


def _unverified(admission: AdmissionRequest, decision: Decision, why: str) -> Decision:
    what = "deletion" if admission.operation == "DELETE" else "update"
    return deny(Rule.UNVERIFIABLE, "criticalsvc could not verify the cluster state with a fresh read from the "
                f"API server ({why}), so it does not allow this {what} yet; retry shortly",
                protected=True, blocking=decision.blocking)


def _internal_error_decision(exc: BaseException) -> Decision:
    return deny(Rule.UNVERIFIABLE, f"criticalsvc failed while evaluating this request ({type(exc).__name__}), "
                "so it does not allow it; the service log has the details", protected=True)


def _uid_of(review: Any) -> str:
    request = review.get("request") if isinstance(review, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) else ""


def _old_name(admission: AdmissionRequest) -> str:
    # Items of a deletecollection arrive with name "" (design/kubernetes-semantics.md §1.1): the name is in oldObject.
    old = admission.old_object
    metadata = old.get("metadata") if old is not None else None
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return name if isinstance(name, str) else ""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array"}.get(
        type(value), type(value).__name__)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = text if len(text) <= 200 else text[:199] + "…"
    return f"{type(exc).__name__}: {text}" if not text.startswith(type(exc).__name__) else text


def _json(content: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(content), status_code=status, headers=headers, media_type=JSON)


__all__ = [
    "DEFAULT_CONFIRM_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "Confirm",
    "CountsObjects",
    "ExplainsReadiness",
    "NeedsConfirmation",
    "StateSource",
    "StaticStateSource",
    "Webhook",
    "allowed_and_protected",
    "create_app",
]
