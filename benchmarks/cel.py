"""CEL conditions: per-evaluation time of cel-python alone and of the fast path, on the usual conditions.

    python -m benchmarks cel [--evaluations 500] [--rounds 7] [--json]

Every condition of api/examples and of the realcluster benchmark's churn criteria
(benchmarks/realcluster.py, CHURN_GUARD) is evaluated on objects of its criterion's resource, shaped
as the API server serves them (a Pod with its managedFields, conditions and container statuses), with
`evaluate_condition` as the watch path calls it (pruning included): once with cel-python alone (the
evaluator before the fast path) and once with the fast path (criticalsvc/condition.py, "The fast
path"). The two modes alternate per round, so outside load lands on both alike; reported per case:
the median over rounds of the µs per evaluation, and their ratio (from this one run). An object the
fast program errors on (a Deployment without spec.replicas) is answered by cel-python after the fast
attempt: its row shows what that costs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import yaml

from .report import emit

ROOT = Path(__file__).resolve().parent.parent


def _pod(name: str, phase: str) -> dict[str, Any]:
    containers = [{"name": f"c{i}", "image": f"registry.example.com/app:{i}", "ports": [{"containerPort": 8080 + i}],
                   "env": [{"name": f"E{j}", "value": "x" * 20} for j in range(6)],
                   "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}} for i in range(2)]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "batch", "uid": "0f2c6b3e-5d1a-4c2b-9e8f-1a2b3c4d5e6f",
                     "resourceVersion": "123456", "creationTimestamp": "2026-11-26T10:00:00Z",
                     "labels": {"app": "worker", "pod-template-hash": "5d8f7c9b6"},
                     "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-26T09:59:00Z"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "worker-5d8f7c9b6",
                                          "uid": "1a2b", "controller": True, "blockOwnerDeletion": True}],
                     "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                                        "apiVersion": "v1", "time": "2026-11-26T10:00:00Z",
                                        "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {}}}}]},
        "spec": {"containers": containers, "nodeName": "node-1", "restartPolicy": "Always",
                 "serviceAccountName": "default", "volumes": [{"name": "v", "emptyDir": {}}]},
        "status": {"phase": phase, "podIP": "10.0.0.7", "startTime": "2026-11-26T10:00:01Z",
                   "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-11-26T10:00:02Z"}
                                  for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
                   "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0,
                                          "image": c["image"], "state": {"running": {}}} for c in containers]},
    }


def _deployment(replicas: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "worker"}},
                            "template": {"metadata": {"labels": {"app": "worker"}},
                                         "spec": {"containers": [{"name": "c", "image": "registry.example.com/a:1"}]}}}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "worker", "namespace": "batch", "labels": {"app": "churn-worker"}},
            "spec": spec, "status": {"observedGeneration": 3, "replicas": replicas or 0}}


# The objects each resource's conditions are evaluated on: (label, object).
OBJECTS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "pods": [("Pod Running", _pod("w-1", "Running")), ("Pod Succeeded", _pod("w-2", "Succeeded"))],
    "deployments": [("Deployment replicas 3", _deployment(3)), ("Deployment replicas 0", _deployment(0)),
                    ("Deployment no replicas", _deployment(None))],
    "persistentvolumeclaims": [("PVC Bound", {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "metadata": {"name": "data", "namespace": "batch"},
                                              "spec": {"accessModes": ["ReadWriteOnce"]},
                                              "status": {"phase": "Bound"}})],
    "configmaps": [("ConfigMap state idle", {"apiVersion": "v1", "kind": "ConfigMap",
                                             "metadata": {"name": "cm-1", "namespace": "churn"},
                                             "data": {"state": "idle", "seen": "17"}}),
                   ("ConfigMap no data", {"apiVersion": "v1", "kind": "ConfigMap",
                                          "metadata": {"name": "cm-2", "namespace": "churn"}})],
}


def conditions() -> list[tuple[str, str]]:
    """(resource, condition) of every criterion with a condition in api/examples and the churn guard."""
    from .realcluster import CHURN_GUARD

    found: list[tuple[str, str]] = []
    documents: list[Any] = []
    for path in sorted((ROOT / "api" / "examples").glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    documents.append(CHURN_GUARD)
    for doc in documents:
        for criterion in (doc.get("spec") or {}).get("criteria") or []:
            if isinstance(criterion, dict) and criterion.get("condition"):
                pair = (criterion.get("resources", {}).get("resource", ""), criterion["condition"])
                if pair not in found:
                    found.append(pair)
    return found


def measure(evaluations: int, rounds: int) -> dict[str, Any]:
    from criticalsvc.condition import compile_condition, evaluate_condition

    rows = []
    for resource, expression in conditions():
        fast = compile_condition(expression, "condition")
        slow = attrs.evolve(fast, fast=None)
        for label, obj in OBJECTS.get(resource, []):
            assert evaluate_condition(fast, obj) == evaluate_condition(slow, obj), (expression, label)
            times: dict[str, list[float]] = {"celpy": [], "fast": []}
            for r in range(rounds):
                order = [("celpy", slow), ("fast", fast)]
                for mode, condition in order if r % 2 == 0 else order[::-1]:
                    started = time.perf_counter()
                    for _ in range(evaluations):
                        evaluate_condition(condition, obj)
                    times[mode].append((time.perf_counter() - started) / evaluations * 1e6)
            celpy_us, fast_us = statistics.median(times["celpy"]), statistics.median(times["fast"])
            rows.append([expression, label, repr(evaluate_condition(fast, obj)),
                         "yes" if fast.fast is not None else "no",
                         round(celpy_us, 1), round(fast_us, 1), round(celpy_us / fast_us, 1)])
    return {"evaluations": evaluations, "rounds": rounds,
            "table": {"title": "µs per evaluation (median of rounds; modes alternating)",
                      "columns": ["condition", "object", "outcome", "fast path", "celpy µs", "fast µs",
                                  "celpy / fast"],
                      "rows": rows}}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks cel", description=__doc__.splitlines()[0])
    p.add_argument("--evaluations", type=int, default=500, help="evaluations per timing (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=7, help="timings per mode, alternating (default: %(default)s)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.evaluations < 1 or args.rounds < 1:
        print("python -m benchmarks cel: --evaluations and --rounds must be positive", file=sys.stderr)
        return 2
    emit("cel", measure(args.evaluations, args.rounds), as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
