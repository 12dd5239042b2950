"""What the gate costs the API server, counted from the real kube-apiserver's audit log (every
request of the gate's ServiceAccount): no read for a denial, at most one round of confirming reads
for a protected ALLOW, and no watch restarted in normal operation.

A read is a GET or a LIST: a decision never opens a watch. The watches in the log belong to the
reflectors, and each re-opens its stream every 5-10 minutes when the server ends it (as client-go's
does), so on a control plane shared by many tests one of them can fall into any short window; whether
a watch had to *start over* is the gate's own count, criticalsvc_watch_restarts_total, which a clean
expiry does not move (criticalsvc/cache/reflector.py).

"Zero" and "at most" hold for an empty log too, so each count is taken only once the log is seen to
cover the window (a later request of the gate's is in it: the replicas read or renew their Lease every
2 s), and the teardown's log must hold what a confirmed ALLOW cannot do without: a fresh LIST of the
CriticalServices (criticalsvc/live.py) for each."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from tests.backends import RealBackend
from tests.realcluster.cluster import RealCluster
from tests.realcluster.controlplane import gate_requests
from tests.realcluster.teardown import RepeatingDeleter, Story, apply_story, wait_for

pytestmark = pytest.mark.realcluster

# What the status writer and leader election write or read: not on the decision path.
BOOKKEEPING = frozenset({"leases", "events", "criticalservices/status", "validatingwebhookconfigurations"})
# The watches every decision leans on (criticalsvc_watch_restarts_total's resource label, kubectl's spelling).
WATCHED = ("criticalservices.criticalsvc.io", "namespaces")


def _reads(requests: list[dict[str, str]]) -> Counter[str]:
    return Counter(f"{r['verb']} {r['resource'] or 'discovery'}" for r in requests
                   if r["verb"] in ("get", "list") and r["resource"] not in BOOKKEEPING)


def _settled(cluster: RealCluster, *, quiet: float = 1.0, timeout: float = 60) -> None:
    """Wait until the gate has read nothing for `quiet` seconds: the reflectors a new story starts (LIST,
    then WATCH) are not a decision's cost, and on a loaded machine they can come after the story is
    protected."""
    def quiet_window() -> bool:
        since = time.time()
        time.sleep(quiet)
        _captured_after(cluster, since + quiet)
        return not _reads(gate_requests(cluster.plane.audit_log, since=since))
    wait_for(quiet_window, timeout=timeout, what=f"the gate to read nothing for {quiet} s")


def _restarts(cluster: RealCluster, *resources: str) -> float:
    """criticalsvc_watch_restarts_total of `resources`, summed over the replicas."""
    return sum(gate.metric("criticalsvc_watch_restarts_total", resource=r)
               for gate in cluster.gate.replicas for r in resources)


def _captured_after(cluster: RealCluster, moment: float) -> None:
    """Wait until the audit log holds a request of the gate's received after `moment`: the requests before
    it (quick reads, answered in milliseconds) are written by then. Fails if the log stays empty."""
    wait_for(lambda: any(r["resource"] == "leases" for r in gate_requests(cluster.plane.audit_log, since=moment)),
             timeout=30, what=f"the audit log ({cluster.plane.audit_log}) to record the gate's Lease requests")


def _decisions(cluster: RealCluster, since: float) -> list[dict[str, object]]:
    out = []
    for gate in cluster.gate.replicas:
        for line in gate.process.log_path.read_text().splitlines():
            if '"event":"decision"' in line:
                entry = json.loads(line)
                if time.mktime(time.strptime(entry["time"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone >= since - 1:
                    out.append(entry)
    return out


def test_denials_cost_no_read_and_a_protected_allow_one_round(realcluster: RealCluster) -> None:
    """20 refused DELETEs: zero reads; the teardown's confirmed ALLOWs: at most one read round each; no watch
    restarts."""
    story = Story.make("load")
    apply_story(realcluster.kubectl, realcluster.admin, story)
    _settled(realcluster)
    start = time.time()
    for _ in range(20):
        assert realcluster.admin.delete(story.deployment_path).status_code == 403
    end = time.time()
    _captured_after(realcluster, end)
    during_denials = _reads(gate_requests(realcluster.plane.audit_log, since=start))
    assert sum(during_denials.values()) == 0, f"a denial made the gate read: {during_denials}"

    restarts_before = _restarts(realcluster, *WATCHED)
    teardown_start = time.time()
    deleter = RepeatingDeleter(realcluster.admin, story.paths())
    with RealBackend(realcluster).finalizer_controller(story):
        assert deleter.run(timeout=120)
    _captured_after(realcluster, time.time())
    requests = gate_requests(realcluster.plane.audit_log, since=teardown_start)
    reads = _reads(requests)
    confirmed = [d for d in _decisions(realcluster, teardown_start) if d.get("live_confirmation")]
    confirming_reads = sum(n for k, n in reads.items() if k.startswith(("get ", "list ")) and "discovery" not in k)
    print(f"\n{len(deleter.attempts)} DELETEs ({len(deleter.refused())} refused), {len(confirmed)} confirmed "
          f"ALLOWs, gate requests during the teardown: {dict(reads)}; all: "
          f"{dict(Counter(r['verb'] + ' ' + r['resource'] for r in requests))}")
    assert confirmed, "no protected ALLOW was confirmed"
    # Every confirmation lists the CriticalServices afresh: an audit log without them missed the teardown.
    assert reads["list criticalservices"] >= len(confirmed), (len(confirmed), reads)
    # A round reads the provider's CriticalServices' criteria: here 2 criteria, + the provider/namespace.
    assert confirming_reads <= 4 * len(confirmed), (confirming_reads, len(confirmed), reads)
    assert _restarts(realcluster, *WATCHED) == restarts_before, "a watch restarted in normal operation"
