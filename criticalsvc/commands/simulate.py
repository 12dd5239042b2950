"""`criticalsvc simulate -f BUNDLE`: delete a bundle in a simulated cluster and watch the gate order it.

Loads the bundle into the simulated control plane (criticalsvc.sim: the real gate as its webhook,
Kubernetes' namespace controller, CRD cleanup and garbage collector, and an operator per Finalizer
criterion), deletes all of it the way the chosen client would, and prints what happened, in virtual
time, and the verdict. `--no-gate` runs the same teardown without the gate: what it saves you from.

Exit codes: 0 the teardown completed, 1 it got stuck (what holds each remaining object is printed),
2 bad input (one line naming the file and document).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import MalformedManifest
from ..sim.cluster import Cluster, Verdict
from ..sim.timeline import REMOVED, Event, render_text
from .plan import add_bundle_arguments, load_bundles

WIDTH = 120  # fixed, so the output is the same in a terminal, a pipe and a test

CLIENT_WORDS = {
    "manifestwork": "the ManifestWork agent: everything at once, each refusal retried with backoff 50 ms → 60 s",
    "kubectl": "kubectl delete -f: one pass in file order, no retry",
    "namespace": "namespace deletion: the bundle's namespaces (and what lives outside them), retried; "
                 "the namespace controller deletes the content",
}


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="delete a bundle in a simulated cluster and show the order the gate enforces",
        description=__doc__.splitlines()[0] if __doc__ else None)
    add_bundle_arguments(p)
    p.add_argument("--client", choices=("manifestwork", "kubectl", "namespace"), default="manifestwork",
                   help="who deletes the bundle (default: manifestwork)")
    p.add_argument("--no-gate", action="store_true", help="run the same teardown without the gate")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for the interleaving: request order, reconcile delays (default 0)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--legacy-namespace-deletion", action="store_true",
                   help="delete namespace content in any order (Kubernetes < 1.33) instead of pods first")
    p.add_argument("--repeat", type=float, metavar="SECONDS",
                   help="with --client kubectl: re-run `kubectl delete -f` every SECONDS until it succeeds")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.repeat is not None and (args.client != "kubectl" or args.repeat <= 0):
        raise MalformedManifest("--repeat", "needs --client kubectl and a positive number of seconds")
    manifests = load_bundles(args.filename)
    cluster = Cluster(gate=not args.no_gate, seed=args.seed,
                      ordered_namespace_deletion=not args.legacy_namespace_deletion)
    cluster.load(manifests)
    cluster.teardown(args.client, repeat=args.repeat)
    verdict = cluster.run()
    if args.output == "json":
        json.dump(to_json(cluster, verdict, args), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(to_text(cluster, verdict, args))
    return 0 if verdict.completed else 1


def _quiet(e: Event) -> bool:
    # A propagation finalizer dropped from an object that still has others says nothing to a reader.
    return e.outcome == REMOVED and e.actor == "garbage-collector"


def to_text(cluster: Cluster, verdict: Verdict, args: argparse.Namespace) -> str:
    n_bundles = len(cluster.bundles)
    total = sum(len(v) for v in cluster.bundles.values())
    client = CLIENT_WORDS[args.client]
    if args.client == "kubectl" and args.repeat:
        client = f"kubectl delete -f, re-run every {args.repeat:g} s until it succeeds"
    ns_mode = "any order (before Kubernetes 1.33)" if args.legacy_namespace_deletion else \
        "pods first (Kubernetes ≥ 1.33)"
    out = [
        f"Tearing down {total} object{'s' if total != 1 else ''} from {', '.join(args.filename)} "
        f"({n_bundles} bundle{'s' if n_bundles != 1 else ''}), all at once.",
        f"  deleted by: {client}",
        f"  gate: {'OFF (--no-gate)' if args.no_gate else 'on'};  namespace content: {ns_mode};  seed: {args.seed}",
        "",
        "What happened (virtual time since the delete; identical retries folded into one line):",
        render_text(cluster.timeline.events, short=cluster.describe, width=WIDTH, hide=_quiet).rstrip("\n"),
        "",
        "Order (marked: deletion started; gone: removed from the API):",
    ]
    name_w = min(max((len(cluster.describe(r)) for r, _m in cluster.order()), default=0), 70)
    for ref, mark in cluster.order():
        gone = f"gone +{mark.gone[0]:.3f}s" if mark.gone else "STILL HERE"
        if mark.marked is not None and mark.marked == mark.gone:
            out.append(f"  {cluster.describe(ref):<{name_w}}  {'deleted at once':<18}  {gone}")
            continue
        marked = f"marked +{mark.marked[0]:.3f}s" if mark.marked else "never marked"
        out.append(f"  {cluster.describe(ref):<{name_w}}  {marked:<18}  {gone}")
    if verdict.remaining:
        out += ["", "What holds each remaining object:"]
        for hold in verdict.remaining:
            state = "terminating" if hold.terminating else "not deleted"
            out.append(f"  {cluster.describe(hold.ref)} ({state})")
            for reason in hold.reasons:
                out.append(f"    - {reason}")
    out += ["", verdict.summary(), ""]
    return "\n".join(out)


def to_json(cluster: Cluster, verdict: Verdict, args: argparse.Namespace) -> dict[str, Any]:
    def ref_dict(ref: Any) -> dict[str, str]:
        return {"group": ref.group_resource.group, "resource": ref.group_resource.resource,
                "namespace": ref.namespace, "name": ref.name, "display": cluster.describe(ref)}

    return {
        "files": list(args.filename),
        "client": args.client,
        "gate": not args.no_gate,
        "seed": args.seed,
        "orderedNamespaceDeletion": not args.legacy_namespace_deletion,
        "bundles": {name: [ref_dict(r) for r in refs] for name, refs in cluster.bundles.items()},
        "events": cluster.timeline.to_json(),
        "order": [{"object": ref_dict(ref),
                   "marked": None if m.marked is None else {"time": round(m.marked[0], 6), "seq": m.marked[1]},
                   "gone": None if m.gone is None else {"time": round(m.gone[0], 6), "seq": m.gone[1]}}
                  for ref, m in cluster.order()],
        "verdict": verdict.to_dict(),
    }
