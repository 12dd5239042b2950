"""Build the real control plane's binaries, and helm, from the Go modules, once per version, outside the checkout.

    python -m tests.realcluster build [--kubernetes 1.37|1.34]   # prints the binaries' directory

Each Kubernetes minor has a Go module beside this file (`k8s-1.37/`, `k8s-1.34/`) that requires
`k8s.io/kubernetes` at one patch release and replaces every staging module by its matching tag; etcd
has its own (`etcd-3.6/`), and so has helm (`helm-3.22/`, for the chart tests, tests/test_helm.py).
`go build` turns them into kube-apiserver, kube-controller-manager, kubectl, etcd and helm under
CACHE/<name>-<version>/, where CACHE is $CRITICALSVC_REALCLUSTER_CACHE or
~/.cache/criticalsvc/realcluster. A version whose binaries are there is not built again; a
build writes into a temporary directory and renames it into place, so an interrupted build never
leaves a half-filled cache, and a file lock keeps two builds of one version (two test runs, nox and
pytest) from racing.

Measured on the project's 2-core machine, cold (empty Go module and build caches): about 30 s for
etcd, several minutes for the Kubernetes three, and about 100 s for helm; see README.md, "Tests on a
real control plane".
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
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
HELM_MODULE = "helm-3.22"
HELM_VERSION = "v3.22.0"
# -s -w: no symbol tables or DWARF; the binaries are a third smaller and never debugged here.
LINKER_FLAGS = ("-s", "-w")


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
    """Why the real control plane and helm cannot be built here (one line), or None when they can."""
    if shutil.which("go") is None:
        return ("no Go toolchain (`go` is not on PATH): the real control plane and helm are built from their "
                "Go modules")
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
    with _building(log) as (root, say):
        version = KUBERNETES_VERSIONS[minor]
        etcd_dir = root / f"etcd-{ETCD_VERSION}"
        if not (etcd_dir / "etcd").is_file():
            _build(HERE / ETCD_MODULE, ["."], etcd_dir, say=say, what=f"etcd {ETCD_VERSION}", output="etcd")
        k8s_dir = root / f"kubernetes-{version}"
        if not all((k8s_dir / name).is_file() for name in KUBERNETES_COMMANDS):
            packages = [f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_COMMANDS]
            _build(HERE / f"k8s-{minor}", packages, k8s_dir, say=say, what=f"Kubernetes {version}")
    built = cached(minor)
    assert built is not None, f"the build of {minor} left binaries missing in {cache_root()}"
    return built


def helm_path() -> Path:
    return cache_root() / f"helm-{HELM_VERSION}" / "helm"


def cached_helm() -> Path | None:
    """The helm binary, if it is already built."""
    path = helm_path()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_helm(*, log: Any = None) -> Path:
    """The helm binary, building it when missing (minutes, when the Go caches are cold)."""
    found = cached_helm()
    if found is not None:
        return found
    with _building(log) as (_, say):
        if cached_helm() is None:
            _build(HERE / HELM_MODULE, ["helm.sh/helm/v3/cmd/helm"], helm_path().parent, say=say,
                   what=f"Helm {HELM_VERSION}", ldflags=_helm_version_flags())
    built = cached_helm()
    assert built is not None, f"the build of helm left no binary at {helm_path()}"
    return built


def _helm_version_flags() -> tuple[str, ...]:
    """What Helm's Makefile stamps in with -X: its own version, and the Kubernetes version that
    `helm template` and `helm lint` assume (`.Capabilities.KubeVersion`, the deprecated-API check)
    when they do not talk to a cluster. Unstamped, those read v3.22 and v1.20; the Kubernetes one is
    the minor of the client-go the module is built with, as `K8S_MODULES_VER` in
    https://github.com/helm/helm/blob/v3.22.0/Makefile."""
    go_mod = (HERE / HELM_MODULE / "go.mod").read_text(encoding="utf-8")
    found = re.search(r"^\s*k8s\.io/client-go v0\.(\d+)\.", go_mod, re.MULTILINE)
    assert found is not None, f"{HELM_MODULE}/go.mod requires no k8s.io/client-go"
    stamps = {"helm.sh/helm/v3/internal/version.version": HELM_VERSION}
    for package in ("helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"):
        stamps |= {f"{package}.k8sVersionMajor": "1", f"{package}.k8sVersionMinor": found.group(1)}
    return tuple(f"-X {name}={value}" for name, value in stamps.items())


@contextlib.contextmanager
def _building(log: Any) -> Iterator[tuple[Path, Any]]:
    """The cache directory, locked against other builds, and where to report progress."""
    reason = missing_toolchain()
    if reason is not None:
        raise RuntimeError(reason)
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".build.lock"):
        yield root, say


def _layout(minor: str) -> Binaries:
    root = cache_root()
    k8s_dir = root / f"kubernetes-{KUBERNETES_VERSIONS[minor]}"
    return Binaries(kubernetes_version=KUBERNETES_VERSIONS[minor], etcd=root / f"etcd-{ETCD_VERSION}" / "etcd",
                    kube_apiserver=k8s_dir / "kube-apiserver",
                    kube_controller_manager=k8s_dir / "kube-controller-manager", kubectl=k8s_dir / "kubectl")


def _build(module: Path, packages: list[str], target: Path, *, say: Any, what: str, output: str = "",
           ldflags: tuple[str, ...] = ()) -> None:
    """`go build` `packages` of `module` into `target`: each binary named after its package's last path
    element, or `output` for a single package (`go build -o DIR/ .` would name it after the module's
    directory, `etcd-3.6`)."""
    say(f"building {what} into {target} (a cold build takes minutes) ...")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # -mod=readonly: go.mod and go.sum are committed; a build never rewrites them.
        linker = " ".join((*LINKER_FLAGS, *ldflags))
        subprocess.run(["go", "build", "-mod=readonly", f"-ldflags={linker}", "-o", f"{staging}/{output}", *packages],
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

