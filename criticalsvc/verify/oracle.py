"""The explorer's judge: what must never happen, and what must be gone at the end - in its own terms.

Independent of the decision code: it reads the configuration's intent (its menus' dicts) and the store's
raw objects, never criticalsvc.criteria, state or decision. Its two properties:

**Safety**, checked at every store event (the first moment an object is marked or gone):

* a provider (named, or each object its selector selects) stops while a criterion of its CriticalService
  is unmet - it is marked or gone, or its namespace starts terminating while it is there (the pods of a
  terminating namespace go first, design/criticalservice.md §3 rule 2), unless every criterion names
  objects in that namespace (confined, §3a: the provider waits inside it);
* a CriticalService is marked or gone while an object it protects exists (rule 3);
* an object labelled deletion-protected is marked or gone (rule 5).

**Liveness**, judged on the verdict: with a retrying deleter, or replay on, everything goes except what
`stays` says the docs say stays (the deletion-protected object and what transitively waits for it:
README, "the label ... keeps a namespace being deleted Terminating until the label is removed"; under Argo
CD, which never deletes a CRD, the CRDs and what waits for them: design/criticalservice.md §6); with a
one-pass deleter and no replay (kubectl once, `helm uninstall`), what is left is only what it was refused, none
of it half-deleted (terminating), besides `stays` (design/criticalservice.md §6, "kubectl delete -f does not retry").

**Enforcement** (`EnforcementOracle`, for criticalsvc/verify/enforcement.py: a CriticalService becoming enforced
while API servers lag on webhook configurations; design/routing.md, "No window, on every API server"):

* while a CriticalService's Ready says `Enforcing`, no DELETE it forbids (of a provider, of a namespace holding one
  unless its criteria are confined there, of a custom provider type's CRD) is admitted by any API server, whatever
  version of the gate's webhook configuration it holds;
* an object the gate labelled `criticalsvc.io/protected` keeps the label while a CriticalService forbids its DELETE:
  no write removes it, and no API server would admit an UPDATE removing it;
* at the end, every object whose DELETE is forbidden carries the label and every Ready says `Enforcing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import networkx as nx

from ..api import GroupResource, ObjectRef
from ..sim.cluster import TeardownVerdict
from ..sim.store import Store, WatchEvent
from .configurations import CRD_NAME, CRITERIA, GROUP, OBJECTS, PLURAL, PROTECTED, PROVIDERS, Configuration

# The label the gate writes on what a CriticalService protects, which the shipped configuration routes by objectSelector
# on every API server (design/routing.md, "No window, on every API server").
PROTECTION_LABEL, PROTECTION_VALUE = "criticalsvc.io/protected", "true"

NAMESPACES = GroupResource("", "namespaces")
# The catalogue object each provider is (or selects).
PROVIDER_OBJECT = {"deploy": "deploy", "cm": "cm", "widget": "widget", "cm-selector": "cm",
                   "widget-selector": "widget", "ns-a": "ns-a", "crd": "crd"}
CRDS = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
CRITICAL_SERVICES = GroupResource("criticalsvc.io", "criticalservices")
# The deleters that retry, or whose garbage collector does.
RETRYING = frozenset({"kubectl-repeat", "namespace", "manifestwork", "gc", "flux", "argocd", "argocd-background"})
# The deleters that never delete a CRD (Argo CD's shouldBeDeleted: `!kube.IsCRD(obj)`), so for them the CRD may stay:
# https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1165-L1170
KEEP_CRDS = frozenset({"argocd", "argocd-background"})
WIDGETS = GroupResource(GROUP, PLURAL)


@attrs.frozen
class Violation:
    property: str  # "safety" or "liveness"
    text: str
    subject: str = ""  # the object it is about: minimization keeps a smaller run only if it is about the same


def _gr(d: Mapping[str, Any]) -> GroupResource:
    return GroupResource(str(d.get("group", "")), str(d["resource"]))


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return obj["metadata"].get("labels") or {}


def _matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    # The menus use matchLabels only.
    return all(labels.get(k) == v for k, v in ((selector or {}).get("matchLabels") or {}).items())


def _ns_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    return obj["metadata"].get("namespace", "") or "", obj["metadata"]["name"]


def _ref(gr: GroupResource, obj: Mapping[str, Any]) -> ObjectRef:
    md = obj["metadata"]
    return ObjectRef(gr, md.get("namespace", "") or "", md["name"])


class Oracle:
    """Subscribes to the store; `violations` collects what it saw. `judge` adds liveness at the end."""

    def __init__(self, store: Store, config: Configuration) -> None:
        self.store, self.config = store, config
        self.violations: list[Violation] = []
        self._going: set[ObjectRef] = set()
        store.subscribe(self._event)

    # --- the configuration's intent over the raw store ----------------------------------------------
    def _objects(self, gr: GroupResource) -> list[Mapping[str, Any]]:
        return list(self.store.list(gr))

    def _covered(self, key: str) -> list[ObjectRef]:
        """The objects criterion `key` still counts."""
        c = CRITERIA[key]
        if c["type"] == "Finalizer":
            f = c["finalizer"]
            return [_ref(_gr(f), o) for o in self._objects(_gr(f)) if f["finalizerName"] in
                    (o["metadata"].get("finalizers") or ())]
        if c["type"] == "SpecificResource":
            t = c["specificResource"]
            gr, ns = _gr(t), t.get("namespace", "")
            return [ObjectRef(gr, ns, t["name"])] if self.store.exists(gr, ns, t["name"]) else []
        r = c["resources"]
        return [_ref(_gr(r), o) for o in self._objects(_gr(r))
                if (r.get("namespace") is None or o["metadata"].get("namespace") == r["namespace"])
                and _matches(r.get("selector"), _labels(o))]

    def unmet(self, i: int) -> list[str]:
        return [f"{key}: {', '.join(str(r) for r in refs)}" for key in self.config.services[i].criteria
                if (refs := self._covered(key))]

    def _provides(self, i: int, gr: GroupResource, obj: Mapping[str, Any]) -> bool:
        p = PROVIDERS[self.config.services[i].provider]
        md = obj["metadata"]
        if _gr(p) != gr or (p.get("namespace") and md.get("namespace") != p["namespace"]):
            return False
        return md["name"] == p["name"] if "name" in p else _matches(p["selector"], _labels(obj))

    def providers(self, i: int) -> list[ObjectRef]:
        gr = _gr(PROVIDERS[self.config.services[i].provider])
        return [_ref(gr, o) for o in self._objects(gr) if self._provides(i, gr, o)]

    def confined(self, i: int, namespace: str) -> bool:
        def inside(key: str) -> bool:
            c = CRITERIA[key]
            if c["type"] == "SpecificResource":
                return bool(c["specificResource"].get("namespace") == namespace)
            return bool(c["type"] == "Resources" and c["resources"].get("namespace") == namespace)
        return all(inside(k) for k in self.config.services[i].criteria)

    # --- safety ---------------------------------------------------------------------------------------
    def _event(self, event: WatchEvent) -> None:
        obj = event.object
        ref = _ref(event.group_resource, obj)
        if not (event.type == "DELETED" or obj["metadata"].get("deletionTimestamp")) or ref in self._going:
            return
        self._going.add(ref)
        how = "is gone" if event.type == "DELETED" else "is marked for deletion"
        if all(_labels(obj).get(k) == v for k, v in PROTECTED.items()):
            self._add("safety", f"{ref} {how} although labelled deletion-protected", ref)
        for i in range(len(self.config.services)):
            name = f"cs{i}"
            if self._provides(i, event.group_resource, obj) and (unmet := self.unmet(i)):
                self._add("safety", f"provider {ref} of {name} {how} while its criteria are unmet ({'; '.join(unmet)})",
                          ref)
            if event.group_resource == NAMESPACES and not self.confined(i, ref.name):
                here = [p for p in self.providers(i) if p.namespace == ref.name]
                if here and (unmet := self.unmet(i)):
                    self._add("safety", f"namespace {ref.name} {how} while it holds {name}'s provider "
                              f"{', '.join(map(str, here))} and {name}'s criteria are unmet ({'; '.join(unmet)})", ref)
            if ref == ObjectRef(CRITICAL_SERVICES, "", name) and (left := self.providers(i)):
                self._add("safety", f"CriticalService {name} {how} while its provider {', '.join(map(str, left))} "
                          "exists", ref)

    def _add(self, prop: str, text: str, subject: object = "") -> None:
        self.violations.append(Violation(prop, text, str(subject)))

    # --- liveness -------------------------------------------------------------------------------------
    def stays(self, deleter: str = "") -> set[ObjectRef]:
        """What the docs say a teardown leaves, from the objects left: those that wait, directly or through
        others, for the deletion-protected object (rule 5: README, "keeps a namespace being deleted Terminating
        until the label is removed"), or for a cycle of waits that passes through "content waits for its
        namespace's DELETE" - which holds only when the deleter deletes namespaces and leaves their content
        to the namespace controller (`namespace`), and is the documented limit of design/criticalservice.md §6
        ("Same namespace, partly", also through other CriticalServices; a Namespace provider whose criteria
        count its own content, as for OpenKruise's Cascading, is its smallest case), or for a Widget whose
        Finalizer controller's provider was never there (§6, "Finalizers held by an absent controller"), or,
        for a deleter that never deletes a CRD (KEEP_CRDS), for a CRD (§6, "A deleter that never deletes what a
        criterion waits for").

        A cycle without such a wait is not excused: the CREATE's cycle check exists to refuse it.
        The waits, in the oracle's own words (design/criticalservice.md §3):
        a provider waits for what its criteria count; a CriticalService for its providers and its provider's
        terminating namespace (rule 3); a namespace for
        its content and, unless the CriticalService is confined to it, for what the criteria of a
        CriticalService whose provider lives there count; a CRD for its instances and, if some provider is one
        of them, for what that provider's criteria count; the CRD criticalservices.criticalsvc.io for every
        CriticalService."""
        left = [ObjectRef(gr, *_ns_name(o)) for gr in self._kinds() for o in self._objects(gr)]
        graph = nx.DiGraph()
        graph.add_nodes_from(left)
        namespace_edges: set[tuple[ObjectRef, ObjectRef]] = set()
        terminating = {r.name for r in left if r.group_resource == NAMESPACES and self._terminating(r)}
        for r in left:
            if r.namespace:
                graph.add_edge(ObjectRef(NAMESPACES, "", r.namespace), r)
                if deleter == "namespace" and r.namespace not in terminating:
                    graph.add_edge(r, ObjectRef(NAMESPACES, "", r.namespace))
                    namespace_edges.add((r, ObjectRef(NAMESPACES, "", r.namespace)))
            if r.group_resource == WIDGETS:
                graph.add_edge(ObjectRef(CRDS, "", CRD_NAME), r)
            if r.group_resource == CRITICAL_SERVICES:
                graph.add_edge(ObjectRef(CRDS, "", "criticalservices.criticalsvc.io"), r)
        for i, s in enumerate(self.config.services):
            counted = [c for key in s.criteria for c in self._covered(key)]
            providers = self.providers(i)
            me = ObjectRef(CRITICAL_SERVICES, "", f"cs{i}")
            spec_ns = PROVIDERS[s.provider].get("namespace")
            if spec_ns and spec_ns in terminating:  # rule 3: it goes after its provider's namespace
                graph.add_edge(me, ObjectRef(NAMESPACES, "", spec_ns))
            for p in providers:
                graph.add_edge(me, p)
                waiters = [p]
                if p.namespace and not self.confined(i, p.namespace):
                    waiters.append(ObjectRef(NAMESPACES, "", p.namespace))
                if p.group_resource == WIDGETS:
                    waiters.append(ObjectRef(CRDS, "", CRD_NAME))
                graph.add_edges_from((w, c) for w in waiters for c in counted)
        stuck: set[ObjectRef] = set()
        if self.config.protected and "cm" in self.config.objects:
            md = OBJECTS["cm"]["metadata"]
            stuck.add(ObjectRef(GroupResource("", "configmaps"), md["namespace"], md["name"]))
        if self.config.finalizer and not any(PROVIDER_OBJECT[s.provider] in self.config.objects
                                             for s in self.config.services if "finalizer" in s.criteria):
            # §6 "Finalizers held by an absent controller": no provider of a Finalizer criterion was ever there to
            # run the controller, so the Widget keeps its finalizer. (One that went too early is a safety finding.)
            stuck.update(r for r in left if r.group_resource == WIDGETS)
        if deleter in KEEP_CRDS:
            stuck.update(r for r in left if r.group_resource == CRDS)
        for scc in nx.strongly_connected_components(graph):
            if not any((u, v) in namespace_edges for u in scc for v in scc):
                continue
            rest = graph.subgraph(scc).copy()
            rest.remove_edges_from(namespace_edges)
            if nx.is_directed_acyclic_graph(rest):  # every cycle here passes through a namespace's DELETE
                stuck |= scc
        out = set(stuck & set(graph.nodes))
        for r in list(out):
            out |= nx.ancestors(graph, r)
        return out

    def _kinds(self) -> list[GroupResource]:
        return [NAMESPACES, CRDS, CRITICAL_SERVICES, WIDGETS, GroupResource("apps", "deployments"),
                GroupResource("", "configmaps")]

    def _terminating(self, ref: ObjectRef) -> bool:
        obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
        return obj is not None and bool(obj["metadata"].get("deletionTimestamp"))

    def judge(self, verdict: TeardownVerdict, *, deleter: str, replay: bool, refused: Iterable[ObjectRef]) -> None:
        """Liveness: everything goes but `stays` with a retrying deleter or replay on; else only what the one-pass
        deleter was (`refused`) is left besides, none of it terminating."""
        complete = replay or deleter in RETRYING
        stays = self.stays(deleter)
        left = [h for h in verdict.remaining if h.ref not in stays]
        if deleter == "manifestwork" and stays & {h.ref for h in verdict.remaining} and not replay:
            # The agent removes its AppliedManifestWork only once everything it deleted is gone, and only then does
            # the garbage collector retry what the gate refused (design/kubernetes-semantics.md §8): an object that
            # stays (deletion-protected) leaves the refused ones where a one-pass deleter would (§6).
            complete = False
        if complete:
            for h in left:
                self._add("liveness", f"{h.ref} stays: {'; '.join(h.reasons)}", h.ref)
            return
        refused = set(refused)
        for h in left:
            if h.terminating:
                self._add("liveness", f"{h.ref} is left half-deleted (terminating for good): {'; '.join(h.reasons)}",
                          h.ref)
            elif h.ref not in refused:
                self._add("liveness", f"{h.ref} stays though the deleter was never refused on it: "
                          f"{'; '.join(h.reasons)}", h.ref)


# What a request to every API server answered: for each one that admitted it, a description of that API server.
Admitted = Callable[[str, ObjectRef], Sequence[str]]


def _carries(obj: Mapping[str, Any] | None) -> bool:
    return obj is not None and _labels(obj).get(PROTECTION_LABEL) == PROTECTION_VALUE


class EnforcementOracle(Oracle):
    """The enforcement properties (module docstring), judged after each step of the model and at its end."""

    def __init__(self, store: Store, config: Configuration) -> None:
        super().__init__(store, config)
        self._labelled: set[ObjectRef] = set()
        store.subscribe(self._label_event)

    def reset(self) -> None:
        """Forget what was seen: the model put the store back as it was before the leader's first step."""
        self.violations.clear()
        self._going.clear()
        self._labelled = {_ref(gr, o) for gr in {r.group_resource for r in self.store.refs()}
                          for o in self.store.list(gr) if _carries(o)}

    def guarded(self, i: int) -> list[ObjectRef]:
        """The objects whose DELETE cs`i` forbids now: none once its criteria are met; else its providers, the
        namespace of each unless every criterion names objects inside it (confined: the provider waits there), and
        the CRD of a custom provider type (CRD cleanup deletes the instances without admission)."""
        if not self.unmet(i):
            return []
        out = self.providers(i)
        for namespace in sorted({p.namespace for p in out if p.namespace}):
            if not self.confined(i, namespace):
                out.append(ObjectRef(NAMESPACES, "", namespace))
        if out and PROVIDERS[self.config.services[i].provider].get("group") == GROUP \
                and self.store.exists(CRDS, "", CRD_NAME):
            out.append(ObjectRef(CRDS, "", CRD_NAME))
        return out

    def _label_event(self, event: WatchEvent) -> None:
        ref = _ref(event.group_resource, event.object)
        if _carries(event.object):
            self._labelled.add(ref)
        elif ref in self._labelled and event.type != "DELETED":
            self._labelled.discard(ref)
            for i in range(len(self.config.services)):
                if ref in self.guarded(i):
                    self._add("safety", f"{ref} lost its label {PROTECTION_LABEL} while cs{i} forbids its DELETE "
                              f"({'; '.join(self.unmet(i))})", ref)

    def judge_step(self, *, ready: Sequence[str], admitted: Admitted, after: str) -> None:
        """After the model's step `after`: with Ready (each CriticalService's reason) as reported, ask `admitted` about
        every forbidden DELETE of an Enforcing CriticalService, and every removal of a label that protects."""
        asked: set[tuple[str, ObjectRef]] = set()
        for i in range(len(self.config.services)):
            for ref in self.guarded(i):
                if ready[i] == "Enforcing" and ("DELETE", ref) not in asked:
                    asked.add(("DELETE", ref))
                    for server in admitted("DELETE", ref):
                        self._add("safety", f"after {after}, with cs{i} Ready=Enforcing, the DELETE of {ref} was "
                                  f"admitted by {server} ({'; '.join(self.unmet(i))})", ref)
                if ("UNLABEL", ref) not in asked and _carries(self.store.get(ref.group_resource, ref.namespace,
                                                                             ref.name)):
                    asked.add(("UNLABEL", ref))
                    for server in admitted("UNLABEL", ref):
                        self._add("safety", f"after {after}, an UPDATE removing {PROTECTION_LABEL} from {ref} was "
                                  f"admitted by {server} while cs{i} forbids its DELETE", ref)

    def judge_end(self, *, ready: Sequence[str]) -> None:
        """Liveness of the leader: everything it must label is labelled, and every CriticalService says Enforcing."""
        for i in range(len(self.config.services)):
            for ref in self.guarded(i):
                if not _carries(self.store.get(ref.group_resource, ref.namespace, ref.name)):
                    self._add("liveness", f"{ref} never got the label {PROTECTION_LABEL} although cs{i} forbids its "
                              "DELETE", ref)
            if ready[i] != "Enforcing":
                self._add("liveness", f"cs{i} never became Ready=Enforcing (it says {ready[i]})", f"cs{i}")
