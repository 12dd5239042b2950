"""Hypothesis strategies for teardown scenarios: random operator topologies, bundles and clients.

A topology is a few operators, each with a CRD, CRs carrying its finalizer spread across namespaces
(app namespaces and the operators' own), a provider Deployment (the operator) in its own namespace
(sometimes owned by another object, so the garbage collector deletes it; sometimes with a pod), a
CriticalService (Finalizer + the CRD, and sometimes "wait for operator j's provider"), plus unrelated
ConfigMaps (some owned by others). Objects are grouped into bundles at random, each deleted by a
random client, starting at a random time, with a random seed for the interleaving.

The generator also knows what each CriticalService waits for, in its own terms: that is the
independent oracle the scenario tests check the simulator and the gate against.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import strategies as st

from criticalsvc.manifests import Manifest

# kubectl-repeat is kubectl re-run every 30 s until it succeeds; kubectl-once is a single pass.
CLIENTS = ("manifestwork", "namespace", "kubectl-repeat", "kubectl-once")
RETRYING = ("manifestwork", "namespace", "kubectl-repeat")


@attrs.frozen
class CR:
    name: str
    namespace: str
    finalizer: bool


@attrs.frozen
class Operator:
    index: int
    crs: tuple[CR, ...]
    waits_for: tuple[int, ...]  # operators whose provider must be gone before this one's may go
    owned: bool  # the provider Deployment is owned by a ConfigMap (the garbage collector deletes it)
    pod: bool  # the provider has a pod (owned by the Deployment): namespace deletion deletes pods first

    @property
    def group(self) -> str:
        return f"op{self.index}.example.com"

    @property
    def plural(self) -> str:
        return f"widgets{self.index}"

    @property
    def kind(self) -> str:
        return f"Widget{self.index}"

    @property
    def finalizer(self) -> str:
        return f"{self.group}/cleanup"

    @property
    def namespace(self) -> str:
        return f"op{self.index}-system"

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"

    @property
    def service(self) -> str:
        return f"op{self.index}"


@attrs.frozen
class Extra:
    name: str
    namespace: str
    owner: str | None  # another extra ConfigMap in the same namespace


@attrs.frozen
class Topology:
    operators: tuple[Operator, ...]
    app_namespaces: tuple[str, ...]
    extras: tuple[Extra, ...]
    bundles: tuple[tuple[int, ...], ...]  # per bundle: indices into manifests()
    clients: tuple[str, ...]  # per bundle
    starts: tuple[float, ...]  # per bundle: seconds after the first
    seed: int
    replay: bool = False  # the CriticalServices ask for spec.replayDeletion: WhenTearingDown

    def has_cycle(self) -> bool:
        """Do the operators' waits-for edges close a cycle? (Plain DFS, independent of criticalsvc.graph.)"""
        edges = {op.index: op.waits_for for op in self.operators}
        state: dict[int, int] = {}

        def visit(n: int) -> bool:
            state[n] = 1
            for m in edges.get(n, ()):
                if state.get(m) == 1 or (state.get(m) is None and visit(m)):
                    return True
            state[n] = 2
            return False

        return any(state.get(n) is None and visit(n) for n in edges)

    @property
    def retrying(self) -> bool:
        return all(c in RETRYING for c in self.clients)

    def objects(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for ns in self.app_namespaces:
            out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        for op in self.operators:
            out.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": op.namespace}})
            deployment: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment",
                                          "metadata": {"name": "controller", "namespace": op.namespace}}
            if op.owned:
                out.append({"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "operator-bundle", "namespace": op.namespace}})
                deployment["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "operator-bundle"}]
            out.append(deployment)
            if op.pod:
                out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": "controller-0", "namespace": op.namespace,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "controller",
                                         "blockOwnerDeletion": True}]}})
            out.append({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                        "metadata": {"name": op.crd},
                        "spec": {"group": op.group, "scope": "Namespaced",
                                 "names": {"plural": op.plural, "singular": op.kind.lower(), "kind": op.kind},
                                 "versions": [{"name": "v1", "served": True, "storage": True}]}})
            for cr in op.crs:
                md: dict[str, Any] = {"name": cr.name, "namespace": cr.namespace}
                if cr.finalizer:
                    md["finalizers"] = [op.finalizer]
                out.append({"apiVersion": f"{op.group}/v1", "kind": op.kind, "metadata": md})
        for x in self.extras:
            md = {"name": x.name, "namespace": x.namespace}
            if x.owner is not None:
                md["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": x.owner}]
            out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": md})
        for op in self.operators:
            criteria: list[dict[str, Any]] = [
                {"type": "Finalizer", "finalizer": {"group": op.group, "resource": op.plural,
                                                    "finalizerName": op.finalizer}},
                {"type": "SpecificResource", "specificResource": {
                    "group": "apiextensions.k8s.io", "resource": "customresourcedefinitions", "name": op.crd}}]
            for j in op.waits_for:
                criteria.append({"type": "SpecificResource", "specificResource": {
                    "group": "apps", "resource": "deployments", "namespace": f"op{j}-system", "name": "controller"}})
            out.append({"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
                        "metadata": {"name": op.service},
                        "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": op.namespace,
                                              "name": "controller"},
                                 "criteria": criteria,
                                 **({"replayDeletion": "WhenTearingDown"} if self.replay else {})}})
        return out

    def manifests(self) -> list[Manifest]:
        objs = self.objects()
        bundle_of = {i: b for b, members in enumerate(self.bundles) for i in members}
        return [Manifest(o, f"scenario: document {i + 1}", f"manifestwork/b{bundle_of[i]}")
                for i, o in enumerate(objs)]

    def size(self) -> int:
        return len(self.objects())


@st.composite
def topologies(draw: st.DrawFn, *, max_operators: int = 3, cycles: bool = False,
               clients: tuple[str, ...] = CLIENTS, replay: bool = False) -> Topology:
    n_ops = draw(st.integers(1, max_operators))
    app_namespaces = tuple(f"apps-{j}" for j in range(draw(st.integers(0, 2))))
    all_namespaces = [*app_namespaces, *(f"op{i}-system" for i in range(n_ops))]
    operators = []
    for i in range(n_ops):
        n_crs = draw(st.integers(0, 4))
        crs = tuple(CR(f"w{k}", draw(st.sampled_from(all_namespaces)), draw(st.booleans() | st.just(True)))
                    for k in range(n_crs))
        others = [j for j in range(n_ops) if j != i and (cycles or j < i)]
        waits_for = tuple(sorted(draw(st.sets(st.sampled_from(others), max_size=2)))) if others else ()
        operators.append(Operator(i, crs, waits_for, draw(st.booleans()), draw(st.booleans())))
    extras = []
    for k in range(draw(st.integers(0, 3))):
        ns = draw(st.sampled_from(all_namespaces))
        candidates = [x.name for x in extras if x.namespace == ns]
        owner = draw(st.none() | st.sampled_from(candidates)) if candidates else None
        extras.append(Extra(f"extra-{k}", ns, owner))
    topo = Topology(tuple(operators), app_namespaces, tuple(extras), (), (), (), 0)
    n_objects = topo.size()
    n_bundles = draw(st.integers(1, 3))
    assignment = [draw(st.integers(0, n_bundles - 1)) for _ in range(n_objects)]
    bundles = tuple(tuple(i for i, b in enumerate(assignment) if b == k) for k in range(n_bundles))
    bundles = tuple(b for b in bundles if b)
    return attrs.evolve(
        topo,
        bundles=bundles,
        clients=tuple(draw(st.sampled_from(clients)) for _ in bundles),
        starts=tuple(draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 45.0])) for _ in bundles),
        seed=draw(st.integers(0, 2**16)),
        replay=replay,
    )
