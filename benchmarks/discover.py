"""`criticalsvc discover`'s inference at cluster scale, in-process: the cost past the API server's.

    python -m benchmarks discover [--objects 100000] [--namespaces 10000] [--operators 50] [--json]
    python -m benchmarks discover --real [--objects 100000] [--namespaces 10000] [--json]

Builds the LIST answers of a cluster as discover reads it (criticalsvc/discover/read.py): --objects
ConfigMaps as PartialObjectMetadata spread over --namespaces namespaces (one in ten carrying one of the
operators' finalizers, one in a hundred terminating), and --operators operators, each a Deployment with its
Service, EndpointSlice, ReplicaSet and Pod, a ServiceAccount bound to update its own custom resource type and a
webhook configuration; plus a cluster-admin account. Then times, in this process: the inventory built from
those pages (what the reader does per page), the access questions and their RBAC answers (a snapshot's
SubjectAccessReviews), the proposal, and the YAML, and reports peak traced memory. The API server's own cost
(the LIST pages themselves) is not in it: on a real cluster that is the metadata LIST of every type.

With --real, the whole command on the real control plane instead (tests/realcluster; not part of CI: minutes of
loading): benchmarks/realscale.py's cluster shape without pods or CriticalServices (--namespaces namespaces,
--objects ConfigMaps spread over them, each namespace's first carrying a finalizer), loaded by its Go loader, then
`criticalsvc discover --kubeconfig` run as a user runs it, in its own process: wall time, peak RSS, and the
objects it read.
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from typing import Any

from criticalsvc.api import GroupResource
from criticalsvc.discover.inventory import CLUSTERROLEBINDINGS, CLUSTERROLES, InventoryBuilder
from criticalsvc.discover.propose import access_questions, propose
from criticalsvc.discover.rbac import review
from criticalsvc.discover.render import render_yaml

CONFIGMAPS = GroupResource("", "configmaps")


def pages(objects: int, namespaces: int, operators: int) -> list[tuple[GroupResource, dict[str, Any]]]:
    from tests.discover_cluster import (
        cluster_role,
        cluster_role_binding,
        custom,
        deployment,
        rule,
        webhook_configuration,
        workload_with_service,
    )

    out: list[tuple[GroupResource, dict[str, Any]]] = []
    kinds = {"Deployment": GroupResource("apps", "deployments"), "Service": GroupResource("", "services"),
             "ReplicaSet": GroupResource("apps", "replicasets"), "Pod": GroupResource("", "pods"),
             "EndpointSlice": GroupResource("discovery.k8s.io", "endpointslices"),
             "ValidatingWebhookConfiguration": GroupResource("admissionregistration.k8s.io",
                                                             "validatingwebhookconfigurations")}
    for k in range(operators):
        ns, name = f"op-{k}", f"operator{k}-controller"
        for o in workload_with_service(ns, name, sa=name):
            out.append((kinds[o["kind"]], o))
        out.append((kinds["ValidatingWebhookConfiguration"], webhook_configuration(name, ns, name)))
        out.append((CLUSTERROLES, cluster_role(name, [rule([f"operator{k}.example.com"], ["*"])])))
        out.append((CLUSTERROLEBINDINGS, cluster_role_binding(name, name, (ns, name))))
        for j in range(max(1, objects // (10 * operators))):
            out.append((GroupResource(f"operator{k}.example.com", "widgets"),
                        custom(f"operator{k}.example.com/v1", "Widget", f"scale-{j % namespaces}", f"w{j}",
                               finalizers=[f"operator{k}.example.com/cleanup"])))
    out.append((kinds["Deployment"], deployment("admin", "everything", sa="admin")))
    out.append((CLUSTERROLES, cluster_role("cluster-admin", [rule(["*"], ["*"], ["*"])])))
    out.append((CLUSTERROLEBINDINGS, cluster_role_binding("admin", "cluster-admin", ("admin", "admin"))))
    for j in range(objects):
        m: dict[str, Any] = {"name": f"cm-{j}", "namespace": f"scale-{j % namespaces}", "uid": f"u{j}",
                             "resourceVersion": str(j), "labels": {"tier": "backend"}}
        if j % 100 == 0:
            m["deletionTimestamp"] = "2026-12-07T00:00:00Z"
            m["finalizers"] = ["kubernetes.io/legacy"]
        out.append((CONFIGMAPS, {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": m}))
    return out


def run(objects: int, namespaces: int, operators: int) -> dict[str, Any]:
    items = pages(objects, namespaces, operators)
    timed = _run(items, traced=False)
    traced = _run(items, traced=True)
    return {**timed, "peakTracedMiB": traced["peakTracedMiB"]}


def _run(items: list[tuple[GroupResource, dict[str, Any]]], *, traced: bool) -> dict[str, Any]:
    """One pass; with `traced`, under tracemalloc (which slows it several-fold: its times are not reported)."""
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    builder = InventoryBuilder()
    for gr, obj in items:
        builder.add(gr, obj)
    inv = builder.build()
    t1 = time.perf_counter()
    questions = access_questions(inv)
    answers = {q: review(q, inv) for q in questions}
    t2 = time.perf_counter()
    discovery = propose(inv, answers)
    t3 = time.perf_counter()
    text = render_yaml(discovery)
    t4 = time.perf_counter()
    peak = 0
    if traced:
        _current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {"objects": inv.objects, "proposals": len(discovery.proposals), "accessQuestions": len(questions),
            "inventorySeconds": round(t1 - t0, 3), "accessSeconds": round(t2 - t1, 3),
            "proposeSeconds": round(t3 - t2, 3), "renderSeconds": round(t4 - t3, 3),
            "totalSeconds": round(t4 - t0, 3), "peakTracedMiB": round(peak / 2**20, 1), "yamlBytes": len(text)}


# `criticalsvc ARGS...` in this process, then its own peak RSS (KiB) as the last line of stderr.
_MEASURED = ("import resource, sys\nfrom criticalsvc.cli import main\ncode = main(sys.argv[1:])\n"
             "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)")


def run_real(objects: int, namespaces: int) -> dict[str, Any]:
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from tests.realcluster import build
    from tests.realcluster.controlplane import ControlPlane

    from .realscale import EMPTY, LOADER_MODULE, Layout, Loader, go_binary

    if build.cached(build.selected_minor()) is None and (reason := build.missing_toolchain()) is not None:
        return {"skipped": reason}
    binaries = build.ensure_built(build.selected_minor())
    go_binary(LOADER_MODULE)
    layout = Layout(namespaces, objects, 0, 0)
    with tempfile.TemporaryDirectory(prefix="bench-discover-") as tmp:
        plane = ControlPlane(binaries, Path(tmp), workloads=False)
        try:
            plane.start()
            loader = Loader(plane, Path(tmp))
            started = time.perf_counter()
            created = sum(loader.create(items)["created"] for items in (layout.namespaces_from(EMPTY),
                                                                       layout.objects_from(EMPTY)))
            load_seconds = time.perf_counter() - started
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _MEASURED, "discover", "--kubeconfig",
                                   str(plane.admin_kubeconfig), "-o", "json"], capture_output=True, text=True,
                                  check=False)
            seconds = time.perf_counter() - started
            if done.returncode != 0:
                return {"error": done.stderr[-2000:]}
            *lines, rss = done.stderr.splitlines()
            skipped = [line for line in lines if line.startswith("skipped ")]
            return {"kubernetes": binaries.kubernetes_version, "created": created,
                    "loadSeconds": round(load_seconds, 1), "discoverSeconds": round(seconds, 2),
                    "discoverPeakRssMiB": round(int(rss) / 1024, 1),
                    "proposals": len(json.loads(done.stdout)["items"]), "skipped": len(skipped),
                    "firstSkipped": skipped[:3]}
        finally:
            plane.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks discover", description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=100_000)
    p.add_argument("--namespaces", type=int, default=10_000)
    p.add_argument("--operators", type=int, default=50)
    p.add_argument("--real", action="store_true", help="on the real control plane (minutes of loading)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = run_real(args.objects, args.namespaces) if args.real else run(args.objects, args.namespaces,
                                                                           args.operators)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>18}: {v}")
    return 0
