"""Cold start: from CacheState.start() to ready, with 100k objects to list.

    python -m benchmarks coldstart [--objects 100000] [--load-budget 60] [--json]

The API server is the stand-in (criticalsvc.sim.apiserver.standin.StandIn over a sim Store, served over
plain HTTP on its own thread by ServerThread); the client is what `criticalsvc serve --kubeconfig`
runs: `connect(kubeconfig=...)`, KubeTransport, CacheState, `wait_ready()`. The store holds one
operator (Namespace, provider Deployment, CRD, CriticalService with a Finalizer criterion on the
CRD's resource) and N CRs carrying that finalizer over 100 tenant namespaces, so the CRs are
watched and the first LIST of them is what readiness waits for.

Filling the store is measured separately (`loadSeconds`): it is the stand-in's cost, not the
gate's. When the first 5,000 creates predict more than --load-budget seconds for all N, N drops
to 20,000 and the section says so (`reducedFrom`).

Caveat: the stand-in and the client share this process (and its GIL), so the stand-in's JSON
encoding of the LIST is inside the measured time; against a real API server the figure is lower.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .report import emit

TENANTS = 100
GROUP, PLURAL, KIND = "op0.example.com", "widgets0", "Widget0"
FINALIZER = f"{GROUP}/cleanup"
PROBE = 5000
REDUCED = 20_000


def _base() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"tenant-{t}"}}
                                 for t in range(TENANTS)]
    out += [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "op0-system"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "controller", "namespace": "op0-system"}, "spec": {"replicas": 1}},
        {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
         "metadata": {"name": f"{PLURAL}.{GROUP}"},
         "spec": {"group": GROUP, "scope": "Namespaced",
                  "names": {"plural": PLURAL, "singular": KIND.lower(), "kind": KIND},
                  "versions": [{"name": "v1", "served": True, "storage": True}]}},
        {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "op0"},
         "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "op0-system",
                               "name": "controller"},
                  "criteria": [{"type": "Finalizer",
                                "finalizer": {"group": GROUP, "resource": PLURAL, "finalizerName": FINALIZER}}]}},
    ]
    return out


def _cr(j: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": KIND,
            "metadata": {"name": f"widget-{j:07d}", "namespace": f"tenant-{j % TENANTS}",
                         "labels": {"app.kubernetes.io/instance": f"widget-{j:07d}"}, "finalizers": [FINALIZER]},
            "spec": {"size": j % 10}}


def load(objects: int, budget: float) -> tuple[Any, dict[str, Any]]:
    from criticalsvc.sim.store import Store

    store = Store(clock=time.time)
    t0 = time.perf_counter()
    for obj in _base():
        store.create(obj)
    target, reduced_from = objects, None
    for j in range(objects):
        if j == PROBE and objects > REDUCED:
            predicted = (time.perf_counter() - t0) / PROBE * objects
            if predicted > budget:
                target, reduced_from = REDUCED, objects
                print(f"   coldstart: loading {objects} objects would take ~{predicted:.0f} s "
                      f"(> {budget:g} s); using {REDUCED}", file=sys.stderr, flush=True)
        if j >= target:
            break
        store.create(_cr(j))
    seconds = time.perf_counter() - t0
    return store, {"objects": target, "reducedFrom": reduced_from, "loadSeconds": round(seconds, 2),
                   "loadObjectsPerSecond": round(target / seconds)}


async def start_to_ready(kubeconfig: Path, timeout: float) -> dict[str, Any]:
    from criticalsvc.cache import CacheState, KubeTransport, connect

    t0 = time.perf_counter()
    api = await connect(kubeconfig=str(kubeconfig))
    transport = KubeTransport(api)
    cache = CacheState(transport)
    try:
        await cache.start()
        ready = await cache.wait_ready(timeout)
        elapsed = time.perf_counter() - t0
        counts = cache.counts()
    finally:
        await cache.stop()
        await api.close()
    return {"ready": ready, "startToReadySeconds": round(elapsed, 2), "cachedCounts": counts}


def _rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks coldstart", description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--load-budget", type=float, default=60.0, help="seconds allowed for filling the store")
    p.add_argument("--timeout", type=float, default=300.0, help="give up waiting for ready after this")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from criticalsvc.sim.apiserver.server import ServerThread
    from criticalsvc.sim.apiserver.standin import StandIn
    from criticalsvc.sim.kubeconfig import write_kubeconfig

    store, loaded = load(args.objects, args.load_budget)
    print(f"   coldstart: loaded {loaded['objects']} objects in {loaded['loadSeconds']} s", file=sys.stderr, flush=True)
    rss_loaded = _rss_mib()
    # crd_path=None: the stand-in would re-read the CriticalService CRD file on every discovery request.
    with tempfile.TemporaryDirectory(prefix="criticalsvc-coldstart-") as tmp, \
            ServerThread(StandIn(store, crd_path=None)) as url:
        kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url)
        result = asyncio.run(start_to_ready(kubeconfig, args.timeout))
    watched = result["cachedCounts"].get(f"{PLURAL}.{GROUP}", 0)
    section = {**loaded, **result, "watchedObjectsCached": watched,
               "peakRSSMiBAfterLoad": rss_loaded, "peakRSSMiB": _rss_mib(),
               "note": "stand-in and client share one process (GIL): the LIST's encoding is inside the time"}
    emit("coldstart", section, as_json=args.json)
    return 0 if result["ready"] and watched == loaded["objects"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
