"""Latency and throughput at load: the gate against a bare allow-all endpoint, same stack, same run.

    python -m benchmarks latency [--connections 1,4,16] [--duration 3] [--rounds 3] [--workloads protected,unprotected]
                                 [--services 20] [--crs 2000] [--log-level info] [--json]
                                 [--condition EXPR] [--provider-selector]
                                 [--event-loops auto|asyncio,uvloop] [--baseline DIR]

Both servers are separate processes on the same uvicorn + httptools stack with the same TLS
settings (criticalsvc.serving.Service, certificates from `criticalsvc certs --san 127.0.0.1`):

    gate   `criticalsvc serve --state SNAPSHOT` on a generated cluster (benchmarks.scale.cluster:
           --services operators with CRDs and CriticalServices, --crs CRs with finalizers; with
           --condition, every Finalizer criterion carries that CEL condition, and with
           --provider-selector every provider is chosen by its labels instead of its name)
    bare   the same Service around an app whose /validate reads the body, decodes it with orjson
           and answers allowed: true for its uid - everything but the decision, metrics and log line
           (like the gate's, its POST /validate goes past starlette's routing straight to the handler)

The load generator is wrk (Debian package `wrk`) over HTTPS keep-alive, posting a ~3 KB
AdmissionReview (api/examples/reviews/delete-provider.json, its oldObject filled out like a real
Deployment) with benchmarks/wrk/review.lua, which prints percentiles as JSON. Two workloads:

    protected     every request deletes op0's controller, a provider whose criteria do not hold: the
                  gate's most expensive answer (evaluate, deny, name the blockers, log the message)
    unprotected   every request deletes a Deployment no CriticalService names: the gate's most
                  common answer (the webhook sees every Deployment DELETE of the cluster)
 Debian's wrk has no rate control (that is wrk2), so the offered load is
varied by the number of connections (closed loop: each connection sends its next request when the
answer arrives); for each level the gate and the bare endpoint are measured back to back, --rounds
times, alternating which goes first; throughput and CPU are totals over the rounds, the percentiles
the median round's (see `combine`).

Comparisons in one run (the machine's load then falls on every variant alike): --event-loops
asyncio,uvloop runs a gate and a bare endpoint on each loop (`serve --event-loop`), and --baseline
DIR adds a gate served from another checkout of the code (e.g. `git archive main | tar -x -C DIR`),
so a change is measured against the code before it, round by round in a rotating order.

Reading it: the goal is gate p99 <= 1.25 x bare p99 and gate requests/s >= 0.8 x bare. Both servers
are single Python processes (one core each at most); on a 2-core machine wrk shares the CPU with
them, so absolute figures are lower than on a real node - the ratios are the point. Each run also
reads the server's CPU time from /proc: `cpuUsPerRequest` is CPU per answer, and at saturation
(`cpuShare` ~1.0) the throughput ratio is just bare CPU / gate CPU, so `cpuExtraUsPerRequest`
(gate - bare) is the gate's whole cost: decision, metrics, log line, and the bigger answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .report import emit

ROOT = Path(__file__).resolve().parents[1]
LUA = Path(__file__).resolve().parent / "wrk" / "review.lua"
EXAMPLE_REVIEW = ROOT / "api" / "examples" / "reviews" / "delete-provider.json"
P99_GOAL, THROUGHPUT_GOAL = 1.25, 0.8


# --- the bare endpoint (runs in its own process: python -m benchmarks latency --serve-bare DIR) --------
def serve_bare(workdir: Path, event_loop: str = "auto") -> int:
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from criticalsvc.metrics import Metrics
    from criticalsvc.serving import Endpoint, Service, TLSFiles, event_loop_factory

    class Bare:
        """Quacks like criticalsvc.server.Webhook for Service: allow-all /validate, /readyz."""

        def __init__(self) -> None:
            self.metrics = Metrics()

        async def validate(self, receive: Any) -> Response:
            chunks = []
            while True:  # as the gate reads a body (criticalsvc.server.Webhook._receive_body)
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    break
            review = orjson.loads(b"".join(chunks))
            body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "response": {"uid": review["request"]["uid"], "allowed": True}}
            return Response(orjson.dumps(body), media_type="application/json")

        async def readyz(self, request: Request) -> Response:
            return Response(b'{"ready":true}', media_type="application/json")

        def webhook_app(self) -> Any:
            # As the gate's (criticalsvc.server._WebhookFront): POST /validate past starlette's routing.
            rest = Starlette(routes=[Route("/readyz", self.readyz, methods=["GET"])])

            async def app(scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http" and scope["path"] == "/validate" and scope["method"] == "POST":
                    await (await self.validate(receive))(scope, receive, send)
                else:
                    await rest(scope, receive, send)

            return app

        def ops_app(self) -> Starlette:
            return Starlette(routes=[Route("/readyz", self.readyz, methods=["GET"])])

    service = Service(Bare(), listen=Endpoint("127.0.0.1", 0),  # type: ignore[arg-type]
                      tls=TLSFiles(str(workdir / "tls.crt"), str(workdir / "tls.key")),
                      ops_listen=Endpoint("127.0.0.1", 0))
    assert service.ops_address is not None
    ports = {"listen": service.webhook_address[1], "ops_listen": service.ops_address[1]}
    tmp = workdir / ".bare-ports"
    tmp.write_text(json.dumps(ports))
    os.replace(tmp, workdir / "bare-ports.json")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await service.run(stop.wait)

    with asyncio.Runner(loop_factory=event_loop_factory(event_loop)[1]) as runner:
        runner.run(run())
    return 0


# --- set-up ------------------------------------------------------------------------------------------
# The workloads: which Deployment every request of a run deletes. `protected` is the gate's most
# expensive answer (op0's controller, whose CriticalService's criteria do not hold: evaluate them, deny
# with a message naming the blockers); `unprotected` is its most common one (any other Deployment of the
# cluster: a gate sees every Deployment DELETE, and almost none is a provider).
WORKLOADS = {"protected": ("op0-system", "controller"), "unprotected": ("tenant-7", "web")}


def review_body(services: int, workload: str = "protected") -> bytes:
    """A DELETE of a Deployment (see WORKLOADS), filled out like a real one (~3 KB)."""
    review = json.loads(EXAMPLE_REVIEW.read_text())
    req = review["request"]
    namespace, name = WORKLOADS[workload]
    req["name"], req["namespace"] = name, namespace
    labels = {"app.kubernetes.io/name": "op0", "app.kubernetes.io/component": "controller"}
    req["oldObject"] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": name, "namespace": namespace, "uid": "5b1f7c1e-8d3a-4f0e-9c2b-1a2b3c4d5e6f",
            "resourceVersion": "48213377", "generation": 7, "creationTimestamp": "2026-03-02T09:14:51Z",
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": "7",
                            "meta.helm.sh/release-name": "op0", "meta.helm.sh/release-namespace": "op0-system"},
            "managedFields": [{"manager": "helm", "operation": "Update", "apiVersion": "apps/v1",
                               "time": "2026-03-02T09:14:51Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app.kubernetes.io/name": {}}},
                                            "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                                                'k:{"name":"manager"}': {".": {}, "f:image": {}}}}}}}}],
        },
        "spec": {
            "replicas": 2, "revisionHistoryLimit": 10, "selector": {"matchLabels": labels},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {"metadata": {"labels": labels}, "spec": {
                "serviceAccountName": "op0-controller", "terminationGracePeriodSeconds": 10,
                "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{
                    "name": "manager", "image": "registry.example.com/op0/controller:v1.12.3",
                    "args": ["--leader-elect", "--metrics-bind-address=:8080", "--health-probe-bind-address=:8081"],
                    "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"limits": {"cpu": "500m", "memory": "256Mi"},
                                  "requests": {"cpu": "50m", "memory": "64Mi"}},
                    "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 20},
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 10},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}},
        },
        "status": {"replicas": 2, "readyReplicas": 2, "availableReplicas": 2, "updatedReplicas": 2,
                   "observedGeneration": 7},
    }
    req["userInfo"] = {"username": "system:serviceaccount:open-cluster-management-agent:klusterlet-work-sa",
                       "uid": "0b7d9f4e-2a1c-4e8b-b6f3-9d8c7b6a5f4e",
                       "groups": ["system:serviceaccounts", "system:serviceaccounts:open-cluster-management-agent",
                                  "system:authenticated"]}
    return json.dumps(review, separators=(",", ":")).encode()


def write_snapshot(path: Path, services: int, crs: int, condition: str | None = None,
                   selector: bool = False) -> int:
    from .scale import cluster

    items = [copy.deepcopy(dict(m.obj)) for m in cluster(services, crs, 0, condition, selector)]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return len(items)


def _wait_ports(path: Path, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> dict[str, int]:
    import httpx

    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not write {path} within {timeout} s")
        time.sleep(0.05)
    ports: dict[str, int] = json.loads(path.read_text())
    while True:  # readiness is polled, never slept for
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{ports['ops_listen']}/readyz", timeout=1.0).status_code == 200:
                return ports
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready within {timeout} s")
        time.sleep(0.05)


def make_certs(work: Path) -> None:
    """A CA and a serving certificate for 127.0.0.1 in `work` (ca.crt, tls.crt, tls.key)."""
    subprocess.run([sys.executable, "-m", "criticalsvc", "certs", "--out", str(work), "--san", "127.0.0.1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def spawn_gate(work: Path, snapshot: Path, *, log_level: str = "info", stderr: Any = subprocess.DEVNULL,
               port_file: str = "gate-ports.json", event_loop: str | None = None,
               root: Path = ROOT) -> subprocess.Popen[bytes]:
    """`criticalsvc serve --state SNAPSHOT` with make_certs' TLS on 127.0.0.1 port 0; ports go to work/port_file.

    `event_loop`: its --event-loop (None: the default); `root`: the checkout whose criticalsvc is served
    (another one than ours is put first on the path, ahead of the editable install)."""
    loop = ["--event-loop", event_loop] if event_loop is not None else []
    env = {**os.environ, "PYTHONPATH": str(root)} if root != ROOT else None
    return subprocess.Popen(
        [sys.executable, "-m", "criticalsvc", "serve", "--state", str(snapshot), "--tls-cert", str(work / "tls.crt"),
         "--tls-key", str(work / "tls.key"), "--listen", "127.0.0.1:0", "--ops-listen", "127.0.0.1:0",
         "--port-file", str(work / port_file), "--log-level", log_level, "--no-status", *loop],
        stdout=subprocess.DEVNULL, stderr=stderr, cwd=root, env=env)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (/proc/PID/stat, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_wrk(port: int, review: Path, *, connections: int, duration: float, pid: int) -> dict[str, Any]:
    threads = min(connections, 2)
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration:g}s", "--timeout", "10s",
           "--latency", "-s", str(LUA), f"https://127.0.0.1:{port}/validate"]
    cpu_before = cpu_seconds(pid)
    proc = subprocess.run(cmd, env={**os.environ, "REVIEW": str(review)}, capture_output=True, text=True,
                          check=False)
    cpu = cpu_seconds(pid) - cpu_before
    for line in proc.stdout.splitlines():
        if line.startswith("WRKJSON "):
            raw = json.loads(line[len("WRKJSON "):])
            break
    else:
        raise RuntimeError(f"wrk gave no result (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout[-500:]}")
    seconds = raw["durationUs"] / 1e6
    errors = raw["errConnect"] + raw["errRead"] + raw["errWrite"] + raw["errTimeout"] + raw["non200"]
    return {"connections": connections, "threads": threads, "requests": raw["requests"],
            "rps": round(raw["requests"] / seconds, 1), "p50ms": raw["p50Us"] / 1000, "p90ms": raw["p90Us"] / 1000,
            "p99ms": raw["p99Us"] / 1000, "p999ms": raw["p999Us"] / 1000, "maxms": raw["maxUs"] / 1000,
            "meanms": round(raw["meanUs"] / 1000, 3), "errors": errors,
            # The server's own CPU per answer: at saturation (cpuShare ~1: one Python process uses one
            # core at most) this, not the latency, is what sets the throughput ratio.
            "cpuUsPerRequest": round(cpu * 1e6 / raw["requests"], 1) if raw["requests"] else None,
            "cpuShare": round(cpu / seconds, 2), "command": " ".join(cmd)}


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One figure from a server's rounds: totals for throughput and CPU, the median round's percentiles.

    wrk reports percentiles, not its histogram, so rounds cannot be merged exactly; the median of the
    rounds' p99 is robust to one round hit by outside load, which is why there are rounds at all.
    """
    seconds = sum(r["requests"] / r["rps"] for r in runs if r["rps"])
    requests = sum(r["requests"] for r in runs)
    cpu_us = sum(r["cpuUsPerRequest"] * r["requests"] for r in runs if r["cpuUsPerRequest"] is not None)
    out: dict[str, Any] = {"connections": runs[0]["connections"], "rounds": len(runs), "requests": requests,
                           "rps": round(requests / seconds, 1) if seconds else 0.0,
                           "cpuUsPerRequest": round(cpu_us / requests, 1) if requests else None,
                           "cpuShare": round(statistics.median(r["cpuShare"] for r in runs), 2),
                           "errors": sum(r["errors"] for r in runs), "maxms": max(r["maxms"] for r in runs)}
    for key in ("p50ms", "p90ms", "p99ms", "p999ms", "meanms"):
        out[key] = round(statistics.median(r[key] for r in runs), 3)
    out["perRound"] = [{k: r[k] for k in ("rps", "p50ms", "p99ms", "cpuUsPerRequest", "cpuShare")} for r in runs]
    out["command"] = runs[0]["command"]
    return out


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _targets(loops: list[str], baseline: Path | None) -> list[tuple[str, str, str | None]]:
    """(name, kind, event loop) of every server of a run: a gate and a bare endpoint per loop, one baseline."""
    one = len(loops) == 1
    out: list[tuple[str, str, str | None]] = []
    for loop in loops:
        suffix = "" if one else f"/{loop}"
        out += [(f"gate{suffix}", "gate", None if loop == "auto" else loop), (f"bare{suffix}", "bare", loop)]
    if baseline is not None:
        out.append(("baseline", "baseline", None))
    return out


def _ratios(g: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"p99Ratio": round(g["p99ms"] / b["p99ms"], 2) if b["p99ms"] else None,
            "p50Ratio": round(g["p50ms"] / b["p50ms"], 2) if b["p50ms"] else None,
            "throughputRatio": round(g["rps"] / b["rps"], 2) if b["rps"] else None,
            "cpuRatio": round(g["cpuUsPerRequest"] / b["cpuUsPerRequest"], 2)
            if g["cpuUsPerRequest"] and b["cpuUsPerRequest"] else None,
            "cpuExtraUsPerRequest": round(g["cpuUsPerRequest"] - b["cpuUsPerRequest"], 1)
            if g["cpuUsPerRequest"] and b["cpuUsPerRequest"] else None}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks latency", description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=_ints, default=[1, 4, 16], help="wrk connection counts (load levels)")
    p.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run")
    p.add_argument("--rounds", type=int, default=3, help="wrk runs per server and level, alternating the servers")
    p.add_argument("--workloads", type=lambda t: [w for w in t.split(",") if w], default=list(WORKLOADS),
                   help=f"comma-separated, of: {', '.join(WORKLOADS)}")
    p.add_argument("--services", type=int, default=20, help="CriticalServices in the gate's snapshot")
    p.add_argument("--crs", type=int, default=2000, help="CRs with finalizers in the gate's snapshot")
    p.add_argument("--condition", default=None, help="a CEL condition on every Finalizer criterion of the snapshot")
    p.add_argument("--provider-selector", action="store_true",
                   help="the snapshot's CriticalServices choose their providers by label selector")
    p.add_argument("--log-level", default="info", help="the gate's --log-level (info: one line per decision)")
    p.add_argument("--event-loops", type=lambda t: [w for w in t.split(",") if w], default=["auto"],
                   help="comma-separated `serve --event-loop` values: a gate and a bare endpoint on each "
                        "(default: auto, the gate's default)")
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="also serve the gate from this checkout (its criticalsvc/ first on the path) and compare")
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve-bare", metavar="DIR", help=argparse.SUPPRESS)
    p.add_argument("--event-loop", default="auto", help=argparse.SUPPRESS)  # the bare endpoint's
    args = p.parse_args(argv)
    if args.serve_bare:
        return serve_bare(Path(args.serve_bare), args.event_loop)
    if args.rounds < 1 or args.duration <= 0:
        p.error("need --rounds >= 1 and --duration > 0")
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown or not args.workloads:
        p.error(f"--workloads: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(WORKLOADS)}")
    bad_loops = [x for x in args.event_loops if x not in ("auto", "uvloop", "asyncio")]
    if bad_loops or not args.event_loops or len(set(args.event_loops)) != len(args.event_loops):
        p.error(f"--event-loops: expected distinct values of auto, uvloop, asyncio, got {','.join(args.event_loops)}")
    if args.baseline is not None and not (args.baseline / "criticalsvc" / "__init__.py").is_file():
        p.error(f"--baseline: {args.baseline} has no criticalsvc/__init__.py (a checkout of this repository?)")

    if shutil.which("wrk") is None:
        msg = "wrk is not installed: the latency benchmark needs it (Debian/Ubuntu: apt-get install -y wrk)"
        print(f"python -m benchmarks latency: {msg}", file=sys.stderr)
        emit("latency", {"skipped": msg}, as_json=args.json)
        return 1

    py = sys.executable
    targets = _targets(args.event_loops, args.baseline)
    names = [name for name, _, _ in targets]
    with tempfile.TemporaryDirectory(prefix="criticalsvc-bench-") as tmp:
        work = Path(tmp)
        make_certs(work)
        snapshot = work / "snapshot.json"
        objects = write_snapshot(snapshot, args.services, args.crs, args.condition, args.provider_selector)
        reviews = {}
        for workload in args.workloads:
            reviews[workload] = work / f"review-{workload}.json"
            reviews[workload].write_bytes(review_body(args.services, workload))
        review_bytes = {w: r.stat().st_size for w, r in reviews.items()}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        levels = []
        decisions = {}
        try:
            for k, (name, kind, loop) in enumerate(targets):
                port_file = f"ports-{k}.json"
                if kind == "bare":
                    bare_dir = work / f"bare-{k}"
                    bare_dir.mkdir()
                    for f in ("tls.crt", "tls.key"):
                        (bare_dir / f).write_bytes((work / f).read_bytes())
                    procs[name] = subprocess.Popen(
                        [py, "-m", "benchmarks", "latency", "--serve-bare", str(bare_dir), "--event-loop", str(loop)],
                        stdout=subprocess.DEVNULL, cwd=ROOT)
                else:
                    procs[name] = spawn_gate(work, snapshot, log_level=args.log_level, port_file=port_file,
                                             event_loop=loop, root=args.baseline if kind == "baseline" else ROOT)
            ports = {}
            for k, (name, kind, _) in enumerate(targets):
                path = work / f"bare-{k}" / "bare-ports.json" if kind == "bare" else work / f"ports-{k}.json"
                ports[name] = _wait_ports(path, procs[name], name)["listen"]
            import ssl

            import httpx

            tls = ssl.create_default_context(cafile=str(work / "ca.crt"))
            for workload, review in reviews.items():
                answer = httpx.post(f"https://127.0.0.1:{ports[names[0]]}/validate", content=review.read_bytes(),
                                    headers={"content-type": "application/json"}, verify=tls).json()
                decisions[workload] = "allowed" if answer["response"]["allowed"] else "denied"
                for c in args.connections:
                    # Rounds, rotating which server goes first: on a shared machine a burst of outside
                    # load then lands on all of them alike instead of on whichever ran at that moment.
                    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
                    for k in range(args.rounds):
                        shift = k % len(names)
                        for name in names[shift:] + names[:shift]:
                            runs[name].append(run_wrk(ports[name], review, connections=c, duration=args.duration,
                                                      pid=procs[name].pid))
                    combined = {name: combine(runs[name]) for name in names}
                    level: dict[str, Any] = {"workload": workload, "connections": c, **combined}
                    # gate vs bare on the same loop (the top level's gate/bare when there is one loop)
                    comparisons = {}
                    for name, kind, _ in targets:
                        if kind == "gate":
                            comparisons[f"{name} / {name.replace('gate', 'bare', 1)}"] = _ratios(
                                combined[name], combined[name.replace("gate", "bare", 1)])
                            if args.baseline is not None:
                                comparisons[f"{name} / baseline"] = _ratios(combined[name], combined["baseline"])
                    if "gate/uvloop" in combined and "gate/asyncio" in combined:
                        comparisons["gate/uvloop / gate/asyncio"] = _ratios(combined["gate/uvloop"],
                                                                            combined["gate/asyncio"])
                        comparisons["bare/uvloop / bare/asyncio"] = _ratios(combined["bare/uvloop"],
                                                                            combined["bare/asyncio"])
                    level["comparisons"] = comparisons
                    if "gate" in combined and "bare" in combined:
                        level.update(comparisons["gate / bare"])
                    levels.append(level)
                    print(f"   latency: {workload}, {c} connections: " + "; ".join(
                        f"{n} p99 {combined[n]['p99ms']} ms {combined[n]['rps']} req/s "
                        f"({combined[n]['cpuUsPerRequest']} us CPU/req)" for n in names),
                        file=sys.stderr, flush=True)
        finally:
            for proc in procs.values():
                _stop(proc)

    cols = ["workload", "connections", "target", "rps", "p50ms", "p99ms", "maxms", "cpuUsPerRequest", "errors"]
    rows = []
    for lv in levels:
        for target in names:
            r = lv[target]
            rows.append([lv["workload"], lv["connections"], target, r["rps"], r["p50ms"], r["p99ms"], r["maxms"],
                         r["cpuUsPerRequest"], r["errors"]])
    ratio_cols = ["workload", "connections", "comparison", "p50Ratio", "p99Ratio", "throughputRatio", "cpuRatio",
                  "cpuExtraUsPerRequest"]
    ratio_rows = [[lv["workload"], lv["connections"], what, *(r[c] for c in ratio_cols[3:])]
                  for lv in levels for what, r in lv["comparisons"].items()]

    def met(workload: str) -> bool:
        return all((r["p99Ratio"] or 99) <= P99_GOAL and (r["throughputRatio"] or 0) >= THROUGHPUT_GOAL
                   for lv in levels if lv["workload"] == workload
                   for what, r in lv["comparisons"].items() if what.startswith("gate") and "baseline" not in what
                   and "/ gate" not in what)

    section = {
        "reviewBytes": review_bytes,
        "gateDecision": decisions,
        "snapshotObjects": objects, "snapshotServices": args.services,
        "snapshotCondition": args.condition or "", "snapshotProviderSelector": args.provider_selector,
        "durationSeconds": args.duration, "rounds": args.rounds, "gateLogLevel": args.log_level,
        "targets": names, "eventLoops": args.event_loops,
        "baseline": str(args.baseline) if args.baseline is not None else None,
        "goal": f"gate p99 <= {P99_GOAL} x bare, throughput >= {THROUGHPUT_GOAL} x bare",
        "goalMet": {w: met(w) for w in reviews},
        "levels": levels,
        "tables": [{"title": "wrk over HTTPS keep-alive", "columns": cols, "rows": rows},
                   {"title": "ratios (first / second)", "columns": ratio_cols, "rows": ratio_rows}],
    }
    emit("latency", section, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
