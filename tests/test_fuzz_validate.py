"""Hostile input against `POST /validate` of the real webhook app, in-process (issue 6, hardening).

The app is `Webhook(...).webhook_app()` over the reference story, called straight through ASGI (a
dozen lines below instead of an HTTP client: about 5x cheaper per request, which is what lets 10,000+
bodies run in the `ci` profile on 2 cores). For every body: never a 5xx and no exception escapes or is
swallowed (criticalsvc_decision_errors_total stays 0); undecodable or not-an-AdmissionReview input gets
a 400 with a JSON `error`; a wire-valid review gets a 200 AdmissionReview with its uid; and a DELETE
that names a protected object is never allowed unless the documented exceptions apply (the oracle,
`strategies_fuzz.must_deny`). Bodies per run: 4,000 garbage + 4,000 mutated + 2,500 protected (+ 8 controls) = 10,508;
CRITICALSVC_FUZZ_SCALE=N multiplies the generated ones by N (the long profile).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from collections import Counter
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest
import structlog
from hypothesis import given, settings
from starlette.applications import Starlette
from strategies_fuzz import (
    TARGETS,
    Body,
    base_reviews,
    delete_review,
    garbage_bodies,
    must_deny,
    mutated_reviews,
    protected_deletes,
    wire_valid,
)

from criticalsvc.logs import configure_logging
from criticalsvc.manifests import load_path
from criticalsvc.server import StaticStateSource, Webhook
from criticalsvc.snapshot import build_state

STORY = Path(__file__).resolve().parents[1] / "api/examples/reference-story.yaml"
# The long profile: CRITICALSVC_FUZZ_SCALE=10 runs ten times as many bodies (105,000: ~12 min on 2 cores).
SCALE = max(1, int(os.environ.get("CRITICALSVC_FUZZ_SCALE", "1") or 1))
GARBAGE_EXAMPLES = 4000 * SCALE
MUTATED_EXAMPLES = 4000 * SCALE
PROTECTED_EXAMPLES = 2500 * SCALE


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    """The webhook over the reference story, logging only errors (10,000 info lines would cost seconds)."""
    configure_logging("error", stream=io.BytesIO())
    yield Webhook(StaticStateSource(build_state(load_path(str(STORY)))))
    structlog.reset_defaults()
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if type(h).__name__ != "_ForwardToStructlog"]
    root.setLevel(logging.WARNING)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def _post(app: Starlette, data: bytes, chunk: int) -> tuple[int, bytes]:
    """POST `data` to /validate in `chunk`-byte pieces, as an ASGI server would; (status, body)."""
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "https",
        "path": "/validate", "raw_path": b"/validate", "root_path": "", "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        "client": ("127.0.0.1", 1), "server": ("gate", 443),
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


class Checker:
    """Sends bodies and asserts the contract on each answer; tallies outcomes for the negative controls."""

    def __init__(self, webhook: Webhook, loop: asyncio.AbstractEventLoop) -> None:
        self.webhook, self.loop = webhook, loop
        self.app = webhook.webhook_app()
        self.tally: Counter[str] = Counter()

    def errors(self) -> float:
        value = self.webhook.metrics.registry.get_sample_value("criticalsvc_decision_errors_total")
        return value or 0.0

    def check(self, body: Body, chunk: int = 65536) -> None:
        before = self.errors()
        status, raw = self.loop.run_until_complete(_post(self.app, body.data, chunk))
        assert status < 500, (status, raw[:300])
        assert self.errors() == before, "an exception was raised while answering (caught by the fail-closed net)"
        answer = orjson.loads(raw)
        if not body.decodable or not wire_valid(body.review):
            assert status == 400, (status, answer)
            assert isinstance(answer["error"], str) and answer["error"], answer
            self.tally["400"] += 1
            return
        assert status == 200, (status, answer)
        assert (answer["apiVersion"], answer["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
        response = answer["response"]
        assert response["uid"] == body.review["request"]["uid"]
        assert isinstance(response["allowed"], bool)
        if must_deny(body.review):
            assert response["allowed"] is False, ("a protected DELETE was allowed", body.review, answer)
            assert response["status"]["code"] == 403
            self.tally["must-deny"] += 1
        self.tally["allowed" if response["allowed"] else "denied"] += 1


@pytest.fixture
def checker(webhook: Webhook, loop: asyncio.AbstractEventLoop) -> Checker:
    return Checker(webhook, loop)


def test_garbage_bodies_get_a_400_with_an_error(checker: Checker) -> None:
    """Random bytes, truncated reviews and over-deep nesting are answered 400 with a JSON error, never 5xx."""

    @settings(max_examples=GARBAGE_EXAMPLES)
    @given(garbage_bodies())
    def run(body: Body) -> None:
        checker.check(body, chunk=7)

    run()
    assert checker.tally["400"] == GARBAGE_EXAMPLES  # every one of them was refused


def test_mutated_reviews_are_answered_or_refused_never_crash(checker: Checker) -> None:
    """Reviews mutated field by field get a 200 with their uid when wire-valid, a 400 otherwise, never a 5xx."""

    @settings(max_examples=MUTATED_EXAMPLES)
    @given(mutated_reviews())
    def run(body: Body) -> None:
        checker.check(body)

    run()
    # Both sides of the wire contract and of the gate were reached (a fuzzer stuck on 400s proves little).
    assert checker.tally["400"] > MUTATED_EXAMPLES // 10
    assert checker.tally["allowed"] > 0 and checker.tally["must-deny"] > MUTATED_EXAMPLES // 20, checker.tally


def test_protected_deletes_are_never_allowed(checker: Checker) -> None:
    """A DELETE naming a protected object is denied however it is dressed, unless terminating or break-glass."""

    @settings(max_examples=PROTECTED_EXAMPLES)
    @given(protected_deletes())
    def run(body: Body) -> None:
        checker.check(body)

    run()
    assert checker.tally["must-deny"] > PROTECTED_EXAMPLES // 2, checker.tally
    assert checker.tally["allowed"] > 0, checker.tally  # the documented exceptions were exercised too


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.resource)
def test_oracle_negative_control(checker: Checker, target: Any) -> None:
    """The oracle is not vacuous: each protected DELETE is denied plainly and allowed with break-glass."""
    plain = delete_review(target, name=target.name, old=dict(target.old_object))
    glass = delete_review(target, name=target.name, old={
        **target.old_object, "metadata": {**target.old_object["metadata"],
                                          "annotations": {"criticalsvc.io/break-glass": "incident 42"}}})
    assert must_deny(plain) and not must_deny(glass)
    for review, allowed in ((plain, False), (glass, True)):
        status, raw = checker.loop.run_until_complete(_post(checker.app, orjson.dumps(review), 65536))
        assert status == 200 and orjson.loads(raw)["response"]["allowed"] is allowed


def test_a_criterion_type_of_the_wrong_type_is_an_invalid_spec(checker: Checker) -> None:
    """Regression (found by this fuzzer): `type: []` in a criterion is a 422 invalid spec, not a swallowed TypeError."""
    create = next(r for r in base_reviews() if r["request"]["operation"] == "CREATE")
    create["request"]["object"]["spec"]["criteria"][0]["type"] = []
    checker.check(Body(orjson.dumps(create), create))
    status, raw = checker.loop.run_until_complete(_post(checker.app, orjson.dumps(create), 65536))
    response = orjson.loads(raw)["response"]
    assert status == 200 and response["allowed"] is False and response["status"]["code"] == 422
    assert "spec.criteria[0].type" in response["status"]["message"]


def test_a_condition_nested_past_the_recursion_limit_is_an_invalid_spec(checker: Checker) -> None:
    """A condition 300 parentheses deep is a 422 naming the field, not a RecursionError (a 500)."""
    create = next(r for r in base_reviews() if r["request"]["operation"] == "CREATE")
    create["request"]["object"]["spec"]["criteria"][0]["condition"] = "(" * 300 + "true" + ")" * 300
    checker.check(Body(orjson.dumps(create), create))
    status, raw = checker.loop.run_until_complete(_post(checker.app, orjson.dumps(create), 65536))
    response = orjson.loads(raw)["response"]
    assert status == 200 and response["allowed"] is False and response["status"]["code"] == 422
    assert "spec.criteria[0].condition: syntax error: expression recursion limit exceeded" in \
        response["status"]["message"]
