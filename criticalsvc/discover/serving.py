"""Which workload serves a Service: the exact half of discovery (pure).

A webhook's `clientConfig.service`, a CRD's conversion webhook and an APIService's `spec.service` each name
a Service; the Service's traffic goes to its endpoints. The endpoints are read, in this order:

    1. its EndpointSlices (label kubernetes.io/service-name): each endpoint's targetRef names a Pod;
    2. else the Pods in its namespace whose labels match its selector (what the EndpointSlice controller
       would select: https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpointslice/endpointslice_controller.go);
    3. else the workloads in its namespace whose pod template labels match its selector (no pod runs now,
       a snapshot without pods): the pods they would create are the ones it would select.

A Pod is traced to its workload through its controller ownerReference: a ReplicaSet (and that one's
controller, a Deployment), a StatefulSet or a DaemonSet. A pod owned by anything else (a Job, nothing at
all) leaves the Service unresolved: no workload to name as a provider.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ..api import ObjectRef
from .inventory import (
    DAEMONSETS,
    DEPLOYMENTS,
    REPLICASETS,
    STATEFULSETS,
    WORKLOAD_TYPES,
    EndpointSlice,
    Inventory,
    Owned,
    ServiceRef,
    Workload,
)

_CONTROLLER_TYPES = {"ReplicaSet": REPLICASETS, "Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS,
                     "DaemonSet": DAEMONSETS}


@attrs.frozen
class Trace:
    """What serves a Service: the workloads behind it, how that was found, and whether it answers now."""

    service: ServiceRef
    workloads: tuple[ObjectRef, ...]
    evidence: str
    exists: bool = True
    endpoints: int | None = None  # from its EndpointSlices; None when it has none
    ready: int | None = None
    problem: str = ""  # why no workload was found

    @property
    def resolved(self) -> bool:
        return bool(self.workloads)


class Index:
    """The inventory's pods, ReplicaSets, workloads and EndpointSlices by key, built once per inventory."""

    def __init__(self, inv: Inventory) -> None:
        self.inv = inv
        self.pods = {p.ref: p for p in inv.pods}
        self.pods_by_namespace: dict[str, list[Owned]] = {}
        for p in inv.pods:
            self.pods_by_namespace.setdefault(p.ref.namespace, []).append(p)
        self.replicasets = {(r.ref.namespace, r.ref.name): r for r in inv.replicasets}
        self.workloads = {w.ref: w for w in inv.workloads}
        self.slices: dict[tuple[str, str], list[EndpointSlice]] = {}
        for s in inv.endpoint_slices:
            self.slices.setdefault((s.namespace, s.service_name), []).append(s)
        self.services = {(s.namespace, s.name): s for s in inv.services}

    def owner(self, pod: Owned) -> tuple[ObjectRef | None, str]:
        """The workload controlling `pod`, and the chain that shows it ("pod p <- ReplicaSet r <- Deployment d")."""
        if pod.controller is None:
            return None, f"pod {pod.ref.key} has no controller"
        kind, name = pod.controller
        gr = _CONTROLLER_TYPES.get(kind)
        if gr is None:
            return None, (f"pod {pod.ref.key} is controlled by {kind} {name}, not a Deployment, StatefulSet or "
                          "DaemonSet")
        if gr == REPLICASETS:
            rs = self.replicasets.get((pod.ref.namespace, name))
            if rs is None:
                # The ReplicaSet's name is the Deployment's plus the pod-template-hash; without the ReplicaSet
                # (a snapshot that left it out) the Deployment is the one whose name that prefix is.
                guess = _deployment_by_replicaset_name(name, pod.ref.namespace, self.workloads)
                return guess, (f"pod {pod.ref.key} <- ReplicaSet {name} (not read) <- Deployment {guess.name}"
                               if guess else f"pod {pod.ref.key} <- ReplicaSet {name}, which was not found")
            if rs.controller is None or rs.controller[0] != "Deployment":
                return None, f"pod {pod.ref.key} <- ReplicaSet {name}, which no Deployment controls"
            return (ObjectRef(DEPLOYMENTS, pod.ref.namespace, rs.controller[1]),
                    f"pod {pod.ref.key} <- ReplicaSet {name} <- Deployment {rs.controller[1]}")
        return ObjectRef(gr, pod.ref.namespace, name), f"pod {pod.ref.key} <- {kind} {name}"


def _deployment_by_replicaset_name(rs: str, namespace: str,
                                   workloads: Mapping[ObjectRef, Workload]) -> ObjectRef | None:
    prefix, _, _hash = rs.rpartition("-")
    ref = ObjectRef(DEPLOYMENTS, namespace, prefix)
    return ref if prefix and ref in workloads else None


def _matches(selector: Iterable[tuple[str, str]], labels: Iterable[tuple[str, str]]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in selector)


def trace_service(ref: ServiceRef, index: Index) -> Trace:
    """The workloads behind Service `ref` (see the module docstring)."""
    service = index.services.get((ref.namespace, ref.name))
    if service is None:
        return Trace(ref, (), "", exists=False, problem=f"{ref} does not exist")
    slices = index.slices.get((ref.namespace, ref.name), [])
    endpoints = [e for s in slices for e in s.endpoints]
    counts = {"endpoints": len(endpoints), "ready": sum(e.ready for e in endpoints)} if slices else {}
    pods = [index.pods[e.pod] for e in endpoints if e.pod is not None and e.pod in index.pods]
    how = f"the endpoints of its EndpointSlices ({len(endpoints)}, {counts.get('ready', 0)} ready)"
    selector = service.selector or ()
    if not pods and selector:
        pods = [p for p in index.pods_by_namespace.get(ref.namespace, []) if _matches(selector, p.labels)]
        how = f"the pods its selector {_show(selector)} matches"
    found: dict[ObjectRef, str] = {}
    unresolved: list[str] = []
    for pod in sorted(pods, key=lambda p: p.ref):
        owner, chain = index.owner(pod)
        if owner is None:
            unresolved.append(chain)
        else:
            found.setdefault(owner, chain)
    if found:
        chains = "; ".join(found.values())
        return Trace(ref, tuple(sorted(found)), f"{ref} -> {how}: {chains}", **counts)  # type: ignore[arg-type]
    if selector:
        templates = [w for w in index.workloads.values()
                     if w.ref.namespace == ref.namespace and w.ref.group_resource in WORKLOAD_TYPES
                     and w.template_labels and _matches(selector, w.template_labels)]
        if templates:
            names = ", ".join(f"{w.kind} {w.ref.name}" for w in templates)
            return Trace(ref, tuple(sorted(w.ref for w in templates)),
                         f"{ref} -> its selector {_show(selector)} matches the pod template of {names}"
                         f"{' (no pod of it runs now)' if not pods else ''}", **counts)  # type: ignore[arg-type]
    if unresolved:
        problem = f"{ref} -> " + "; ".join(unresolved)
    elif not selector:
        problem = f"{ref} has no selector and no endpoint names a pod"
    else:
        problem = f"{ref}: no pod or workload in namespace {ref.namespace} matches its selector {_show(selector)}"
    return Trace(ref, (), "", problem=problem, **counts)  # type: ignore[arg-type]


def _show(selector: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector)
