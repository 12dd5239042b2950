"""Replay of refused deletions on both clusters (the stand-in and the real control plane): the gate
records what it refuses as intents and re-issues those DELETEs itself when their time has come, so a
single `kubectl delete -f` of the reference story leaves nothing behind, in the safe order."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import yaml

from tests.backends import Backend, RealBackend
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import Observer, Story, all_gone, apply_story, replay_grant, wait_for

CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
INTENTS = "/api/v1/namespaces/criticalsvc-system/configmaps"
REPLAY_ROLE = replay_grant()


def with_replay(story: Story) -> Story:
    return attrs.evolve(story, text=story.text.replace("spec:\n  provider:",
                                                      "spec:\n  replayDeletion: WhenTearingDown\n  provider:"))


@contextlib.contextmanager
def replay_granted(cluster: Backend) -> Iterator[None]:
    """The operator's grant (api/examples/replay.yaml), for the test's duration."""
    done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(REPLAY_ROLE))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        cluster.kubectl("delete", "clusterrole", REPLAY_ROLE["metadata"]["name"], "--ignore-not-found")


def condition(cluster: Backend, name: str, type_: str) -> dict[str, Any]:
    status = (cluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def intents(cluster: Backend) -> list[dict[str, Any]]:
    page = cluster.admin.get(f"{INTENTS}?labelSelector=criticalsvc.io%2Fdeletion-intent%3Dtrue") or {}
    return list(page.get("items") or [])


def test_kubectl_delete_f_once_leaves_nothing_behind_with_replay(cluster: Backend) -> None:
    """One `kubectl delete -f` pass: the namespace, Deployment and CriticalService it is refused are replayed by the
    gate once the CRs and the CRD are gone - all of it goes, in the safe order, and status and Events say so."""
    story = with_replay(Story.make("replay"))
    with replay_granted(cluster):
        apply_story(cluster.kubectl, cluster.admin, story)
        if cluster.name == "real":  # the stand-in serves no SelfSubjectAccessReview: the condition stays Unknown
            wait_for(lambda: condition(cluster, story.critical_service, "ReplayPermitted").get("status") == "True",
                     timeout=60, what="ReplayPermitted=True once the grant is aggregated")
        # A dry run is never recorded (sideEffects: NoneOnDryRun).
        dry = cluster.kubectl("delete", "deployment", story.name("finalizer-deployment"), "-n", story.namespace,
                              "--dry-run=server")
        assert dry.returncode == 1 and "may not be deleted yet" in dry.stderr, dry
        observer = Observer(cluster.admin, story.paths())
        with cluster.finalizer_controller(story):
            observer.start()
            try:
                once = cluster.kubectl("delete", "-f", "-", "--wait=false", input=story.text)
                assert once.returncode == 1, once  # refusals are printed as before: kubectl does not know
                assert once.stderr.count("Error from server (Forbidden)") == 3, once.stderr
                wait_for(lambda: all_gone(cluster.admin, story.paths().values()), timeout=120,
                         what="everything gone after one kubectl pass")
            finally:
                observer.stop()
    assert observer.order_violations(story.dependents()) == []
    assert [i for i in intents(cluster) if story.suffix in str(i.get("data"))] == []  # replayed: none left

    def replayed() -> list[dict[str, Any]]:
        events = (cluster.admin.get("/api/v1/namespaces/default/events") or {}).get("items") or []
        return [e for e in events if e.get("reason") == "DeletionReplayed"
                and e["involvedObject"].get("name") == story.critical_service]

    wait_for(lambda: bool(replayed()), timeout=30,
             what=f"an Event on the CriticalService saying it was replayed; gate log:\n{cluster.gate_log()[-3000:]}")
    message = replayed()[0]["message"]
    assert "replayed the deletion" in message and "asked for at" in message, message


def test_without_replay_one_pass_still_leaves_the_refused_objects(cluster: Backend) -> None:
    """Replay off (the default): one pass leaves the provider, its namespace and the CriticalService, and no
    intent is recorded - behaviour as before."""
    story = Story.make("noreplay")
    apply_story(cluster.kubectl, cluster.admin, story)
    with cluster.finalizer_controller(story):
        once = cluster.kubectl("delete", "-f", "-", "--wait=false", input=story.text)
        assert once.returncode == 1, once
        wait_for(lambda: not cluster.admin.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                                  f"{story.crd_name}"), timeout=60, what="the CRD gone")
        assert cluster.admin.exists(story.deployment_path)
        assert cluster.admin.exists(f"{CRITICAL_SERVICES}/{story.critical_service}")
        assert [i for i in intents(cluster) if story.suffix in str(i.get("data"))] == []
        # Clean up the session's shared cluster as a user without replay does: run it until nothing is left.
        wait_for(lambda: cluster.kubectl("delete", "-f", "-", "--wait=false", "--ignore-not-found",
                                         input=story.text).returncode == 0, timeout=120, what="a run that exits 0",
                 interval=1.0)
        wait_for(lambda: all_gone(cluster.admin, story.paths().values()), timeout=60, what="the story cleaned up")


@pytest.mark.realcluster
def test_intents_survive_a_gate_restart(realcluster: RealCluster) -> None:
    """Intents are API objects, not memory: the gate is stopped right after the refused pass and started again
    once the CRs are gone; the new process finds the intents and replays them - nothing is left behind."""
    cluster = RealBackend(realcluster)
    story = with_replay(Story.make("restart"))
    try:
        with replay_granted(cluster):
            apply_story(cluster.kubectl, cluster.admin, story)
            wait_for(lambda: condition(cluster, story.critical_service, "ReplayPermitted").get("status") == "True",
                     timeout=60, what="ReplayPermitted=True")
            with cluster.finalizer_controller(story):
                once = cluster.kubectl("delete", "-f", "-", "--wait=false", input=story.text)
                assert once.returncode == 1, once
                wait_for(lambda: len([i for i in intents(cluster) if story.suffix in str(i.get("data"))]) == 3,
                         timeout=30, what="three intents recorded")
                realcluster.gate.stop()
                wait_for(lambda: not cluster.admin.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                                          f"{story.crd_name}"), timeout=90, what="the CRD gone")
                gate = realcluster.gate.restart()
                wait_for(lambda: all_gone(cluster.admin, story.paths().values()), timeout=120,
                         what="everything gone after the restart")
                assert gate.metric("criticalsvc_deletion_replays_total", outcome="Replayed") >= 3, gate.metrics()
    finally:
        if not realcluster.gate.replicas or any(r.process.popen is None or r.process.popen.poll() is not None
                                                for r in realcluster.gate.replicas):
            realcluster.gate.restart()
