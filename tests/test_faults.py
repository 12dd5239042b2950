"""Faults from the API server (the stand-in) during watches and live confirmations: no wrong ALLOW, then recovery.

The service is composed as `serve` composes it (commands/serve.py `_main`): CacheState over the
stand-in, a LiveReader confirming cache ALLOWs, the real Webhook in front. Each test starts with the
provider's criteria met (the cache ALLOWs its deletion), deafens the cache with a fault on every watch,
then makes the criteria unmet on the API server - so the cache's ALLOW is now wrong and only the live
confirmation stands between it and a wrong answer. Faults: 500, 410 Gone, a stream broken off
mid-body, and a request that never answers (slow/timeout); in the "confirm" phase the confirmation
reads fail the same way. Every review answered meanwhile must be a denial (or a 503); after the faults
are cleared the cache must catch up and the answers be right again: BLOCKED for the provider, ALLOW for
an unprotected object. Conditions are polled (kubefakes.eventually), never slept for.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubefakes import RunningStandIn, eventually, running_standin, story_objects, story_store

from criticalsvc.admission import parse_review
from criticalsvc.cache import Backoff, CacheState, KubeTransport
from criticalsvc.decision import decide
from criticalsvc.live import LiveReader
from criticalsvc.server import Webhook

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
FAST = Backoff(initial=0.01, maximum=0.05)
REVIEW = json.loads((ROOT / "api/examples/reviews/delete-provider.json").read_text())
# A CoolResource nobody protects: its deletion is the "correct ALLOW" after recovery.
UNPROTECTED = {**REVIEW, "request": {
    **REVIEW["request"], "uid": "unprotected", "name": "alpha", "namespace": "cool-apps",
    "kind": {"group": "my.crd.group", "version": "v1", "kind": "CoolResource"},
    "resource": {"group": "my.crd.group", "version": "v1", "resource": "coolresources"},
    "oldObject": {"apiVersion": "my.crd.group/v1", "kind": "CoolResource",
                  "metadata": {"name": "alpha", "namespace": "cool-apps"}}}}
# Without the CRD and its CRs the provider's criteria are met.
MET = ("CustomResourceDefinition", "CoolResource")
# The reader's own budget; the stand-in's "hang" fault never answers, so this is the timeout path.
READ_TIMEOUT = 0.3
FAULTS: dict[str, dict[str, Any]] = {
    "500": {"action": "status", "status": 500},
    "410-gone": {"action": "status", "status": 410},
    "dropped-stream": {"action": "abort"},
    "no-answer": {"action": "hang"},
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def env() -> Iterator[RunningStandIn]:
    with running_standin(story_store(skip_kinds=MET)) as running:
        yield running


@contextlib.asynccontextmanager
async def service(env: RunningStandIn) -> AsyncIterator[tuple[CacheState, httpx.AsyncClient]]:
    """The cache, the live reader and the webhook over the stand-in, as `serve` wires them."""
    from kubernetes.aio import client

    api = client.ApiClient(client.Configuration(host=env.url))
    transport = KubeTransport(api)
    cache = CacheState(transport, backoff=FAST)
    reader = LiveReader(transport, mapper=cache.mapper, timeout=READ_TIMEOUT)
    webhook = Webhook(cache, confirm=reader.confirm, needs_confirmation=reader.needs_confirmation)
    try:
        await cache.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=webhook.webhook_app()),
                                     base_url="http://gate") as http:
            yield cache, http
    finally:
        env.faults.clear()  # release hanging requests before the cache stops
        await cache.stop()
        await api.close()  # type: ignore[no-untyped-call]


async def answer(http: httpx.AsyncClient, review: dict[str, Any]) -> dict[str, Any] | None:
    """The AdmissionReview response, or None for a 503 (not ready: the API server's failurePolicy applies)."""
    reply = await http.post("/validate", json=review)
    assert reply.status_code in (200, 503), reply.text
    return reply.json()["response"] if reply.status_code == 200 else None


def watching(cache: CacheState) -> bool:
    """Every watched resource's reflector has its watch open."""
    reflectors = [cache.reflector(gr) for gr in cache.watched()]
    return bool(reflectors) and all(r is not None and r.watching for r in reflectors)


def reopened_into_fault(env: RunningStandIn, cache: CacheState, opened: int) -> bool:
    """Drop the watches still open at the stand-in; true once every watch has come back into the fault.

    Dropped again on every poll: a watch whose request was counted but whose stream the stand-in had
    not registered yet when the first drop came (a busy machine) is missed by that drop and would
    otherwise stay open, healthy, for good. Watches hanging in the fault never reach the stand-in,
    so a repeated drop does not touch them.
    """
    env.drop_watches()
    return env.faults.seen(r".*", watch=True) >= opened + len(cache.watched())


@pytest.mark.parametrize("phase", ["watch", "confirm"])
@pytest.mark.parametrize("fault", list(FAULTS))
async def test_no_wrong_allow_during_faults_and_recovery_after(env: RunningStandIn, fault: str, phase: str) -> None:
    """While the API server fails, a protected DELETE whose criteria are unmet is never allowed; after, all is right."""
    async with service(env) as (cache, http):
        assert await cache.wait_ready(5)
        await eventually(lambda: watching(cache), what="every watch open")
        before = await answer(http, REVIEW)
        assert before is not None and before["allowed"] is True  # criteria met: the baseline ALLOW

        opened = env.faults.seen(r".*", watch=True)
        env.faults.add(r".*", watch=True, **FAULTS[fault])
        if phase == "confirm":  # before the change, so that no relist (after a 410) can teach the cache either
            env.faults.add(r".*", watch=False, **FAULTS[fault])
        await eventually(lambda: reopened_into_fault(env, cache, opened), timeout=15,
                         what="every watch reopened into the fault")
        (crd,) = story_objects("CustomResourceDefinition")
        await env.write(lambda: env.store.create(crd))
        for cr in story_objects("CoolResource"):
            await env.write(functools.partial(env.store.create, cr))

        answers = [await answer(http, {**REVIEW, "request": {**REVIEW["request"], "uid": f"during-{i}"}})
                   for i in range(3)]
        assert all(a is None or a["allowed"] is False for a in answers), answers
        if phase == "confirm":  # the fresh read failed, so the gate says it could not verify
            assert any(a is not None and a["auditAnnotations"]["rule"] == "unverifiable" for a in answers), answers

        env.faults.clear()
        await eventually(lambda: not cache.unsynced() and not decide(parse_review(REVIEW), cache).allowed,
                         timeout=10, what="the cache caught up with the API server")
        after = await answer(http, REVIEW)
        assert after is not None and after["allowed"] is False
        assert after["auditAnnotations"]["rule"] == "blocked" and "super-important" in after["status"]["message"]
        other = await answer(http, UNPROTECTED)
        assert other is not None and other["allowed"] is True
        assert (await http.get("/readyz")).status_code == 200


async def test_negative_control_without_confirmation_the_stale_cache_allows(env: RunningStandIn) -> None:
    """The scenario is sharp: a deaf cache alone allows deletion whose criteria are now unmet."""
    async with service(env) as (cache, _http):
        assert await cache.wait_ready(5)
        await eventually(lambda: watching(cache), what="every watch open")
        opened = env.faults.seen(r".*", watch=True)
        env.faults.add(r".*", watch=True, action="hang")  # a watch that never answers: no relist either
        await eventually(lambda: reopened_into_fault(env, cache, opened), timeout=15,
                         what="every watch reopened into the fault")
        (crd,) = story_objects("CustomResourceDefinition")
        await env.write(lambda: env.store.create(crd))
        assert decide(parse_review(REVIEW), cache).allowed  # what the webhook would say without confirming
