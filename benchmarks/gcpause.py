"""Garbage-collection pauses with a full cache: what a full collection costs, and what gc.freeze() saves.

    python -m benchmarks gcpause [--objects 100000] [--repeat 5] [--json]

A full collection (generation 2) walks every object the collector tracks, and stops the process - the
event loop that answers reviews with it - while it does. A gate caching N objects tracks a few objects
per cached one (the slim KubeObject, its tuples and dicts), so the pause grows with the cluster.
CPython starts a full collection when the objects that survived younger collections since the last
full one exceed a quarter of those already old (gc's long_lived_pending > long_lived_total / 4,
https://github.com/python/cpython/blob/v3.11.7/Modules/gcmodule.c#L1436-L1443): a cluster whose
watched objects churn keeps creating survivors, so full collections keep coming.

gc.freeze() moves every tracked object into a permanent generation no collection walks
(https://docs.python.org/3.11/library/gc.html#gc.freeze). `criticalsvc serve` freezes its heap once at
start-up, and again once its caches have synced (criticalsvc/commands/serve.py): objects cached then
are never walked again; those that churn in later are collected as usual, and a frozen object that
is deleted is still freed by reference counting (only a reference cycle among frozen objects would be
kept, and a KubeObject holds none).

Measured here in one process, one run: N objects projected into a MemoryState as the watch caches do
(the shape of benchmarks/scale.py's bytes-per-object point); `--repeat` timed gc.collect(2) each:
before the cache is filled (the process's own heap), with the cache, and after gc.freeze().
Reported: median and max pause of each, and what the cache adds per 1,000 cached objects.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from typing import Any

from .report import emit


def fill(count: int) -> Any:
    """A MemoryState holding `count` CRs projected as the watch caches project them."""
    from criticalsvc.api import GroupResource
    from criticalsvc.objects import project
    from criticalsvc.state import MemoryState

    from .scale import TENANTS

    state = MemoryState()
    gr = GroupResource("op0.example.com", "widgets0")
    for j in range(count):
        raw = {"apiVersion": "op0.example.com/v1", "kind": "Widget0",
               "metadata": {"name": f"widget-{j:07d}", "namespace": f"tenant-{j % TENANTS}",
                            "uid": f"00000000-0000-4000-8000-{j:012d}", "resourceVersion": str(1000 + j),
                            "labels": {"app.kubernetes.io/instance": f"widget-{j:07d}",
                                       "app.kubernetes.io/managed-by": "op0"},
                            "finalizers": ["op0.example.com/cleanup"]},
               "spec": {"size": j}}
        state.upsert(project(raw, gr))
    return state


def _collect_ms() -> float:
    started = time.perf_counter()
    gc.collect(2)
    return (time.perf_counter() - started) * 1000


def measure(objects: int, repeat: int) -> dict[str, Any]:
    # The process's own heap (modules, the benchmark) first, without a cache: what a full collection
    # costs a gate that caches nothing; `criticalsvc serve` freezes that heap at start-up anyway.
    gc.collect()
    baseline = [_collect_ms() for _ in range(repeat)]
    before = len(gc.get_objects())
    started = time.perf_counter()
    state = fill(objects)
    fill_seconds = time.perf_counter() - started
    gc.collect()
    tracked = len(gc.get_objects()) - before
    cached = [_collect_ms() for _ in range(repeat)]
    gc.freeze()
    frozen = [_collect_ms() for _ in range(repeat)]
    gc.unfreeze()
    count = sum(1 for _ in state.objects())
    del state
    gc.collect()

    def summary(xs: list[float]) -> dict[str, float]:
        return {"medianMs": round(statistics.median(xs), 3), "maxMs": round(max(xs), 3)}

    out: dict[str, Any] = {
        "objects": count, "trackedObjectsPerCachedObject": round(tracked / max(1, count), 2),
        "fillSeconds": round(fill_seconds, 2), "repeat": repeat,
        "fullCollectionNoCache": summary(baseline), "fullCollection": summary(cached),
        "fullCollectionAfterFreeze": summary(frozen)}
    extra = out["fullCollection"]["medianMs"] - out["fullCollectionNoCache"]["medianMs"]
    out["cachePauseMsPer1000Objects"] = round(1000 * extra / max(1, count), 3)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks gcpause", description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=100_000, help="objects in the cache (default: %(default)s)")
    p.add_argument("--repeat", type=int, default=5, help="timed full collections per mode (default: %(default)s)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.objects < 1 or args.repeat < 1:
        print("python -m benchmarks gcpause: --objects and --repeat must be positive", file=sys.stderr)
        return 2
    section = measure(args.objects, args.repeat)
    full, frozen = section["fullCollection"]["medianMs"], section["fullCollectionAfterFreeze"]["medianMs"]
    print(f"   gcpause: {section['objects']} cached objects: full collection {full} ms, after gc.freeze() {frozen} ms",
          file=sys.stderr, flush=True)
    emit("gcpause", section, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
