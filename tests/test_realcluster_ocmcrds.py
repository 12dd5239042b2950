"""The ManifestWork CRDs come from the pinned `open-cluster-management.io/api` module, checked by go.sum."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.realcluster import build, ocmcrds

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="no Go toolchain (`go` is not on PATH)")


def test_the_cache_holds_the_two_work_crds_of_the_pinned_module() -> None:
    crds = [yaml.safe_load(p.read_text()) for p in ocmcrds.ensure_crds()]
    found = {(c["spec"]["names"]["kind"], c["spec"]["scope"]) for c in crds}
    assert found == {("ManifestWork", "Namespaced"), ("AppliedManifestWork", "Cluster")}
    assert all(c["spec"]["group"] == "work.open-cluster-management.io" for c in crds)
    assert str(build.cache_root()) in str(ocmcrds.crds_dir()) and ocmcrds.VERSION in ocmcrds.crds_dir().name


def test_a_module_whose_hash_differs_from_go_sum_is_refused(tmp_path: Path) -> None:
    """A tampered go.sum (or a changed module) stops the download with go's own words, one line up front."""
    module = tmp_path / "ocm-api"
    shutil.copytree(ocmcrds.MODULE_DIR, module)
    text = (module / "go.sum").read_text()
    (module / "go.sum").write_text(text.replace("h1:Q", "h1:X", 1))
    with pytest.raises(RuntimeError, match=r"go mod download -json open-cluster-management.io/api.*checksum mismatch"):
        ocmcrds.module_dir(module)
