"""Real scale: the gate cold-started on a real control plane holding 10,000 namespaces and 100,000 objects.

    python -m benchmarks realscale [--namespaces 10000] [--objects 100000] [--pods 1000] [--services 1000]
                                   [--victims 500] [--stacks 100] [--replicas 2] [--small-fraction 0.1]
                                   [--idle-seconds 30] [--no-inprocess] [--json]

Issue 21, part 3. Not part of CI (minutes of loading); flags shrink it for a smoke run, e.g.
`--namespaces 200 --objects 2000 --pods 40 --services 20 --victims 40 --stacks 3 --idle-seconds 10`.

Starts its own control plane (tests/realcluster: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok and its fake Nodes, so pods run), applies the install as a user does, and then
measures the gate at three sizes of one cluster, each grown from the one before (`Layout`: every
object of a smaller size is an object of the larger one):

    empty     the install only (no CriticalService): the baseline RSS
    small     --small-fraction of everything below (0 skips it)
    full      --namespaces namespaces `scale-<n>`; --objects ConfigMaps spread evenly over them (each
              namespace's first one carries a finalizer, half are labelled tier=backend, two in three
              say data.state=active); --pods pods spread over them, scheduled to kwok's Nodes and Running;
              --services CriticalServices, each protecting a 0-replica Deployment `provider` in its own
              namespace, in four kinds by index: a Finalizer criterion on ConfigMaps with a CEL
              condition; a SpecificResource criterion (a named ConfigMap); a Resources criterion on
              ConfigMaps with a label selector and a CEL condition; a Resources criterion on Pods with a
              CEL condition on status.phase plus one on the namespace's ConfigMaps. --victims
              unprotected 0-replica Deployments in `scale-victims`.

Loading is benchmarks/loader (Go, 32 concurrent creates with the admin's certificate; the shipped
webhook configuration is taken away while the CriticalServices are created, since no gate is running
then to review them, and put back before the gate starts): its time is the API server's cost, printed
apart. At each size the gate (`criticalsvc serve --kubeconfig`, as tests/realcluster/gate.py starts
it) is started cold - --replicas of them behind the loopback Service stand-in, one after another - and
reported: time from process start to /readyz 200 per replica, RSS (VmRSS) per replica at ready and after
the run, the objects it caches (criticalsvc_cache_objects, summed), and the API-server requests per
second it makes while idle, in two windows of --idle-seconds after ready (the first holds the
status writer's first pass). Requests are counted from kube-apiserver's audit log, which the control
plane writes for the gate's ServiceAccount alone (tests/realcluster/controlplane.py AUDIT_POLICY):
apiserver_request_total has no user or user-agent label to filter by.

Bytes per cached object are live, from RSS (no tracemalloc endpoint exists in the gate): the RSS growth
of replica 0 at ready over the empty cluster's, divided by the growth of its cached objects; and the
same between small and full (the marginal cost, without the fixed cost of starting the watches).

At the full size only: decision latency while --victims DELETEs of unprotected Deployments (allowed)
and as many dry-run DELETEs of protected providers (refused) are sent by 4 concurrent clients - the
gate's own histograms criticalsvc_cache_decision_duration_seconds and criticalsvc_decision_duration_seconds
from /metrics, both replicas summed, as benchmarks/realcluster.py reads them - and a --stacks teardown
of the reference story (tests/realcluster/teardown.py: applied 8 at a time, then every stack deleted
at once by a retrying deleter each, the finalizer controller played by one thread), with the gate's
requests per second during it.

Then, with the control plane stopped, the same points in-process: `benchmarks.scale.memory_per_object`
(tracemalloc bytes per cached object) and `benchmarks.scale.sweep` (decide() p50/p99 with --services
CriticalServices and as many cached objects), and `python -m benchmarks coldstart --objects N` (start
to ready against the in-process stand-in, in its own process).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from .realcluster import WEBHOOK_CONFIGURATION, _deployment, _gate_body, _gate_view, go_binary

HERE = Path(__file__).resolve().parent
LOADER_MODULE = HERE / "loader"
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
VICTIMS_NAMESPACE = "scale-victims"
FINALIZER_PREFIX = "scale.criticalsvc.io/hold-"
ACTIVE = "has(object.data) && has(object.data.state) && object.data.state == 'active'"
RUNNING = "object.status.phase in ['Pending', 'Running']"
WORKER_LABELS = {"app": "scale-worker"}
READY_TIMEOUT = 900.0
# The gate may read what the CriticalServices name (the aggregated reader role a user adds).
READER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "criticalsvc-read-scale", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
    "rules": [{"apiGroups": [""], "resources": ["configmaps", "pods"], "verbs": ["get", "list", "watch"]}],
}


# --- the cluster's shape (pure) --------------------------------------------------------------------------
@attrs.frozen
class Layout:
    """How many of each; object i of a kind lives in namespace i * namespaces // count of the full size, so
    the objects of `scaled(f)` are the first ones of each kind of the full size, in the same places (and,
    when f times each count is whole, in its own namespaces only)."""

    namespaces: int
    configmaps: int
    pods: int
    services: int
    victims: int = 0
    # (namespaces, configmaps, pods, services) of the size whose spread this one keeps; None: its own.
    spread: tuple[int, int, int, int] | None = None

    def scaled(self, fraction: float) -> Layout:
        def part(n: int) -> int:
            return math.floor(n * fraction + 1e-9)

        return Layout(part(self.namespaces), part(self.configmaps), part(self.pods), part(self.services),
                      part(self.victims), spread=self._spread)

    @property
    def _spread(self) -> tuple[int, int, int, int]:
        return self.spread or (self.namespaces, self.configmaps, self.pods, self.services)

    @property
    def total(self) -> int:
        """Objects created: namespaces, ConfigMaps, pods, CriticalServices with their providers, victims (and
        their namespace)."""
        return self.namespaces + self.configmaps + self.pods + 2 * self.services + self.victims + (self.victims > 0)

    def _home(self, index: int, kind: int) -> int:
        spread = self._spread
        return index * spread[0] // spread[kind]

    def configmap(self, j: int) -> tuple[str, dict[str, Any]]:
        n = self._home(j, 1)
        namespaces, configmaps = self._spread[:2]
        k = j - -(-n * configmaps // namespaces)  # its index within namespace n
        metadata: dict[str, Any] = {"name": f"cm-{k}", "labels": {"app.kubernetes.io/part-of": "scale",
                                                                  "tier": "backend" if k % 2 == 0 else "frontend"}}
        if k == 0:
            metadata["finalizers"] = [f"{FINALIZER_PREFIX}{n}"]
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
                "data": {"state": "idle" if k % 3 == 2 else "active", "owner": f"team-{n % 97}"}}
        return f"/api/v1/namespaces/{namespace(n)}/configmaps", body

    def pod(self, k: int) -> tuple[str, dict[str, Any]]:
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"worker-{k}", "labels": WORKER_LABELS},
                "spec": {"containers": [{"name": "c", "image": "registry.example/worker:1"}]}}
        return f"/api/v1/namespaces/{namespace(self._home(k, 2))}/pods", body

    def service_namespace(self, i: int) -> str:
        return namespace(self._home(i, 3))

    def provider(self, i: int) -> tuple[str, dict[str, Any]]:
        return f"/apis/apps/v1/namespaces/{self.service_namespace(i)}/deployments", _deployment("provider")

    def provider_path(self, i: int) -> str:
        return f"{self.provider(i)[0]}/provider"

    def critical_service(self, i: int) -> tuple[str, dict[str, Any]]:
        ns = self.service_namespace(i)
        configmaps = {"group": "", "resource": "configmaps"}
        backend = {"matchLabels": {"tier": "backend"}}
        criteria: list[dict[str, Any]]
        if i % 4 == 0:
            hold = f"{FINALIZER_PREFIX}{ns.removeprefix('scale-')}"
            criteria = [{"type": "Finalizer", "condition": ACTIVE, "finalizer": {**configmaps, "finalizerName": hold}}]
        elif i % 4 == 1:
            criteria = [{"type": "SpecificResource",
                         "specificResource": {**configmaps, "namespace": ns, "name": "cm-0"}}]
        elif i % 4 == 2:
            criteria = [{"type": "Resources", "condition": ACTIVE,
                         "resources": {**configmaps, "namespace": ns, "selector": backend}}]
        else:
            criteria = [{"type": "Resources", "condition": RUNNING,
                         "resources": {"group": "", "resource": "pods", "namespace": ns}},
                        {"type": "Resources", "resources": {**configmaps, "namespace": ns}}]
        body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": f"scale-{i}"},
                "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": ns, "name": "provider"},
                         "criteria": criteria}}
        return CRITICAL_SERVICES, body

    def victim(self, v: int) -> tuple[str, dict[str, Any]]:
        return f"/apis/apps/v1/namespaces/{VICTIMS_NAMESPACE}/deployments", _deployment(f"victim-{v}")

    def victim_path(self, v: int) -> str:
        return f"{self.victim(v)[0]}/victim-{v}"

    # What to create to grow `before` into this layout, in waves (each needs the one before).
    def namespaces_from(self, before: Layout) -> Iterator[tuple[str, dict[str, Any]]]:
        for n in range(before.namespaces, self.namespaces):
            yield "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace(n)}}
        if self.victims and not before.victims:
            yield "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                         "metadata": {"name": VICTIMS_NAMESPACE}}

    def objects_from(self, before: Layout) -> Iterator[tuple[str, dict[str, Any]]]:
        for j in range(before.configmaps, self.configmaps):
            yield self.configmap(j)
        for i in range(before.services, self.services):
            yield self.provider(i)
        for v in range(before.victims, self.victims):
            yield self.victim(v)

    def pods_from(self, before: Layout) -> Iterator[tuple[str, dict[str, Any]]]:
        """Last of the objects: a pod needs its namespace's default ServiceAccount, which a controller makes."""
        for k in range(before.pods, self.pods):
            yield self.pod(k)

    def services_from(self, before: Layout) -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(before.services, self.services):
            yield self.critical_service(i)


def namespace(n: int) -> str:
    return f"scale-{n}"


EMPTY = Layout(0, 0, 0, 0, 0)


# --- arithmetic (pure) --------------------------------------------------------------------------------------
def bytes_per_object(rss_kib: tuple[int, int], objects: tuple[int, int]) -> int | None:
    """RSS growth per object between two (smaller, larger) points: (KiB, KiB) and (objects, objects)."""
    grown = objects[1] - objects[0]
    if grown <= 0:
        return None
    return round((rss_kib[1] - rss_kib[0]) * 1024 / grown)


def per_second(counts: Counter[str], seconds: float) -> dict[str, float]:
    """Each count as a rate over `seconds`, most frequent first, and their sum under "total"."""
    rates = {key: round(n / seconds, 2) for key, n in counts.most_common()}
    return {"total": round(sum(counts.values()) / seconds, 2), **rates}


def quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- the control plane side -----------------------------------------------------------------------------------
class Loader:
    """benchmarks/loader (Go): POSTs what it is given, 32 at a time, with the admin's certificate."""

    def __init__(self, plane: Any, directory: Path, workers: int = 32) -> None:
        self.plane, self.log, self.workers = plane, directory / "loader.log", workers
        self.binary = go_binary(LOADER_MODULE)

    def create(self, items: Iterable[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        pki = self.plane.pki
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                [str(self.binary), "-server", self.plane.url, "-ca", str(pki.ca_cert), "-cert", str(pki.admin_cert),
                 "-key", str(pki.admin_key), "-workers", str(self.workers)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
            assert process.stdin is not None and process.stdout is not None
            try:
                for path, body in items:
                    process.stdin.write(json.dumps({"path": path, "body": body}, separators=(",", ":")) + "\n")
                process.stdin.close()
                out = process.stdout.read()
                process.wait(timeout=60)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        try:
            done: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise RuntimeError(f"the loader exited {process.returncode} without a result (see {self.log})") from None
        if done["errors"]:
            raise RuntimeError(f"the loader failed {done['errors']} creates; the first: {done['firstError']}")
        return done


def load(cluster: Env, layout: Layout, before: Layout) -> dict[str, Any]:
    """Create what grows `before` into `layout`; the CriticalServices with the shipped webhook configuration
    taken away (no gate runs to review their CREATE) and put back after. Waits for every pod to run."""
    client = cluster.admin
    started = time.perf_counter()
    waves = [cluster.loader.create(items) for items in (layout.namespaces_from(before), layout.objects_from(before),
                                                         layout.pods_from(before))]
    saved = client.get(WEBHOOK_CONFIGURATION)
    assert saved is not None, "the install's ValidatingWebhookConfiguration is missing"
    assert client.delete(WEBHOOK_CONFIGURATION).status_code == 200
    try:
        waves.append(cluster.loader.create(layout.services_from(before)))
    finally:
        created = client.create("/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
                                _gate_body(saved))
        assert created.status_code == 201, created.text
    created_seconds = time.perf_counter() - started
    running = wait_running(client, layout.pods)
    seconds = time.perf_counter() - started
    created_count = sum(w["created"] for w in waves)
    return {"created": created_count, "existed": sum(w["existed"] for w in waves),
            "retries": sum(w["retries"] for w in waves), "createSeconds": round(created_seconds, 1),
            "createsPerSecond": round(created_count / created_seconds) if created_seconds else None,
            "podsRunning": running, "secondsUntilPodsRun": round(seconds, 1)}


def wait_running(client: Any, pods: int, timeout: float = 900) -> int:
    """Poll until `pods` pods labelled app=scale-worker are Running (kwok plays their kubelet)."""
    deadline = time.monotonic() + timeout
    running = 0
    while True:
        page = client.request("GET", "/api/v1/pods", params={
            "labelSelector": "app=scale-worker", "fieldSelector": "status.phase=Running"}).json()
        running = len(page.get("items") or [])
        if running >= pods or time.monotonic() > deadline:
            return running
        time.sleep(2)


def add_nodes(cluster: Env, pods: int) -> int:
    """More kwok Nodes like the plane's own (1,000 pods each), so `pods` pods all fit; waits until they are
    Ready and untainted. Returns how many Nodes there are."""
    from tests.realcluster.controlplane import KWOK_ANNOTATION, KWOK_NODE_RESOURCES

    per_node = int(KWOK_NODE_RESOURCES["pods"])
    wanted = max(1, -(-pods // per_node))
    names = [f"kwok-scale-{n}" for n in range(1, wanted)]
    for name in names:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {KWOK_ANNOTATION: "fake"},
                             "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok"}},
                "status": {"capacity": KWOK_NODE_RESOURCES, "allocatable": KWOK_NODE_RESOURCES}}
        created = cluster.admin.create("/api/v1/nodes", node)
        assert created.status_code == 201, created.text

    def untainted(name: str) -> bool:
        node = cluster.admin.get(f"/api/v1/nodes/{name}") or {}
        ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        return bool(ready) and ready[0]["status"] == "True" and not node.get("spec", {}).get("taints")

    from tests.realcluster.teardown import wait_for

    for name in names:
        wait_for(lambda n=name: untainted(n), timeout=120, what=f"the Node {name} Ready and untainted")
    return wanted


@attrs.define
class Env:
    plane: Any  # tests.realcluster.controlplane.ControlPlane
    gate: Any  # tests.realcluster.gate.InstalledGate
    admin: Any  # tests.realcluster.client.Client
    loader: Loader


def _rss_kib(process: Any) -> int:
    with open(f"/proc/{process.popen.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {process.name}")


def _cached(metrics_text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in metrics_text.splitlines():
        if line.startswith("criticalsvc_cache_objects{"):
            head, _, value = line.rpartition(" ")
            resource = head.split('resource="', 1)[1].split('"', 1)[0]
            out[resource] = out.get(resource, 0) + int(float(value))
    return out


def start_gate(cluster: Env, replicas: int) -> list[dict[str, Any]]:
    """Start `replicas` replicas cold, one after another; per replica: seconds to ready and RSS then."""
    gate = cluster.gate
    gate.replicas.clear()
    out = []
    if replicas == 1:
        started = time.perf_counter()
        gate.replicas.append(gate.replica(0).start(timeout=READY_TIMEOUT))
        out.append({"readySeconds": round(time.perf_counter() - started, 2)})
    else:
        from tests.realcluster.loadbalancer import LoadBalancer

        gate.balancer = LoadBalancer(gate.port).start()
        for _ in range(replicas):
            started = time.perf_counter()
            gate.add_replica(timeout=READY_TIMEOUT)
            out.append({"readySeconds": round(time.perf_counter() - started, 2)})
    for entry, replica in zip(out, gate.replicas, strict=True):
        entry["name"] = replica.process.name
        entry["rssMiBAtReady"] = round(_rss_kib(replica.process) / 1024, 1)
        entry["rssKiBAtReady"] = _rss_kib(replica.process)
    return out


def stop_gate(cluster: Env) -> None:
    cluster.gate.stop()
    cluster.gate.replicas.clear()


def gate_requests_between(audit_log: Path, start: float, end: float) -> Counter[str]:
    """The gate's requests received in [start, end) (Unix times), counted by "VERB resource"."""
    from tests.realcluster.controlplane import gate_requests

    def key(r: dict[str, str]) -> str:
        return f"{r['verb']} {r['resource'] or 'discovery'}"

    # All since `end` is a subset of all since `start` when read in this order (the log only grows).
    later = Counter(key(r) for r in gate_requests(audit_log, since=end))
    return Counter(key(r) for r in gate_requests(audit_log, since=start)) - later


def _cpu_seconds(process: Any) -> float:
    """User + system CPU time the process has used (/proc/PID/stat fields 14 and 15, in clock ticks)."""
    import os

    fields = Path(f"/proc/{process.popen.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle(cluster: Env, seconds: float) -> dict[str, Any]:
    """The gate's API requests per second in two windows of `seconds` right after ready; over the second,
    each replica's CPU share and the serving loop's lag (the gate's own histograms)."""
    replicas = cluster.gate.replicas
    t0 = time.time()
    time.sleep(seconds)
    t1 = time.time()
    cpu_before = [_cpu_seconds(r.process) for r in replicas]
    metrics_before = "\n".join(r.metrics() for r in replicas)
    time.sleep(seconds)
    t2 = time.time()
    cpu = [round(100 * (_cpu_seconds(r.process) - b) / (t2 - t1), 1) for r, b in zip(replicas, cpu_before, strict=True)]
    view = _gate_view(metrics_before, "\n".join(r.metrics() for r in replicas))
    time.sleep(1)  # the audit log is written as requests complete
    first = gate_requests_between(cluster.plane.audit_log, t0, t1)
    second = gate_requests_between(cluster.plane.audit_log, t1, t2)
    return {"windowSeconds": seconds, "firstWindowPerSecond": per_second(first, t1 - t0),
            "secondWindowPerSecond": per_second(second, t2 - t1), "secondWindowCpuPercent": cpu,
            "secondWindowLoopLagP99Ms": view.get("loopLagP99Ms"),
            "secondWindowLoopLagOnCpuP99Ms": view.get("loopLagOnCpuP99Ms")}


def stage(cluster: Env, name: str, layout: Layout, before: Layout, *, replicas: int,
          idle_seconds: float) -> dict[str, Any]:
    print(f"   realscale: {name}: loading {layout}", file=sys.stderr, flush=True)
    loaded = load(cluster, layout, before) if layout != before else {"created": 0}
    print(f"   realscale: {name}: loaded {loaded}; starting the gate", file=sys.stderr, flush=True)
    gates = start_gate(cluster, replicas)
    cached = _cached(cluster.gate.replicas[0].metrics())
    print(f"   realscale: {name}: ready {gates}, caching {sum(cached.values())}", file=sys.stderr, flush=True)
    quiet = idle(cluster, idle_seconds)
    for entry, replica in zip(gates, cluster.gate.replicas, strict=True):
        entry["rssMiBAfterIdle"] = round(_rss_kib(replica.process) / 1024, 1)
    print(f"   realscale: {name}: idle {quiet}", file=sys.stderr, flush=True)
    return {"layout": attrs.asdict(layout), "objects": layout.total, "load": loaded, "replicas": gates,
            "cachedObjects": sum(cached.values()), "cachedByResource": cached, "idleRequests": quiet}


def decisions(cluster: Env, layout: Layout, concurrency: int = 4) -> dict[str, Any]:
    """DELETE every victim (allowed) and as many providers with dryRun (refused), interleaved, from
    `concurrency` clients; the clients' latencies and the gate's own histograms over the run."""
    from tests.realcluster.client import Client

    replicas = cluster.gate.replicas
    local = threading.local()
    clients: list[Any] = []
    lock = threading.Lock()
    outcomes: Counter[str] = Counter()
    samples: dict[str, list[float]] = {"allowed": [], "refused": []}

    def client() -> Any:
        if getattr(local, "client", None) is None:
            local.client = Client(cluster.plane.admin_kubeconfig)
            with lock:
                clients.append(local.client)
        return local.client

    def one(k: int) -> None:
        if k % 2 == 0:
            kind, path, params, want = "allowed", layout.victim_path(k // 2), None, 200
        else:
            kind, want = "refused", 403
            path, params = layout.provider_path((k // 2 * 7919) % layout.services), {"dryRun": "All"}
        started = time.perf_counter()
        status = client().delete(path, params=params).status_code
        elapsed = time.perf_counter() - started
        with lock:
            samples[kind].append(elapsed)
            outcomes[f"{kind}: {status}" + ("" if status == want else " (unexpected)")] += 1

    before = "\n".join(r.metrics() for r in replicas)
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(2 * layout.victims)))
    seconds = time.perf_counter() - started
    after = "\n".join(r.metrics() for r in replicas)
    for c in clients:
        c.close()
    client_view = {f"{kind}P{q}Ms": round(1000 * quantile(xs, q / 100), 1)
                   for kind, xs in samples.items() if xs for q in (50, 99)}
    return {"deletes": sum(outcomes.values()), "seconds": round(seconds, 1), "outcomes": dict(outcomes),
            "clientLatency": client_view, "gateView": _gate_view(before, after)}


def releases(cluster: Env, layout: Layout, *, timeout: float = 60) -> dict[str, Any]:
    """For one CriticalService of each of the first three kinds, take away what protects its provider, then
    DELETE the provider with dryRun until the gate allows it, and five times more: each ALLOW of a protected
    provider is confirmed on fresh reads (criticalsvc/live.py), so these time the confirmation at this size.
    Kind 0's Finalizer criterion makes it LIST every ConfigMap of the cluster; kind 1 GETs one; kind 2 LISTs
    one namespace's by label."""
    client = cluster.admin
    out: dict[str, Any] = {}
    for kind, what in ((0, "Finalizer on ConfigMaps, with a condition"), (1, "SpecificResource, a ConfigMap"),
                       (2, "Resources: ConfigMaps of a namespace by label, with a condition")):
        i = next((i for i in range(layout.services - 1, -1, -1) if i % 4 == kind), None)
        if i is None:
            continue
        base = f"/api/v1/namespaces/{layout.service_namespace(i)}/configmaps"
        names = [item["metadata"]["name"] for item in (client.get(base) or {}).get("items", [])]
        if kind == 1:
            client.merge_patch(f"{base}/cm-0", {"metadata": {"finalizers": None}})
            assert client.delete(f"{base}/cm-0").status_code in (200, 202)
        else:
            for name in names:
                assert client.merge_patch(f"{base}/{name}", {"data": {"state": "idle"}}).status_code == 200
        released = time.perf_counter()
        answers: list[tuple[int, float, str, float]] = []  # status, seconds, body, seconds since released
        while time.perf_counter() - released < timeout:
            started = time.perf_counter()
            response = client.delete(layout.provider_path(i), params={"dryRun": "All"})
            now = time.perf_counter()
            answers.append((response.status_code, now - started, response.text[:300], now - released))
            if response.status_code == 200 and len([a for a in answers if a[0] == 200]) >= 5:
                break
            if response.status_code != 200:
                time.sleep(0.5)
        allowed = [a for a in answers if a[0] == 200]
        out[f"kind{kind}"] = {
            "criteria": what, "service": f"scale-{i}",
            "allowedAfterSeconds": round(allowed[0][3], 2) if allowed else None,
            "allowedDeleteMs": [round(1000 * a[1], 1) for a in allowed],
            "refusals": len(answers) - len(allowed),
            "lastRefusal": next((a[2] for a in reversed(answers) if a[0] != 200), "")}
        print(f"   realscale: release kind {kind}: {out[f'kind{kind}']}", file=sys.stderr, flush=True)
    return out


def teardown(cluster: Env, stacks: int) -> dict[str, Any]:
    """`stacks` reference stories applied (8 at a time), then all torn down at once; wall time, what the
    deleters saw, and the gate's requests and decisions meanwhile."""
    from tests.realcluster.client import Client
    from tests.realcluster.teardown import RepeatingDeleter, SharedFinalizerController, Story, apply_story

    stories = [Story.make(f"s{i}") for i in range(stacks)]
    started = time.perf_counter()

    def apply(story: Story) -> None:
        for attempt in range(3):
            try:
                apply_story(cluster.plane.kubectl, cluster.admin, story, timeout=180)
                return
            except AssertionError:
                if attempt == 2:
                    raise

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(apply, stories))
    applied = time.perf_counter() - started
    print(f"   realscale: {stacks} stacks applied in {applied:.1f} s; tearing down", file=sys.stderr, flush=True)
    clients = [Client(cluster.plane.admin_kubeconfig) for _ in stories]
    deleters = [RepeatingDeleter(c, s.paths()) for c, s in zip(clients, stories, strict=True)]
    shared = Client(cluster.plane.admin_kubeconfig)
    controller = SharedFinalizerController(shared, stories)
    timeout = 60 + 3 * stacks
    done: list[bool] = []
    before = "\n".join(r.metrics() for r in cluster.gate.replicas)
    wall_start = time.time()
    t0 = time.perf_counter()
    workers = [threading.Thread(target=lambda d=d: done.append(d.run(timeout=timeout)), daemon=True)
               for d in deleters]
    controller.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout + 30)
    wall = time.perf_counter() - t0
    wall_end = time.time()
    controller.stop()
    after = "\n".join(r.metrics() for r in cluster.gate.replicas)
    time.sleep(1)
    requests = gate_requests_between(cluster.plane.audit_log, wall_start, wall_end)
    for c in [*clients, shared]:
        c.close()
    statuses = Counter(a.status for d in deleters for a in d.attempts)
    return {"stacks": stacks, "appliedSeconds": round(applied, 1), "completed": sum(done),
            "wallSeconds": round(wall, 1), "deletesSent": sum(statuses.values()),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "gateRequestsPerSecond": per_second(requests, wall), "gateView": _gate_view(before, after)}


def run_real(layout: Layout, *, small_fraction: float, replicas: int, idle_seconds: float, stacks: int,
             keep: Path | None) -> dict[str, Any]:
    from tests.realcluster import build
    from tests.realcluster.client import Client
    from tests.realcluster.controlplane import ControlPlane
    from tests.realcluster.gate import install

    if build.cached(build.selected_minor()) is None and (reason := build.missing_toolchain()) is not None:
        return {"skipped": reason}
    binaries = build.ensure_built(build.selected_minor())
    go_binary(LOADER_MODULE)  # built before the control plane starts
    with tempfile.TemporaryDirectory(prefix="bench-realscale-") as tmp:
        directory = keep or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        plane = ControlPlane(binaries, directory, workloads=True)
        gate = admin = None
        result: dict[str, Any] = {"kubernetes": binaries.kubernetes_version}
        try:
            plane.start()
            gate = install(plane, directory / "gate")
            admin = Client(plane.admin_kubeconfig)
            done = plane.kubectl("apply", "-f", "-", input=json.dumps(READER_ROLE))
            assert done.returncode == 0, done.stderr
            cluster = Env(plane, gate, admin, Loader(plane, directory))
            result["nodes"] = add_nodes(cluster, layout.pods + 2 * stacks + 50)
            stages: dict[str, Any] = {}
            sizes = [("empty", EMPTY)]
            if 0 < small_fraction < 1:
                sizes.append(("small", layout.scaled(small_fraction)))
            sizes.append(("full", layout))
            before = EMPTY
            for name, size in sizes:
                stages[name] = stage(cluster, name, size, before, replicas=replicas, idle_seconds=idle_seconds)
                before = size
                if name == "small":  # at the full size, after the decisions (they expect every provider protected)
                    stages[name]["releases"] = releases(cluster, size)
                if name != "full":
                    stop_gate(cluster)
            full = stages["full"]
            full["decisions"] = decisions(cluster, layout)
            print(f"   realscale: decisions {full['decisions']}", file=sys.stderr, flush=True)
            full["releases"] = releases(cluster, layout)
            if stacks:
                full["teardown"] = teardown(cluster, stacks)
                print(f"   realscale: teardown {full['teardown']}", file=sys.stderr, flush=True)
            for entry, replica in zip(full["replicas"], gate.replicas, strict=True):
                entry["rssMiBAfterRun"] = round(_rss_kib(replica.process) / 1024, 1)
            result["stages"] = stages
            result["bytesPerCachedObject"] = _per_object(stages)
            return result
        finally:
            if admin is not None:
                admin.close()
            if gate is not None:
                gate.stop()
            plane.stop()


def _per_object(stages: dict[str, Any]) -> dict[str, Any]:
    def point(name: str) -> tuple[int, int]:
        s = stages[name]
        return s["replicas"][0]["rssKiBAtReady"], s["cachedObjects"]

    out: dict[str, Any] = {"method": "RSS (VmRSS) growth of replica 0 at ready / growth of its cached objects"}
    pairs = [("emptyToFull", "empty", "full"), ("smallToFull", "small", "full")]
    for key, a, b in pairs:
        if a in stages and b in stages:
            (ra, oa), (rb, ob) = point(a), point(b)
            out[key] = bytes_per_object((ra, rb), (oa, ob))
    return out


# --- the same points in-process ---------------------------------------------------------------------------------
def manifests(layout: Layout) -> list[Any]:
    """Every object the benchmark creates for `layout`, as the gate's in-process state builder takes them
    (criticalsvc.snapshot.build_state): namespaced as its path says, each with a uid."""
    from criticalsvc.manifests import Manifest

    out = []
    for path, body in [*layout.namespaces_from(EMPTY), *layout.objects_from(EMPTY), *layout.pods_from(EMPTY),
                       *layout.services_from(EMPTY)]:
        obj = {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(out)}"}}
        if "/namespaces/" in path:
            obj["metadata"]["namespace"] = path.split("/namespaces/")[1].split("/")[0]
        out.append(Manifest(obj, f"generated: document {len(out) + 1}"))
    return out


def status_pass(services: int, passes: int = 3) -> dict[str, Any]:
    """The leader's status pass (compute_status for every CriticalService, criticalsvc/statuswriter.py) over
    `services` CriticalServices of this benchmark's kinds, each namespace holding 10 ConfigMaps: CPU ms per
    pass, the fastest of `passes` after a first one. It ran on the event loop without a pause until the pass
    was sliced (statuswriter.LOOP_SLICE)."""
    from criticalsvc.snapshot import build_state
    from criticalsvc.status import compute_status

    state = build_state(manifests(Layout(services, 10 * services, services, services)))
    timings = []
    for _ in range(passes + 1):
        started = time.perf_counter()
        for cs in state.critical_services():
            compute_status(cs, state, now=time.time())
        timings.append(time.perf_counter() - started)
    return {"services": services, "msPerPass": round(1000 * min(timings[1:]), 1),
            "msPerPassFirst": round(1000 * timings[0], 1)}


def run_inprocess(layout: Layout) -> dict[str, Any]:
    from . import scale

    statuses = status_pass(layout.services)
    print(f"   realscale: in-process status pass {statuses}", file=sys.stderr, flush=True)
    memory = scale.memory_per_object(layout.configmaps)
    print(f"   realscale: in-process {memory['bytesPerObject']} B per cached object", file=sys.stderr, flush=True)
    services = max(1, layout.services)
    crs = 10 * services
    filler = max(0, layout.total - crs)
    [swept] = scale.sweep([(services, crs, filler)], decisions=5000, rounds=5, seed=0)
    done = subprocess.run([sys.executable, "-m", "benchmarks", "coldstart", "--objects", str(layout.configmaps),
                           "--load-budget", "600", "--json"], stdout=subprocess.PIPE, text=True, check=False)
    try:
        coldstart = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        coldstart = {"error": f"exit {done.returncode}, no JSON result"}
    return {"memory": memory, "decide": swept, "coldstart": coldstart, "statusPass": statuses}


# --- the report -----------------------------------------------------------------------------------------------
def table(result: dict[str, Any]) -> list[str]:
    """One markdown table: a row per figure, a column per size and one for in-process."""
    stages = result.get("stages", {})
    names = [n for n in ("empty", "small", "full") if n in stages]
    inproc = result.get("inprocess", {})
    rows: list[tuple[str, list[Any], Any]] = []

    def col(f: Any) -> list[Any]:
        out = []
        for n in names:
            try:
                out.append(f(stages[n]))
            except (KeyError, IndexError, TypeError):
                out.append("")
        return out

    def replicas(key: str) -> Any:
        return lambda s: " / ".join(str(r[key]) for r in s["replicas"] if key in r)

    rows.append(("objects created (ns / ConfigMaps / pods / CriticalServices)",
                 col(lambda s: f"{s['layout']['namespaces']} / {s['layout']['configmaps']} / "
                               f"{s['layout']['pods']} / {s['layout']['services']}"), ""))
    rows.append(("load: creates, seconds (creates/s)",
                 col(lambda s: f"{s['load']['created']}, {s['load']['createSeconds']} s "
                               f"({s['load']['createsPerSecond']}/s)"), ""))
    cold = inproc.get("coldstart", {})
    rows.append(("objects the gate caches", col(lambda s: s["cachedObjects"]), cold.get("watchedObjectsCached", "")))
    rows.append(("time to ready, s (per replica)", col(replicas("readySeconds")), cold.get("startToReadySeconds", "")))
    rows.append(("RSS at ready, MiB (per replica)", col(replicas("rssMiBAtReady")), cold.get("peakRSSMiB", "")))
    rows.append(("RSS after idle (-> after the run), MiB (per replica)",
                 col(lambda s: " / ".join(f"{r.get('rssMiBAfterIdle')}" + (f" -> {r['rssMiBAfterRun']}"
                                                                            if "rssMiBAfterRun" in r else "")
                                          for r in s["replicas"])), ""))
    per = result.get("bytesPerCachedObject", {})
    rows.append(("bytes per cached object (live RSS; empty->full, small->full)",
                 [""] * (len(names) - 1) + [f"{per.get('emptyToFull')}, {per.get('smallToFull')}"],
                 f"{inproc.get('memory', {}).get('bytesPerObject', '')} (tracemalloc)"))
    rows.append(("gate's API requests/s idle, first window (then second)",
                 col(lambda s: f"{s['idleRequests']['firstWindowPerSecond']['total']} "
                               f"({s['idleRequests']['secondWindowPerSecond']['total']})"), ""))
    rows.append(("idle (second window): CPU % per replica; loop lag p99 ms (on CPU)",
                 col(lambda s: f"{' / '.join(str(c) for c in s['idleRequests']['secondWindowCpuPercent'])}; "
                               f"{s['idleRequests']['secondWindowLoopLagP99Ms']} "
                               f"({s['idleRequests']['secondWindowLoopLagOnCpuP99Ms']})"), ""))
    decide = inproc.get("decide", {})
    rows.append(("decision p50 / p99 ms, cache only",
                 col(lambda s: f"{s['decisions']['gateView']['cacheDecisionP50Ms']} / "
                               f"{s['decisions']['gateView']['cacheDecisionP99Ms']}"),
                 f"{decide.get('p50us', 0) / 1000:.3f} / {decide.get('p99us', 0) / 1000:.3f} (decide())"
                 if decide else ""))
    rows.append(("decision p50 / p99 ms, all (live confirmations included)",
                 col(lambda s: f"{s['decisions']['gateView']['decisionP50Ms']} / "
                               f"{s['decisions']['gateView']['decisionP99Ms']}"), ""))
    rows.append(("client DELETE p50 / p99 ms: allowed, refused (dry run)",
                 col(lambda s: f"{s['decisions']['clientLatency']['allowedP50Ms']} / "
                               f"{s['decisions']['clientLatency']['allowedP99Ms']}, "
                               f"{s['decisions']['clientLatency']['refusedP50Ms']} / "
                               f"{s['decisions']['clientLatency']['refusedP99Ms']}"), ""))
    def released(s: dict[str, Any]) -> str:
        out = []
        for kind in ("kind0", "kind1", "kind2"):
            r = s["releases"].get(kind)
            if r is None:
                continue
            ms = sorted(r["allowedDeleteMs"])
            out.append(f"{ms[len(ms) // 2]}" if ms else "never allowed")
        return " / ".join(out)

    rows.append(("leader's status pass over every CriticalService, ms of CPU", [""] * len(names),
                 inproc.get("statusPass", {}).get("msPerPass", "")))
    rows.append(("provider DELETE allowed once released, p50 ms (live confirmation): Finalizer (LIST all "
                 "ConfigMaps) / SpecificResource / Resources", col(released), ""))
    rows.append(("teardown: stacks done / wall s / gate requests/s",
                 col(lambda s: f"{s['teardown']['completed']}/{s['teardown']['stacks']} / "
                               f"{s['teardown']['wallSeconds']} / {s['teardown']['gateRequestsPerSecond']['total']}"),
                 ""))
    lines = ["| | " + " | ".join(names) + " | in-process |", "|---" * (len(names) + 2) + "|"]
    for label, values, inp in rows:
        lines.append(f"| {label} | " + " | ".join(str(v) for v in values) + f" | {inp} |")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks realscale", description=__doc__.splitlines()[0])
    p.add_argument("--namespaces", type=int, default=10_000)
    p.add_argument("--objects", type=int, default=100_000, help="ConfigMaps (default: %(default)s)")
    p.add_argument("--pods", type=int, default=1000)
    p.add_argument("--services", type=int, default=1000, help="CriticalServices (default: %(default)s)")
    p.add_argument("--victims", type=int, default=500, help="unprotected Deployments deleted (default: %(default)s)")
    p.add_argument("--stacks", type=int, default=100, help="reference stories torn down at once (0: none)")
    p.add_argument("--replicas", type=int, default=2, help="gate replicas at the full size")
    p.add_argument("--small-fraction", type=float, default=0.1,
                   help="the intermediate size, a fraction of the full one (0: none)")
    p.add_argument("--idle-seconds", type=float, default=30.0, help="each of the two idle windows")
    p.add_argument("--no-inprocess", action="store_true", help="skip the in-process points")
    p.add_argument("--keep", type=Path, metavar="DIR", help="run in DIR and keep the logs")
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = p.parse_args(argv)
    if not (0 < args.services <= args.namespaces and args.namespaces <= args.objects and args.replicas >= 1):
        p.error("need 0 < --services <= --namespaces <= --objects and --replicas >= 1")
    layout = Layout(args.namespaces, args.objects, args.pods, args.services, args.victims)
    started = time.perf_counter()
    try:
        result = run_real(layout, small_fraction=args.small_fraction, replicas=args.replicas,
                          idle_seconds=args.idle_seconds, stacks=args.stacks, keep=args.keep)
    except (subprocess.CalledProcessError, RuntimeError) as exc:
        print(f"python -m benchmarks realscale: {exc}", file=sys.stderr)
        return 1
    result["realSeconds"] = round(time.perf_counter() - started, 1)
    if not args.no_inprocess and "skipped" not in result:
        result["inprocess"] = run_inprocess(layout)
    result["wallSeconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
        if "stages" in result:
            print("\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
