"""Where operator commands (`explain`, `graph`) read the cluster from: a snapshot or a live cluster."""

from __future__ import annotations

import argparse

from ..manifests import load_path
from ..snapshot import build_state
from ..state import MemoryState


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="read the live cluster through this kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--state", metavar="SNAPSHOT.yaml",
                   help="read a snapshot (kubectl get ... -o yaml) instead of a live cluster")


def load_source(args: argparse.Namespace) -> MemoryState:
    if args.state:
        return build_state(load_path(args.state))
    from ..livesnapshot import snapshot_cluster

    return snapshot_cluster(kubeconfig=args.kubeconfig, context=args.context)
