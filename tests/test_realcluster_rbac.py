"""The gate's least-privilege RBAC meets a criterion over a type nobody granted it, on the real
control plane: the gate stays ready for everything else and refuses only what depends on that type,
saying which grant is missing; once the operator adds the aggregated reader role, it decides as usual."""

from __future__ import annotations

import httpx
import pytest

from tests.backends import RealBackend
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import RepeatingDeleter, Story, wait_for

pytestmark = pytest.mark.realcluster


def _denial(cluster: RealCluster, path: str) -> str:
    response = cluster.admin.delete(path, params={"dryRun": "All"})
    return str(response.json().get("message", "")) if response.status_code == 403 else f"HTTP {response.status_code}"


def test_a_type_the_gate_may_not_read_blocks_only_what_depends_on_it(realcluster: RealCluster) -> None:
    """No reader role for the CRs: the provider's DELETE names the missing grant; other deletes go on; the role
    fixes it."""
    story = Story.make("rbac")
    for _ in range(2):  # twice: the CRs need their CRD (no reader role applied on purpose)
        realcluster.kubectl("apply", "-f", "-", input=story.text)
        realcluster.kubectl("wait", "--for=condition=Established", f"crd/{story.crd_name}", "--timeout=60s")
    missing = f"the gate may not list coolresources.{story.group} (403 Forbidden)"
    wait_for(lambda: missing in _denial(realcluster, story.deployment_path), timeout=60,
             what="a denial naming the missing grant")
    assert 'ClusterRole labelled criticalsvc.io/aggregate-to-reader="true"' in _denial(realcluster,
                                                                                     story.deployment_path)
    # The rest of the cluster is not held hostage: the gate is ready and an unrelated namespace goes.
    gate = realcluster.gate.replicas[0]
    assert httpx.get(f"{gate.ops_url}/readyz", timeout=5).status_code == 200
    assert realcluster.kubectl("create", "namespace", "unrelated-rbac").returncode == 0
    deleted = realcluster.kubectl("delete", "namespace", "unrelated-rbac", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr

    assert realcluster.kubectl("apply", "-f", "-", input=story.reader_role()).returncode == 0
    wait_for(lambda: "objects still carry finalizer" in _denial(realcluster, story.deployment_path), timeout=90,
             what="the gate to read the CRs once the reader role is aggregated")

    deleter = RepeatingDeleter(realcluster.admin, story.paths())
    with RealBackend(realcluster).finalizer_controller(story):
        assert deleter.run(timeout=120), "the story did not come apart once the gate could read it"
