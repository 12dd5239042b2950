"""Scale over HTTP: /validate latency, seen by a client, as CriticalServices and cached objects grow.

    python -m benchmarks scale_http [--decisions 2000] [--rounds 40] [--services 10,100,1000,10000]
                                    [--crs-per-service 10] [--objects-services 100]
                                    [--objects 1000,10000,50000,200000] [--log-level debug] [--seed 0] [--json]

The over-HTTP half of the scale benchmark (benchmarks/scale.py times `decide()` in-process). The
clusters, the sweeps and the request mix are scale.py's (`cluster()`, `requests()`), so the two
tables line up point by point:

    services sweep   N = 10 .. 10,000 CriticalServices, 10 CRs each (the cluster grows with N)
    objects sweep    100 CriticalServices x 10 CRs, filled up with ConfigMaps to 1k .. 200k objects

Servers: each point is its own process (`python -m benchmarks scale_http --serve-point ...`), so
each has its own heap. The child builds the state in-process (`scale.cluster` ->
`snapshot.build_state`: what `criticalsvc serve --state` does after reading the file) and serves the
real app, `server.Webhook(StaticStateSource(state))` in `serving.Service`: TLS (certificates from
`criticalsvc certs --san 127.0.0.1`; the API server calls webhooks over HTTPS only, and Service has
no plain-HTTP webhook listener), HTTP/1.1, plus the ops listener, both on 127.0.0.1 port 0. It prints
its ports as one JSON line on stdout once bound; the parent then polls /readyz on the ops port.
SIGTERM stops it (graceful shutdown, as in production).

Logging is at `debug` by default: one JSON line per decision, here to a file, which gives the
server's own time per decision (`latency_ms` of each `decision` line: handler entry to response
body ready, without HTTP parsing and TLS) next to the client's. Production's `info` has no line for
the routine ALLOWs of unprotected objects (server.ROUTINE_RULES), so it would leave those out of
the server columns; `--log-level warning` drops the decision lines and with them the server columns.

Client: this process posts the DELETE mix of scale.requests, encoded as the API server sends it
(resource, kind, name, namespace, oldObject, userInfo, DeleteOptions), sequentially over one
keep-alive HTTPS connection per server (httpx.Client), timing each POST with time.perf_counter_ns
from before sending to the decoded answer; the client's garbage collector is off while timing.

Interleaving: the machine is shared (2 cores; other jobs, the client itself), and load that comes
and goes is far bigger than the effect measured: run point after point, the server's p99 moved
by up to 5x between neighbouring points, with no trend. So all servers of a sweep start first (idle ones cost no CPU),
each gets 200 untimed warm-up reviews, and then each point's N reviews are sent in --rounds blocks,
round-robin over the points (the order rotates each round), each block after 5 untimed reviews
(default: 40 blocks of 50). A burst of outside load then lands on every point alike, not on one.

Reading it: `p50us`/`p99us`/`maxus` are the client's round trips and include the Python client's
own cost (httpx over TLS: most of a millisecond per request on this kind of machine, on the same
cores as the server), so absolute figures are well above what the API server's Go client would see:
the growth across a sweep is the point. p99 growth = p99(last point) / p99(first point) - 1, goal
<= 0.10. `serverP50us`/`serverP99us` come from the server's decision lines (see above). `rssMiB` is
a server's resident memory once its state is built, `startupSeconds` from spawn to ready.
Every answer must be a 200 AdmissionReview; anything else counts in `errors` (exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from criticalsvc.admission import AdmissionRequest, render_review

from .report import emit, percentile
from .scale import add_sweep_arguments, cluster, requests

ROOT = Path(__file__).resolve().parents[1]
WARM_UP = 200  # untimed reviews per server before timing: imports, caches, the TLS session
# Untimed reviews at the start of each block: the first requests after the client switched servers
# find the server's CPU caches cold (another process ran), which is this benchmark's doing, not scale.
BLOCK_WARM_UP = 5
WARM_PREFIX = "warm-"  # uid prefix of untimed reviews, so the server's log lines of them can be skipped
# A child builds up to 200k objects before it listens (~10 s here); generous for a slow machine.
READY_TIMEOUT = 180.0
P99_GROWTH_GOAL = 0.10
USER: dict[str, Any] = {"username": "system:serviceaccount:kube-system:namespace-controller",
        "uid": "0b7d9f4e-2a1c-4e8b-b6f3-9d8c7b6a5f4e",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"]}


# --- the server (runs in its own process: python -m benchmarks scale_http --serve-point ...) -----------
def serve_point(services: int, crs: int, filler: int, certs: Path, log_level: str) -> int:
    from criticalsvc.logs import configure_logging
    from criticalsvc.server import StaticStateSource, Webhook
    from criticalsvc.serving import Endpoint, Service, TLSFiles
    from criticalsvc.snapshot import build_state

    configure_logging(log_level)
    t0 = time.perf_counter()
    manifests = cluster(services, crs, filler)
    objects = len(manifests)
    state = build_state(manifests)
    del manifests
    gc.collect()
    build = time.perf_counter() - t0
    loopback = Endpoint("127.0.0.1", 0)
    service = Service(Webhook(StaticStateSource(state)), listen=loopback, ops_listen=loopback,
                      tls=TLSFiles(str(certs / "tls.crt"), str(certs / "tls.key")))
    assert service.ops_address is not None
    print(json.dumps({"listen": service.webhook_address[1], "ops_listen": service.ops_address[1],
                      "objects": objects, "buildSeconds": round(build, 2), "rssMiB": _rss_mib()}), flush=True)

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await service.run(stop.wait)

    asyncio.run(run())
    return 0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


# --- the client ----------------------------------------------------------------------------------------
def review_body(req: AdmissionRequest, *, uid_prefix: str = "") -> bytes:
    """`req` as the AdmissionReview v1 the API server would post for the namespace controller (USER)."""
    import orjson

    sent = attrs.evolve(req, uid=uid_prefix + req.uid, username=USER["username"], propagation_policy="Background")
    return orjson.dumps(render_review(sent, user_uid=USER["uid"], groups=USER["groups"]))


class Server:
    """One sweep point's server process and the client's keep-alive connection to it."""

    def __init__(self, services: int, crs: int, filler: int, *, certs: Path, workdir: Path, log_level: str) -> None:
        self.services, self.crs, self.filler = services, crs, filler
        self.log_path = workdir / f"server-{services}-{crs}-{filler}.log"
        cmd = [sys.executable, "-m", "benchmarks", "scale_http", "--serve-point", str(certs),
               "--point", f"{services},{crs},{filler}", "--log-level", log_level]
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT)
        self.client: Any = None
        try:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()  # blocks until the child has built its state and bound its sockets
            if not line:
                self.proc.wait()
                tail = self.log_path.read_text(errors="replace")[-1500:]
                raise RuntimeError(f"the server for {self} exited with {self.proc.returncode} before listening: {tail}")
            self.info: dict[str, Any] = json.loads(line)
            self._wait_ready()
            self.startup = time.perf_counter() - started
            import httpx

            self.url = f"https://127.0.0.1:{self.info['listen']}/validate"
            self.client = httpx.Client(verify=ssl.create_default_context(cafile=str(certs / "ca.crt")),
                                       http2=False, timeout=10.0,
                                       limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        except BaseException:
            self.stop()
            raise

    def __str__(self) -> str:
        return f"{self.services} services / {self.crs} CRs / {self.filler} ConfigMaps"

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + READY_TIMEOUT
        while True:  # readiness is polled, never slept for
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.info['ops_listen']}/readyz", timeout=1.0).status_code == 200:
                    return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server for {self} exited with {self.proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server for {self} was not ready within {READY_TIMEOUT} s")
            time.sleep(0.02)

    def post(self, body: bytes) -> tuple[int, bool | None]:
        """POST one review; (nanoseconds from send to decoded answer, allowed or None for a bad answer)."""
        import orjson

        t0 = time.perf_counter_ns()
        response = self.client.post(self.url, content=body, headers=HEADERS)
        answer = orjson.loads(response.content)
        elapsed = time.perf_counter_ns() - t0
        if response.status_code != 200 or not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
            return elapsed, None
        return elapsed, bool(answer["response"].get("allowed"))

    def stop(self) -> None:
        """SIGTERM (graceful shutdown), then wait; the log file is complete afterwards."""
        if self.client is not None:
            self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


HEADERS = {"content-type": "application/json", "accept": "application/json"}


def server_times(log_path: Path) -> dict[str, Any]:
    """Percentiles of `latency_ms` over the server's decision log lines of timed (not warm-up) reviews."""
    values = []
    with open(log_path, "rb") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if (isinstance(entry, dict) and entry.get("event") == "decision" and "latency_ms" in entry
                    and not str(entry.get("uid", "")).startswith(WARM_PREFIX)):
                values.append(float(entry["latency_ms"]) * 1000)
    if not values:
        return {}
    values.sort()
    return {"serverP50us": round(percentile(values, 50), 1), "serverP99us": round(percentile(values, 99), 1),
            "serverRequests": len(values)}


def sweep(points: list[tuple[int, int, int]], *, decisions: int, rounds: int, seed: int, certs: Path,
          workdir: Path, log_level: str) -> list[dict[str, Any]]:
    """Start a server per point, then time `decisions` reviews per point in `rounds` interleaved blocks."""
    servers: list[Server] = []
    try:
        for services, crs, filler in points:
            servers.append(Server(services, crs, filler, certs=certs, workdir=workdir, log_level=log_level))
            s = servers[-1]
            print(f"   scale_http: {s}: {s.info['objects']} objects, ready in {s.startup:.1f} s "
                  f"(build {s.info['buildSeconds']} s, RSS {s.info['rssMiB']} MiB)", file=sys.stderr, flush=True)
        timed = [[review_body(r) for r in requests(s.services, s.crs, decisions, random.Random(seed))]
                 for s in servers]
        warm_count = WARM_UP + rounds * BLOCK_WARM_UP
        warm = [[review_body(r, uid_prefix=WARM_PREFIX)
                 for r in requests(s.services, s.crs, warm_count, random.Random(seed + 1))] for s in servers]
        for s, bodies in zip(servers, warm, strict=True):
            for body in bodies[:WARM_UP]:
                s.post(body)
        samples: list[list[int]] = [[] for _ in servers]
        denied = [0] * len(servers)
        errors = [0] * len(servers)
        bounds = [decisions * r // rounds for r in range(rounds + 1)]
        gc.collect()
        gc.disable()  # the client's collector pauses are not the server's latency
        try:
            for r in range(rounds):
                for k in range(len(servers)):
                    j = (r + k) % len(servers)  # rotate who goes first: no point always follows the same one
                    s = servers[j]
                    for body in warm[j][WARM_UP + r * BLOCK_WARM_UP:WARM_UP + (r + 1) * BLOCK_WARM_UP]:
                        s.post(body)
                    for body in timed[j][bounds[r]:bounds[r + 1]]:
                        ns, allowed = s.post(body)
                        samples[j].append(ns)
                        errors[j] += allowed is None
                        denied[j] += allowed is False
        finally:
            gc.enable()
    finally:
        for s in servers:
            s.stop()
    rows = []
    for s, values, d, e in zip(servers, samples, denied, errors, strict=True):
        values.sort()
        row: dict[str, Any] = {
            "services": s.services, "crs": s.crs, "matchingPerService": s.crs // s.services,
            "objects": s.info["objects"], "buildSeconds": s.info["buildSeconds"],
            "startupSeconds": round(s.startup, 2), "rssMiB": s.info["rssMiB"],
            "p50us": round(percentile(values, 50) / 1000, 1), "p99us": round(percentile(values, 99) / 1000, 1),
            "maxus": round(values[-1] / 1000, 1), "meanus": round(sum(values) / len(values) / 1000, 1),
            "requests": len(values), "denied": d, "errors": e,
        }
        if log_level in ("debug", "info"):
            row.update(server_times(s.log_path))
        s.log_path.unlink(missing_ok=True)
        print(f"   scale_http: {s.services} services, {row['objects']} objects: p50 {row['p50us']} us, "
              f"p99 {row['p99us']} us (server p50 {row.get('serverP50us', '-')} us, "
              f"p99 {row.get('serverP99us', '-')} us)", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _growth(rows: list[dict[str, Any]], key: str) -> float | None:
    if not rows or not rows[0].get(key) or key not in rows[-1]:
        return None
    return round(float(rows[-1][key]) / float(rows[0][key]) - 1, 3)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks scale_http", description=(__doc__ or "").splitlines()[0])
    p.add_argument("--decisions", type=int, default=2000, help="reviews timed per point")
    p.add_argument("--rounds", type=int, default=40, help="interleaved blocks the reviews of a point are split into")
    add_sweep_arguments(p)
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="debug",
                   help="the servers' log level (debug: a line for every decision, routine ALLOWs included)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.add_argument("--serve-point", metavar="CERTS_DIR", help=argparse.SUPPRESS)
    p.add_argument("--point", type=_ints, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_point:
        services, crs, filler = args.point
        return serve_point(services, crs, filler, Path(args.serve_point), args.log_level)
    if args.decisions < 1 or not 1 <= args.rounds <= args.decisions:
        p.error("need --decisions >= 1 and 1 <= --rounds <= --decisions")

    started = time.perf_counter()
    per = args.crs_per_service
    n = args.objects_services
    base = len(cluster(n, n * per))
    with tempfile.TemporaryDirectory(prefix="criticalsvc-bench-") as tmp:
        work = Path(tmp)
        subprocess.run([sys.executable, "-m", "criticalsvc", "certs", "--out", str(work), "--san", "127.0.0.1"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        opts: dict[str, Any] = {"decisions": args.decisions, "rounds": args.rounds, "seed": args.seed,
                                "certs": work, "workdir": work, "log_level": args.log_level}
        by_services = sweep([(s, s * per, 0) for s in args.services], **opts)
        by_objects = sweep([(n, n * per, max(0, total - base)) for total in args.objects], **opts)

    server_columns = args.log_level in ("debug", "info")
    cols = ["services", "objects", "p50us", "p99us", "maxus", "serverP50us", "serverP99us", "rssMiB",
            "startupSeconds"]
    if not server_columns:
        cols = [c for c in cols if not c.startswith("server")]

    def table(title: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"title": title, "columns": cols, "rows": [[r.get(c, "") for c in cols] for r in rows]}

    growth = {"p99GrowthServicesSweep": _growth(by_services, "p99us"),
              "p99GrowthObjectsSweep": _growth(by_objects, "p99us")}
    section: dict[str, Any] = {
        "transport": "HTTPS/1.1 keep-alive, 1 connection per server, sequential (httpx client in Python)",
        "serverLogLevel": args.log_level,
        "decisionsPerPoint": args.decisions,
        "roundsPerSweep": args.rounds,
        **growth,
        "p50GrowthServicesSweep": _growth(by_services, "p50us"),
        "p50GrowthObjectsSweep": _growth(by_objects, "p50us"),
    }
    if server_columns:
        section["serverP99GrowthServicesSweep"] = _growth(by_services, "serverP99us")
        section["serverP99GrowthObjectsSweep"] = _growth(by_objects, "serverP99us")
    section.update({
        "p99GrowthGoal": P99_GROWTH_GOAL,
        "goalMet": all(g is not None and g <= P99_GROWTH_GOAL for g in growth.values()),
        "errors": sum(r["errors"] for r in by_services + by_objects),
        "servicesSweep": by_services,
        "objectsSweep": by_objects,
        "wallSeconds": round(time.perf_counter() - started, 1),
        "tables": [
            table(f"services sweep over HTTPS ({per} CRs per CriticalService)", by_services),
            table(f"objects sweep over HTTPS ({n} CriticalServices x {per} CRs, the rest ConfigMaps)", by_objects),
        ],
    })
    emit("scale_http", section, as_json=args.json)
    return 1 if section["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
