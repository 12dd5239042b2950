"""The webhook's HTTP layer in-process: AdmissionReview answers, HTTP errors, confirmation, metrics, logs."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import structlog
from kubefakes import Unreadable, state_with

from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import BREAK_GLASS_ANNOTATION, CRDS, GroupResource, ObjectRef
from criticalsvc.decision import Decision, Rule, deny
from criticalsvc.logs import configure_logging
from criticalsvc.manifests import load_path
from criticalsvc.server import StateSource, StaticStateSource, Webhook
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "api/examples/reference-story.yaml"
DELETE_PROVIDER = json.loads((ROOT / "api/examples/reviews/delete-provider.json").read_text())
COLLECTION_ITEM = json.loads((ROOT / "api/examples/reviews/delete-namespace-collection-item.json").read_text())
COOL = GroupResource("my.crd.group", "coolresources")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def logs() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The JSON log lines written so far (logging is configured into a buffer for the test)."""
    buffer = io.BytesIO()
    configure_logging("info", stream=buffer)
    yield lambda: [orjson.loads(line) for line in buffer.getvalue().splitlines()]
    structlog.reset_defaults()
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if type(h).__name__ != "_ForwardToStructlog"]
    root.setLevel(logging.WARNING)


@pytest.fixture
def state() -> MemoryState:
    return build_state(load_path(str(STORY)))


@pytest.fixture
def source(state: MemoryState) -> StaticStateSource:
    return StaticStateSource(state)


def make_webhook(source: StateSource, **options: Any) -> Webhook:
    return Webhook(source, **options)


def client_for(webhook: Webhook, *, ops: bool = False) -> httpx.AsyncClient:
    app = webhook.ops_app() if ops else webhook.webhook_app()
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gate")


async def post_review(webhook: Webhook, review: Any) -> httpx.Response:
    async with client_for(webhook) as client:
        return await client.post("/validate", content=orjson.dumps(review),
                                 headers={"content-type": "application/json"})


def meet_criteria(state: MemoryState) -> None:
    """Remove every CoolResource and the CRD, so the provider's CriticalService has all criteria met."""
    for obj in list(state.objects(COOL)):
        state.remove(obj.ref)
    state.remove(ObjectRef(CRDS, "", "coolresources.my.crd.group"))


def review_of(name: str, *, namespace: str = "finalizer-namespace", **request: Any) -> dict[str, Any]:
    review: dict[str, Any] = copy.deepcopy(DELETE_PROVIDER)
    review["request"]["name"] = name
    review["request"]["namespace"] = namespace
    review["request"]["oldObject"]["metadata"].update(name=name, namespace=namespace)
    review["request"].update(request)
    return review


def metric_value(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_prefix} not in metrics")


# --- answers ---------------------------------------------------------------------------------------
async def test_denies_protected_provider_with_403_message(source: StaticStateSource) -> None:
    """Deleting the provider while CRs carry the finalizer gets a 403 denial naming the CriticalService."""
    response = await post_review(make_webhook(source), DELETE_PROVIDER)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == DELETE_PROVIDER["request"]["uid"]
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["code"] == 403
    assert "CriticalService for-finalizer-deployment" in body["response"]["status"]["message"]


async def test_allows_deletion_nothing_protects(source: StaticStateSource) -> None:
    """Deleting a Deployment no CriticalService protects is allowed."""
    response = await post_review(make_webhook(source), review_of("some-other-deployment"))
    assert response.status_code == 200
    assert response.json()["response"]["allowed"] is True


async def test_allows_provider_once_criteria_are_met(state: MemoryState, source: StaticStateSource) -> None:
    """With the CRs and the CRD gone, the provider's deletion is allowed."""
    meet_criteria(state)
    response = await post_review(make_webhook(source), DELETE_PROVIDER)
    assert response.json()["response"]["allowed"] is True
    assert response.json()["response"]["auditAnnotations"]["rule"] == Rule.CRITERIA_MET.value


async def test_dry_run_gets_the_same_answer(source: StaticStateSource) -> None:
    """A dry-run DELETE gets exactly the answer the real DELETE gets."""
    webhook = make_webhook(source)
    real = (await post_review(webhook, DELETE_PROVIDER)).json()
    dry = (await post_review(webhook, review_of("finalizer-deployment", dryRun=True))).json()
    assert dry == real


# --- HTTP errors ------------------------------------------------------------------------------------
def _with_request(**fields: Any) -> bytes:
    return orjson.dumps({**DELETE_PROVIDER, "request": {**DELETE_PROVIDER["request"], **fields}})


JSON_TYPE = "application/json"
MALFORMED: list[tuple[str, bytes, str, str]] = [
    ("not JSON", b"{not json", JSON_TYPE, "body: not valid JSON"),
    ("empty body", b"", JSON_TYPE, "body: empty"),
    ("an array", b"[1, 2]", JSON_TYPE, "body: an AdmissionReview must be a JSON object, got an array"),
    ("a string", b'"review"', JSON_TYPE, "got a string"),
    ("wrong apiVersion", orjson.dumps({**DELETE_PROVIDER, "apiVersion": "admission.k8s.io/v1beta1"}), JSON_TYPE,
     "apiVersion: expected admission.k8s.io/v1"),
    ("wrong kind", orjson.dumps({**DELETE_PROVIDER, "kind": "Pod"}), JSON_TYPE, "kind: expected AdmissionReview"),
    ("no request", orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), JSON_TYPE,
     "request: required"),
    ("no uid", _with_request(uid=""), JSON_TYPE, "request.uid: required"),
    ("bad operation", _with_request(operation="ERASE"), JSON_TYPE, "request.operation"),
    ("text content type", orjson.dumps(DELETE_PROVIDER), "text/plain",
     "Content-Type: expected application/json, got text/plain"),
    ("no content type", orjson.dumps(DELETE_PROVIDER), "", "Content-Type: expected application/json, got none"),
]


@pytest.mark.parametrize(("body", "content_type", "expected"), [m[1:] for m in MALFORMED],
                         ids=[m[0] for m in MALFORMED])
async def test_malformed_review_gets_400_naming_the_problem(
    source: StaticStateSource, body: bytes, content_type: str, expected: str
) -> None:
    """Each kind of malformed request is answered HTTP 400 with a one-line JSON error naming the field."""
    headers = {"content-type": content_type} if content_type else {}
    async with client_for(make_webhook(source)) as client:
        response = await client.post("/validate", content=body, headers=headers)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert expected in error and "\n" not in error


async def test_error_quoting_a_huge_value_stays_short(source: StaticStateSource) -> None:
    """A 400 that quotes what was sent (here a 100 KB apiVersion) keeps its error line short."""
    body = orjson.dumps({**DELETE_PROVIDER, "apiVersion": "v" * 100_000})
    async with client_for(make_webhook(source)) as client:
        response = await client.post("/validate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith("apiVersion: expected admission.k8s.io/v1") and len(error) <= 300


async def test_json_charset_parameter_is_accepted(source: StaticStateSource) -> None:
    """`application/json; charset=utf-8` is JSON too."""
    async with client_for(make_webhook(source)) as client:
        response = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                     headers={"content-type": "application/json; charset=utf-8"})
    assert response.status_code == 200


async def test_oversize_body_gets_413(source: StaticStateSource) -> None:
    """A body over max_body_bytes is answered 413 with a JSON error, and the connection is marked to close."""
    review = review_of("finalizer-deployment")
    review["request"]["oldObject"]["data"] = {"blob": "x" * 5000}
    webhook = make_webhook(source, max_body_bytes=4096)
    response = await post_review(webhook, review)
    assert response.status_code == 413
    assert "over the limit of 4096 bytes" in response.json()["error"]
    assert response.headers["connection"] == "close"
    assert (await post_review(webhook, DELETE_PROVIDER)).status_code == 200  # under the limit: answered


async def call_asgi(app: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes], *,
                    gap: float = 0.0) -> tuple[int, bytes, int]:
    """POST /validate through the raw ASGI interface, each chunk after the first `gap` seconds after the one
    before; returns (status, body, chunks the app pulled)."""
    pulled = 0

    async def receive() -> dict[str, Any]:
        nonlocal pulled
        if pulled >= len(chunks):
            await asyncio.Event().wait()  # a client that sends nothing more
        if pulled and gap:
            await asyncio.sleep(gap)
        pulled += 1
        return {"type": "http.request", "body": chunks[pulled - 1], "more_body": pulled < len(chunks)}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "https", "path": "/validate", "raw_path": b"/validate", "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 443)}
    await asyncio.wait_for(app(scope, receive, send), 5)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, body, pulled


async def test_cache_decision_time_starts_with_the_body_read(source: StaticStateSource) -> None:
    """A body that arrives in two reads 200 ms apart: the review took 200 ms in the gate
    (criticalsvc_decision_duration_seconds), its decision from the caches far less
    (criticalsvc_cache_decision_duration_seconds), of which some was CPU (criticalsvc_cache_decision_cpu_seconds)."""
    webhook = make_webhook(source)
    body = orjson.dumps(review_of("unrelated"))
    half = len(body) // 2
    status, answer, _ = await call_asgi(webhook.webhook_app(), [(b"content-type", b"application/json")],
                                        [body[:half], body[half:]], gap=0.2)  # the rest of the body comes late
    assert status == 200 and orjson.loads(answer)["response"]["allowed"] is True
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, "criticalsvc_decision_duration_seconds_sum") >= 0.2
    cache = metric_value(metrics, "criticalsvc_cache_decision_duration_seconds_sum")
    assert metric_value(metrics, "criticalsvc_cache_decision_duration_seconds_count") == 1 and cache < 0.1
    assert metric_value(metrics, "criticalsvc_cache_decision_cpu_seconds_count") == 1
    assert 0 < metric_value(metrics, "criticalsvc_cache_decision_cpu_seconds_sum") <= cache


async def test_oversize_declared_length_is_rejected_unread(source: StaticStateSource) -> None:
    """A Content-Length over the limit is answered 413 before a single body chunk is read."""
    app = make_webhook(source, max_body_bytes=1024).webhook_app()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"10485760")]
    status, body, pulled = await call_asgi(app, headers, [b"x" * 1024] * 10240)
    assert (status, pulled) == (413, 0)
    assert "10485760 bytes is over the limit of 1024 bytes" in orjson.loads(body)["error"]


async def test_oversize_stream_stops_reading_at_the_limit(source: StaticStateSource) -> None:
    """A chunked body without Content-Length is read only until it passes the limit, then answered 413."""
    app = make_webhook(source, max_body_bytes=4096).webhook_app()
    status, _, pulled = await call_asgi(app, [(b"content-type", b"application/json")], [b"x" * 1024] * 100)
    assert status == 413
    assert pulled == 5  # 5 KiB > 4 KiB: the remaining 95 chunks were never pulled


async def test_not_ready_gives_503_until_ready(source: StaticStateSource) -> None:
    """Before the state is ready /validate and /readyz answer 503 with the reason; afterwards 200."""
    source.set_readiness(False, "namespaces")
    webhook = make_webhook(source)
    async with client_for(webhook) as client:
        review = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                   headers={"content-type": "application/json"})
        ready = await client.get("/readyz")
        health = await client.get("/healthz")
    assert review.status_code == 503
    assert review.json()["error"] == "not ready: waiting for namespaces"
    assert ready.status_code == 503 and ready.json() == {"ready": False, "reason": "waiting for namespaces"}
    assert health.status_code == 200  # alive, just not ready

    source.set_readiness(True)
    async with client_for(webhook) as client:
        assert (await client.get("/readyz")).status_code == 200
    assert (await post_review(webhook, DELETE_PROVIDER)).status_code == 200


async def test_terminating_reports_not_ready_but_answers_and_closes_connections(source: StaticStateSource) -> None:
    """After SIGTERM (begin_termination) the Service must stop routing here, and the API server must not
    reuse its connections, yet every review still gets the real answer: /readyz 503 "shutting down" on both
    listeners, /validate the same decision as before, with `Connection: close`."""
    webhook = make_webhook(source)
    before = await post_review(webhook, DELETE_PROVIDER)
    assert "connection" not in before.headers  # control: keep-alive while serving normally
    webhook.begin_termination()
    after = await post_review(webhook, DELETE_PROVIDER)
    assert after.status_code == 200 and after.headers["connection"] == "close"
    assert after.json()["response"] == before.json()["response"]
    for ops in (False, True):
        async with client_for(webhook, ops=ops) as client:
            ready = await client.get("/readyz")
            assert (await client.get("/healthz")).status_code == 200  # alive: no restart wanted
        assert ready.status_code == 503 and ready.json() == {"ready": False, "reason": "shutting down"}


async def test_ops_app_serves_probes_and_metrics_but_not_validate(source: StaticStateSource) -> None:
    """The plain-HTTP ops app answers /healthz, /readyz, /metrics and has no /validate."""
    async with client_for(make_webhook(source), ops=True) as client:
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        response = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                     headers={"content-type": "application/json"})
    assert response.status_code == 404


# --- live confirmation ------------------------------------------------------------------------------
class RecordingConfirm:
    """A confirm callback that records its calls and answers with `answer(request, decision)`."""

    def __init__(self, answer: Callable[[AdmissionRequest, Decision], Any]) -> None:
        self.answer = answer
        self.calls: list[tuple[AdmissionRequest, Decision]] = []

    async def __call__(self, request: AdmissionRequest, decision: Decision) -> Decision:
        self.calls.append((request, decision))
        result = self.answer(request, decision)
        if asyncio.iscoroutine(result):
            result = await result
        return result  # type: ignore[no-any-return]


async def test_confirm_can_turn_an_allow_into_a_deny(state: MemoryState, source: StaticStateSource) -> None:
    """When the live read finds a blocker the cache missed, its DENY is what the API server gets."""
    meet_criteria(state)
    confirm = RecordingConfirm(lambda r, d: deny(Rule.BLOCKED, "live read: alpha still carries the finalizer"))
    webhook = make_webhook(source, confirm=confirm)
    body = (await post_review(webhook, DELETE_PROVIDER)).json()
    assert body["response"]["allowed"] is False
    assert body["response"]["status"]["message"] == "live read: alpha still carries the finalizer"
    [(request, cached)] = confirm.calls
    assert request.uid == DELETE_PROVIDER["request"]["uid"] and cached.allowed and cached.protected
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, 'criticalsvc_live_confirmations_total{result="denied"}') == 1


async def test_confirm_that_agrees_keeps_the_allow(state: MemoryState, source: StaticStateSource) -> None:
    """When the live read agrees, the deletion is allowed."""
    meet_criteria(state)
    confirm = RecordingConfirm(lambda r, d: d)
    webhook = make_webhook(source, confirm=confirm)
    body = (await post_review(webhook, DELETE_PROVIDER)).json()
    assert body["response"]["allowed"] is True and len(confirm.calls) == 1
    # The confirmed answer waited for a round trip: it is a decision, but not one from the caches alone.
    await post_review(webhook, review_of("unrelated"))  # nothing protects it: no confirmation
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, "criticalsvc_decision_duration_seconds_count") == 2
    assert metric_value(metrics, "criticalsvc_cache_decision_duration_seconds_count") == 1


async def test_confirm_raising_denies_saying_it_could_not_verify(state: MemoryState, source: StaticStateSource) -> None:
    """If the live read fails, the protected deletion is denied with a message saying the gate could not verify."""
    meet_criteria(state)

    def fail(request: AdmissionRequest, decision: Decision) -> Decision:
        raise ConnectionError("connection refused by 10.0.0.1:443")

    webhook = make_webhook(source, confirm=RecordingConfirm(fail))
    body = (await post_review(webhook, DELETE_PROVIDER)).json()
    assert body["response"]["allowed"] is False
    message = body["response"]["status"]["message"]
    assert "could not verify" in message and "connection refused" in message
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, 'criticalsvc_live_confirmation_failures_total{reason="error"}') == 1
    assert metric_value(metrics, 'criticalsvc_live_confirmations_total{result="failed"}') == 1


async def test_confirm_timing_out_denies(state: MemoryState, source: StaticStateSource) -> None:
    """A live read that does not answer within confirm_timeout denies the deletion."""
    meet_criteria(state)

    async def hang(request: AdmissionRequest, decision: Decision) -> Decision:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    webhook = make_webhook(source, confirm=RecordingConfirm(hang), confirm_timeout=0.05)
    body = (await post_review(webhook, DELETE_PROVIDER)).json()
    assert body["response"]["allowed"] is False
    assert "no answer within 0.05 s" in body["response"]["status"]["message"]


async def test_confirm_is_not_asked_for_denials_or_unprotected_objects(source: StaticStateSource) -> None:
    """Denials and deletions nothing protects are answered from the cache without a live read."""
    confirm = RecordingConfirm(lambda r, d: pytest.fail("confirm must not be called"))
    webhook = make_webhook(source, confirm=confirm)
    assert (await post_review(webhook, DELETE_PROVIDER)).json()["response"]["allowed"] is False
    assert (await post_review(webhook, review_of("unrelated"))).json()["response"]["allowed"] is True
    assert confirm.calls == []


async def test_needs_confirmation_chooses_which_decisions_are_confirmed(source: StaticStateSource) -> None:
    """A custom needs_confirmation sends other ALLOWs (here: an unprotected one) to the live read too."""
    confirm = RecordingConfirm(lambda r, d: deny(Rule.BLOCKED, "live read disagrees"))
    webhook = make_webhook(source, confirm=confirm, needs_confirmation=lambda r, d: d.allowed)
    body = (await post_review(webhook, review_of("unrelated"))).json()
    assert body["response"]["allowed"] is False and len(confirm.calls) == 1


class BareSource:
    """The least a state source must offer: `ready` and `state`, nothing optional."""

    def __init__(self, state: MemoryState) -> None:
        self.ready = False
        self.state = state


async def test_bare_state_source_is_enough(state: MemoryState) -> None:
    """A source with only `ready` and `state` serves reviews and probes with a generic reason."""
    source = BareSource(state)
    webhook = make_webhook(source)
    async with client_for(webhook) as client:
        ready = await client.get("/readyz")
        metrics = (await client.get("/metrics")).text
    assert ready.json() == {"ready": False, "reason": "the cluster state is not synced yet"}
    assert "criticalsvc_cache_objects" not in metrics
    source.ready = True
    assert (await post_review(webhook, DELETE_PROVIDER)).json()["response"]["allowed"] is False


# --- failure inside the decision ----------------------------------------------------------------------
class BrokenState:
    """A state whose provider index fails: stands in for any bug below the decision."""

    def __init__(self, inner: MemoryState) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def protecting(self, provider: ObjectRef, labels: Any = None) -> Any:
        raise RuntimeError("index corrupted")


async def test_unexpected_exception_in_decision_fails_closed(
    state: MemoryState, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    """A bug inside the decision answers DENY (not a 500), logged with the exception."""
    webhook = make_webhook(StaticStateSource(BrokenState(state)))
    response = await post_review(webhook, DELETE_PROVIDER)
    assert response.status_code == 200
    assert response.json()["response"]["allowed"] is False
    assert "failed while evaluating" in response.json()["response"]["status"]["message"]
    errors = [line for line in logs() if line["event"] == "decision failed"]
    assert len(errors) == 1 and errors[0]["level"] == "error" and "index corrupted" in json.dumps(errors[0])
    assert metric_value(webhook.metrics.exposition()[0].decode(), "criticalsvc_decision_errors_total") == 1


# --- metrics and logs -------------------------------------------------------------------------------
async def test_metrics_count_decisions_rejections_and_cache_objects(source: StaticStateSource) -> None:
    """/metrics shows decisions by resource/operation/result/rule, rejections by reason, latency and cache sizes."""
    webhook = make_webhook(source)
    await post_review(webhook, DELETE_PROVIDER)
    await post_review(webhook, DELETE_PROVIDER)
    await post_review(webhook, review_of("unrelated"))
    async with client_for(webhook, ops=True) as client:
        bad = await client.post("/validate", content=b"{", headers={"content-type": "application/json"})
    assert bad.status_code == 404  # the ops app: not counted
    async with client_for(webhook) as client:
        await client.post("/validate", content=b"{", headers={"content-type": "application/json"})
        text = (await client.get("/metrics")).text
    assert metric_value(text, 'criticalsvc_decisions_total{operation="DELETE",resource="deployments.apps",'
                              'result="denied",rule="blocked"}') == 2
    assert metric_value(text, 'criticalsvc_decisions_total{operation="DELETE",resource="deployments.apps",'
                              'result="allowed",rule="unprotected"}') == 1
    assert metric_value(text, 'criticalsvc_requests_rejected_total{reason="malformed"}') == 1
    assert metric_value(text, "criticalsvc_decision_duration_seconds_count") == 3
    assert metric_value(text, 'criticalsvc_decision_duration_seconds_bucket{le="0.0001"}') >= 0
    assert metric_value(text, 'criticalsvc_cache_objects{resource="coolresources.my.crd.group"}') == 3


async def test_one_log_line_per_decision_without_object_contents(
    source: StaticStateSource, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    """Each decision logs one JSON line with who/what/result/latency, and nothing of the object's contents."""
    webhook = make_webhook(source)
    review = copy.deepcopy(COLLECTION_ITEM)  # name "" as in a namespace controller's deletecollection
    review["request"]["oldObject"]["spec"] = {"env": [{"name": "TOKEN", "value": "s3cr3t-marker"}]}
    review["request"]["oldObject"]["metadata"]["annotations"] = {"note": "annotation-marker"}
    await post_review(webhook, review)
    lines = logs()
    decisions = [line for line in lines if line["event"] == "decision"]
    assert len(decisions) == 1
    line = decisions[0]
    assert line["level"] == "info"
    assert {k: line[k] for k in ("uid", "user", "operation", "resource", "namespace", "name", "dry_run",
                                 "result", "rule")} == {
        "uid": review["request"]["uid"], "user": "system:serviceaccount:kube-system:namespace-controller",
        "operation": "DELETE", "resource": "deployments.apps", "namespace": "finalizer-namespace",
        "name": "finalizer-deployment", "dry_run": False, "result": "denied", "rule": "blocked"}
    assert "for-finalizer-deployment" in line["message"] and isinstance(line["latency_ms"], float)
    everything = json.dumps(lines)
    assert "s3cr3t-marker" not in everything and "annotation-marker" not in everything


async def test_routine_allows_are_counted_but_logged_only_at_debug(
    source: StaticStateSource, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    """At info, an ALLOW of an object nothing protects writes no decision line (it is counted); at debug it does."""
    webhook = make_webhook(source)
    await post_review(webhook, review_of("unrelated", namespace="default"))
    await post_review(webhook, review_of("finalizer-deployment"))  # protected: denied, logged at info
    assert [line["rule"] for line in logs() if line["event"] == "decision"] == ["blocked"]
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, 'criticalsvc_decisions_total{operation="DELETE",resource="deployments.apps",'
                                 'result="allowed",rule="unprotected"}') == 1
    buffer = io.BytesIO()
    configure_logging("debug", stream=buffer)
    await post_review(make_webhook(source), review_of("unrelated", namespace="default"))
    [line] = [orjson.loads(raw) for raw in buffer.getvalue().splitlines() if b'"decision"' in raw]
    assert (line["level"], line["result"], line["rule"]) == ("debug", "allowed", "unprotected")


async def test_break_glass_is_allowed_and_logged_at_warning(
    source: StaticStateSource, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    """A break-glass annotation lets a blocked deletion through, logged at warning level with the reason and counted."""
    review = review_of("finalizer-deployment")
    review["request"]["oldObject"]["metadata"]["annotations"] = {BREAK_GLASS_ANNOTATION: "INC-4711 controller wedged"}
    webhook = make_webhook(source)
    body = (await post_review(webhook, review)).json()
    assert body["response"]["allowed"] is True
    [line] = [line for line in logs() if line["event"] == "decision"]
    assert line["level"] == "warning" and line["break_glass"] == "INC-4711 controller wedged"
    metrics = webhook.metrics.exposition()[0].decode()
    assert metric_value(metrics, 'criticalsvc_break_glass_total{resource="deployments.apps"}') == 1


async def test_rejections_are_logged_without_the_body(
    source: StaticStateSource, logs: Callable[[], list[dict[str, Any]]]
) -> None:
    """A malformed request is logged as one warning naming the problem, without echoing the body."""
    async with client_for(make_webhook(source)) as client:
        await client.post("/validate", content=b'{"secret-marker": 1}', headers={"content-type": "application/json"})
    [line] = [line for line in logs() if line["event"] == "request rejected"]
    assert line["level"] == "warning" and line["status"] == 400 and line["reason"] == "malformed"
    assert "secret-marker" not in json.dumps(logs())


# --- a CriticalService's CREATE waits (bounded) for a cache that is syncing ------------------------------------
PVCS = GroupResource("", "persistentvolumeclaims")


def _cs(name: str, provider: str, criterion: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": {"group": "", "resource": "persistentvolumeclaims", "namespace": "shop",
                                  "name": provider}, "criteria": [criterion]}}


class SyncingSource:
    """Caches with the claims type still syncing until `sync()`; `waits` counts wait_changed calls."""

    def __init__(self, *, forbidden: bool = False) -> None:
        self.memory = state_with(_cs("team-a", "data", {"type": "Resources", "resources": {
            "group": "", "resource": "persistentvolumeclaims", "namespace": "shop",
            "selector": {"matchLabels": {"role": "cache"}}}}))
        self.synced, self.forbidden, self.waits = False, forbidden, 0
        self.changed = asyncio.Event()
        self.ready = True

    @property
    def state(self) -> Any:
        return self.memory if self.synced else Unreadable(self.memory, PVCS)

    def syncing(self) -> bool:
        return not self.synced and not self.forbidden

    async def wait_changed(self, timeout: float) -> bool:
        self.waits += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.changed.wait()
        return self.changed.is_set()

    def sync(self) -> None:
        self.synced = True
        self.changed.set()


def _create_team_c() -> dict[str, Any]:
    # team-c waits for team-a's claim and protects a claim team-a's criterion might select: a cycle or not
    # depends on the claims' labels, which the syncing cache does not have yet.
    obj = _cs("team-c", "cache", {"type": "SpecificResource", "specificResource": {
        "group": "", "resource": "persistentvolumeclaims", "namespace": "shop", "name": "data"}})
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "c1", "kind": {"group": "criticalsvc.io", "version": "v1alpha1", "kind": "CriticalService"},
        "resource": {"group": "criticalsvc.io", "version": "v1alpha1", "resource": "criticalservices"},
        "name": "team-c", "operation": "CREATE", "userInfo": {"username": "alice"}, "object": obj}}


async def test_a_critical_service_create_waits_for_a_syncing_cache_instead_of_being_refused() -> None:
    source = SyncingSource()
    webhook = make_webhook(source, sync_wait=5.0)
    asyncio.get_running_loop().call_later(0.2, source.sync)
    response = (await post_review(webhook, _create_team_c())).json()["response"]
    assert response["allowed"] is True, response
    assert source.waits == 1


async def test_the_wait_is_bounded_and_then_refuses_as_unverifiable() -> None:
    source = SyncingSource()
    webhook = make_webhook(source, sync_wait=0.3)
    started = asyncio.get_running_loop().time()
    response = (await post_review(webhook, _create_team_c())).json()["response"]
    assert asyncio.get_running_loop().time() - started < 2.0
    assert response["allowed"] is False
    assert "could not verify" in response["status"]["message"]


async def test_a_type_the_gate_may_not_list_is_not_waited_for() -> None:
    source = SyncingSource(forbidden=True)
    response = (await post_review(make_webhook(source, sync_wait=5.0), _create_team_c())).json()["response"]
    assert response["allowed"] is False and source.waits == 0
    assert "403 Forbidden" in response["status"]["message"]


# --- a CriticalService's CREATE warns when the gate may not read a type it names ------------------------------
class FakeAccess:
    def __init__(self, *unlistable: GroupResource) -> None:
        self.denied, self.asked = set(unlistable), []

    async def unlistable(self, types: Any, *, timeout: float) -> list[GroupResource]:
        self.asked.append(list(types))
        return [gr for gr in types if gr in self.denied]


def _create(cs: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "w1", "kind": {"group": "criticalsvc.io", "version": "v1alpha1", "kind": "CriticalService"},
        "resource": {"group": "criticalsvc.io", "version": "v1alpha1", "resource": "criticalservices"},
        "name": cs["metadata"]["name"], "operation": "CREATE", "userInfo": {"username": "alice"}, "object": cs}}


async def test_a_critical_service_naming_a_type_the_gate_may_not_list_is_admitted_with_a_warning(
        state: MemoryState, source: StaticStateSource) -> None:
    (cs,) = [m.obj for m in load_path(str(STORY)) if m.kind == "CriticalService"]
    access = FakeAccess(COOL)
    response = (await post_review(make_webhook(source, read_access=access, manages_routes=True),
                                  _create(copy.deepcopy(dict(cs))))).json()["response"]
    assert response["allowed"] is True
    assert response["warnings"] == [
        'spec.criteria[0]: the gate may not list coolresources.my.crd.group; what depends on it is refused as '
        'unverifiable until a ClusterRole labelled criticalsvc.io/aggregate-to-reader="true" grants get, list, '
        'watch on coolresources.my.crd.group']
    assert access.asked == [[GroupResource("apps", "deployments"), COOL, CRDS]]
    # Readable: no warning.
    response = (await post_review(make_webhook(source, read_access=FakeAccess(), manages_routes=True),
                                  _create(copy.deepcopy(dict(cs))))).json()["response"]
    assert "warnings" not in response
