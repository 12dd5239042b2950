"""The clusters the API-behaviour tests run against, behind one interface: the stand-in
(`criticalsvc serve --embedded`: the simulated control plane behind the HTTP API stand-in, the gate
registered on it) and the real control plane (tests/realcluster). The `cluster` fixture in
conftest.py runs a test once on each, so a place where the stand-in departs from the real API
server fails a test instead of hiding a gate bug or a stand-in gap.

Both run the same kubectl: the one built with the real control plane when it is in the build cache
(so both backends meet the same client version), else the one on PATH.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

from tests.realcluster import build
from tests.realcluster.client import Client
from tests.realcluster.teardown import FinalizerController, Story, story_finalizer_controller

ROOT = Path(__file__).resolve().parents[1]


WEBHOOK_CONFIGURATIONS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


def gate_configurations(admin: Any) -> list[dict[str, Any]]:
    """The gate's own configurations as stored now (criticalsvc-providers and its shards, CONFIGURATION_NAMES),
    read in one LIST."""
    from criticalsvc.webhookconfigurations import CONFIGURATION_NAMES

    listed = admin.get(WEBHOOK_CONFIGURATIONS) or {}
    return [c for c in listed.get("items") or [] if c["metadata"]["name"] in CONFIGURATION_NAMES]


def gate_webhooks(admin: Any) -> list[dict[str, Any]]:
    """Every webhook of the gate's own configurations."""
    return [w for c in gate_configurations(admin) for w in c.get("webhooks") or []]


class Embedded:
    def __init__(self, tmp: Path) -> None:
        self.kubeconfig = tmp / "kubeconfig"
        ports_file = tmp / "ports.json"
        self.log = (tmp / "serve.log").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "criticalsvc", "serve", "--embedded", "--kubeconfig-out", str(self.kubeconfig),
             "--port-file", str(ports_file), "--log-level", "warning", "--log-file", "-"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not ports_file.exists():  # readiness is polled, never slept for
            assert self.proc.poll() is None, self.output()
            assert time.monotonic() < deadline, "serve --embedded did not start"
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        self.api = f"http://127.0.0.1:{ports['embedded']}"
        self.ops = f"http://127.0.0.1:{ports['ops_listen']}"
        while True:
            try:
                if httpx.get(f"{self.ops}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the gate never became ready:\n{self.output()}"
            time.sleep(0.05)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, within: float = 10.0) -> tuple[int | None, float]:
        """SIGTERM, then poll for the exit: (exit code or None if still running after `within` s, seconds taken)."""
        if self.proc.poll() is not None:
            return self.proc.returncode, 0.0
        self.proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        try:
            while self.proc.poll() is None and time.monotonic() - start < within:
                time.sleep(0.05)
            return self.proc.poll(), time.monotonic() - start
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()



def kubectl_binary() -> str | None:
    """The built kubectl of the selected Kubernetes version if cached, else the one on PATH."""
    binaries = build.cached(build.selected_minor())
    return str(binaries.kubectl) if binaries is not None else shutil.which("kubectl")


class Backend(Protocol):
    name: str
    kubeconfig: Path
    admin: Client

    def kubectl(self, *args: str, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]: ...

    def finalizer_controller(self, story: Story) -> contextlib.AbstractContextManager[Any]: ...

    def gate_log(self) -> str: ...


class StandInBackend:
    """`serve --embedded`: its simulated finalizer controllers already run every provider's finalizer."""

    name = "standin"

    def __init__(self, embedded: Embedded, home: Path) -> None:
        self.embedded = embedded
        self.kubeconfig = embedded.kubeconfig
        self.admin = Client(embedded.kubeconfig)
        self.home = home

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        binary = kubectl_binary()
        assert binary is not None, "no kubectl"
        env = {**os.environ, "HOME": str(self.home), "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run([binary, "--cache-dir", str(self.home / "kubectl-cache"), *args], cwd=ROOT, env=env,
                              input=input, capture_output=True, text=True, timeout=timeout, check=False)

    @contextlib.contextmanager
    def finalizer_controller(self, story: Story) -> Iterator[None]:
        yield

    def gate_log(self) -> str:
        return self.embedded.output()


class RealBackend:
    """The session's real control plane; the provider's finalizer controller is a test thread."""

    name = "real"

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.kubeconfig: Path = cluster.kubeconfig
        self.admin: Client = cluster.admin

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = self.cluster.plane.kubectl(*args, input=input, timeout=timeout)
        return result

    def finalizer_controller(self, story: Story) -> contextlib.AbstractContextManager[FinalizerController]:
        return story_finalizer_controller(self.admin, story)

    def gate_log(self) -> str:
        return "\n".join(g.process.log_path.read_text() for g in self.cluster.gate.replicas)


# --- helpers of the tests that run on both clusters -----------------------------------------------------
def provider_webhook(text: str) -> str:
    """`text` with the name of the webhook that refused a provider's DELETE made one: the shipped protected.gate
    answers once the gate's label is stored on the provider, criticalsvc-providers' providers.gate before
    (design/routing.md); which one it was is timing, the rest of the message is the gate's."""
    return text.replace('"protected.gate.criticalsvc.io"', '"providers.gate.criticalsvc.io"')


def unique(prefix: str) -> str:
    """A name no other test uses (the real cluster is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """A command's stdout, after asserting it succeeded."""
    assert result.returncode == 0, f"{result.args}: {result.stderr}"
    return str(result.stdout)


def widget_crd(group: str) -> dict[str, Any]:
    """A namespaced CRD `widgets.<group>` (kind Widget) that keeps whatever its objects carry."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {"group": group, "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema}]}}


def deployment_manifest(name: str, namespace: str, replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": "web", "image": "registry.example.com/web:1"}]}}}}


def protect_with_user(admin: Client, prefix: str) -> tuple[str, str, str, str]:
    """A namespace with Deployments `provider` and `user`, and a CriticalService protecting the provider
    until `user` is gone: (namespace, provider path, user path, service name)."""
    ns = unique(prefix)
    assert admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": ns}}).status_code == 201
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    for name in ("provider", "user"):
        assert admin.create(deployments, deployment_manifest(name, ns, replicas=0)).status_code == 201
    service = f"protects-{ns}"
    created = admin.create("/apis/criticalsvc.io/v1alpha1/criticalservices", {
        "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": service},
        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": "provider"},
                 "criteria": [{"type": "SpecificResource", "specificResource": {
                     "group": "apps", "resource": "deployments", "namespace": ns, "name": "user"}}]}})
    assert created.status_code == 201, created.text
    return ns, f"{deployments}/provider", f"{deployments}/user", service


STREAM_LABEL = "criticalsvc-test/stream"


class DeleteStream(threading.Thread):
    """Creates and deletes Deployments in a loop, counting the DELETE answers by status; anything but 200 is a
    failure (the load of the HA and certificate-rotation tests). Each Deployment is a provider selected by a
    CriticalService whose criterion always holds (`start` creates it and waits until it is Ready), so every
    DELETE is routed to the gate and allowed by it: only what a CriticalService names reaches the gate
    (design/routing.md), and a stream of unprotected DELETEs would never reach it."""

    def __init__(self, client: Any, namespace: str) -> None:
        super().__init__(daemon=True, name="delete-stream")
        self.client, self.namespace = client, namespace
        self.statuses: Counter[int] = Counter()
        self.failures: list[str] = []
        self.stopping = threading.Event()
        self.service = f"stream-{namespace}"

    def start(self) -> None:
        service = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                   "metadata": {"name": self.service},
                   "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": self.namespace,
                                         "selector": {"matchLabels": {STREAM_LABEL: "true"}}},
                            # A type the gate reads without extra RBAC, in another namespace (one in the set
                            # could be labelled into it: a cycle the CREATE refuses): never there.
                            "criteria": [{"type": "SpecificResource", "specificResource": {
                                "group": "apps", "resource": "deployments", "namespace": "default",
                                "name": f"never-{self.namespace}"}}]}}
        path = f"/apis/criticalsvc.io/v1alpha1/criticalservices/{self.service}"
        deadline = time.monotonic() + 60
        while True:  # refused (fail closed) until the gate's caches can read what it names
            created = self.client.create("/apis/criticalsvc.io/v1alpha1/criticalservices", service)
            if created.status_code in (201, 409):
                break
            assert time.monotonic() < deadline, f"stream CriticalService not created: {created.text}"
            time.sleep(0.2)
        while not any(c.get("type") == "Ready" and c.get("status") == "True"
                      for c in ((self.client.get(path) or {}).get("status") or {}).get("conditions") or []):
            assert time.monotonic() < deadline, f"{path} not Ready within 60 s"
            time.sleep(0.1)
        super().start()

    def run(self) -> None:
        base = f"/apis/apps/v1/namespaces/{self.namespace}/deployments"
        i = 0
        while not self.stopping.is_set():
            name = f"d{i}"
            manifest = deployment_manifest(name, self.namespace, replicas=0)
            manifest["metadata"].setdefault("labels", {})[STREAM_LABEL] = "true"
            self.client.create(base, manifest)
            response = self.client.delete(f"{base}/{name}")
            self.statuses[response.status_code] += 1
            if response.status_code != 200:
                self.failures.append(f"{response.status_code} {response.text[:300]}")
            i += 1

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)
        self.client.delete(f"/apis/criticalsvc.io/v1alpha1/criticalservices/{self.service}")
