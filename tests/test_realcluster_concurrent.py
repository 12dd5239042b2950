"""Many teardowns at once, and a soak, on a real control plane with two gate replicas behind the
stand-in for their Service (issue 13's remaining parts).

1. `test_concurrent_teardowns_complete_in_order`: N copies of the reference story (each its own
   namespaces, CRD group, finalizer, provider Deployment and CriticalService) applied, then all torn
   down at once by N repeating deleters (every refused DELETE re-sent) in threads, with the stories' finalizer
   controllers running. Every teardown completes, none breaks the safe order. Printed: the wall time,
   the gate's request rate on the API server during the teardown (from the audit log, by verb) and
   the gate's decision latency (its own histogram, both replicas, before/after difference).
2. `test_soak_no_wrong_decision_and_flat_memory`: a steady stream of small stacks (a provider
   Deployment protected until a `user` Deployment is gone) created and torn down for a fixed time:
   never a wrong ALLOW (the provider, its CriticalService or its namespace deleted while the user
   exists), no other refusal or failure (no 500 "failed calling webhook", no refused CREATE of a
   CriticalService), and each replica's RSS grows less than 5 % from a warm-up point to the end.
   Counted and printed, not failed on: refusals after the user was gone (cache lag). The "no other
   answer" part once failed: the gate dropped readiness (503 to everything) whenever a new
   CriticalService's types were syncing, and stopped watching a type as soon as its last
   CriticalService went, so every stack restarted the deployments.apps watch (382 restarts and 27
   500s in a 2-minute soak); now readiness holds after the first sync and caches linger
   (CacheState.unwatch_after).

Sizes (the CI profile is the default; each test stays under a minute on 2 busy cores):

    CRITICALSVC_CONCURRENT_STACKS=8            # the long profile: 50
    CRITICALSVC_REALCLUSTER_SOAK_SECONDS=20    # the long profile: 600

    PATH=$PATH:/usr/local/go/bin CRITICALSVC_CONCURRENT_STACKS=50 CRITICALSVC_REALCLUSTER_SOAK_SECONDS=600 \
        .venv/bin/pytest tests/test_realcluster_concurrent.py -s
"""

from __future__ import annotations

import math
import os
import re
import ssl
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import httpx
import pytest

from benchmarks.realcluster import histogram_quantile
from tests.backends import deployment_manifest, unique
from tests.realcluster.client import Client
from tests.realcluster.cluster import RealCluster, built_binaries, real_cluster
from tests.realcluster.controlplane import gate_requests
from tests.realcluster.gate import GateProcess
from tests.realcluster.teardown import (
    FinalizerController,
    Observer,
    RepeatingDeleter,
    SharedFinalizerController,
    Story,
    apply_story,
    wait_for,
)

pytestmark = pytest.mark.realcluster

STACKS = int(os.environ.get("CRITICALSVC_CONCURRENT_STACKS", "8"))
SOAK_SECONDS = float(os.environ.get("CRITICALSVC_REALCLUSTER_SOAK_SECONDS", "20"))
# Up to this many stories, each has its own FinalizerController thread; beyond, one thread serves all.
THREADS_PER_STORY_UP_TO = 16
SOAK_WORKERS = 2  # stacks in flight at once during the soak
RSS_GROWTH_LIMIT = 0.05
DURATION = "criticalsvc_decision_duration_seconds"
TAIL_PARTS = ("criticalsvc_cache_decision_duration_seconds", "criticalsvc_cache_decision_cpu_seconds",
              "criticalsvc_event_loop_lag_seconds",
              "criticalsvc_event_loop_lag_cpu_seconds", 'criticalsvc_gc_pause_seconds{generation="2"}')
# What the status writer and leader election write or read: not on the decision path.
BOOKKEEPING = frozenset({"leases", "events", "criticalservices/status"})


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane of this module's own with 2 gate replicas behind the load balancer."""
    with real_cluster(built_binaries(), tmp_path_factory.mktemp("concurrent"), replicas=2) as cluster:
        yield cluster


@pytest.fixture
def logs_on_failure(request: pytest.FixtureRequest, pair: RealCluster) -> Iterator[None]:
    """Print the control plane's and the replicas' log tails when the test failed."""
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed > failed_before:
        print(f"\n{pair.logs()}")


# --- asking each replica directly --------------------------------------------------------------------
class ReplicaProbe:
    """Sends a dry-run DELETE AdmissionReview straight to every replica's webhook port (as the API server
    would, TLS verified against the install's CA): does every replica refuse it yet? The API server
    reuses its connections through the load balancer, so a dry-run DELETE sent through it tells about
    the replica its connection happens to reach only, and a replica whose cache has not seen a new
    CriticalService yet still lets its provider go (unprotected as far as it knows)."""

    def __init__(self, cluster: RealCluster) -> None:
        context = ssl.create_default_context(cafile=str(cluster.gate.certs / "ca.crt"))
        self.replicas = list(cluster.gate.replicas)
        self.http = httpx.Client(verify=context, timeout=10, trust_env=False)

    def close(self) -> None:
        self.http.close()

    def refused_by_every_replica(self, resource: tuple[str, str, str], namespace: str, name: str,
                                 old: dict[str, Any]) -> bool:
        group, version, plural = resource
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": str(uuid.uuid4()), "operation": "DELETE", "dryRun": True,
            "kind": {"group": group, "version": version, "kind": old.get("kind", "")},
            "resource": {"group": group, "version": version, "resource": plural},
            "name": name, "namespace": namespace, "oldObject": old,
            "userInfo": {"username": "criticalsvc-test-probe"}}}
        for gate in self.replicas:
            answer = self.http.post(f"https://127.0.0.1:{gate.webhook_port}/validate", json=review)
            if answer.status_code != 200 or answer.json()["response"]["allowed"]:
                return False
        return True

    def wait_protected(self, client: Client, path: str, *, timeout: float = 60) -> float:
        """Wait until every replica refuses to delete the Deployment at `path`; the seconds it took."""
        started = time.monotonic()
        obj = client.get(path)
        assert obj is not None, f"{path} does not exist"
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        wait_for(lambda: self.refused_by_every_replica(("apps", "v1", "deployments"), namespace, name, obj),
                 timeout=timeout, what=f"every replica to protect {path}", interval=0.05)
        return time.monotonic() - started


# --- the gate's decision-latency histogram --------------------------------------------------------------
@attrs.frozen
class Histogram:
    buckets: dict[float, float]  # cumulative counts by upper bound
    total: float
    count: float

    @classmethod
    def read(cls, gate: GateProcess, metric: str = DURATION) -> Histogram:
        """`metric` may name one labelled series: `name{label="value"}`."""
        name, _, labels = metric.partition("{")
        label = labels.rstrip("}")
        buckets: dict[float, float] = {}
        total = count = 0.0
        for line in gate.metrics().splitlines():
            head, _, value = line.rpartition(" ")
            series, _, their = head.partition("{")
            if label and label not in their.rstrip("}").split(","):
                continue
            if series == f"{name}_bucket":
                le = re.search(r'le="([^"]+)"', head)
                assert le is not None, line
                buckets[math.inf if le.group(1) == "+Inf" else float(le.group(1))] = float(value)
            elif series == f"{name}_sum":
                total = float(value)
            elif series == f"{name}_count":
                count = float(value)
        if label and not buckets:
            return cls({math.inf: 0.0}, 0.0, 0.0)  # no sample of that series yet (no full collection)
        assert buckets, f"{metric} not in {gate.process.name}'s /metrics"
        return cls(buckets, total, count)

    def __sub__(self, other: Histogram) -> Histogram:
        return Histogram({le: self.buckets.get(le, 0.0) - other.buckets.get(le, 0.0)
                          for le in self.buckets.keys() | other.buckets.keys()},
                         self.total - other.total, self.count - other.count)

    def __add__(self, other: Histogram) -> Histogram:
        return Histogram({le: self.buckets.get(le, 0.0) + other.buckets.get(le, 0.0)
                          for le in self.buckets.keys() | other.buckets.keys()},
                         self.total + other.total, self.count + other.count)

    def summary(self, noun: str = "decisions") -> str:
        if not self.count:
            return f"no {noun}"
        pairs = sorted(self.buckets.items())
        p50, p99 = (1000 * histogram_quantile(pairs, q) for q in (0.5, 0.99))
        return (f"{self.count:.0f} {noun}, mean {1000 * self.total / self.count:.2f} ms, "
                f"p50 ~{p50:.2f} ms, p99 ~{p99:.2f} ms")


def _counter(gate: GateProcess, name: str, **labels: str) -> float:
    total = 0.0
    for line in gate.metrics().splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def _watch_starts(gate: GateProcess, resource: str, offset: int) -> int:
    """How often the replica started watching `resource` since its log was `offset` bytes long."""
    with gate.process.log_path.open("rb") as log:
        log.seek(offset)
        return sum(1 for line in log if b'"event":"watching"' in line and f'"resource":"{resource}"'.encode() in line)


def _rss_kib(gate: GateProcess) -> int:
    popen = gate.process.popen
    assert popen is not None and popen.poll() is None, f"{gate.process.name} is not running"
    with open(f"/proc/{popen.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {gate.process.name}")


def _per_second(counts: Counter[str], seconds: float) -> str:
    return ", ".join(f"{k} {n / seconds:.1f}/s ({n})" for k, n in counts.most_common()) or "none"


# --- 1. many teardowns at once ---------------------------------------------------------------------
@attrs.define
class Stack:
    story: Story
    client: Client
    deleter: RepeatingDeleter
    observer: Observer
    done: list[bool] = attrs.field(factory=list)
    finished_after: float = 0.0


FAILED_CALLING_WEBHOOK = "failed calling webhook"


def _apply_all(cluster: RealCluster, stories: list[Story], probe: ReplicaProbe) -> list[str]:
    """Apply the stories, 4 at a time, until every replica protects each provider. An apply refused
    with "failed calling webhook" (the gate failing closed: both replicas answer 503 while they sync
    the type a new CriticalService names) is applied again, as a user or GitOps agent would; the
    refusals are returned."""
    failed: list[str] = []

    def apply(story: Story) -> None:
        for attempt in range(5):
            try:
                apply_story(cluster.kubectl, cluster.admin, story, timeout=120)
                break
            except AssertionError as exc:
                if FAILED_CALLING_WEBHOOK not in str(exc) or attempt == 4:
                    raise
                failed.append(f"{story.suffix}: {str(exc).splitlines()[0][:200]}")
                time.sleep(0.5)
        probe.wait_protected(cluster.admin, story.deployment_path, timeout=60)

    with ThreadPoolExecutor(max_workers=4) as pool:
        for future in [pool.submit(apply, s) for s in stories]:
            future.result()
    return failed


def test_concurrent_teardowns_complete_in_order(pair: RealCluster, logs_on_failure: None) -> None:
    """N reference stories torn down at once: every teardown completes, none out of order; prints wall time,
    the gate's API request rate by verb and its decision latency."""
    stories = [Story.make(f"c{i}") for i in range(STACKS)]
    probe = ReplicaProbe(pair)
    started = time.monotonic()
    try:
        apply_failures = _apply_all(pair, stories, probe)
    finally:
        probe.close()
    applied_in = time.monotonic() - started
    wait_for(lambda: all(g.ready() for g in pair.gate.replicas), timeout=60, what="both replicas ready")

    # Observers watch every object of every story (one watch per collection); `observe_every` is their
    # pause before re-watching after a break, longer with N so that reconnecting watches do not starve
    # the 2 cores the control plane runs on.
    observe_every = max(0.1, 0.05 * STACKS)
    stacks = []
    for story in stories:
        client = Client(pair.kubeconfig)
        stacks.append(Stack(story, client, RepeatingDeleter(client, story.paths()),
                            Observer(client, story.paths(), interval=observe_every)))
    controllers: list[FinalizerController | SharedFinalizerController]
    shared_client = None
    if STACKS <= THREADS_PER_STORY_UP_TO:
        controllers = [FinalizerController(s.client, deployment_path=s.story.deployment_path,
                                           crs_path=f"/apis/{s.story.group}/v1/coolresources",
                                           finalizer=s.story.finalizer) for s in stacks]
    else:
        shared_client = Client(pair.kubeconfig)
        controllers = [SharedFinalizerController(shared_client, stories)]
    timeout = 60 + 3 * STACKS
    before = [Histogram.read(g) for g in pair.gate.replicas]
    # The tail's parts (issue 21): decisions without a live confirmation round trip, and the event loop's lag.
    before_parts = {m: [Histogram.read(g, m) for g in pair.gate.replicas] for m in TAIL_PARTS}
    wall_start = time.time()
    teardown_start = time.monotonic()

    def tear_down(stack: Stack) -> None:
        stack.done.append(stack.deleter.run(timeout=timeout))
        stack.finished_after = time.monotonic() - teardown_start

    workers = [threading.Thread(target=tear_down, args=(s,), daemon=True, name=f"deleter-{s.story.suffix}")
               for s in stacks]
    try:
        for thread in [*controllers, *(s.observer for s in stacks), *workers]:
            thread.start()
        for worker in workers:
            worker.join(timeout + 30)
        wall = time.monotonic() - teardown_start
        wall_end = time.time()
    finally:
        for stack in stacks:
            stack.observer.stop()
        for controller in controllers:
            controller.stop()
    after = [Histogram.read(g) for g in pair.gate.replicas]
    parts = {m: [Histogram.read(g, m) - b for g, b in zip(pair.gate.replicas, before_parts[m], strict=True)]
             for m in TAIL_PARTS}
    time.sleep(1)  # the audit log is written as requests complete
    # The gate's requests received during the teardown: all since its start minus those since its end.
    # (Read in this order, the second read holds every line of the first.)
    after_end = gate_requests(pair.plane.audit_log, since=wall_end)
    requests = gate_requests(pair.plane.audit_log, since=wall_start)
    for late in after_end:
        requests.remove(late)
    for stack in stacks:
        stack.client.close()
    if shared_client is not None:
        shared_client.close()

    by_verb = Counter(r["verb"] for r in requests)
    on_path = Counter(r["verb"] for r in requests if r["resource"] not in BOOKKEEPING)
    by_resource = Counter(f"{r['verb']} {r['resource'] or 'discovery'}" for r in requests)
    per_replica = [a - b for a, b in zip(after, before, strict=True)]
    latency = per_replica[0]
    for h in per_replica[1:]:
        latency = latency + h
    attempts = [a for s in stacks for a in s.deleter.attempts]
    statuses = Counter(a.status for a in attempts)
    finish = sorted(s.finished_after for s in stacks)
    threads = "one controller thread per story" if STACKS <= THREADS_PER_STORY_UP_TO else "one shared controller thread"
    print(f"\n{STACKS} reference stories ({sum(len(s.story.paths()) for s in stacks)} objects) applied in "
          f"{applied_in:.1f} s, torn down at once by {STACKS} retrying deleters "
          f"({threads}, observers every {observe_every:.2f} s); applies refused with \"{FAILED_CALLING_WEBHOOK}\" "
          f"and applied again: {len(apply_failures)}")
    print(f"  wall time {wall:.1f} s (first story done after {finish[0]:.1f} s, median "
          f"{statistics.median(finish):.1f} s, last {finish[-1]:.1f} s); {len(attempts)} DELETEs sent, "
          f"statuses {dict(statuses)}")
    client_errors = [e for s in stacks for e in s.deleter.errors]
    plain_404 = [a for a in attempts if a.status == 404 and "page not found" in a.message]
    print(f"  DELETEs of a CR answered 404 \"page not found\" (its CRD already gone): {len(plain_404)}; "
          f"deleters' requests without an answer (retried next pass): {len(client_errors)} {client_errors[:3]}")
    print(f"  gate -> API server during the teardown: {len(requests)} requests = {len(requests) / wall:.1f}/s; "
          f"by verb: {_per_second(by_verb, wall)}")
    print(f"  decision path only (no leases/events/status): {_per_second(on_path, wall)}")
    print(f"  by verb and resource: {dict(by_resource.most_common())}")
    print(f"  gate decision latency (both replicas): {latency.summary()}")
    for gate, h in zip(pair.gate.replicas, per_replica, strict=True):
        print(f"    {gate.process.name}: {h.summary()}")
    for metric, per in parts.items():
        both = per[0] + per[1] if len(per) == 2 else per[0]
        print(f"  {metric} (both replicas): {both.summary('samples')}")

    stuck = {s.story.suffix: [k for k in s.story.paths() if k not in s.observer.first_gone]
             for s in stacks if s.done != [True]}
    assert not stuck, f"{len(stuck)} of {STACKS} teardowns did not finish within {timeout} s: {stuck}"
    violations = {s.story.suffix: v for s in stacks if (v := s.observer.order_violations(s.story.dependents()))}
    assert not violations, f"order violations: {violations}"
    assert {s.story.suffix: s.observer.gaps for s in stacks if s.observer.gaps} == {}, "an observer missed events"
    assert statuses[403] >= STACKS, f"the gate held back too little: {dict(statuses)}"
    assert latency.count >= statuses[403], "fewer decisions in the replicas' histograms than refusals"


# --- 2. the soak -------------------------------------------------------------------------------------
CRITICALSERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"


@attrs.define
class Tally:
    cycles: int = 0
    wrong: list[str] = attrs.field(factory=list)  # an ALLOW while what it protects still needed it
    checked: int = 0  # DELETEs whose answer had to be a refusal
    lagging_refusals: int = 0  # a 403 after the user was gone (the caches had not caught up yet)
    release_lag: list[float] = attrs.field(factory=list)  # user DELETE answered -> provider DELETE allowed
    protect_lag: list[float] = attrs.field(factory=list)  # CriticalService created -> every replica refuses
    unexpected: Counter[str] = attrs.field(factory=Counter)  # answers other than the expected ones
    errors: list[str] = attrs.field(factory=list)


def _until_allowed(client: Client, path: str, tally: Tally, *, counted: bool, timeout: float = 30) -> float:
    """DELETE `path` every 50 ms until it is answered 200 (or 404); the seconds it took."""
    started = time.monotonic()
    while True:
        response = client.delete(path)
        if response.status_code in (200, 404):
            return time.monotonic() - started
        if response.status_code == 403:
            if counted:
                tally.lagging_refusals += 1
        else:
            tally.unexpected[f"{response.status_code} on deleting {path.rsplit('/', 2)[-2]}"] += 1
        if time.monotonic() - started > timeout:
            raise AssertionError(f"DELETE {path} still refused after {timeout:.0f} s: {response.text[:300]}")
        time.sleep(0.05)


def _create(client: Client, path: str, body: dict[str, Any], tally: Tally, *, timeout: float = 30) -> None:
    """POST until 201; a 500 (the webhook could not be called: fail closed) is counted and retried."""
    started = time.monotonic()
    while (response := client.create(path, body)).status_code != 201:
        tally.unexpected[f"{response.status_code} on creating {path.rsplit('/', 1)[-1]}"] += 1
        if response.status_code != 500 or time.monotonic() - started > timeout:
            raise AssertionError(f"POST {path}: {response.status_code} {response.text[:300]}")
        time.sleep(0.05)


def _protected_pair(client: Client, tally: Tally) -> tuple[str, str, str, str]:
    """`protect_with_user`'s stack (a namespace, Deployments `provider` and `user`, a CriticalService
    protecting the provider until `user` is gone), its CREATEs retried when the webhook fails closed."""
    ns = unique("soak")
    _create(client, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, tally)
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    for name in ("provider", "user"):
        _create(client, deployments, deployment_manifest(name, ns, replicas=0), tally)
    service = f"protects-{ns}"
    _create(client, CRITICALSERVICES, {
        "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": service},
        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": "provider"},
                 "criteria": [{"type": "SpecificResource", "specificResource": {
                     "group": "apps", "resource": "deployments", "namespace": ns, "name": "user"}}]}}, tally)
    return ns, f"{deployments}/provider", f"{deployments}/user", service


def _is_ready(client: Client, path: str) -> bool:
    conditions = ((client.get(path) or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _cycle(client: Client, probe: ReplicaProbe, tally: Tally) -> None:
    """One small stack's life: created, refused while needed, released in order, gone."""
    ns, provider, user, service = _protected_pair(client, tally)
    created = time.monotonic()
    probe.wait_protected(client, provider, timeout=30)
    # ... and routed: what a user waits for (`kubectl wait --for=condition=Ready`, design/routing.md).
    wait_for(lambda: _is_ready(client, f"{CRITICALSERVICES}/{service}"), timeout=30, what=f"{service} Ready",
             interval=0.05)
    tally.protect_lag.append(time.monotonic() - created)
    # The user still exists: the provider, the CriticalService and the namespace must all be refused.
    for what, path in (("provider", provider), ("CriticalService", f"{CRITICALSERVICES}/{service}"),
                       ("namespace", f"/api/v1/namespaces/{ns}")):
        response = client.delete(path)
        tally.checked += 1
        if response.status_code in (200, 202):
            tally.wrong.append(f"{what} {path} deleted ({response.status_code}) while {user} existed")
        elif response.status_code != 403:
            tally.unexpected[f"{response.status_code} on {what} while needed"] += 1
    _until_allowed(client, user, tally, counted=False)
    tally.release_lag.append(_until_allowed(client, provider, tally, counted=True))
    _until_allowed(client, f"{CRITICALSERVICES}/{service}", tally, counted=False)
    _until_allowed(client, f"/api/v1/namespaces/{ns}", tally, counted=False)
    tally.cycles += 1


class RssSampler(threading.Thread):
    """VmRSS of every replica once a second: [(seconds since start, [KiB per replica])]."""

    def __init__(self, replicas: list[GateProcess]) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.replicas = replicas
        self.samples: list[tuple[float, list[int]]] = []
        self.stopping = threading.Event()
        self.started_at = time.monotonic()

    def run(self) -> None:
        while True:
            self.samples.append((time.monotonic() - self.started_at, [_rss_kib(g) for g in self.replicas]))
            if self.stopping.wait(1.0):
                return

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        self.samples.append((time.monotonic() - self.started_at, [_rss_kib(g) for g in self.replicas]))

    def at(self, seconds: float) -> list[int]:
        return next(rss for t, rss in self.samples if t >= seconds)


def _soak_worker(cluster: RealCluster, probe: ReplicaProbe, tally: Tally, until: float) -> Callable[[], None]:
    def run() -> None:
        client = Client(cluster.kubeconfig)
        try:
            while time.monotonic() < until:
                try:
                    _cycle(client, probe, tally)
                except Exception as exc:  # recorded and asserted on, the stream goes on
                    tally.errors.append(f"{type(exc).__name__}: {exc}"[:400])
                    time.sleep(0.5)
        finally:
            client.close()
    return run


def test_soak_no_wrong_decision_and_flat_memory(pair: RealCluster, logs_on_failure: None) -> None:
    """Small stacks created and torn down for SOAK_SECONDS by 2 workers: zero wrong ALLOWs; each replica's
    RSS grows < 5 % from the warm-up point (a fifth of the soak, at least 5 s) to the end."""
    wait_for(lambda: all(g.ready() for g in pair.gate.replicas), timeout=60, what="both replicas ready")
    probe = ReplicaProbe(pair)
    tallies = [Tally() for _ in range(SOAK_WORKERS)]
    warm_up = max(5.0, SOAK_SECONDS / 5)
    sampler = RssSampler(list(pair.gate.replicas))
    before = [Histogram.read(g) for g in pair.gate.replicas]
    replicas = list(pair.gate.replicas)
    not_ready_before = [_counter(g, "criticalsvc_requests_rejected_total", reason="not-ready") for g in replicas]
    log_offsets = [g.process.log_path.stat().st_size for g in pair.gate.replicas]
    sampler.start()
    until = time.monotonic() + SOAK_SECONDS
    workers = [threading.Thread(target=_soak_worker(pair, probe, t, until), daemon=True, name=f"soak-{i}")
               for i, t in enumerate(tallies)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(SOAK_SECONDS + 120)
    finally:
        sampler.stop()
        probe.close()
    elapsed = sampler.samples[-1][0]
    after = [Histogram.read(g) for g in pair.gate.replicas]
    not_ready = [_counter(g, "criticalsvc_requests_rejected_total", reason="not-ready") - n
                 for g, n in zip(pair.gate.replicas, not_ready_before, strict=True)]
    watch_starts = [_watch_starts(g, "deployments.apps", o) for g, o in zip(replicas, log_offsets, strict=True)]

    cycles = sum(t.cycles for t in tallies)
    wrong = [w for t in tallies for w in t.wrong]
    errors = [e for t in tallies for e in t.errors]
    unexpected: Counter[str] = sum((t.unexpected for t in tallies), Counter())
    release = sorted(x for t in tallies for x in t.release_lag)
    protect = sorted(x for t in tallies for x in t.protect_lag)
    warm, end = sampler.at(warm_up), sampler.samples[-1][1]
    peak = [max(rss[i] for _, rss in sampler.samples) for i in range(len(pair.gate.replicas))]
    growth = [(e - w) / w for w, e in zip(warm, end, strict=True)]
    print(f"\nsoak {elapsed:.1f} s, {SOAK_WORKERS} workers: {cycles} stacks created and torn down "
          f"({cycles / elapsed:.2f}/s); {sum(t.checked for t in tallies)} DELETEs that had to be refused, "
          f"wrong ALLOWs {len(wrong)}; refusals after the user was gone (cache lag) "
          f"{sum(t.lagging_refusals for t in tallies)}; other answers {dict(unexpected)}; errors {len(errors)}")
    if release:
        print(f"  user gone -> provider allowed: median {1000 * statistics.median(release):.0f} ms, "
              f"max {1000 * release[-1]:.0f} ms; CriticalService created -> both replicas refuse: median "
              f"{1000 * statistics.median(protect):.0f} ms, max {1000 * protect[-1]:.0f} ms")
    for i, gate in enumerate(pair.gate.replicas):
        print(f"  {gate.process.name} RSS: start {sampler.samples[0][1][i] / 1024:.1f} MiB, after warm-up "
              f"({warm_up:.0f} s) {warm[i] / 1024:.1f} MiB, end {end[i] / 1024:.1f} MiB, "
              f"peak {peak[i] / 1024:.1f} MiB: growth {100 * growth[i]:+.2f} %; {(after[i] - before[i]).summary()}; "
              f"answered 503 not-ready {not_ready[i]:.0f} times (API server calls and probes); started watching "
              f"deployments.apps {watch_starts[i]} times")

    assert wrong == [], f"{len(wrong)} wrong ALLOWs: {wrong[:5]}"
    assert errors == [], f"{len(errors)} cycles failed: {errors[:3]}"
    assert not unexpected, f"answers other than the gate's decisions: {dict(unexpected)}"
    assert cycles >= max(5, SOAK_SECONDS / 4), f"the stream barely ran: {cycles} cycles"
    assert all(g < RSS_GROWTH_LIMIT for g in growth), \
        f"RSS grew {[f'{100 * g:.1f} %' for g in growth]} from {warm} to {end} KiB"

