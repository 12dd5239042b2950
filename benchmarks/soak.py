"""Soak: the gate under a fixed offered rate for a bounded time - zero errors, flat memory.

    python -m benchmarks soak [--duration 60] [--rate 200] [--services 20] [--crs 2000]
                              [--connections 16] [--sample-interval 1] [--log-level info]
                              [--churn-rounds 4] [--seed 0] [--json]

The gate is `criticalsvc serve --state SNAPSHOT` in its own process, on the cluster the latency
benchmark uses (benchmarks.scale.cluster: --services operators with CRDs and CriticalServices,
--crs CRs carrying their operator's finalizer), over HTTPS keep-alive with a CA from
`criticalsvc certs`. The client is open loop: request k is due at start + k / rate whatever happened
to request k-1 (as the API server sends whenever users delete), and its latency is measured from
that due time, so a stalled gate shows up as latency rather than as a politely slower client
(the "coordinated omission" a closed-loop client such as wrk makes). Python at 200 requests/s uses
a fraction of one core, so the client does not starve the gate on a 2-core machine; `schedulerLagMaxMs`
says how late the client itself was in sending.

The requests are a fixed, seeded mix of what a gate sees (design/kubernetes-semantics.md §1, §3):

    provider-delete        DELETE of an operator's controller Deployment (~3 KB, like a real one):
                           protected - its CRs still carry the finalizer  -> 200, allowed false, 403
    provider-ns-delete     DELETE of that operator's Namespace: protected too -> allowed false, 403
    configmap-delete       an unrelated ConfigMap                           -> allowed true
    cr-delete              a CR with its operator's finalizer (a dependent) -> allowed true
    crd-delete             a CRD a CriticalService names as a criterion     -> allowed true
    tenant-ns-delete       a tenant Namespace                               -> allowed true
    malformed-*            truncated JSON, wrong apiVersion, no request.uid, a JSON array
                           -> 400 with {"error": ...}: expected, not errors

The expected answers come from how the cluster is generated (every operator has CRs, so every
provider is protected), not from asking `decide`, so the run checks the gate rather than itself.

An error is anything the API server would treat as a failed call or a wrong answer (§1.4, §1.5
[D2]): a connection error, a timeout (10 s, the v1 default timeoutSeconds [A2]), a 5xx, any other
unexpected status, an undecodable reply or one with the wrong apiVersion/kind/uid, a wrong ALLOW of
a protected deletion (`wrongAllow`) or a wrong DENY of an unprotected one (`wrongDeny`).

Memory: the gate's VmRSS (/proc/PID/status) and open file descriptors every --sample-interval
seconds. The first 20 % of the samples are warm-up (allocator arenas, the metrics' label sets and
the connection pool fill up); rssStartMiB is the median of the next 20 %, rssEndMiB the median of
the last 20 %, and rssGrowth = (end - start) / start. Medians, so one sample taken mid-garbage-
collection does not decide the result. Each open TLS connection costs the gate ~290 KiB (measured;
most of it asyncio's 256 KiB TLS read buffer), so on a busy machine, where latency spikes make the
client open more of its --connections late in a run, RSS steps up by that much per connection and
then stays flat: a 600 s run at 200/s plateaued at 71.8 MiB after ~80 s. rssMiB has the series.

Connection churn (after the load, not part of rssGrowth): the load keeps its connections open, but
the API server's transport closes a connection idle for 90 s and opens another when it needs one.
`churn` opens 64 connections at once, sends one review on each and closes them idle, 4 times;
churnRetainedKiBPerConnection is what the gate's RSS grew by per closed connection after the first
round. Close to 0 when a closed connection's memory is reused; ~290 KiB when the server keeps the
connection until its keep-alive timeout (120 s) expires - which hypercorn 0.18, the gate's server
before uvicorn, did: its H11Protocol ignores the close of an idle connection, and TCPServer's task
group then waits for the idle timer.

rssSlopePctPer10MinLast30Min is the least-squares slope through the samples of the last 30 minutes
(all of them in a shorter run), in percent of their mean per 10 minutes: issue 21's goal for the
60-minute run (`--duration 3600 --sample-interval 60`) is <= 0.5.

Goals: errors == 0 and rssGrowth < 5 % (issue 6, "Soak"): goalMet; and churnRetainedKiBPerConnection
< 32 (a tenth of a kept connection): churnGoalMet. A missed goal is reported with exit code 0; only a
run that could not be made (the gate did not start or died) exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from criticalsvc.admission import AdmissionRequest, render_review
from criticalsvc.api import GroupResource

from .latency import _stop, _wait_ports, make_certs, review_body, spawn_gate, write_snapshot
from .report import emit, percentile

ERRORS_GOAL = 0
RSS_GROWTH_GOAL = 0.05
# The API server's default webhook timeout in admission.k8s.io/v1 is 10 s [A2]: a slower answer
# is a failed call there, so it is one here.
REQUEST_TIMEOUT = 10.0
# Fractions of the samples: the first fifth is warm-up, the second the baseline, the last the end.
WINDOW = 0.2
# Every request's uid is this placeholder in the pre-encoded body, replaced per request (a bytes
# replace on ~3 KB costs microseconds; re-encoding the review per request would cost the client
# more than the gate spends deciding).
UID_PLACEHOLDER = "00000000-0000-4000-8000-000000000000"
RESPONSE_API_VERSION = "admission.k8s.io/v1"
# The churn probe: 4 rounds of 64 connections opened at once and closed idle. One round is warm-up,
# so 192 closed connections are measured: at ~290 KiB each (asyncio's TLS protocol keeps a 256 KiB
# read buffer per connection) a connection left behind shows as ~54 MiB, far above allocator noise.
CHURN_CONNECTIONS, CHURN_ROUNDS, CHURN_SETTLE = 64, 4, 0.3
# The long soak's memory goal (issue 21): over its last 30 minutes, RSS grows <= 0.5 % per 10 minutes.
SLOPE_WINDOW, SLOPE_GOAL_PCT_PER_10_MIN = 1800.0, 0.5
# A tenth of what one TLS connection holds: more than allocator noise, far less than a kept connection.
CHURN_RETAINED_GOAL_KIB = 32.0

# Error kinds (keys of the `errors` table).
CONNECTION, TIMEOUT, SERVER_ERROR, UNEXPECTED_STATUS = "connection", "timeout", "5xx", "unexpectedStatus"
BAD_RESPONSE, WRONG_ALLOW, WRONG_DENY, CLIENT = "badResponse", "wrongAllow", "wrongDeny", "client"


@attrs.frozen
class Case:
    """One kind of request in the mix and the answer it must get."""

    name: str
    bodies: tuple[bytes, ...]  # variants (one per operator, say); request k sends bodies[k % len]
    status: int  # the expected HTTP status
    allowed: bool | None  # the expected response.allowed (None: not a 200)
    weight: int  # how many of every sum(weights) requests are this case

    @property
    def protected(self) -> bool:
        return self.status == 200 and self.allowed is False


# --- the request mix ----------------------------------------------------------------------------------
def _review(*, group: str, version: str, kind: str, resource: str, name: str, namespace: str,
            old_object: dict[str, Any]) -> dict[str, Any]:
    request = AdmissionRequest(UID_PLACEHOLDER, GroupResource(group, resource), "DELETE", name, namespace,
                               old_object=old_object, kind=kind, username="soak", propagation_policy="Background")
    return dict(render_review(request, version=version))


def _encode(review: dict[str, Any]) -> bytes:
    body = json.dumps(review, separators=(",", ":")).encode()
    assert body.count(UID_PLACEHOLDER.encode()) == 1, "the uid placeholder must occur exactly once"
    return body


def cases(services: int, crs: int, *, variants: int = 20) -> list[Case]:
    """The request mix against benchmarks.scale.cluster(services, crs); see the module docstring."""
    if services < 1 or crs < services:
        raise ValueError(f"need services >= 1 and crs >= services (every provider protected), got {services}, {crs}")
    from .scale import TENANTS

    ops = range(min(services, variants))
    provider = json.loads(review_body(services))  # op0's controller, filled out to a real size
    provider["request"]["uid"] = UID_PLACEHOLDER
    op0 = _encode(provider)
    # Operator i's controller: the same document with op0 renamed ("op0" only occurs as that name).
    providers = tuple(op0.replace(b"op0", f"op{i}".encode()) for i in ops)

    def namespace(ns: str) -> bytes:
        return _encode(_review(group="", version="v1", kind="Namespace", resource="namespaces", name=ns,
                               namespace=ns, old_object={"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": ns, "labels": {
                                                             "kubernetes.io/metadata.name": ns}}}))

    def configmap(t: int) -> bytes:
        ns = f"tenant-{t}"
        return _encode(_review(group="", version="v1", kind="ConfigMap", resource="configmaps", name="settings",
                               namespace=ns, old_object={"apiVersion": "v1", "kind": "ConfigMap",
                                                         "metadata": {"name": "settings", "namespace": ns},
                                                         "data": {"LOG_LEVEL": "info", "REPLICAS": "3"}}))

    def cr(j: int) -> bytes:
        # CR j belongs to operator j % services and lives in tenant-(j % TENANTS) (scale.cluster).
        i, ns = j % services, f"tenant-{j % TENANTS}"
        group, kind = f"op{i}.example.com", f"Widget{i}"
        return _encode(_review(group=group, version="v1", kind=kind, resource=f"widgets{i}", name=f"w{j}",
                               namespace=ns, old_object={"apiVersion": f"{group}/v1", "kind": kind, "metadata": {
                                   "name": f"w{j}", "namespace": ns, "labels": {"app.kubernetes.io/instance": f"w{j}"},
                                   "finalizers": [f"{group}/cleanup"]}}))

    def crd(i: int) -> bytes:
        name = f"widgets{i}.op{i}.example.com"
        return _encode(_review(group="apiextensions.k8s.io", version="v1", kind="CustomResourceDefinition",
                               resource="customresourcedefinitions", name=name, namespace="",
                               old_object={"apiVersion": "apiextensions.k8s.io/v1",
                                           "kind": "CustomResourceDefinition", "metadata": {"name": name}}))

    wrong_version = json.loads(op0)
    wrong_version["apiVersion"] = "admission.k8s.io/v1beta1"
    no_uid = json.loads(op0)
    del no_uid["request"]["uid"]
    return [
        Case("provider-delete", providers, 200, False, 4),
        Case("provider-ns-delete", tuple(namespace(f"op{i}-system") for i in ops), 200, False, 1),
        Case("configmap-delete", tuple(configmap(t) for t in range(variants)), 200, True, 3),
        Case("cr-delete", tuple(cr(j) for j in range(0, crs, max(1, crs // variants))), 200, True, 3),
        Case("crd-delete", tuple(crd(i) for i in ops), 200, True, 1),
        Case("tenant-ns-delete", tuple(namespace(f"tenant-{t}") for t in range(variants)), 200, True, 1),
        Case("malformed-truncated", (op0[: len(op0) // 2],), 400, None, 1),
        Case("malformed-apiversion", (json.dumps(wrong_version).encode(),), 400, None, 1),
        Case("malformed-no-uid", (json.dumps(no_uid).encode(),), 400, None, 1),
        Case("malformed-array", (b"[]",), 400, None, 1),
    ]


def schedule(mix: Sequence[Case], count: int, seed: int = 0) -> list[int]:
    """Indexes into `mix` for `count` requests: each block of sum(weights) requests has every case
    `weight` times, in a seeded random order (the same proportions in every stretch of the run)."""
    block = [i for i, c in enumerate(mix) for _ in range(c.weight)]
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < count:
        rng.shuffle(block)
        out.extend(block)
    return out[:count]


def request_uid(k: int) -> str:
    """A UUID-shaped uid for request k, the same length as the placeholder it replaces."""
    return f"00000000-0000-4000-8000-{k + 1:012x}"


# --- judging one answer -------------------------------------------------------------------------------
def classify(case: Case, status: int, body: bytes, uid: str) -> str | None:
    """None if `status`/`body` is the right answer to request `uid` of `case`, else the error kind."""
    if status >= 500:
        return SERVER_ERROR
    if status != case.status:
        return UNEXPECTED_STATUS
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return BAD_RESPONSE
    if not isinstance(doc, dict):
        return BAD_RESPONSE
    if case.status != 200:  # a rejection must name what is wrong, in one line
        return None if isinstance(doc.get("error"), str) and doc["error"] else BAD_RESPONSE
    # What the API server checks before it believes an answer (§1.4, [D2]).
    response = doc.get("response")
    if (doc.get("apiVersion") != RESPONSE_API_VERSION or doc.get("kind") != "AdmissionReview"
            or not isinstance(response, dict) or response.get("uid") != uid
            or not isinstance(response.get("allowed"), bool)):
        return BAD_RESPONSE
    allowed = response["allowed"]
    if allowed != case.allowed:
        return WRONG_ALLOW if allowed else WRONG_DENY
    if not allowed:  # a denial carries a 403 Status the client shows to the user (§1.4)
        code = response.get("status", {}).get("code") if isinstance(response.get("status"), dict) else None
        if code != 403:
            return BAD_RESPONSE
    return None


# --- memory -------------------------------------------------------------------------------------------
def rss_kib(pid: int) -> int | None:
    """The process's resident set size in KiB (VmRSS), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def open_fds(pid: int) -> int | None:
    """How many file descriptors the process has open (sockets included), or None once it is gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def rss_growth(samples: Sequence[int]) -> tuple[float, float, float] | None:
    """(start, end, growth) from RSS samples in order: start is the median of the second fifth
    (after a first fifth of warm-up), end the median of the last fifth; None under 5 samples."""
    n = len(samples)
    if n < 5:
        return None
    w = max(1, math.floor(n * WINDOW))
    start = statistics.median(samples[w:2 * w])
    end = statistics.median(samples[-w:])
    return float(start), float(end), (end - start) / start


def rss_slope(samples: Sequence[int], interval: float, *, window: float = SLOPE_WINDOW) -> float | None:
    """The least-squares slope of the last `window` seconds of RSS samples (taken every `interval` s),
    in percent of their mean per 10 minutes; None with fewer than 3 samples in the window.

    A slope, not the end-to-start difference: two numbers taken minutes apart say little about whether
    memory still grows at the end of an hour, a fit through every sample of the last half-hour does."""
    n = min(len(samples), int(window / interval) + 1)
    if n < 3:
        return None
    ys = [float(v) for v in samples[-n:]]
    xs = [i * interval for i in range(n)]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope * 600 / my * 100


# --- the load -----------------------------------------------------------------------------------------
@attrs.define
class Tally:
    """What the load run saw; filled in by `drive`."""

    latencies_ms: list[float] = attrs.Factory(list)
    errors: Counter[str] = attrs.Factory(Counter)
    by_case: dict[str, Counter[str]] = attrs.Factory(dict)  # case -> {"requests", "ok", "denied", <error>}
    first_errors: list[str] = attrs.Factory(list)  # the first few, word for word
    rss: list[int] = attrs.Factory(list)  # KiB, one per sample interval
    fds: list[int] = attrs.Factory(list)  # open file descriptors, sampled with rss
    sent: int = 0
    load_seconds: float = 0.0
    max_lag_ms: float = 0.0

    def record(self, case: Case, error: str | None, *, denied: bool, detail: str = "") -> None:
        counts = self.by_case.setdefault(case.name, Counter())
        counts["requests"] += 1
        if error is None:
            counts["ok"] += 1
            counts["denied"] += denied
        else:
            counts[error] += 1
            self.errors[error] += 1
            if len(self.first_errors) < 5:
                self.first_errors.append(f"{case.name}: {error}{': ' + detail if detail else ''}")


async def drive(*, url: str, ca_file: str, mix: Sequence[Case], rate: float, duration: float, pid: int,
                sample_interval: float = 1.0, connections: int = 16, seed: int = 0) -> Tally:
    """Send rate x duration requests from `mix` to `url` open loop, sampling `pid`'s RSS meanwhile."""
    import aiohttp

    tally = Tally()
    count = max(1, round(rate * duration))
    order = schedule(mix, count, seed)
    placeholder = UID_PLACEHOLDER.encode()
    ctx = ssl.create_default_context(cafile=ca_file)
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[None]] = set()
    done_sending = asyncio.Event()

    async def one(session: aiohttp.ClientSession, k: int, due: float) -> None:
        case = mix[order[k]]
        uid = request_uid(k)
        body = case.bodies[k % len(case.bodies)].replace(placeholder, uid.encode())
        try:
            async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
                status, answer = resp.status, await resp.read()
        except TimeoutError:
            tally.record(case, TIMEOUT, denied=False, detail=f"no answer within {REQUEST_TIMEOUT} s")
            return
        except aiohttp.ClientError as exc:
            tally.record(case, CONNECTION, denied=False, detail=f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # the client's own failure: still counted, never swallowed
            tally.record(case, CLIENT, denied=False, detail=f"{type(exc).__name__}: {exc}")
            return
        tally.latencies_ms.append((loop.time() - due) * 1000)
        error = classify(case, status, answer, uid)
        denied = error is None and case.protected
        tally.record(case, error, denied=denied, detail=f"HTTP {status}: {answer[:200]!r}" if error else "")

    async def sample() -> None:
        while True:
            kib, fds = rss_kib(pid), open_fds(pid)
            if kib is not None and fds is not None:
                tally.rss.append(kib)
                tally.fds.append(fds)
            try:
                await asyncio.wait_for(done_sending.wait(), sample_interval)
                return
            except TimeoutError:
                pass

    connector = aiohttp.TCPConnector(ssl=ctx, limit=connections, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        sampler = asyncio.create_task(sample())
        t0 = loop.time()
        for k in range(count):
            due = t0 + k / rate
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tally.max_lag_ms = max(tally.max_lag_ms, (loop.time() - due) * 1000)
            task = loop.create_task(one(session, k, due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            tally.sent += 1
        # The load period ends when the last request is due plus one interval, not when it is sent.
        await asyncio.sleep(max(0.0, t0 + count / rate - loop.time()))
        tally.load_seconds = loop.time() - t0
        done_sending.set()
        await sampler
        if pending:  # answers still on their way: each is bounded by REQUEST_TIMEOUT
            await asyncio.gather(*pending)
    return tally


# --- connection churn -------------------------------------------------------------------------------
async def churn(*, url: str, ca_file: str, body: bytes, pid: int, connections: int = CHURN_CONNECTIONS,
                rounds: int = CHURN_ROUNDS) -> dict[str, Any]:
    """Open `connections` keep-alive connections at once, send one review on each, then close them all
    from the client side, idle - as Go's transport closes a connection idle for 90 s; `rounds` times.

    The first round is warm-up (the allocator reaching its level for that many connections at once);
    what the gate's RSS grows by over the later rounds, per connection closed, is memory a closed
    connection left behind. Returns that and the answers' statuses (all must be 200)."""
    import aiohttp

    ctx = ssl.create_default_context(cafile=ca_file)
    statuses: Counter[int] = Counter()
    rss: list[int] = []
    fds: list[int] = []
    for r in range(rounds):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=connections)) as session:
            async def one(k: int, first: int = r * connections) -> None:
                data = body.replace(UID_PLACEHOLDER.encode(), request_uid(first + k).encode())
                async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
                    await resp.read()
                    statuses[resp.status] += 1

            await asyncio.gather(*(one(k) for k in range(connections)))
        # Leaving the block closed every connection; give the gate a moment to see the EOFs.
        await asyncio.sleep(CHURN_SETTLE)
        kib, n = rss_kib(pid), open_fds(pid)
        if kib is None or n is None:
            raise RuntimeError("the gate exited during the connection churn")
        rss.append(kib)
        fds.append(n)
    closed = (rounds - 1) * connections
    return {"churnConnections": rounds * connections, "churnStatuses": {str(k): v for k, v in statuses.items()},
            "churnRssMiB": [round(k / 1024, 1) for k in rss], "churnOpenFds": fds,
            "churnRetainedKiBPerConnection": round((rss[-1] - rss[0]) / closed, 1) if closed else None}


# --- one soak run -------------------------------------------------------------------------------------
@attrs.frozen
class Gate:
    """A running `criticalsvc serve --state` process (see running_gate)."""

    url: str
    ca_file: str
    process: subprocess.Popen[bytes]
    objects: int
    log: Path

    def check_alive(self, during: str) -> None:
        exited = self.process.poll()
        if exited is not None:
            tail = self.log.read_bytes()[-1500:].decode(errors="replace")
            raise RuntimeError(f"the gate exited with {exited} during {during}; its log ends:\n{tail}")


@contextlib.contextmanager
def running_gate(*, services: int = 20, crs: int = 2000, log_level: str = "info") -> Iterator[Gate]:
    """A gate on benchmarks.scale.cluster(services, crs) over TLS, ready (polled) on entry, SIGTERMed on exit."""
    with tempfile.TemporaryDirectory(prefix="criticalsvc-soak-") as tmp:
        work = Path(tmp)
        make_certs(work)
        snapshot = work / "snapshot.json"
        objects = write_snapshot(snapshot, services, crs)
        log = work / "gate.log"
        with log.open("wb") as log_file:
            process = spawn_gate(work, snapshot, log_level=log_level, stderr=log_file)
        try:
            port = _wait_ports(work / "gate-ports.json", process, "the gate")["listen"]
            yield Gate(f"https://127.0.0.1:{port}/validate", str(work / "ca.crt"), process, objects, log)
        finally:
            _stop(process)


def soak(*, duration: float = 60.0, rate: float = 200.0, services: int = 20, crs: int = 2000,
         connections: int = 16, sample_interval: float = 1.0, log_level: str = "info",
         seed: int = 0, churn_rounds: int = CHURN_ROUNDS) -> dict[str, Any]:
    """Start a gate, drive it at `rate` requests/s for `duration` s, then churn connections (unless
    churn_rounds is 0), stop it; return the report section.

    Raises RuntimeError if the run could not be made (the gate did not start, or died during it)."""
    if rate <= 0 or duration <= 0:
        raise ValueError(f"rate and duration must be positive, got {rate}, {duration}")
    mix = cases(services, crs)
    with running_gate(services=services, crs=crs, log_level=log_level) as gate:
        started = time.perf_counter()
        tally = asyncio.run(drive(url=gate.url, ca_file=gate.ca_file, mix=mix, rate=rate, duration=duration,
                                  pid=gate.process.pid, sample_interval=sample_interval, connections=connections,
                                  seed=seed))
        wall = time.perf_counter() - started
        gate.check_alive("the soak")
        churned = {}
        if churn_rounds > 1:
            churned = asyncio.run(churn(url=gate.url, ca_file=gate.ca_file, body=mix[0].bodies[0],
                                        pid=gate.process.pid, rounds=churn_rounds))
            gate.check_alive("the connection churn")
    section = _section(tally, mix, duration=duration, rate=rate, services=services, objects=gate.objects,
                       connections=connections, sample_interval=sample_interval, log_level=log_level, wall=wall)
    section.update(churned)
    if churned:
        retained = churned["churnRetainedKiBPerConnection"]
        section["churnGoal"] = f"churnRetainedKiBPerConnection < {CHURN_RETAINED_GOAL_KIB:g}"
        section["churnGoalMet"] = retained is not None and retained < CHURN_RETAINED_GOAL_KIB
    return section


def _section(tally: Tally, mix: Sequence[Case], *, duration: float, rate: float, services: int, objects: int,
             connections: int, sample_interval: float, log_level: str, wall: float) -> dict[str, Any]:
    answered = sorted(tally.latencies_ms)
    errors = sum(tally.errors.values())
    rss = rss_growth(tally.rss)
    start, end, growth = rss if rss is not None else (None, None, None)
    slope = rss_slope(tally.rss, sample_interval)
    met = errors == ERRORS_GOAL and growth is not None and growth < RSS_GROWTH_GOAL

    def mib(kib: float | None) -> float | None:
        return None if kib is None else round(kib / 1024, 1)

    case_rows = []
    for case in mix:
        c = tally.by_case.get(case.name, Counter())
        expected = f"HTTP {case.status}" if case.status != 200 else ("deny 403" if case.protected else "allow")
        case_rows.append([case.name, expected, c["requests"], c["ok"], c["denied"], c["requests"] - c["ok"]])
    return {
        "durationSeconds": duration, "offeredRate": rate, "connections": connections,
        "snapshotObjects": objects, "snapshotServices": services, "gateLogLevel": log_level,
        "requests": tally.sent, "answered": len(answered),
        "achievedRate": round(tally.sent / tally.load_seconds, 1) if tally.load_seconds else 0.0,
        "answeredRate": round(len(answered) / tally.load_seconds, 1) if tally.load_seconds else 0.0,
        "schedulerLagMaxMs": round(tally.max_lag_ms, 1),
        "p50ms": round(percentile(answered, 50), 2) if answered else None,
        "p99ms": round(percentile(answered, 99), 2) if answered else None,
        "maxms": round(answered[-1], 2) if answered else None,
        "errorCount": errors,
        "errors": dict(sorted(tally.errors.items())),
        "firstErrors": tally.first_errors,
        "protectedRequests": sum(tally.by_case.get(c.name, Counter())["requests"] for c in mix if c.protected),
        "protectedDenied": sum(tally.by_case.get(c.name, Counter())["denied"] for c in mix if c.protected),
        "rssSamples": len(tally.rss), "rssSampleIntervalSeconds": sample_interval,
        "rssFirstMiB": mib(tally.rss[0]) if tally.rss else None,
        "rssStartMiB": mib(start), "rssEndMiB": mib(end), "rssPeakMiB": mib(max(tally.rss)) if tally.rss else None,
        "rssGrowth": round(growth, 4) if growth is not None else None,
        # The fit through the last 30 minutes' samples (or all, in a shorter run): what grows at the end.
        "rssSlopePctPer10MinLast30Min": None if slope is None else round(slope, 3),
        "rssSlopeGoal": f"<= {SLOPE_GOAL_PCT_PER_10_MIN} % per 10 min over the last {SLOPE_WINDOW / 60:g} min",
        # The whole series (one value per interval: 600 numbers for a 10 min run), to see a trend.
        "rssMiB": [mib(kib) for kib in tally.rss],
        # File descriptors (sockets: one per client connection) - a leak of connections shows here first.
        "openFdsFirst": tally.fds[0] if tally.fds else None, "openFdsLast": tally.fds[-1] if tally.fds else None,
        "openFdsPeak": max(tally.fds) if tally.fds else None,
        "goal": f"errors == {ERRORS_GOAL}, rssGrowth < {RSS_GROWTH_GOAL:.0%}",
        "errorsGoalMet": errors == ERRORS_GOAL,
        "rssGoalMet": growth is not None and growth < RSS_GROWTH_GOAL,
        "goalMet": met,
        "wallSeconds": round(wall, 1),
        "byCase": {name: dict(c) for name, c in tally.by_case.items()},
        "tables": [{"title": "requests by case", "columns": ["case", "expected", "requests", "ok", "denied", "errors"],
                    "rows": case_rows}],
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (issue 6's long profile: 600)")
    p.add_argument("--rate", type=float, default=200.0, help="offered requests per second (open loop)")
    p.add_argument("--services", type=int, default=20, help="CriticalServices in the gate's snapshot")
    p.add_argument("--crs", type=int, default=2000, help="CRs with finalizers in the gate's snapshot")
    p.add_argument("--connections", type=int, default=16, help="most keep-alive connections the client opens")
    p.add_argument("--sample-interval", type=float, default=1.0, help="seconds between RSS samples")
    p.add_argument("--log-level", default="info", help="the gate's --log-level (info: one line per decision)")
    p.add_argument("--seed", type=int, default=0, help="seed of the request order")
    p.add_argument("--churn-rounds", type=int, default=CHURN_ROUNDS,
                   help=f"rounds of {CHURN_CONNECTIONS} connections opened and closed after the load (0: none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        section = soak(duration=args.duration, rate=args.rate, services=args.services, crs=args.crs,
                       connections=args.connections, sample_interval=args.sample_interval,
                       log_level=args.log_level, seed=args.seed, churn_rounds=args.churn_rounds)
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"python -m benchmarks soak: {exc}", file=sys.stderr)
        emit("soak", {"error": str(exc)}, as_json=args.json)
        return 1
    print(f"   soak: {section['requests']} requests at {section['achievedRate']} req/s, "
          f"{section['errorCount']} errors, RSS {section['rssStartMiB']} -> {section['rssEndMiB']} MiB "
          f"({section['rssGrowth']}), p99 {section['p99ms']} ms; churn: "
          f"{section.get('churnRetainedKiBPerConnection')} KiB retained per closed connection",
          file=sys.stderr, flush=True)
    emit("soak", section, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
