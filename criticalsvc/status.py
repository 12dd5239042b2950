"""A CriticalService's status, computed from the cluster state (pure; the writer is elsewhere).

Conditions follow the Kubernetes API conventions (metav1.Condition: type, status, reason, message,
lastTransitionTime, observedGeneration); lastTransitionTime only moves when `status` flips, so a
writer that recomputes every few seconds does not churn it.

    Ready      True  (Enforcing | Warning)      the gate protects the provider as specified
               False (ProviderTypeNotServed)    the provider's type is not served: nothing to protect
               False (ProviderNotRouted)        no webhook sends the gate the DELETEs (or, with holdUpdates
                                                or scaleToZero, the UPDATEs) of the provider's type, and the
                                                gate does not manage routes (serve
                                                --no-manage-provider-webhooks): the message says what to add
               True  (EnforcingByRoute)         enforced where the API server holds criticalsvc-providers, but
                                                not carried by a label every API server routes (the gate may not
                                                patch an object, or the shipped configuration predates the labels):
                                                the message says which and what to grant
               False (LabelPending)             the gate is labelling a protected object (criticalsvc.io/protected):
                                                not enforced until the label is stored
               False (RoutePending)             the gate manages routes but has not written this one yet, or
                                                has and the API server was not yet seen sending it (the
                                                routing probe, criticalsvc/webhookrouter.py)
               False (RoutingFailed)            writing the route failed: the message names the API error
               False (InvalidCondition)         a criterion's stored condition does not compile (written while
                                                the webhook was away): every object of that criterion counts,
                                                so it never holds - the message names the field and the error
    Blocking   True  (CriteriaUnmet)            deleting the provider (or its namespace) is denied now
               False (CriteriaMet)              it would be allowed
               Unknown (CannotVerify)           some type the criteria or the provider name cannot be read now
                                                (403, cache not synced): the webhook refuses the provider's
                                                DELETE as unverifiable, and the message is its reason (which
                                                type, which error, what to grant); unmetCriteria is absent
               Unknown (CannotConfirm)          the caches see every criterion met, but the fresh read that
                                                confirms an ALLOW failed for the provider's last DELETE seen by
                                                the writing replica (e.g. a Finalizer criterion over a type too
                                                large to LIST in the budget), so it was refused; the message
                                                is the read's error. Held until a confirmation succeeds, or
                                                for CONFIRM_FAILURE_SHOWN seconds
    (Ready is Unknown (CannotVerify) too when whether the provider's type is served cannot be told.)
    RoutedNarrowly   (when the gate manages routes)
               True  (Narrow)                   only requests about this provider reach the gate for it
               False (Broad)                    some of them are routed more broadly (a selector without a
                                                namespace routes every namespace DELETE; a condition past the
                                                size the API server takes routes a type whole): the message
                                                says which and why (criticalsvc/routing.py)
    ProviderRecreated   (a named provider the gate has seen re-created, status.previousProviderUID; or
                     spec.recreatedProvider: Orphan set)
               True  (Orphaned)                 the object under the provider's name is a re-creation and
                                                spec.recreatedProvider: Orphan lets this CriticalService go
                                                without it (decision.recreated_provider_orphan): the intent is
                                                in effect
               True  (Protected)                it is a re-creation, and it is protected (Protect, or Orphan
                                                while a criterion is unmet): the message says why and what to set
               False (SameProvider)             Orphan is set, but the provider there is the one protected
               False (ProviderGone)             Orphan is set and no provider is there (nothing to orphan)
    Stuck      (a named provider and some Finalizer criterion, or a known deleter; criticalsvc/stuck.py)
               True  (DeleterNeverDeletes)      a criterion waits for an object that the tool last refused
                                                deleting the provider (Argo CD, Helm) never deletes, and
                                                nobody is deleting it: the message names it, the evidence, and
                                                the way out (delete it by hand, or let the CRD stay)
               True  (FinalizerControllerDown)  a Finalizer criterion is unmet and the provider, which removes
                                                the finalizer, is not running: terminating, scaled to 0, or no
                                                replica available; the message gives the way out (scale up, or
                                                the kubectl patch that removes the finalizer by hand)
               False (ControllerAvailable | NoFinalizerPending | ProviderAbsent | AvailabilityUnknown)
    Covered    (when the gate checks what providers serve: serve --check-coverage-every; a named provider only)
               True  (CoversServed)             every webhook configuration, CRD conversion and APIService the
                                                provider serves (and finalizer, where known) is in the criteria
               False (ServesUncovered)          the provider serves something no criterion covers: the message
                                                names it and the criterion to add (criticalsvc/discover/coverage.py)
    ReplayPermitted   (spec.replayDeletion: WhenTearingDown only)
               True  (Permitted)                the gate may delete what it would replay
               False (Forbidden)                it may not: the message names the missing grant
               Unknown (NotChecked)             not checked yet (the leader checks once a minute)

`deletionIntents` lists the refused deletions the gate will replay (criticalsvc/replay.py), oldest first.

`providers` counts the objects a provider selector (spec.provider.selector) selects now; for a named
provider, `providerUID` records the uid of the provider last seen, so a provider deleted and re-created under
the same name is visible (the design's open question on adoption), and `previousProviderUID` the uid seen
there before it once the uid changed (what spec.recreatedProvider: Orphan compares against); `blockers`
names the first few unmet criteria with example objects, the same words the denial message uses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from . import criteria, protectionlabels
from .api import (
    LABEL_VALUE,
    PROTECTED_LABEL,
    CriticalService,
    Enforcement,
    GroupResource,
    ObjectRef,
    ProviderSelector,
    RecreatedProvider,
    ReplayDeletion,
)
from .decision import recreated_provider_orphan
from .deleters import Deleter
from .discover.coverage import Served, describe, uncovered
from .errors import UNVERIFIED, StateUnavailable
from .objects import KubeObject
from .restmapper import ResourceType
from .routing import LABELS_WEBHOOK, PROVIDERS_CONFIGURATION, Route, Routing, needed_routes, not_routed
from .state import ClusterState, provider_objects
from .stuck import finalizer_controller, left_behind
from .timestamps import format_rfc3339

if TYPE_CHECKING:  # status reports replay's intents; the rules never import how they are reported (.importlinter)
    from .replay import DeletionIntent

# The reason of a condition the gate cannot compute now (a type it may not read, a cache not synced), and
# the words the webhook's denial starts with then (decision.decide), so the two say the same thing.
CANNOT_VERIFY = "CannotVerify"
CANNOT_CONFIRM = "CannotConfirm"
# How long a refused confirmation is shown when no later DELETE of the provider comes (a deleter gave up).
CONFIRM_FAILURE_SHOWN = 600.0
UNVERIFIED_PREFIX = f"{UNVERIFIED}: "
# The status is an API object other tools read; five blockers are enough to act on.
MAX_BLOCKERS = 5
MAX_INTENTS = 20  # the CRD's maxItems for status.deletionIntents
REPLAY_AGGREGATE_LABEL = "criticalsvc.io/aggregate-to-replay"
LABEL_AGGREGATE_LABEL = "criticalsvc.io/aggregate-to-labeller"


def _condition(type_: str, status: bool | None, reason: str, message: str, *, now: str, generation: int,
               previous: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    value = "Unknown" if status is None else "True" if status else "False"
    old = next((c for c in previous if c.get("type") == type_), None)
    since = old.get("lastTransitionTime") if old is not None and old.get("status") == value else None
    return {"type": type_, "status": value, "reason": reason, "message": message,
            "lastTransitionTime": since or now, "observedGeneration": generation}


def compute_status(cs: CriticalService, state: ClusterState, *, now: float, generation: int = 1,
                   previous: Mapping[str, Any] | None = None, intents: Sequence[DeletionIntent] = (),
                   replay_forbidden: Sequence[GroupResource] | None = None,
                   routing: Routing | None = None, refused_confirmation: str | None = None,
                   lookup: Callable[[GroupResource], ResourceType | None] | None = None,
                   label_errors: Mapping[ObjectRef, str] | None = None,
                   served: Sequence[Served] | None = None,
                   deleter: Deleter | None = None) -> dict[str, Any]:
    """The `.status` the gate would write for `cs` now; a part the state cannot answer is Unknown, never a guess.

    `replay_forbidden`: the types the gate may not delete for its replays ([] all permitted, None
    not checked yet); read only when the CriticalService asks for replay. `routing`: what the
    provider-routes writer (criticalsvc/webhookrouter.py) last saw (routing.Routing(managed=False) when
    the gate does not manage routes); None: routing is not judged (a status of the criteria alone).
    `refused_confirmation`: why the fresh read confirming the provider's last DELETE failed, when it did
    (criticalsvc/live.py, LiveReader.refused). `lookup`: the REST mapper's (which routes a CriticalService needs
    depends on its provider type's scope); `label_errors`: the labeller's failed writes (criticalsvc/labeller.py).
    `served`: what the provider serves (criticalsvc/discover/coverage.py), None when not known (then no Covered
    condition). `deleter`: who was last refused deleting the provider or its namespace, as far as the request
    showed (criticalsvc/deleters.py): Stuck says when it never deletes what a criterion waits for."""
    stamp = format_rfc3339(now)
    prev_conditions = (previous or {}).get("conditions") or []
    # Each part is computed on its own, so a type the gate cannot read (403, not synced) leaves the others
    # true: a status that says "may go" while the webhook says "cannot verify" is the lie this prevents.
    unmet: list[tuple[int, criteria.Verdict]] = []
    unverifiable: list[str] = []
    for i, c in enumerate(cs.criteria):
        try:
            verdict = criteria.evaluate(c, state)
        except StateUnavailable as exc:
            unverifiable.append(str(exc))
        else:
            if not verdict.satisfied:
                unmet.append((i, verdict))
    provider: KubeObject | None = None
    provider_known = True
    try:
        provider = state.get(cs.provider) if isinstance(cs.provider, ObjectRef) else None
    except StateUnavailable as exc:
        provider_known = False
        unverifiable.insert(0, str(exc))
    try:
        provider_type = state.resolve(cs.provider.group_resource)
    except StateUnavailable as exc:
        provider_type, type_error = None, str(exc)
    else:
        type_error = ""
    broken = [c.condition.error for c in cs.criteria if c.condition is not None and c.condition.error]
    if broken:
        # Protection stays (fail closed: criticalsvc/condition.py, compile_condition), but the criterion can
        # never hold, so the teardown it orders would never finish: say so where `kubectl get csvc` looks.
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        ready = _condition("Ready", False, "InvalidCondition",
                           f"{broken[0]}{more}; every object of the criterion counts, so it never holds - fix the "
                           "condition", now=stamp, generation=generation, previous=prev_conditions)
    elif type_error:
        ready = _condition("Ready", None, CANNOT_VERIFY, f"{UNVERIFIED_PREFIX}{type_error}", now=stamp,
                           generation=generation, previous=prev_conditions)
    elif provider_type is None:
        ready = _condition("Ready", False, "ProviderTypeNotServed",
                           f"{cs.provider.group_resource} is not served; nothing is protected until it is",
                           now=stamp, generation=generation, previous=prev_conditions)
    elif routing is not None and (unenforced := _unenforced(cs, state, provider_type, routing, lookup,
                                                            label_errors or {})) is not None:
        status_, reason, message = unenforced
        ready = _condition("Ready", status_, reason, message, now=stamp, generation=generation,
                           previous=prev_conditions)
    else:
        # Enforced even while some type cannot be read: the webhook then refuses the provider's DELETE as
        # unverifiable (criticalsvc/decision.py, Rule.UNVERIFIABLE), which is protection, not its absence.
        warn = cs.enforcement == Enforcement.WARN
        where = " on every API server" if routing is not None else ""
        ready = _condition("Ready", True, "Warning" if warn else "Enforcing",
                           ("denials are reported as warnings only (enforcement: Warn)" if warn
                            else f"deletes of {cs.provider} are gated{where}"),
                           now=stamp, generation=generation, previous=prev_conditions)
    if unverifiable or type_error:
        # The webhook's own words (decision.decide): which type, which error, what to grant.
        why = "; ".join(dict.fromkeys([type_error, *unverifiable] if type_error else unverifiable))
        blocking = _condition("Blocking", None, CANNOT_VERIFY, f"{UNVERIFIED_PREFIX}{why}", now=stamp,
                              generation=generation, previous=prev_conditions)
    elif unmet:
        first = unmet[0][1].describe()
        more = f" (and {len(unmet) - 1} more criteria)" if len(unmet) > 1 else ""
        blocking = _condition("Blocking", True, "CriteriaUnmet", f"{first}{more}", now=stamp,
                              generation=generation, previous=prev_conditions)
    elif refused_confirmation:
        # The caches say "may go", the webhook said no: the status says what the webhook does.
        blocking = _condition("Blocking", None, CANNOT_CONFIRM,
                              f"every criterion holds in the gate's caches, but the fresh read that confirms a "
                              f"deletion failed, so the last DELETE of {cs.provider} was refused: "
                              f"{refused_confirmation}", now=stamp, generation=generation, previous=prev_conditions)
    else:
        blocking = _condition("Blocking", False, "CriteriaMet", "every criterion holds; the provider may go",
                              now=stamp, generation=generation, previous=prev_conditions)
    conditions = [ready, blocking]
    if routing is not None and routing.managed and provider_type is not None:
        conditions.append(_narrow_condition(cs, routing, now=stamp, generation=generation, previous=prev_conditions))
    if provider_known and not unverifiable and not type_error:
        stuck = finalizer_controller(cs, provider, [v for _, v in unmet], state)
        left = left_behind(cs, [v for _, v in unmet], state, deleter)
        if left is not None and (stuck is None or not stuck.stuck):
            stuck = left
        if stuck is not None:
            conditions.append(_condition("Stuck", stuck.stuck, stuck.reason.value, stuck.message, now=stamp,
                                         generation=generation, previous=prev_conditions))
    if served is not None:
        conditions.append(coverage_condition(cs, served, state, now=stamp, generation=generation,
                                             previous=prev_conditions))
    if cs.replay_deletion == ReplayDeletion.WHEN_TEARING_DOWN:
        conditions.append(_replay_condition(replay_forbidden, now=stamp, generation=generation,
                                            previous=prev_conditions))
    verified = not (unverifiable or type_error)
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": conditions,
        "criteriaCount": len(cs.criteria),
        # Unknown is no count: null removes it, so the Unmet column is empty rather than a reassuring 0.
        "unmetCriteria": len(unmet) if verified else None,
        "blockers": [
            {"criterion": i, "description": v.describe(), "count": v.count,
             "examples": [e.key for e in v.examples]}
            for i, v in unmet[:MAX_BLOCKERS]
        ],
    }
    if intents:
        status["deletionIntents"] = [_intent(i) for i in sorted(intents, key=lambda i: i.requested_at)[:MAX_INTENTS]]
    if isinstance(cs.provider, ProviderSelector):
        # A set has no one uid (and re-creation is what a selector is for): how many it selects now is news.
        try:
            status["providers"] = len(provider_objects(cs.provider, state))
        except StateUnavailable:
            status["providers"] = None  # unknown, not 0
        status["selector"] = str(cs.provider.selector)  # the Selector printer column (JSONPath cannot format it)
    elif not provider_known:
        status["providerUID"] = None  # which object is there now is unknown: no uid rather than a stale one
    elif provider is not None and provider.uid:
        status["providerUID"] = provider.uid
    elif cs.provider_uid:
        status["providerUID"] = cs.provider_uid  # keep the last uid seen while the provider is away
    if isinstance(cs.provider, ObjectRef):
        previous_uid = _previous_uid(cs, provider if provider_known else None, previous)
        if previous_uid:
            status["previousProviderUID"] = previous_uid
        recreated = _recreated_condition(attrs.evolve(cs, previous_provider_uid=previous_uid), provider, state,
                                         known=provider_known and verified, now=stamp, generation=generation,
                                         previous=prev_conditions)
        if recreated is not None:
            conditions.append(recreated)
    return status


def coverage_condition(cs: CriticalService, served: Sequence[Served], state: ClusterState, **kw: Any) -> dict[str, Any]:
    """Covered: does `cs` cover everything its provider serves (criticalsvc/discover/coverage.py)?"""
    def resolve(gr: GroupResource) -> GroupResource | None:
        try:
            return state.resolve(gr)
        except StateUnavailable:
            return None  # compared as spelt

    missing = uncovered(cs, served, resolve)
    if not missing:
        return _condition("Covered", True, "CoversServed", f"the criteria cover all {len(served)} thing(s) "
                          f"{cs.provider} is seen serving", **kw)
    first = missing[0]
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return _condition("Covered", False, "ServesUncovered",
                      f"{cs.provider} also serves {describe(first.criterion)}{more}, which no criterion covers: "
                      f"add the criterion `{first.criterion}` (`criticalsvc discover` proposes it); evidence: "
                      f"{first.evidence}"[:1024], **kw)


def _previous_uid(cs: CriticalService, provider: KubeObject | None,
                  previous: Mapping[str, Any] | None) -> str | None:
    """status.previousProviderUID: the uid seen under the provider's name before the current one. It moves
    only when the gate sees a new uid there, so it survives the provider being away and the gate restarting
    (it is read back from the status); an unknown provider changes nothing."""
    last = cs.provider_uid or (previous or {}).get("providerUID")
    kept = cs.previous_provider_uid or (previous or {}).get("previousProviderUID")
    if provider is not None and provider.uid and isinstance(last, str) and last and last != provider.uid:
        return last
    return kept if isinstance(kept, str) and kept else None


def _recreated_condition(cs: CriticalService, provider: KubeObject | None, state: ClusterState, *, known: bool,
                         **kw: Any) -> dict[str, Any] | None:
    orphan_set = cs.recreated_provider == RecreatedProvider.ORPHAN
    if not known:
        return None  # the criteria or the provider cannot be read now: Blocking says so, this would guess
    if provider is None:
        if not orphan_set:
            return None
        return _condition("ProviderRecreated", False, "ProviderGone", f"no {cs.provider} is there; "
                          "spec.recreatedProvider: Orphan lets this CriticalService go past a re-created one only",
                          **kw)
    verdict = recreated_provider_orphan(cs, provider, state)
    if verdict.orphaned:
        return _condition("ProviderRecreated", True, "Orphaned", verdict.message, **kw)
    recreated = cs.previous_provider_uid is not None and provider.uid != cs.previous_provider_uid
    if recreated:
        return _condition("ProviderRecreated", True, "Protected", verdict.hint.lstrip("; "), **kw)
    if not orphan_set:
        return None
    return _condition("ProviderRecreated", False, "SameProvider", verdict.hint.strip(" ()"), **kw)


def _replay_condition(forbidden: Sequence[GroupResource] | None, **kw: Any) -> dict[str, Any]:
    if forbidden is None:
        return {**_condition("ReplayPermitted", False, "NotChecked", "the gate has not checked yet whether it may "
                             "delete what it would replay", **kw), "status": "Unknown"}
    if not forbidden:
        return _condition("ReplayPermitted", True, "Permitted", "the gate may delete the provider, its namespace "
                          "and this CriticalService when it replays a refused deletion", **kw)
    names = ", ".join(str(gr) for gr in forbidden)
    return _condition("ReplayPermitted", False, "Forbidden",
                      f"the gate may not delete {names}, so refused deletions of them cannot be replayed; grant "
                      f"delete with a ClusterRole labelled {REPLAY_AGGREGATE_LABEL}=\"true\"", **kw)


def _intent(intent: DeletionIntent) -> dict[str, Any]:
    out: dict[str, Any] = {"object": str(intent.target), "uid": intent.uid, "user": intent.user,
                           "requestedAt": format_rfc3339(intent.requested_at), "phase": intent.phase.value}
    if intent.propagation_policy:
        out["propagationPolicy"] = intent.propagation_policy
    out["message"] = ("everything still blocking it is being deleted; replayed when the criteria hold"
                      if intent.armed_at is not None else "waiting for what blocks it to be deleted")
    return out


def _unenforced(cs: CriticalService, state: ClusterState, provider_type: GroupResource, routing: Routing,
                lookup: Callable[[GroupResource], ResourceType | None] | None,
                label_errors: Mapping[ObjectRef, str]) -> tuple[bool, str, str] | None:
    """Ready's status, reason and message while `cs` is not enforced on every API server; None when it is.

    Enforced everywhere: every object it protects that exists carries the gate's labels, which the shipped
    configuration routes by objectSelector on every API server (criticalsvc/protectionlabels.py), and what no
    label can carry (an absent provider's name, a selector, `scale`) is routed by criticalsvc-providers and was
    seen in force by the routing probe. When an object cannot be labelled (the gate may not patch it), or the
    shipped configuration does not route the labels (an install from before they existed), its route by name
    is all there is: Ready is True with its own reason, EnforcingByRoute, since the probe proves that route on
    one API server only."""
    if not routing.managed:
        return False, "ProviderNotRouted", not_routed(cs, provider_type)
    resource_type = lookup(provider_type) if lookup is not None else None
    try:
        # In force on every API server only what carries its labels, and only while the shipped configuration
        # routes them: before that (an install from before the labels), every existing object rests on its route.
        missing = protectionlabels.missing(cs, state) if routing.labelled else \
            sorted(protectionlabels.protected_objects(cs, state), key=protectionlabels.order_key)
    except StateUnavailable as exc:
        unreadable: str | None = str(exc)
        missing = []
    else:
        unreadable = None
    if resource_type is None:
        needs = routing.needs_of(cs)
    else:
        carried = None
        if routing.labelled:
            carried = protectionlabels.carried_in(state)
        needs = needed_routes(cs, resource_type, carried)
    if needs is None or not needs <= routing.live:
        return (False, *_unrouted(cs, routing, needs))
    if unreadable is not None:
        return True, "EnforcingByRoute", (
            f"deletes of {cs.provider} are gated where the API server holds ValidatingWebhookConfiguration "
            f"{PROVIDERS_CONFIGURATION}; whether they carry the gate's labels cannot be read now: {unreadable}")
    pending = [ref for ref in missing if ref not in label_errors] if routing.labelled else []
    if pending:
        more = f" (and {len(pending) - 1} more)" if len(pending) > 1 else ""
        return False, "LabelPending", (f"the gate is labelling {pending[0]}{more} {PROTECTED_LABEL}={LABEL_VALUE}, "
                                       "which sends its DELETE to the gate on every API server; not enforced until "
                                       "the label is stored")
    if not routing.labelled and missing:
        return True, "EnforcingByRoute", (
            f"deletes of {cs.provider} are gated where the API server holds ValidatingWebhookConfiguration "
            f"{PROVIDERS_CONFIGURATION} (seen on the one that answered the routing probe; another may hold it late): "
            f"the shipped configuration has no webhook {LABELS_WEBHOOK}, so the gate's labels route nothing - apply "
            "the current one (design/routing.md, Upgrading)")
    failed = [ref for ref in missing if ref in label_errors]
    if failed:
        return True, "EnforcingByRoute", (
            f"deletes of {cs.provider} are gated where the API server holds ValidatingWebhookConfiguration "
            f"{PROVIDERS_CONFIGURATION} (seen on the one that answered the routing probe; another may hold it late), "
            f"because the gate could not label {failed[0]}: {label_errors[failed[0]]}; let it patch that type "
            f"(a ClusterRole labelled {LABEL_AGGREGATE_LABEL}=\"true\")")
    return None


def _unrouted(cs: CriticalService, routing: Routing, needs: frozenset[Route] | None) -> tuple[str, str]:
    """Ready's reason and message while the API server is not known to route what `cs` needs."""
    if routing.error:
        return "RoutingFailed", (f"the gate could not route {cs.provider} (ValidatingWebhookConfiguration "
                                 f"{PROVIDERS_CONFIGURATION}): {routing.error}")
    if needs is not None and needs <= routing.written:
        return "RoutePending", (f"the gate has routed {cs.provider} (ValidatingWebhookConfiguration "
                                f"{PROVIDERS_CONFIGURATION}) and waits for the API server to send it there (a "
                                "probe); not enforced until it does")
    return "RoutePending", (f"the gate has not yet routed {cs.provider} (ValidatingWebhookConfiguration "
                            f"{PROVIDERS_CONFIGURATION}); not enforced until it has")


def _narrow_condition(cs: CriticalService, routing: Routing, **kw: Any) -> dict[str, Any]:
    """RoutedNarrowly: whether what `cs` routes reaches the gate alone, or drags other requests along."""
    broad = [(r, routing.broad[r]) for r in sorted(routing.needs_of(cs) or (), key=Route.sort_key)
             if r in routing.broad]
    if not broad:
        return _condition("RoutedNarrowly", True, "Narrow", f"only requests about {cs.provider} reach the gate "
                          "for it; nothing else waits on the gate in an outage", **kw)
    route, why = broad[0]
    more = f" (and {len(broad) - 1} more)" if len(broad) > 1 else ""
    return _condition("RoutedNarrowly", False, "Broad",
                      f"{route}{more}: {why}; in an outage of the gate those requests are refused too", **kw)


def same_status(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Equal but for timestamps: a writer skips the PATCH when nothing a reader cares about changed."""
    def strip(s: Mapping[str, Any] | None) -> Any:
        if s is None:
            return None
        out = dict(s)
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"}
                             for c in s.get("conditions") or []]
        return out
    return bool(strip(a) == strip(b))
