"""Two gate replicas behind a stand-in for their Service, on a real HA control plane: a replica
killed, the leader killed, a rolling restart, and the serving certificate renewed on every replica,
each during deletions in progress (issue 13). The control plane runs three kube-apiservers over one
etcd behind a balancer (tests/realcluster/controlplane.py, issue 34), so the gate's watches, Lease
and writes, and the test's clients, are spread over API servers as on a production control plane.

The replicas run behind tests/realcluster/loadbalancer.py, which routes connections only to replicas
whose /readyz answers 200, as kube-proxy routes only to ready endpoints; each serves its certificate
from a Secret volume of its own (tests/realcluster/secretvolume.py). What is counted is what users
see: DELETEs answered "failed calling webhook" (HTTP 500) and any wrong ALLOW; and, for the rolling
restart and the renewal, what the API server counts of its calls to the gate's webhooks
(tests/realcluster/admission_metrics.py, summed over the three), which includes the calls no test
client made.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from test_realcluster_faults import Resilient, _must_be_gone

from tests.backends import DeleteStream, protect_with_user
from tests.realcluster import admission_metrics
from tests.realcluster.admission_metrics import AdmissionCalls
from tests.realcluster.cluster import RealCluster, built_binaries, real_cluster
from tests.realcluster.gate import SECRET_KEYS, criticalsvc
from tests.realcluster.secretvolume import project
from tests.realcluster.teardown import FinalizerController, Observer, RepeatingDeleter, Story, apply_story, wait_for

pytestmark = pytest.mark.realcluster

LEASE = "/apis/coordination.k8s.io/v1/namespaces/criticalsvc-system/leases/criticalsvc-status"
# A replica killed under a sequential deleter: calls fail only until the balancer's next health check.
MAX_FAILED_ON_KILL = 3
KILL_NOTICED_WITHIN = 2.0  # seconds after the kill: the 0.25 s check, its 1 s connect budget, slack
RELOADS = "criticalsvc_certificate_reloads_total"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    binaries = built_binaries()
    with real_cluster(binaries, tmp_path_factory.mktemp("ha"), replicas=2, apiservers=3) as cluster:
        yield cluster


def _holder(cluster: RealCluster) -> str:
    lease = cluster.admin.get(LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _teardown_during(cluster: RealCluster, story: Story,
                     fault: Callable[[RepeatingDeleter], None]) -> tuple[RepeatingDeleter, Observer]:
    """Tear the story down while `fault(deleter)` runs; assert it finished, in the safe order (the observer),
    and that every DELETE answered 200 found what it protects gone right then (as the fault tests do)."""
    apply_story(cluster.kubectl, cluster.admin, story)
    controller = FinalizerController(cluster.admin, deployment_path=story.deployment_path,
                                     crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
    observer = Observer(cluster.admin, story.paths())
    client = Resilient(cluster.admin, must_be_gone=_must_be_gone(story))
    deleter = RepeatingDeleter(client, story.paths())  # type: ignore[arg-type]
    done: list[bool] = []
    worker = threading.Thread(target=lambda: done.append(deleter.run(timeout=180)), daemon=True)
    controller.start()
    observer.start()
    worker.start()
    try:
        fault(deleter)
        worker.join(200)
    finally:
        observer.stop()
        controller.stop()
    assert done == [True], "the teardown did not finish"
    assert observer.order_violations(story.dependents()) == []
    assert client.wrong_allows == [], client.wrong_allows
    assert set(client.allowed) == set(_must_be_gone(story)), client.allowed  # each provider's 200 was checked
    return deleter, observer


def _first_refusal(deleter: RepeatingDeleter) -> None:
    """The teardown is under way: the gate has refused a DELETE (the fault then lands mid-teardown)."""
    wait_for(lambda: any(a.status == 403 for a in deleter.attempts), timeout=60,
             what="the first refusal (the teardown under way)", interval=0.05)


def test_leader_killed_mid_teardown_no_wrong_allow_and_a_new_leader_takes_over(ha: RealCluster) -> None:
    """kill -9 of the status-writing leader: the teardown completes in the safe order; the other replica
    leads within the lease."""
    wait_for(lambda: _holder(ha) != "", timeout=30, what="a leader")
    leader = _holder(ha)
    victim = next(g for g in ha.gate.replicas if g.process.name == leader)
    took: list[float] = []

    def kill_leader(deleter: RepeatingDeleter) -> None:
        _first_refusal(deleter)
        victim.kill()
        killed = time.monotonic()
        wait_for(lambda: _holder(ha) not in ("", leader), timeout=60, what="a new leader", interval=0.2)
        took.append(time.monotonic() - killed)

    story = Story.make("leaderkill")
    deleter, _observer = _teardown_during(ha, story, kill_leader)
    assert deleter.refused(), "the gate never held anything back"
    assert took and took[0] <= 15 + 2 + 5, f"takeover took {took}"  # lease 15 s + retry period 2 s + slack
    victim.start()  # back to two replicas for the next test
    # No flood of Events: repeats of one denial are one Event with a growing count, per writing leader
    # (the new leader's aggregation starts afresh), so at most two Events per denied object here.
    events = [e for e in (ha.admin.get("/api/v1/namespaces/default/events") or {}).get("items", [])
              if e["involvedObject"].get("name") == story.critical_service and e.get("reason") == "DeletionBlocked"]
    per_object = Counter(e["message"].split(" denied", 1)[0] for e in events)
    refusals = len(deleter.refused())
    print(f"\nleader takeover after kill -9: {took[0]:.1f} s; {refusals} refusals became {len(events)} Events "
          f"(counts {sorted(e.get('count', 1) for e in events)}) over {len(per_object)} objects")
    assert events and max(per_object.values()) <= 2, per_object


def test_a_non_leader_killed_mid_teardown_changes_nothing_for_the_teardown(ha: RealCluster) -> None:
    """kill -9 of the replica that does not lead: the teardown completes in the safe order, the leader
    keeps the Lease (status writing goes on undisturbed)."""
    wait_for(lambda: _holder(ha) != "" and all(g.ready() for g in ha.gate.replicas), timeout=60,
             what="a leader and both replicas ready")
    leader = _holder(ha)
    victim = next(g for g in ha.gate.replicas if g.process.name != leader)

    killed: list[float] = []

    def kill_follower(deleter: RepeatingDeleter) -> None:
        _first_refusal(deleter)
        victim.kill()
        killed.append(time.monotonic())

    story = Story.make("followerkill")
    deleter, _observer = _teardown_during(ha, story, kill_follower)
    assert deleter.refused(), "the gate never held anything back"
    assert _holder(ha) == leader
    failed = [a for a in deleter.attempts if a.status >= 500]
    victim.start()
    print(f"\nnon-leader kill -9: {len(deleter.attempts)} DELETEs, {len(failed)} failed calls (in flight on the "
          f"killed replica; retried): {[(round(a.at - killed[0], 2), a.status) for a in failed]}")
    # The deleter sends one request at a time, and the balancer stops routing to the dead replica at its next
    # health check (every 0.25 s): only the call in flight and those in that moment can fail.
    assert len(failed) <= MAX_FAILED_ON_KILL, [(a.key, a.status, a.message) for a in failed]
    assert all(a.at - killed[0] <= KILL_NOTICED_WITHIN for a in failed), [a.at - killed[0] for a in failed]


def _protected_provider(cluster: RealCluster) -> str:
    """The path of a Deployment a CriticalService protects (its user exists), once the gate refuses it."""
    _, provider, _, _ = protect_with_user(cluster.admin, "held")
    wait_for(lambda: _held(cluster, provider) == 403, timeout=30, what="the gate to protect the provider")
    return provider


def _held(cluster: RealCluster, provider: str) -> int:
    """A dry-run DELETE of the protected provider (reviewed like a real one, deletes nothing): its status."""
    return cluster.admin.delete(provider, params={"dryRun": "All"}).status_code


def _assert_no_failed_call(stream: DeleteStream, held: list[int], calls: AdmissionCalls) -> None:
    """Neither the client nor the API server saw a failed admission call; the protected provider was
    refused each time, and those refusals are the gate's only rejections the API server counted (403);
    its count of allowed calls covers the stream's DELETEs (the scrapes saw the load)."""
    assert sum(stream.statuses.values()) > 20, "the stream barely ran"
    assert stream.failures == [], f"{len(stream.failures)} failed: {stream.failures[:3]}; {calls}"
    assert calls.failed == 0 and calls.errors == {}, calls
    assert held and set(held) == {403}, held
    assert set(calls.denied) == {"403"} and calls.denied["403"] >= len(held), calls
    assert calls.by_code.get("200", 0) >= stream.statuses[200], calls


def test_rolling_restart_fails_no_admission_call(ha: RealCluster) -> None:
    """SIGTERM one replica at a time, the next only once the restarted one is ready: no DELETE fails, as
    the client sees it and as the API server counts its calls to the gate's webhooks."""
    wait_for(lambda: all(g.ready() for g in ha.gate.replicas), timeout=60, what="both replicas ready")
    assert ha.kubectl("create", "namespace", "rolling").returncode == 0
    stream = DeleteStream(ha.admin, "rolling")
    provider = _protected_provider(ha)
    held: list[int] = []
    before = admission_metrics.scrape(ha.plane)
    took: list[float] = []
    stream.start()
    try:
        time.sleep(1)
        for gate in list(ha.gate.replicas):
            started = time.monotonic()
            gate.stop()
            gate.start()
            wait_for(lambda: ha.gate.balancer is not None and len(ha.gate.balancer.ready_backends()) == 2,
                     timeout=60, what="the restarted replica back behind the Service")
            took.append(time.monotonic() - started)
            held.append(_held(ha, provider))
        time.sleep(1)
    finally:
        stream.stop()
    calls = AdmissionCalls.between(before, admission_metrics.settled(ha.plane))
    print(f"\nrolling restart ({', '.join(f'{t:.1f}' for t in took)} s per replica, SIGTERM to ready behind the "
          f"Service): {sum(stream.statuses.values())} deletes, statuses {dict(stream.statuses)}; {calls}")
    _assert_no_failed_call(stream, held, calls)


def test_serving_certificate_rotated_on_every_replica_under_load_fails_no_admission_call(
        ha: RealCluster, tmp_path: Path) -> None:
    """A renewed serving certificate (same CA, so the webhooks' caBundle still trusts it) reaches each
    replica's Secret volume in turn, as each node's kubelet updates its pod's copy, while DELETEs stream
    through the Service: no admission call fails (client and API server), each replica reloads once and
    then presents the new certificate, the one not yet updated meanwhile still presenting the old one."""
    wait_for(lambda: all(g.ready() for g in ha.gate.replicas), timeout=60, what="both replicas ready")
    replicas = list(ha.gate.replicas)
    ca = ha.gate.certs / "ca.crt"
    # What an operator does to renew: `criticalsvc certs` again on the directory holding the CA (it reuses
    # ca.crt and ca.key), then apply the Secret it wrote; here each replica's volume gets its keys.
    renewal = tmp_path / "renewal"
    renewal.mkdir()
    for name in ("ca.crt", "ca.key"):
        shutil.copy(ha.gate.certs / name, renewal / name)
    criticalsvc("certs", "--out", str(renewal), "--san", "127.0.0.1")
    assert (renewal / "ca.crt").read_bytes() == ca.read_bytes(), "the CA changed (the caBundle would be stale)"
    new = x509.load_pem_x509_certificate((renewal / "tls.crt").read_bytes())
    old = {g.process.name: g.served_certificate(ca) for g in replicas}
    assert new not in old.values()
    reloads_before = {g.process.name: (g.metric(RELOADS, result="ok"), g.metric(RELOADS, result="failed"))
                      for g in replicas}
    assert ha.kubectl("create", "namespace", "rotation").returncode == 0
    stream = DeleteStream(ha.admin, "rotation")
    provider = _protected_provider(ha)
    held: list[int] = []
    before = admission_metrics.scrape(ha.plane)
    took: dict[str, float] = {}
    stream.start()
    try:
        time.sleep(1)
        for i, gate in enumerate(replicas):
            project(gate.certs, {name: (renewal / name).read_bytes() for name in SECRET_KEYS})
            updated = time.monotonic()
            wait_for(lambda gate=gate: gate.served_certificate(ca) == new, timeout=15,  # type: ignore[misc]
                     what=f"{gate.process.name} to serve the new certificate", interval=0.1)
            took[gate.process.name] = time.monotonic() - updated
            for waiting in replicas[i + 1:]:  # its volume not updated yet: the API server meets both pairs
                assert waiting.served_certificate(ca) == old[waiting.process.name]
            held.append(_held(ha, provider))
            time.sleep(1)
    finally:
        stream.stop()
    calls = AdmissionCalls.between(before, admission_metrics.settled(ha.plane))
    reloads = {g.process.name: g.metric(RELOADS, result="ok") - reloads_before[g.process.name][0] for g in replicas}
    failed = {g.process.name: g.metric(RELOADS, result="failed") - reloads_before[g.process.name][1]
              for g in replicas}
    print(f"\ncertificate rotated on {len(replicas)} replicas under load: {sum(stream.statuses.values())} deletes, "
          f"statuses {dict(stream.statuses)}; {calls}; new certificate served "
          f"{', '.join(f'{n} {t:.1f} s' for n, t in took.items())} after its volume changed (serial "
          f"{hex(new.serial_number)[:14]}); reloads ok {reloads}, failed {failed}")
    _assert_no_failed_call(stream, held, calls)
    assert reloads == {g.process.name: 1 for g in replicas}, f"reloads ok {reloads}, failed {failed}"
    assert all(g.served_certificate(ca) == new for g in replicas)


def test_leader_killed_after_a_refused_pass_the_new_leader_replays(ha: RealCluster) -> None:
    """Replays follow the Lease: one `kubectl delete -f` pass with replay on, the leader killed (kill -9) as soon
    as the three refused deletions are recorded; the other replica takes the Lease, finds the intents and replays
    them - everything goes, in the safe order, the new leader counting the replays."""
    from tests.backends import RealBackend
    from tests.test_clusters_replay import intents, replay_granted, with_replay

    cluster = RealBackend(ha)
    wait_for(lambda: _holder(ha) != "" and all(g.ready() for g in ha.gate.replicas), timeout=60,
             what="a leader and both replicas ready")
    story = with_replay(Story.make("leaderreplay"))
    leader = _holder(ha)
    victim = next(g for g in ha.gate.replicas if g.process.name == leader)
    with replay_granted(cluster):
        apply_story(ha.kubectl, ha.admin, story)
        observer = Observer(ha.admin, story.paths())
        with cluster.finalizer_controller(story):
            observer.start()
            try:
                once = ha.kubectl("delete", "-f", "-", "--wait=false", input=story.text)
                assert once.returncode == 1, once
                wait_for(lambda: len([i for i in intents(cluster) if story.suffix in str(i.get("data"))]) == 3,
                         timeout=30, what="three intents recorded")
                victim.kill()
                wait_for(lambda: _holder(ha) not in ("", leader), timeout=60, what="a new leader", interval=0.2)
                wait_for(lambda: all(not ha.admin.exists(p) for p in story.paths().values()), timeout=120,
                         what="everything gone, replayed by the new leader")
            finally:
                observer.stop()
                victim.start()  # back to two replicas for the next test
    assert observer.order_violations(story.dependents()) == []
    new_leader = next(g for g in ha.gate.replicas if g.process.name == _holder(ha))
    assert new_leader.metric("criticalsvc_deletion_replays_total", outcome="Replayed") >= 1


def test_the_gate_is_served_by_every_api_server(ha: RealCluster) -> None:
    """Through the balancer the two replicas' connections (watches, Lease, reads and writes) reach each of the
    three API servers: every audit log records requests of the gate."""
    from tests.realcluster.controlplane import gate_requests

    assert len(ha.plane.audit_logs) == 3
    wait_for(lambda: all(gate_requests(log) for log in ha.plane.audit_logs), timeout=30,
             what=f"requests of the gate in each API server's audit log ({ha.plane.audit_logs})")
    print("\nthe gate's requests per API server: " + ", ".join(
        f"{i}: {len(gate_requests(log))}" for i, log in enumerate(ha.plane.audit_logs)))
