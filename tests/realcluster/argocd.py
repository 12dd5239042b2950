"""Argo CD's application controller and repo-server, the real binary, beside the test control plane.

    argo = ArgoCD(plane, directory).install().start()       # CRDs, namespace, RBAC; redis, repo-server, controller
    repo = GitRepository(directory / "git").init()           # a bare repository served over file://
    revision = repo.commit({"stack.yaml": text}, "the stack")
    app = Application(admin, "stack", repo.url, finalizer=RESOURCES_FINALIZER)
    app.create(); app.wait_synced(revision)
    app.delete()                                             # the cascade: Argo CD deletes what it tracks

What runs, and how an Argo CD user runs it:
- Argo CD v3.2.3 (build.py builds its multi-call binary from the Go module proxy into the realcluster cache),
  as `argocd-application-controller` and `argocd-repo-server` (ARGOCD_BINARY_NAME, what argv[0] says in its
  images: https://github.com/argoproj/argo-cd/blob/v3.2.3/cmd/main.go), out of cluster, on loopback ports of
  our own, logs in the run's directory. Their cache is miniredis (build.py), the in-memory Redis Argo CD's
  own tests use; argocd-server, dex, the ApplicationSet and notifications controllers are not run (what
  `core-install.yaml` installs but for the UI/API server: nothing here needs them).
- What it is installed with is the release's own manifests/core-install.yaml, read from the Go module
  cache: the Application and AppProject CRDs, the controller's ServiceAccount, Role, ClusterRole (`*` on
  `*`) and bindings, and the argocd-cm, argocd-cmd-params-cm, argocd-rbac-cm, argocd-secret... ConfigMaps
  and Secret, in namespace `argocd`. Its Deployments, StatefulSet, Services and NetworkPolicies are not
  applied: the processes run here instead.
  https://github.com/argoproj/argo-cd/blob/v3.2.3/manifests/core-install.yaml
- The controller talks to the API server with a token of its own ServiceAccount,
  system:serviceaccount:argocd:argocd-application-controller (every request through the real RBAC
  authorizer, and the user the gate sees); the in-cluster destination https://kubernetes.default.svc is
  that same kubeconfig (ARGOCD_FAKE_IN_CLUSTER, Cluster.RawRestConfig:
  https://github.com/argoproj/argo-cd/blob/v3.2.3/pkg/apis/application/v1alpha1/types.go#L3624-L3640).
- The AppProject `default` is created here as argocd-server creates it on start (every source, every
  destination, every cluster-scoped kind).
- The source is a local bare Git repository over file://, as Argo CD's own e2e fixtures use
  (test/e2e/fixture: RepoURLTypeFile); the repo-server clones it with the git on PATH.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import yaml

from . import build
from .client import Client
from .controlplane import ControlPlane, ControlPlaneError, Process, free_port, poll, write_kubeconfig

MODULE_DIR = build.HERE / build.ARGOCD_MODULE
ARGOCD = "github.com/argoproj/argo-cd/v3"
NAMESPACE = "argocd"
SERVICE_ACCOUNT = "argocd-application-controller"
CONTROLLER_USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
GROUP = "argoproj.io"
APPLICATIONS = f"/apis/{GROUP}/v1alpha1/namespaces/{NAMESPACE}/applications"
# The Application's finalizers: with the first, deleting the Application deletes what it tracks in the
# foreground (DeleteOptions.propagationPolicy Foreground), with the second in the background
# (appv1.ForegroundPropagationPolicyFinalizer, BackgroundPropagationPolicyFinalizer):
# https://github.com/argoproj/argo-cd/blob/v3.2.3/pkg/apis/application/v1alpha1/application_defaults.go
RESOURCES_FINALIZER = "resources-finalizer.argocd.argoproj.io"
BACKGROUND_FINALIZER = f"{RESOURCES_FINALIZER}/background"
# Argo CD v3's default tracking: an annotation `<app>:<group>/<kind>:<namespace>/<name>` on every object it
# applies (common.AnnotationKeyAppInstance; the default `application.resourceTrackingMethod` is annotation
# since v3.0): https://github.com/argoproj/argo-cd/blob/v3.2.3/common/common.go#L201
TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
SYNC_WAVE_ANNOTATION = "argocd.argoproj.io/sync-wave"
IN_CLUSTER = "https://kubernetes.default.svc"
# What of core-install.yaml is applied: the kinds that are configuration, and only the application
# controller's and repo-server's share of the RBAC (the ApplicationSet controller and redis are not run).
INSTALLED_KINDS = ("CustomResourceDefinition", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
                   "ClusterRoleBinding", "ConfigMap", "Secret")
SKIPPED_NAMES = ("argocd-applicationset-controller", "argocd-redis", "applicationsets.argoproj.io")
READY_TIMEOUT = 90.0

JSON = dict[str, Any]


def argocd_dir() -> Path:
    """Argo CD's module in the Go module cache (the version argocd-3.2/go.mod requires, go.sum-checked)."""
    return Path(build.module_download(MODULE_DIR, ARGOCD)["Dir"])


def install_documents() -> list[JSON]:
    """The configuration part of the release's core-install.yaml (see INSTALLED_KINDS), in namespace argocd."""
    text = (argocd_dir() / "manifests" / "core-install.yaml").read_text(encoding="utf-8")
    docs = []
    for doc in yaml.safe_load_all(text):
        if not doc or doc["kind"] not in INSTALLED_KINDS or doc["metadata"]["name"] in SKIPPED_NAMES:
            continue
        if doc["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["namespace"] = NAMESPACE
        docs.append(doc)
    return docs


@attrs.define
class ArgoCD:
    """Argo CD installed (CRDs, namespace, configuration, RBAC) and its controller, repo-server and Redis running."""

    plane: ControlPlane
    directory: Path
    processes: list[Process] = attrs.field(factory=list)
    redis: str = ""
    repo_server: str = ""
    controller_health: str = ""

    def install(self) -> ArgoCD:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._kubectl("create", "namespace", NAMESPACE, ok_if="AlreadyExists")
        docs = install_documents()
        # Server-side: the Application CRD is larger than client-side apply's last-applied annotation allows.
        self._kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs))
        crds = [f"crd/{d['metadata']['name']}" for d in docs if d["kind"] == "CustomResourceDefinition"]
        self._kubectl("wait", "--for=condition=Established", *crds, "--timeout=60s")
        # The AppProject argocd-server would create on start (server.go, initializeDefaultProject).
        project = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "AppProject",
                   "metadata": {"name": "default", "namespace": NAMESPACE},
                   "spec": {"sourceRepos": ["*"], "destinations": [{"server": "*", "namespace": "*"}],
                            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]}}
        self._kubectl("apply", "-f", "-", input=yaml.safe_dump(project))
        # The key argocd-server generates on its first start (settings.go, InitializeSettings): without it the
        # controller refuses every cluster ("server.secretkey is missing").
        key = base64.b64encode(base64.b64encode(secrets.token_bytes(32))).decode()
        self._kubectl("patch", "secret", "argocd-secret", "-n", NAMESPACE, "--type=merge", "-p",
                      json.dumps({"data": {"server.secretkey": key}}))
        return self

    def start(self) -> ArgoCD:
        binaries = build.ensure_argocd()
        home = self.directory / "home"
        home.mkdir(exist_ok=True)
        tmp = self.directory / "tmp"
        tmp.mkdir(exist_ok=True)
        common = {"HOME": str(home), "TMPDIR": str(tmp)}
        # Redis first: both read and write their caches there.
        redis_port = free_port()
        self.redis = f"127.0.0.1:{redis_port}"
        redis = self._process("miniredis", [str(binaries.miniredis), f"--addr={self.redis}"], common)
        poll(lambda: "listening on" in redis.tail(5), timeout=READY_TIMEOUT, what="miniredis listening",
             alive=redis.check_alive)
        # The repo-server: plaintext gRPC on loopback (--disable-tls, and the controller's --repo-server-plaintext),
        # no GPG (its keyring needs gpg and a writable /app/config/gpg).
        repo_port, repo_metrics = free_port(), free_port()
        self.repo_server = f"127.0.0.1:{repo_port}"
        repo = self._process("argocd-repo-server", [
            str(binaries.argocd), "--address=127.0.0.1", f"--port={repo_port}", "--metrics-address=127.0.0.1",
            f"--metrics-port={repo_metrics}", "--disable-tls", f"--redis={self.redis}", "--loglevel=info",
            "--logformat=json"],
            {**common, "ARGOCD_BINARY_NAME": "argocd-repo-server", "ARGOCD_GPG_ENABLED": "false"})
        poll(lambda: _http_ok(f"http://127.0.0.1:{repo_metrics}/healthz?full=true"), timeout=READY_TIMEOUT,
             what="argocd-repo-server /healthz", alive=repo.check_alive)
        token = self._kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration", "48h")
        kubeconfig = write_kubeconfig(self.directory / "argocd-application-controller.kubeconfig",
                                      server=self.plane.url, ca_cert=self.plane.pki.ca_cert,
                                      name="argocd-application-controller", user={"token": token.strip()},
                                      namespace=NAMESPACE)
        metrics = free_port()
        self.controller_health = f"http://127.0.0.1:{metrics}/healthz"
        # One controller, no sharding (ARGOCD_CONTROLLER_REPLICAS unset: 1). --app-resync 180 is its default;
        # a test asks for a refresh (the refresh annotation, what `argocd app get --refresh` sets) instead.
        controller = self._process("argocd-application-controller", [
            str(binaries.argocd), f"--repo-server={self.repo_server}", "--repo-server-plaintext",
            f"--redis={self.redis}", f"--metrics-port={metrics}", "--status-processors=5",
            "--operation-processors=5", "--loglevel=info", "--logformat=json"],
            {**common, "ARGOCD_BINARY_NAME": "argocd-application-controller", "KUBECONFIG": str(kubeconfig),
             "ARGOCD_FAKE_IN_CLUSTER": "true"})
        poll(lambda: _http_ok(self.controller_health), timeout=READY_TIMEOUT,
             what="argocd-application-controller /healthz", alive=controller.check_alive)
        return self

    def _process(self, name: str, argv: list[str], env: dict[str, str]) -> Process:
        process = Process(name, argv, self.directory / f"{name}.log", env=env)
        process.start()
        self.processes.append(process)
        return process

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def log_entries(self, name: str = "argocd-application-controller") -> list[JSON]:
        """One process's JSON log lines, parsed (others skipped)."""
        entries = []
        for process in self.processes:
            if process.name != name or not process.log_path.exists():
                continue
            for line in process.log_path.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict):
                        entries.append(entry)
        return entries

    def logs(self, lines: int = 60) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.tail(lines)}" for p in self.processes)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def _kubectl(self, *args: str, input: str | None = None, ok_if: str = "") -> str:
        done = self.plane.kubectl(*args, input=input)
        if done.returncode != 0 and not (ok_if and ok_if in done.stderr):
            raise ControlPlaneError(f"kubectl {' '.join(args[:3])} failed: {done.stderr.strip()}")
        return str(done.stdout)


def _http_ok(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2) as response:
        return bool(response.status == 200)


@contextlib.contextmanager
def running(plane: ControlPlane, directory: Path) -> Iterator[ArgoCD]:
    """Argo CD installed and started; its processes stopped afterwards."""
    argo = ArgoCD(plane, directory)
    try:
        argo.install().start()
        yield argo
    finally:
        argo.stop()


@attrs.define
class GitRepository:
    """A bare repository (the remote Argo CD reads over file://) and a work tree that commits to it."""

    directory: Path

    @property
    def bare(self) -> Path:
        return self.directory / "remote.git"

    @property
    def work(self) -> Path:
        return self.directory / "work"

    @property
    def url(self) -> str:
        return self.bare.resolve().as_uri()

    def init(self) -> GitRepository:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._git("init", "--quiet", "--bare", "--initial-branch=main", str(self.bare), cwd=self.directory)
        self._git("init", "--quiet", "--initial-branch=main", str(self.work), cwd=self.directory)
        self._git("remote", "add", "origin", self.url)
        return self

    def commit(self, files: dict[str, str | None], message: str) -> str:
        """Write (text) or remove (None) `files`, commit and push to main; the new commit's sha."""
        for name, text in files.items():
            path = self.work / name
            if text is None:
                path.unlink(missing_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
        self._git("add", "--all", ".")
        self._git("commit", "--quiet", "--allow-empty", "-m", message)
        self._git("push", "--quiet", "origin", "main")
        return self._git("rev-parse", "HEAD").strip()

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        env = {**os.environ, "GIT_AUTHOR_NAME": "criticalsvc tests", "GIT_AUTHOR_EMAIL": "tests@criticalsvc.io",
               "GIT_COMMITTER_NAME": "criticalsvc tests", "GIT_COMMITTER_EMAIL": "tests@criticalsvc.io",
               "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
        done = subprocess.run(["git", *args], cwd=cwd or self.work, env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout


@attrs.define
class Application:
    """An Argo CD Application in namespace argocd: the directory `path` of `repo_url` at main, synced onto the
    in-cluster destination automatically (prune on, retried every few seconds while a step fails)."""

    admin: Client
    name: str
    repo_url: str
    path: str = "."
    finalizer: str | None = RESOURCES_FINALIZER

    @property
    def url(self) -> str:
        return f"{APPLICATIONS}/{self.name}"

    def manifest(self) -> JSON:
        metadata: JSON = {"name": self.name, "namespace": NAMESPACE}
        if self.finalizer:
            metadata["finalizers"] = [self.finalizer]
        return {"apiVersion": f"{GROUP}/v1alpha1", "kind": "Application", "metadata": metadata, "spec": {
            "project": "default",
            "source": {"repoURL": self.repo_url, "path": self.path, "targetRevision": "main"},
            "destination": {"server": IN_CLUSTER},
            # A failed sync (a refused prune) is retried with backoff: 1 s doubling to 5 s, without end.
            "syncPolicy": {"automated": {"prune": True},
                           "retry": {"limit": -1, "backoff": {"duration": "1s", "factor": 2, "maxDuration": "5s"}}},
        }}

    def create(self) -> None:
        _ok(self.admin.create(APPLICATIONS, self.manifest()))

    def get(self) -> JSON | None:
        return self.admin.get(self.url)

    def refresh(self) -> None:
        """Ask the controller to compare with Git now, the branch resolved again (what `argocd app get
        --hard-refresh` sets: a normal refresh may reuse the repo-server's cached revision of the branch)."""
        _ok(self.admin.merge_patch(self.url, {"metadata": {"annotations": {"argocd.argoproj.io/refresh": "hard"}}}))

    def synced(self, revision: str) -> bool:
        """Synced and Healthy-or-Progressing at `revision`, the last operation Succeeded there."""
        status = (self.get() or {}).get("status") or {}
        sync = status.get("sync") or {}
        operation = status.get("operationState") or {}
        return (sync.get("status") == "Synced" and sync.get("revision") == revision
                and operation.get("phase") == "Succeeded"
                and (operation.get("syncResult") or {}).get("revision") == revision)

    def conditions(self) -> list[JSON]:
        return list(((self.get() or {}).get("status") or {}).get("conditions") or [])

    def events(self) -> list[JSON]:
        """The Kubernetes Events the controller recorded on the Application (what `kubectl events` shows)."""
        found = self.admin.get(f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector="
                               f"involvedObject.kind%3DApplication,involvedObject.name%3D{self.name}") or {}
        return list(found.get("items") or [])

    def delete(self) -> None:
        response = self.admin.delete(self.url)
        assert response.status_code in (200, 202), response.text


def _ok(response: Any) -> JSON:
    if response.status_code >= 300:
        raise AssertionError(f"{response.request.method} {response.request.url}: {response.status_code} "
                             f"{response.text}")
    body: JSON = response.json()
    return body


@attrs.frozen
class Snapshot:
    """The Application as an Argo CD user sees it at one moment (`argocd app get`: conditions, sync, health,
    operation)."""

    at: float
    deleting: bool
    finalizers: tuple[str, ...]
    conditions: tuple[tuple[str, str], ...]  # (type, message)
    sync: str
    health: str
    phase: str  # status.operationState.phase
    operation_message: str


class ApplicationWatch(threading.Thread):
    """Polls an Application (every `interval`) and keeps each distinct state, until it is gone or stopped."""

    def __init__(self, app: Application, *, interval: float = 0.2) -> None:
        super().__init__(daemon=True, name=f"watch {app.name}")
        self.app, self.interval = app, interval
        self.snapshots: list[Snapshot] = []
        self.gone_at: float | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(Exception):
                found = self.app.get()
                if found is None:
                    self.gone_at = time.monotonic()
                    return
                status = found.get("status") or {}
                operation = status.get("operationState") or {}
                shot = Snapshot(time.monotonic(), bool(found["metadata"].get("deletionTimestamp")),
                                tuple(found["metadata"].get("finalizers") or ()),
                                tuple((str(c.get("type")), str(c.get("message"))) for c in status.get("conditions")
                                      or []),
                                str((status.get("sync") or {}).get("status", "")),
                                str((status.get("health") or {}).get("status", "")),
                                str(operation.get("phase", "")), str(operation.get("message", "")))
                last = self.snapshots[-1] if self.snapshots else None
                if last is None or attrs.evolve(last, at=shot.at) != shot:
                    self.snapshots.append(shot)
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
