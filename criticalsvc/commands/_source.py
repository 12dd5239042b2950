"""Where operator commands (`explain`, `graph`) read the cluster from: a snapshot or a live cluster."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ..errors import InvalidInput
from ..manifests import load_path
from ..snapshot import build_state
from ..state import MemoryState

# What to do without a cluster, in words that work for `explain` and `graph` (they take no --embedded).
NO_CLUSTER_HINT = ("pass --state SNAPSHOT.yaml (e.g. the bundle you applied), or start a simulated cluster with "
                   "`criticalsvc serve --embedded --kubeconfig-out /tmp/k &` and pass --kubeconfig /tmp/k")
IN_CLUSTER_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def add_source_arguments(p: argparse.ArgumentParser, *, namespace_help: str) -> None:
    """The options kubectl users expect on anything that reads a cluster (-n, --context, --kubeconfig,
    $KUBECONFIG), so that `criticalsvc X` and `kubectl criticalsvc X` take the same flags as kubectl."""
    p.add_argument("-n", "--namespace", default="", help=namespace_help)
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="read the live cluster through this kubeconfig (default: $KUBECONFIG, ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--state", metavar="SNAPSHOT.yaml",
                   help="read a snapshot (kubectl get ... -o yaml) instead of a live cluster")


def _in_cluster() -> bool:
    return "KUBERNETES_SERVICE_HOST" in os.environ


def _kubeconfig_files(kubeconfig: str | None) -> list[str]:
    """The kubeconfig files kubectl would read, in its order of precedence."""
    if kubeconfig:
        return [kubeconfig]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [p for p in env.split(os.pathsep) if p]
    home = os.path.expanduser("~/.kube/config")
    return [home] if os.path.isfile(home) else []


def load_source(args: argparse.Namespace) -> MemoryState:
    if args.state:
        return build_state(load_path(args.state))
    from ..livesnapshot import snapshot_cluster

    if args.kubeconfig is None and not _kubeconfig_files(None) and not _in_cluster():
        raise InvalidInput("--kubeconfig", f"no cluster configuration: not in a pod, no $KUBECONFIG and no "
                           f"~/.kube/config; {NO_CLUSTER_HINT}")
    try:
        return snapshot_cluster(kubeconfig=args.kubeconfig, context=args.context)
    except InvalidInput as exc:
        if "--embedded" in exc.problem and "serve --embedded" not in exc.problem:  # a hint for `serve`, not here
            problem = exc.problem.split(" (try --embedded")[0]
            raise type(exc)(exc.path, f"{problem}; {NO_CLUSTER_HINT}", where=exc.where) from None
        raise


def default_namespace(args: argparse.Namespace) -> str:
    """The namespace kubectl would use without -n: the kubeconfig's current context's namespace
    (--context picks another context), the pod's own namespace in a cluster, else "default".

    With --state and no --kubeconfig/--context, "default": a snapshot has no context."""
    if args.state and not args.kubeconfig and not args.context:
        return "default"
    files = _kubeconfig_files(args.kubeconfig)
    if not files and not args.kubeconfig and _in_cluster():
        try:
            with open(IN_CLUSTER_NAMESPACE_FILE, encoding="utf-8") as f:
                return f.read().strip() or "default"
        except OSError:
            return "default"
    current: str | None = args.context
    contexts: dict[str, Any] = {}
    for path in files:
        doc = _read_yaml(path)
        if current is None and isinstance(doc.get("current-context"), str) and doc["current-context"]:
            current = doc["current-context"]  # the first file that sets it wins, as in kubectl
        for entry in doc.get("contexts") or ():
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                contexts.setdefault(entry["name"], entry.get("context") or {})  # first definition wins
    context = contexts.get(current or "")
    namespace = context.get("namespace") if isinstance(context, Mapping) else None
    return namespace if isinstance(namespace, str) and namespace else "default"


def _read_yaml(path: str) -> Mapping[str, Any]:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return {}  # reading the cluster reports an unusable kubeconfig, naming it
    return doc if isinstance(doc, Mapping) else {}
