"""The reference story torn down on a real control plane (kube-apiserver, kube-controller-manager,
etcd), through the gate installed as a user installs it: the safe order is enforced by the real
API server calling the gate, and the real namespace controller and garbage collector do their part."""

from __future__ import annotations

import pytest

from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import FinalizerController, Observer, RetryingDeleter, Story, apply_story

pytestmark = pytest.mark.realcluster


def test_reference_story_all_at_once_with_a_retrying_deleter(realcluster: RealCluster) -> None:
    """Everything deleted at once by a ManifestWork-style client: all of it goes, providers after their dependents."""
    story = Story.make("mw")
    apply_story(realcluster.kubectl, realcluster.admin, story)
    controller = FinalizerController(realcluster.admin, deployment_path=story.deployment_path,
                                     crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
    observer = Observer(realcluster.admin, story.paths())
    controller.start()
    observer.start()
    try:
        deleter = RetryingDeleter(realcluster.admin, story.paths())
        finished = deleter.run(timeout=180)
    finally:
        observer.stop()
        controller.stop()
    assert finished, f"teardown did not finish; still refused: {[a.message for a in deleter.refused()[-3:]]}"
    assert observer.order_violations(story.dependents()) == []
    refused = {a.key for a in deleter.refused()}
    assert f"Deployment/{story.name('finalizer-deployment')}" in refused, "the gate never held the provider back"
    assert sorted(controller.removed) == ["alpha", "beta", "gamma"], "the CRs were not finalized by their controller"
