"""The design's reference story, torn down all at once in the simulated cluster, for every client.

The design (design/criticalservice.md §4) promises this partial order: CRs and CRD marked -> CRs finalized -> CRD
finalized -> Deployment and namespace deleted -> both finalized -> CriticalService deleted last.
The tests assert those order relations on the store's own sequence numbers (resourceVersion), not a
transcript, over several seeds; and that without the gate the same bundle gets stuck because the
finalizer's controller goes before the CRs are finalized.
"""

from __future__ import annotations

import pytest

from criticalsvc.api import CRDS, CRITICAL_SERVICES, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.manifests import load_path
from criticalsvc.sim.cluster import Cluster

STORY = "api/examples/reference-story.yaml"
CRS = [ObjectRef(GroupResource("my.crd.group", "coolresources"), "cool-apps", n) for n in ("alpha", "beta", "gamma")]
CRD = ObjectRef(CRDS, "", "coolresources.my.crd.group")
DEPLOYMENT = ObjectRef(GroupResource("apps", "deployments"), "finalizer-namespace", "finalizer-deployment")
PROVIDER_NS = ObjectRef(NAMESPACES, "", "finalizer-namespace")
APPS_NS = ObjectRef(NAMESPACES, "", "cool-apps")
SERVICE = ObjectRef(CRITICAL_SERVICES, "", "for-finalizer-deployment")
ALL = [*CRS, CRD, DEPLOYMENT, PROVIDER_NS, APPS_NS, SERVICE]


def simulate(client: str, *, seed: int = 0, gate: bool = True) -> Cluster:
    cluster = Cluster(seed=seed, gate=gate)
    cluster.load(load_path(STORY))
    cluster.teardown(client, repeat=30.0 if client == "kubectl" else None)
    cluster.run()
    return cluster


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("client", ["manifestwork", "kubectl", "namespace"])
def test_reference_story_comes_apart_in_the_designs_order(client, seed):
    """Every client, several interleavings: the gate turns an all-at-once delete into the design's partial order."""
    cluster = simulate(client, seed=seed)
    assert cluster.verdict().completed
    marked = {r: cluster.marks[r].marked[1] for r in ALL}
    gone = {r: cluster.marks[r].gone[1] for r in ALL}
    # 1-2: the CRs and the CRD are marked before any CR is finalized.
    assert max(marked[r] for r in [*CRS, CRD]) < min(gone[r] for r in CRS)
    # 3-4: every CR is finalized before the CRD is.
    assert max(gone[r] for r in CRS) < gone[CRD]
    # 5-6: the Deployment and its namespace are deleted only after the CRD is gone.
    assert gone[CRD] < marked[DEPLOYMENT] and gone[CRD] < marked[PROVIDER_NS]
    # 7-8: the Deployment is gone before its namespace is.
    assert gone[DEPLOYMENT] < gone[PROVIDER_NS]
    # 9: the CriticalService is deleted after everything it protects, and is the last to go.
    assert marked[SERVICE] > max(gone[r] for r in ALL if r != SERVICE)


@pytest.mark.parametrize("client", ["manifestwork", "kubectl"])
def test_clients_that_delete_the_provider_directly_are_refused_first(client):
    """The ManifestWork agent and kubectl both try the Deployment at once and are refused with the gate's reason."""
    cluster = simulate(client)
    refusals = [e for e in cluster.timeline.of(DEPLOYMENT) if e.outcome == "denied" and e.actor != "garbage-collector"]
    assert refusals and refusals[0].time < 0.1
    assert "CriticalService for-finalizer-deployment protects it until" in refusals[0].reason
    assert "still carry finalizer my.crd.group/super-important" in refusals[0].reason


def test_namespace_client_leaves_the_deployment_to_the_namespace_controller():
    """Namespace client: the provider's namespace is refused first; the namespace controller deletes the Deployment."""
    cluster = simulate("namespace")
    mine = [e.outcome for e in cluster.timeline.of(PROVIDER_NS) if e.actor.startswith("namespace-cleanup")]
    assert mine[0] == "denied"
    (deleted,) = [e for e in cluster.timeline.of(DEPLOYMENT) if e.outcome == "deleted"]
    assert deleted.actor == "namespace-controller" and deleted.verb == "deletecollection"


def test_kubectl_without_repeat_stops_after_one_pass_and_says_what_would_help():
    """A single kubectl pass leaves the refused objects behind; the verdict says nothing retries them."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    cluster.teardown("kubectl")
    verdict = cluster.run()
    assert verdict.stuck
    held = {h.ref: h for h in verdict.remaining}
    assert set(held) == {DEPLOYMENT, PROVIDER_NS, SERVICE}
    assert any("the gate would allow it now" in r for r in held[DEPLOYMENT].reasons)
    assert held[SERVICE].blocked_by == ("for-finalizer-deployment",)
    assert "--repeat" in verdict.summary()


@pytest.mark.parametrize("seed", [0, 3])
def test_without_the_gate_the_story_gets_stuck_on_a_dead_finalizer_controller(seed):
    """--no-gate: the Deployment goes at once, its controller before the CRs are finalized: they stay forever."""
    cluster = simulate("manifestwork", seed=seed, gate=False)
    verdict = cluster.verdict()
    assert verdict.stuck
    assert {h.ref for h in verdict.remaining} == {*CRS, CRD, APPS_NS}
    first_attempt = min(e.seq for e in cluster.timeline.events
                        if e.verb.startswith("remove finalizer my.crd.group") and e.ref in CRS)
    assert cluster.marks[DEPLOYMENT].gone[1] < first_attempt
    for cr in CRS:
        (hold,) = [h for h in verdict.remaining if h.ref == cr]
        assert any("stays forever" in r and "finalizer-deployment" in r for r in hold.reasons)
    (crd,) = [h for h in verdict.remaining if h.ref == CRD]
    assert "waiting for its 3 instances" in crd.reasons[0]
    assert "taken down first" in verdict.summary()


def test_a_seed_replays_the_same_run():
    """The same seed gives the same timeline, event for event."""
    a, b = simulate("manifestwork", seed=5), simulate("manifestwork", seed=5)
    assert [e.to_dict() for e in a.timeline] == [e.to_dict() for e in b.timeline]
    assert [e.to_dict() for e in a.timeline] != [e.to_dict() for e in simulate("manifestwork", seed=6).timeline]
