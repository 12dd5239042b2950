"""Simulate a large teardown and report wall time and peak memory.

    python -m benchmarks teardown [--operators 20] [--crs 500] [--tenants 10] [--client manifestwork]
                                  [--seed 0] [--no-gate] [--json]

The default cluster is 20 operators, each with a CRD, 500 CRs carrying its finalizer spread over
10 tenant namespaces, a provider Deployment in its own namespace and a CriticalService: 10,000 CRs,
10,090 objects in all, one ManifestWork per operator plus one for the tenant namespaces, deleted at
once. Time is split into building the manifests, loading them (every create goes through the gate's
admission) and the teardown; peak memory is the process's maximum resident set size.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

from criticalsvc.manifests import Manifest
from criticalsvc.sim.cluster import Cluster


def bundle(*, operators: int, crs: int, tenants: int) -> list[Manifest]:
    out: list[Manifest] = []

    def add(obj: dict[str, Any], mw: str) -> None:
        out.append(Manifest(obj, f"generated: document {len(out) + 1}", f"manifestwork/{mw}"))

    for t in range(tenants):
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"tenant-{t}"}}, "tenants")
    for i in range(operators):
        group, plural, kind = f"op{i}.example.com", f"widgets{i}", f"Widget{i}"
        finalizer = f"{group}/cleanup"
        mw = f"operator-{i}"
        add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"op{i}-system"}}, mw)
        add({"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "controller", "namespace": f"op{i}-system"}, "spec": {"replicas": 1}}, mw)
        add({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
             "metadata": {"name": f"{plural}.{group}"},
             "spec": {"group": group, "scope": "Namespaced",
                      "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                      "versions": [{"name": "v1", "served": True, "storage": True}]}}, mw)
        for j in range(crs):
            add({"apiVersion": f"{group}/v1", "kind": kind,
                 "metadata": {"name": f"w{j}", "namespace": f"tenant-{j % tenants}", "finalizers": [finalizer]}}, mw)
        add({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": f"op{i}"},
             "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": f"op{i}-system",
                                   "name": "controller"},
                      "criteria": [{"type": "Finalizer",
                                    "finalizer": {"group": group, "resource": plural, "finalizerName": finalizer}},
                                   {"type": "SpecificResource",
                                    "specificResource": {"group": "apiextensions.k8s.io",
                                                         "resource": "customresourcedefinitions",
                                                         "name": f"{plural}.{group}"}}]}}, mw)
    return out


def _peak_rss_mb() -> float:
    # ru_maxrss is in kilobytes on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks teardown", description=__doc__.splitlines()[0])
    p.add_argument("--operators", type=int, default=20)
    p.add_argument("--crs", type=int, default=500, help="CRs per operator")
    p.add_argument("--tenants", type=int, default=10)
    p.add_argument("--client", choices=("manifestwork", "kubectl", "namespace"), default="manifestwork")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-gate", action="store_true")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = p.parse_args(argv)

    rss0 = _peak_rss_mb()
    t0 = time.perf_counter()
    manifests = bundle(operators=args.operators, crs=args.crs, tenants=args.tenants)
    t1 = time.perf_counter()
    cluster = Cluster(gate=not args.no_gate, seed=args.seed)
    cluster.load(manifests)
    t2 = time.perf_counter()
    cluster.teardown(args.client, repeat=30.0 if args.client == "kubectl" else None)
    verdict = cluster.run()
    t3 = time.perf_counter()
    result = {
        "objects": len(manifests), "client": args.client, "gate": not args.no_gate, "seed": args.seed,
        "completed": verdict.completed, "virtualSeconds": round(verdict.elapsed, 3),
        "events": len(cluster.timeline), "denials": verdict.denials,
        "buildSeconds": round(t1 - t0, 3), "loadSeconds": round(t2 - t1, 3), "teardownSeconds": round(t3 - t2, 3),
        "wallSeconds": round(t3 - t0, 3), "peakRSSMiB": round(_peak_rss_mb(), 1),
        "peakRSSMiBAtStart": round(rss0, 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        width = max(len(k) for k in result)
        for k, v in result.items():
            print(f"  {k:<{width}}  {v}")
    return 0 if verdict.completed or args.no_gate else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
