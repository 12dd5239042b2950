"""Teardown scenarios: random topologies, bundles, clients and interleavings, checked against an oracle.

For every generated scenario (tests/strategies_sim.py) the simulated cluster runs with the real gate,
and an oracle that knows the topology's intent — and reads the store's raw objects, not the gate's
indexes — checks at every store event:

* safety: an operator stops running (its Deployment becomes terminating or goes, or its namespace
  becomes terminating) only once everything its CriticalService waits for is gone;
* the CriticalService goes last: when its DELETE is admitted, its provider and everything its
  criteria cover are gone and the provider's namespace is not terminating (the gate's rule; with
  Foreground propagation the object itself leaves a moment later, when that namespace may have
  started terminating — the provider is gone by then, so nothing is left unprotected);

and after the run:

* liveness: with retrying clients and no cycle, the teardown completes within
  BOUND = last start + (4·depth + 3) · STEP, where depth is the longest chain of operators waiting for
  each other and 4·depth + 3 bounds the number of phases (per operator level: CRs, CRD, provider,
  namespace; then the CriticalServices, and ConfigMap owner chains). STEP = 1200 s is the most any
  actor waits after its blocker is gone: the garbage collector's and the CRD cleanup's 1000 s backoff
  cap plus the CRD cleanup's 60 s poll, a client's 60 s cap (kubectl's 30 s re-run), and the namespace
  controller's 5 s grace and 8 s requeue;
* cycles are refused when the CriticalServices are created, never found as a hang;
* negative control: without the gate, the generator finds teardowns that get stuck.

Scenario counts scale with the hypothesis profile (ci: ~600 per run; big: 50× that).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, find, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from strategies_sim import Topology, topologies

from criticalsvc.api import CRDS, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.errors import MalformedManifest
from criticalsvc.sim.cluster import Cluster, TeardownVerdict
from criticalsvc.sim.store import Store, WatchEvent

DEPLOYMENTS = GroupResource("apps", "deployments")
CRITICAL_SERVICES = GroupResource("criticalsvc.io", "criticalservices")
STEP = 1200.0


def scaled(n: int) -> int:
    """`n` examples in the ci profile (hypothesis' default of 100), proportionally more or fewer in others."""
    return max(1, n * settings().max_examples // 100)


class Oracle:
    """Watches every store event and checks the topology's intent against the store's raw objects."""

    def __init__(self, store: Store, topo: Topology) -> None:
        self.store, self.topo = store, topo
        self.violations: list[str] = []
        self.marked: set[ObjectRef] = set()
        store.subscribe(self.check)

    def _present(self, gr: GroupResource, namespace: str, name: str) -> bool:
        return self.store.exists(gr, namespace, name)

    def _carrying(self, group: str, plural: str, finalizer: str) -> list[str]:
        return [f"{o['metadata'].get('namespace')}/{o['metadata']['name']}"
                for o in self.store.list(GroupResource(group, plural))
                if finalizer in (o["metadata"].get("finalizers") or [])]

    def unmet(self, i: int) -> list[str]:
        op = self.topo.operators[i]
        carrying = self._carrying(op.group, op.plural, op.finalizer)
        out = [f"{op.plural} {k} still carries {op.finalizer}" for k in carrying]
        if self._present(CRDS, "", op.crd):
            out.append(f"CRD {op.crd} still exists")
        out += [f"operator {j}'s provider still exists" for j in op.waits_for
                if self._present(DEPLOYMENTS, f"op{j}-system", "controller")]
        return out

    def check(self, event: WatchEvent) -> None:
        md = event.object["metadata"]
        ref = ObjectRef(event.group_resource, md.get("namespace", "") or "", md["name"])
        going = event.type == "DELETED" or bool(md.get("deletionTimestamp"))
        if not going:
            return
        for op in self.topo.operators:
            provider = ObjectRef(DEPLOYMENTS, op.namespace, "controller")
            stops = ref == provider or (ref == ObjectRef(NAMESPACES, "", op.namespace)
                                        and self._present(DEPLOYMENTS, op.namespace, "controller"))
            if stops and (unmet := self.unmet(op.index)):
                self.violations.append(f"{ref} {event.type} while {op.service}'s criteria are unmet: {unmet}")
            if ref == ObjectRef(CRITICAL_SERVICES, "", op.service):
                left = self.unmet(op.index)
                if self._present(DEPLOYMENTS, op.namespace, "controller"):
                    left.append("its provider still exists")
                admitted = ref not in self.marked  # the moment the gate let its DELETE through
                self.marked.add(ref)
                ns = self.store.get(NAMESPACES, "", op.namespace)
                if admitted and ns is not None and ns["metadata"].get("deletionTimestamp"):
                    left.append("its provider's namespace is terminating")
                if left:
                    self.violations.append(f"CriticalService {op.service} {event.type} before its group: {left}")


def depth(topo: Topology) -> int:
    edges = {op.index: op.waits_for for op in topo.operators}

    def longest(n: int) -> int:
        return 1 + max((longest(m) for m in edges[n]), default=0)

    return max(longest(op.index) for op in topo.operators)


def bound(topo: Topology) -> float:
    return max(topo.starts) + (4 * depth(topo) + 3) * STEP


def start(cluster: Cluster, topo: Topology, k: int, *, delay: float = 0.0) -> None:
    client = topo.clients[k]
    cluster.teardown("kubectl" if client.startswith("kubectl") else client, bundles=[f"manifestwork/b{k}"],
                     repeat=30.0 if client == "kubectl-repeat" else None, delay=delay)


def run(topo: Topology, *, gate: bool = True) -> tuple[Cluster, TeardownVerdict, Oracle]:
    cluster = Cluster(gate=gate, seed=topo.seed)
    oracle = Oracle(cluster.store, topo)
    cluster.load(topo.manifests())
    for k, delay in enumerate(topo.starts):
        start(cluster, topo, k, delay=delay)
    return cluster, cluster.run(), oracle


def describe(cluster: Cluster, verdict: TeardownVerdict) -> str:
    return verdict.summary() + "".join(f"\n  {h.ref}: {'; '.join(h.reasons)}" for h in verdict.remaining)


@settings(max_examples=scaled(330), suppress_health_check=[HealthCheck.too_slow])
@given(topologies())
def test_teardowns_are_safe_live_and_end_with_the_critical_service(topo):
    """Any topology, bundling, clients and interleaving: safe at every event; completes in bound when clients retry."""
    cluster, verdict, oracle = run(topo)
    event(f"bundles: {len(topo.bundles)}; clients: {', '.join(sorted(set(topo.clients)))}")
    event("completed" if verdict.completed else "stuck")
    assert oracle.violations == []
    if topo.retrying:
        assert verdict.completed, describe(cluster, verdict)
        assert verdict.elapsed <= bound(topo)


@settings(max_examples=scaled(150), suppress_health_check=[HealthCheck.too_slow])
@given(topologies(cycles=True, clients=("manifestwork", "namespace")))
def test_cycles_are_refused_at_creation_never_found_as_a_hang(topo):
    """A CriticalService closing a waits-for cycle is refused when created; an acyclic spec tears down."""
    if topo.has_cycle():
        with pytest.raises(MalformedManifest, match="would close a dependency cycle"):
            Cluster(seed=topo.seed).load(topo.manifests())
        return
    cluster, verdict, oracle = run(topo)
    assert oracle.violations == []
    assert verdict.completed, describe(cluster, verdict)
    assert verdict.elapsed <= bound(topo)


def test_without_the_gate_the_generator_finds_stuck_teardowns():
    """Negative control: with the gate off some generated teardown gets stuck — and the gate completes that one."""
    stuck = find(topologies(clients=("manifestwork", "namespace")), lambda t: run(t, gate=False)[1].stuck,
                 settings=settings(max_examples=200, database=None, derandomize=True))
    _cluster, _verdict, oracle = run(stuck, gate=False)
    assert oracle.violations, "the oracle must see the unsafe order that got it stuck"
    cluster, verdict, oracle = run(stuck)
    assert oracle.violations == [] and verdict.completed, describe(cluster, verdict)


def test_without_the_gate_most_teardowns_with_finalizers_get_stuck():
    """Counted negative control: of 40 generated teardowns whose CRs carry finalizers, the gate-less most get stuck."""
    seen = stuck = 0

    @settings(max_examples=40, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(topologies(clients=("manifestwork",)).filter(lambda t: any(cr.finalizer for op in t.operators
                                                                      for cr in op.crs)))
    def count(topo):
        nonlocal seen, stuck
        seen += 1
        stuck += run(topo, gate=False)[1].stuck

    count()
    assert seen >= 20 and stuck >= seen // 2, (seen, stuck)


class TeardownMachine(RuleBasedStateMachine):
    """Bundles start deleting at moments the machine picks, with time passing in between."""

    @initialize(topo=topologies())
    def load(self, topo):
        self.topo = topo
        self.cluster = Cluster(seed=topo.seed)
        self.oracle = Oracle(self.cluster.store, topo)
        self.cluster.load(topo.manifests())
        self.started: list[int] = []

    @rule(pick=st.integers(0, 2))
    def start_a_bundle(self, pick):
        waiting = [k for k in range(len(self.topo.bundles)) if k not in self.started]
        if not waiting:
            return  # always enabled: a precondition here makes hypothesis discard many runs
        k = waiting[pick % len(waiting)]
        start(self.cluster, self.topo, k)
        self.started.append(k)

    @rule(seconds=st.sampled_from([0.001, 0.3, 1.0, 4.0, 9.0, 70.0]))
    def let_time_pass(self, seconds):
        self.cluster.advance(seconds)

    @invariant()
    def safe(self):
        assert self.oracle.violations == []

    def teardown(self):
        if not hasattr(self, "cluster"):
            return
        for k in range(len(self.topo.bundles)):
            if k not in self.started:
                start(self.cluster, self.topo, k)
        verdict = self.cluster.run()
        assert self.oracle.violations == []
        if self.topo.retrying:
            assert verdict.completed, describe(self.cluster, verdict)


TeardownMachine.TestCase.settings = settings(max_examples=scaled(60), stateful_step_count=8,
                                             suppress_health_check=[HealthCheck.too_slow])
test_teardown_machine = TeardownMachine.TestCase
