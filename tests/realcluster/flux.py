"""Flux's kustomize-controller, the real binary, beside the test control plane, with a stand-in for its source.

    controller = KustomizeController(plane, directory).install().start()
    source = ArtifactServer().start()                       # loopback HTTP, serves artifact tarballs
    kustomization = FluxKustomization(admin, namespace, name, source)
    kustomization.publish({"objects.yaml": text})           # a new revision: tarball + GitRepository status
    kustomization.create(prune=True, deletion_policy="MirrorPrune")

What runs, and how a Flux user runs it:
- kustomize-controller v1.9.6 (build.py builds it from the Go module proxy into the realcluster cache), out of
  cluster, with the flags of its own Deployment (--watch-all-namespaces, RUNTIME_NAMESPACE; one replica,
  without leader election, which out of cluster has no namespace for its Lease) and a kubeconfig holding a
  token of its own ServiceAccount `flux-system/kustomize-controller`, so every request it makes goes through
  the real RBAC authorizer. The RBAC is the module's own config/rbac (manager-role, the leader-election Role,
  and cluster-reconciler binding cluster-admin: what `flux install` grants it too), read from the Go module
  cache with config/rbac's `namePrefix: kustomize-`; the Kustomization CRD is the module's config/crd.
  https://github.com/fluxcd/kustomize-controller/tree/v1.9.6/config
- The source. A Kustomization reads nothing of its source object but status.artifact (url, digest,
  revision): getSource and then fetch.Fetch(artifact.URL, artifact.Digest) in
  https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/internal/controller/kustomization_controller.go#L684-L770
  and #L362-L372. source-controller is not run: a GitRepository (the sourceRef kind of `flux bootstrap`)
  is created with the source-controller v1.9.0 CRDs and its status.artifact is written here, pointing at a
  tar.gz served by `ArtifactServer` on loopback, exactly as source-controller's storage serves it. A real
  GitRepository would need a git server and source-controller (another Go build of minutes); an
  OCIRepository a registry; a Bucket an S3 endpoint; ExternalArtifact is off by default (feature gate
  `ExternalArtifact: false`, internal/features/features.go#L100-L102). What kustomize-controller does from
  the artifact on (build, apply, inventory, prune, finalize) is the real binary's.
- The CRDs of the source kinds it watches (GitRepository, OCIRepository, Bucket; the version its
  config/default installs, source-controller v1.9.0) are read from that module in the Go module cache, its
  download checked against SOURCE_CONTROLLER_SUM (the sum.golang.org hash): `go mod tidy` would drop a
  go.mod requirement nothing imports.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.server
import io
import json
import tarfile
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

MODULE_DIR = build.HERE / build.FLUX_MODULE
KUSTOMIZE_CONTROLLER = "github.com/fluxcd/kustomize-controller"
SOURCE_CONTROLLER = "github.com/fluxcd/source-controller"
# The source-controller release kustomize-controller v1.9.6's config/default installs beside it
# (https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/config/default/kustomization.yaml), and its
# module's hash as `go mod download -json` prints it (Sum), the one sum.golang.org holds.
SOURCE_CONTROLLER_VERSION = "v1.9.0"
SOURCE_CONTROLLER_SUM = "h1:5msg2yyjVYDULZos+2ve8MZzcSqTpusiXmrOeBhc9yY="
SOURCE_CRDS = ("gitrepositories", "ocirepositories", "buckets")
FLUX_NAMESPACE = "flux-system"
SERVICE_ACCOUNT = "kustomize-controller"
GROUP = "kustomize.toolkit.fluxcd.io"
KUSTOMIZATIONS = f"/apis/{GROUP}/v1"
SOURCES = "/apis/source.toolkit.fluxcd.io/v1"
# kustomizev1.KustomizationFinalizer:
# https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/api/v1/kustomization_types.go#L29
FINALIZER = "finalizers.fluxcd.io"
# The owner labels kustomize-controller's apply writes on every object (ssa SetOwnerLabels, with the Group as
# prefix); finalize and prune delete only objects that carry them (deleteObjects' Inclusions,
# kustomization_controller.go#L1442-L1458).
OWNER_LABELS = (f"{GROUP}/name", f"{GROUP}/namespace")
READY_TIMEOUT = 60.0

JSON = dict[str, Any]


def _module_dir(path: str, version: str | None = None) -> Path:
    return Path(build.module_download(MODULE_DIR, path, version)["Dir"])


def kustomize_controller_dir() -> Path:
    """kustomize-controller's module in the Go module cache (the version flux-1.9/go.mod requires, go.sum-checked)."""
    return _module_dir(KUSTOMIZE_CONTROLLER)


def source_controller_dir() -> Path:
    info = build.module_download(MODULE_DIR, SOURCE_CONTROLLER, SOURCE_CONTROLLER_VERSION)
    if info.get("Sum") != SOURCE_CONTROLLER_SUM:
        raise RuntimeError(f"{SOURCE_CONTROLLER}@{SOURCE_CONTROLLER_VERSION}: hash {info.get('Sum')}, "
                           f"not {SOURCE_CONTROLLER_SUM}")
    return Path(info["Dir"])


def crd_texts() -> list[str]:
    """The Kustomization CRD and the source CRDs it watches, as their modules ship them."""
    kustomize = kustomize_controller_dir() / "config" / "crd" / "bases"
    source = source_controller_dir() / "config" / "crd" / "bases"
    return [(kustomize / f"{GROUP}_kustomizations.yaml").read_text(encoding="utf-8"),
            *((source / f"source.toolkit.fluxcd.io_{plural}.yaml").read_text(encoding="utf-8")
              for plural in SOURCE_CRDS)]


def rbac_documents(namespace: str = FLUX_NAMESPACE, service_account: str = SERVICE_ACCOUNT) -> list[JSON]:
    """kustomize-controller's config/rbac as its kustomization.yaml renders it (namePrefix `kustomize-`; every
    subject the controller's ServiceAccount), read from the module."""
    rbac = kustomize_controller_dir() / "config" / "rbac"
    listing = yaml.safe_load((rbac / "kustomization.yaml").read_text(encoding="utf-8"))
    prefix = listing.get("namePrefix", "")
    docs: list[JSON] = []
    for name in listing["resources"]:
        doc = yaml.safe_load((rbac / name).read_text(encoding="utf-8"))
        doc["metadata"]["name"] = prefix + doc["metadata"]["name"]
        if doc["kind"] in ("Role", "RoleBinding"):
            doc["metadata"]["namespace"] = namespace
        if "subjects" in doc:
            doc["subjects"] = [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}]
            if doc["roleRef"]["name"] != "cluster-admin":  # a role of the set, renamed with it
                doc["roleRef"]["name"] = prefix + doc["roleRef"]["name"]
        docs.append(doc)
    return docs


@attrs.define
class KustomizeController:
    """kustomize-controller installed (CRDs, namespace, ServiceAccount, RBAC) and running as its ServiceAccount."""

    plane: ControlPlane
    directory: Path
    process: Process | None = None
    health_url: str = ""

    def install(self) -> KustomizeController:
        self.directory.mkdir(parents=True, exist_ok=True)
        for text in crd_texts():
            self._kubectl("apply", "--server-side", "-f", "-", input=text)
        plurals = ["kustomizations.kustomize.toolkit.fluxcd.io",
                   *(f"{p}.source.toolkit.fluxcd.io" for p in SOURCE_CRDS)]
        self._kubectl("wait", "--for=condition=Established", *(f"crd/{p}" for p in plurals), "--timeout=60s")
        setup = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": FLUX_NAMESPACE}},
                 {"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": SERVICE_ACCOUNT, "namespace": FLUX_NAMESPACE}}, *rbac_documents()]
        self._kubectl("apply", "-f", "-", input=yaml.safe_dump_all(setup))
        return self

    def start(self) -> KustomizeController:
        binary = build.ensure_flux()
        token = self._kubectl("create", "token", SERVICE_ACCOUNT, "-n", FLUX_NAMESPACE, "--duration", "48h")
        kubeconfig = write_kubeconfig(self.directory / "kustomize-controller.kubeconfig", server=self.plane.url,
                                      ca_cert=self.plane.pki.ca_cert, name="kustomize-controller",
                                      user={"token": token.strip()})
        health = free_port()
        self.health_url = f"http://127.0.0.1:{health}"
        # The args of its Deployment (config/manager/deployment.yaml), with loopback ports of our own, but for
        # --enable-leader-election: out of cluster controller-runtime finds no namespace for the Lease ("not
        # running in-cluster, please specify LeaderElectionNamespace"), and main.go sets none. One replica, so
        # nothing to elect.
        self.process = Process("kustomize-controller", [
            str(binary), "--watch-all-namespaces", "--log-level=info", "--log-encoding=json",
            f"--metrics-addr=127.0.0.1:{free_port()}", f"--health-addr=127.0.0.1:{health}",
        ], self.directory / "kustomize-controller.log",
            # No --kubeconfig flag: controller-runtime's GetConfig reads $KUBECONFIG out of cluster.
            env={"RUNTIME_NAMESPACE": FLUX_NAMESPACE, "KUBECONFIG": str(kubeconfig)})
        self.process.start()
        poll(self._ready, timeout=READY_TIMEOUT, what="kustomize-controller /readyz", alive=self.process.check_alive)
        return self

    def _ready(self) -> bool:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.health_url}/readyz", timeout=2) as response:
            return bool(response.status == 200)

    def log_entries(self) -> list[JSON]:
        """The controller's JSON log lines, parsed (others skipped)."""
        if self.process is None or not self.process.log_path.exists():
            return []
        entries = []
        for line in self.process.log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict):
                    entries.append(entry)
        return entries

    def logs(self, lines: int = 60) -> str:
        return "" if self.process is None else f"--- kustomize-controller ---\n{self.process.tail(lines)}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def _kubectl(self, *args: str, input: str | None = None) -> str:
        done = self.plane.kubectl(*args, input=input)
        if done.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args[:3])} failed: {done.stderr.strip()}")
        return str(done.stdout)


def tarball(files: dict[str, str]) -> bytes:
    """A tar.gz of `files` (name -> text), as source-controller's storage archives a revision."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class ArtifactServer:
    """A loopback HTTP server for artifact tarballs (source-controller's storage server, for what it serves)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        files, requests = self.files, self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                requests.append(self.path)
                body = files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="artifact-server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ArtifactServer:
        self.thread.start()
        return self

    def put(self, path: str, body: bytes) -> str:
        self.files[path] = body
        return f"{self.url}{path}"

    def stop(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join(10)
        self.server.server_close()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define
class FluxKustomization:
    """A GitRepository (its artifact published here) and the Kustomization that applies it, in `namespace`."""

    admin: Client
    server: ArtifactServer
    namespace: str
    name: str
    revisions: int = 0

    @property
    def path(self) -> str:
        return f"{KUSTOMIZATIONS}/namespaces/{self.namespace}/kustomizations/{self.name}"

    @property
    def source_path(self) -> str:
        return f"{SOURCES}/namespaces/{self.namespace}/gitrepositories/{self.name}"

    def create_source(self) -> None:
        # spec.url is never fetched (no source-controller); it says where the manifests would come from.
        _ok(self.admin.create(f"{SOURCES}/namespaces/{self.namespace}/gitrepositories", {
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"url": f"https://git.example/{self.name}.git", "interval": "10m", "ref": {"branch": "main"}}}))

    def publish(self, files: dict[str, str]) -> str:
        """A new revision of the source: the tarball served, status.artifact written as source-controller
        writes it (url, digest sha256:<hex>, revision `main@sha1:<hex>`, size, lastUpdateTime); the revision."""
        self.revisions += 1
        body = tarball(files)
        digest = hashlib.sha256(body).hexdigest()
        commit = hashlib.sha1(body, usedforsecurity=False).hexdigest()
        path = f"/gitrepository/{self.namespace}/{self.name}/{commit}.tar.gz"
        url = self.server.put(path, body)
        revision = f"main@sha1:{commit}"
        now = _now()
        _ok(self.admin.merge_patch(f"{self.source_path}/status", {"status": {
            "observedGeneration": 1,
            "artifact": {"path": path.lstrip("/"), "url": url, "revision": revision, "digest": f"sha256:{digest}",
                         "size": len(body), "lastUpdateTime": now},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Succeeded", "lastTransitionTime": now,
                            "observedGeneration": 1, "message": f"stored artifact for revision '{revision}'"}]}}))
        return revision

    def create(self, *, prune: bool = True, deletion_policy: str | None = None, retry_interval: str = "2s",
               timeout: str = "60s", depends_on: tuple[str, ...] = ()) -> None:
        """The Kustomization of this source's root (spec.path ./; kustomize-controller generates its
        kustomization.yaml). retryInterval 2 s: a failed reconcile (a refused prune) is retried that soon."""
        spec: JSON = {"interval": "10m", "retryInterval": retry_interval, "timeout": timeout, "path": "./",
                      "prune": prune, "sourceRef": {"kind": "GitRepository", "name": self.name}}
        if deletion_policy is not None:
            spec["deletionPolicy"] = deletion_policy
        if depends_on:
            spec["dependsOn"] = [{"name": name} for name in depends_on]
        _ok(self.admin.create(f"{KUSTOMIZATIONS}/namespaces/{self.namespace}/kustomizations", {
            "apiVersion": f"{GROUP}/v1", "kind": "Kustomization",
            "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}))

    def create_from(self, spec: JSON) -> None:
        """A Kustomization with a user's `spec` (a documented one), reading this source's root instead of its
        own sourceRef and path."""
        spec = {**spec, "path": "./", "sourceRef": {"kind": "GitRepository", "name": self.name}}
        _ok(self.admin.create(f"{KUSTOMIZATIONS}/namespaces/{self.namespace}/kustomizations", {
            "apiVersion": f"{GROUP}/v1", "kind": "Kustomization",
            "metadata": {"name": self.name, "namespace": self.namespace}, "spec": spec}))

    def get(self) -> JSON | None:
        return self.admin.get(self.path)

    def ready(self, revision: str) -> bool:
        """Ready=True at `revision` (status.lastAppliedRevision), for the current generation."""
        found = self.get() or {}
        status = found.get("status") or {}
        return (status.get("lastAppliedRevision") == revision
                and status.get("observedGeneration") == found.get("metadata", {}).get("generation")
                and condition(found, "Ready").get("status") == "True")

    def inventory(self) -> list[str]:
        """status.inventory's entry ids (`<namespace>_<name>_<group>_<Kind>`)."""
        entries = (((self.get() or {}).get("status") or {}).get("inventory") or {}).get("entries") or []
        return [str(e["id"]) for e in entries]

    def events(self) -> list[JSON]:
        """The Kubernetes Events kustomize-controller recorded on the Kustomization (what `kubectl events` shows)."""
        found = self.admin.get(f"/api/v1/namespaces/{self.namespace}/events?fieldSelector="
                               f"involvedObject.kind%3DKustomization,involvedObject.name%3D{self.name}") or {}
        return list(found.get("items") or [])


def condition(obj: JSON, kind: str) -> JSON:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _ok(response: Any) -> JSON:
    if response.status_code >= 300:
        raise AssertionError(f"{response.request.method} {response.request.url}: {response.status_code} "
                             f"{response.text}")
    body: JSON = response.json()
    return body


@contextlib.contextmanager
def running(plane: ControlPlane, directory: Path) -> Iterator[tuple[KustomizeController, ArtifactServer]]:
    """kustomize-controller installed and started, and an artifact server; both stopped afterwards."""
    controller = KustomizeController(plane, directory)
    server = ArtifactServer()
    try:
        controller.install().start()
        server.start()
        yield controller, server
    finally:
        controller.stop()
        with contextlib.suppress(Exception):
            server.stop()


@attrs.frozen
class Snapshot:
    """The Kustomization as a Flux user sees it at one moment (`kubectl get kustomization -o yaml`)."""

    at: float
    deleting: bool
    finalizers: tuple[str, ...]
    ready: str  # the Ready condition's status, "" without one
    reason: str
    message: str
    inventory: tuple[str, ...]


class KustomizationWatch(threading.Thread):
    """Polls a Kustomization (every `interval`) and keeps each distinct state, until it is gone or stopped."""

    def __init__(self, kustomization: FluxKustomization, *, interval: float = 0.2) -> None:
        super().__init__(daemon=True, name=f"watch {kustomization.name}")
        self.kustomization, self.interval = kustomization, interval
        self.snapshots: list[Snapshot] = []
        self.gone_at: float | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            with contextlib.suppress(Exception):
                found = self.kustomization.get()
                if found is None:
                    self.gone_at = time.monotonic()
                    return
                ready = condition(found, "Ready")
                entries = ((found.get("status") or {}).get("inventory") or {}).get("entries") or []
                shot = Snapshot(time.monotonic(), bool(found["metadata"].get("deletionTimestamp")),
                                tuple(found["metadata"].get("finalizers") or ()), str(ready.get("status", "")),
                                str(ready.get("reason", "")), str(ready.get("message", "")),
                                tuple(str(e["id"]) for e in entries))
                last = self.snapshots[-1] if self.snapshots else None
                if last is None or attrs.evolve(last, at=shot.at) != shot:
                    self.snapshots.append(shot)
            self.stopping.wait(self.interval)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
