"""The simulator's Argo CD client (criticalsvc/sim/clients.py ArgoCDApplication) against a description written
here by hand from Argo CD v3.2.3, not from the client's code
(https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1165-L1283, sort_delete.go):

- a pass sends nothing while any of the Application's objects has a deletionTimestamp;
- it never deletes a CRD, nor an object annotated `argocd.argoproj.io/sync-options: Delete=false`;
- it deletes only the highest sync wave left, all of it in the same pass;
- Foreground by default, Background with the `/background` finalizer;
- the Application goes once nothing it deletes is left: a stack whose criteria wait for the CRD never goes.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from criticalsvc.api import CRDS, GroupResource
from criticalsvc.manifests import load_path, load_text
from criticalsvc.sim.clients import ArgoCDApplication
from criticalsvc.sim.cluster import Cluster

STORY = "api/examples/reference-story.yaml"
DEPLOYMENTS = GroupResource("apps", "deployments")


def _argocd(cluster: Cluster, kind: str = "argocd") -> ArgoCDApplication:
    [client] = cluster.teardown(kind)
    assert isinstance(client, ArgoCDApplication)
    return client


def _deletes(cluster: Cluster) -> list[tuple[float, str, str, str]]:
    return [(e.time, e.ref.group_resource.resource, e.ref.name, e.outcome) for e in cluster.timeline
            if e.actor.startswith("argocd/") and e.verb == "DELETE" and e.ref is not None]


def _story(*, criteria: str = "reference", waves: bool = False) -> str:
    text = Path(STORY).read_text(encoding="utf-8")
    if criteria == "finalizer":
        text = text[:text.index("  - type: SpecificResource")]
    if waves:
        for name in ("alpha", "beta", "gamma"):
            text = text.replace(f"  name: {name}\n", f"  name: {name}\n  annotations: {{argocd.argoproj.io/sync-wave: "
                                                     f"'1'}}\n")
    return text


def test_the_reference_story_never_finishes_since_argo_cd_leaves_the_crd() -> None:
    """One pass deletes everything but the CRD at once (Foreground); the operator, its namespace and the
    CriticalService are refused; nothing is sent while the CRs terminate; then they are refused again, for
    ever: the CRD a criterion waits for is never deleted, and the Application stays."""
    cluster = Cluster(seed=0)
    cluster.load(load_path(STORY))
    client = _argocd(cluster)
    verdict = cluster.run()
    assert not verdict.completed
    deletes = _deletes(cluster)
    assert "customresourcedefinitions" not in {resource for _t, resource, _n, _o in deletes}
    first = [d for d in deletes if d[0] < client.passes[0] + 0.1]
    assert sorted(name for _t, _r, name, _o in first) == sorted(
        ["alpha", "beta", "gamma", "cool-apps", "finalizer-deployment", "finalizer-namespace",
         "for-finalizer-deployment"])
    assert {name for _t, _r, name, outcome in first if outcome == "denied"} == {
        "finalizer-deployment", "finalizer-namespace", "for-finalizer-deployment"}
    crs_gone = max(e.time for e in cluster.timeline if e.ref is not None and e.ref.name in ("alpha", "beta", "gamma")
                   and e.outcome == "gone")
    second = [d for d in deletes if d[0] > client.passes[0] + 0.1]
    assert second and min(t for t, *_ in second) >= crs_gone  # nothing while the CRs terminate
    assert {outcome for *_, outcome in second} == {"denied"}
    assert client.gone_at is None
    assert any("Argo CD does not delete CRDs when it deletes an Application" in e.reason
               for e in cluster.timeline.denials() if e.time > crs_gone)


@pytest.mark.parametrize(("kind", "foreground"), [("argocd", True), ("argocd-background", False)])
def test_the_finalizer_criterion_alone_finishes_and_leaves_the_crd(kind: str, foreground: bool) -> None:
    cluster = Cluster(seed=1)
    cluster.load(load_text(_story(criteria="finalizer"), "story.yaml"))
    client = _argocd(cluster, kind)
    cluster.run()
    assert client.gone_at is not None
    assert cluster.store.exists(CRDS, "", "coolresources.my.crd.group"), "Argo CD deleted the CRD"
    assert not cluster.store.exists(DEPLOYMENTS, "finalizer-namespace", "finalizer-deployment")
    marked = [e for e in cluster.timeline if e.actor.startswith("argocd/") and e.outcome == "marked"]
    assert marked and all(("foregroundDeletion" in e.reason) == foreground for e in marked), marked


def test_the_highest_wave_goes_first_and_alone() -> None:
    cluster = Cluster(seed=2)
    cluster.load(load_text(_story(criteria="finalizer", waves=True), "story.yaml"))
    client = _argocd(cluster)
    cluster.run()
    assert client.gone_at is not None
    deletes = _deletes(cluster)
    first = {name for t, _r, name, _o in deletes if t < client.passes[0] + 0.1}
    assert first == {"alpha", "beta", "gamma"}  # wave 1 only
    crs_gone = max(e.time for e in cluster.timeline if e.ref is not None and e.ref.name in ("alpha", "beta", "gamma")
                   and e.outcome == "gone")
    assert all(t >= crs_gone for t, _r, name, _o in deletes if name not in first)
    # With the CRs gone before the operator is asked, nothing of wave 0 is refused but the CriticalService,
    # which waits for its provider.
    assert {name for _t, _r, name, outcome in deletes if outcome == "denied"} <= {"for-finalizer-deployment"}


def test_delete_false_is_never_deleted() -> None:
    cluster = Cluster(seed=3)
    cluster.load(load_text(_story(criteria="finalizer") + textwrap.dedent("""\
        ---
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: kept
          namespace: default
          annotations: {argocd.argoproj.io/sync-options: "Prune=false,Delete=false"}
        """), "story.yaml"))
    client = _argocd(cluster)
    cluster.run()
    assert client.gone_at is not None
    assert "kept" not in {name for _t, _r, name, _o in _deletes(cluster)}


# The gate's decisions on the real application controller's DELETEs (Argo CD v3.2.3) deleting an Application
# holding the reference story with the Finalizer criterion alone, Foreground, replay off, in the gate's log order
# (tests/test_realcluster_argocd.py, the "Finalizer only, Foreground, replay off" case; seconds after the first
# DELETE): pass 1 refused the operator, its namespace and the CriticalService (sent at once: their order varies);
# once the CRs were gone the operator and its namespace went, the CriticalService was refused (twice: a pass from
# the controller's not yet updated cache) and went after the operator. The Application was gone 11.3-11.7 s after
# its DELETE in three runs.
REAL_DECISIONS = [
    (0.00, {("deployments", "denied"), ("namespaces", "denied"), ("criticalservices", "denied")}),
    (5.25, {("criticalservices", "denied"), ("namespaces", "allowed"), ("deployments", "allowed")}),
    (10.65, {("criticalservices", "allowed")}),
]
REAL_APPLICATION_GONE = (11.3, 11.7)
MARGIN = 1.5  # seconds: the real passes come on the controller's cache events, the simulated ones REACTION after


@pytest.mark.parametrize("seed", range(3))
def test_the_simulated_teardown_decides_as_the_real_controllers_passes_were_decided(seed: int) -> None:
    cluster = Cluster(seed=seed)
    cluster.load(load_text(_story(criteria="finalizer"), "story.yaml"))
    client = _argocd(cluster)
    cluster.run()
    ops = {"deployments", "namespaces", "criticalservices"}
    decided = [(e.time, e.ref.group_resource.resource, "denied" if e.outcome == "denied" else "allowed")
               for e in cluster.timeline if e.actor.startswith("argocd/") and e.verb == "DELETE" and e.ref is not None
               and e.ref.group_resource.resource in ops and e.ref.name != "cool-apps"]
    first = decided[0][0]
    passes: list[tuple[float, set[tuple[str, str]]]] = []
    for t, resource, outcome in decided:
        if not passes or t - first - passes[-1][0] > 0.5:
            passes.append((t - first, set()))
        passes[-1][1].add((resource, outcome))
    assert [p for _t, p in passes] == [p for _t, p in REAL_DECISIONS]
    for (t, _), (real, _) in zip(passes, REAL_DECISIONS, strict=True):
        assert abs(t - real) <= MARGIN, passes
    assert client.gone_at is not None
    assert min(REAL_APPLICATION_GONE) - MARGIN <= client.gone_at <= max(REAL_APPLICATION_GONE) + MARGIN
