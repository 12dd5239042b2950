"""Protection carried by the protected object: which objects must carry the gate's labels, and which no longer.

A DELETE's webhook objectSelector is matched against the object as stored (a DELETE's `object` is null, its
`oldObject` the stored one), by whichever API server serves the request. So a label stored on a provider
routes its DELETE to the gate on every API server from the moment the write commits, whatever webhook
configuration each API server's informer holds - as long as the webhook that selects the label is one every
API server already has. That webhook is in the shipped configuration `criticalsvc` (deploy/base/webhook.yaml,
`protected.gate` and `protected-updates.gate`), which does not change as CriticalServices come and go. This is
Crossplane's way for its Usages (the label `crossplane.io/in-use` and a static webhook selecting it:
https://github.com/crossplane/crossplane/blob/v2.3.4/cluster/webhookconfigurations/usage.yaml).

What a CriticalService protects from DELETE, and so labels (`protected_objects`):

    each existing provider (the named one, or every object its selector selects)   PROTECTED_LABEL, and
                                                                                   UPDATES_HELD_LABEL when its
                                                                                   updates or scaling to 0 are held
    the namespace of each (a namespaced provider type)                             PROTECTED_LABEL
    the CRD of the provider's type (a custom type: CRD cleanup deletes instances   PROTECTED_LABEL
    without admission)

Left out: objects in the namespaces the shipped webhooks' namespaceSelector skips (the gate's own and
kube-system, never gated), objects already being deleted (their DELETE passed; writes to them are never
held), CriticalServices (the shipped configuration routes them whole) and the types the API server never
sends to webhooks (routing.EXEMPT).

A label can only be removed by an UPDATE, and the shipped configuration routes every UPDATE that removes one
from an object: the gate refuses it while a CriticalService protects the object (decision.py,
Rule.PROTECTION_LABEL). The gate removes its labels itself once no CriticalService wants them (`stale`).

Pure: what the leader's labeller (criticalsvc/labeller.py) writes, and what status (criticalsvc/status.py) reads
to say whether a CriticalService is enforced on every API server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .api import (
    CRDS,
    CRITICAL_SERVICES,
    LABEL_VALUE,
    NAMESPACES,
    PROTECTED_LABEL,
    UPDATES_HELD_LABEL,
    CriticalService,
    GroupResource,
    HoldUpdates,
    ObjectRef,
    ScaleToZero,
)
from .errors import StateUnavailable
from .labels import LabelSelector, Requirement
from .objects import KubeObject
from .routing import EXEMPT
from .state import ClusterState, provider_objects

# The namespaces every shipped webhook's namespaceSelector skips (deploy/base/webhook.yaml): nothing in them
# is gated, so nothing in them is labelled.
UNGATED_NAMESPACES = frozenset({"criticalsvc-system", "kube-system"})
GATE_LABELS = (PROTECTED_LABEL, UPDATES_HELD_LABEL)
DELETE_ONLY = frozenset({PROTECTED_LABEL})
DELETE_AND_UPDATES = frozenset({PROTECTED_LABEL, UPDATES_HELD_LABEL})

Wanted = Mapping[ObjectRef, frozenset[str]]


def ref_of(obj: KubeObject) -> ObjectRef:
    return ObjectRef(obj.group_resource, obj.namespace, obj.name)


def holds_updates(cs: CriticalService) -> bool:
    return cs.hold_updates == HoldUpdates.WHILE_BLOCKING or cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING


def _gated(obj: KubeObject | None) -> bool:
    return obj is not None and not obj.deletion_timestamp and obj.namespace not in UNGATED_NAMESPACES \
        and not (obj.group_resource == NAMESPACES and obj.name in UNGATED_NAMESPACES)


def provider_members(cs: CriticalService, state: ClusterState) -> list[KubeObject]:
    """The existing providers of `cs` (the named one, or its selector's members); none while its type is not
    served or is one nothing labels. For a selector this scans its type (in its namespace): the labeller keeps
    the answer until an object of that type there is written (MemoryState.writes)."""
    gr = state.resolve(cs.provider.group_resource)
    if gr is None or gr in EXEMPT or gr == CRITICAL_SERVICES:
        return []
    if isinstance(cs.provider, ObjectRef):
        found = state.get(ObjectRef(gr, cs.provider.namespace, cs.provider.name))
        return [found] if found is not None else []
    return list(provider_objects(cs.provider, state))


def protected_objects(cs: CriticalService, state: ClusterState,
                      members: list[KubeObject] | None = None) -> dict[ObjectRef, frozenset[str]]:
    """The existing objects `cs` protects from DELETE, each with the labels it must carry (`members`: its
    provider_members, when the caller has them). Raises StateUnavailable when a type it needs is not readable now
    (then nothing is known to be carried)."""
    gr = state.resolve(cs.provider.group_resource)
    if gr is None or gr in EXEMPT or gr == CRITICAL_SERVICES:
        return {}
    labels = DELETE_AND_UPDATES if holds_updates(cs) else DELETE_ONLY
    if members is None:
        members = provider_members(cs, state)
    if isinstance(cs.provider, ObjectRef):
        namespaces = {cs.provider.namespace} if cs.provider.namespace else set()
    else:
        namespaces = {cs.provider.namespace} if cs.provider.namespace else {m.namespace for m in members}
    out = {ref_of(m): labels for m in members if _gated(m)}
    for namespace in sorted(n for n in namespaces if n):
        ns = state.get(ObjectRef(NAMESPACES, "", namespace))
        if _gated(ns):
            out[ObjectRef(NAMESPACES, "", namespace)] = DELETE_ONLY
    if "." in gr.group:  # a CRD's name is <plural>.<group>, and a custom group has a dot
        crd = ObjectRef(CRDS, "", f"{gr.resource}.{gr.group}")
        if _gated(state.get(crd)):
            out[crd] = DELETE_ONLY
    return out


def wanted(services: Iterable[CriticalService], state: ClusterState) -> dict[ObjectRef, frozenset[str]]:
    """Every object some CriticalService protects, with the union of the labels they ask of it."""
    out: dict[ObjectRef, frozenset[str]] = {}
    for cs in services:
        for ref, labels in protected_objects(cs, state).items():
            out[ref] = out.get(ref, frozenset()) | labels
    return out


def carries(obj: KubeObject | None, labels: Iterable[str]) -> bool:
    return obj is not None and all(obj.labels.get(key) == LABEL_VALUE for key in labels)


def carried_in(state: ClusterState) -> Callable[[ObjectRef, frozenset[str]], bool]:
    """routing.Carried on `state`: whether the stored object carries the labels; False when its type cannot be read
    now (a 403, a cache still syncing), so its route by name stays - one unreadable type must never narrow, nor stall,
    what the others route."""
    def carried(ref: ObjectRef, labels: frozenset[str]) -> bool:
        try:
            return carries(state.get(ref), labels)
        except StateUnavailable:
            return False
    return carried


def missing(cs: CriticalService, state: ClusterState) -> list[ObjectRef]:
    """The objects `cs` protects that do not carry their labels yet, in (type, namespace, name) order."""
    return sorted((ref for ref, labels in protected_objects(cs, state).items() if not carries(state.get(ref), labels)),
                  key=order_key)


def to_add(want: Wanted, state: ClusterState) -> dict[ObjectRef, frozenset[str]]:
    """The labels each wanted object lacks."""
    out: dict[ObjectRef, frozenset[str]] = {}
    for ref, labels in want.items():
        try:
            obj = state.get(ref)
        except StateUnavailable:
            continue  # its type cannot be read now: labelled once it can, the others meanwhile
        if obj is None:
            continue
        lacking = frozenset(k for k in labels if obj.labels.get(k) != LABEL_VALUE)
        if lacking:
            out[ref] = lacking
    return out


def stale(want: Wanted, state: ClusterState, types: Iterable[GroupResource]) -> dict[ObjectRef, frozenset[str]]:
    """The gate's labels on objects of `types` (those it ever labelled) that no CriticalService wants any more."""
    out: dict[ObjectRef, frozenset[str]] = {}
    for gr in sorted(set(types), key=lambda g: (g.group, g.resource)):
        for key in GATE_LABELS:
            try:
                found = state.select(gr, namespace=None, selector=LabelSelector((Requirement(key, "Exists"),)))
            except StateUnavailable:
                continue  # a type that cannot be read now keeps its labels until it can be
            for obj in found:
                if obj.deletion_timestamp or key in want.get(ref_of(obj), frozenset()):
                    continue
                ref = ref_of(obj)
                out[ref] = out.get(ref, frozenset()) | {key}
    return out


def merge_patch(*, add: Iterable[str] = (), remove: Iterable[str] = ()) -> dict[str, object]:
    """A JSON merge patch (RFC 7386) of labels: null removes a key."""
    labels: dict[str, str | None] = {k: LABEL_VALUE for k in sorted(add)}
    labels.update({k: None for k in sorted(remove)})
    return {"metadata": {"labels": labels}}


def order_key(ref: ObjectRef) -> tuple[str, str, str, str]:
    return (ref.group_resource.group, ref.group_resource.resource, ref.namespace, ref.name)
