"""Scale: in-process decision latency as CriticalServices and cached objects grow; bytes per cached object.

    python -m benchmarks scale [--decisions 10000] [--services 10,100,1000,10000] [--crs-per-service 10]
                               [--objects-services 100] [--objects 1000,10000,50000,200000]
                               [--matching 10,100,1000,10000] [--memory-objects 200000] [--seed 0] [--json]
                               [--conditions-matching 10,1000,10000] [--condition EXPR]
                               [--selectors-services 10,100,1000]

The cluster is generated, not loaded: N operators, each a Namespace, a provider Deployment, a CRD
and a CriticalService (a Finalizer criterion on its CRs plus a SpecificResource criterion on its
CRD), CRs carrying their operator's finalizer spread over 100 tenant namespaces, and filler
ConfigMaps no CriticalService names. Three sweeps, each varying one thing:

    services sweep   N = 10 .. 10,000 CriticalServices, 10 CRs each (the cluster grows with N)
    objects sweep    100 CriticalServices x 10 CRs, filled up with ConfigMaps to 1k .. 200k objects
    matching sweep   1 CriticalService whose Finalizer criterion matches 10 .. 10,000 CRs
    conditions sweep the matching sweep's cluster at 10 .. 10,000 CRs, each size twice: without a
                     condition and with --condition on the Finalizer criterion (default
                     `object.spec.size % 2 == 0`: half the CRs count), timed interleaved in one sweep,
                     so the two figures of a size are comparable (issue 11)
    selectors sweep  N = 10 .. 1,000 CriticalServices, each twice: the provider named
                     (`name: controller`) and the same provider chosen by a label selector
                     (`selector: {matchLabels: {app.kubernetes.io/name: opN, ...component: controller}}`
                     in its namespace), timed interleaved (issue 11)

Each point times `decide()` (time.perf_counter_ns around the call only) over a random mix of the
DELETEs a gate sees: a provider Deployment (protected: a Finalizer criterion holds), a CRD (protected:
SpecificResource), a CR, a tenant Namespace, an unrelated ConfigMap, a provider's Namespace. The
mix is the same for every point, so the p50/p99 growth across a sweep is the cost of scale alone.
The points of a sweep are timed interleaved (--rounds blocks each, round-robin; see `sweep`), so
outside load on a shared machine lands on all of them alike.

Memory: tracemalloc traces building raw object dicts (fresh strings, as a JSON decoder makes them),
projecting them to KubeObjects and upserting them into a MemoryState; the dicts are then dropped and
what stays allocated, divided by the object count, is the cost of one cached object (goal <= 500 B).
It is measured twice, without and with --condition evaluated on every object as it is projected (the
cache stores its outcome, not the object: criticalsvc/objects.py).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
import tracemalloc
import uuid
from typing import Any

from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import GroupResource
from criticalsvc.condition import compile_condition
from criticalsvc.decision import decide
from criticalsvc.manifests import Manifest
from criticalsvc.objects import project
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState

from .report import emit, percentile

TENANTS = 100
DEPLOYMENTS = GroupResource("apps", "deployments")
NAMESPACES = GroupResource("", "namespaces")
CRDS = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
CONFIGMAPS = GroupResource("", "configmaps")


def _uid(i: int) -> str:
    # A version-4 UUID, as the API server generates them (a deterministic one per object).
    return str(uuid.UUID(int=(i * 0x9E3779B97F4A7C15F39CC0605CEDC835) % 2**128, version=4))


# Half the CRs count (spec.size is the CR's index): the evaluation and the filtering both do work.
DEFAULT_CONDITION = "object.spec.size % 2 == 0"


def cluster(services: int, crs: int, filler: int = 0, condition: str | None = None,
            selector: bool = False) -> list[Manifest]:
    """Manifests of `services` operators, `crs` CRs spread evenly over them and TENANTS namespaces,
    and `filler` ConfigMaps no CriticalService names (a bigger cluster, nothing more to match); with
    `condition`, every Finalizer criterion carries it and every CR a spec.size to read; with
    `selector`, every CriticalService chooses its provider by the Deployment's labels, not its name."""
    out: list[Manifest] = []
    n = 0

    def add(obj: dict[str, Any]) -> None:
        nonlocal n
        n += 1
        obj["metadata"].setdefault("uid", _uid(n))
        out.append(Manifest(obj, f"generated: document {n}"))

    for t in range(TENANTS):
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"tenant-{t}"}})
    for i in range(services):
        group, plural, kind = f"op{i}.example.com", f"widgets{i}", f"Widget{i}"
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"op{i}-system"}})
        add({"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "controller", "namespace": f"op{i}-system", "labels": _controller_labels(i)}})
        add({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": f"{plural}.{group}"},
             "spec": {"group": group, "scope": "Namespaced",
                      "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                      "versions": [{"name": "v1", "served": True, "storage": True}]}})
        add({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": f"op{i}"},
             "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": f"op{i}-system",
                                   **({"selector": {"matchLabels": _controller_labels(i)}} if selector
                                      else {"name": "controller"})},
                      "criteria": [{"type": "Finalizer",
                                    "finalizer": {"group": group, "resource": plural,
                                                  "finalizerName": f"{group}/cleanup"},
                                    **({"condition": condition} if condition else {})},
                                   {"type": "SpecificResource",
                                    "specificResource": {"group": "apiextensions.k8s.io",
                                                         "resource": "customresourcedefinitions",
                                                         "name": f"{plural}.{group}"}}]}})
    for j in range(crs):
        i = j % services
        group, kind = f"op{i}.example.com", f"Widget{i}"
        add({"apiVersion": f"{group}/v1", "kind": kind,
             "metadata": {"name": f"w{j}", "namespace": f"tenant-{j % TENANTS}",
                          "labels": {"app.kubernetes.io/instance": f"w{j}"},
                          "finalizers": [f"{group}/cleanup"]},
             **({"spec": {"size": j}} if condition else {})})
    for k in range(filler):
        add({"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": f"cm-{k}", "namespace": f"tenant-{k % TENANTS}",
                          "labels": {"app.kubernetes.io/instance": f"cm-{k}"}}})
    return out


def _controller_labels(i: int) -> dict[str, str]:
    return {"app.kubernetes.io/name": f"op{i}", "app.kubernetes.io/component": "controller"}


def requests(services: int, crs: int, count: int, rng: random.Random) -> list[AdmissionRequest]:
    """`count` DELETE requests, the mix described in the module docstring."""
    out = []
    for k in range(count):
        i = rng.randrange(services)
        group, plural = f"op{i}.example.com", f"widgets{i}"
        kind = k % 6
        if kind == 0:
            ns, name = f"op{i}-system", "controller"
            req = AdmissionRequest(f"u{k}", DEPLOYMENTS, "DELETE", name, ns, kind="Deployment", old_object={
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns, "labels": _controller_labels(i)}})
        elif kind == 1:
            name = f"{plural}.{group}"
            req = AdmissionRequest(f"u{k}", CRDS, "DELETE", name, "", kind="CustomResourceDefinition",
                                   old_object={"apiVersion": "apiextensions.k8s.io/v1",
                                               "kind": "CustomResourceDefinition", "metadata": {"name": name}})
        elif kind == 2 and crs:
            j = rng.randrange(crs)
            i = j % services
            group, plural = f"op{i}.example.com", f"widgets{i}"
            ns = f"tenant-{j % TENANTS}"
            req = AdmissionRequest(f"u{k}", GroupResource(group, plural), "DELETE", f"w{j}", ns, kind=f"Widget{i}",
                                   old_object={"apiVersion": f"{group}/v1", "kind": f"Widget{i}",
                                               "metadata": {"name": f"w{j}", "namespace": ns,
                                                            "finalizers": [f"{group}/cleanup"]}})
        elif kind == 3:
            ns = f"tenant-{rng.randrange(TENANTS)}"
            req = AdmissionRequest(f"u{k}", NAMESPACES, "DELETE", ns, ns, kind="Namespace",
                                   old_object={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        elif kind == 4:
            ns = f"tenant-{rng.randrange(TENANTS)}"
            req = AdmissionRequest(f"u{k}", CONFIGMAPS, "DELETE", "settings", ns, kind="ConfigMap",
                                   old_object={"apiVersion": "v1", "kind": "ConfigMap",
                                               "metadata": {"name": "settings", "namespace": ns}})
        else:
            ns = f"op{i}-system"
            req = AdmissionRequest(f"u{k}", NAMESPACES, "DELETE", ns, ns, kind="Namespace",
                                   old_object={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        out.append(req)
    return out


def build_point(services: int, crs: int, filler: int = 0, condition: str | None = None,
                selector: bool = False) -> tuple[MemoryState, dict[str, Any]]:
    t0 = time.perf_counter()
    manifests = cluster(services, crs, filler, condition, selector)
    state = build_state(manifests)
    info = {"services": services, "crs": crs, "matchingPerService": crs // services, "objects": len(manifests),
            "buildSeconds": round(time.perf_counter() - t0, 2), "condition": condition or "",
            "provider": "selector" if selector else "name"}
    return state, info


# (services, CRs, filler ConfigMaps[, condition[, selector]]): the arguments of build_point.
Point = tuple[int, int, int] | tuple[int, int, int, str | None] | tuple[int, int, int, str | None, bool]


def sweep(points: list[Point], *, decisions: int, rounds: int, seed: int) -> list[dict[str, Any]]:
    """Build every point's state, then time `decisions` per point in `rounds` blocks, round-robin.

    Interleaved because the machine is shared: a burst of outside load (or a collection) lasting a
    second would land on one point if the points ran one after another, and that point's p99 would be
    the burst, not the scale. Round-robin, with the order rotating each round, spreads it over all.
    The states are built first and the heap then frozen (gc.freeze, as `criticalsvc serve` does after
    loading), so a full collection does not walk the other points' objects in the middle of a block.
    """
    built = [build_point(*pt) for pt in points]
    gc.collect()
    gc.freeze()
    reqs = [requests(info["services"], info["crs"], decisions, random.Random(seed)) for _, info in built]
    for (state, _), rs in zip(built, reqs, strict=True):
        for r in rs[:200]:  # warm-up: first calls pay for imports, caches, attribute lookups
            decide(r, state)
    samples: list[list[int]] = [[] for _ in built]
    denied = [0] * len(built)
    bounds = [decisions * k // rounds for k in range(rounds + 1)]
    clock = time.perf_counter_ns
    for k in range(rounds):
        order = list(range(len(built)))
        order = order[k % len(order):] + order[: k % len(order)]
        for i in order:
            state, out = built[i][0], samples[i]
            for r in reqs[i][bounds[k]:bounds[k + 1]]:
                t0 = clock()
                d = decide(r, state)
                out.append(clock() - t0)
                denied[i] += not d.allowed
    results = []
    for (_, info), xs, n_denied in zip(built, samples, denied, strict=True):
        xs.sort()
        info.update({"p50us": round(percentile(xs, 50) / 1000, 1), "p99us": round(percentile(xs, 99) / 1000, 1),
                     "maxus": round(xs[-1] / 1000, 1), "meanus": round(sum(xs) / len(xs) / 1000, 1),
                     "denied": n_denied, "decisions": len(xs)})
        cond = f" (condition {info['condition']})" if info["condition"] else ""
        cond += " (provider by selector)" if info["provider"] == "selector" else ""
        print(f"   scale: {info['services']} services, {info['objects']} objects{cond}: p50 {info['p50us']} us, "
              f"p99 {info['p99us']} us (build {info['buildSeconds']} s)", file=sys.stderr, flush=True)
        results.append(info)
    del built
    gc.unfreeze()
    gc.collect()
    return results


def memory_per_object(count: int, condition: str | None = None) -> dict[str, Any]:
    """tracemalloc bytes that stay allocated per CR cached in a MemoryState (see the module docstring)."""
    conditions = (compile_condition(condition, "--condition"),) if condition else ()
    state = MemoryState()
    gr = GroupResource("op0.example.com", "widgets0")
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for j in range(count):
        raw = {"apiVersion": "op0.example.com/v1", "kind": "Widget0",
               "metadata": {"name": f"widget-{j:07d}", "namespace": f"tenant-{j % TENANTS}", "uid": _uid(j),
                            "resourceVersion": str(1000 + j),
                            "labels": {"app.kubernetes.io/instance": f"widget-{j:07d}",
                                       "app.kubernetes.io/managed-by": "op0"},
                            "finalizers": ["op0.example.com/cleanup"]},
               "spec": {"size": j}}
        state.upsert(project(raw, gr, conditions))
        del raw
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per = (current - base) / count
    return {"objects": count, "bytesPerObject": round(per), "goalBytes": 500, "met": per <= 500,
            "tracedMiB": round((current - base) / 2**20, 1), "peakMiB": round((peak - base) / 2**20, 1),
            "objectShape": "name, namespace, uid, 2 labels, 1 finalizer" + (f", condition {condition}" if condition
                                                                               else "")}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """The services and objects sweeps' options (shared with scale_http, so both time the same points)."""
    p.add_argument("--services", type=_ints, default=[10, 100, 1000, 10_000])
    p.add_argument("--crs-per-service", type=int, default=10, help="CRs per CriticalService in both sweeps")
    p.add_argument("--objects-services", type=int, default=100, help="CriticalServices in the objects sweep")
    p.add_argument("--objects", type=_ints, default=[1000, 10_000, 50_000, 200_000],
                   help="cached objects in the objects sweep (the rest beyond the operators' are ConfigMaps)")


def _growth(rows: list[dict[str, Any]], key: str) -> float:
    return round(rows[-1][key] / rows[0][key] - 1, 3) if rows and rows[0][key] else 0.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__.splitlines()[0])
    p.add_argument("--decisions", type=int, default=10_000, help="decisions timed per point")
    add_sweep_arguments(p)
    p.add_argument("--matching", type=_ints, default=[10, 100, 1000, 10_000],
                   help="CRs one Finalizer criterion matches, in the matching sweep (1 CriticalService)")
    p.add_argument("--memory-objects", type=int, default=200_000)
    p.add_argument("--conditions-matching", type=_ints, default=[10, 1000, 10_000],
                   help="CRs of the conditions sweep's points (each timed without and with --condition)")
    p.add_argument("--condition", default=DEFAULT_CONDITION, help="the CEL condition of the conditions sweep")
    p.add_argument("--selectors-services", type=_ints, default=[10, 100, 1000],
                   help="CriticalServices of the selectors sweep's points (each timed named and by selector)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved blocks each point's decisions are split into")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.decisions < 1 or not 1 <= args.rounds <= args.decisions:
        p.error("need --decisions >= 1 and 1 <= --rounds <= --decisions")

    started = time.perf_counter()
    memory = memory_per_object(args.memory_objects)
    print(f"   scale: {memory['bytesPerObject']} bytes per cached object", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    memory_conditioned = memory_per_object(args.memory_objects, args.condition)
    memory_conditioned["evaluateUsPerObject"] = round((time.perf_counter() - t0) / args.memory_objects * 1e6, 1)
    print(f"   scale: {memory_conditioned['bytesPerObject']} bytes per cached object with a condition",
          file=sys.stderr, flush=True)
    per = args.crs_per_service
    opts = {"decisions": args.decisions, "rounds": args.rounds, "seed": args.seed}
    by_services = sweep([(n, n * per, 0) for n in args.services], **opts)
    n = args.objects_services
    base = len(cluster(n, n * per))
    by_objects = sweep([(n, n * per, max(0, total - base)) for total in args.objects], **opts)
    by_matching = sweep([(1, m, 0) for m in args.matching], **opts)
    by_condition = sweep([(1, m, 0, c) for m in args.conditions_matching for c in (None, args.condition)], **opts)
    by_selector = sweep([(n, n * per, 0, None, sel) for n in args.selectors_services for sel in (False, True)],
                        **opts)
    cols = ["services", "matchingPerService", "objects", "p50us", "p99us", "maxus", "buildSeconds"]

    def table(title: str, rows: list[dict[str, Any]], columns: list[str] = cols) -> dict[str, Any]:
        return {"title": title, "columns": columns, "rows": [[r[c] for c in columns] for r in rows]}

    section = {
        "decisionsPerPoint": args.decisions,
        "p99GrowthServicesSweep": _growth(by_services, "p99us"),
        "p99GrowthObjectsSweep": _growth(by_objects, "p99us"),
        "p99GrowthMatchingSweep": _growth(by_matching, "p99us"),
        "p50GrowthServicesSweep": _growth(by_services, "p50us"),
        "p50GrowthObjectsSweep": _growth(by_objects, "p50us"),
        "p50GrowthMatchingSweep": _growth(by_matching, "p50us"),
        "roundsPerSweep": args.rounds,
        "p99GrowthGoal": 0.10,
        "bytesPerCachedObject": memory["bytesPerObject"],
        "bytesPerCachedObjectGoal": 500,
        "memory": memory,
        "bytesPerCachedObjectWithCondition": memory_conditioned["bytesPerObject"],
        "memoryWithCondition": memory_conditioned,
        "conditionsSweep": by_condition,
        "selectorsSweep": by_selector,
        "p99SelectorOverNamed": [round(b["p99us"] / a["p99us"], 3) for a, b in zip(by_selector[::2], by_selector[1::2],
                                                                                  strict=True) if a["p99us"]],
        "servicesSweep": by_services,
        "objectsSweep": by_objects,
        "matchingSweep": by_matching,
        "wallSeconds": round(time.perf_counter() - started, 1),
        "tables": [
            table(f"services sweep ({per} CRs per CriticalService)", by_services),
            table(f"objects sweep ({n} CriticalServices x {per} CRs, the rest ConfigMaps)", by_objects),
            table("matching sweep (1 CriticalService, N CRs with its finalizer)", by_matching),
            table(f"conditions sweep (1 CriticalService, N CRs; without and with {args.condition})", by_condition,
                  ["condition", "matchingPerService", "objects", "p50us", "p99us", "maxus", "buildSeconds"]),
            table(f"selectors sweep (N CriticalServices x {per} CRs; provider named, then by label selector)",
                  by_selector, ["provider", "services", "objects", "p50us", "p99us", "maxus", "buildSeconds"]),
        ],
    }
    emit("scale", section, as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
