"""Why can't I delete this? The gate's decision for a would-be DELETE, criterion by criterion.

It builds the DELETE admission request the API server would send for the object and runs the same
`decide` the webhook runs, then lays out every CriticalService that has a say and each of its
criteria with the objects that block it — so the answer is the gate's, not a re-implementation.
A criterion with a condition also lists the objects its condition left out (false for them) and those
it could not be evaluated on (they block: the gate fails closed).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import attrs

from . import criteria, deleters, nsorder
from .admission import AdmissionRequest
from .api import (
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    NAMESPACES,
    CriticalService,
    ObjectRef,
    RecreatedProvider,
    ReplayDeletion,
)
from .criteria import Verdict
from .decision import Decision, decide
from .discover.diagnose import Diagnosis, render_lines
from .replay import DeletionIntent
from .state import ClusterState, provider_objects
from .stuck import Stuck, finalizer_controller, left_behind
from .timestamps import format_rfc3339


@attrs.frozen
class ServiceReport:
    service: CriticalService
    role: str  # how the CriticalService relates to the target
    verdicts: tuple[Verdict, ...]
    # Per criterion, the first objects its condition left out (empty without a condition).
    excluded: tuple[tuple[ObjectRef, ...], ...] = ()
    # Whether its Finalizer criteria wait on a provider that is not running (criticalsvc/stuck.py).
    stuck: Stuck | None = None


@attrs.frozen
class Explanation:
    target: ObjectRef
    exists: bool
    decision: Decision
    services: tuple[ServiceReport, ...]
    # Refused deletions of the target the gate has recorded and will replay (spec.replayDeletion).
    intents: tuple[DeletionIntent, ...] = ()
    # Why the target is stuck terminating, if it is (criticalsvc/discover/diagnose.py): the gate's decision
    # alone says nothing about a namespace that will never go.
    diagnosis: Diagnosis | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": {"resource": str(self.target.group_resource), "namespace": self.target.namespace,
                       "name": self.target.name},
            "exists": self.exists,
            "allowed": self.decision.allowed,
            "rule": self.decision.rule.value,
            "message": self.decision.message,
            "warnings": list(self.decision.warnings),
            "criticalServices": [
                {"name": r.service.name, "role": r.role, "enforcement": r.service.enforcement.value,
                 **({"stuck": {"reason": r.stuck.reason.value, "message": r.stuck.message}}
                    if r.stuck is not None and r.stuck.stuck else {}),
                 "criteria": [{"index": i, "satisfied": v.satisfied, "description": str(v.criterion),
                               "count": v.count, "examples": [e.key for e in v.examples],
                               **_condition_dict(v, r.excluded[i] if r.excluded else ())}
                              for i, v in enumerate(r.verdicts)]}
                for r in self.services
            ],
            "deletionIntents": [{"uid": i.uid, "user": i.user, "requestedAt": format_rfc3339(i.requested_at),
                                 "propagationPolicy": i.propagation_policy, "phase": i.phase.value}
                                for i in self.intents],
            **({"stuck": self.diagnosis.to_dict()} if self.diagnosis is not None else {}),
        }


def _condition_dict(v: Verdict, excluded: tuple[ObjectRef, ...]) -> dict[str, Any]:
    if v.criterion.condition is None:
        return {}
    return {"condition": v.criterion.condition.expression, "excluded": v.excluded,
            "excludedExamples": [e.key for e in excluded],
            "conditionErrors": [{"object": ref.key, "error": error} for ref, error in v.errors]}


def describe_excluded(v: Verdict, excluded: tuple[ObjectRef, ...]) -> str:
    """Which objects the condition left out, and why; "" when it left out none."""
    first = ", ".join(e.key for e in excluded)
    if not v.excluded:
        return ""
    if v.excluded == 1:
        return f"the condition is false for {first}, so it does not count"
    return f"the condition is false for {v.excluded} objects (first: {first}), so they do not count"


def explain(target: ObjectRef, state: ClusterState, *, obj: Mapping[str, Any] | None = None,
            intents: tuple[DeletionIntent, ...] = ()) -> Explanation:
    """The gate's answer for DELETE of `target` now, with every CriticalService that has a say."""
    stored = state.get(target)
    if obj is None:
        # What the API server would send as oldObject: the stored object, or (not in the state) one
        # without labels, so the answer is the gate's for an unlabelled object of that name.
        metadata: dict[str, Any] = {"name": target.name}
        if stored is not None:
            metadata["labels"] = dict(stored.labels)
            if stored.deletion_timestamp:
                metadata["deletionTimestamp"] = stored.deletion_timestamp
        if target.namespace:
            metadata["namespace"] = target.namespace
        obj = {"metadata": metadata}
    request = AdmissionRequest(
        uid="explain", group_resource=target.group_resource, operation="DELETE", name=target.name,
        namespace=target.name if target.group_resource == NAMESPACES else target.namespace,
        old_object=obj, username="criticalsvc-explain")
    decision = decide(request, state)
    reports: list[ServiceReport] = []
    # Who would delete it, from the object's own annotations (Argo CD's tracking, Helm's release): its teardown
    # is stuck when a criterion waits for something that tool never deletes (criticalsvc/deleters.py).
    deleter = deleters.of_request("", _mapping(obj.get("metadata")))

    def add(cs: CriticalService, role: str) -> None:
        verdicts = tuple(criteria.evaluate(c, state) for c in cs.criteria)
        provider = state.get(cs.provider) if isinstance(cs.provider, ObjectRef) else None
        unmet = [v for v in verdicts if not v.satisfied]
        stuck = finalizer_controller(cs, provider, unmet, state)
        if stuck is None or not stuck.stuck:
            stuck = left_behind(cs, unmet, state, deleter) or stuck
        excluded = tuple(criteria.excluded_objects(c, state) for c in cs.criteria)
        reports.append(ServiceReport(cs, role, verdicts, excluded, stuck))

    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    for cs in sorted(state.protecting(target, labels), key=lambda c: c.name):
        add(cs, "protects it (it is the provider)" if isinstance(cs.provider, ObjectRef) else
            f"selects it by its labels (spec.provider.selector: {cs.provider}) and protects it")
    if target.group_resource == NAMESPACES:
        for cs in sorted(state.hosted_in(target.name), key=lambda c: c.name):
            inside = (" (confined to it: does not hold the namespace back, its provider waits inside)"
                      if nsorder.confined(cs) else "")
            if isinstance(cs.provider, ObjectRef):
                add(cs, f"protects {cs.provider}, which lives in this namespace{inside}")
            elif members := provider_objects(cs.provider, state, namespace=target.name):
                first = ", ".join(o.key for o in itertools.islice(members, 3))
                add(cs, f"protects {cs.provider}, of which {len(members)} live in this namespace (first: {first})"
                        f"{inside}")
    if target.group_resource == CRITICAL_SERVICES:
        for cs in state.critical_services():
            if cs.name == target.name:
                add(cs, "is the object itself (it goes after its provider)")
    if target.group_resource == CRDS and target.name == CRD_NAME:
        for cs in sorted(state.critical_services(), key=lambda c: c.name):
            add(cs, "would be removed without admission with its CRD")
    mine = tuple(i for i in intents if i.target == target and (stored is None or i.uid == stored.uid))
    return Explanation(target, stored is not None, decision, tuple(reports), mine)


def render_text(e: Explanation) -> str:
    verdict = "ALLOWED" if e.decision.allowed else "DENIED"
    lines = [f"DELETE {e.target}: {verdict} now (rule: {e.decision.rule.value})"]
    if not e.exists:
        lines.append("  (the object does not exist in the cluster state; showing what the gate would say)")
    if not e.services:
        lines.append("  No CriticalService has a say in this deletion.")
    for r in e.services:
        lines.append(f"  CriticalService {r.service.name} ({r.service.enforcement.value}) {r.role}:")
        for i, v in enumerate(r.verdicts):
            mark = "met  " if v.satisfied else "UNMET"
            detail = "" if v.satisfied else f" - {v.describe()}"
            lines.append(f"    [{mark}] criteria[{i}] {v.criterion}{detail}")
            if v.excluded and r.excluded:
                lines.append(f"            excluded: {describe_excluded(v, r.excluded[i])}")
        if r.service.replay_deletion == ReplayDeletion.WHEN_TEARING_DOWN:
            lines.append("    replayDeletion: WhenTearingDown - a refused DELETE is replayed by the gate once these "
                         "criteria hold, if everything blocking it is being deleted")
        if r.stuck is not None and r.stuck.stuck:
            lines.append(f"    STUCK ({r.stuck.reason.value}): {r.stuck.message}")
        if r.service.recreated_provider == RecreatedProvider.ORPHAN:
            before = r.service.previous_provider_uid
            seen = f"the gate saw uid {before} there before" if before else "the gate has seen no re-creation yet"
            lines.append(f"    recreatedProvider: Orphan - this CriticalService may go while {r.service.provider} is a "
                         f"re-created object and every criterion holds ({seen}); never the provider itself")
    for intent in e.intents:
        policy = f" (propagationPolicy {intent.propagation_policy})" if intent.propagation_policy else ""
        lines.append(f"  Deletion intent ({intent.phase.value}): {intent.user or 'someone'} asked at "
                     f"{format_rfc3339(intent.requested_at)}{policy}; the gate deletes it when the criteria hold"
                     f"{'' if intent.armed_at is not None else ', if what blocks it is deleted soon'}")
    if e.diagnosis is not None:
        lines += render_lines(e.diagnosis)
    if not e.decision.allowed:
        lines.append(f"  Message: {e.decision.message}")
    for w in e.decision.warnings:
        lines.append(f"  Warning: {w}")
    return "\n".join(lines) + "\n"


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
