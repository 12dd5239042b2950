"""`criticalsvc discover`: propose the CriticalServices that protect what the cluster already depends on."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import attrs

from ..discover.inventory import from_objects
from ..discover.propose import Skipped, access_questions, in_namespace, propose
from ..discover.rbac import review
from ..discover.render import render_json, render_yaml, skipped_lines
from ..errors import InvalidInput
from ..manifests import load_path
from ._source import NO_CLUSTER_HINT, _in_cluster, _kubeconfig_files, add_source_arguments


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "discover", help="propose CriticalServices for the webhooks, APIServices and finalizers a cluster runs",
        description="Find the workloads serving webhooks, CRD conversions and APIServices, and those processing "
                    "finalizers found on live objects, and print the CriticalServices that would protect them "
                    "(with their evidence), the read grants the gate needs, and what was skipped.")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    p.add_argument("--enforcement", choices=("Enforce", "Warn"), default="Enforce",
                   help="spec.enforcement of the proposals (Warn: roll out in audit mode first)")
    p.add_argument("--gate-namespace", default="criticalsvc-system", metavar="NS",
                   help="the gate's own namespace, whose workloads are left out (default %(default)s)")
    add_source_arguments(p, namespace_help="propose only for the workloads in this namespace (the whole cluster is "
                                           "still read: what they serve and the objects carrying their finalizers "
                                           "live anywhere)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    unreadable: tuple[str, ...] = ()
    if args.state:
        inv = from_objects(m.obj for m in load_path(args.state))
        answers = {q: review(q, inv) for q in access_questions(inv, gate_namespace=args.gate_namespace)}
    else:
        from ..discover.read import read_cluster

        if args.kubeconfig is None and not _kubeconfig_files(None) and not _in_cluster():
            raise InvalidInput("--kubeconfig", f"no cluster configuration: not in a pod, no $KUBECONFIG and no "
                               f"~/.kube/config; {NO_CLUSTER_HINT}")

        read, answers = read_cluster(kubeconfig=args.kubeconfig, context=args.context,
                                     questions_for=lambda i: access_questions(i, gate_namespace=args.gate_namespace))
        inv, unreadable = read.inventory, read.unreadable
    discovery = propose(inv, answers, gate_namespace=args.gate_namespace)
    if args.namespace:
        discovery = in_namespace(discovery, args.namespace)
    if unreadable:
        discovery = attrs.evolve(discovery, skipped=discovery.skipped + tuple(
            Skipped(u.partition(": ")[0], f"could not be listed, its finalizers are unknown: {u.partition(': ')[2]}")
            for u in unreadable))
    if args.output == "json":
        sys.stdout.write(render_json(discovery, enforcement=args.enforcement))
        for line in skipped_lines(discovery):
            print(line, file=sys.stderr)
    else:
        sys.stdout.write(render_yaml(discovery, enforcement=args.enforcement))
    return 0
