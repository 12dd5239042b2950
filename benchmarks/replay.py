"""Teardown time against the ideal, with and without replay of refused deletions (issue: makespan/ideal).

    python -m benchmarks replay [--seeds 5] [--real] [--json]

The ideal is the same teardown by an oracle client that deletes each object the moment the gate would
allow it (criticalsvc/sim/clients.py IdealDelete): every phase starts when the previous one ends, so its
teardown time is the critical path. Every other deleter's teardown time (makespan: first DELETE to the
last object gone) is divided by it. A deleter that leaves objects behind has no makespan ("stuck").

Deleters, each with replay off (spec.replayDeletion: Never) and on (WhenTearingDown):

    kubectl          `kubectl delete -f` once, in file order, no retry
    kubectl-rerun    the same re-run by a person every 30 s until it exits 0 (replay off only)
    manifestwork     the OCM work agent: everything at once, each refusal retried 50 ms·2ⁿ ≤ 60 s
    flux             Flux's kustomize-controller deleting a Kustomization: the whole pass again after a refusal,
                     750 ms·2ⁿ; the makespan runs until the Kustomization is gone ("stack gone" beside it)
    namespace        the bundle's namespaces (and what lives outside them), retried as above
    gc-background    the stack is owned by one root object; deleting it (Background) leaves the rest to
    gc-foreground    the garbage collector, which retries a refusal 5 ms·2ⁿ ≤ 1000 s (Foreground: the
                     root waits for its dependents)

The bundle is the reference story (api/examples/reference-story.yaml); the simulator runs in virtual
time (over `--seeds` interleavings; mean and worst ratio). `--real` also runs the replayed kubectl pass,
the retrying client with and without replay, and the ideal on the real control plane (tests/realcluster;
skipped with the reason when it cannot be built), in wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

from benchmarks.replay_cases import CASES, ROOT_OWNER, render
from criticalsvc.manifests import Manifest, load_text
from criticalsvc.sim.clients import FluxKustomization
from criticalsvc.sim.cluster import Cluster
from criticalsvc.sim.timeline import DENIED

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "api" / "examples" / "reference-story.yaml"
SLOW_FINALIZER = (60.0, 120.0)  # seconds a CR's finalizer takes: deleters' backoffs grow meanwhile
GOAL = 1.2  # the bound for the replayed kubectl pass and the replayed retrying client


def story_text(*, replay: bool, owned: bool) -> str:
    """The reference story; with replay on its CriticalService asks for it; `owned`: one root owns it all."""
    docs = [d for d in yaml.safe_load_all(STORY.read_text()) if d]
    for d in docs:
        if d["kind"] == "CriticalService" and replay:
            d["spec"]["replayDeletion"] = "WhenTearingDown"
        if owned:
            d["metadata"]["ownerReferences"] = [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                                 "name": ROOT_OWNER, "blockOwnerDeletion": True}]
    if owned:
        # Any cluster-scoped object can own the stack (an operator's or a GitOps tool's record of it);
        # a ClusterRole without rules is one that costs nothing to delete.
        docs.insert(0, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                        "metadata": {"name": ROOT_OWNER}, "rules": []})
    return yaml.safe_dump_all(docs, sort_keys=False)


def manifests(*, replay: bool, owned: bool) -> list[Manifest]:
    return load_text(story_text(replay=replay, owned=owned), str(STORY), bundle="manifestwork/story")


def simulate(deleter: str, *, replay: bool, seed: int, finalizer: tuple[float, float] | None = None) -> dict[str, Any]:
    owned = deleter.startswith("gc-")
    cluster = _cluster(seed, finalizer)
    cluster.load(manifests(replay=replay, owned=owned))
    client = "kubectl" if deleter == "kubectl-rerun" else deleter
    clients = cluster.teardown(client, repeat=30.0 if deleter == "kubectl-rerun" else None)
    verdict = cluster.run()
    # Flux's teardown ends when its Kustomization is gone (its finalizer removed after a pass without
    # refusal), as benchmarks/replay_real.py measures it; the stack may be gone before.
    owner_gone = [c.gone_at for c in clients if isinstance(c, FluxKustomization) and c.gone_at is not None]
    refused = [f"{e.ref.group_resource}/{e.ref.name}" for e in cluster.timeline.events
               if e.outcome == DENIED and e.ref is not None]
    return {"completed": verdict.completed, "makespan": max([verdict.elapsed, *owner_gone]),
            "stackGone": verdict.elapsed, "refusals": verdict.denials, "refused": refused,
            "replayed": len(cluster.replayer.replayed) if cluster.replayer is not None else 0}


def _cluster(seed: int, finalizer: tuple[float, float] | None) -> Cluster:
    return Cluster(seed=seed) if finalizer is None else Cluster(seed=seed, finalizer_delay=finalizer)


def sim_table(seeds: int, finalizer: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    ideal = {False: [simulate("ideal", replay=False, seed=s, finalizer=finalizer)["makespan"] for s in range(seeds)],
             True: [_ideal_owned(s, finalizer) for s in range(seeds)]}
    rows = []
    for deleter, replay in CASES:
        runs = [simulate(deleter, replay=replay, seed=s, finalizer=finalizer) for s in range(seeds)]
        base = ideal[deleter.startswith("gc-")]
        row: dict[str, Any] = {"deleter": deleter, "replay": replay, "seeds": seeds,
                               "completed": sum(r["completed"] for r in runs),
                               "idealSeconds": round(statistics.mean(base), 3),
                               "refusals": round(statistics.mean(r["refusals"] for r in runs), 1),
                               "replayed": round(statistics.mean(r["replayed"] for r in runs), 1)}
        if all(r["completed"] for r in runs):
            ratios = [r["makespan"] / b for r, b in zip(runs, base, strict=True)]
            row |= {"makespanSeconds": round(statistics.mean(r["makespan"] for r in runs), 3),
                    "ratioMean": round(statistics.mean(ratios), 3), "ratioMax": round(max(ratios), 3)}
            if deleter == "flux":
                row |= {"stackGoneSeconds": round(statistics.mean(r["stackGone"] for r in runs), 3),
                        "refused": runs[0]["refused"]}
        rows.append(row)
    return rows


def _ideal_owned(seed: int, finalizer: tuple[float, float] | None) -> float:
    cluster = _cluster(seed, finalizer)
    cluster.load(manifests(replay=False, owned=True))
    cluster.teardown("ideal")
    return cluster.run().elapsed


def goals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's bound: the replayed kubectl pass and the replayed retrying client within GOAL of the ideal."""
    wanted = [r for r in rows if r["replay"] and r["deleter"] in ("kubectl", "manifestwork")]
    met = all(r.get("ratioMax", float("inf")) <= GOAL for r in wanted)
    return {"goal": f"makespan/ideal <= {GOAL} for kubectl and manifestwork with replay", "met": met}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks replay", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="simulated interleavings per case (default 5)")
    parser.add_argument("--real", action="store_true", help="also measure on the real control plane")
    parser.add_argument("--json", action="store_true", help="print the report section as JSON (last line)")
    args = parser.parse_args(argv)
    rows = sim_table(args.seeds)
    slow = sim_table(args.seeds, SLOW_FINALIZER)
    section: dict[str, Any] = {"simulator": rows, "simulatorGoal": goals(rows), "simulatorSlowFinalizer": slow,
                               "simulatorSlowFinalizerGoal": goals(slow)}
    print(render(rows, "Simulator (virtual time), reference story (its finalizer takes 0.5-2 s per CR):"))
    print(f"goal: {section['simulatorGoal']['goal']}: {'met' if section['simulatorGoal']['met'] else 'NOT met'}")
    print()
    print(render(slow, f"The same with a slow finalizer ({SLOW_FINALIZER[0]:g}-{SLOW_FINALIZER[1]:g} s per CR, "
                       "a cloud resource's cleanup):"))
    print(f"goal: {goals(slow)['goal']}: {'met' if goals(slow)['met'] else 'NOT met'}")
    if args.real:
        from benchmarks import replay_real

        real = replay_real.run()
        section["realcluster"] = real
        if "skipped" in real:
            print(f"\nreal control plane: skipped ({real['skipped']})")
        else:
            print()
            print(render(real["rows"], "Real control plane (wall time), reference story:"))
            print(render(real["slowRows"], f"The same, a slow finalizer ({real['slowFinalizerSeconds']:g} s per CR):"))
            replay_real.print_stack_tables(real)
            section["realclusterGoal"] = goals(real["rows"])
    if args.json:
        print(json.dumps(section))
    met = section["simulatorGoal"]["met"] and section["simulatorSlowFinalizerGoal"]["met"] and \
        section.get("realclusterGoal", {"met": True})["met"]
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
