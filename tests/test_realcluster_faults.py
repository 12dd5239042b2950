"""Control-plane faults in the middle of a bulk teardown, on a real control plane (issue 13).

Each teardown is the reference story (tests/realcluster/teardown.py) deleted all at once by a
repeating deleter (every refused DELETE re-sent) while the provider's finalizer controller runs, and a fault hits
once the gate has refused the first DELETE (the teardown is under way):

- kube-apiserver restarted (SIGTERM, start, /readyz);
- etcd restarted (SIGTERM, start on the same data directory, /health) under a running API server;
- kube-apiserver frozen with SIGSTOP for 8 s, then SIGCONT;

and each time the teardown must complete in the safe order (no order violation seen by the observer)
with no wrong ALLOW: whenever a provider's DELETE is answered 200, what it protects is verified gone
right then (objects of the story never come back, so anything found alive was alive at the ALLOW).
Three more: the gate's confirming read made impossible (it must deny, never allow); etcd frozen
(a DELETE then waits in the API server before admission, so the gate is not asked); and the gate's
serving certificate rotated under a stream of DELETEs (no failed admission call).

This module runs its own control plane (one gate replica), as it restarts and freezes etcd and the
API server; the gate reaches the API server through `pausable_proxy`, a loopback TCP forwarder that
can stop moving bytes - the gate's view of the API server frozen, while the API server itself still
calls the webhook. The module's `realcluster` fixture overrides the session's, so that conftest's
failure hook attaches this cluster's logs.

The deleter and the finalizer controller talk to the API server through `Resilient`: a request that
gets no answer (connection refused or reset while the API server restarts) is recorded as status 599
("no answer") and retried later, as the OCM work agent and a controller would, instead of ending the
thread. The observer uses the plain client: an unanswered poll tells nothing and is skipped.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import httpx
import pytest
import yaml
from cryptography import x509

from tests.backends import DeleteStream, deployment_manifest, protect_with_user, unique
from tests.realcluster.client import Client
from tests.realcluster.cluster import RealCluster, built_binaries
from tests.realcluster.controlplane import ControlPlane, free_port, write_kubeconfig
from tests.realcluster.gate import GateProcess, criticalsvc, install, served_certificate
from tests.realcluster.loadbalancer import Backend, LoadBalancer
from tests.realcluster.teardown import FinalizerController, Observer, RepeatingDeleter, Story, apply_story, wait_for

pytestmark = pytest.mark.realcluster

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
NO_ANSWER = 599  # what `Resilient` records for a request that got no HTTP answer at all
PAUSE = 8.0  # how long the API server is frozen (SIGSTOP)
SETTLE = 0.5  # after SIGSTOP, for answers already on their way


# --- a pausable view of the API server, for the gate ----------------------------------------------------

def pausable_proxy(upstream_port: int) -> LoadBalancer:
    """A loopback TCP forwarder to the API server (a load balancer of one backend). `pause()` stops moving
    bytes, both ways, on open connections and on new ones (they are accepted and then hang), until `resume()`:
    what a client sees of an API server that stopped answering without closing anything. TLS passes through,
    so the gate still verifies the API server's certificate (its SAN is the IP 127.0.0.1, any port)."""
    return LoadBalancer(free_port(), name="apiserver-proxy",
                        backends=[Backend("apiserver", upstream_port)]).start()


# --- the module's cluster --------------------------------------------------------------------------------

@attrs.define
class Faults:
    cluster: RealCluster
    proxy: LoadBalancer

    @property
    def plane(self) -> ControlPlane:
        return self.cluster.plane

    @property
    def gate(self) -> GateProcess:
        return self.cluster.gate.replicas[0]

    def recover(self) -> None:
        """Whatever a test did (or failed to undo): etcd and the API server running, the proxy
        forwarding, the gate serving and ready."""
        self.proxy.resume()
        for process in (self.plane.etcd, self.plane.apiserver):
            process.signal(signal.SIGCONT)
        if self.plane.etcd.popen is None or self.plane.etcd.popen.poll() is not None:
            self.plane.etcd.start()
        self.plane.wait_etcd_ready()
        if self.plane.apiserver.popen is None or self.plane.apiserver.popen.poll() is not None:
            self.plane.apiserver.start()
        self.plane.wait_apiserver_ready()
        replicas = self.cluster.gate.replicas
        if not replicas or any(r.process.popen is None or r.process.popen.poll() is not None for r in replicas):
            self.cluster.gate.restart()
        wait_for(self.gate.ready, timeout=60, what="the gate ready again")


@pytest.fixture(scope="module")
def _faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Faults]:
    binaries = built_binaries()
    directory = tmp_path_factory.mktemp("faults")
    plane = ControlPlane(binaries, directory)
    proxy: LoadBalancer | None = None
    cluster: RealCluster | None = None
    try:
        plane.start()
        installed = install(plane, directory / "gate")
        proxy = pausable_proxy(plane.apiserver_port)
        # The install's kubeconfig (the ServiceAccount's token), pointed at the proxy.
        token = yaml.safe_load(installed.kubeconfig.read_text())["users"][0]["user"]["token"]
        via_proxy = write_kubeconfig(directory / "gate" / "gate-via-proxy.kubeconfig", server=proxy.url,
                                     ca_cert=plane.pki.ca_cert, name="criticalsvc-gate", user={"token": token})
        gate = attrs.evolve(installed, kubeconfig=via_proxy)
        cluster = RealCluster(plane, gate, Client(plane.admin_kubeconfig))
        gate.start()
        yield Faults(cluster, proxy)
    finally:
        if cluster is not None:
            cluster.admin.close()
            cluster.gate.stop()
        if proxy is not None:
            proxy.stop()
        plane.stop()


@pytest.fixture(scope="module")
def realcluster(_faults: Faults) -> RealCluster:
    """This module's own cluster, under the session fixture's name: conftest's failure hook then
    attaches its control plane's and gate's log tails to a failing test's report."""
    return _faults.cluster


@pytest.fixture
def faults(_faults: Faults, realcluster: RealCluster) -> Iterator[Faults]:
    """The module's cluster; afterwards etcd, the API server and the gate run and answer again."""
    try:
        yield _faults
    finally:
        _faults.recover()


# --- clients that live through faults, and the wrong-ALLOW check ---------------------------------------------

def _answer(status: int, message: str) -> httpx.Response:
    return httpx.Response(status, json={"kind": "Status", "message": message})


class Resilient:
    """The admin client as a retrying deleter or a controller uses it through a fault: no answer is
    status 599, an unanswerable existence check says "still there" (try again later).

    `must_be_gone`: REST path -> paths that must be gone whenever a DELETE of that path is allowed
    (200). Checked right after each such answer, with reads retried until the API server answers;
    anything found alive is a wrong ALLOW, kept in `wrong_allows`."""

    def __init__(self, client: Client, *, must_be_gone: dict[str, list[str]] | None = None) -> None:
        self.client = client
        self.must_be_gone = must_be_gone or {}
        self.wrong_allows: list[str] = []
        self.allowed: list[str] = []

    def delete(self, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.client.delete(path, **kwargs)
        except httpx.HTTPError as exc:
            return _answer(NO_ANSWER, f"no answer: {type(exc).__name__}: {exc}")
        if response.status_code >= 400:
            try:
                response.json()
            except ValueError:
                return _answer(response.status_code, response.text[:300])
        if response.status_code == 200 and path in self.must_be_gone:
            self.allowed.append(path)
            alive = [p for p in self.must_be_gone[path] if self._surely_exists(p)]
            if alive:
                self.wrong_allows.append(f"DELETE {path} allowed while {alive} still existed")
        return response

    def _surely_exists(self, path: str) -> bool:
        deadline = time.monotonic() + 60
        while True:
            try:
                return self.client.exists(path)
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def exists(self, path: str) -> bool:
        try:
            return self.client.exists(path)
        except httpx.HTTPError:
            return True

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.client.get(path)
        except httpx.HTTPError:
            return None

    def json_patch(self, path: str, patch: list[dict[str, Any]]) -> httpx.Response:
        try:
            return self.client.json_patch(path, patch)
        except httpx.HTTPError as exc:
            return _answer(NO_ANSWER, f"no answer: {type(exc).__name__}: {exc}")

    def create(self, path: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return self.client.create(path, body)
        except httpx.HTTPError as exc:
            return _answer(NO_ANSWER, f"no answer: {type(exc).__name__}: {exc}")


def _must_be_gone(story: Story) -> dict[str, list[str]]:
    """For each provider-ish object of the story, what must be gone when its DELETE is allowed: the
    objects its CriticalService's criteria name (the custom resources and their CRD) - and for the
    CriticalService itself, its provider too. The namespace may be marked terminating while its
    provider Deployment still exists (the criteria are met; the namespace controller then deletes the
    Deployment, which the gate allows), so the Deployment is not on the namespace's list."""
    paths = story.paths()
    deployment = f"Deployment/{story.name('finalizer-deployment')}"
    criteria = [k for k in paths if k.startswith("CoolResource/")] + [f"CustomResourceDefinition/{story.crd_name}"]
    needs = {deployment: criteria, f"Namespace/{story.namespace}": criteria,
             f"CriticalService/{story.critical_service}": [*criteria, deployment]}
    return {paths[key]: [paths[k] for k in gone] for key, gone in needs.items()}


@attrs.define
class Teardown:
    story: Story
    deleter: RepeatingDeleter
    observer: Observer
    client: Resilient
    started: float  # monotonic
    seconds: float  # from the first DELETE to the last object gone
    fault: tuple[float, float]  # monotonic start and end of the fault

    def statuses(self, start: float = 0.0, end: float = float("inf")) -> dict[int, int]:
        return dict(sorted(Counter(a.status for a in self.deleter.attempts if start <= a.at <= end).items()))

    def during_fault(self) -> dict[int, int]:
        """The deleter's answers received while the fault lasted, by status."""
        return self.statuses(*self.fault)

    def after_fault(self) -> float:
        """Seconds from the end of the fault to the end of the teardown."""
        return self.started + self.seconds - self.fault[1]

    def longest_wait(self) -> float:
        """The longest time the deleter went without an answer (a request hanging through the fault)."""
        times = [self.started] + [a.at for a in self.deleter.attempts]
        return max(b - a for a, b in itertools.pairwise(times))

    def timeline(self) -> str:
        """When each kind of object was first seen gone, in seconds after the fault ended."""
        kinds: dict[str, float] = {}
        for key, at in self.observer.gone_at.items():
            kind = key.split("/")[0]
            kinds[kind] = max(kinds.get(kind, -1e9), at - self.fault[1])
        return ", ".join(f"{k} {t:+.1f}" for k, t in sorted(kinds.items(), key=lambda kv: kv[1]))


def teardown_during(cluster: RealCluster, story: Story, fault: Callable[[RepeatingDeleter], tuple[float, float]],
                    *, timeout: float = 150) -> Teardown:
    """Apply the story, then tear it down while `fault(deleter)` runs (it returns when the fault began
    and ended); assert the teardown finished, in the safe order, with no wrong ALLOW."""
    apply_story(cluster.kubectl, cluster.admin, story)
    client = Resilient(cluster.admin, must_be_gone=_must_be_gone(story))
    controller = FinalizerController(Resilient(cluster.admin), deployment_path=story.deployment_path,  # type: ignore[arg-type]
                                     crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
    observer = Observer(cluster.admin, story.paths())
    deleter = RepeatingDeleter(client, story.paths())  # type: ignore[arg-type]
    done: list[bool] = []
    worker = threading.Thread(target=lambda: done.append(deleter.run(timeout=timeout)), daemon=True,
                              name="retrying-deleter")
    controller.start()
    observer.start()
    started = time.monotonic()
    worker.start()
    try:
        window = fault(deleter)
        worker.join(timeout + 30)
        seconds = time.monotonic() - started
    finally:
        observer.stop()
        controller.stop()
    result = Teardown(story, deleter, observer, client, started, seconds, window)
    assert done == [True], f"the teardown did not finish; last answers: {deleter.attempts[-5:]}"
    assert client.wrong_allows == [], client.wrong_allows
    assert observer.order_violations(story.dependents()) == []
    assert deleter.refused(), "the gate never held anything back"
    return result


def _first_refusal(deleter: RepeatingDeleter) -> None:
    wait_for(lambda: any(a.status == 403 for a in deleter.attempts), timeout=60,
             what="the first refusal (the teardown under way)", interval=0.05)


def _gate_events(gate: GateProcess, offset: int) -> list[dict[str, Any]]:
    """The gate's JSON log lines written after byte `offset`."""
    with gate.process.log_path.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    events = []
    for line in lines:
        with contextlib.suppress(ValueError):
            events.append(json.loads(line))
    return events


def _log_summary(events: list[dict[str, Any]]) -> dict[str, int]:
    """What the gate logged, by event (decisions by result), for the figures."""
    counts: Counter[str] = Counter()
    for e in events:
        event = str(e.get("event", ""))
        counts[f"decision {e.get('result')}" if event == "decision" else event] += 1
    return dict(counts.most_common())


def _unverified(events: list[dict[str, Any]]) -> list[str]:
    """The gate's decisions whose live confirmation failed (a fresh read not answered in time, as when
    etcd goes down between a DELETE's own read and the review), as "name: result"; each must be a denial."""
    found = [f"{e.get('resource')} {e.get('name')}: {e.get('result')} after {e.get('latency_ms')} ms"
             for e in events if e.get("event") == "decision" and e.get("live_confirmation") == "failed"]
    assert all(": denied after" in f for f in found), f"an ALLOW whose confirmation failed: {found}"
    return found


def _status_names(statuses: dict[int, int]) -> str:
    return ", ".join(f"{'no answer' if s == NO_ANSWER else s}: {n}" for s, n in statuses.items()) or "none"


# --- 1. kube-apiserver restarted -----------------------------------------------------------------------

def test_apiserver_restarted_mid_teardown_completes_in_order(faults: Faults) -> None:
    """kube-apiserver stopped (SIGTERM) and started again while the retrying deleter is at work: the
    DELETEs meanwhile get no answer, the gate's watches reconnect, and the teardown completes in the
    safe order with no wrong ALLOW."""
    plane = faults.plane
    log_offset = faults.gate.process.log_path.stat().st_size

    def restart(deleter: RepeatingDeleter) -> tuple[float, float]:
        _first_refusal(deleter)
        start = time.monotonic()
        plane.restart_apiserver()
        return start, time.monotonic()

    teardown = teardown_during(faults.cluster, Story.make("apirestart"), restart)
    start, end = teardown.fault
    events = _gate_events(faults.gate, log_offset)
    print(f"\napiserver restart: down+ready in {end - start:.1f} s; gone (s after ready): {teardown.timeline()}; "
          f"{len(teardown.deleter.attempts)} deletes, "
          f"statuses during the restart {{{_status_names(teardown.during_fault())}}}, "
          f"overall {{{_status_names(teardown.statuses())}}}; teardown {teardown.seconds:.1f} s "
          f"({teardown.after_fault():.1f} s after the API server was ready); "
          f"provider ALLOWs checked {len(teardown.client.allowed)}; unverified (denied) {_unverified(events)}; "
          f"gate log {_log_summary(events)}")
    assert faults.gate.ready()


# --- 2. etcd restarted ---------------------------------------------------------------------------------

def test_etcd_restarted_mid_teardown_completes_in_order(faults: Faults) -> None:
    """etcd stopped (SIGTERM), down 3 s, and started again on the same data directory while the API
    server keeps running. The DELETE in flight waits inside the API server (its etcd client retries)
    rather than failing: measured, the deleter got no answer at all during the restart and one request
    waited ~15 s. A review that reaches the gate just as etcd goes down (the DELETE's own read done)
    may find the gate's confirming read unanswerable: it is denied after 2 s ("could not verify"),
    never allowed. The API server reconnects by itself, and the teardown completes in the safe order
    with no wrong ALLOW. (etcd's own SIGTERM takes ~7 s here: it drains the API server's watch streams.)"""
    plane = faults.plane
    log_offset = faults.gate.process.log_path.stat().st_size
    apiserver_back: list[float] = []
    stopped: list[float] = []

    def restart(deleter: RepeatingDeleter) -> tuple[float, float]:
        _first_refusal(deleter)
        start = time.monotonic()
        plane.etcd.stop()  # restart_etcd's own stop then finds it stopped
        stopped.append(time.monotonic() - start)
        plane.restart_etcd(down=3.0)
        end = time.monotonic()
        plane.wait_apiserver_ready()
        apiserver_back.append(time.monotonic() - end)
        return start, end

    teardown = teardown_during(faults.cluster, Story.make("etcdrestart"), restart)
    start, end = teardown.fault
    events = _gate_events(faults.gate, log_offset)
    messages = {a.message[:120] for a in teardown.deleter.attempts if start <= a.at <= end and a.status != 403}
    print(f"\netcd restart: stopped in {stopped[0]:.1f} s, down 3 s, healthy again {end - start:.1f} s after the "
          f"SIGTERM, API server /readyz {apiserver_back[0]:.1f} s later; longest wait for an answer "
          f"{teardown.longest_wait():.1f} s; gone (s after etcd healthy): {teardown.timeline()}; "
          f"{len(teardown.deleter.attempts)} deletes, statuses during the restart "
          f"{{{_status_names(teardown.during_fault())}}}, overall {{{_status_names(teardown.statuses())}}}; "
          f"answers during: {sorted(messages)}; "
          f"teardown {teardown.seconds:.1f} s ({teardown.after_fault():.1f} s after etcd was back); "
          f"unverified (denied) {_unverified(events)}; gate log {_log_summary(events)}")
    assert faults.gate.ready()


# --- 3. kube-apiserver frozen (SIGSTOP) ---------------------------------------------------------------------

def test_apiserver_frozen_mid_teardown_recovers_in_order(faults: Faults) -> None:
    """kube-apiserver frozen with SIGSTOP for 8 s - longer than the gate's confirmation budget (2 s) and
    the webhook's timeout (5 s) - while the retrying deleter keeps sending, then SIGCONT.

    While it is frozen no new review reaches the gate (the API server is what calls it) and the
    deleter's DELETE waits on its open connection. A review already at the gate when the API server
    froze is still decided: from the cache if that suffices; if its ALLOW needed a confirming read
    (every namespace DELETE does), that read cannot be answered, and after 2 s the gate denies
    ("could not verify ... LiveReadTimeout") - never an ALLOW; by then the API server's own 5 s for the
    call are spent, so after SIGCONT it answers that DELETE 500 "failed calling webhook" (seen in some
    runs, depending on what was in flight). The gate's connections stay open, so its watch caches stay
    synced and its /readyz stays 200: it reports nothing but such a failed confirmation. After SIGCONT
    the same connections carry on, and the teardown completes in the safe order with no wrong ALLOW."""
    plane = faults.plane
    gate = faults.gate
    log = gate.process.log_path
    log_offset = log.stat().st_size
    readyz: Counter[int] = Counter()
    frozen_at: list[float] = []  # wall clock, as the gate's log

    def freeze(deleter: RepeatingDeleter) -> tuple[float, float]:
        _first_refusal(deleter)
        frozen_at.append(time.time())
        start = time.monotonic()
        plane.apiserver.signal(signal.SIGSTOP)
        try:
            while time.monotonic() - start < PAUSE:
                try:
                    readyz[httpx.get(f"{gate.ops_url}/readyz", timeout=2).status_code] += 1
                except httpx.HTTPError:
                    readyz[0] += 1
                time.sleep(0.5)
        finally:
            plane.apiserver.signal(signal.SIGCONT)
        frozen_at.append(time.time())
        return start, time.monotonic()

    teardown = teardown_during(faults.cluster, Story.make("apifrozen"), freeze)
    start, end = teardown.fault
    events = _gate_events(gate, log_offset)
    # Decisions logged while the API server was frozen: when each review arrived, and how it ended.
    decided_while_frozen = []
    for e in events:
        logged = _wall(e)
        if e.get("event") == "decision" and frozen_at[0] < logged < frozen_at[1]:
            arrived = logged - float(e.get("latency_ms", 0)) / 1000
            decided_while_frozen.append((arrived - frozen_at[0], logged - frozen_at[0], e))
    after = [a for a in teardown.deleter.attempts if a.at > end]
    first = f"{after[0].status} {after[0].at - end:.2f} s after SIGCONT" if after else "-"
    in_flight = [f"{e.get('resource')} {e.get('name')}: {e.get('result')} ({e.get('rule')}, "
                 f"confirmation {e.get('live_confirmation', '-')}) {logged:.2f} s into the freeze"
                 for _, logged, e in decided_while_frozen]
    print(f"\napiserver SIGSTOP {end - start:.1f} s: gate /readyz while frozen {dict(readyz)}; "
          f"answers while frozen {{{_status_names(teardown.during_fault())}}}; first answer after: {first}; "
          f"{len(teardown.deleter.attempts)} deletes, overall {{{_status_names(teardown.statuses())}}}; "
          f"teardown {teardown.seconds:.1f} s ({teardown.after_fault():.1f} s after SIGCONT); longest wait for an "
          f"answer {teardown.longest_wait():.1f} s; gone (s after SIGCONT): {teardown.timeline()}; "
          f"reviews in flight at the freeze, decided while frozen: {in_flight or 'none'}; "
          f"unverified (denied) {_unverified(events)}; gate log {_log_summary(events)}")
    assert teardown.statuses(start + SETTLE, end) == {}, "the API server answered while frozen?"
    for arrived, logged, e in decided_while_frozen:
        assert arrived < 0.1, f"a review reached the gate {arrived:.2f} s into the freeze: {e}"
        if logged > SETTLE:  # not a cache decision: the confirming read that could not be made
            assert e["result"] == "denied" and e.get("live_confirmation") == "failed", e
    assert set(readyz) == {200}, f"the gate's /readyz while the API server was frozen: {dict(readyz)}"
    assert gate.ready()


def _wall(event: dict[str, Any]) -> float:
    """A gate log line's time (UTC, ISO 8601) as a Unix time."""
    stamp = str(event.get("time", ""))
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else 0.0


# --- 3b. the confirming read cannot be made -----------------------------------------------------------------

def _cleanup_pair(admin: Client, ns: str, provider: str, user: str, service: str) -> None:
    admin.delete(user)
    wait_for(lambda: admin.delete(provider).status_code in (200, 404), timeout=60, what="the provider DELETE")
    wait_for(lambda: admin.delete(f"{CRITICAL_SERVICES}/{service}").status_code in (200, 404), timeout=60,
             what="the CriticalService DELETE")
    assert admin.delete(f"/api/v1/namespaces/{ns}").status_code == 200


def test_a_confirming_read_that_cannot_be_made_in_time_denies(faults: Faults) -> None:
    """The gate's view of the API server frozen (the proxy stops moving its bytes) while the API server
    still calls the webhook.

    What the gate does (criticalsvc/live.py, server.py): a DELETE its watch caches would ALLOW, of
    something a CriticalService protects, is decided again on fresh reads (GET/LIST without
    resourceVersion). The live reader's budget for the whole confirmation is 2 s (live.CONFIRM_TIMEOUT);
    the webhook bounds the callback at 4 s (server.DEFAULT_CONFIRM_TIMEOUT); the API server waits 5 s
    (the webhook's timeoutSeconds). A read that is not answered within the budget becomes
    LiveReadTimeout: the webhook logs "live confirmation failed", counts
    criticalsvc_live_confirmation_failures_total{reason="timeout"} and answers 403 ("could not verify
    the cluster state with a fresh read from the API server ...; retry shortly") - it denies, it never
    falls back to the cache's ALLOW.

    Provoked twice here while the gate's view is frozen: (a) the protection restored behind the gate's
    back (`user` recreated: the caches still say the criterion is met) - the DELETE of the provider must
    not be allowed; (b) the criterion really met again (`user` deleted) - still denied, as nothing can
    be verified. Both answered 403 within the API server's 5 s, the provider still there. After resume the
    caches catch up and the provider's DELETE is allowed."""
    admin, gate, proxy = faults.cluster.admin, faults.gate, faults.proxy
    ns, provider, user, service = protect_with_user(admin, "confirm")
    deployments = provider.rsplit("/", 1)[0]

    def dry_run() -> int:
        return admin.delete(provider, params={"dryRun": "All"}).status_code

    wait_for(lambda: dry_run() == 403, timeout=60, what="the gate to protect the provider")
    assert admin.delete(user).status_code == 200
    wait_for(lambda: dry_run() == 200, timeout=60, what="the gate to see the criterion met (confirmed ALLOW)")

    log_offset = gate.process.log_path.stat().st_size
    timeouts_before = gate.metric("criticalsvc_live_confirmation_failures_total", reason="timeout")
    answers: list[tuple[str, int, float, str]] = []
    proxy.pause()
    paused = time.monotonic()
    try:
        assert admin.create(deployments, deployment_manifest("user", ns, replicas=0)).status_code == 201
        for case in ("protection restored behind the gate's back", "criterion really met"):
            if case == "criterion really met":
                assert admin.delete(user).status_code == 200
            sent = time.monotonic()
            answer = admin.delete(provider)
            took = time.monotonic() - sent
            message = answer.json().get("message", "") if answer.status_code != 200 else ""
            answers.append((case, answer.status_code, took, message))
            assert answer.status_code != 200, f"{case}: the provider's DELETE was allowed with no fresh read"
            assert admin.exists(provider) and "deletionTimestamp" not in admin.get(provider)["metadata"]  # type: ignore[index]
        ready_while_paused = gate.ready()
    finally:
        proxy.resume()
        resumed = time.monotonic()
    events = _gate_events(gate, log_offset)
    failures = [e for e in events if e.get("event") == "live confirmation failed"]
    timeouts = gate.metric("criticalsvc_live_confirmation_failures_total", reason="timeout") - timeouts_before

    wait_for(lambda: dry_run() == 200, timeout=60, what="the gate to confirm an ALLOW again after resume")
    recovered = time.monotonic() - resumed
    for case, status, took, message in answers:
        print(f"\ngate view frozen, {case}: {status} in {took:.2f} s: {message[:260]}")
    print(f"gate view frozen {resumed - paused:.1f} s: live confirmation failures logged {len(failures)} "
          f"({sorted({str(e.get('error')) for e in failures})}), timeout metric +{timeouts:g}, /readyz while "
          f"frozen {'200' if ready_while_paused else 'not ready'}; "
          f"confirmed ALLOW again {recovered:.1f} s after resume")
    for case, status, took, message in answers:
        assert status == 403, f"{case}: {status} {message}"
        assert "could not verify the cluster state with a fresh read" in message, message
        assert took < 5.0, f"{case}: answered after {took:.1f} s (the API server waits 5 s)"
    assert len(failures) == 2 and timeouts == 2
    _cleanup_pair(admin, ns, provider, user, service)


def test_etcd_frozen_holds_a_delete_before_the_gate_is_asked(faults: Faults) -> None:
    """etcd frozen with SIGSTOP for 4 s: the API server's DELETE handler reads the object from etcd
    before admission (registry Store.Delete -> Storage.Get, an etcd read for resourceVersion ""), so a
    DELETE of a protected provider sent meanwhile waits there and no review reaches the gate; after
    SIGCONT it is admitted as usual and refused (403). So a frozen etcd cannot make the gate decide
    while its own fresh reads hang: that case needs the gate's view frozen instead (the test above)."""
    admin, gate, plane = faults.cluster.admin, faults.gate, faults.plane
    ns, provider, user, service = protect_with_user(admin, "etcdstop")
    wait_for(lambda: admin.delete(provider, params={"dryRun": "All"}).status_code == 403, timeout=60,
             what="the gate to protect the provider")
    log_offset = gate.process.log_path.stat().st_size
    answer: list[tuple[int, float, str]] = []
    second = Client(plane.admin_kubeconfig)

    def delete() -> None:
        sent = time.monotonic()
        try:
            response = second.delete(provider)
            answer.append((response.status_code, time.monotonic() - sent, response.text[:200]))
        except httpx.HTTPError as exc:
            answer.append((NO_ANSWER, time.monotonic() - sent, repr(exc)))

    plane.etcd.signal(signal.SIGSTOP)
    frozen = time.monotonic()
    worker = threading.Thread(target=delete, daemon=True)
    try:
        worker.start()
        time.sleep(4.0)
        reviews_while_frozen = [e for e in _gate_events(gate, log_offset)
                                if e.get("event") == "decision" and e.get("name") == "provider"]
        answered_while_frozen = list(answer)
    finally:
        plane.etcd.signal(signal.SIGCONT)
        thawed = time.monotonic()
    worker.join(40)
    second.close()
    status, took, _ = answer[0] if answer else (0, 0.0, "")
    print(f"\netcd SIGSTOP {thawed - frozen:.1f} s: provider DELETE answered while frozen: "
          f"{answered_while_frozen or 'no'}; gate reviews of it while frozen {len(reviews_while_frozen)}; "
          f"answer {status} {took:.1f} s after sending ({took - (thawed - frozen):.2f} s after SIGCONT)")
    assert answer and answer[0][0] == 403, answer
    assert answered_while_frozen == [] and reviews_while_frozen == []
    assert admin.exists(provider)
    _cleanup_pair(admin, ns, provider, user, service)


# --- 4. serving certificate rotated under load ---------------------------------------------------------------

def test_serving_certificate_rotated_under_load_fails_no_admission_call(faults: Faults) -> None:
    """`criticalsvc certs --out DIR --san 127.0.0.1` run again on the gate's certificate directory (it
    reuses the CA there, so the webhooks' caBundle stays valid, and writes a new key and certificate),
    twice, while DELETEs stream through the webhook: not one admission call fails, and each time the
    gate presents the new certificate (by serial number) on new handshakes within its reload interval
    (2 s polling)."""
    gate, installed = faults.gate, faults.cluster.gate
    cert_dir = installed.certs
    ca = cert_dir / "ca.crt"
    ca_before = ca.read_bytes()
    ns = unique("rotation")
    admin = faults.cluster.admin
    assert admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns}}).status_code == 201
    log_offset = gate.process.log_path.stat().st_size
    reloads_before = gate.metric("criticalsvc_certificate_reloads_total", result="ok")
    stream = DeleteStream(Resilient(admin), ns)
    took: list[float] = []
    serials: list[int] = [served_certificate(installed.port, ca).serial_number]
    stream.start()
    try:
        time.sleep(1.5)
        for _ in range(2):
            criticalsvc("certs", "--out", str(cert_dir), "--san", "127.0.0.1")
            rotated = (cert_dir / "tls.crt").stat().st_mtime  # the last file the command writes
            new = x509.load_pem_x509_certificate((cert_dir / "tls.crt").read_bytes()).serial_number
            assert new != serials[-1]
            wait_for(lambda new=new: served_certificate(installed.port, ca).serial_number == new,  # type: ignore[misc]
                     timeout=15, what="the gate to serve the new certificate", interval=0.1)
            took.append(time.time() - rotated)
            serials.append(new)
            time.sleep(1.5)
    finally:
        stream.stop()
    events = _gate_events(gate, log_offset)
    reloads = gate.metric("criticalsvc_certificate_reloads_total", result="ok") - reloads_before
    failed_reloads = [e for e in events if e.get("event", "").startswith("certificate reload failed")]
    total = sum(stream.statuses.values())
    print(f"\ncertificate rotation x2 under load: {total} deletes, statuses {_status_names(dict(stream.statuses))}; "
          f"new certificate served {', '.join(f'{t:.1f}' for t in took)} s after the files changed; serials "
          f"{[hex(s)[:14] for s in serials]}; reloads logged ok {reloads:g}, failed {len(failed_reloads)}")
    assert ca.read_bytes() == ca_before, "the CA changed (the caBundle would be stale)"
    assert total > 20, "the stream barely ran"
    assert stream.failures == [], f"{len(stream.failures)} failed: {stream.failures[:3]}"
    # `criticalsvc certs` rewrites tls.key, then tls.crt: a check of the files between the two writes
    # sees a mismatched pair, logs "certificate reload failed; still serving the previous certificate"
    # and keeps the old one (by design); the next check loads the new pair. So only the successful
    # reloads are counted exactly.
    assert reloads == 2, f"{reloads:g} reloads; failed: {failed_reloads}"
    assert served_certificate(installed.port, ca).serial_number == serials[-1]
    assert admin.delete(f"/api/v1/namespaces/{ns}").status_code == 200
