"""The tools we replace, running beside criticalsvc: the same scenarios on fresh real control planes, one table.

    python -m benchmarks peers [--tools none,criticalsvc,crossplane,kyverno] [--deletes 60] [--rounds 4] [--json]
                               [--scenarios finalizer,...] [--teardowns kubectl-once,...] [--out F] [--keep DIR]
    python -m benchmarks peers build [--tools crossplane,kyverno]    # build the peers only

Not part of CI (it builds two other projects and starts four control planes). Each tool gets its own
fresh control plane (tests/realcluster/controlplane.py), is installed there as its users run it outside a
cluster, and then goes through the same scenarios, each written in that tool's own API (or reported as
not expressible in it, with the reason):

- `finalizer`: the reference story - the Deployment that removes a finalizer must not go while custom
  resources carrying it exist, and may go once they are gone;
- `namespace`: a namespace must not go while it has an active (Pending/Running) Pod; it may go once the
  Pod has finished or is gone;
- `usage`: Crossplane's own Usage example (a Cluster used by a Release); a dry-run DELETE of the used
  object must change nothing;
- `lock`: an object lock - while a Lock exists the ConfigMap of the same name may be neither deleted nor
  changed; once the Lock is gone both are allowed;
- the reference story torn down all at once by `kubectl delete -f` (one pass, and repeated every second
  until everything is gone), by deleting its namespaces (and its CRD) once, and as an Open Cluster
  Management ManifestWork by deleting the ManifestWork (the work agent's deletion path,
  tests/realcluster/manifestwork.py: one sorted pass, refusals dropped, the garbage collector finishing;
  with what the agent's DELETEs got and how it read them): whether it completes,
  whether it came apart in a safe order (no finalizer's controller gone while a CR that needs it was
  still there), its time against the tool-neutral ideal (benchmarks/ideal.py `neutral`: each DELETE sent
  the moment the safe order allows it, the CRD once its instances are gone, with no webhook; every tool timed
  on the same objects, the story's workload), and how many requests the webhooks refused
  (apiserver_admission_webhook_rejection_count);
- the resident memory (VmRSS, VmHWM) of the tool's process after all that; then DELETE latency through
  kube-apiserver of objects nothing protects (Deployments with 0 replicas), at 1 and 8 concurrent
  deleters, with the tool and with no webhook at all, in alternating rounds (`Webhooks`).

`none` is the negative control: the same scenarios with no tool must fail every "refuses what it must".

The peers are Go programs built from their released modules by the small modules of ours under
benchmarks/peers/ (go.mod/go.sum only: they name the peer's command as a `tool`), into
~/.cache/criticalsvc/peers/ (or $CRITICALSVC_PEERS_CACHE). A peer that cannot be built is reported with
the exact command and the tail of its error, and the other tools still run.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import yaml

from benchmarks import ideal

HERE = Path(__file__).resolve().parent
MODULES = HERE / "peers"
TOOLS = ("none", "criticalsvc", "crossplane", "kyverno")
TEARDOWN_TIMEOUT = 60.0
REJECTIONS = "apiserver_admission_webhook_rejection_count"


# --- building the peers ------------------------------------------------------------------------------

@attrs.frozen
class Peer:
    name: str
    version: str
    package: str  # the main package, named as a `tool` in MODULES/<name>/go.mod

    @property
    def module(self) -> Path:
        return MODULES / self.name

    @property
    def binary(self) -> Path:
        return cache_root() / f"{self.name}-{self.version}" / self.name

    def build_command(self, out: Path) -> list[str]:
        # Two cores shared by many: lowest priority, one package at a time.
        return ["nice", "-n", "19", "env", "GOFLAGS=-p=1", "go", "build", "-trimpath", "-ldflags=-s -w",
                "-o", str(out), self.package]


PEERS = {
    "crossplane": Peer("crossplane", "v2.3.4", "github.com/crossplane/crossplane/v2/cmd/crossplane"),
    "kyverno": Peer("kyverno", "v1.19.1", "github.com/kyverno/kyverno/cmd/kyverno"),
}


@attrs.frozen
class BuildFailure:
    command: str
    error: str


def cache_root() -> Path:
    configured = os.environ.get("CRITICALSVC_PEERS_CACHE")
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "criticalsvc" / "peers"


def ensure_built(peer: Peer) -> Path | BuildFailure:
    """The peer's binary, built once (under a file lock, into a temporary name renamed into place)."""
    if peer.binary.exists():
        return peer.binary
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    cache_root().mkdir(parents=True, exist_ok=True)
    with (cache_root() / f".{peer.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if peer.binary.exists():
            return peer.binary
        peer.binary.parent.mkdir(parents=True, exist_ok=True)
        partial = peer.binary.with_name(f".{peer.name}.partial")
        command = peer.build_command(partial)
        where = peer.module.relative_to(HERE.parent) if peer.module.is_relative_to(HERE.parent) else peer.module
        shown = f"cd {shlex.quote(str(where))} && {shlex.join(peer.build_command(peer.binary))}"
        if go is None:
            return BuildFailure(shown, "no Go toolchain on PATH")
        env = dict(os.environ, PATH=f"{Path(go).parent}:{os.environ.get('PATH', '')}")
        done = subprocess.run(command, cwd=peer.module, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return BuildFailure(shown, "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:]))
        partial.rename(peer.binary)
        return peer.binary


def module_dir(module: str, version: str, cwd: Path) -> Path:
    """The peer's module source in the Go module cache (`go mod download -json`), for its CRDs."""
    from tests.realcluster.build import module_download
    return Path(module_download(cwd, module, version)["Dir"])


# --- measuring ---------------------------------------------------------------------------------------

def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a live process, in KiB."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def rejections(client: Any) -> int:
    """kube-apiserver's count of requests any webhook rejected, so far."""
    total = 0.0
    for line in client.request("GET", "/metrics").text.splitlines():
        if line.startswith(REJECTIONS + "{") or line.startswith(REJECTIONS + " "):
            total += float(line.rpartition(" ")[2])
    return int(total)


def _deployment(name: str, namespace: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace,
                                                                         "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "registry.example/none:1"}]}}}}


def delete_latency(kubeconfig: Path, namespace: str, *, count: int, deleters: int, tag: str) -> list[float]:
    """Create `count` unprotected Deployments, then delete them with `deleters` concurrent clients (each its
    own connection); the seconds each DELETE took, as its client saw it."""
    from tests.realcluster.client import Client

    base = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    clients = [Client(kubeconfig) for _ in range(deleters)]
    try:
        for i in range(count):
            response = clients[0].create(base, _deployment(f"{tag}-{i}", namespace))
            assert response.status_code == 201, response.text

        def work(k: int) -> list[float]:
            samples = []
            for i in range(k, count, deleters):
                started = time.perf_counter()
                response = clients[k].delete(f"{base}/{tag}-{i}")
                samples.append(time.perf_counter() - started)
                assert response.status_code == 200, response.text
            return samples

        with concurrent.futures.ThreadPoolExecutor(deleters) as pool:
            return [s for part in pool.map(work, range(deleters)) for s in part]
    finally:
        for c in clients:
            c.close()


def latency_summary(samples: list[float]) -> dict[str, float]:
    return {"p50Ms": round(1000 * statistics.median(samples), 2), "p99Ms": round(1000 * quantile(samples, 0.99), 2),
            "n": len(samples)}


LATENCY_MODES = ("none", "tool")


def round_order(round_index: int) -> tuple[str, ...]:
    """The modes of one latency round, the first one alternating from round to round (so that outside load
    and drift - this machine is shared - land on both alike, as benchmarks/realcluster.py rotates its modes)."""
    return LATENCY_MODES if round_index % 2 == 0 else LATENCY_MODES[::-1]


WEBHOOK_COLLECTIONS = tuple(f"/apis/admissionregistration.k8s.io/v1/{kind}"
                            for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"))
PROBE_NAMESPACE, PROBE_NAME = "latency-probe", "probe"


class Webhooks:
    """The tool installed (`tool`) or not (`none`) on one control plane, switched between latency rounds.

    `none`: the tool's process is paused (SIGSTOP: Kyverno re-registers its webhook configurations itself, and
    criticalsvc keeps one of its own current) and every webhook configuration is deleted; `tool`: the
    configurations as they were are created again and the process continued. Each switch waits until a
    probe - a dry-run DELETE of a ConfigMap the tool locks (its `lock` expression) - is refused (`tool`) or
    allowed (`none`). No tool (`none` as the tool): nothing to switch; both modes measure the same thing."""

    def __init__(self, tool: Tool, env: Env) -> None:
        self.tool, self.env = tool, env
        self.probe = f"/api/v1/namespaces/{PROBE_NAMESPACE}/configmaps/{PROBE_NAME}"
        self.saved: list[tuple[str, dict[str, Any]]] = []
        self.polluted: list[str] = []  # configurations seen registered during a `none` round
        self.active = bool(tool.lock(PROBE_NAMESPACE, PROBE_NAME)) and env.process is not None

    def install_probe(self) -> None:
        if not self.active:
            return
        env = self.env
        env.apply(LOCK_CRD, twice=True)
        env.apply(_dump([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PROBE_NAMESPACE}},
                         {"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE}},
                         {"apiVersion": "locking.example.com/v1", "kind": "Lock",
                          "metadata": {"name": PROBE_NAME, "namespace": PROBE_NAMESPACE}}]))
        env.apply(self.tool.lock(PROBE_NAMESPACE, PROBE_NAME))
        if not _wait(lambda: env.refused(self.probe)[0], 90):
            raise AssertionError(f"the latency probe {self.probe} was never refused")
        for collection in WEBHOOK_COLLECTIONS:
            for item in (env.client.get(collection) or {}).get("items", []):
                meta = item["metadata"]
                body = {k: v for k, v in item.items() if k not in ("status",)}
                body["metadata"] = {k: meta[k] for k in ("name", "labels", "annotations") if k in meta}
                self.saved.append((collection, body))

    def _registered(self) -> list[str]:
        return [item["metadata"]["name"] for collection in WEBHOOK_COLLECTIONS
                for item in (self.env.client.get(collection) or {}).get("items", [])]

    def set(self, mode: str) -> None:
        if not self.active:
            return
        env = self.env
        if mode == "none":
            env.process.signal(signal.SIGSTOP)
            for collection, body in self.saved:
                env.client.delete(f"{collection}/{body['metadata']['name']}")
            ok = _wait(lambda: not self._registered() and not env.refused(self.probe)[0], 60)
        else:
            for collection, body in self.saved:
                response = env.client.create(collection, body)
                if response.status_code not in (201, 409):
                    raise AssertionError(f"re-creating {body['metadata']['name']}: {_message(response)}")
            env.process.signal(signal.SIGCONT)
            ok = _wait(lambda: env.refused(self.probe)[0], 90)
        if not ok:
            raise AssertionError(f"the latency probe did not show the mode {mode!r} within the timeout")

    def check_none(self) -> None:
        """After a `none` round: note any configuration that came back during it (the round then was not bare)."""
        if self.active:
            self.polluted += self._registered()

    def restore(self) -> None:
        if self.active:
            self.set("tool")


def measure_latency(tool: Tool, env: Env, *, deletes: int, rounds: int) -> dict[str, Any]:
    """DELETE latency of unprotected Deployments at 1 and 8 concurrent deleters, the tool installed and not,
    `rounds` rounds of `deletes` per mode, alternating (round_order)."""
    switch = Webhooks(tool, env)
    switch.install_probe()
    out: dict[str, Any] = {"rounds": rounds, "deletesPerRound": deletes, "switched": switch.active}
    try:
        for deleters in (1, 8):
            samples: dict[str, list[float]] = {m: [] for m in LATENCY_MODES}
            for r in range(rounds):
                for mode in round_order(r):
                    switch.set(mode)
                    samples[mode] += delete_latency(env.plane.admin_kubeconfig, "bench", count=deletes,
                                                    deleters=deleters, tag=f"{mode}{deleters}-{r}")
                    if mode == "none":
                        switch.check_none()
            for mode, taken in samples.items():
                out[f"{mode}{deleters}"] = latency_summary(taken)
    finally:
        switch.restore()
    if switch.polluted:
        out["noneRoundsWithWebhooks"] = sorted(set(switch.polluted))
    return out


# --- the tools -----------------------------------------------------------------------------------------

@attrs.define
class Env:
    """One fresh control plane and what runs on it for one tool."""

    plane: Any
    client: Any
    directory: Path
    process: Any = None  # the tool's own process (a tests.realcluster.controlplane.Process), if any
    pid: int | None = None
    agent: Any = None  # the ManifestWork agent (tests/realcluster/manifestwork.py), once its CRDs are installed

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> Any:
        return self.plane.kubectl(*args, input=input, timeout=timeout)

    def apply(self, text: str, *, twice: bool = False) -> None:
        """`kubectl apply -f -`; `twice` when the text holds CRDs and their custom resources."""
        if twice:
            self.kubectl("apply", "-f", "-", input=text)
            for doc in yaml.safe_load_all(text):
                if doc and doc["kind"] == "CustomResourceDefinition":
                    self.kubectl("wait", "--for=condition=Established", f"crd/{doc['metadata']['name']}",
                                 "--timeout=60s")
        # Again while it fails, for 30 s: a grant applied in the same text (an aggregated ClusterRole) takes a
        # moment to reach the tool, which refuses what it cannot verify until then.
        deadline = time.monotonic() + 30
        while (done := self.kubectl("apply", "-f", "-", input=text)).returncode != 0 and time.monotonic() < deadline:
            time.sleep(1)
        if done.returncode != 0:
            raise AssertionError(f"kubectl apply failed: {done.stderr.strip()}")

    def refused(self, path: str, *, dry_run: bool = True) -> tuple[bool, str]:
        """DELETE `path` (a dry run unless told); (refused by a webhook, the answer's message)."""
        response = self.client.delete(path, params={"dryRun": "All"} if dry_run else None)
        refused = response.status_code not in (200, 202, 404)
        return refused, _message(response) if refused else ""


def _message(response: Any) -> str:
    try:
        body = response.json()
    except ValueError:
        return str(response.text)[:200]
    return f"{response.status_code} {str(body.get('message', ''))[:300]}" if isinstance(body, dict) else ""


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _dump(docs: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


class NotExpressible(Exception):
    """The scenario cannot be said in this tool's API (the message says why)."""


class Tool:
    """A deletion gate installed on a fresh control plane, and the scenarios written in its API."""

    name = "none"
    version = "-"
    refusal = "-"  # the HTTP status its refusals carry

    def install(self, env: Env) -> None:
        """Install and start the tool; return once its webhook answers."""

    def stop(self, env: Env) -> None:
        if env.process is not None:
            env.process.stop()

    # Each returns the manifests that express the scenario (applied after the scenario's own objects),
    # or raises NotExpressible.
    def story(self, story: Any) -> str:
        """The reference story's bundle with this tool's protection in it."""
        return _dump([d for d in story.objects if d["kind"] != "CriticalService"])

    def prepare(self, env: Env, story: Any) -> None:
        """What an operator grants the tool once, outside the bundle (RBAC), before the story is applied."""

    def wait_protected(self, env: Env, story: Any) -> None:
        """Return once the story's Deployment is protected (it is refused); no tool: nothing to wait for."""

    def namespace(self, namespace: str) -> str:
        return ""

    def usage(self, cluster: str, release: str) -> str:
        return ""

    def lock(self, namespace: str, name: str) -> str:
        return ""


def _reader(resource: str, group: str) -> dict[str, Any]:
    """The aggregated ClusterRole a user adds so the gate may read a type its CriticalServices name (the
    gate refuses what it cannot verify, so without it every DELETE it is asked about is refused)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": f"criticalsvc-read-{resource}",
                         "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
            "rules": [{"apiGroups": [group], "resources": [resource], "verbs": ["get", "list", "watch"]}]}


class Criticalsvc(Tool):
    name = "criticalsvc"
    refusal = "403"

    def install(self, env: Env) -> None:
        from tests.realcluster.gate import install

        gate = install(env.plane, env.directory / "gate")
        replica = gate.start()
        env.process = replica.process
        env.pid = replica.process.popen.pid
        self.gate = gate

    def stop(self, env: Env) -> None:
        self.gate.stop()

    def version_of(self) -> str:
        from importlib.metadata import version

        return version("criticalsvc")

    def prepare(self, env: Env, story: Any) -> None:
        from tests.realcluster.teardown import replay_grant

        env.apply(story.reader_role() + "---\n" + _dump([replay_grant()]))

    def story(self, story: Any) -> str:
        # With replayDeletion, as the Usages have it: a one-pass deleter's refused DELETEs are carried out
        # by the gate once allowed (design/replay.md).
        docs = story.objects
        for doc in docs:
            if doc["kind"] == "CriticalService":
                doc["spec"]["replayDeletion"] = "WhenTearingDown"
        return _dump(docs)

    def wait_protected(self, env: Env, story: Any) -> None:
        from tests.realcluster.teardown import wait_for

        wait_for(lambda: env.refused(story.deployment_path)[0], timeout=60,
                 what="criticalsvc to protect the story's Deployment")

    def namespace(self, namespace: str) -> str:
        return _dump([_reader("pods", ""), {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                       "metadata": {"name": f"{namespace}-active-pods"},
                       "spec": {"provider": {"resource": "namespaces", "name": namespace},
                                "criteria": [{"type": "Resources", "resources": {"resource": "pods",
                                                                                  "namespace": namespace},
                                              "condition": "object.status.phase in ['Pending', 'Running']"}]}}])

    def usage(self, cluster: str, release: str) -> str:
        return _dump([{"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                       "metadata": {"name": f"{cluster}-used-by-{release}"},
                       "spec": {"replayDeletion": "WhenTearingDown",
                                "provider": {"group": "compute.example.org", "resource": "clusters", "name": cluster},
                                "criteria": [{"type": "SpecificResource", "specificResource": {
                                    "group": "helm.example.org", "resource": "releases", "name": release}}]}}])

    def lock(self, namespace: str, name: str) -> str:
        return _dump([_reader("configmaps", ""), {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                       "metadata": {"name": f"lock-{namespace}-{name}"},
                       "spec": {"provider": {"resource": "configmaps", "namespace": namespace, "name": name},
                                "criteria": [{"type": "SpecificResource", "specificResource": {
                                    "group": "locking.example.com", "resource": "locks", "namespace": namespace,
                                    "name": name}}],
                                "holdUpdates": "WhileBlocking"}}])


def _apply_crds(env: Env, files: list[Path]) -> None:
    """Apply a peer's CRD files from its module, server-side (some exceed the client-side annotation limit)."""
    for crd in files:
        done = env.kubectl("apply", "--server-side", "-f", str(crd))
        if done.returncode != 0:
            raise AssertionError(f"applying {crd.name}: {done.stderr.strip()}")


class Crossplane(Tool):
    """`crossplane core start` outside the cluster: its CRDs, its no-usages webhook and the Usage controller.

    What the Helm chart's init container (`crossplane core init`) does is done here by hand: the CRDs from
    the module's cluster/crds/, a CA with serving and client pairs in the directories
    `--tls-server-certs-dir`/`--tls-client-certs-dir` read, and the webhook configuration of
    cluster/webhookconfigurations/usage.yaml with a URL instead of a Service.
    """

    name = "crossplane"
    refusal = "409"

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.version = PEERS["crossplane"].version

    def install(self, env: Env) -> None:
        from criticalsvc import certs
        from tests.realcluster.controlplane import Process, free_port, poll

        source = module_dir("github.com/crossplane/crossplane/v2", self.version, PEERS["crossplane"].module)
        _apply_crds(env, sorted((source / "cluster" / "crds").glob("*.yaml")))
        env.kubectl("create", "namespace", "crossplane-system")
        tls = env.directory / "crossplane-tls"
        ca = certs.make_ca("crossplane-bench-ca")
        serving = certs.make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
        client = certs.make_client_cert(ca, "crossplane")
        for sub in ("server", "client"):
            (tls / sub).mkdir(parents=True, exist_ok=True)
        for name, data, private in (("ca.crt", certs.cert_pem(ca.cert), False),
                                    ("tls.crt", certs.cert_pem(serving.cert) + certs.cert_pem(ca.cert), False),
                                    ("tls.key", certs.key_pem(serving.key), True)):
            certs.write_pem(tls / "server" / name, data, private=private)
        for name, data, private in (("ca.crt", certs.cert_pem(ca.cert), False),
                                    ("tls.crt", certs.cert_pem(client.cert), False),
                                    ("tls.key", certs.key_pem(client.key), True)):
            certs.write_pem(tls / "client" / name, data, private=private)
        port, health = free_port(), free_port()
        hook = yaml.safe_load((source / "cluster" / "webhookconfigurations" / "usage.yaml").read_text())
        for webhook in hook["webhooks"]:
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{webhook['clientConfig']['service']['path']}",
                                       "caBundle": base64.b64encode(certs.cert_pem(ca.cert)).decode()}
        env.process = Process("crossplane", [
            str(self.binary), "core", "start", "--webhook-port", str(port), "--metrics-port", str(free_port()),
            "--health-probe-port", str(health), "--tls-server-certs-dir", str(tls / "server"),
            "--tls-client-certs-dir", str(tls / "client"), "--xpkg-cache-dir", str(env.directory / "xpkg"),
            "--namespace", "crossplane-system",
        ], env.directory / "crossplane.log")
        os.environ["KUBECONFIG"] = str(env.plane.admin_kubeconfig)  # ctrl.GetConfig() reads it
        try:
            env.process.start()
        finally:
            del os.environ["KUBECONFIG"]
        env.pid = env.process.popen.pid
        from tests.realcluster.controlplane import _http_ok

        poll(lambda: _http_ok(f"http://127.0.0.1:{health}/readyz"), timeout=180, what="crossplane /readyz",
             alive=env.process.check_alive, interval=0.3)
        env.apply(_dump([hook]))

    def _wait_labelled(self, env: Env, path: str) -> None:
        from tests.realcluster.controlplane import poll

        def labelled() -> bool:
            obj = env.client.get(path) or {}
            return bool((obj.get("metadata", {}).get("labels") or {}).get("crossplane.io/in-use") == "true")

        poll(labelled, timeout=90, what=f"crossplane's Usage controller to label {path} in-use",
             alive=env.process.check_alive, interval=0.2)

    def story(self, story: Any) -> str:
        deployment = next(d for d in story.objects if d["kind"] == "Deployment")
        usages = [{"apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
                   "metadata": {"name": f"controller-used-by-{cr['metadata']['name']}",
                                "namespace": cr["metadata"]["namespace"]},
                   "spec": {"replayDeletion": True,
                            "of": {"apiVersion": "apps/v1", "kind": "Deployment",
                                   "resourceRef": {"name": deployment["metadata"]["name"],
                                                   "namespace": deployment["metadata"]["namespace"]}},
                            "by": {"apiVersion": cr["apiVersion"], "kind": cr["kind"],
                                   "resourceRef": {"name": cr["metadata"]["name"]}}}}
                  for cr in story.objects if cr["kind"] == "CoolResource"]
        return super().story(story) + "---\n" + _dump(usages)

    def wait_protected(self, env: Env, story: Any) -> None:
        # Not probed with a dry-run DELETE: Crossplane's webhook records every refused DELETE, dry runs
        # too, as the deletion to replay (see the `usage` scenario).
        self._wait_labelled(env, story.deployment_path)

    def namespace(self, namespace: str) -> str:
        raise NotExpressible("a Usage's `by` is one object (named, or a selector resolved once to one object), "
                             "with no condition on its state: 'while active Pods exist' cannot be said")

    def usage(self, cluster: str, release: str) -> str:
        return _dump([{"apiVersion": "protection.crossplane.io/v1beta1", "kind": "ClusterUsage",
                       "metadata": {"name": f"{cluster}-used-by-{release}"},
                       "spec": {"replayDeletion": True,
                                "of": {"apiVersion": "compute.example.org/v1", "kind": "Cluster",
                                       "resourceRef": {"name": cluster}},
                                "by": {"apiVersion": "helm.example.org/v1", "kind": "Release",
                                       "resourceRef": {"name": release}}}}])

    def lock(self, namespace: str, name: str) -> str:
        return _dump([{"apiVersion": "protection.crossplane.io/v1beta1", "kind": "Usage",
                       "metadata": {"name": f"lock-{name}", "namespace": namespace},
                       "spec": {"of": {"apiVersion": "v1", "kind": "ConfigMap", "resourceRef": {"name": name}},
                                "by": {"apiVersion": "locking.example.com/v1", "kind": "Lock",
                                       "resourceRef": {"name": name}}}}])


def _policy(name: str, group: str, resource: str, operations: list[str], match: str, allowed: str,
            message: str) -> dict[str, Any]:
    """A Kyverno ValidatingPolicy: `operations` of `resource` for which `match` holds are denied unless `allowed`
    (CEL; `oldObject` is the object deleted or updated, `resource.List` reads the cluster; its `items` are
    typed `any`, which a comprehension refuses to range over without `dyn(...)`)."""
    return {"apiVersion": "policies.kyverno.io/v1", "kind": "ValidatingPolicy", "metadata": {"name": name},
            "spec": {"validationActions": ["Deny"],
                     "matchConstraints": {"resourceRules": [{"apiGroups": [group], "apiVersions": ["*"],
                                                             "operations": operations, "resources": [resource]}]},
                     "matchConditions": [{"name": "the-protected-object", "expression": match}],
                     "validations": [{"expression": allowed, "message": message}]}}


class Kyverno(Tool):
    """Kyverno's admission controller outside the cluster (`--serverIP`): its CRDs from the module's config/crds/,
    the `kyverno` namespace; it writes its own CA and serving pair into the two Secrets it is named and
    registers its webhook configurations itself, pointed at https://SERVER_IP:PORT."""

    name = "kyverno"
    refusal = "400"  # measured: "denied the request: Policy ... failed"

    def __init__(self, binary: Path) -> None:
        self.binary = binary
        self.version = PEERS["kyverno"].version

    def install(self, env: Env) -> None:
        from tests.realcluster.controlplane import Process, free_port, poll

        source = module_dir("github.com/kyverno/kyverno", self.version, PEERS["kyverno"].module)
        _apply_crds(env, sorted((source / "config" / "crds").rglob("*.yaml")))
        env.kubectl("create", "namespace", "kyverno")
        port = free_port()
        env.process = Process("kyverno", [
            # HOST:PORT: the webhooks' URL is https://SERVER_IP/PATH (pkg/tls takes a port in it too).
            str(self.binary), "--kubeconfig", str(env.plane.admin_kubeconfig), "--serverIP", f"127.0.0.1:{port}",
            "--webhookServerPort", str(port), "--servicePort", str(port),
            "--caSecretName", "kyverno-svc.kyverno.svc.kyverno-tls-ca",
            "--tlsSecretName", "kyverno-svc.kyverno.svc.kyverno-tls-pair", "--admissionReports=false",
            "--controllerRuntimeMetricsAddress", f"127.0.0.1:{free_port()}",
        ], env.directory / "kyverno.log")
        # What its Deployment's pod spec sets (it exits when INIT_CONFIG or METRICS_CONFIG is undefined).
        variables = {"KYVERNO_NAMESPACE": "kyverno", "KYVERNO_SERVICEACCOUNT_NAME": "kyverno",
                     "KYVERNO_DEPLOYMENT": "kyverno", "KYVERNO_POD_NAME": "kyverno-0", "INIT_CONFIG": "kyverno",
                     "METRICS_CONFIG": "kyverno-metrics"}
        os.environ.update(variables)
        try:
            env.process.start()
        finally:
            for key in variables:
                del os.environ[key]
        env.pid = env.process.popen.pid
        poll(lambda: "kyverno-resource-validating-webhook-cfg" in env.kubectl(
            "get", "validatingwebhookconfigurations", "-o", "name").stdout, timeout=180,
             what="kyverno's webhook configurations", alive=env.process.check_alive, interval=0.5)

    def prepare(self, env: Env, story: Any) -> None:
        # The policy is installed apart from the bundle: in it, `kubectl delete -f` would delete it too.
        deployment = next(d for d in story.objects if d["kind"] == "Deployment")["metadata"]
        env.apply(_dump([_policy(
            f"protect-{deployment['name']}", "apps", "deployments", ["DELETE"],
            f"oldObject.metadata.namespace == '{deployment['namespace']}' && "
            f"oldObject.metadata.name == '{deployment['name']}'",
            f"dyn(resource.List('{story.group}/v1', 'coolresources', '').items).all(o, "
            f"!has(o.metadata.finalizers) || !('{story.finalizer}' in o.metadata.finalizers))",
            "custom resources still carry the finalizer this Deployment's controller removes")]))

    def wait_protected(self, env: Env, story: Any) -> None:
        from tests.realcluster.teardown import wait_for

        wait_for(lambda: env.refused(story.deployment_path)[0], timeout=90,
                 what="kyverno to protect the story's Deployment")

    def namespace(self, namespace: str) -> str:
        return _dump([_policy(
            f"{namespace}-active-pods", "", "namespaces", ["DELETE"], f"oldObject.metadata.name == '{namespace}'",
            f"dyn(resource.List('v1', 'pods', '{namespace}').items).all(p, "
            "!(has(p.status.phase) && p.status.phase in ['Pending', 'Running']))",
            "the namespace still has active Pods")])

    def usage(self, cluster: str, release: str) -> str:
        return _dump([_policy(
            f"{cluster}-used-by-{release}", "compute.example.org", "clusters", ["DELETE"],
            f"oldObject.metadata.name == '{cluster}'",
            f"dyn(resource.List('helm.example.org/v1', 'releases', '').items).all(r, r.metadata.name != '{release}')",
            f"the Release {release} still uses it")])

    def lock(self, namespace: str, name: str) -> str:
        return _dump([_policy(
            f"lock-{namespace}-{name}", "", "configmaps", ["DELETE", "UPDATE"],
            f"oldObject.metadata.namespace == '{namespace}' && oldObject.metadata.name == '{name}'",
            f"dyn(resource.List('locking.example.com/v1', 'locks', '{namespace}').items)"
            f".all(l, l.metadata.name != '{name}')",
            "locked")])


# --- scenarios ---------------------------------------------------------------------------------------

def _check(results: list[dict[str, Any]], what: str, must: str, ok: bool, detail: str = "") -> None:
    results.append({"check": what, "kind": must, "ok": ok, **({"detail": detail[:300]} if detail else {})})


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():
                return True
        time.sleep(0.2)
    return False


def scenario_finalizer(tool: Tool, env: Env) -> list[dict[str, Any]]:
    from tests.realcluster.teardown import Story

    story = Story.make("fin")
    tool.prepare(env, story)
    env.apply(tool.story(story), twice=True)
    tool.wait_protected(env, story)
    out: list[dict[str, Any]] = []
    refused, message = env.refused(story.deployment_path)
    _check(out, "DELETE Deployment while CRs carry its finalizer", "refuse", refused, message)
    controller_thread = controller(env, story)
    controller_thread.start()
    try:
        env.kubectl("delete", "coolresources." + story.group, "--all", "-n", story.cr_namespace, "--wait=false")
        env.kubectl("delete", "crd", story.crd_name, "--wait=false")
        gone = _wait(lambda: not env.client.exists(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                                  f"{story.crd_name}"), 60)
        allowed = _wait(lambda: not env.refused(story.deployment_path)[0], 60)
        _check(out, "DELETE Deployment once the CRs (and their CRD) are gone", "allow", gone and allowed,
               env.refused(story.deployment_path)[1] if gone else "the CRs did not go")
    finally:
        controller_thread.stop()
    return out


def scenario_namespace(tool: Tool, env: Env) -> list[dict[str, Any]]:
    ns = "ns-active-pods"
    protection = tool.namespace(ns)  # NotExpressible before anything is created
    env.apply(_dump([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}]))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "worker", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "registry.example/worker:1"}]}}
    env.apply(_dump([pod]))
    if protection:
        env.apply(protection)
    path = f"/api/v1/namespaces/{ns}"
    out: list[dict[str, Any]] = []
    refused = _wait(lambda: env.refused(path)[0], 30 if protection else 2)
    _check(out, "DELETE namespace with a Pending Pod", "refuse", refused, env.refused(path)[1])
    env.kubectl("patch", "pod", "worker", "-n", ns, "--subresource=status", "--type=merge",
                "-p", '{"status":{"phase":"Succeeded"}}')
    _check(out, "DELETE namespace whose only Pod has Succeeded", "allow",
           _wait(lambda: not env.refused(path)[0], 30), env.refused(path)[1])
    return out


USAGE_CRDS = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: clusters.compute.example.org}
spec:
  group: compute.example.org
  scope: Cluster
  names: {plural: clusters, singular: cluster, kind: Cluster}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object,
              x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: releases.helm.example.org}
spec:
  group: helm.example.org
  scope: Cluster
  names: {plural: releases, singular: release, kind: Release}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object,
              x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: criticalsvc-read-usage, labels: {criticalsvc.io/aggregate-to-reader: "true"}}
rules: [{apiGroups: [compute.example.org, helm.example.org], resources: [clusters, releases],
         verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: criticalsvc-replay-usage, labels: {criticalsvc.io/aggregate-to-replay: "true"}}
rules: [{apiGroups: [compute.example.org], resources: [clusters], verbs: [delete]},
        {apiGroups: [criticalsvc.io], resources: [criticalservices], verbs: [delete]}]
"""


def scenario_usage(tool: Tool, env: Env) -> list[dict[str, Any]]:
    """Crossplane's Usage example, with replayDeletion: the Cluster is refused while the Release exists,
    deleted by the tool once the Release is gone; a dry-run DELETE must leave nothing to replay."""
    env.apply(USAGE_CRDS, twice=True)
    out: list[dict[str, Any]] = []
    for pair, dry_run in (("real", False), ("dry", True)):
        cluster, release = f"prod-{pair}", f"app-{pair}"
        env.apply(_dump([{"apiVersion": "compute.example.org/v1", "kind": "Cluster", "metadata": {"name": cluster}},
                         {"apiVersion": "helm.example.org/v1", "kind": "Release", "metadata": {"name": release}}]))
        protection = tool.usage(cluster, release)
        if protection:
            env.apply(protection)
        cpath = f"/apis/compute.example.org/v1/clusters/{cluster}"
        rpath = f"/apis/helm.example.org/v1/releases/{release}"
        if isinstance(tool, Crossplane):
            tool._wait_labelled(env, cpath)
        elif protection:
            _wait(lambda p=cpath: env.refused(p)[0], 30)
        refused, message = env.refused(cpath, dry_run=dry_run)
        if not dry_run:
            _check(out, "DELETE the used Cluster while its Release exists", "refuse", refused, message)
        assert env.client.delete(rpath).status_code in (200, 202)
        if dry_run:
            time.sleep(5)  # what a replay would take: crossplane's and criticalsvc's took < 1 s in the real pair
            _check(out, "a refused dry-run DELETE deletes nothing later (Release gone, 5 s)", "allow",
                   env.client.exists(cpath), "" if env.client.exists(cpath) else "the Cluster was deleted")
        elif refused:
            replayed = _wait(lambda p=cpath: not env.client.exists(p), 20)
            _check(out, "the refused DELETE is replayed once the Release is gone", "replay", replayed)
            if not replayed:
                _check(out, "DELETE the Cluster once its Release is gone", "allow",
                       not env.refused(cpath, dry_run=False)[0])
    return out


LOCK_CRD = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: locks.locking.example.com}
spec:
  group: locking.example.com
  scope: Namespaced
  names: {plural: locks, singular: lock, kind: Lock}
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object,
              x-kubernetes-preserve-unknown-fields: true}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: criticalsvc-read-locks, labels: {criticalsvc.io/aggregate-to-reader: "true"}}
rules: [{apiGroups: [locking.example.com], resources: [locks], verbs: [get, list, watch]}]
"""


def scenario_lock(tool: Tool, env: Env) -> list[dict[str, Any]]:
    ns, name = "payments", "payments-config"
    env.apply(LOCK_CRD, twice=True)
    env.apply(_dump([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
                     {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns},
                      "data": {"acquirer": "https://acquirer.example.com"}},
                     {"apiVersion": "locking.example.com/v1", "kind": "Lock",
                      "metadata": {"name": name, "namespace": ns}, "spec": {"reason": "change freeze"}}]))
    protection = tool.lock(ns, name)
    if protection:
        env.apply(protection)
    path = f"/api/v1/namespaces/{ns}/configmaps/{name}"
    if isinstance(tool, Crossplane):
        tool._wait_labelled(env, path)
    elif protection:
        _wait(lambda: env.refused(path)[0], 30)
    out: list[dict[str, Any]] = []
    refused, message = env.refused(path)
    _check(out, "DELETE the locked ConfigMap", "refuse", refused, message)
    changed = env.kubectl("label", "configmap", name, "-n", ns, "--dry-run=server", "edited=yes")
    _check(out, "change the locked ConfigMap (kubectl label)", "refuse", changed.returncode != 0,
           changed.stderr.strip())
    assert env.client.delete(f"/apis/locking.example.com/v1/namespaces/{ns}/locks/{name}").status_code in (200, 202)
    _check(out, "DELETE the ConfigMap once the Lock is gone", "allow",
           _wait(lambda: not env.refused(path)[0], 30), env.refused(path)[1])
    return out


SCENARIOS: dict[str, Callable[[Tool, Env], list[dict[str, Any]]]] = {
    "finalizer": scenario_finalizer, "namespace": scenario_namespace, "usage": scenario_usage,
    "lock": scenario_lock,
}


# --- teardowns ---------------------------------------------------------------------------------------

def _story_paths(tool: Tool, story: Any, mode: str) -> dict[str, str]:
    # The same objects for every tool (benchmarks/ideal.py `counted`): the story's workload, not the tool's own
    # objects (a CriticalService, a Usage, a policy).
    paths = ideal.counted(story.paths())
    if mode == "namespace":  # what deleting the namespaces (and the CRD, cluster-scoped) removes
        paths = {k: v for k, v in paths.items()
                 if "/namespaces/" in v or k.startswith(("Namespace/", "CustomResourceDefinition/"))}
    return paths


def teardown(tool: Tool, env: Env, mode: str) -> dict[str, Any]:
    """Apply the story with the tool's protection, then delete it all at once by `mode`; watch it go."""
    from tests.realcluster.teardown import Observer, Story

    story = Story.make(mode.replace("-", ""))
    tool.prepare(env, story)
    bundle = tool.story(story)
    env.apply(bundle, twice=True)
    tool.wait_protected(env, story)
    paths = _story_paths(tool, story, mode)
    controller_thread = controller(env, story)
    observer = Observer(env.client, paths)
    bundle_file = env.directory / f"bundle-{mode}.yaml"
    bundle_file.write_text(bundle)
    before = rejections(env.client)
    controller_thread.start()
    observer.start()
    started = time.monotonic()
    complete = False
    kubectl_refusals = 0
    try:
        if mode == "namespace":
            env.kubectl("delete", f"namespace/{story.namespace}", f"namespace/{story.cr_namespace}",
                        f"customresourcedefinition/{story.crd_name}", "--wait=false")
        elif mode == "ideal":  # the tool-neutral ideal: each DELETE the moment the safe order allows it
            ideal.run_order(env.client, paths, ideal.neutral(paths, story.dependents()),
                            stopping=threading.Event(), timeout=TEARDOWN_TIMEOUT)
        deadline = started + TEARDOWN_TIMEOUT
        passes = 0
        while time.monotonic() < deadline:
            if mode in ("kubectl-once", "kubectl-repeat") and (passes == 0 or mode == "kubectl-repeat"):
                done = env.kubectl("delete", "-f", str(bundle_file), "--wait=false", "--ignore-not-found")
                kubectl_refusals += done.stderr.count("denied the request")
                passes += 1
            if not any(env.client.exists(p) for p in paths.values()):
                complete = True
                break
            time.sleep(1.0 if mode == "kubectl-repeat" else 0.2)
        wall = time.monotonic() - started
    finally:
        observer.stop()
        controller_thread.stop()
    left = sorted(k for k, v in paths.items() if env.client.exists(v))
    return {"complete": complete, "wallSeconds": round(wall, 2) if complete else None,
            "left": left, "orderViolations": observer.order_violations(_safety(story, paths)),
            "refusedByWebhooks": rejections(env.client) - before, "kubectlRefusals": kubectl_refusals,
            "controllerStoppedWithCRs": controller_thread.stopped_with,
            "kubectlPasses": passes if mode.startswith("kubectl") else None}


def namespace_path(object_path: str) -> str:
    """The REST path of the namespace of a namespaced object's REST path."""
    _, _, rest = object_path.partition("/namespaces/")
    if not rest:
        raise ValueError(f"not a namespaced object's path: {object_path}")
    return f"/api/v1/namespaces/{rest.split('/', 1)[0]}"


def controller(env: Env, story: Any) -> Any:
    """The story's finalizer controller as its Pods run it (tests/realcluster/teardown.py's FinalizerController is
    a thread that runs while the Deployment object exists): it removes the finalizer while a Pod of the Deployment
    exists and is not being deleted (kube-controller-manager's ReplicaSet controller creates it; with no kubelet
    it stays Pending). So it stops when the Deployment is gone (the garbage collector deletes its ReplicaSet and
    Pods) AND when the Deployment's namespace starts terminating even while a gate keeps the Deployment object:
    a terminating namespace's Pods are deleted before anything else in it, and none can be created there any more
    (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/namespace/deletion/namespaced_resources_deleter.go#L529-L556).
    (A real Pod runs on for its grace period after its deletion; a controller that stops on SIGTERM does not.)
    `stopped_with` lists the CRs still there when it stopped: each stuck for good unless its finalizer is removed
    by something else."""
    from tests.realcluster.client import Client
    from tests.realcluster.teardown import FinalizerController, remove_deleting_finalizers

    deployment = next(d for d in story.objects if d["kind"] == "Deployment")
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    pods = f"{namespace_path(story.deployment_path)}/pods"

    class ControllerPods(FinalizerController):
        stopped_with: list[str] | None = None
        started_running = False

        def run(self) -> None:
            while not self.stopping.wait(self.interval):
                try:
                    if self.stopped_with is not None:
                        continue
                    listed = self.client.request("GET", pods, params={"labelSelector": selector})
                    running = listed.status_code == 200 and any(
                        not p["metadata"].get("deletionTimestamp") for p in listed.json().get("items", []))
                    if running:
                        self.started_running = True
                        self.removed += remove_deleting_finalizers(self.client, self.crs_path, self.finalizer)
                    elif self.started_running:  # its Pods are gone or going: the controller has stopped
                        crs = self.client.get(self.crs_path) or {}
                        self.stopped_with = sorted(o["metadata"]["name"] for o in crs.get("items", []))
                except Exception:
                    continue

        def stop(self) -> None:
            super().stop()
            self.client.close()

    # A client of its own: one connection per thread (the others' requests run at the same time).
    return ControllerPods(Client(env.plane.admin_kubeconfig), deployment_path=story.deployment_path,
                          crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)


def _safety(story: Any, paths: dict[str, str]) -> dict[str, list[str]]:
    """Unsafe: the finalizer's controller (the Deployment, or its namespace) gone while a CR that needs it was
    still there; a CR left then is stuck for good. (The design's order also puts the CRD first; a CRD whose CRs
    are all gone needs no controller, so that stricter order is not asked of every tool.)"""
    crs = [k for k in paths if k.startswith("CoolResource/")]
    return {k: crs for k in paths if k.startswith(("Deployment/", f"Namespace/{story.namespace}"))}


MANIFESTWORK_TIMEOUT = 120.0  # the garbage collector retries a refusal 5 ms·2ⁿ: its later retries are seconds apart


def agent_answers(statuses: list[int], sync_errors: int) -> dict[str, int]:
    """What the work agent's one pass of DELETEs got, as the agent reads it
    (https://github.com/open-cluster-management-io/ocm/blob/v1.3.1/pkg/work/helper/helpers.go#L253-L265):
    `deleted` (2xx: waited for), `gone` (404), `forgotten` (409: taken for a failed UID precondition and dropped
    without an error: the ManifestWork reports nothing), `failed` (any other refusal: dropped too, but the sync
    returns an error); `syncErrors`, the syncs that returned one."""
    out = {"sent": len(statuses), "deleted": 0, "gone": 0, "forgotten": 0, "failed": 0, "syncErrors": sync_errors}
    for status in statuses:
        key = ("deleted" if status < 300 else "gone" if status == 404 else "forgotten" if status == 409
               else "failed")
        out[key] += 1
    return out


def _agent(env: Env) -> Any:
    """The ManifestWork agent for this control plane, its CRDs installed (and the garbage collector watching
    AppliedManifestWorks, as on a managed cluster where the agent has long run) on first use."""
    if env.agent is None:
        from tests.realcluster import ocmcrds
        from tests.realcluster.manifestwork import ManifestWorkAgent

        agent = ManifestWorkAgent(env.client, cluster_namespace="cluster1")
        agent.install_crds(env.kubectl, [p.read_text() for p in ocmcrds.ensure_crds()])
        env.agent = agent
    return env.agent


def teardown_manifestwork(tool: Tool, env: Env) -> dict[str, Any]:
    """The story delivered as one ManifestWork (its bundle, with the tool's protection in it) and torn down by
    deleting the ManifestWork: the work agent's deletion path (tests/realcluster/manifestwork.py: one pass of
    DELETEs in sorted order, Background with a UID precondition, refusals dropped), then kube-controller-manager's
    garbage collector for what the agent dropped (its AppliedManifestWork owner gone, it deletes them and
    retries each refusal, https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/garbagecollector/garbagecollector.go#L350-L368)."""
    from tests.realcluster.client import Client
    from tests.realcluster.manifestwork import Teardown
    from tests.realcluster.teardown import Observer, Story

    agent = _agent(env)
    story = Story.make("manifestwork")
    tool.prepare(env, story)
    work = agent.apply(f"story-{tool.name}", _docs(tool.story(story)))
    tool.wait_protected(env, story)
    paths = _story_paths(tool, story, "manifestwork")
    controller_thread = controller(env, story)
    observer = Observer(env.client, paths)
    agent_thread = Teardown(Client(env.plane.admin_kubeconfig), work)  # its own connection, as the controller
    before = rejections(env.client)
    controller_thread.start()
    observer.start()
    started = time.monotonic()
    agent_thread.start()
    complete = False
    try:
        complete = _wait(lambda: not any(env.client.exists(p) for p in paths.values()), MANIFESTWORK_TIMEOUT)
        wall = time.monotonic() - started
        _wait(lambda: agent_thread.manifestwork_gone_at is not None, 10)
    finally:
        observer.stop()
        agent_thread.stop()
        agent_thread.client.close()
        controller_thread.stop()
    left = sorted(k for k, v in paths.items() if env.client.exists(v))
    work_gone = agent_thread.manifestwork_gone_at
    # What was still there when the ManifestWork was gone: what its user is told is deleted, and is not (yet).
    after_work = (sorted(k for k in paths if observer.gone_at.get(k, float("inf")) > work_gone)
                  if work_gone is not None else None)
    return {"complete": complete, "wallSeconds": round(wall, 2) if complete else None,
            "left": left, "orderViolations": observer.order_violations(_safety(story, paths)),
            "refusedByWebhooks": rejections(env.client) - before,
            "controllerStoppedWithCRs": controller_thread.stopped_with,
            "agent": agent_answers([d.status for d in agent_thread.deletes], len(agent_thread.errors)),
            "agentDeletes": [f"{d.status} {d.path}" + (f": {d.message[:160]}" if d.message else "")
                             for d in agent_thread.deletes],
            "agentErrors": agent_thread.errors[:5],
            "manifestWorkGoneSeconds": round(work_gone - started, 2) if work_gone is not None else None,
            "leftWhenManifestWorkGone": after_work}


TEARDOWNS = ("kubectl-once", "kubectl-repeat", "namespace", "manifestwork")


# --- one tool, end to end ----------------------------------------------------------------------------

def run_tool(tool: Tool, binaries: Any, directory: Path, *, deletes: int, rounds: int, with_ideal: bool,
             scenarios: tuple[str, ...] = tuple(SCENARIOS), teardowns: tuple[str, ...] = TEARDOWNS) -> dict[str, Any]:
    from tests.realcluster.client import Client
    from tests.realcluster.controlplane import ControlPlane

    plane = ControlPlane(binaries, directory)
    client = None
    env: Env | None = None
    result: dict[str, Any] = {"tool": tool.name, "version": tool.version, "refusalStatus": tool.refusal}
    try:
        plane.start()
        client = Client(plane.admin_kubeconfig)
        env = Env(plane, client, directory)
        assert env.kubectl("create", "namespace", "bench").returncode == 0
        started = time.monotonic()
        tool.install(env)
        result["installSeconds"] = round(time.monotonic() - started, 1)
        done: dict[str, Any] = {}
        for name in scenarios:
            try:
                done[name] = {"checks": SCENARIOS[name](tool, env)}
            except NotExpressible as why:
                done[name] = {"notExpressible": str(why)}
            except Exception as exc:  # one scenario's failure is reported, the others still run
                done[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        result["scenarios"] = done
        torn: dict[str, Any] = {}
        for mode in (("ideal",) if with_ideal else ()) + teardowns:
            try:
                torn[mode] = (teardown_manifestwork(tool, env) if mode == "manifestwork"
                              else teardown(tool, env, mode))
            except Exception as exc:
                torn[mode] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        result["teardowns"] = torn
        # After everything, in the tool's steady state (not while it starts its informers): its memory, then
        # DELETE latency with it and without it, alternating.
        if env.pid is not None:
            result["memoryKiB"] = rss_kib(env.pid)
        result["deleteLatency"] = measure_latency(tool, env, deletes=deletes, rounds=rounds)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:600]
        if env is not None and env.process is not None:
            result["toolLogTail"] = env.process.tail(15)
    finally:
        if env is not None:
            with contextlib.suppress(Exception):
                tool.stop(env)
        if client is not None:
            client.close()
        plane.stop()
    return result


def make_tool(name: str) -> Tool | BuildFailure:
    if name == "none":
        return Tool()
    if name == "criticalsvc":
        tool = Criticalsvc()
        tool.version = tool.version_of()
        return tool
    built = ensure_built(PEERS[name])
    if isinstance(built, BuildFailure):
        return built
    return Crossplane(built) if name == "crossplane" else Kyverno(built)


# --- the table ---------------------------------------------------------------------------------------

def _verdict(checks: list[dict[str, Any]], kind: str) -> str:
    mine = [c for c in checks if c["kind"] == kind]
    if not mine:
        return "-"
    return "yes" if all(c["ok"] for c in mine) else "NO"


def render(results: list[dict[str, Any]]) -> str:
    lines = ["| tool | scenario | refuses what it must | allows what it may | replays |",
             "|---|---|---|---|---|"]
    for r in results:
        if "scenarios" not in r:
            lines.append(f"| {r['tool']} | - | {r.get('build') or r.get('error') or '-'} | | |")
        for name, s in (r.get("scenarios") or {}).items():
            if "checks" in s:
                c = s["checks"]
                lines.append(f"| {r['tool']} | {name} | {_verdict(c, 'refuse')} | {_verdict(c, 'allow')} | "
                             f"{_verdict(c, 'replay')} |")
            else:
                lines.append(f"| {r['tool']} | {name} | n/a: {s.get('notExpressible') or s.get('error')} | | |")
    ideal = next((r["teardowns"]["ideal"].get("wallSeconds") for r in results
                  if "ideal" in (r.get("teardowns") or {})), None)
    lines += ["", "| tool | teardown | completes | safe order | seconds | × ideal | refused | left |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for mode, t in (r.get("teardowns") or {}).items():
            if "error" in t:
                lines.append(f"| {r['tool']} | {mode} | error: {t['error']} | | | | | |")
                continue
            ratio = f"{t['wallSeconds'] / ideal:.1f}" if ideal and t["wallSeconds"] else "-"
            lines.append(f"| {r['tool']} | {mode} | {'yes' if t['complete'] else 'NO'} | "
                         f"{'yes' if not t['orderViolations'] else 'NO'} | {t['wallSeconds'] or '-'} | {ratio} | "
                         f"{t['refusedByWebhooks']} | {', '.join(t['left']) or '-'} |")
    lines += ["", "| tool | ManifestWork teardown: the agent's DELETEs (sent: deleted/gone/forgotten on 409/failed) "
              "| the agent's sync errors | ManifestWork gone after (s) | left when the ManifestWork was gone |",
              "|---|---|---|---|---|"]
    for r in results:
        t = (r.get("teardowns") or {}).get("manifestwork") or {}
        if "agent" not in t:
            continue
        a = t["agent"]
        left = t["leftWhenManifestWorkGone"]
        gone = t["manifestWorkGoneSeconds"]
        lines.append(f"| {r['tool']} | {a['sent']}: {a['deleted']}/{a['gone']}/{a['forgotten']}/{a['failed']} | "
                     f"{a['syncErrors']} | {gone if gone is not None else 'never (still there at the end)'} | "
                     f"{(', '.join(left) or '-') if left is not None else '-'} |")
    lines += ["", "| tool | DELETE p50/p99 ms, 1 deleter: none / tool | 8 deleters: none / tool | RSS MiB (peak) |",
              "|---|---|---|---|"]
    for r in results:
        lat = r.get("deleteLatency")
        if not lat:
            lines.append(f"| {r['tool']} | {r.get('error') or r.get('build') or '-'} | | |")
            continue
        mem = r.get("memoryKiB") or {}
        memory = f"{mem['VmRSS'] / 1024:.0f} ({mem['VmHWM'] / 1024:.0f})" if mem else "-"
        pair = {k: f"{v['p50Ms']}/{v['p99Ms']}" for k, v in lat.items() if isinstance(v, dict)}
        note = f" (webhooks seen during a `none` round: {', '.join(lat['noneRoundsWithWebhooks'])})" \
            if lat.get("noneRoundsWithWebhooks") else ""
        lines.append(f"| {r['tool']} | {pair['none1']} / {pair['tool1']} | {pair['none8']} / {pair['tool8']} | "
                     f"{memory}{note} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks peers", description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=("run", "build"), default="run")
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--deletes", type=int, default=60, help="DELETEs per latency round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="latency rounds per mode (tool, none) and concurrency (default: %(default)s)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--teardowns", default=",".join(TEARDOWNS), help="comma-separated (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--keep", type=Path, help="keep each tool's run directory (logs) under this directory")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    names = [n for n in args.tools.split(",") if n]
    unknown = [n for n in names if n not in TOOLS]
    if unknown:
        parser.error(f"--tools: unknown {', '.join(unknown)} (known: {', '.join(TOOLS)})")
    scenarios = tuple(n for n in args.scenarios.split(",") if n)
    teardowns = tuple(n for n in args.teardowns.split(",") if n)
    for flag, asked, known in (("--scenarios", scenarios, tuple(SCENARIOS)), ("--teardowns", teardowns, TEARDOWNS)):
        if set(asked) - set(known):
            parser.error(f"{flag}: unknown {', '.join(sorted(set(asked) - set(known)))} (known: {', '.join(known)})")
    if args.action == "build":
        worst = 0
        for name in names:
            if name in PEERS:
                built = ensure_built(PEERS[name])
                shown = built if isinstance(built, Path) else f"FAILED: {built.command}\n{built.error}"
                print(f"{name}: {shown}")
                worst = max(worst, int(isinstance(built, BuildFailure)))
        return worst
    from tests.realcluster import build

    reason = build.missing_toolchain() if build.cached(build.selected_minor()) is None else None
    if reason is not None:
        print(json.dumps({"skipped": reason}))
        return 0
    binaries = build.ensure_built(build.selected_minor())
    results: list[dict[str, Any]] = []
    for name in names:
        tool = make_tool(name)
        if isinstance(tool, BuildFailure):
            status = f"not built: `{tool.command}`: {tool.error.splitlines()[-1]}" if tool.command else tool.error
            results.append({"tool": name, "build": status, "buildError": tool.error})
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix=f"bench-peers-{name}-") as tmp:
            directory = args.keep / name if args.keep else Path(tmp)
            if args.keep:
                shutil.rmtree(directory, ignore_errors=True)
            results.append(run_tool(tool, binaries, directory, deletes=args.deletes, rounds=args.rounds,
                                    with_ideal=name == "none", scenarios=scenarios, teardowns=teardowns))
    section = {"kubernetes": binaries.kubernetes_version, "results": results}
    if args.out:
        args.out.write_text(json.dumps(section, indent=2))
    print(render(results))
    if args.json:
        print(json.dumps(section))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
