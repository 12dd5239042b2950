"""The real control plane reports the Kubernetes release it is built from (issue 20, item 5).

Built from the Go modules without upstream's `-ldflags -X` version stamps, kube-apiserver said
`v0.0.0-master+$Format:%H$` and `kubectl version` failed on it ("could not parse pre-release/metadata");
tests/realcluster/build.py now stamps the pinned release on every binary.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.realcluster import build
from tests.realcluster.cluster import RealCluster

pytestmark = pytest.mark.realcluster


def _expected(cluster: RealCluster) -> dict[str, str]:
    version = cluster.plane.binaries.kubernetes_version
    found = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", version)
    assert found is not None
    return {"gitVersion": version, "major": found.group(1), "minor": found.group(2), "gitTreeState": "archive"}


def _release_fields(info: dict[str, str]) -> dict[str, str]:
    return {k: info[k] for k in ("gitVersion", "major", "minor", "gitTreeState")}


def test_kubectl_version_reports_the_pinned_release_for_client_and_server(realcluster: RealCluster) -> None:
    """`kubectl version -o json` succeeds and both halves name the release the binaries are built from."""
    done = realcluster.kubectl("version", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # no version-skew or parse warning
    info = json.loads(done.stdout)
    assert _release_fields(info["clientVersion"]) == _expected(realcluster)
    assert _release_fields(info["serverVersion"]) == _expected(realcluster)


def test_get_version_reports_the_pinned_release_and_its_date(realcluster: RealCluster) -> None:
    """GET /version, what discovery clients and Helm read: the release, and the release's date as buildDate
    (the same in every build of it), never the unstamped 1970-01-01."""
    info = realcluster.admin.get("/version")
    assert info is not None
    assert _release_fields(info) == _expected(realcluster)
    assert re.fullmatch(r"20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", info["buildDate"]), info["buildDate"]
    assert not info["buildDate"].startswith("1970"), info["buildDate"]


@pytest.mark.parametrize("command", ["kube-controller-manager", "kube-scheduler"])
def test_the_other_components_report_the_pinned_release(realcluster: RealCluster, command: str) -> None:
    """`--version` of the controller manager and the scheduler prints `Kubernetes vX.Y.Z`, as a release's does."""
    binaries = realcluster.plane.binaries
    path = {"kube-controller-manager": binaries.kube_controller_manager, "kube-scheduler": binaries.kube_scheduler}
    done = subprocess.run([str(path[command]), "--version"], capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"Kubernetes {build.KUBERNETES_VERSIONS[build.selected_minor()]}"
