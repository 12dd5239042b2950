"""`python -m tests.realcluster build|up`: the real control plane for people (`nox -s realcluster -- ...`).

    build [--kubernetes 1.37|1.34] [--argocd]
                                            build the binaries, helm and Flux's kustomize-controller (and with
                                            --argocd Argo CD, for `nox -s realcluster-slow`) into the cache
                                            (once per version)
    up [--kubeconfig-out PATH] [--kubernetes 1.37|1.34] [--replicas N] [--apiservers N] [--dir DIR]
                                            start etcd, kube-apiserver (N of them behind a loopback
                                            balancer, as kubeadm HA runs them), kube-controller-manager,
                                            kube-scheduler, kwok and its fake Node (pods run) and the
                                            gate (installed as a user installs it); run until Ctrl-C
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from . import build

if TYPE_CHECKING:
    from .controlplane import ControlPlane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.realcluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "up"):
        p = sub.add_parser(name)
        p.add_argument("--kubernetes", choices=sorted(build.KUBERNETES_VERSIONS), default=build.selected_minor(),
                       help="Kubernetes minor (default: $CRITICALSVC_KUBERNETES or %(default)s)")
        if name == "up":
            p.add_argument("--kubeconfig-out", type=Path, default=Path("realcluster.kubeconfig"),
                           help="write the admin kubeconfig here (default: %(default)s)")
            p.add_argument("--replicas", type=int, default=1, help="gate replicas (default: %(default)s)")
            p.add_argument("--apiservers", type=int, default=1,
                           help="kube-apiservers over the one etcd, behind a balancer (default: %(default)s)")
            p.add_argument("--dir", type=Path, help="keep the run's files (logs, etcd, certificates) here")
        else:
            p.add_argument("--argocd", action="store_true",
                           help="Argo CD too (its tests run in `nox -s realcluster-slow`; ~17 min cold)")
    args = parser.parse_args(argv)
    if args.command == "up" and args.apiservers < 1:
        parser.error(f"--apiservers {args.apiservers}: at least 1")
    complete = build.cached(args.kubernetes) is not None and (args.command == "up" or (
        build.cached_helm() is not None and build.cached_flux() is not None
        and (not args.argocd or build.cached_argocd() is not None)))
    reason = None if complete else build.missing_toolchain()
    if reason is not None:
        print(f"realcluster: {reason}", file=sys.stderr)
        return 2
    binaries = build.ensure_built(args.kubernetes)
    if args.command == "build":
        build.ensure_helm()
        build.ensure_flux()
        if args.argocd:
            build.ensure_argocd()
        print(binaries.kube_apiserver.parent)
        return 0
    return _up(binaries, args)


STORY_CRD, STORY_CSVC = "crd/coolresources.my.crd.group", "csvc/for-finalizer-deployment"


def quick_start(kubeconfig: Path, kubectl: Path) -> str:
    """The commands `up` prints: the reference story applied, its status read, and deleted until it is gone,
    with the read access the gate needs for its custom resources (each line runs as it is, in bash)."""
    story, reader = "api/examples/reference-story.yaml", "api/examples/rbac/reference-story-reader.yaml"
    lines = [
        f"export KUBECONFIG={kubeconfig}",
        f"export PATH={kubectl.parent}:$PATH",
        f"kubectl apply -f {reader}   # the gate reads every type a CriticalService names",
        f"kubectl apply -f {story}; kubectl wait --for=condition=Established {STORY_CRD}",
        f"kubectl apply -f {story}   # again: the CRs need their CRD first",
        # Enforced: the gate has routed the provider and seen the API server route it (design/routing.md).
        f"kubectl wait --for=condition=Ready {STORY_CSVC} --timeout=60s   # enforced: the API server routes it",
        # Both criteria unmet (the CRs carry the finalizer, the CRD exists), once the gate has read the CRs.
        f"kubectl wait --for=jsonpath='{{.status.unmetCriteria}}'=2 {STORY_CSVC} --timeout=60s; "
        "kubectl get csvc -o wide",
        # Until the CriticalService, which goes last, is gone (the CRs' kind stops mapping once their CRD goes).
        f"while kubectl get {STORY_CSVC} >/dev/null 2>&1; do kubectl delete -f {story} --ignore-not-found "
        "--wait=false; sleep 2; done   # the gate refuses what is out of order; retried",
        f"kubectl wait --for=delete {STORY_CSVC} namespace/finalizer-namespace namespace/cool-apps --timeout=180s",
        f"kubectl delete -f {reader}",
    ]
    return "\n".join(f"  {line}" for line in lines)


def _up(binaries: build.Binaries, args: argparse.Namespace) -> int:
    from .cluster import real_cluster
    from .controlplane import KWOK_NODE
    from .teardown import FinalizerController, Story

    directory = args.dir or Path(tempfile.mkdtemp(prefix="criticalsvc-realcluster-"))
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"starting Kubernetes {binaries.kubernetes_version} in {directory} ...", file=sys.stderr)
    with real_cluster(binaries, directory, replicas=args.replicas, apiservers=args.apiservers) as cluster:
        args.kubeconfig_out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.kubeconfig, args.kubeconfig_out)
        os.chmod(args.kubeconfig_out, 0o600)
        kubectl = binaries.kubectl
        # The reference story's provider, played while its Deployment exists (kwok runs its pods, no container).
        story = Story.make("")
        controller = FinalizerController(cluster.admin, deployment_path=story.deployment_path,
                                         crs_path=f"/apis/{story.group}/v1/coolresources", finalizer=story.finalizer)
        controller.start()
        print(f"""
Kubernetes {binaries.kubernetes_version} is up at {cluster.plane.url}, with the gate installed
(webhooks -> {cluster.gate.url}/validate; {len(cluster.gate.replicas)} replica(s), logs in {cluster.gate.directory}).\
{_apiservers(cluster.plane)}
The reference story from apply to gone (run from the repository's root; a test runs these lines verbatim):

{quick_start(args.kubeconfig_out.resolve(), kubectl)}

Pods run on the fake Node {KWOK_NODE} (kwok plays its kubelet; no container runs), so while
finalizer-deployment exists a stand-in for its controller removes the story's finalizer from deleting
CRs. Control-plane logs: {directory}.
Ctrl-C stops everything.""", flush=True)
        stop.wait()
        print("stopping ...", file=sys.stderr)
        controller.stop()
    if args.dir is None:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


def _apiservers(plane: ControlPlane) -> str:
    """With several API servers: which is where (the URL above is their balancer's)."""
    if plane.apiservers == 1:
        return ""
    each = "".join(f"\n  API server {i}: {url}   (the admin pinned to it: KUBECONFIG={plane.kubeconfig_for(i)})"
                   for i, url in enumerate(plane.urls))
    return (f"\n{plane.url} is a TCP balancer (a new API server per connection, TLS passed through) in front of "
            f"{plane.apiservers} kube-apiservers over the one etcd:{each}")


if __name__ == "__main__":
    sys.exit(main())
