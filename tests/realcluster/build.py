"""Build the real control plane's binaries from the Go modules, once per version, outside the checkout.

    python -m tests.realcluster build [--kubernetes 1.37|1.34]   # prints the binaries' directory

Each Kubernetes minor has a Go module beside this file (`k8s-1.37/`, `k8s-1.34/`) that requires
`k8s.io/kubernetes` at one patch release and replaces every staging module by its matching tag; etcd
has its own (`etcd-3.6/`). `go build` turns them into kube-apiserver, kube-controller-manager,
kubectl and etcd under CACHE/<version>/, where CACHE is $CRITICALSVC_REALCLUSTER_CACHE or
~/.cache/criticalsvc/realcluster. A version whose four binaries are there is not built again; a
build writes into a temporary directory and renames it into place, so an interrupted build never
leaves a half-filled cache, and a file lock keeps two builds of one version (two test runs, nox and
pytest) from racing.

Measured on the project's 2-core machine, cold (empty Go module and build caches): about 30 s for
etcd and several minutes for the Kubernetes three; see README.md, "Tests on a real control plane".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent

# The default is the newest 1.3x release the Go module proxy serves; 1.34 is the first minor with
# ordered namespace deletion (KEP-5080) enabled by default, kept selectable to catch version drift.
KUBERNETES_VERSIONS = {"1.37": "v1.37.2", "1.34": "v1.34.4"}
DEFAULT_KUBERNETES = "1.37"
ETCD_MODULE = "etcd-3.6"
ETCD_VERSION = "v3.6.16"
KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kubectl")
# -s -w: no symbol tables or DWARF; the binaries are a third smaller and never debugged here.
GO_BUILD_FLAGS = ("-ldflags=-s -w",)


@attrs.frozen
class Binaries:
    """The four executables of one control-plane version."""

    kubernetes_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path


def cache_root() -> Path:
    configured = os.environ.get("CRITICALSVC_REALCLUSTER_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "criticalsvc" / "realcluster"


def selected_minor() -> str:
    """The Kubernetes minor the tests run against: $CRITICALSVC_KUBERNETES, default 1.37."""
    minor = os.environ.get("CRITICALSVC_KUBERNETES", DEFAULT_KUBERNETES)
    if minor not in KUBERNETES_VERSIONS:
        raise SystemExit(f"CRITICALSVC_KUBERNETES={minor}: not one of {', '.join(KUBERNETES_VERSIONS)}")
    return minor


def missing_toolchain() -> str | None:
    """Why the real control plane cannot be built here (one line), or None when it can."""
    if shutil.which("go") is None:
        return "no Go toolchain (`go` is not on PATH): the real control plane is built from the Kubernetes Go modules"
    return None


def cached(minor: str) -> Binaries | None:
    """The binaries of `minor`, if all four are already built."""
    binaries = _layout(minor)
    paths = (binaries.etcd, binaries.kube_apiserver, binaries.kube_controller_manager, binaries.kubectl)
    return binaries if all(p.is_file() and os.access(p, os.X_OK) for p in paths) else None


def ensure_built(minor: str, *, log: Any = None) -> Binaries:
    """The binaries of `minor`, building what is missing (minutes, when the Go caches are cold)."""
    found = cached(minor)
    if found is not None:
        return found
    reason = missing_toolchain()
    if reason is not None:
        raise RuntimeError(reason)
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".build.lock"):
        version = KUBERNETES_VERSIONS[minor]
        etcd_dir = root / f"etcd-{ETCD_VERSION}"
        if not (etcd_dir / "etcd").is_file():
            _build(HERE / ETCD_MODULE, ["."], etcd_dir, say=say, what=f"etcd {ETCD_VERSION}", output="etcd")
        k8s_dir = root / f"kubernetes-{version}"
        if not all((k8s_dir / name).is_file() for name in KUBERNETES_COMMANDS):
            packages = [f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_COMMANDS]
            _build(HERE / f"k8s-{minor}", packages, k8s_dir, say=say, what=f"Kubernetes {version}")
    built = cached(minor)
    assert built is not None, f"the build of {minor} left binaries missing in {root}"
    return built


def _layout(minor: str) -> Binaries:
    root = cache_root()
    k8s_dir = root / f"kubernetes-{KUBERNETES_VERSIONS[minor]}"
    return Binaries(kubernetes_version=KUBERNETES_VERSIONS[minor], etcd=root / f"etcd-{ETCD_VERSION}" / "etcd",
                    kube_apiserver=k8s_dir / "kube-apiserver",
                    kube_controller_manager=k8s_dir / "kube-controller-manager", kubectl=k8s_dir / "kubectl")


def _build(module: Path, packages: list[str], target: Path, *, say: Any, what: str, output: str = "") -> None:
    """`go build` `packages` of `module` into `target`: each binary named after its package's last path
    element, or `output` for a single package (`go build -o DIR/ .` would name it after the module's
    directory, `etcd-3.6`)."""
    say(f"building {what} into {target} (a cold build takes minutes) ...")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # -mod=readonly: go.mod and go.sum are committed; a build never rewrites them.
        subprocess.run(["go", "build", "-mod=readonly", *GO_BUILD_FLAGS, "-o", f"{staging}/{output}", *packages],
                       cwd=module, check=True)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    say(f"built {what} in {time.monotonic() - started:.0f} s")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

