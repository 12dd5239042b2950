"""The admission rules: one pure function from a request and a cluster state to a decision.

    DELETE of a provider          every CriticalService whose provider it is must have all criteria met
    DELETE of a namespace         no CriticalService whose (existing) provider lives there may have unmet
                                  criteria: deleting the namespace would take the provider down - except one
                                  confined to that namespace (criticalsvc/nsorder.py: all its criteria's objects
                                  live there), whose provider outlives them inside the terminating namespace
                                  (its own DELETE is refused, the namespace controller retries), unless the
                                  controller's own order would wedge (nsorder.find_wedge)
    DELETE of a CriticalService   not while its provider exists (terminating or not), nor while the
                                  provider's namespace is terminating: the protection outlives what it
                                  protects, so it is the last of its group to go
    spec.recreatedProvider: Orphan      a CriticalService's own DELETE is allowed while the object under its
                                  provider's name is not the one it protected before (status.previousProviderUID:
                                  deleted and re-created) and every criterion holds; never a provider's DELETE
    DELETE of the CriticalService CRD   not while any CriticalService exists: CRD cleanup deletes
                                  the CRs without admission and the gate would silently lose all protection
    DELETE of a provider's CRD    as a DELETE of the provider: while some CriticalService whose (existing)
                                  provider is an instance of that CRD has unmet criteria, since CRD cleanup
                                  would delete the provider without admission
    label deletion-protected=Always     deny, always (remove the label to delete); for an object of any
                                  type, which deploy/'s labelled-objects webhook sends by its label
    annotation break-glass=<reason>     allow what would be denied, with a warning; logged by the caller
    spec.enforcement: Warn              that CriticalService's denials become warnings
    CREATE/UPDATE of a CriticalService  reject an invalid spec or one that closes a dependency cycle;
                                  warn when some, not all, criteria objects live in the provider's own
                                  namespace, or when deleting that namespace would be refused as a wedge
    UPDATE of a provider          held while criteria are unmet when its CriticalService says
                                  holdUpdates: WhileBlocking; replicas set to 0 (the object or its
                                  `scale` subresource) refused when it says scaleToZero: DenyWhileBlocking.
                                  Never held: an object already terminating, an update that only removes
                                  finalizers/ownerReferences or changes status or bookkeeping metadata
                                  (criticalsvc/updates.py), any other subresource (status)
    UPDATE removing a gate label  criticalsvc.io/protected (or updates-held) stays while a CriticalService
                                  protects the object: it is what routes the object's DELETE to the gate on
                                  every API server (criticalsvc/protectionlabels.py); the gate removes it
                                  itself once nothing protects the object

Wire facts honoured (design/kubernetes-semantics.md §1, §4): `object` is null on DELETE, so everything is read from
`oldObject`; `name` is "" for items of a deletecollection, so it comes from `oldObject.metadata.name`;
a DELETE without oldObject of a type outside GATED_DELETES that is no CriticalService's provider type is
denied: only the label can have sent it, and the gate holds no copy of such objects to read the label from
(a provider type is watched, and routed by the gate's own configuration, criticalsvc/routing.py);
a repeated DELETE of an object that already carries deletionTimestamp already passed the gate and is
allowed; a dry-run request gets exactly the same evaluation (this function has no side effects).
Denials carry code 403/Forbidden explicitly because the API server turns anything below 400 into 400.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import attrs

from . import criteria, deleters, nsorder, protectionlabels, updates
from .api import (
    BREAK_GLASS_ANNOTATION,
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    GATED_DELETES,
    NAMESPACES,
    CriticalService,
    Enforcement,
    FinalizerCriterion,
    GroupResource,
    HoldUpdates,
    ObjectRef,
    ProviderSelector,
    RecreatedProvider,
    ReplayDeletion,
    ScaleToZero,
    parse_critical_service,
)
from .errors import UNVERIFIED, DependencyCycle, InvalidSpec, StateUnavailable
from .objects import KubeObject
from .request import AdmissionRequest
from .routing import not_routed
from .state import ClusterState, provider_objects

# Messages end up on a terminal after the API server's prefix; Kubernetes has no hard limit, but a
# wall of text helps nobody, so the message is capped and says how much it left out.
MESSAGE_LIMIT = 1000
# The API server may truncate warnings longer than 256 characters (admission/v1 types.go).
WARNING_LIMIT = 256
# How many of a refusal's clauses it repeats as warnings (`_waiting`): each is a line of the client's output.
WAIT_WARNINGS = 4


class Rule(enum.StrEnum):
    """Which rule decided; a label value in metrics and a field in logs."""

    NOT_GATED = "not-gated"
    UNPROTECTED = "unprotected"
    CRITERIA_MET = "criteria-met"
    ALREADY_TERMINATING = "already-terminating"
    BLOCKED = "blocked"
    WARN_ONLY = "warn-only"
    BREAK_GLASS = "break-glass"
    DELETION_PROTECTED = "deletion-protected"
    UNIDENTIFIED = "unidentified"
    UNVERIFIABLE = "unverifiable"
    VALID_SPEC = "valid-spec"
    INVALID_SPEC = "invalid-spec"
    CYCLE = "cycle"
    UPDATE_HELD = "update-held"
    SCALE_TO_ZERO = "scale-to-zero"
    # An UPDATE a lock never holds (finalizer removal, status, bookkeeping): see criticalsvc/updates.py.
    UPDATE_EXEMPT = "update-exempt"
    # A CriticalService's DELETE let through by spec.recreatedProvider: Orphan (its provider was re-created).
    RECREATED_PROVIDER_ORPHANED = "recreated-provider-orphaned"
    # An UPDATE of a CriticalService that changes only spec.recreatedProvider (audited, never routine).
    RECREATED_PROVIDER_INTENT = "recreated-provider-intent"
    # An UPDATE that would remove a label carrying a CriticalService's protection (protectionlabels.py).
    PROTECTION_LABEL = "protection-label"
    # Not a decision: the answer to the leader's routing probe (criticalsvc/webhookrouter.py).
    ROUTING_PROBE = "routing-probe"


@attrs.frozen
class Block:
    """One reason the deletion may not happen now."""

    text: str
    service: str | None = None
    enforcement: Enforcement = Enforcement.ENFORCE
    # What it waits for, clause by clause (a refusal repeats each as a warning: `_waiting`); () for `text` whole.
    clauses: tuple[str, ...] = ()
    replays: bool = False  # its CriticalService asks the gate to replay the refused DELETE (spec.replayDeletion)


@attrs.frozen
class Decision:
    allowed: bool
    rule: Rule
    message: str = ""
    code: int = 200
    reason: str = ""
    warnings: tuple[str, ...] = ()
    # True when a CriticalService had a say: an ALLOW then must be confirmed with a fresh read.
    protected: bool = False
    # CriticalServices whose criteria block the deletion (for Events and status).
    blocking: tuple[str, ...] = ()
    break_glass: str | None = None
    # spec.recreatedProvider at work (changed, or letting a CriticalService go): for the audit annotation.
    recreated_provider: str | None = None
    # A refusal's clauses again, one warning each, and what happens then (`_waiting`): sent as warnings before
    # `warnings` (admission.render_response), for clients that print a refused request's warnings but not its
    # message (helm uninstall); kept apart so that explain and the logs do not repeat the message.
    waiting: tuple[str, ...] = ()


def allow(rule: Rule, *, warnings: Sequence[str] = (), protected: bool = False, **kw: Any) -> Decision:
    return Decision(True, rule, warnings=tuple(_warning(w) for w in warnings), protected=protected, **kw)


def deny(rule: Rule, message: str, *, code: int = 403, reason: str = "Forbidden", **kw: Any) -> Decision:
    return Decision(False, rule, _cap(message), code, reason, **kw)


def decide(request: AdmissionRequest, state: ClusterState, *, manages_routes: bool = True) -> Decision:
    """The gate's answer to one admission request. Pure: no I/O, no clock, no side effects.

    `manages_routes`: the gate writes its providers' routes itself (criticalsvc/routing.py; `serve`'s default).
    False (--no-manage-provider-webhooks): a CriticalService's CREATE warns that nothing sends its provider's
    DELETEs, since the shipped configuration routes no provider."""
    try:
        if request.operation == "DELETE":
            return _decide_delete(request, state)
        if request.operation in ("CREATE", "UPDATE") and _is(request.group_resource, CRITICAL_SERVICES, state):
            return _decide_write(request, state, manages_routes)
        if request.operation == "UPDATE":
            return _decide_update(request, state)
        return allow(Rule.NOT_GATED)
    except StateUnavailable as exc:
        return deny(
            Rule.UNVERIFIABLE,
            f"{UNVERIFIED}: {exc}",
            protected=True,
        )


def _is(gr: GroupResource, wanted: GroupResource, state: ClusterState) -> bool:
    return gr == wanted or state.resolve(gr) == wanted


# --- DELETE ---------------------------------------------------------------------------------------
def _decide_delete(request: AdmissionRequest, state: ClusterState) -> Decision:
    old = request.old_object
    metadata: Mapping[str, Any] = old.get("metadata") or {} if isinstance(old, Mapping) else {}
    if not isinstance(metadata, Mapping):
        metadata = {}
    name = request.name or str(metadata.get("name") or "")
    labels: Mapping[str, Any] = _mapping(metadata.get("labels"))
    if (old is not None and name and not metadata.get("deletionTimestamp")
            and labels.get(DELETION_PROTECTED_LABEL) == DELETION_PROTECTED_ALWAYS):
        # Decided on the request alone: deploy/'s labelled-objects webhook sends objects of any type,
        # which the gate holds no cache of and whose API group it may not even have discovered.
        return _labelled(_ref(request, _resolved_leniently(request.group_resource, state), name))

    gr = state.resolve(request.group_resource) or request.group_resource
    ref = _ref(request, gr, name)
    if old is None and request.group_resource not in GATED_DELETES and gr not in GATED_DELETES \
            and not _is_provider_type(gr, state):
        # Only the labelled-objects webhook routes such types, by oldObject's labels (design/
        # kubernetes-semantics.md §7); the gate keeps no copy of such objects, so without oldObject it
        # cannot read the label and does not guess.
        what, missing = (f"{ref}", "no oldObject") if name else (f"the {gr} being deleted", "no name and no oldObject")
        return deny(Rule.UNIDENTIFIED, f"criticalsvc cannot read the labels of {what} (the request has {missing}), "
                    f"so it does not allow it: it must see whether {DELETION_PROTECTED_LABEL} is set")
    if not name:
        # Without oldObject and name nothing identifies the object (pre-1.15 collection deletes).
        if _could_be_gated(gr, request.namespace, state):
            return deny(Rule.UNIDENTIFIED, f"criticalsvc cannot tell which {gr} is being deleted "
                        "(the request has no name and no oldObject), so it does not allow it")
        return allow(Rule.NOT_GATED)
    if old is None:
        stored = state.get(ref)
        labels = stored.labels if stored else {}
        annotations: Mapping[str, Any] = {}
        deletion_timestamp = stored.deletion_timestamp if stored else None
    else:
        annotations = _mapping(metadata.get("annotations"))
        deletion_timestamp = metadata.get("deletionTimestamp")

    if deletion_timestamp:
        return allow(Rule.ALREADY_TERMINATING)
    if labels.get(DELETION_PROTECTED_LABEL) == DELETION_PROTECTED_ALWAYS:
        return _labelled(ref)

    blocks: list[Block] = []
    protected = False
    orphaned: str | None = None
    deleter = deleters.of_request(request.username, metadata)
    if gr == NAMESPACES:
        # Deleting the namespace cannot take down a provider that is not there.
        hosted = [cs for cs in sorted(state.hosted_in(name), key=lambda c: c.name) if _provider_here(cs, name, state)]
        protected = protected or bool(hosted)
        blocks += _namespace_blocks(name, hosted, state, deleter)
    if gr == CRITICAL_SERVICES:
        protected = True
        service_blocks, orphaned = _service_blocks(request, name, state)
        blocks += service_blocks
    if gr == CRDS and name == CRD_NAME:
        protected = True
        services = sorted(cs.name for cs in state.critical_services())
        if services:
            some = "1 CriticalService still exists" if len(services) == 1 else \
                f"{len(services)} CriticalServices still exist"
            blocks.append(Block(
                f"{some} (first: {', '.join(services[:3])}); deleting their CRD would remove them without "
                "admission and lift all protection - delete them first"))
    if gr == CRDS and name != CRD_NAME:
        # CRD cleanup deletes every instance straight from storage, never asking a webhook (deleteInstances
        # in the CRD finalizer, design/kubernetes-semantics.md §5 [C1]): a provider that is a custom resource
        # is only as protected as its CRD.
        instances = [cs for cs in sorted(_providers_of_type(_instances_of(name), state), key=lambda c: c.name)
                     if _provider_exists(cs, state)]
        protected = protected or bool(instances)
        for cs in instances:
            blocks += _criteria_blocks(cs, state, f"protects {cs.provider}, an instance of this CRD (deleting "
                                       "the CRD would delete it without admission),")
    # The labels decide for a provider selector: the request's oldObject's when sent, else the cached object's.
    for cs in sorted(state.protecting(ref, labels), key=lambda c: c.name):
        protected = True
        blocks += _criteria_blocks(cs, state, "protects it" if isinstance(cs.provider, ObjectRef) else
                                   f"selects it by its labels ({cs.provider}) and protects it", deleter)
    if orphaned is not None and not blocks:
        # Nothing else has a say (a CriticalService may itself be another's provider): the intent decides.
        return allow(Rule.RECREATED_PROVIDER_ORPHANED, warnings=[orphaned], protected=True,
                     recreated_provider="Orphan")
    return _conclude(ref, blocks, annotations, protected=protected)


def _ref(request: AdmissionRequest, gr: GroupResource, name: str) -> ObjectRef:
    # For a Namespace the request's `namespace` is its own name; the object is cluster-scoped.
    return ObjectRef(gr, "" if gr == NAMESPACES else request.namespace, name)


def _resolved_leniently(gr: GroupResource, state: ClusterState) -> GroupResource:
    """The canonical name of `gr` if the state can tell, else `gr` as the request spelt it (a request's
    resource is already the plural the API server serves)."""
    try:
        return state.resolve(gr) or gr
    except StateUnavailable:
        return gr


def _labelled(ref: ObjectRef) -> Decision:
    return deny(Rule.DELETION_PROTECTED, f"{ref} is labelled {DELETION_PROTECTED_LABEL}="
                f"{DELETION_PROTECTED_ALWAYS}; remove the label to delete it")


def _providers_of_type(gr: GroupResource, state: ClusterState) -> Iterator[CriticalService]:
    """The CriticalServices whose provider is of type `gr` (however the spec spells the type)."""
    return (cs for cs in state.critical_services()
            if (state.resolve(cs.provider.group_resource) or cs.provider.group_resource) == gr)


def _is_provider_type(gr: GroupResource, state: ClusterState) -> bool:
    """Some CriticalService's provider is of type `gr`: the gate's own configuration routes its DELETEs."""
    return any(True for _ in _providers_of_type(gr, state))


def _could_be_gated(gr: GroupResource, namespace: str, state: ClusterState) -> bool:
    if gr in (NAMESPACES, CRITICAL_SERVICES, CRDS):
        return True
    return any(not namespace or cs.provider.namespace in (namespace, None) for cs in _providers_of_type(gr, state))


def _criteria_blocks(cs: CriticalService, state: ClusterState, why: str,
                     deleter: deleters.Deleter | None = None) -> list[Block]:
    unmet = [v for v in (criteria.evaluate(c, state) for c in cs.criteria) if not v.satisfied]
    if not unmet:
        return []
    described = tuple(v.describe() for v in unmet)
    # A hint, never a rule: when the deleter will never delete what a criterion waits for, the wait cannot end
    # on its own, and the refusal its user sees (Argo CD's DeletionError, Helm's error) says so and how out.
    left = deleters.left_behind(deleter, unmet, state, cs.name)
    hint = f". {left.message} [{left.deleter}: {left.deleter.evidence}]" if left is not None else ""
    return [Block(f"CriticalService {cs.name} {why} until: {'; '.join(described)}{hint}", cs.name, cs.enforcement,
                  described, _replays(cs))]


def _replays(cs: CriticalService) -> bool:
    return cs.replay_deletion == ReplayDeletion.WHEN_TEARING_DOWN


def _namespace_blocks(namespace: str, hosted: Sequence[CriticalService], state: ClusterState,
                      deleter: deleters.Deleter | None = None) -> list[Block]:
    """Why the namespace may not go: the unmet CriticalServices hosted there that are not confined to it,
    and the confined ones only if the namespace controller's order would wedge (criticalsvc/nsorder.py)."""
    blocks: list[Block] = []
    confined_unmet: list[CriticalService] = []
    for cs in hosted:
        found = _criteria_blocks(cs, state, _provider_here(cs, namespace, state), deleter)
        if found and nsorder.confined(cs):
            confined_unmet.append(cs)  # its provider's own DELETE keeps it until the namespace empties
        else:
            blocks += found
    if not confined_unmet:
        return blocks
    wedge = nsorder.find_wedge(namespace, hosted, state)
    if wedge is None:
        return blocks
    for cs in confined_unmet:
        if cs.name in wedge.services:
            blocks += _criteria_blocks(cs, state, _provider_here(cs, namespace, state).rstrip(",") + " (all its "
                                       "criteria's objects do too, but the namespace controller could never "
                                       f"empty it: {wedge.describe()}),")
    return blocks


def _service_blocks(request: AdmissionRequest, name: str, state: ClusterState) -> tuple[list[Block], str | None]:
    """What holds the CriticalService's own DELETE back; and, when spec.recreatedProvider: Orphan lets it go
    although its provider is there (a re-created one), the warning saying so (else None)."""
    cs: CriticalService | None
    try:
        cs = parse_critical_service(request.old_object) if request.old_object is not None else None
    except InvalidSpec:
        cs = None
    if cs is None:
        cs = next((c for c in state.critical_services() if c.name == name), None)
    if cs is None:
        return [], None  # an unparseable CriticalService protects nothing the gate could name
    if isinstance(cs.provider, ProviderSelector):
        # Every selected object is its provider: it waits for the last, terminating or not.
        members = provider_objects(cs.provider, state)
        if members:
            return [Block(f"its provider set ({cs.provider}) still has {_some(members)}; a CriticalService goes "
                          "after its provider", cs.name, cs.enforcement, replays=_replays(cs))], None
    elif (provider := state.get(cs.provider)) is not None:
        orphan = recreated_provider_orphan(cs, provider, state)
        if orphan.orphaned:
            return [], orphan.message
        state_word = "is terminating" if provider.terminating else "still exists"
        return [Block(f"its provider {_provider(cs)} {state_word}; a CriticalService goes after its provider"
                      f"{orphan.hint}", cs.name, cs.enforcement, replays=_replays(cs))], None
    if cs.provider.namespace:
        ns = state.get(ObjectRef(NAMESPACES, "", cs.provider.namespace))
        if ns is not None and ns.terminating:
            return [Block(f"its provider's namespace {cs.provider.namespace} is still terminating; a "
                          "CriticalService goes after everything it protects", cs.name, cs.enforcement,
                          replays=_replays(cs))], None
    return [], None


@attrs.frozen
class Orphan:
    """Whether spec.recreatedProvider: Orphan lets a CriticalService go although its named provider is there.

    `orphaned`: it does now; `message` says why (a warning on the DELETE, the status condition's message).
    Otherwise `hint` is what the refusal adds ("" when the provider is simply the one protected)."""

    orphaned: bool
    message: str = ""
    hint: str = ""


def recreated_provider_orphan(cs: CriticalService, provider: KubeObject, state: ClusterState) -> Orphan:
    """The seed's orphan intent, decided (design/criticalservice.md §6). Pure, shared by the DELETE, the status
    and `explain`. The object under the provider's name is a re-creation when its uid differs from
    status.previousProviderUID, the uid the gate saw there before the current one: that earlier object is then
    gone (one name, one object). The criteria must hold too: a re-created provider that something needs again
    keeps its protection, so the intent never drops protection anything is waiting on."""
    previous = cs.previous_provider_uid
    recreated = previous is not None and bool(provider.uid) and provider.uid != previous
    if not recreated:
        if cs.recreated_provider == RecreatedProvider.ORPHAN:
            return Orphan(False, hint=" (spec.recreatedProvider: Orphan lets it go only once the gate has seen the "
                          "provider re-created, status.previousProviderUID; this one is the object it protects)")
        return Orphan(False)
    again = f"{cs.provider} was deleted and re-created (uid {provider.uid}, before {previous})"
    if cs.recreated_provider != RecreatedProvider.ORPHAN:
        return Orphan(False, hint=f"; {again}: if the teardown is stuck behind the re-created object, set "
                      f"spec.recreatedProvider: Orphan on CriticalService {cs.name} to let it go without it")
    unmet = [v for v in (criteria.evaluate(c, state) for c in cs.criteria) if not v.satisfied]
    if unmet:
        return Orphan(False, hint=f"; {again} and spec.recreatedProvider is Orphan, but it is let go only "
                      f"while every criterion holds, and {unmet[0].describe()}")
    return Orphan(True, f"{again}; spec.recreatedProvider: Orphan lets CriticalService {cs.name} go, and the "
                  "re-created object is no longer protected")


def _conclude(ref: ObjectRef, blocks: list[Block], annotations: Mapping[str, Any], *, protected: bool) -> Decision:
    enforced = [b for b in blocks if b.enforcement == Enforcement.ENFORCE]
    warned = [f"(enforcement: Warn) would deny deleting {ref}: {b.text}" for b in blocks
              if b.enforcement == Enforcement.WARN]
    blocking = tuple(sorted({b.service for b in blocks if b.service}))
    if not enforced:
        rule = Rule.WARN_ONLY if warned else (Rule.CRITERIA_MET if protected else Rule.UNPROTECTED)
        return allow(rule, warnings=warned, protected=protected, blocking=blocking)
    message = f"{ref} may not be deleted yet: " + " | ".join(b.text for b in enforced)
    reason = annotations.get(BREAK_GLASS_ANNOTATION)
    if isinstance(reason, str) and reason.strip():
        return allow(Rule.BREAK_GLASS, warnings=[f"break-glass ({reason.strip()}): allowed although {message}",
                                                 *warned],
                     protected=protected, blocking=blocking, break_glass=reason.strip())
    return deny(Rule.BLOCKED, message, warnings=tuple(_warning(w) for w in warned), protected=protected,
                blocking=blocking, waiting=tuple(_waiting(ref, enforced)))


def _waiting(ref: ObjectRef, blocks: Sequence[Block]) -> list[str]:
    """The refusal once more as warnings, one per thing it waits for, and what happens then. `helm uninstall`
    prints the warnings of a refused DELETE but never its message (design/helm.md), and a warning may be cut
    at WARNING_LIMIT characters, so each clause gets its own."""
    clauses = list(dict.fromkeys(c for b in blocks for c in (b.clauses or (b.text,))))
    out = [_warning(f"{ref} may not be deleted while {c}") for c in clauses[:WAIT_WARNINGS]]
    if len(clauses) > WAIT_WARNINGS:
        out.append(_warning(f"{ref} may not be deleted for {len(clauses) - WAIT_WARNINGS} more reasons: see the "
                            "error, or `criticalsvc explain`"))
    services = sorted({b.service for b in blocks if b.service})
    if not services:
        return out
    if all(b.replays for b in blocks if b.service):
        out.append(_warning(f"{ref}: the gate deletes it once that is over (replayDeletion: WhenTearingDown)"))
    else:
        out.append(_warning(f"{ref}: delete it again once that is over, or set spec.replayDeletion: "
                            f"WhenTearingDown on CriticalService {', '.join(services)}"))
    return out


def _provider(cs: CriticalService) -> str:
    return str(cs.provider)


def _instances_of(crd_name: str) -> GroupResource:
    """The type a CRD serves: its name is `<plural>.<group>`, which the API server enforces."""
    plural, _, group = crd_name.partition(".")
    return GroupResource(group, plural)


def _provider_exists(cs: CriticalService, state: ClusterState) -> bool:
    if isinstance(cs.provider, ObjectRef):
        return state.get(cs.provider) is not None
    return bool(provider_objects(cs.provider, state))


def _provider_here(cs: CriticalService, namespace: str, state: ClusterState) -> str:
    """How `cs` protects something in `namespace`, for a denial; "" when no provider of it is there."""
    if isinstance(cs.provider, ObjectRef):
        return f"protects {cs.provider}, which lives in this namespace," if state.get(cs.provider) is not None else ""
    members = provider_objects(cs.provider, state, namespace=namespace)
    return f"protects {cs.provider}: {_some(members)} in this namespace," if members else ""


def _some(objects: Collection[KubeObject]) -> str:
    """`2 objects (first: a, b)`: a count and the first three, as criteria's descriptions name them."""
    first = ", ".join(o.key for o in itertools.islice(objects, 3))
    return f"{len(objects)} object{'s' if len(objects) != 1 else ''} (first: {first})"


# --- CREATE / UPDATE of a CriticalService -----------------------------------------------------------
def _decide_write(request: AdmissionRequest, state: ClusterState, manages_routes: bool = True) -> Decision:
    if request.sub_resource:
        return allow(Rule.NOT_GATED)  # status writes are the gate's own
    try:
        cs = parse_critical_service(request.object)
    except InvalidSpec as exc:
        name = request.name or _name_of(request.object)
        return deny(Rule.INVALID_SPEC, f'CriticalService "{name}" is invalid: {exc}', code=422, reason="Invalid")
    if request.operation == "UPDATE" and request.old_object is not None:
        try:
            old = parse_critical_service(request.old_object)
        except InvalidSpec:
            old = None
        if old is not None and _same_spec(old, cs):
            if old.recreated_provider != cs.recreated_provider:
                # Only the intent changed: it adds no dependency (no cycle check), and it is what a stuck
                # teardown's operator sets, so it is never refused for the rest of the spec's sake.
                return _intent_changed(cs, request.username)
            return allow(Rule.VALID_SPEC)  # metadata-only edits (labels, break-glass) are never blocked
    warnings = list(_spec_warnings(cs, state, manages_routes))
    from .graph import NAMESPACE_STEP, check_no_cycle, namespace_deletion_cycle, with_candidate  # builds on criteria

    try:
        edges = with_candidate(cs, state)
        check_no_cycle(cs, state, edges)
        if (nscycle := namespace_deletion_cycle(cs, state, edges)) is not None:
            names = " -> ".join([*nscycle.cycle, nscycle.cycle[0]])
            # Only the steps through a namespace: the others are ordinary waits (the warning's 256 characters).
            through = "; ".join(s for s in nscycle.steps if NAMESPACE_STEP in s)
            warnings.append(f"deleting only the namespaces can never finish {names}: {through}; delete it first "
                            "(design/criticalservice.md §6)")
    except DependencyCycle as exc:
        steps = f" ({'; '.join(exc.steps)})" if exc.steps else ""
        return deny(Rule.CYCLE, f'CriticalService "{cs.name}" would close a {exc}; no teardown of these '
                    f"could ever finish{steps}", warnings=tuple(_warning(w) for w in warnings))
    changed = request.operation == "UPDATE" and request.old_object is not None and \
        _mapping(request.old_object.get("spec")).get("recreatedProvider", "Protect") != cs.recreated_provider.value
    return allow(Rule.VALID_SPEC, warnings=warnings,
                 recreated_provider=f"{cs.recreated_provider.value} set by {request.username or 'someone'}"
                 if changed else None)


def _intent_changed(cs: CriticalService, user: str) -> Decision:
    who = user or "someone"
    if cs.recreated_provider == RecreatedProvider.ORPHAN:
        text = (f"spec.recreatedProvider set to Orphan by {who}: CriticalService {cs.name} may be deleted while its "
                "provider is a re-created object and every criterion holds; that object is then unprotected")
    else:
        text = (f"spec.recreatedProvider set to {cs.recreated_provider.value} by {who}: a re-created provider is "
                "protected")
    return allow(Rule.RECREATED_PROVIDER_INTENT, warnings=[text],
                 recreated_provider=f"{cs.recreated_provider.value} set by {who}")


def _same_spec(a: CriticalService, b: CriticalService) -> bool:
    # spec.recreatedProvider is left out: changing it alone is decided by _intent_changed.
    return (a.provider, a.criteria, a.enforcement, a.replay_deletion, a.hold_updates, a.scale_to_zero) == \
        (b.provider, b.criteria, b.enforcement, b.replay_deletion, b.hold_updates, b.scale_to_zero)


def _spec_warnings(cs: CriticalService, state: ClusterState, manages_routes: bool = True) -> list[str]:
    out: list[str] = []
    provider_type = state.resolve(cs.provider.group_resource)
    if provider_type is None:
        out.append(f"spec.provider: {cs.provider.group_resource} is not served (yet); nothing is protected "
                   "until it is")
    elif provider_type != CRITICAL_SERVICES and not manages_routes:
        out.append(f"spec.provider: {not_routed(cs, provider_type)}")
    if isinstance(cs.provider, ProviderSelector) and cs.provider.selector.is_empty and cs.provider.namespace is None:
        out.append(f"spec.provider: an empty selector without a namespace selects every {cs.provider.group_resource} "
                   "in the cluster; every one of them is protected")
    for i, c in enumerate(cs.criteria):
        named = criteria.named_resource(c)
        if state.resolve(named) is None:
            out.append(f"spec.criteria[{i}]: {named} is not served (yet); the criterion holds until it is")
    try:
        out += _namespace_warnings(cs, state)
    except StateUnavailable as exc:
        # Advice, not a verdict: another CriticalService's unreadable type must not refuse this one's CREATE.
        out.append(f"spec.provider: the order in which namespace {cs.provider.namespace} empties could not be "
                   f"checked: {exc}")
    return out


# --- UPDATE of a provider (spec.holdUpdates, spec.scaleToZero) -----------------------------------------
# The object itself and its `scale` subresource are decided on; any other subresource (status, a
# Namespace's finalize) is the controllers' way of finishing what was started and is never held, even
# though the router sends none of them (decided defensively, as every request reaching the gate is).
SCALE_SUBRESOURCE = "scale"


@attrs.frozen
class _UpdateBlock:
    rule: Rule  # UPDATE_HELD or SCALE_TO_ZERO
    block: Block


def _decide_update(request: AdmissionRequest, state: ClusterState) -> Decision:
    if request.sub_resource not in ("", SCALE_SUBRESOURCE):
        return allow(Rule.NOT_GATED)
    scale = request.sub_resource == SCALE_SUBRESOURCE
    old, new = request.old_object, request.object
    name = request.name or _name_of(new) or _name_of(old)
    if _metadata_of(old).get("deletionTimestamp") or _metadata_of(new).get("deletionTimestamp"):
        # Its deletion already passed the gate; what follows (finalizers removed, the garbage
        # collector's patches) finishes it, and holding any of it would wedge the teardown.
        return allow(Rule.ALREADY_TERMINATING)
    if not name:
        return allow(Rule.NOT_GATED)  # an UPDATE always names its object; nothing could protect this one
    gr = state.resolve(request.group_resource) or request.group_resource
    ref = _ref(request, gr, name)
    if not scale:
        kept = _protection_label_kept(ref, old, new, state)
        if kept is not None:
            return kept
    services = [cs for cs in sorted(state.protecting(ref), key=lambda c: c.name)
                if cs.hold_updates == HoldUpdates.WHILE_BLOCKING or cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING]
    if not services:
        return allow(Rule.UNPROTECTED)
    if scale:
        # A Scale carries no deletionTimestamp (only name, namespace, uid, resourceVersion and
        # creationTimestamp: scaleFromDeployment in pkg/registry/apps/deployment/storage/storage.go), so
        # the workload's is read from the state; a stale state can miss it, never invent it.
        stored = state.get(ref)
        if stored is not None and stored.terminating:
            return allow(Rule.ALREADY_TERMINATING)
        changes = updates.replicas(old, scale=True) != updates.replicas(new, scale=True)
    else:
        changes = updates.changes_content(old, new)
    to_zero = updates.scales_to_zero(old, new, scale=scale)
    blocks: list[_UpdateBlock] = []
    applied = False
    for cs in services:
        if cs.hold_updates == HoldUpdates.WHILE_BLOCKING and changes:
            applied = True
            blocks += [_UpdateBlock(Rule.UPDATE_HELD, b) for b in _criteria_blocks(cs, state, "holds updates of it")]
        elif cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING and to_zero:
            applied = True
            blocks += [_UpdateBlock(Rule.SCALE_TO_ZERO, b)
                       for b in _criteria_blocks(cs, state, "forbids scaling it to 0 replicas")]
    if not applied:
        holds = any(cs.hold_updates == HoldUpdates.WHILE_BLOCKING for cs in services)
        return allow(Rule.UPDATE_EXEMPT if holds and not changes else Rule.UNPROTECTED)
    return _conclude_update(ref, blocks, _mapping(_metadata_of(new).get("annotations")), scale=scale)


def _protection_label_kept(ref: ObjectRef, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                           state: ClusterState) -> Decision | None:
    """A denial when the UPDATE removes (or changes) a gate label some CriticalService still wants on `ref`."""
    old_labels, new_labels = _mapping(_metadata_of(old).get("labels")), _mapping(_metadata_of(new).get("labels"))
    removed = [k for k in protectionlabels.GATE_LABELS if k in old_labels and new_labels.get(k) != old_labels[k]]
    if not removed:
        return None
    candidates = list(state.protecting(ref, {str(k): str(v) for k, v in old_labels.items()}))
    if ref.group_resource == NAMESPACES:
        candidates += state.hosted_in(ref.name)
    if ref.group_resource == CRDS:
        candidates += _providers_of_type(_instances_of(ref.name), state)
    keeping = sorted({cs.name for cs in candidates
                      if set(removed) & protectionlabels.protected_objects(cs, state).get(ref, frozenset())})
    if not keeping:
        return None
    names = ", ".join(keeping[:3]) + (f" (and {len(keeping) - 3} more)" if len(keeping) > 3 else "")
    return deny(Rule.PROTECTION_LABEL,
                f"{ref}: the label {removed[0]} may not be removed while CriticalService {names} protects it: it is "
                "what sends the object's DELETE to the gate on every API server; the gate removes it itself once "
                "no CriticalService protects the object", protected=True, blocking=tuple(keeping))


def _conclude_update(ref: ObjectRef, blocks: list[_UpdateBlock], annotations: Mapping[str, Any], *,
                     scale: bool) -> Decision:
    enforced = [b for b in blocks if b.block.enforcement == Enforcement.ENFORCE]
    warned = [f"(enforcement: Warn) would deny {_doing(b.rule, ref)}: {b.block.text}" for b in blocks
              if b.block.enforcement == Enforcement.WARN]
    blocking = tuple(sorted({b.block.service for b in blocks if b.block.service}))
    if not enforced:
        return allow(Rule.WARN_ONLY if warned else Rule.CRITERIA_MET, warnings=warned, protected=True,
                     blocking=blocking)
    rule = Rule.UPDATE_HELD if any(b.rule == Rule.UPDATE_HELD for b in enforced) else Rule.SCALE_TO_ZERO
    head = f"{ref} may not be updated yet" if rule == Rule.UPDATE_HELD else \
        f"{ref} may not be scaled to 0 replicas yet"
    message = f"{head}: " + " | ".join(b.block.text for b in enforced)
    reason = annotations.get(BREAK_GLASS_ANNOTATION)
    if isinstance(reason, str) and reason.strip():
        return allow(Rule.BREAK_GLASS, warnings=[f"break-glass ({reason.strip()}): allowed although {message}",
                                                 *warned],
                     protected=True, blocking=blocking, break_glass=reason.strip())
    if scale:
        # A Scale has no annotations to carry the break-glass: the override goes through the object.
        hint = (f"to override, set spec.replicas to 0 on the object itself with the annotation "
                f"{BREAK_GLASS_ANNOTATION}=<reason>")
    else:
        hint = (f"removing finalizers is never held; to override, set the annotation "
                f"{BREAK_GLASS_ANNOTATION}=<reason> in this same update")
    return deny(rule, f"{message} ({hint})", warnings=tuple(_warning(w) for w in warned), protected=True,
                blocking=blocking)


def _doing(rule: Rule, ref: ObjectRef) -> str:
    return f"updating {ref}" if rule == Rule.UPDATE_HELD else f"scaling {ref} to 0 replicas"


def _metadata_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    metadata = obj.get("metadata") if isinstance(obj, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else {}


def _namespace_warnings(cs: CriticalService, state: ClusterState) -> list[str]:
    """Criteria objects in the provider's own namespace: fine when all of them are (the namespace may go,
    criticalsvc/nsorder.py), unless its controller's order would wedge; a trap when only some are."""
    ns = cs.provider.namespace
    if not ns:
        return []
    inside = [i for i, c in enumerate(cs.criteria) if nsorder.confined_criterion(c, ns)]
    if not inside:
        return []
    outside = [i for i in range(len(cs.criteria)) if i not in inside]
    if outside:
        j = outside[0]
        why = " (a Finalizer criterion spans all namespaces)" if isinstance(cs.criteria[j], FinalizerCriterion) else ""
        return [f"spec.criteria[{i}]: its objects live in the provider's namespace {ns}, but spec.criteria[{j}]'s do "
                f"not{why}, so deleting {ns} is refused until these are gone too: delete them first" for i in inside]
    hosted = [c for c in state.hosted_in(ns) if c.name != cs.name and _provider_here(c, ns, state)]
    wedge = nsorder.find_wedge(ns, [*hosted, cs], state)
    if wedge is None or cs.name not in wedge.services:
        return []
    return [f"deleting namespace {ns} would be refused while its objects are as now: {wedge.describe()}"]


def _name_of(obj: Mapping[str, Any] | None) -> str:
    if isinstance(obj, Mapping) and isinstance(obj.get("metadata"), Mapping):
        return str(obj["metadata"].get("name") or "")
    return ""


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _cap(message: str) -> str:
    if len(message) <= MESSAGE_LIMIT:
        return message
    cut = message[: MESSAGE_LIMIT - 40].rsplit(" ", 1)[0]
    return f"{cut} … ({len(message) - len(cut)} more characters)"


def _warning(text: str) -> str:
    return text if len(text) <= WARNING_LIMIT else text[: WARNING_LIMIT - 1] + "…"
