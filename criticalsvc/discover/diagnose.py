"""Why is this stuck terminating, what is at fault, and the way out (pure; `criticalsvc explain` shows it).

A namespace's own conditions say why its controller cannot finish
(https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/namespace/deletion/status_condition_utils.go);
each is traced here to the object at fault:

    NamespaceDeletionDiscoveryFailure   discovery of some group version failed: its APIService is unavailable,
                                        traced to its Service, the endpoints and the workload behind it
    NamespaceDeletionContentFailure     deleting some type failed: a webhook with failurePolicy Fail whose
                                        server does not answer refuses the DELETEs, traced the same way
    NamespaceContentRemaining           objects remain: each terminating one, by its finalizers
    NamespaceFinalizersRemaining        finalizers remain: per finalizer, the workload that would process it
                                        (the inference `discover` makes, criticalsvc/discover/propose.py) and
                                        whether it runs

An object with a deletionTimestamp (not a namespace) is diagnosed by its finalizers alone. Every cause comes
with ways out, safe ones first; an unsafe one (removing a finalizer by hand, deleting an APIService, forcing a
namespace's finalize) is marked, with what it leaves behind.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from ..api import NAMESPACES, FinalizerCriterion, GroupResource, ObjectRef
from .finalizers import is_builtin
from .inventory import APIService, Inventory, Terminating, Webhook, Workload
from .propose import Discovery, propose
from .rbac import AccessAnswer, AccessQuestion
from .serving import Index, Trace, trace_service

PROBLEM_CONDITIONS = ("NamespaceDeletionDiscoveryFailure", "NamespaceDeletionGroupVersionParsingFailure",
                      "NamespaceDeletionContentFailure", "NamespaceContentRemaining", "NamespaceFinalizersRemaining")
# What Kubernetes' own finalizers wait for (its controllers remove them once that holds).
_BUILTIN_WAITS = {
    "foregroundDeletion": "the garbage collector removes it once every dependent with blockOwnerDeletion is gone",
    "orphan": "the garbage collector removes it once it has orphaned the dependents",
    "kubernetes.io/pvc-protection": "the claim is removed once no Pod uses it",
    "kubernetes.io/pv-protection": "the volume is removed once no claim is bound to it",
}


@attrs.frozen
class WayOut:
    text: str
    unsafe: str = ""  # what it leaves behind; empty when safe


@attrs.frozen
class Cause:
    summary: str
    ways_out: tuple[WayOut, ...] = ()


@attrs.frozen
class Diagnosis:
    target: ObjectRef
    deletion_timestamp: str | None
    conditions: tuple[str, ...]  # the namespace's problem conditions, as "Type (Reason): message"
    causes: tuple[Cause, ...]
    last_resort: WayOut | None = None  # what people are told to do, and what it costs

    @property
    def stuck(self) -> bool:
        return bool(self.causes or self.conditions)

    def to_dict(self) -> dict[str, object]:
        return {"deletionTimestamp": self.deletion_timestamp, "conditions": list(self.conditions),
                "causes": [{"summary": c.summary, "waysOut": [{"text": w.text, **({"unsafe": w.unsafe} if w.unsafe
                                                                                   else {})} for w in c.ways_out]}
                           for c in self.causes],
                **({"lastResort": {"text": self.last_resort.text, "unsafe": self.last_resort.unsafe}}
                   if self.last_resort else {})}


def render_lines(d: Diagnosis) -> list[str]:
    lines = [f"  STUCK TERMINATING since {d.deletion_timestamp}:" if d.deletion_timestamp else "  STUCK:"]
    lines += [f"    condition {c}" for c in d.conditions]
    for c in d.causes:
        lines.append(f"    cause: {c.summary}")
        for w in c.ways_out:
            lines.append(f"      way out{' (UNSAFE: ' + w.unsafe + ')' if w.unsafe else ''}: {w.text}")
    if d.last_resort is not None:
        lines.append(f"    last resort (UNSAFE: {d.last_resort.unsafe}): {d.last_resort.text}")
    return lines


def diagnose(target: ObjectRef, inv: Inventory, answers: Mapping[AccessQuestion, AccessAnswer], *,
             gate_namespace: str = "criticalsvc-system") -> Diagnosis | None:
    """Why `target` (a namespace or any object) is stuck terminating; None when it is not terminating."""
    index = Index(inv)
    discovery = propose(inv, answers, gate_namespace=gate_namespace)
    if target.group_resource == NAMESPACES:
        ns = inv.namespace(target.name)
        if ns is None or ns.deletion_timestamp is None:
            return None
        conditions = [c for c in ns.conditions if c.type in PROBLEM_CONDITIONS and c.status == "True"]
        causes: list[Cause] = []
        if any(c.type == "NamespaceDeletionDiscoveryFailure" for c in conditions):
            message = " ".join(c.message for c in conditions if c.type == "NamespaceDeletionDiscoveryFailure")
            causes += [_apiservice_cause(a, index) for a in inv.apiservices if a.service is not None and
                       a.available != "True" and (_group_version(a) in message or not message)]
        failure = " ".join(c.message for c in conditions if c.type == "NamespaceDeletionContentFailure")
        causes += [_webhook_cause(w, index) for w in inv.webhooks if w.service is not None and w.name and
                   w.name in failure]
        inside = [t for t in inv.terminating if t.ref.namespace == target.name and t.finalizers]
        causes += _finalizer_causes(inside, index, discovery)
        if not causes and ns.spec_finalizers and not conditions:
            causes.append(Cause(f"namespace {target.name} still has spec.finalizers {list(ns.spec_finalizers)} and "
                                "no condition yet: the namespace controller has not finished a pass"))
        shown = tuple(f"{c.type} ({c.reason}): {c.message}" for c in conditions)
        # The namespace's own finalizer, removed through the finalize subresource, is the advice found everywhere:
        # the namespace disappears and everything still in it stays in etcd, unreachable until it is re-created.
        force = WayOut(f"kubectl get ns {target.name} -o json | jq '.spec.finalizers=[]' | kubectl replace --raw "
                       f"/api/v1/namespaces/{target.name}/finalize -f -",
                       unsafe="every object still in it is left in storage, with its finalizers and external "
                              "resources, and reappears if the namespace is re-created")
        return Diagnosis(target, ns.deletion_timestamp, shown, tuple(causes), force)
    mine = next((t for t in inv.terminating if t.ref == target), None)
    if mine is None:
        return None
    return Diagnosis(target, mine.deletion_timestamp, (), tuple(_finalizer_causes([mine], index, discovery)))


def _group_version(a: APIService) -> str:
    version, _, group = a.name.partition(".")
    return f"{group}/{version}"


def _server(trace: Trace, index: Index) -> tuple[str, list[WayOut]]:
    """Why the Service behind something does not answer, and how to bring its server back."""
    ref = trace.service
    if not trace.exists:
        return f"{ref} does not exist", [WayOut(f"re-create {ref} and the workload behind it")]
    if trace.endpoints is not None and trace.ready:
        return f"{ref} has {trace.ready} ready endpoint(s)", []
    why = f"{ref} has no ready endpoints"
    ways: list[WayOut] = []
    workloads = [index.workloads[w] for w in trace.workloads if w in index.workloads]
    if not workloads:
        return f"{why}; {trace.problem or 'no workload behind it'} (was it deleted?)", [
            WayOut(f"re-install the workload that serves {ref}")]
    parts = []
    for w in workloads:
        state = _workload_state(w)
        parts.append(f"its {w.kind} {w.ref.key} {state}")
        ns = f" -n {w.ref.namespace}"
        if w.deletion_timestamp is not None:
            ways.append(WayOut(f"re-create {w.kind} {w.ref.key} once it is gone (from the manifests it came from)"))
        elif w.replicas == 0:
            ways.append(WayOut(f"kubectl scale{ns} {w.ref.group_resource}/{w.ref.name} --replicas=1"))
        else:
            ways.append(WayOut(f"find why {w.kind} {w.ref.key}'s pods are not ready (kubectl describe{ns} "
                               f"{w.ref.group_resource}/{w.ref.name})"))
    return f"{why}; " + "; ".join(parts), ways


def _workload_state(w: Workload) -> str:
    if w.deletion_timestamp is not None:
        return f"was deleted at {w.deletion_timestamp} (still terminating)"
    if w.replicas == 0:
        return "is scaled to 0 replicas"
    if w.available == 0:
        return f"has none of its {w.replicas if w.replicas is not None else ''} replica(s) available".replace(
            "its  ", "its ")
    return f"has {w.available} available replica(s)"


def _apiservice_cause(a: APIService, index: Index) -> Cause:
    assert a.service is not None
    server, ways = _server(trace_service(a.service, index), index)
    status = f" ({a.reason}: {a.message})" if a.reason or a.message else ""
    return Cause(
        f"APIService {a.name} is unavailable{status}: {server}. Discovery of {_group_version(a)} fails, so the "
        "namespace controller cannot tell what is left to delete",
        (*ways, WayOut(f"kubectl delete apiservice {a.name}, if that API is no longer wanted",
                       unsafe="whatever its server stored is left in that server's storage, not deleted")))


def _webhook_cause(w: Webhook, index: Index) -> Cause:
    assert w.service is not None
    server, ways = _server(trace_service(w.service, index), index)
    return Cause(
        f"{w.kind} {w.configuration_name} (webhook {w.name}, failurePolicy {w.failure_policy}) refuses the "
        f"namespace controller's deletes: {server}",
        (*ways, WayOut(f"kubectl delete {w.configuration.resource}.{w.configuration.group} {w.configuration_name}, "
                       "if the webhook is no longer wanted",
                       unsafe="whatever it validated or mutated goes unchecked from then on")))


def _provider(gr: GroupResource, finalizer: str, discovery: Discovery) -> tuple[ObjectRef | None, str]:
    for p in discovery.proposals:
        for d in p.dependencies:
            c = d.criterion
            if isinstance(c, FinalizerCriterion) and c.group_resource == gr and c.finalizer_name == finalizer:
                return p.provider, d.confidence.value
    reason = next((s.reason for s in discovery.skipped if s.subject == f"finalizer {finalizer} on {gr}"), "")
    return None, reason.partition("; ")[2] or reason  # without "found on ...": the cause says that already


def _finalizer_causes(terminating: list[Terminating], index: Index, discovery: Discovery) -> list[Cause]:
    groups: dict[tuple[GroupResource, str], list[Terminating]] = {}
    for t in terminating:
        for f in t.finalizers:
            groups.setdefault((t.ref.group_resource, f), []).append(t)
    causes = []
    for (gr, finalizer), objs in sorted(groups.items()):
        first = objs[0]
        since = min(o.deletion_timestamp for o in objs)
        what = f"{len(objs)} {gr} ({', '.join(o.ref.key for o in objs[:3])}) wait for finalizer {finalizer} " \
               f"since {since}"
        patch = _remove_patch(first, finalizer)
        manual = WayOut(patch, unsafe="the cleanup the finalizer guards never runs (external resources leak)")
        if is_builtin(finalizer):
            wait = _BUILTIN_WAITS.get(finalizer, "Kubernetes' own controllers remove it")
            causes.append(Cause(f"{what}: a Kubernetes finalizer; {wait}"))
            continue
        provider, how = _provider(gr, finalizer, discovery)
        if provider is None:
            causes.append(Cause(f"{what}: no running workload processes it ({how or 'none found'}); its controller "
                                "was probably removed before these objects",
                                (WayOut("re-install the controller that processes it (it then finishes the cleanup)"),
                                 manual)))
            continue
        w = index.workloads[provider]
        state = _workload_state(w)
        if w.deletion_timestamp is None and w.replicas != 0 and w.available:
            causes.append(Cause(f"{what}: its controller is probably {w.kind} {w.ref.key} ({how} confidence), which "
                                f"{state}: it is at work, or failing - see its logs (kubectl logs -n {w.ref.namespace} "
                                f"{w.ref.group_resource}/{w.ref.name})", (manual,)))
            continue
        ways = [WayOut(f"kubectl scale -n {w.ref.namespace} {w.ref.group_resource}/{w.ref.name} --replicas=1")] \
            if w.deletion_timestamp is None else \
            [WayOut(f"re-create {w.kind} {w.ref.key} (it was deleted before the objects it cleans up)")]
        causes.append(Cause(f"{what}: its controller is {w.kind} {w.ref.key} ({how} confidence), which {state}",
                            (*ways, manual)))
    return causes


def _remove_patch(t: Terminating, finalizer: str) -> str:
    """The kubectl patch removing `finalizer` from `t` - testing its index first, so that it cannot remove another
    finalizer if the list changed meanwhile (as criticalsvc/stuck.py does)."""
    i = t.finalizers.index(finalizer)
    patch = json.dumps([{"op": "test", "path": f"/metadata/finalizers/{i}", "value": finalizer},
                        {"op": "remove", "path": f"/metadata/finalizers/{i}"}], separators=(",", ":"))
    where = f" -n {t.ref.namespace}" if t.ref.namespace else ""
    return f"kubectl patch {t.ref.group_resource} {t.ref.name}{where} --type=json -p '{patch}'"
