"""The gate's cost on a real control plane: DELETE latency through kube-apiserver, against the floor.

    python -m benchmarks realcluster [--objects 96] [--rounds 4] [--concurrency 1,8,32]
                                     [--churn-rate 300] [--no-teardown] [--json]
                                     [--cells protected,unprotected,decisions] [--services 10,1000]
                                     [--enforcing-creates 50] [--cluster-wide 3]

Starts its own control plane (tests/realcluster: etcd, kube-apiserver, kube-controller-manager built
from the Kubernetes Go modules; skipped with the reason when they cannot be built) with the gate
installed as a user installs it, and beside it the floor: benchmarks/noopwebhook, a validating
webhook written with Go's standard library that answers every review "allowed" over TLS, built like
the other test binaries into ~/.cache/criticalsvc/noopwebhook-<hash of its source>/.

The gate is sent only what may concern something protected (design/routing.md): the shipped
configuration `criticalsvc` routes CriticalServices and labelled objects, and the router's
`criticalsvc-providers` routes each provider. So there are two kinds of cells:

1. Protected cells (`--cells protected`): DELETE latency of a *protected* request, in three modes:
   `gate` (`criticalsvc` and `criticalsvc-providers` as the router wrote them), `floor` (copies of both -
   names, rules, selectors, matchConditions, timeouts, failurePolicy - pointed at the no-op) and `none`
   (no webhook). The object is a Deployment with 0 replicas labelled bench=protected in namespace `bench`:
   a selected provider of CriticalService `bench-guard`, whose one criterion (ConfigMap bench/blocker
   absent) is met. The API server routes it by the providers' matchCondition on oldObject's labels, and
   the gate answers ALLOW after its fresh read from the API server (server.py, `Confirm`): the answer
   every deletion of a provider ends with, and its most expensive one. The floor's no-op answers at once,
   so gate/floor is what the gate's review costs, fresh read included. `--objects` are created per round
   and deleted by `C` concurrent deleters (threads, one keep-alive connection each), for C in
   --concurrency; each C once without and once with background churn. Within one (C, churn) cell the
   modes alternate per round, in a rotating order, so that outside load (this machine is shared) lands
   on every mode alike. Reported per cell: p50/p99 of each mode and the ratios gate/floor and gate/none,
   measured in the same run.
   Outside `gate` the gate's replicas are stopped (SIGSTOP; Modes says why): the gate's CPU in `floor`
   mode is 0 now (before narrow routing it was its CPU watching, not called), and after each `gate`
   switch the gate first catches up with the watch events of the paused seconds (at 300 writes/s of
   churn, ~1,000 of them) - a cost the churn cells' `gate` rounds carry and a running gate would spread.
1b. Unprotected cells (`--cells unprotected`): with --services CriticalServices present (grown in turn,
   e.g. 10 then 1,000; benchmarks/population.py: named Deployment and ConfigMap providers, selected ones
   with a namespace, held updates), `--objects` Deployments and as many ConfigMaps are created per round
   in namespace `free`, which no CriticalService mentions, then the Deployments deleted and the ConfigMaps
   label-updated (merge patch) by C clients. Modes `gate` (both configurations), `none` and `none2` (no
   webhook, measured twice) alternate per round in a rotating order: gate/none is the gate's cost, none2/none
   the noise it is to be read against. Reported per cell: p50/p99 of DELETEs and of UPDATEs per mode, both
   ratios, the gate's criticalsvc_decisions_total summed over replicas across the timed requests of the
   `gate` rounds (0: not one reached it), and kube-apiserver's own CPU per request (process_cpu_seconds_total
   from its /metrics, 10 ms resolution, over the timed requests of each mode), and its own mean time per
   matchCondition evaluation, per webhook (apiserver_admission_match_condition_evaluation_seconds, sum over
   count: its buckets start at 1 ms).
   Routing at scale (benchmarks/routingscale.py), with these cells: per population the stored size of
   `criticalsvc-providers` and the time to create it all and see every CriticalService Enforcing; after the
   last, --enforcing-creates CREATEs timed one by one to Ready=Enforcing; then --cluster-wide selectors
   without a namespace, and what status (RoutedNarrowly) and criticalsvc_broad_routes say.
1c. Decision cells (`--cells decisions`): with --services CriticalServices present (grown in turn, as in
   1b), dry-run DELETEs (dryRun=All: nothing is deleted, nothing written) of two Deployments in `bench`: one
   selected by `bench-guard`, whose criterion is met (the gate allows it after its confirmation), one
   selected by `bench-hold`, whose criterion is not (ConfigMap bench/holder exists: refused from the caches).
   --objects of each per round (the allowed ones, then the refused ones), sent by C clients; modes `gate`,
   `floor` (the no-op allowing) and
   `floor-deny` (a second no-op started with -deny, answering 403) alternate per round in a rotating order,
   so the allowed cell is gate against floor and the refused cell gate against floor-deny, measured in the
   same run. Every answer's status is checked against the mode. Reported per cell: p50/p99 of each, gate/floor
   ratios, gate minus floor at p50, and the machine's 1-minute load average over the cell (it is shared).
2. Churn: `--churn-rate` writes per second (open loop; benchmarks/churn, a Go client with the admin's
   certificate, built like the no-op: a Python client reached only 50-75 a second here) of what a
   busy cluster makes the gate watch: ConfigMaps created, updated and deleted in a namespace that a CriticalService's
   criterion names with a CEL condition (so the gate decodes each and evaluates the condition), and
   Deployments of a type the gate watches updated. The achieved rate is reported: on a loaded
   machine it may fall short of the asked one.
3. The gate's own view per protected cell, from its /metrics (deltas over the cell): decision p50/p99 (all, and
   those answered from the caches alone), the event-loop lag p99 and the part of it the gate was on
   the CPU (the rest is the OS not running it: this machine is shared), full-collection pauses, and
   the API server's
   apiserver_admission_webhook_admission_duration_seconds for the gate's and the floor's webhooks; and
   each process's CPU (the gate, the floor, kube-apiserver, from /proc) while each mode's DELETEs were
   sent: the share of one core it used and its CPU microseconds per DELETE (`cpu`). A share near 1.0
   for the gate would say its single event loop is the limit; the gate's us/DELETE in `gate` mode
   minus its own in `floor` mode (watching only) is what answering the reviews costs it.
4. With --profile-cell C: py-spy (--nonblocking, 100 Hz) on the gate during the churn cell of C
   deleters, folded into inclusive shares of the gate's parts (reviews, watch events, CEL, status
   and Events, logging, HTTP, TLS) and the hottest frames (`gateProfile`).
5. Unless --no-teardown: the reference story's teardown wall time, applied, then deleted all at
   once by the repeating client (every refused DELETE re-sent, 0.5 s between passes) with the test
   finalizer controller.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import contextlib
import copy
import hashlib
import json
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

HERE = Path(__file__).resolve().parent
NOOP_MODULE = HERE / "noopwebhook"
CHURN_MODULE = HERE / "churn"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
WEBHOOK_CONFIGURATION = f"{WEBHOOKS}/criticalsvc"
FLOOR_CONFIGURATION_NAME = "criticalsvc-floor"
DURATION_METRIC = "apiserver_admission_webhook_admission_duration_seconds"
MODES = ("gate", "floor", "none")
CHURN_NAMESPACE, BENCH_NAMESPACE = "churn", "bench"
CHURN_WORKERS = 20  # Deployments updated by the churn
# The protected cells' Deployments: selected providers of CriticalService BENCH_GUARD, whose criterion is met.
PROTECTED_LABELS = {"bench": "protected"}
BENCH_GUARD = {
    "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "bench-guard"},
    "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": BENCH_NAMESPACE,
                          "selector": {"matchLabels": PROTECTED_LABELS}},
             "criteria": [{"type": "SpecificResource", "specificResource": {
                 "resource": "configmaps", "namespace": BENCH_NAMESPACE, "name": "blocker"}}]},
}
# The decision cells' refused provider: selected by CriticalService BENCH_HOLD, whose criterion is unmet while
# ConfigMap bench/holder exists (it is created with the cells and never deleted).
HELD_LABELS = {"bench": "held"}
BENCH_HOLD = {
    "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "bench-hold"},
    "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": BENCH_NAMESPACE,
                          "selector": {"matchLabels": HELD_LABELS}},
             "criteria": [{"type": "SpecificResource", "specificResource": {
                 "resource": "configmaps", "namespace": BENCH_NAMESPACE, "name": "holder"}}]},
}
DECISION_MODES = ("gate", "floor", "floor-deny")
FREE_NAMESPACE = "free"  # no CriticalService mentions it
UNPROTECTED_MODES = ("gate", "none", "none2")
POPULATIONS = (10, 1000)


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear within a bucket."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / (count - below) if count > below else 0)
        lower, below = upper, count
    return lower


def histograms(metrics_text: str, metric: str, *, label: str = "") -> dict[str, dict[float, float]]:
    """Cumulative buckets of histogram `metric` in a Prometheus text page, summed per value of `label`
    (all series under "" when no label is given): {label value: {upper bound: count}}."""
    out: dict[str, dict[float, float]] = {}
    pattern = re.compile(rf'^{re.escape(metric)}_bucket\{{([^}}]*)\}} (\S+)$')
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        fields = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        upper = float("inf") if fields["le"] == "+Inf" else float(fields["le"])
        per = out.setdefault(fields.get(label, "") if label else "", {})
        per[upper] = per.get(upper, 0.0) + float(match.group(2))
    return out


def _delta(after: dict[float, float], before: dict[float, float] | None) -> list[tuple[float, float]]:
    return [(upper, count - (before or {}).get(upper, 0.0)) for upper, count in after.items()]


def _ms(buckets: list[tuple[float, float]], q: float) -> float | None:
    if not buckets or max(count for _, count in buckets) == 0:
        return None
    return round(1000 * histogram_quantile(buckets, q), 2)


def webhook_durations(metrics_text: str, *, suffixes: tuple[str, ...] = ("gate.criticalsvc.io",)) -> dict[str, Any]:
    """Per webhook name ending in one of `suffixes`: count, mean and estimated p50/p99 (ms) of the API
    server's admission calls."""
    per: dict[str, dict[str, Any]] = {}
    pattern = re.compile(rf'^{DURATION_METRIC}_(bucket|sum|count)\{{([^}}]*)\}} (\S+)$')
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        kind, labels, value = match.groups()
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if not fields.get("name", "").endswith(suffixes):
            continue
        entry = per.setdefault(fields["name"], {"buckets": {}, "sum": 0.0, "count": 0.0})
        if kind == "bucket":
            upper = float("inf") if fields["le"] == "+Inf" else float(fields["le"])
            entry["buckets"][upper] = entry["buckets"].get(upper, 0.0) + float(value)
        else:
            entry[kind] += float(value)
    out = {}
    for name, entry in sorted(per.items()):
        buckets = list(entry["buckets"].items())
        out[name] = {"calls": int(entry["count"]),
                     "meanMs": round(1000 * entry["sum"] / entry["count"], 2) if entry["count"] else None,
                     "p50Ms": round(1000 * histogram_quantile(buckets, 0.5), 2),
                     "p99Ms": round(1000 * histogram_quantile(buckets, 0.99), 2)}
    return out


# --- the floor: a no-op webhook in Go -------------------------------------------------------------------
def go_binary(module: Path) -> Path:
    """A Go module of ours under benchmarks/ built into the cache beside the control plane's binaries,
    once per source (~/.cache/criticalsvc/<name>-<hash of go.mod and main.go>/<name>)."""
    from tests.realcluster import build

    digest = hashlib.sha256()
    for name in ("go.mod", "main.go"):
        digest.update((module / name).read_bytes())
    target = build.cache_root().parent / f"{module.name}-{digest.hexdigest()[:12]}"
    binary = target / module.name
    if binary.is_file():
        return binary
    with build._building(None) as (_, say):
        if not binary.is_file():
            build._build(module, ["."], target, say=say, what=f"benchmarks/{module.name}", output=module.name)
    return binary


def noop_binary() -> Path:
    return go_binary(NOOP_MODULE)


@attrs.define
class Noop:
    """The no-op webhook's process; `calls()` reads how many reviews it answered."""

    process: Any  # tests.realcluster.controlplane.Process
    url: str
    ca_bundle: str
    ca_file: Path

    def calls(self) -> int:
        import httpx

        return int(httpx.get(f"{self.url}/calls", verify=self.tls(), timeout=5).text)

    def tls(self) -> ssl.SSLContext:
        """A client context trusting the no-op's CA (httpx deprecates a CA file path as `verify`)."""
        return ssl.create_default_context(cafile=str(self.ca_file))


@contextlib.contextmanager
def noop_webhook(directory: Path, *, deny: bool = False) -> Iterator[Noop]:
    from tests.realcluster.controlplane import Process, poll
    from tests.realcluster.gate import criticalsvc

    binary = noop_binary()
    directory.mkdir(parents=True, exist_ok=True)
    certs = directory / "certs"
    criticalsvc("certs", "--out", str(certs), "--san", "127.0.0.1")
    port_file = directory / "ports.json"
    process = Process("noopwebhook", [str(binary), "-listen", "127.0.0.1:0", "-tls-cert", str(certs / "tls.crt"),
                                      "-tls-key", str(certs / "tls.key"), "-port-file", str(port_file),
                                      *(["-deny"] if deny else [])],
                      directory / "noopwebhook.log")
    try:
        process.start()
        poll(port_file.exists, timeout=30, what="the no-op webhook to listen", alive=process.check_alive, interval=0.05)
        port = json.loads(port_file.read_text())["listen"]
        noop = Noop(process, f"https://127.0.0.1:{port}", base64.b64encode((certs / "ca.crt").read_bytes()).decode(),
                    certs / "ca.crt")
        poll(lambda: noop.calls() >= 0, timeout=30, what="the no-op webhook to answer", alive=process.check_alive)
        yield noop
    finally:
        process.stop()


def floor_configuration(gate_configuration: dict[str, Any], noop: Noop, *,
                        name: str = FLOOR_CONFIGURATION_NAME) -> dict[str, Any]:
    """The gate's ValidatingWebhookConfiguration with every webhook pointed at the no-op: the same
    rules, selectors, timeouts, failurePolicy and matchConditions, so the API server does the same work to
    call it."""
    body = copy.deepcopy({k: v for k, v in gate_configuration.items() if k != "status"})
    body["metadata"] = {"name": name}
    for webhook in body["webhooks"]:
        webhook["name"] = webhook["name"].replace(".gate.criticalsvc.io", ".floor.criticalsvc.io")
        path = re.sub(r"^https://[^/]+", "", webhook["clientConfig"].get("url", "")) or "/validate"
        webhook["clientConfig"] = {"url": noop.url + path, "caBundle": noop.ca_bundle}
    return body


class CpuMeter:
    """CPU seconds (user + system, /proc/PID/stat) that named processes used, and wall seconds, summed over
    the `with` blocks: e.g. the gate's, the floor's and kube-apiserver's CPU while DELETEs were sent."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.cpu = dict.fromkeys(pids, 0.0)
        self.wall = 0.0
        self._start: tuple[dict[str, float], float] | None = None

    def __enter__(self) -> CpuMeter:
        from benchmarks.latency import cpu_seconds

        self._start = ({n: cpu_seconds(p) for n, p in self.pids.items()}, time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        from benchmarks.latency import cpu_seconds

        assert self._start is not None
        before, started = self._start
        self.wall += time.perf_counter() - started
        for name, pid in self.pids.items():
            self.cpu[name] += cpu_seconds(pid) - before[name]

    def summary(self, deletes: int) -> dict[str, Any]:
        """Per process: CPU share of one core while deleting, and CPU microseconds per DELETE."""
        return {name: {"cpuShare": round(cpu / self.wall, 3) if self.wall else None,
                       "cpuUsPerDelete": round(cpu * 1e6 / deletes, 1) if deletes else None}
                for name, cpu in self.cpu.items()}


# --- switching modes --------------------------------------------------------------------------------------
@attrs.define
class Modes:
    """Registers exactly one mode's configurations and waits until the API server acts on them.

    `gate`: the shipped `criticalsvc` and the router's `criticalsvc-providers` as the router wrote it;
    `floor`: copies of both pointed at the no-op; `none`, `none2`: no configuration (two names for one mode,
    measured apart: their difference is the noise). Outside `gate` the gate's replicas are stopped (SIGSTOP)
    while their configurations are away: its router would otherwise re-create `criticalsvc-providers` (or
    fail without `criticalsvc`) and flip every CriticalService's status twice per switch. They are continued
    once both are back, byte for byte, so the router finds what it wrote (same probe digest) and changes
    nothing. A pause lasts one round (a few seconds), under the leader's renew deadline (10 s)."""

    client: Any
    gate_bodies: list[dict[str, Any]]  # criticalsvc first (the owner), then criticalsvc-providers
    floor_bodies: list[dict[str, Any]]
    noop: Noop
    probe: str  # a Deployment the gate protects: refused only while the gate is called
    gates: list[Any] = attrs.field(factory=list)  # the replicas' processes, stopped outside `gate`
    current: str = "gate"
    # `floor-deny`: copies pointed at the no-op started with -deny, the floor of a refusal (decision cells).
    deny_bodies: list[dict[str, Any]] = attrs.field(factory=list)
    deny_noop: Noop | None = None

    def use(self, saved: list[dict[str, Any]], denier: Noop) -> None:
        """The gate's configurations as stored now (criticalsvc first, then each shard of criticalsvc-providers),
        and the floors' copies of them."""

        def floor(c: dict[str, Any], noop: Noop, prefix: str) -> dict[str, Any]:
            rest = c["metadata"]["name"].removeprefix("criticalsvc")  # "", "-providers", "-providers-1" ...
            return floor_configuration(c, noop, name=f"{prefix}{rest}")

        self.gate_bodies = [stored_body(c) for c in saved]
        self.floor_bodies = [floor(c, self.noop, FLOOR_CONFIGURATION_NAME) for c in saved]
        self.deny_bodies = [floor(c, denier, f"{FLOOR_CONFIGURATION_NAME}-deny") for c in saved]

    def _bodies(self, mode: str) -> list[dict[str, Any]]:
        return {"gate": self.gate_bodies, "floor": self.floor_bodies, "floor-deny": self.deny_bodies}.get(mode, [])

    def _probe(self) -> int:
        status: int = self.client.delete(self.probe, params={"dryRun": "All"}).status_code
        return status

    def set(self, mode: str) -> None:
        import signal

        from tests.realcluster.teardown import wait_for

        if mode != self.current:
            if self.current == "gate":
                for p in self.gates:
                    p.signal(signal.SIGSTOP)
            for body in reversed(self._bodies(self.current)):  # the dependent before its owner
                deleted = self.client.delete(f"{WEBHOOKS}/{body['metadata']['name']}")
                assert deleted.status_code in (200, 404), deleted.text
            owner_uid = None
            for i, body in enumerate(self._bodies(mode)):
                body = copy.deepcopy(body)
                for ref in body["metadata"].get("ownerReferences", []):
                    ref["uid"] = owner_uid  # the owner was just re-created: the garbage collector checks its uid
                created = self.client.create(WEBHOOKS, body)
                assert created.status_code == 201, created.text
                if i == 0:  # criticalsvc, which owns every other
                    owner_uid = created.json()["metadata"]["uid"]
            if mode == "gate":
                for p in self.gates:
                    p.signal(signal.SIGCONT)
            self.current = mode

        def acting() -> bool:
            before = self.noop.calls()
            denier = self.deny_noop.calls() if self.deny_noop is not None else 0
            status = self._probe()
            noop_called = self.noop.calls() > before
            denied = self.deny_noop is not None and self.deny_noop.calls() > denier
            if mode == "gate":
                return status == 403 and not noop_called and not denied
            if mode == "floor-deny":
                return status == 403 and denied and not noop_called
            return status == 200 and noop_called == (mode == "floor") and not denied

        wait_for(acting, timeout=60, what=f"the API server to call {mode!r} only", interval=0.05)


def _gate_configurations(client: Any) -> list[dict[str, Any]]:
    """`criticalsvc`, then every shard of criticalsvc-providers the router has written, as stored now."""
    from criticalsvc.webhookconfigurations import CONFIGURATION_NAMES

    saved = [client.get(f"{WEBHOOKS}/{name}") for name in ("criticalsvc", *CONFIGURATION_NAMES)]
    assert saved[0] is not None, "criticalsvc"
    return [c for c in saved if c is not None]


def stored_body(saved: dict[str, Any]) -> dict[str, Any]:
    """A stored configuration as it can be created again: name, labels, ownerReferences and webhooks."""
    meta = saved["metadata"]
    body = {k: v for k, v in saved.items() if k not in ("status", "metadata")}
    body["metadata"] = {"name": meta["name"], "labels": meta.get("labels", {}),
                        **({"ownerReferences": meta["ownerReferences"]} if meta.get("ownerReferences") else {})}
    return body


def _gate_body(saved: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in saved.items() if k != "status"}
    body["metadata"] = {"name": saved["metadata"]["name"], "labels": saved["metadata"].get("labels", {})}
    return body


# --- deleters -----------------------------------------------------------------------------------------------
def _deployment(name: str, *, labels: dict[str, str] | None = None) -> dict[str, Any]:
    labels = labels or {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
            "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "registry.example/none:1"}]}}}}


class Deleters:
    """`concurrency` threads, each with its own client (one keep-alive connection)."""

    def __init__(self, kubeconfig: Path, concurrency: int) -> None:
        from tests.realcluster.client import Client

        self.local = threading.local()
        self.clients: list[Any] = []
        self.lock = threading.Lock()
        self.kubeconfig, self.client_type = kubeconfig, Client
        self.pool = concurrent.futures.ThreadPoolExecutor(concurrency, thread_name_prefix="deleter")

    def _client(self) -> Any:
        client = getattr(self.local, "client", None)
        if client is None:
            client = self.local.client = self.client_type(self.kubeconfig)
            with self.lock:
                self.clients.append(client)
        return client

    def round(self, count: int, tag: str, cpu: CpuMeter | None = None, *, namespace: str = BENCH_NAMESPACE,
              labels: dict[str, str] | None = None) -> list[float]:
        """Create `count` Deployments, then delete them; `cpu` (if given) meters the deleting only."""
        base = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        names = [f"{tag}-{i}" for i in range(count)]

        def create(name: str) -> None:
            response = self._client().create(base, _deployment(name, labels=labels))
            assert response.status_code == 201, response.text

        def delete(name: str) -> float:
            client = self._client()
            started = time.perf_counter()
            response = client.delete(f"{base}/{name}")
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            return elapsed

        list(self.pool.map(create, names))
        with cpu if cpu is not None else contextlib.nullcontext():
            return list(self.pool.map(delete, names))

    def dry_runs(self, paths: list[str]) -> list[tuple[str, float, int]]:
        """DELETE each path with dryRun=All (nothing is deleted, so the same objects serve every round):
        (path, seconds, HTTP status) each."""
        def one(path: str) -> tuple[str, float, int]:
            client = self._client()
            started = time.perf_counter()
            response = client.delete(path, params={"dryRun": "All"})
            return path, time.perf_counter() - started, response.status_code

        return list(self.pool.map(one, paths))

    def unprotected_round(self, count: int, tag: str, namespace: str,
                          around: Any = contextlib.nullcontext) -> tuple[list[float], list[float]]:
        """Create `count` Deployments and `count` ConfigMaps in `namespace`, then delete the Deployments and
        label-update the ConfigMaps (merge patch), inside `around()`; the two lists of latencies."""
        deployments = f"/apis/apps/v1/namespaces/{namespace}/deployments"
        configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
        names = [f"{tag}-{i}" for i in range(count)]

        def create(name: str) -> None:
            made = self._client().create(deployments, _deployment(name))
            assert made.status_code == 201, made.text
            made = self._client().create(configmaps, {"apiVersion": "v1", "kind": "ConfigMap",
                                                      "metadata": {"name": name}, "data": {"k": "v"}})
            assert made.status_code == 201, made.text

        def delete(name: str) -> float:
            started = time.perf_counter()
            response = self._client().delete(f"{deployments}/{name}")
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            return elapsed

        def update(name: str) -> float:
            started = time.perf_counter()
            response = self._client().merge_patch(f"{configmaps}/{name}", {"metadata": {"labels": {"touched": tag}}})
            elapsed = time.perf_counter() - started
            assert response.status_code == 200, response.text
            return elapsed

        list(self.pool.map(create, names))
        with around():
            deleted = list(self.pool.map(delete, names))
            updated = list(self.pool.map(update, names))
        for name in names:  # the ConfigMaps go untimed, so the next round starts from the same namespace
            self._client().delete(f"{configmaps}/{name}")
        return deleted, updated

    def close(self) -> None:
        self.pool.shutdown()
        for client in self.clients:
            client.close()


# --- churn ----------------------------------------------------------------------------------------------------
CHURN_READER_ROLE = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "criticalsvc-read-configmaps-bench", "labels": {"criticalsvc.io/aggregate-to-reader": "true"}},
    "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
}
CHURN_GUARD = {
    "apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "churn-guard"},
    "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": CHURN_NAMESPACE, "name": "guard"},
             "criteria": [
                 {"type": "Resources",
                  "resources": {"group": "", "resource": "configmaps", "namespace": CHURN_NAMESPACE},
                  "condition": "has(object.data) && has(object.data.state) && object.data.state == 'active'"},
                 {"type": "Resources", "resources": {"group": "apps", "resource": "deployments",
                                                     "namespace": CHURN_NAMESPACE,
                                                     "selector": {"matchLabels": {"app": "churn-worker"}}},
                  "condition": "object.spec.replicas > 0"}]},
}


def set_up_churn(cluster: Any, gate: Any) -> None:
    """The churn namespace, its guard, the worker Deployments, and a CriticalService whose criteria name
    ConfigMaps and Deployments there with CEL conditions; waits until the gate caches ConfigMaps."""
    from tests.realcluster.teardown import wait_for

    client = cluster.admin
    done = cluster.kubectl("apply", "-f", "-", input=json.dumps(CHURN_READER_ROLE))
    assert done.returncode == 0, done.stderr
    assert cluster.kubectl("create", "namespace", CHURN_NAMESPACE).returncode == 0
    base = f"/apis/apps/v1/namespaces/{CHURN_NAMESPACE}/deployments"
    assert client.create(base, _deployment("guard")).status_code == 201
    for i in range(CHURN_WORKERS):
        created = client.create(base, _deployment(f"worker-{i}", labels={"app": "churn-worker"}))
        assert created.status_code == 201, created.text
    wait_for(lambda: client.create("/apis/criticalsvc.io/v1alpha1/criticalservices", CHURN_GUARD).status_code == 201,
             timeout=60, what="the churn guard CriticalService to be created")
    wait_for(lambda: gate.metric("criticalsvc_cache_objects", resource="configmaps") > 0, timeout=60,
             what="the gate to cache ConfigMaps")


class Churn:
    """benchmarks/churn (Go) writing at `rate` per second with the admin's client certificate until stopped."""

    def __init__(self, plane: Any, rate: float, prefix: str, directory: Path) -> None:
        self.rate = rate
        pki = plane.pki
        self.process = subprocess.Popen(
            [str(go_binary(CHURN_MODULE)), "-server", plane.url, "-ca", str(pki.ca_cert), "-cert", str(pki.admin_cert),
             "-key", str(pki.admin_key), "-namespace", CHURN_NAMESPACE, "-prefix", prefix, "-rate", str(rate),
             "-workers", str(CHURN_WORKERS)],
            stdout=subprocess.PIPE, stderr=(directory / f"churn-{prefix}.log").open("wb"), text=True)

    def stop(self) -> dict[str, Any]:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        try:
            done = json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return {"askedPerSecond": self.rate,
                    "error": f"the churn exited {self.process.returncode} without a result"}
        seconds = done["seconds"] or 1.0
        return {"askedPerSecond": self.rate, "achievedPerSecond": round(done["writes"] / seconds, 1),
                "writes": done["writes"], "errors": done["errors"], "firstError": done["firstError"]}


# --- py-spy on the gate -----------------------------------------------------------------------------------
# Where the gate's samples go, inclusive: (label, a substring of a frame as py-spy prints it).
PROFILE_AREAS = (
    ("reviews: Webhook.review (read, decide, record, log)", "Webhook.review (criticalsvc/server.py"),
    ("  decide", "decide (criticalsvc/decision.py"),
    ("  the decision's log line", "Webhook._record (criticalsvc/server.py"),
    ("watch events: reflector, projection, CEL, indexes", "criticalsvc/cache/"),
    ("  CEL conditions", "criticalsvc/condition.py"),
    ("status writer and Events", "criticalsvc/statuswriter.py"),
    ("replayer", "criticalsvc/replayer.py"),
    ("webhook router", "criticalsvc/webhookrouter.py"),
    ("structlog (every log line)", "structlog/"),
    ("HTTP server: uvicorn + httptools", "uvicorn/"),
    ("API client: aiohttp", "aiohttp/"),
    ("TLS (ssl, sslproto)", "ssl"),
    ("prometheus_client", "prometheus_client/"),
    ("the lag probe", "probe_event_loop_lag"),
)


class Profiler:
    """py-spy recording the gate (--nonblocking: the gate is never paused) until stopped."""

    def __init__(self, pid: int, out: Path, rate: int = 100) -> None:
        beside = Path(sys.executable).parent / "py-spy"
        self.out = out
        self.process = subprocess.Popen([str(beside), "record", "--nonblocking", "--pid", str(pid), "--rate", str(rate),
                                         "--duration", "3600", "--format", "raw", "--output", str(out)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> dict[str, Any]:
        import signal

        self.process.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        try:
            _, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, err = self.process.communicate()
        if not self.out.exists():
            return {"error": f"py-spy wrote nothing (exit {self.process.returncode}): {err.strip()[-300:]}"}
        return fold_profile(self.out.read_text())


def fold_profile(raw: str) -> dict[str, Any]:
    """py-spy raw samples -> inclusive share per PROFILE_AREAS and the 15 hottest innermost frames."""
    from collections import Counter

    total = 0
    areas: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n, frames = int(count), stack.split(";")
        total += n
        innermost[frames[-1]] += n
        for label, marker in PROFILE_AREAS:
            if any(marker in f for f in frames):
                areas[label] += n
    if not total:
        return {"samples": 0}
    return {"samples": total,
            "inclusivePercent": {label: round(100 * areas[label] / total, 1) for label, _ in PROFILE_AREAS},
            "hottestFrames": [[frame, round(100 * n / total, 1)] for frame, n in innermost.most_common(15)]}


# --- one run ------------------------------------------------------------------------------------------------
def _summary(samples: list[float]) -> dict[str, Any]:
    return {"p50Ms": round(1000 * statistics.median(samples), 2), "p99Ms": round(1000 * _quantile(samples, 0.99), 2),
            "deletes": len(samples)}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b else float("nan")


def _gate_view(before: str, after: str) -> dict[str, Any]:
    """The gate's decision and event-loop-lag quantiles over what happened between two /metrics pages."""
    out: dict[str, Any] = {}
    for key, metric in (("decision", "criticalsvc_decision_duration_seconds"),
                        ("cacheDecision", "criticalsvc_cache_decision_duration_seconds"),
                        ("cacheDecisionCpu", "criticalsvc_cache_decision_cpu_seconds"),
                        ("loopLag", "criticalsvc_event_loop_lag_seconds"),
                        ("loopLagOnCpu", "criticalsvc_event_loop_lag_cpu_seconds")):
        a, b = histograms(after, metric).get(""), histograms(before, metric).get("")
        if a is None:
            continue
        buckets = _delta(a, b)
        out[f"{key}P50Ms"], out[f"{key}P99Ms"] = _ms(buckets, 0.5), _ms(buckets, 0.99)
        out[f"{key}Count"] = int(max(count for _, count in buckets))
    for generation, after_buckets in histograms(after, "criticalsvc_gc_pause_seconds", label="generation").items():
        buckets = _delta(after_buckets, histograms(before, "criticalsvc_gc_pause_seconds",
                                                   label="generation").get(generation))
        out[f"gcGen{generation}Count"] = int(max(count for _, count in buckets))
        out[f"gcGen{generation}P99Ms"] = _ms(buckets, 0.99)
    return out


def measure(cluster: Any, modes: Modes, *, concurrency: list[int], objects: int, rounds: int,
            churn_rate: float, directory: Path, profile_cell: int | None = None) -> list[dict[str, Any]]:
    gate = cluster.gate.replicas[0]
    assert gate.process.popen is not None and modes.noop.process.popen is not None
    assert cluster.plane.apiserver.popen is not None
    pids = {"gate": gate.process.popen.pid, "floor": modes.noop.process.popen.pid,
            "apiserver": cluster.plane.apiserver.popen.pid}
    cells = []
    for c in concurrency:
        deleters = Deleters(cluster.kubeconfig, c)
        try:
            for churning in (False, True):
                samples: dict[str, list[float]] = {m: [] for m in MODES}
                meters = {m: CpuMeter(pids) for m in MODES}
                churn = Churn(cluster.plane, churn_rate, f"c{c}", directory) if churning else None
                profiler = None
                if churning and c == profile_cell:
                    assert gate.process.popen is not None
                    profiler = Profiler(gate.process.popen.pid, directory / f"gate-profile-c{c}.txt")
                modes.set("gate")  # the gate runs (not stopped) while its /metrics are read
                gate_before = gate.metrics()
                try:
                    for r in range(rounds):
                        order = MODES[r % 3:] + MODES[:r % 3]
                        for mode in order:
                            modes.set(mode)
                            tag = f"c{c}-{'churn' if churning else 'quiet'}-{mode}-{r}"
                            samples[mode] += deleters.round(objects, tag, meters[mode], labels=PROTECTED_LABELS)
                finally:
                    churned = churn.stop() if churn is not None else None
                    profiled = profiler.stop() if profiler is not None else None
                modes.set("gate")
                gate_after = gate.metrics()
                cell: dict[str, Any] = {"concurrency": c, "churn": churning,
                                        **{m: _summary(s) for m, s in samples.items()}}
                g, f, n = cell["gate"], cell["floor"], cell["none"]
                cell["ratio"] = {"gateFloorP50": _ratio(g["p50Ms"], f["p50Ms"]),
                                 "gateFloorP99": _ratio(g["p99Ms"], f["p99Ms"]),
                                 "gateNoneP50": _ratio(g["p50Ms"], n["p50Ms"]),
                                 "gateNoneP99": _ratio(g["p99Ms"], n["p99Ms"])}
                cell["gateView"] = _gate_view(gate_before, gate_after)
                # Each process's CPU while the DELETEs of a mode were sent: the gate's in `gate` mode against
                # its own in `floor` mode (watching, not called) is what answering the reviews costs it;
                # the floor's in `floor` mode is the same for a Go webhook.
                cell["cpu"] = {m: meters[m].summary(len(samples[m])) for m in MODES}
                if churned is not None:
                    cell["churnWrites"] = churned
                if profiled is not None:
                    cell["gateProfile"] = profiled
                cells.append(cell)
                print(_row(cell), file=sys.stderr, flush=True)
        finally:
            deleters.close()
    return cells


def decisions_total(metrics_pages: list[str]) -> float:
    """criticalsvc_decisions_total summed over every series of every replica's /metrics page."""
    total = 0.0
    for page in metrics_pages:
        for line in page.splitlines():
            if line.startswith("criticalsvc_decisions_total"):
                total += float(line.rpartition(" ")[2])
    return total


def process_cpu_seconds(metrics_text: str) -> float:
    """process_cpu_seconds_total from a /metrics page (kube-apiserver's own)."""
    for line in metrics_text.splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    raise ValueError("no process_cpu_seconds_total")


MATCH_CONDITION_METRIC = "apiserver_admission_match_condition_evaluation_seconds"


def match_condition_seconds(metrics_text: str) -> dict[str, tuple[float, float]]:
    """kube-apiserver's own time evaluating each webhook's matchConditions (matchconditions/matcher.go observes
    every evaluation; its `name` label is the webhook's): {webhook name: (seconds, evaluations)}. Its buckets
    start at 1 ms, so the sum over the count (the mean) is what resolves an evaluation of microseconds."""
    out: dict[str, tuple[float, float]] = {}
    pattern = re.compile(rf'^{MATCH_CONDITION_METRIC}_(sum|count)\{{([^}}]*)\}} (\S+)$')
    for line in metrics_text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        kind, labels, value = match.groups()
        name = dict(re.findall(r'(\w+)="([^"]*)"', labels)).get("name", "")
        seconds, count = out.get(name, (0.0, 0.0))
        out[name] = (seconds + float(value), count) if kind == "sum" else (seconds, count + float(value))
    return out


def unprotected_summary(samples: dict[str, list[float]]) -> dict[str, Any]:
    """p50/p99 per mode, the gate/none ratios, and the noise: none2/none (the same mode measured twice,
    alternated with the others), which the gate's ratio should be within."""
    out: dict[str, Any] = {m: _summary(s) for m, s in samples.items()}
    g, n, n2 = out["gate"], out["none"], out["none2"]
    out["ratio"] = {"gateNoneP50": _ratio(g["p50Ms"], n["p50Ms"]), "gateNoneP99": _ratio(g["p99Ms"], n["p99Ms"]),
                    "none2NoneP50": _ratio(n2["p50Ms"], n["p50Ms"]),
                    "none2NoneP99": _ratio(n2["p99Ms"], n["p99Ms"])}
    return out


def measure_unprotected(cluster: Any, modes: Modes, *, services: int, concurrency: list[int], objects: int,
                        rounds: int) -> list[dict[str, Any]]:
    """With `services` CriticalServices present: DELETEs of unprotected Deployments and label UPDATEs of
    unprotected ConfigMaps in FREE_NAMESPACE, in modes gate, none and none2 alternated per round."""
    replicas = cluster.gate.replicas
    cells = []
    for c in concurrency:
        deleters = Deleters(cluster.kubeconfig, c)
        deletes: dict[str, list[float]] = {m: [] for m in UNPROTECTED_MODES}
        updates: dict[str, list[float]] = {m: [] for m in UNPROTECTED_MODES}
        apiserver_cpu = dict.fromkeys(UNPROTECTED_MODES, 0.0)
        moved = 0.0
        evaluated: dict[str, list[float]] = {}  # webhook -> [seconds, evaluations] over the timed requests
        try:
            for r in range(rounds):
                order = UNPROTECTED_MODES[r % 3:] + UNPROTECTED_MODES[:r % 3]
                for mode in order:
                    modes.set(mode)
                    counted: dict[str, float] = {}

                    @contextlib.contextmanager
                    def around(mode: str = mode, counted: dict[str, float] = counted,
                               evaluated: dict[str, list[float]] = evaluated) -> Iterator[None]:
                        # Read right around the timed requests: the mode switch's own probe (a refused
                        # dry-run DELETE) is a decision and comes before.
                        if mode == "gate":
                            counted["before"] = decisions_total([g.metrics() for g in replicas])
                        page = cluster.admin.request("GET", "/metrics").text
                        cpu, matched = process_cpu_seconds(page), match_condition_seconds(page)
                        yield
                        page = cluster.admin.request("GET", "/metrics").text
                        counted["cpu"] = process_cpu_seconds(page) - cpu
                        for name, (sec, n) in match_condition_seconds(page).items():
                            was = matched.get(name, (0.0, 0.0))
                            total = evaluated.setdefault(name, [0.0, 0.0])
                            total[0], total[1] = total[0] + sec - was[0], total[1] + n - was[1]
                        if mode == "gate":
                            counted["after"] = decisions_total([g.metrics() for g in replicas])

                    d, u = deleters.unprotected_round(objects, f"u{services}-c{c}-{mode}-{r}", FREE_NAMESPACE,
                                                      around)
                    deletes[mode] += d
                    updates[mode] += u
                    apiserver_cpu[mode] += counted["cpu"]
                    if mode == "gate":
                        moved += counted["after"] - counted["before"]
        finally:
            deleters.close()
        modes.set("gate")
        requests = 2 * objects * rounds
        cell = {"services": services, "concurrency": c, "deletes": unprotected_summary(deletes),
                "updates": unprotected_summary(updates), "gateDecisionsDuringGateRounds": moved,
                # kube-apiserver's own CPU (process_cpu_seconds_total, 10 ms resolution) per request
                "apiserverCpuUsPerRequest": {m: round(apiserver_cpu[m] * 1e6 / requests, 1)
                                             for m in UNPROTECTED_MODES},
                "apiserverMatchConditions": {name: {"evaluations": int(n), "meanUs": round(sec * 1e6 / n, 1)}
                                             for name, (sec, n) in sorted(evaluated.items()) if n}}
        cells.append(cell)
        print(_unprotected_row(cell), file=sys.stderr, flush=True)
        print(f"kube-apiserver's matchCondition evaluations: {json.dumps(cell['apiserverMatchConditions'])}",
              file=sys.stderr, flush=True)
    return cells


def measure_decisions(cluster: Any, modes: Modes, *, services: int, concurrency: list[int], requests: int,
                      rounds: int) -> list[dict[str, Any]]:
    """With `services` CriticalServices present: dry-run DELETEs of a protected provider whose criteria are met
    (allowed) and of one whose criterion is not (refused), `requests` of each per round and mode, sent by C
    clients, in modes gate, floor (the no-op allowing) and floor-deny (the no-op refusing) alternated per round
    in a rotating order. The allowed cell is gate against floor, the refused one gate against floor-deny."""
    base = f"/apis/apps/v1/namespaces/{BENCH_NAMESPACE}/deployments"
    allowed, refused = f"{base}/decisions-allowed", f"{base}/decisions-refused"
    expected = {"gate": {allowed: 200, refused: 403}, "floor": {allowed: 200, refused: 200},
                "floor-deny": {allowed: 403, refused: 403}}
    cells = []
    for c in concurrency:
        deleters = Deleters(cluster.kubeconfig, c)
        samples: dict[str, dict[str, list[float]]] = {m: {allowed: [], refused: []} for m in DECISION_MODES}
        load = []
        try:
            for r in range(rounds):
                for mode in DECISION_MODES[r % 3:] + DECISION_MODES[:r % 3]:
                    modes.set(mode)
                    load.append(_load_average())
                    # One kind after the other: the gate's refusals must not wait behind its confirmations.
                    for path in (allowed, refused):
                        for _path, seconds, status in deleters.dry_runs([path] * requests):
                            assert status == expected[mode][path], f"{mode}: DELETE {path}: {status}"
                            samples[mode][path].append(seconds)
        finally:
            deleters.close()
        modes.set("gate")
        gate_allowed, floor_allowed = _summary(samples["gate"][allowed]), _summary(samples["floor"][allowed])
        gate_refused, floor_refused = _summary(samples["gate"][refused]), _summary(samples["floor-deny"][refused])
        cell = {"services": services, "concurrency": c, "loadAverage1m": [min(load), max(load)],
                "allowed": {"gate": gate_allowed, "floor": floor_allowed,
                            "gateMinusFloorP50Ms": round(gate_allowed["p50Ms"] - floor_allowed["p50Ms"], 2),
                            "gateFloorP50": _ratio(gate_allowed["p50Ms"], floor_allowed["p50Ms"]),
                            "gateFloorP99": _ratio(gate_allowed["p99Ms"], floor_allowed["p99Ms"])},
                "refused": {"gate": gate_refused, "floorDeny": floor_refused,
                            "gateMinusFloorP50Ms": round(gate_refused["p50Ms"] - floor_refused["p50Ms"], 2),
                            "gateFloorP50": _ratio(gate_refused["p50Ms"], floor_refused["p50Ms"]),
                            "gateFloorP99": _ratio(gate_refused["p99Ms"], floor_refused["p99Ms"])}}
        cells.append(cell)
        print(_decision_row(cell), file=sys.stderr, flush=True)
    return cells


def _load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


DECISION_HEADER = ("| CriticalServices | deleters | load (1 min) | refused: gate p50/p99 ms | floor refusing | "
                   "gate/floor p50, p99 | allowed: gate p50/p99 ms | floor allowing | gate-floor p50 ms "
                   "| gate/floor p50, p99 |")


def _decision_row(cell: dict[str, Any]) -> str:
    a, f = cell["allowed"], cell["refused"]
    low, high = cell["loadAverage1m"]
    return (f"| {cell['services']} | {cell['concurrency']} | {low:g}-{high:g} "
            f"| {f['gate']['p50Ms']}/{f['gate']['p99Ms']} | {f['floorDeny']['p50Ms']}/{f['floorDeny']['p99Ms']} "
            f"| {f['gateFloorP50']}x, {f['gateFloorP99']}x "
            f"| {a['gate']['p50Ms']}/{a['gate']['p99Ms']} | {a['floor']['p50Ms']}/{a['floor']['p99Ms']} "
            f"| {a['gateMinusFloorP50Ms']} | {a['gateFloorP50']}x, {a['gateFloorP99']}x |")


UNPROTECTED_HEADER = ("| CriticalServices | clients | DELETE gate p50/p99 ms | none | none2 | gate/none p50, p99 "
                      "| none2/none p50, p99 | UPDATE gate p50/p99 ms | none | none2 | gate/none p50, p99 "
                      "| none2/none p50, p99 | gate decisions during | apiserver CPU us/request gate, none, none2 |")


def _unprotected_row(cell: dict[str, Any]) -> str:
    parts = [str(cell["services"]), str(cell["concurrency"])]
    for kind in ("deletes", "updates"):
        k = cell[kind]
        parts += [f"{k[m]['p50Ms']}/{k[m]['p99Ms']}" for m in UNPROTECTED_MODES]
        parts += [f"{k['ratio']['gateNoneP50']}x, {k['ratio']['gateNoneP99']}x",
                  f"{k['ratio']['none2NoneP50']}x, {k['ratio']['none2NoneP99']}x"]
    cpu = cell["apiserverCpuUsPerRequest"]
    parts += [f"{cell['gateDecisionsDuringGateRounds']:g}", ", ".join(str(cpu[m]) for m in UNPROTECTED_MODES)]
    return "| " + " | ".join(parts) + " |"


TABLE_HEADER = ("| deleters | churn (writes/s) | gate p50/p99 ms | floor p50/p99 ms | none p50/p99 ms | "
                "gate/floor p50 | gate/floor p99 | gate/none p50 | gate/none p99 | decision p99 ms (cache only) "
                "| loop lag p99 ms (on CPU) | gate CPU share, us/DELETE (floor's) |")


def _row(cell: dict[str, Any]) -> str:
    g, f, n, r, v, cpu = cell["gate"], cell["floor"], cell["none"], cell["ratio"], cell["gateView"], cell["cpu"]
    churn = f"{cell['churnWrites']['achievedPerSecond']}" if cell["churn"] else "none"
    return (f"| {cell['concurrency']} | {churn} | {g['p50Ms']}/{g['p99Ms']} | {f['p50Ms']}/{f['p99Ms']} "
            f"| {n['p50Ms']}/{n['p99Ms']} | {r['gateFloorP50']}x | {r['gateFloorP99']}x | {r['gateNoneP50']}x "
            f"| {r['gateNoneP99']}x | {v.get('decisionP99Ms')} ({v.get('cacheDecisionP99Ms')}) "
            f"| {v.get('loopLagP99Ms')} ({v.get('loopLagOnCpuP99Ms')}) "
            f"| {cpu['gate']['gate']['cpuShare']}, {cpu['gate']['gate']['cpuUsPerDelete']} "
            f"({cpu['floor']['floor']['cpuUsPerDelete']}) |")


def run(objects: int, rounds: int, concurrency: list[int], churn_rate: float, teardown: bool,
        profile_cell: int | None = None, keep: Path | None = None, *,
        kinds: tuple[str, ...] = ("protected", "unprotected"), populations: tuple[int, ...] = POPULATIONS,
        enforcing_creates: int = 50, cluster_wide: int = 3) -> dict[str, Any]:
    from benchmarks import population, routingscale
    from tests.realcluster import build
    from tests.realcluster.cluster import real_cluster
    from tests.realcluster.teardown import FinalizerController, RepeatingDeleter, Story, apply_story, wait_for

    reason = build.missing_toolchain() if build.cached(build.selected_minor()) is None else None
    if reason is not None:
        return {"skipped": reason}
    binaries = build.ensure_built(build.selected_minor())
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    noop_binary()  # built before the control plane starts, so a cold build does not count against it
    go_binary(CHURN_MODULE)
    with (contextlib.nullcontext(str(keep)) if keep is not None
          else tempfile.TemporaryDirectory(prefix="bench-realcluster-")) as tmp, \
            real_cluster(binaries, Path(tmp)) as cluster, noop_webhook(Path(tmp) / "noop") as noop, \
            noop_webhook(Path(tmp) / "noop-deny", deny=True) as denier:
        client = cluster.admin
        # A protected provider to probe whether the API server calls the gate, and the measured namespace.
        probe_story = Story.make("probe")
        apply_story(cluster.kubectl, client, probe_story)
        assert cluster.kubectl("create", "namespace", BENCH_NAMESPACE).returncode == 0
        set_up_churn(cluster, cluster.gate.replicas[0])
        wait_for(lambda: client.create("/apis/criticalsvc.io/v1alpha1/criticalservices", BENCH_GUARD).status_code
                 == 201, timeout=60, what="the bench guard CriticalService to be created")
        assert cluster.kubectl("create", "namespace", FREE_NAMESPACE).returncode == 0
        for ns in population.namespaces(max(populations, default=0)):
            assert cluster.kubectl("create", "namespace", ns).returncode == 0
        guards = [BENCH_GUARD]
        if "decisions" in kinds:
            guards.append(BENCH_HOLD)
            holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "holder"}}
            assert client.create(f"/api/v1/namespaces/{BENCH_NAMESPACE}/configmaps", holder).status_code == 201
            for name, labels in (("decisions-allowed", PROTECTED_LABELS), ("decisions-refused", HELD_LABELS)):
                created = client.create(f"/apis/apps/v1/namespaces/{BENCH_NAMESPACE}/deployments",
                                        _deployment(name, labels=labels))
                assert created.status_code == 201, created.text
            wait_for(lambda: client.create("/apis/criticalsvc.io/v1alpha1/criticalservices", BENCH_HOLD).status_code
                     == 201, timeout=60, what="the bench hold CriticalService to be created")
        routingscale.populate(cluster, guards)  # Enforcing: criticalsvc-providers written and live
        gates = [r.process for r in cluster.gate.replicas]
        modes = Modes(client, [], [], noop, probe_story.deployment_path, gates, deny_noop=denier)
        modes.use(_gate_configurations(client), denier)
        cells: list[dict[str, Any]] = []
        if "protected" in kinds:
            print(TABLE_HEADER, file=sys.stderr, flush=True)
            cells = measure(cluster, modes, concurrency=concurrency, objects=objects, rounds=rounds,
                            churn_rate=churn_rate, profile_cell=profile_cell, directory=keep or Path(tmp))
        unprotected: list[dict[str, Any]] = []
        decisions: list[dict[str, Any]] = []
        scale: dict[str, Any] = {}
        if "unprotected" in kinds or "decisions" in kinds:
            print(UNPROTECTED_HEADER if "unprotected" in kinds else DECISION_HEADER, file=sys.stderr, flush=True)
            have = 0
            for size in populations:
                modes.set("gate")
                grown = routingscale.populate(cluster, population.population(size)[have:])
                have = size
                # The configurations changed: what the modes restore is what the router wrote now.
                modes.use(_gate_configurations(client), denier)
                scale[str(size)] = {"populate": grown, "providersConfiguration": routingscale.live_size(cluster)}
                print(f"{size} CriticalServices: {json.dumps(scale[str(size)])}", file=sys.stderr, flush=True)
                if "unprotected" in kinds:
                    unprotected += measure_unprotected(cluster, modes, services=size, concurrency=concurrency,
                                                       objects=objects, rounds=rounds)
                if "decisions" in kinds:
                    decisions += measure_decisions(cluster, modes, services=size, concurrency=concurrency,
                                                   requests=objects, rounds=rounds)
            if populations and enforcing_creates:
                extra = [population.critical_service(i) for i in range(have, have + enforcing_creates)]
                scale["timeToEnforcing"] = {"present": have, **routingscale.time_to_enforcing(cluster, extra)}
                print(f"CREATE to Enforcing: {json.dumps(scale['timeToEnforcing'])}", file=sys.stderr, flush=True)
            if populations and cluster_wide:
                wide = [population.cluster_wide_service(j) for j in range(cluster_wide)]
                routingscale.populate(cluster, wide)
                scale["clusterWide"] = {"count": cluster_wide, **routingscale.broad(cluster, wide)}
                print(f"cluster-wide: {json.dumps(scale['clusterWide'])}", file=sys.stderr, flush=True)
        modes.set("gate")
        metrics = client.request("GET", "/metrics").text
        result: dict[str, Any] = {
            "kubernetes": binaries.kubernetes_version, "objectsPerRound": objects, "roundsPerMode": rounds,
            "cells": cells, "unprotectedCells": unprotected, "decisionCells": decisions, "routingScale": scale,
            "apiserverWebhookDuration": webhook_durations(
                metrics, suffixes=("gate.criticalsvc.io", "floor.criticalsvc.io"))}
        if not teardown:
            return result
        story = Story.make("bench")
        apply_story(cluster.kubectl, client, story)
        controller = FinalizerController(client, deployment_path=story.deployment_path,
                                         crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
        controller.start()
        deleter = RepeatingDeleter(client, story.paths())
        started = time.perf_counter()
        finished = deleter.run(timeout=180)
        wall = time.perf_counter() - started
        controller.stop()
        result["referenceStoryTeardown"] = {"completed": finished, "wallSeconds": round(wall, 2),
                                            "deletesSent": len(deleter.attempts),
                                            "refusedByGate": len(deleter.refused()),
                                            "retryIntervalSeconds": deleter.interval}
        return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks realcluster", description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=96, help="Deployments per round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per mode and cell (default: %(default)s)")
    parser.add_argument("--concurrency", default="1,8,32",
                        help="concurrent deleters, comma-separated (default: %(default)s)")
    parser.add_argument("--churn-rate", type=float, default=300.0,
                        help="background writes per second in the churn cells (default: %(default)s)")
    parser.add_argument("--no-teardown", action="store_true", help="skip the reference story's teardown")
    parser.add_argument("--profile-cell", type=int, metavar="C",
                        help="record the gate with py-spy (--nonblocking) during the churn cell of C deleters")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="run in DIR and keep it: the control plane's and the gate's logs, the py-spy samples")
    parser.add_argument("--cells", default="protected,unprotected",
                        help="which cells, comma-separated: protected, unprotected, decisions (dry-run DELETEs "
                             "refused and allowed against the no-op refusing and allowing, at each --services) "
                             "(default: %(default)s)")
    parser.add_argument("--services", default=",".join(map(str, POPULATIONS)),
                        help="CriticalServices present in the unprotected cells, grown in turn (default: %(default)s)")
    parser.add_argument("--enforcing-creates", type=int, default=50,
                        help="CREATEs timed to Ready=Enforcing after the last population (default: %(default)s)")
    parser.add_argument("--cluster-wide", type=int, default=3,
                        help="cluster-wide selectors added at the end, to see routing go broad (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    try:
        concurrency = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        print(f"python -m benchmarks realcluster: --concurrency {args.concurrency!r}: not comma-separated integers",
              file=sys.stderr)
        return 2
    try:
        result = run(args.objects, args.rounds, concurrency, args.churn_rate, not args.no_teardown,
                     profile_cell=args.profile_cell, keep=args.keep,
                     kinds=tuple(k for k in args.cells.split(",") if k),
                     populations=tuple(int(n) for n in args.services.split(",") if n),
                     enforcing_creates=args.enforcing_creates, cluster_wide=args.cluster_wide)
    except subprocess.CalledProcessError as exc:
        print(f"python -m benchmarks realcluster: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
        if result.get("cells"):
            print(TABLE_HEADER)
            for cell in result["cells"]:
                print(_row(cell))
        if result.get("unprotectedCells"):
            print(UNPROTECTED_HEADER)
            for cell in result["unprotectedCells"]:
                print(_unprotected_row(cell))
        if result.get("decisionCells"):
            print(DECISION_HEADER)
            for cell in result["decisionCells"]:
                print(_decision_row(cell))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
