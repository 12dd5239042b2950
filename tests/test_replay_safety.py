"""The safety rules of replay.py, one by one, on a state built by hand (no simulator).

test_replay.py checks the rules as properties of whole simulated teardowns; a property can pass with a
rule gone when its generator never reaches the case (the simulator's replayer has checks of its own,
and its scripts never label an object deletion-protected nor mix CriticalServices). Here each rule is
one case a user would meet, stated as what must (not) be replayed:

    re-created object (another UID)              dropped, never replayed
    object already terminating by other hands    dropped (its deletion is not ours to re-issue)
    blocker in a namespace being deleted         armed: the namespace controller is deleting it
    object labelled deletion-protected           dropped, with the reason
    one of two refusing CriticalServices opted   not recorded: the other did not ask for replays
      in to replay

`python -m tests.mutants` is the negative control: with any one of these rules removed, a test here fails.
"""

from __future__ import annotations

from typing import Any

from kubefakes import state_with

from criticalsvc import replay
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import DELETION_PROTECTED_ALWAYS, DELETION_PROTECTED_LABEL, NAMESPACES, GroupResource, ObjectRef
from criticalsvc.decision import Rule, decide
from criticalsvc.objects import KubeObject
from criticalsvc.state import MemoryState

DEPLOYMENTS = GroupResource("apps", "deployments")
CONFIGMAPS = GroupResource("", "configmaps")
PROVIDER = ObjectRef(DEPLOYMENTS, "op-system", "controller")
UID, OTHER_UID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
TERMINATING = "2026-01-01T00:00:00Z"
NOW = 1_000.0


def service(name: str, *, replay_on: bool = True) -> dict[str, Any]:
    """A CriticalService for the provider: no ConfigMap labelled app=x may exist in namespace data."""
    spec: dict[str, Any] = {"provider": {"group": "apps", "resource": "deployments", "namespace": "op-system",
                                         "name": "controller"},
                            "criteria": [{"type": "Resources", "resources": {
                                "resource": "configmaps", "namespace": "data",
                                "selector": {"matchLabels": {"app": "x"}}}}]}
    if replay_on:
        spec["replayDeletion"] = "WhenTearingDown"
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": spec}


def state(*, provider_uid: str = UID, provider_terminating: bool = False, labels: dict[str, str] | None = None,
          blocker: bool = False, blocker_terminating: bool = False, data_terminating: bool = False,
          services: tuple[dict[str, Any], ...] = (service("op"),)) -> MemoryState:
    objects = [KubeObject(NAMESPACES, "", "op-system", uid="ns-op"),
               KubeObject(NAMESPACES, "", "data", uid="ns-data",
                          deletion_timestamp=TERMINATING if data_terminating else None),
               KubeObject(DEPLOYMENTS, "op-system", "controller", uid=provider_uid, labels=labels or {},
                          deletion_timestamp=TERMINATING if provider_terminating else None)]
    if blocker:
        objects.append(KubeObject(CONFIGMAPS, "data", "cm-0", uid="cm-uid", labels={"app": "x"},
                                  deletion_timestamp=TERMINATING if blocker_terminating else None))
    return state_with(*services, objects=objects)


def intent(*, armed: bool = True) -> replay.DeletionIntent:
    return replay.DeletionIntent(PROVIDER, UID, "alice", NOW - 10, "Orphan", ("op",),
                                 armed_at=NOW - 5 if armed else None)


def plan_one(s: MemoryState, i: replay.DeletionIntent | None = None) -> replay.Outcome:
    [outcome] = replay.plan([i or intent()], s, now=NOW)
    return outcome


def test_the_intent_is_replayed_once_its_criteria_hold():
    """The baseline the drops below differ from by one fact each."""
    assert plan_one(state()) == replay.Replay(intent())


def test_an_object_re_created_under_the_same_name_is_never_replayed():
    outcome = plan_one(state(provider_uid=OTHER_UID))
    assert isinstance(outcome, replay.Drop) and outcome.reason == replay.DropReason.RECREATED, outcome
    assert OTHER_UID in outcome.message and UID in outcome.message


def test_an_object_someone_else_is_already_deleting_is_not_deleted_again():
    """Its deletion (with the deleter's own propagationPolicy) is under way; a replay would re-issue it as Orphan."""
    outcome = plan_one(state(provider_terminating=True))
    assert isinstance(outcome, replay.Drop) and outcome.reason == replay.DropReason.DELETED_ELSEWHERE, outcome


def test_a_blocker_in_a_namespace_being_deleted_arms_the_intent():
    """`kubectl delete namespace data` is a teardown too: the namespace controller deletes cm-0 in its time."""
    waiting = plan_one(state(blocker=True, data_terminating=True), intent(armed=False))
    assert isinstance(waiting, replay.Wait) and waiting.intent.armed_at == NOW, waiting
    # Armed earlier, it stays armed (not abandoned) while the namespace is still going.
    assert plan_one(state(blocker=True, data_terminating=True)) == replay.Wait(intent(), waiting.why)
    # The negative control of the fixture: the same blocker in a namespace that stays is not a teardown.
    staying = plan_one(state(blocker=True), intent(armed=False))
    assert isinstance(staying, replay.Wait) and staying.intent.armed_at is None
    abandoned = plan_one(state(blocker=True))
    assert isinstance(abandoned, replay.Drop) and abandoned.reason == replay.DropReason.ABANDONED


def test_a_blocker_that_is_itself_terminating_arms_the_intent():
    waiting = plan_one(state(blocker=True, blocker_terminating=True), intent(armed=False))
    assert isinstance(waiting, replay.Wait) and waiting.intent.armed_at == NOW


def test_an_object_labelled_deletion_protected_after_the_refusal_is_dropped_with_the_reason():
    outcome = plan_one(state(labels={DELETION_PROTECTED_LABEL: DELETION_PROTECTED_ALWAYS}))
    assert isinstance(outcome, replay.Drop) and outcome.reason == replay.DropReason.PROTECTED, outcome
    assert "deletion-protected" in outcome.message


def _refused(s: MemoryState) -> tuple[AdmissionRequest, Any]:
    old = {"metadata": {"name": "controller", "namespace": "op-system", "uid": UID}}
    request = AdmissionRequest("u1", DEPLOYMENTS, "DELETE", "controller", "op-system", old_object=old,
                               username="alice")
    decision = decide(request, s)
    assert not decision.allowed and decision.rule == Rule.BLOCKED
    return request, decision


def test_a_refusal_is_recorded_only_when_every_refusing_critical_service_asks_for_replay():
    both = state(blocker=True, services=(service("op"), service("strict", replay_on=False)))
    request, decision = _refused(both)
    assert set(decision.blocking) == {"op", "strict"}
    assert replay.intent_for(request, decision, both, now=NOW) is None
    # ... and with both asking, it is recorded (for both).
    asking = state(blocker=True, services=(service("op"), service("also")))
    request, decision = _refused(asking)
    recorded = replay.intent_for(request, decision, asking, now=NOW)
    assert recorded is not None and recorded.services == ("also", "op") and recorded.uid == UID
