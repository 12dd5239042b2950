"""The Open Cluster Management ManifestWork and AppliedManifestWork CRDs, from their Go module.

    ensure_crds() -> [Path, Path]   # the two CRD files in CACHE/ocm-api-v1.3.0/

The module `open-cluster-management.io/api` ships the CRDs the work agent serves under `work/v1/`.
`ocm-api-1.3/` beside this file pins it (go.mod, and go.sum, which `go` checks the download
against); `go mod download -json` in that directory, with `-mod=readonly`, fetches it into the Go
module cache and prints its `Dir`, and the two CRD files are copied from there into the realcluster
cache (CACHE as in build.py), once, under a file lock. Nothing from the module is kept in the
checkout. Nothing is compiled: the tests' ManifestWork agent (manifestwork.py) is Python.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import build

MODULE_DIR = build.HERE / "ocm-api-1.3"
MODULE = "open-cluster-management.io/api"
VERSION = "v1.3.0"
# work/v1/ of the module: the ManifestWork CRD (namespaced, on the hub) and the AppliedManifestWork
# CRD (cluster-scoped, on the managed cluster); the test control plane is both.
CRD_FILES = ("0000_00_work.open-cluster-management.io_manifestworks.crd.yaml",
             "0000_01_work.open-cluster-management.io_appliedmanifestworks.crd.yaml")


def crds_dir() -> Path:
    return build.cache_root() / f"ocm-api-{VERSION}"


def cached_crds() -> list[Path] | None:
    paths = [crds_dir() / name for name in CRD_FILES]
    return paths if all(p.is_file() for p in paths) else None


def ensure_crds(*, log: Any = None) -> list[Path]:
    """The two CRD files, downloaded and copied into the cache when missing (seconds)."""
    found = cached_crds()
    if found is not None:
        return found
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    build.cache_root().mkdir(parents=True, exist_ok=True)
    # A lock of its own, not build.py's: a Kubernetes build holds that one for minutes.
    with build._locked(build.cache_root() / ".ocm-api.lock"):
        if cached_crds() is None:
            if shutil.which("go") is None:
                raise RuntimeError(build.missing_toolchain())
            source = module_dir()
            staging = Path(tempfile.mkdtemp(prefix=".ocm-api-", dir=build.cache_root()))
            try:
                for name in CRD_FILES:
                    shutil.copyfile(source / "work" / "v1" / name, staging / name)
                if crds_dir().exists():
                    shutil.rmtree(crds_dir())
                staging.rename(crds_dir())
            finally:
                if staging.exists():
                    shutil.rmtree(staging, ignore_errors=True)
            say(f"copied the ManifestWork CRDs of {MODULE} {VERSION} into {crds_dir()}")
    found = cached_crds()
    assert found is not None, f"the ManifestWork CRDs are missing in {crds_dir()}"
    return found


def module_dir(module: Path = MODULE_DIR) -> Path:
    """The module's directory in the Go module cache, downloaded if needed and checked against go.sum."""
    info = build.module_download(module, MODULE)
    if info.get("Version") != VERSION:
        raise RuntimeError(f"{module}/go.mod requires {MODULE} {info.get('Version')}, not {VERSION}")
    return Path(info["Dir"])
