"""Two gate replicas behind a stand-in for their Service, on a real control plane: a replica killed,
the leader killed, and a rolling restart, each during deletions in progress (issue 13's first part).

The replicas run behind tests/realcluster/loadbalancer.py, which routes connections only to replicas
whose /readyz answers 200, as kube-proxy routes only to ready endpoints. What is counted is what
users see: DELETEs answered "failed calling webhook" (HTTP 500) and any wrong ALLOW.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.backends import DeleteStream
from tests.realcluster.cluster import RealCluster, built_binaries, real_cluster
from tests.realcluster.teardown import FinalizerController, Observer, RetryingDeleter, Story, apply_story, wait_for

pytestmark = pytest.mark.realcluster

LEASE = "/apis/coordination.k8s.io/v1/namespaces/criticalsvc-system/leases/criticalsvc-status"


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    binaries = built_binaries()
    with real_cluster(binaries, tmp_path_factory.mktemp("ha"), replicas=2) as cluster:
        yield cluster


def _holder(cluster: RealCluster) -> str:
    lease = cluster.admin.get(LEASE)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def _teardown_during(cluster: RealCluster, story: Story, fault: Any) -> tuple[RetryingDeleter, Observer]:
    apply_story(cluster.kubectl, cluster.admin, story)
    controller = FinalizerController(cluster.admin, deployment_path=story.deployment_path,
                                     crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
    observer = Observer(cluster.admin, story.paths())
    deleter = RetryingDeleter(cluster.admin, story.paths())
    done: list[bool] = []
    worker = threading.Thread(target=lambda: done.append(deleter.run(timeout=180)), daemon=True)
    controller.start()
    observer.start()
    worker.start()
    try:
        fault()
        worker.join(200)
    finally:
        observer.stop()
        controller.stop()
    assert done == [True], "the teardown did not finish"
    return deleter, observer


def test_leader_killed_mid_teardown_no_wrong_allow_and_a_new_leader_takes_over(ha: RealCluster) -> None:
    """kill -9 of the status-writing leader: the teardown completes in the safe order; the other replica
    leads within the lease."""
    wait_for(lambda: _holder(ha) != "", timeout=30, what="a leader")
    leader = _holder(ha)
    victim = next(g for g in ha.gate.replicas if g.process.name == leader)
    took: list[float] = []

    def kill_leader() -> None:
        time.sleep(0.5)  # let the first DELETE pass be refused
        victim.kill()
        killed = time.monotonic()
        wait_for(lambda: _holder(ha) not in ("", leader), timeout=60, what="a new leader", interval=0.2)
        took.append(time.monotonic() - killed)

    story = Story.make("leaderkill")
    deleter, observer = _teardown_during(ha, story, kill_leader)
    assert observer.order_violations(story.dependents()) == []
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

    def kill_follower() -> None:
        time.sleep(0.5)  # let the first DELETE pass be refused
        victim.kill()

    story = Story.make("followerkill")
    deleter, observer = _teardown_during(ha, story, kill_follower)
    assert observer.order_violations(story.dependents()) == []
    assert deleter.refused(), "the gate never held anything back"
    assert _holder(ha) == leader
    failed = [a for a in deleter.attempts if a.status >= 500]
    victim.start()
    print(f"\nnon-leader kill -9: {len(deleter.attempts)} DELETEs, {len(failed)} failed calls (in flight on the "
          f"killed replica; retried)")


def test_rolling_restart_fails_no_admission_call(ha: RealCluster) -> None:
    """SIGTERM one replica at a time, the next only once the restarted one is ready: no DELETE fails."""
    wait_for(lambda: all(g.ready() for g in ha.gate.replicas), timeout=60, what="both replicas ready")
    assert ha.kubectl("create", "namespace", "rolling").returncode == 0
    stream = DeleteStream(ha.admin, "rolling")
    stream.start()
    try:
        time.sleep(1)
        for gate in list(ha.gate.replicas):
            gate.stop()
            gate.start()
            wait_for(lambda: ha.gate.balancer is not None and len(ha.gate.balancer.ready_backends()) == 2,
                     timeout=60, what="the restarted replica back behind the Service")
        time.sleep(1)
    finally:
        stream.stop()
    total = sum(stream.statuses.values())
    print(f"\nrolling restart: {total} deletes, statuses {stream.statuses}")
    assert total > 20, "the stream barely ran"
    assert stream.failures == [], f"{len(stream.failures)} failed: {stream.failures[:3]}"
