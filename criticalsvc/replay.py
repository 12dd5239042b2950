"""Deletion intents: recording a refused DELETE, and deciding when replaying it is safe (pure).

The gate orders a teardown by refusing deletions until their time has come; a deleter that does not
retry (`kubectl delete -f`, one pass) or retries slowly (the garbage collector, backing off to
~1000 s) then leaves objects behind or takes far longer than the work needs. With
`spec.replayDeletion: WhenTearingDown` the gate records the refused DELETE and re-issues it itself once
the criteria hold - but a replay must never delete something the user meanwhile decided to keep, so:

    recorded      a DELETE refused by rule BLOCKED, not a dry run, every CriticalService that refused
                  it asks for replay, the object has a UID and no `criticalsvc.io/replay-deletion: Never`
    Waiting       something still blocking it is not being deleted (a teardown deletes in some order:
                  `kubectl delete -f` may reach the provider before the objects that need it)
    Armed         every object still blocking it is going away: it has a deletionTimestamp, or is itself
                  the target of an armed intent, or lives in a namespace that is either (least fixed
                  point, so a chain of intents is grounded in objects really being deleted)
    replayed      the criteria hold: DELETE with the recorded UID as precondition and the recorded
                  propagation policy; the replayed request passes the gate like any other
    dropped       the object is gone, terminating by other hands, or re-created (another UID); a
                  Waiting intent not armed within ARM_WINDOW (a plain refusal, not a teardown); an Armed
                  intent whose teardown stopped (a blocker that is not going away appeared); replay
                  switched off; the object labelled deletion-protected; or older than TIME_TO_LIVE

Only the decision is here; the simulator's replayer (sim/replayer.py) and the live leader
(criticalsvc/replayer.py) do the I/O. design/replay.md has the reasoning and the safety argument.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from . import criteria
from .api import (
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    GROUP,
    NAMESPACES,
    REPLAY_DELETION_ANNOTATION,
    CriticalService,
    GroupResource,
    ObjectRef,
    ProviderSelector,
    ReplayDeletion,
)
from .decision import Decision, Rule, decide
from .errors import InvalidInput
from .objects import KubeObject
from .request import AdmissionRequest
from .state import ClusterState, provider_objects
from .timestamps import format_rfc3339

# How long a Waiting intent may wait for its teardown to start. `kubectl delete -f` reaches objects in
# file order, one request at a time, so the provider may be refused before the objects that need it
# are deleted; a bundle of a few hundred objects takes well under a minute to walk.
ARM_WINDOW = 120.0
# How long any intent lives: a teardown whose finalizers take longer than this is left to its deleter.
TIME_TO_LIVE = 3600.0
# The value of REPLAY_DELETION_ANNOTATION that cancels (and prevents) intents for an object.
NEVER = "Never"


class Phase(enum.StrEnum):
    WAITING = "Waiting"
    ARMED = "Armed"


class DropReason(enum.StrEnum):
    """Why an intent ends without a replay; the Event's reason is `DeletionIntentDropped` + this."""

    GONE = "ObjectGone"
    RECREATED = "ObjectRecreated"
    DELETED_ELSEWHERE = "DeletedByOthers"
    CANCELLED = "Cancelled"
    NOT_STARTED = "TeardownNotStarted"
    ABANDONED = "TeardownAbandoned"
    REPLAY_OFF = "ReplayDisabled"
    PROTECTED = "DeletionProtected"
    EXPIRED = "Expired"
    FORBIDDEN = "Forbidden"


@attrs.frozen
class DeletionIntent:
    """A DELETE the gate refused and may replay: what, which incarnation, who asked, when, how."""

    target: ObjectRef
    uid: str
    user: str
    requested_at: float
    propagation_policy: str | None = None
    services: tuple[str, ...] = ()
    armed_at: float | None = None

    @property
    def phase(self) -> Phase:
        return Phase.ARMED if self.armed_at is not None else Phase.WAITING


@attrs.frozen
class Replay:
    intent: DeletionIntent


@attrs.frozen
class Wait:
    intent: DeletionIntent  # armed_at updated when it was armed in this round
    why: str


@attrs.frozen
class Drop:
    intent: DeletionIntent
    reason: DropReason
    message: str


Outcome = Replay | Wait | Drop


def intent_for(request: AdmissionRequest, decision: Decision, state: ClusterState, *,
               now: float) -> DeletionIntent | None:
    """The intent to record for a refused DELETE, or None. Pure; the caller writes it."""
    if request.operation != "DELETE" or request.dry_run or decision.allowed or decision.rule != Rule.BLOCKED:
        return None
    if not decision.blocking:
        return None
    services = {cs.name: cs for cs in state.critical_services()}
    if any(services.get(name) is None or services[name].replay_deletion != ReplayDeletion.WHEN_TEARING_DOWN
           for name in decision.blocking):
        return None
    old = _mapping(request.old_object)
    metadata = _mapping(old.get("metadata"))
    annotations = _mapping(metadata.get("annotations"))
    if annotations.get(REPLAY_DELETION_ANNOTATION) == NEVER:
        return None
    target = request.ref if request.name else attrs.evolve(request.ref, name=str(metadata.get("name") or ""))
    target = attrs.evolve(target, group_resource=state.resolve(target.group_resource) or target.group_resource)
    uid = str(metadata.get("uid") or "")
    if not uid:
        stored = state.get(target)
        uid = stored.uid if stored is not None else ""
    if not uid or not target.name:
        return None  # without a UID a replay could not be kept from a re-created object
    return DeletionIntent(target, uid, request.username, now, request.propagation_policy,
                          tuple(sorted(decision.blocking)))


def plan(intents: Sequence[DeletionIntent], state: ClusterState, *, now: float,
         arm_window: float = ARM_WINDOW, time_to_live: float = TIME_TO_LIVE) -> list[Outcome]:
    """What to do with each intent now, in the order given. Pure; may raise StateUnavailable."""
    live: list[tuple[DeletionIntent, Decision, tuple[KubeObject, ...]]] = []
    outcomes: dict[int, Outcome] = {}
    for i, intent in enumerate(intents):
        early = _settled(intent, state, now=now, time_to_live=time_to_live)
        if early is not None:
            outcomes[i] = early
            continue
        decision = decide(_replayed_request(intent, state), state)
        if decision.allowed:
            outcomes[i] = Replay(intent)
            continue
        if decision.rule == Rule.DELETION_PROTECTED:
            outcomes[i] = Drop(intent, DropReason.PROTECTED, f"{intent.target} is labelled deletion-protected")
            continue
        if decision.rule != Rule.BLOCKED:
            outcomes[i] = Wait(intent, f"the gate cannot decide yet ({decision.rule.value})")
            continue
        services = {cs.name: cs for cs in state.critical_services()}
        off = [n for n in decision.blocking
               if services.get(n) is None or services[n].replay_deletion != ReplayDeletion.WHEN_TEARING_DOWN]
        if off:
            outcomes[i] = Drop(intent, DropReason.REPLAY_OFF,
                               f"CriticalService {off[0]} does not ask for its refused deletions to be replayed")
            continue
        live.append((intent, decision, tuple(blockers(intent.target, state))))
    # Targets about to be replayed are going away as much as terminating ones are.
    replaying = {o.intent.uid for o in outcomes.values() if isinstance(o, Replay)}
    armed = _armed({id(it): (it, bl) for it, _, bl in live}, state, replaying)
    for i, intent in enumerate(intents):
        if i in outcomes:
            continue
        entry = next(e for e in live if e[0] is intent)
        staying = [o for o in entry[2] if not _going_away(o, state, armed)]
        if not staying:
            outcomes[i] = Wait(intent if intent.armed_at is not None else attrs.evolve(intent, armed_at=now),
                               "everything still blocking it is being deleted; replayed when the criteria hold")
        elif intent.armed_at is not None:
            outcomes[i] = Drop(intent, DropReason.ABANDONED, f"the teardown stopped: {_what(staying[0])} blocks "
                               "it and is not being deleted")
        elif now - intent.requested_at > arm_window:
            outcomes[i] = Drop(intent, DropReason.NOT_STARTED, f"{_what(staying[0])} blocks it and was not "
                               f"deleted within {arm_window:g} s; a plain refusal is not replayed")
        else:
            outcomes[i] = Wait(intent, f"waiting for {_what(staying[0])} to be deleted")
    return [outcomes[i] for i in range(len(intents))]


def blockers(target: ObjectRef, state: ClusterState) -> Iterable[KubeObject]:
    """Every object whose existence keeps the DELETE of `target` refused (decision.py's rules)."""
    gr = target.group_resource
    services: list[CriticalService] = list(state.protecting(target))
    if gr == NAMESPACES:
        services += [cs for cs in state.hosted_in(target.name)
                     if (state.get(cs.provider) is not None if isinstance(cs.provider, ObjectRef)
                         else provider_objects(cs.provider, state, namespace=target.name))]
    seen: set[ObjectRef] = set()
    for cs in services:
        for c in cs.criteria:
            for obj in criteria.blocking_objects(c, state):
                if obj.ref not in seen:
                    seen.add(obj.ref)
                    yield obj
    if gr == CRITICAL_SERVICES:
        service = next((c for c in state.critical_services() if c.name == target.name), None)
        if service is not None:
            p = service.provider
            members = list(provider_objects(p, state)) if isinstance(p, ProviderSelector) else \
                [o for o in (state.get(p),) if o is not None]
            if members:
                yield from members
            elif service.provider.namespace:
                namespace = state.get(ObjectRef(NAMESPACES, "", service.provider.namespace))
                if namespace is not None:
                    yield namespace
    if gr == CRDS and target.name == CRD_NAME:
        for other in state.critical_services():
            stored = state.get(other.ref)
            if stored is not None:
                yield stored


def _settled(intent: DeletionIntent, state: ClusterState, *, now: float, time_to_live: float) -> Drop | None:
    obj = state.get(intent.target)
    if obj is None:
        return Drop(intent, DropReason.GONE, f"{intent.target} is gone")
    if obj.uid and obj.uid != intent.uid:
        return Drop(intent, DropReason.RECREATED, f"{intent.target} was re-created (uid {obj.uid}, the intent "
                    f"was for {intent.uid})")
    if obj.terminating:
        return Drop(intent, DropReason.DELETED_ELSEWHERE, f"{intent.target} is already being deleted")
    if now - intent.requested_at > time_to_live:
        return Drop(intent, DropReason.EXPIRED, f"the intent is older than {time_to_live:g} s")
    return None


def _replayed_request(intent: DeletionIntent, state: ClusterState) -> AdmissionRequest:
    """The DELETE as the API server would send it for the object as the state has it now."""
    target = intent.target
    obj = state.get(target)
    metadata: dict[str, Any] = {"name": target.name, "uid": intent.uid}
    if target.namespace:
        metadata["namespace"] = target.namespace
    if obj is not None:
        metadata["labels"] = dict(obj.labels)
    namespace = target.name if target.group_resource == NAMESPACES else target.namespace
    return AdmissionRequest(uid=f"replay-{intent.uid}", group_resource=target.group_resource, operation="DELETE",
                            name=target.name, namespace=namespace, old_object={"metadata": metadata},
                            username=intent.user, propagation_policy=intent.propagation_policy)


def _armed(live: Mapping[int, tuple[DeletionIntent, tuple[KubeObject, ...]]], state: ClusterState,
           replaying: set[str]) -> set[str]:
    """UIDs of the intents' targets that are going away: the least fixed point of "every blocker is
    terminating, in a terminating namespace, or itself an armed (or now replayed) target"."""
    armed: set[str] = set(replaying)
    changed = True
    while changed:
        changed = False
        for intent, objs in live.values():
            if intent.uid in armed:
                continue
            if all(_going_away(o, state, armed) for o in objs):
                armed.add(intent.uid)
                changed = True
    return armed


def _going_away(obj: KubeObject, state: ClusterState, armed: set[str]) -> bool:
    """Terminating, an armed target, or in a namespace that is terminating or an armed target (the
    namespace controller deletes its content)."""
    if obj.terminating or (obj.uid and obj.uid in armed):
        return True
    if obj.namespace:
        namespace = state.get(ObjectRef(NAMESPACES, "", obj.namespace))
        return namespace is not None and (namespace.terminating or bool(namespace.uid and namespace.uid in armed))
    return False


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _what(obj: KubeObject) -> str:
    return str(obj.ref)


# --- the record: one ConfigMap per intent in the gate's namespace -----------------------------------------
# A ConfigMap per object incarnation (named by its UID): any replica creates it (AlreadyExists means
# another replica, or an earlier retry, recorded the same deletion first), the leader reads them all,
# so intents survive a restart and a leader change without replicas writing one shared object.
RECORD_LABEL = f"{GROUP}/deletion-intent"


def record_name(uid: str) -> str:
    return f"deletion-intent-{uid}"


def to_record(intent: DeletionIntent, *, namespace: str) -> dict[str, Any]:
    """The ConfigMap that stores `intent`."""
    t = intent.target
    data = {"group": t.group_resource.group, "resource": t.group_resource.resource, "namespace": t.namespace,
            "name": t.name, "uid": intent.uid, "user": intent.user, "requestedAt": repr(intent.requested_at),
            "services": ",".join(intent.services)}
    if intent.propagation_policy:
        data["propagationPolicy"] = intent.propagation_policy
    if intent.armed_at is not None:
        data["armedAt"] = repr(intent.armed_at)
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": record_name(intent.uid), "namespace": namespace,
                         "labels": {RECORD_LABEL: "true", "app.kubernetes.io/name": "criticalsvc"},
                         "annotations": {f"{GROUP}/requested-at": format_rfc3339(intent.requested_at),
                                         f"{GROUP}/object": str(t)}},
            "data": data}


def from_record(obj: Mapping[str, Any]) -> DeletionIntent:
    """A stored ConfigMap -> its intent; raises InvalidInput naming the field (a hand-edited record)."""
    metadata = _mapping(obj.get("metadata"))
    where = f"ConfigMap {metadata.get('namespace', '')}/{metadata.get('name', '')}"
    data = obj.get("data")
    if not isinstance(data, Mapping):
        raise InvalidInput("data", "required", where=where)

    def text(key: str, *, required: bool = True) -> str:
        value = data.get(key)
        if (value is None or value == "") and required:
            raise InvalidInput(f"data.{key}", "required", where=where)
        return str(value or "")

    def seconds(key: str) -> float:
        try:
            return float(text(key))
        except ValueError:
            raise InvalidInput(f"data.{key}", f"{data.get(key)!r} is not a number of seconds", where=where) from None

    target = ObjectRef(GroupResource(text("group", required=False), text("resource")),
                       text("namespace", required=False), text("name"))
    return DeletionIntent(target, text("uid"), text("user", required=False), seconds("requestedAt"),
                          text("propagationPolicy", required=False) or None,
                          tuple(s for s in text("services", required=False).split(",") if s),
                          seconds("armedAt") if data.get("armedAt") else None)


def describe(intent: DeletionIntent) -> str:
    return (f"{intent.target} (uid {intent.uid}), asked by {intent.user or 'unknown'}"
            f"{' with propagationPolicy ' + intent.propagation_policy if intent.propagation_policy else ''}")


__all__ = [
    "ARM_WINDOW",
    "RECORD_LABEL",
    "TIME_TO_LIVE",
    "DeletionIntent",
    "Drop",
    "DropReason",
    "Outcome",
    "Phase",
    "Replay",
    "Wait",
    "blockers",
    "describe",
    "from_record",
    "intent_for",
    "plan",
    "record_name",
    "to_record",
]
