"""Build the real control plane's binaries, and helm, from the Go modules, once per version, outside the checkout.

    python -m tests.realcluster build [--kubernetes 1.37|1.34]   # prints the binaries' directory

Each Kubernetes minor has a Go module beside this file (`k8s-1.37/`, `k8s-1.34/`) that requires
`k8s.io/kubernetes` at one patch release and replaces every staging module by its matching tag; etcd
has its own (`etcd-3.6/`), kwok has its own (`kwok-0.8/`, the fake Node's kubelet), and so has helm
(`helm-3.22/`, for the chart tests, tests/test_helm.py), and so has Flux's kustomize-controller
(`flux-1.9/`, for tests/test_realcluster_flux.py), and so has Argo CD with miniredis (`argocd-3.2/`, for
tests/test_realcluster_argocd.py). `go build` turns them into kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, etcd, kwok, helm, kustomize-controller, argocd and miniredis under
CACHE/<name>-<version>/,
where CACHE is $CRITICALSVC_REALCLUSTER_CACHE or ~/.cache/criticalsvc/realcluster. The Kubernetes
binaries carry the release's version stamps (`_kubernetes_version_flags`), and their directory's name
carries the build recipe (KUBERNETES_RECIPE), so binaries of an older recipe are never reused. kwok's
stage files are read from its module's directory at build time and written beside the binary
(stages.yaml). A version whose binaries are there is not built again; a build writes into a
temporary directory and renames it into place, so an interrupted build never leaves a half-filled
cache, and a file lock keeps two builds of one version (two test runs, nox and pytest) from racing.

Measured on the project's 2-core machine, cold (empty Go module and build caches): about 30 s for
etcd, several minutes for the Kubernetes four, about 100 s for helm, and about 8.5 min wall for kwok on
a busy machine (~80 s of CPU), and 408 s wall (~250 s of CPU, its dependencies not yet in the Go
caches) for kustomize-controller on the same busy machine; see README.md, "Tests on a real control
plane".
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
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
KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# The recipe of the Kubernetes binaries, in their cache directory's name: a binary built by an older
# recipe (r1: unstamped, no kube-scheduler) is never reused. Bump it whenever the build changes what
# the binaries are.
KUBERNETES_RECIPE = "r2"
KWOK_MODULE = "kwok-0.8"
KWOK_VERSION = "v0.8.0"
# kwok's own stage files, as its module ships them (kustomize/stage/ in sigs.k8s.io/kwok): a Node
# becomes Ready and keeps its heartbeat; a Pod bound to it becomes Ready and Running, a Job's Pod then
# Succeeded, and a deleted Pod goes once the API server has set its deletionTimestamp.
# https://github.com/kubernetes-sigs/kwok/tree/v0.8.0/kustomize/stage
KWOK_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml", "pod/fast/pod-ready.yaml",
               "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
HELM_MODULE = "helm-3.22"
HELM_VERSION = "v3.22.0"
# Flux's kustomize-controller: the newest release Go 1.26 builds (v1.10.x needs Go 1.27, its go.mod says
# `go 1.27.0`: https://github.com/fluxcd/kustomize-controller/blob/v1.10.1/go.mod). Its CRD, and those of
# the source kinds it watches, are read from the Go module cache at run time (flux.py).
FLUX_MODULE = "flux-1.9"
FLUX_VERSION = "v1.9.6"
# Argo CD: one multi-call binary (github.com/argoproj/argo-cd/v3/cmd, run as argocd-application-controller
# or argocd-repo-server by ARGOCD_BINARY_NAME), and miniredis for its cache (argocd.py). v3.2.3 is the
# newest release whose gitops-engine is a module of its own, so the proxy serves all it needs.
ARGOCD_MODULE = "argocd-3.2"
ARGOCD_VERSION = "v3.2.3"
MINIREDIS_VERSION = "v2.35.0"
# -s -w: no symbol tables or DWARF; the binaries are a third smaller and never debugged here.
LINKER_FLAGS = ("-s", "-w")


@attrs.frozen
class Binaries:
    """The executables of one control-plane version, and kwok's stages (one YAML stream)."""

    kubernetes_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    kube_scheduler: Path
    kwok: Path
    kwok_stages: Path


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
    """The binaries of `minor`, if all of them are already built."""
    binaries = _layout(minor)
    paths = (binaries.etcd, binaries.kube_apiserver, binaries.kube_controller_manager, binaries.kubectl,
             binaries.kube_scheduler, binaries.kwok)
    complete = all(p.is_file() and os.access(p, os.X_OK) for p in paths) and binaries.kwok_stages.is_file()
    return binaries if complete else None


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
        k8s_dir = _kubernetes_dir(root, minor)
        if not all((k8s_dir / name).is_file() for name in KUBERNETES_COMMANDS):
            packages = [f"k8s.io/kubernetes/cmd/{name}" for name in KUBERNETES_COMMANDS]
            _build(HERE / f"k8s-{minor}", packages, k8s_dir, say=say, what=f"Kubernetes {version}",
                   ldflags=_kubernetes_version_flags(minor))
        _ensure_kwok(root, say)
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


def flux_path() -> Path:
    return cache_root() / f"kustomize-controller-{FLUX_VERSION}" / "kustomize-controller"


def cached_flux() -> Path | None:
    """Flux's kustomize-controller binary, if it is already built."""
    path = flux_path()
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_flux(*, log: Any = None) -> Path:
    """kustomize-controller, building it when missing (minutes, when the Go caches are cold). Its main
    package is the module's root; the `replace .../api => ./api` of its own go.mod does not apply to a
    dependency, so the api module it requires (same version) comes from the proxy."""
    found = cached_flux()
    if found is not None:
        return found
    with _building(log) as (_, say):
        if cached_flux() is None:
            _build(HERE / FLUX_MODULE, ["github.com/fluxcd/kustomize-controller"], flux_path().parent, say=say,
                   what=f"Flux kustomize-controller {FLUX_VERSION}", output="kustomize-controller")
    built = cached_flux()
    assert built is not None, f"the build of kustomize-controller left no binary at {flux_path()}"
    return built


@attrs.frozen
class ArgoCD:
    """Argo CD's multi-call binary and the Redis it caches in."""

    argocd: Path
    miniredis: Path


def _argocd_layout() -> ArgoCD:
    root = cache_root()
    return ArgoCD(argocd=root / f"argocd-{ARGOCD_VERSION}" / "argocd",
                  miniredis=root / f"miniredis-{MINIREDIS_VERSION}" / "miniredis")


def cached_argocd() -> ArgoCD | None:
    """Argo CD's binary and miniredis, if both are already built."""
    found = _argocd_layout()
    return found if all(p.is_file() and os.access(p, os.X_OK) for p in (found.argocd, found.miniredis)) else None


def ensure_argocd(*, log: Any = None) -> ArgoCD:
    """Argo CD and miniredis, building what is missing (Argo CD: 10+ minutes when the Go caches are cold,
    its dependency graph is the largest here). Its version is stamped as its Makefile does
    (https://github.com/argoproj/argo-cd/blob/v3.2.3/Makefile, `-X ${PACKAGE}.version`), so its logs name
    the release rather than 99.99.99."""
    found = cached_argocd()
    if found is not None:
        return found
    layout = _argocd_layout()
    with _building(log) as (_, say):
        if not layout.argocd.is_file():
            _build(HERE / ARGOCD_MODULE, ["github.com/argoproj/argo-cd/v3/cmd"], layout.argocd.parent, say=say,
                   what=f"Argo CD {ARGOCD_VERSION}", output="argocd",
                   ldflags=(f"-X github.com/argoproj/argo-cd/v3/common.version={ARGOCD_VERSION.lstrip('v')}",))
        if not layout.miniredis.is_file():
            _build(HERE / ARGOCD_MODULE, ["./miniredis"], layout.miniredis.parent, say=say,
                   what=f"miniredis {MINIREDIS_VERSION}", output="miniredis")
    built = cached_argocd()
    assert built is not None, f"the build of Argo CD left binaries missing in {cache_root()}"
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


def _kubernetes_dir(root: Path, minor: str) -> Path:
    return root / f"kubernetes-{KUBERNETES_VERSIONS[minor]}-{KUBERNETES_RECIPE}"


def _layout(minor: str) -> Binaries:
    root = cache_root()
    k8s_dir = _kubernetes_dir(root, minor)
    kwok_dir = root / f"kwok-{KWOK_VERSION}"
    return Binaries(kubernetes_version=KUBERNETES_VERSIONS[minor], etcd=root / f"etcd-{ETCD_VERSION}" / "etcd",
                    kube_apiserver=k8s_dir / "kube-apiserver",
                    kube_controller_manager=k8s_dir / "kube-controller-manager", kubectl=k8s_dir / "kubectl",
                    kube_scheduler=k8s_dir / "kube-scheduler", kwok=kwok_dir / "kwok",
                    kwok_stages=kwok_dir / "stages.yaml")


def _kubernetes_version_flags(minor: str) -> tuple[str, ...]:
    """The version stamps of a release build, as upstream's `kube::version::ldflags` sets them on both
    k8s.io/component-base/version and k8s.io/client-go/pkg/version
    (https://github.com/kubernetes/kubernetes/blob/v1.37.2/hack/lib/version.sh#L151-L183). Unstamped, the
    binaries say `v0.0.0-master+$Format:%H$`, which kubectl cannot parse and Helm's `kubeVersion` check
    and every discovery client read as no release at all.

    The module proxy serves the release's source without its git commit, so gitCommit stays empty and
    gitTreeState is `archive`, what version.sh says of a tree exported without git (#L45-L48);
    buildDate is the release's own time from the proxy (`go mod download -json`'s .info), so two builds
    of one release are stamped alike, as SOURCE_DATE_EPOCH does upstream."""
    version = KUBERNETES_VERSIONS[minor]
    found = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", version)
    assert found is not None, f"{version}: not a release version"
    released = _release_time(HERE / f"k8s-{minor}", "k8s.io/kubernetes", version)
    stamps = {"gitVersion": version, "gitMajor": found.group(1), "gitMinor": found.group(2), "gitCommit": "",
              "gitTreeState": "archive", "buildDate": released}
    return tuple(f"-X {package}.{name}={value}" for package in ("k8s.io/component-base/version",
                                                                  "k8s.io/client-go/pkg/version")
                 for name, value in stamps.items())


def module_download(module_dir: Path, path: str, version: str | None = None) -> dict[str, Any]:
    """`go mod download -json PATH[@VERSION]` in `module_dir`: where the module's files are (Dir), its
    version and its .info file (Info). Without a version, the one `module_dir`'s go.mod requires, so the
    hash checked is go.sum's; -mod=readonly (through GOFLAGS: `go mod download` takes no -mod flag) never
    rewrites go.mod or go.sum. The one place the test and benchmark binaries' Go modules are fetched."""
    target = f"{path}@{version}" if version else path
    done = subprocess.run(["go", "mod", "download", "-json", target], cwd=module_dir,
                          env={**os.environ, "GOFLAGS": "-mod=readonly"}, capture_output=True, text=True, check=False)
    try:
        found: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        found = {}
    if done.returncode != 0 or "Error" in found or "Dir" not in found:
        raise RuntimeError(f"`go mod download -json {target}` in {module_dir} failed: "
                           f"{found.get('Error') or done.stderr.strip() or done.stdout.strip()}")
    return found


def _release_time(module_dir: Path, path: str, version: str) -> str:
    info = json.loads(Path(module_download(module_dir, path, version)["Info"]).read_text(encoding="utf-8"))
    stamp = datetime.datetime.fromisoformat(info["Time"].replace("Z", "+00:00")).astimezone(datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ensure_kwok(root: Path, say: Any) -> None:
    """kwok, and its stages read from the module's own files (never copied into the checkout)."""
    kwok_dir = root / f"kwok-{KWOK_VERSION}"
    if (kwok_dir / "kwok").is_file() and (kwok_dir / "stages.yaml").is_file():
        return
    module = HERE / KWOK_MODULE
    source = Path(module_download(module, "sigs.k8s.io/kwok", KWOK_VERSION)["Dir"]) / "kustomize" / "stage"
    stages = "---\n".join((source / name).read_text(encoding="utf-8") for name in KWOK_STAGES)
    _build(module, ["sigs.k8s.io/kwok/cmd/kwok"], kwok_dir, say=say, what=f"kwok {KWOK_VERSION}", output="kwok",
           extra={"stages.yaml": stages})


def _build(module: Path, packages: list[str], target: Path, *, say: Any, what: str, output: str = "",
           ldflags: tuple[str, ...] = (), extra: dict[str, str] | None = None) -> None:
    """`go build` `packages` of `module` into `target`: each binary named after its package's last path
    element, or `output` for a single package (`go build -o DIR/ .` would name it after the module's
    directory, `etcd-3.6`); `extra` files are written beside them, in the same rename."""
    say(f"building {what} into {target} (a cold build takes minutes) ...")
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        # -mod=readonly: go.mod and go.sum are committed; a build never rewrites them.
        linker = " ".join((*LINKER_FLAGS, *ldflags))
        subprocess.run(["go", "build", "-mod=readonly", f"-ldflags={linker}", "-o", f"{staging}/{output}", *packages],
                       cwd=module, check=True)
        for name, text in (extra or {}).items():
            (staging / name).write_text(text, encoding="utf-8")
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

