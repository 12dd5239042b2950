"""Where a gate's CPU goes under load: py-spy samples of `criticalsvc serve` while wrk drives it.

    python -m benchmarks profile [--workload protected] [--connections 4] [--duration 10] [--rate 200]
                                 [--services 20] [--crs 2000] [--event-loop auto] [--baseline DIR]
                                 [--raw PATH] [--json]

The latency benchmark says how much more CPU an answer of the gate costs than one of the bare
endpoint (`cpuExtraUsPerRequest`); this one says what that CPU is spent on. It starts the gate as the
latency benchmark does (same snapshot, same review, same TLS), loads it with wrk, and attaches
py-spy (PyPI `py-spy`, in the `bench` extra; it needs ptrace, i.e. root or CAP_SYS_PTRACE) to the
serving process for --duration seconds, then folds the samples two ways:

    by layer     each sample goes to the layer of its innermost frame: criticalsvc (ours: decision,
                 request handling, logging, metrics), starlette, uvicorn + httptools (HTTP), asyncio + ssl
                 (event loop, TLS), prometheus_client, structlog, other
    by function  inclusive share of the functions on the gate's request path (decide, _record,
                 _read_review, parse_review, the log call ...)

Reading it: the shares are of the serving process's samples while it is saturated (one core).
Multiply a share by the gate's `cpuUsPerRequest` (from the latency benchmark, printed here too)
for microseconds per answer.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .latency import (
    LUA,
    ROOT,
    WORKLOADS,
    _stop,
    _wait_ports,
    cpu_seconds,
    make_certs,
    review_body,
    spawn_gate,
    write_snapshot,
)
from .report import emit

# The layer of a frame, by the function and file py-spy names (`function (path/file.py:line)`, first
# match wins). Time in C is charged to the Python frame that called it: on uvloop, TLS and the socket
# are in C, so a write's encryption and send() show as `StreamWriter.write`, and reading, decrypting
# and dispatching as the loop's own frame (`Runner.run`); on asyncio's loop they are Python frames of
# their own (sslproto.py, selector_events.py, ssl.py).
LAYERS = (
    ("TLS + socket write", ("StreamWriter.write (asyncio/streams.py", "asyncio/sslproto.py", "(ssl.py:",
                            "_SelectorSocketTransport.write")),
    ("event loop: poll, read, dispatch", ("Runner.run (", "asyncio/base_events.py", "asyncio/events.py",
                                          "(selectors.py:", "asyncio/selector_events.py")),
    ("asyncio streams, tasks, locks", ("asyncio/",)),
    ("h11 (HTTP/1.1 parsing, framing)", ("(h11/",)),
    ("uvicorn + httptools (HTTP/1.1 protocol, request cycle)", ("(uvicorn/", "(httptools/")),
    ("criticalsvc: read + decode (orjson) + answer", ("criticalsvc/server.py",)),
    ("criticalsvc: AdmissionRequest parse", ("criticalsvc/admission.py", "criticalsvc/request.py")),
    ("criticalsvc: decide", ("criticalsvc/decision.py", "criticalsvc/state.py", "criticalsvc/criteria.py",
                             "criticalsvc/routing.py", "criticalsvc/api.py", "criticalsvc/labels.py")),
    ("criticalsvc: other (patches, metrics glue, lag probe)", ("criticalsvc/",)),
    ("structlog", ("(structlog/",)),
    ("prometheus_client", ("(prometheus_client/",)),
    ("starlette (Response, ops routes)", ("(starlette/",)),
)
# The functions whose inclusive share is reported: (label, "function (file" prefix as py-spy prints it).
FUNCTIONS = (
    ("Webhook.review (all of ours)", "Webhook.review (criticalsvc/server.py"),
    ("  decide", "decide (criticalsvc/decision.py"),
    ("  _record (metrics + log line)", "Webhook._record (criticalsvc/server.py"),
    ("    the log call (structlog)", "make_method.<locals>.meth ("),
    ("  _read_review (body + JSON)", "Webhook._read_review (criticalsvc/server.py"),
    ("  parse_review", "parse_review (criticalsvc/admission.py"),
    ("Response.__call__ (starlette send)", "Response.__call__ (starlette/responses.py"),
    ("HttpToolsProtocol.data_received (uvicorn receive)", "HttpToolsProtocol.data_received (uvicorn/"),
)


def layer_of(frame: str) -> str:
    for name, markers in LAYERS:
        if any(marker in frame for marker in markers):
            return name
    return "other"


def fold(raw: str) -> tuple[int, dict[str, int], dict[str, int]]:
    """py-spy's raw (collapsed) output -> (samples, samples by innermost layer, inclusive samples by function)."""
    total = 0
    layers: collections.Counter[str] = collections.Counter()
    functions: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        layers[layer_of(frames[-1])] += n
        for label, prefix in FUNCTIONS:
            if any(prefix in f for f in frames):
                functions[label] += n
    return total, dict(layers), dict(functions)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks profile", description=__doc__.splitlines()[0])
    p.add_argument("--workload", choices=list(WORKLOADS), default="protected")
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--duration", type=float, default=10.0, help="seconds of sampling")
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--services", type=int, default=20)
    p.add_argument("--crs", type=int, default=2000)
    p.add_argument("--event-loop", default=None, help="the gate's `serve --event-loop` (default: its default)")
    p.add_argument("--baseline", type=Path, default=None, metavar="DIR",
                   help="profile the gate of this checkout instead (as benchmarks.latency --baseline)")
    p.add_argument("--raw", metavar="PATH", help="also keep py-spy's raw (collapsed) samples in PATH")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    # py-spy is a console script of the venv running us, which need not be on PATH.
    beside = Path(sys.executable).parent / "py-spy"
    pyspy = str(beside) if beside.exists() else shutil.which("py-spy")
    missing = [tool for tool, path in (("wrk", shutil.which("wrk")), ("py-spy", pyspy)) if path is None]
    if missing:
        msg = (f"{' and '.join(missing)} not installed: the profile needs wrk (apt-get install -y wrk) and "
               "py-spy (pip install -e '.[bench]')")
        print(f"python -m benchmarks profile: {msg}", file=sys.stderr)
        emit("profile", {"skipped": msg}, as_json=args.json)
        return 1

    with tempfile.TemporaryDirectory(prefix="criticalsvc-profile-") as tmp:
        work = Path(tmp)
        make_certs(work)
        snapshot = work / "snapshot.json"
        write_snapshot(snapshot, args.services, args.crs)
        review = work / "review.json"
        review.write_bytes(review_body(args.services, args.workload))
        gate = spawn_gate(work, snapshot, port_file="ports.json", event_loop=args.event_loop,
                          root=args.baseline or ROOT)
        try:
            port = _wait_ports(work / "ports.json", gate, "the gate")["listen"]
            load = subprocess.Popen(
                ["wrk", "-t", "2", "-c", str(args.connections), "-d", f"{args.duration + 3:g}s", "--timeout", "10s",
                 "-s", str(LUA), f"https://127.0.0.1:{port}/validate"],
                env={**os.environ, "REVIEW": str(review)}, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
            time.sleep(1.0)  # let wrk connect and the gate reach steady state before sampling
            cpu_before, started = cpu_seconds(gate.pid), time.monotonic()
            out = work / "profile.txt"
            assert pyspy is not None
            spy = subprocess.run([pyspy, "record", "--pid", str(gate.pid), "--duration", f"{int(args.duration)}",
                                  "--rate", str(args.rate), "--format", "raw", "--output", str(out),
                                  # sample without stopping the process: its timing stays its own
                                  "--nonblocking"],
                                 capture_output=True, text=True, check=False)
            cpu_share = (cpu_seconds(gate.pid) - cpu_before) / (time.monotonic() - started)
            wrk_out, _ = load.communicate(timeout=args.duration + 60)
            if spy.returncode != 0 or not out.exists():
                raise RuntimeError(f"py-spy failed (exit {spy.returncode}): {spy.stderr.strip()[-500:]}")
            raw = out.read_text()
            if args.raw:
                Path(args.raw).write_text(raw)
        finally:
            _stop(gate)

    requests = 0.0
    for line in wrk_out.splitlines():
        if line.startswith("WRKJSON "):
            d = json.loads(line[len("WRKJSON "):])
            requests = d["requests"] / (d["durationUs"] / 1e6)
    total, layers, functions = fold(raw)
    if not total:
        print("python -m benchmarks profile: py-spy recorded no samples", file=sys.stderr)
        return 1

    def share(n: int) -> float:
        return round(100 * n / total, 1)

    # CPU per answer, and each layer's part of it: its share of the samples times that.
    cpu_us = cpu_share * 1e6 / requests if requests else 0.0

    def us(n: int) -> float:
        return round(cpu_us * n / total, 1)

    section = {
        "workload": args.workload, "connections": args.connections, "samples": total,
        "baseline": str(args.baseline) if args.baseline else None, "eventLoop": args.event_loop,
        "gateRequestsPerSecond": round(requests, 1), "gateCpuShare": round(cpu_share, 2),
        "gateCpuUsPerRequest": round(cpu_us, 1),
        "byLayer": {k: share(v) for k, v in sorted(layers.items(), key=lambda kv: -kv[1])},
        "byFunction": {label: share(functions.get(label, 0)) for label, _ in FUNCTIONS},
        "tables": [
            {"title": "samples by the layer of the innermost frame (% of the gate's samples, us of CPU per answer)",
             "columns": ["layer", "percent", "us/answer"],
             "rows": [[k, share(v), us(v)] for k, v in sorted(layers.items(), key=lambda kv: -kv[1])]},
            {"title": "inclusive share of functions on the request path (%)",
             "columns": ["function", "percent"],
             "rows": [[label, share(functions.get(label, 0))] for label, _ in FUNCTIONS]},
        ],
    }
    emit("profile", section, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
