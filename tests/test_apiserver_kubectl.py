"""The real kubectl against the stand-in, with the real gate registered as an in-process webhook.

The machine's `kubectl` may be the Google Cloud SDK dispatcher: it asks `/version` first and runs the
kubectl matching the server's minor (the stand-in says 32). It caches that answer and discovery under
--cache-dir, so every test uses a fresh one; a cache reused across stand-ins would send requests to
types an old server served (design/kubernetes-semantics.md §12).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from criticalsvc.sim.apiserver.server import ServerThread
from criticalsvc.sim.apiserver.standin import StandIn
from criticalsvc.sim.kubeconfig import write_kubeconfig
from criticalsvc.sim.store import Store, gate_hook
from criticalsvc.sim.webhooks import DEFAULT_RULES, ProviderRoutesRule, RegisteredWebhook

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl is not on PATH (Debian package kubernetes-client)")

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = "api/examples/reference-story.yaml"


class Kubectl:
    """kubectl with a kubeconfig written by kubeconfig.py and a cache directory of its own."""

    def __init__(self, standin: StandIn, url: str, home: Path) -> None:
        self.standin = standin
        self.home = home
        config = write_kubeconfig(home / "kubeconfig", url)
        self.env = {**os.environ, "HOME": str(home), "KUBECONFIG": str(config)}
        self.cache = str(home / "cache")

    def command(self, *args: str) -> list[str]:
        return ["kubectl", "--cache-dir", self.cache, *args]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=60, check=False)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.command(*args), cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Kubectl]:
    """A fresh stand-in whose store calls the real gate on every gated request, and kubectl for it."""
    store = Store(clock=time.time)
    store.webhooks.append(RegisteredWebhook(gate_hook(store), rules=(*DEFAULT_RULES, ProviderRoutesRule(store.state))))
    standin = StandIn(store)
    with ServerThread(standin) as url:
        yield Kubectl(standin, url, tmp_path)


def test_apply_get_and_delete_the_reference_story(kubectl: Kubectl) -> None:
    """kubectl applies the story (twice, for the CRs), lists it, and prints the gate's denials on delete -f."""
    first = kubectl.run("apply", "-f", BUNDLE)
    assert first.returncode == 1, first.stderr
    assert 'no matches for kind "CoolResource" in version "my.crd.group/v1"' in first.stderr
    assert "ensure CRDs are installed first" in first.stderr
    assert "deployment.apps/finalizer-deployment created" in first.stdout

    second = kubectl.run("apply", "-f", BUNDLE)
    assert second.returncode == 0, second.stderr
    assert "coolresource.my.crd.group/alpha created" in second.stdout
    assert "deployment.apps/finalizer-deployment unchanged" in second.stdout

    listed = kubectl.run("get", "deploy", "-A")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:2] == ["finalizer-namespace", "finalizer-deployment"]

    deleted = kubectl.run("delete", "-f", BUNDLE, "--wait=false")
    assert deleted.returncode == 1
    prefix = (f'Error from server (Forbidden): error when deleting "{BUNDLE}": admission webhook '
              '"gate.criticalsvc.io" denied the request: ')
    denials = [line for line in deleted.stderr.splitlines() if line.startswith(prefix)]
    assert [line[len(prefix):].split(" may not be deleted yet")[0] for line in denials] == [
        "namespaces finalizer-namespace",
        "deployments.apps finalizer-namespace/finalizer-deployment",
        "criticalservices.criticalsvc.io for-finalizer-deployment",
    ]
    assert deleted.stdout.splitlines() == [
        'customresourcedefinition.apiextensions.k8s.io "coolresources.my.crd.group" deleted',
        'namespace "cool-apps" deleted',
        'coolresource.my.crd.group "alpha" deleted',
        'coolresource.my.crd.group "beta" deleted',
        'coolresource.my.crd.group "gamma" deleted',
    ]
    remaining = kubectl.run("get", "deploy", "finalizer-deployment", "-n", "finalizer-namespace", "-o", "name")
    assert remaining.stdout.strip() == "deployment.apps/finalizer-deployment"


def test_delete_waits_for_the_finalizer_over_a_watch(kubectl: Kubectl) -> None:
    """`kubectl delete` (waiting) returns once the object's finalizer is removed, learnt through a watch."""
    manifest = kubectl.home / "cfg.yaml"
    manifest.write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: team}\n---\n"
                        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: team}\n")
    assert kubectl.run("apply", "-f", str(manifest)).returncode == 0
    hold = '{"metadata":{"finalizers":["example.com/hold"]}}'
    assert kubectl.run("patch", "configmap", "cfg", "-n", "team", "--type=merge", "-p", hold).returncode == 0
    waiting = kubectl.popen("delete", "configmap", "cfg", "-n", "team", "--timeout=20s")
    deadline = time.monotonic() + 15
    while kubectl.standin.open_watches == 0:  # kubectl is waiting on its watch
        assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
        time.sleep(0.02)
    release = '{"metadata":{"finalizers":null}}'
    assert kubectl.run("patch", "configmap", "cfg", "-n", "team", "--type=merge", "-p", release).returncode == 0
    out, err = waiting.communicate(timeout=20)
    assert waiting.returncode == 0, err
    assert out.strip() == 'configmap "cfg" deleted'
    assert "Unhandled Error" not in err and "Failed to watch" not in err


def test_generator_commands_send_protobuf(kubectl: Kubectl) -> None:
    """`kubectl create namespace` sends protobuf, which the stand-in decodes; a kind it has no protobuf
    table for gets a clear 415 saying how to send it (client-go does not fall back to JSON)."""
    created = kubectl.run("create", "namespace", "team")
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "namespace/team created"
    cronjob = kubectl.run("create", "cronjob", "nightly", "-n", "team", "--image=busybox", "--schedule=0 0 * * *")
    assert cronjob.returncode == 1
    assert "the API-server stand-in does not decode CronJob (batch/v1) from protobuf" in cronjob.stderr
    assert "kubectl create -f / kubectl apply -f" in cronjob.stderr


def test_explain_criticalservices(kubectl: Kubectl) -> None:
    """`kubectl explain criticalservices.spec` reads the CriticalService schema from /openapi/v3."""
    explained = kubectl.run("explain", "criticalservices.spec")
    assert explained.returncode == 0, explained.stderr
    assert "KIND:       CriticalService" in explained.stdout
    assert "provider" in explained.stdout
