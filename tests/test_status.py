"""CriticalService status: conditions, providerUID, blockers — computed from the state."""

import pytest
from kubefakes import Unreadable

from criticalsvc.api import CRDS, GroupResource, ObjectRef
from criticalsvc.manifests import load_path
from criticalsvc.objects import KubeObject
from criticalsvc.snapshot import build_state
from criticalsvc.status import compute_status, same_status


@pytest.fixture
def story():
    state = build_state(load_path("api/examples/reference-story.yaml"))
    (cs,) = state.critical_services()
    return state, cs


def _cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_blocking_while_crs_carry_the_finalizer(story):
    """With CRs still finalized, Blocking is True and the blockers name the CRs."""
    state, cs = story
    status = compute_status(cs, state, now=1_700_000_000)
    assert _cond(status, "Blocking")["status"] == "True"
    assert _cond(status, "Blocking")["reason"] == "CriteriaUnmet"
    assert status["unmetCriteria"] == 2 and status["criteriaCount"] == 2
    assert status["blockers"][0]["count"] == 3
    assert status["blockers"][0]["examples"] == ["cool-apps/alpha", "cool-apps/beta", "cool-apps/gamma"]
    assert _cond(status, "Ready")["reason"] == "Enforcing"


def test_not_blocking_once_dependents_are_gone(story):
    """When the CRs and the CRD are gone, Blocking flips to False and blockers is empty."""
    state, cs = story
    for obj in list(state.objects()):
        if obj.group_resource.group == "my.crd.group" or obj.group_resource == CRDS:
            state.remove(obj.ref)
    status = compute_status(cs, state, now=1_700_000_000)
    assert _cond(status, "Blocking")["status"] == "False"
    assert status["blockers"] == [] and status["unmetCriteria"] == 0


def test_last_transition_time_moves_only_when_status_flips(story):
    """Recomputing an unchanged status keeps lastTransitionTime; a flip updates it."""
    state, cs = story
    first = compute_status(cs, state, now=1_700_000_000)
    again = compute_status(cs, state, now=1_700_000_600, previous=first)
    assert _cond(again, "Blocking")["lastTransitionTime"] == _cond(first, "Blocking")["lastTransitionTime"]
    assert same_status(first, again)
    for obj in list(state.objects()):
        if obj.group_resource.group == "my.crd.group" or obj.group_resource == CRDS:
            state.remove(obj.ref)
    flipped = compute_status(cs, state, now=1_700_000_900, previous=again)
    assert _cond(flipped, "Blocking")["lastTransitionTime"] == "2023-11-14T22:28:20Z"
    assert not same_status(again, flipped)


def test_provider_uid_tracks_the_live_provider(story):
    """providerUID is the uid of the provider object currently seen (re-creation changes it)."""
    state, cs = story
    provider = state.get(cs.provider)
    state.upsert(KubeObject(provider.group_resource, provider.namespace, provider.name, uid="uid-2"))
    assert compute_status(cs, state, now=0)["providerUID"] == "uid-2"


def test_provider_of_an_unrouted_type_is_not_ready_and_says_what_to_add(story):
    """A gate that does not manage routes: nothing routes a provider (the shipped configuration routes none), so
    Ready is False, naming what to add; the same CriticalService is Enforcing once its routes are seen live."""
    import attrs

    from criticalsvc.routing import Routing, desired, route_key

    state, cs = story
    service = attrs.evolve(cs, provider=ObjectRef(GroupResource("", "services"), cs.provider.namespace, "webhook"))
    ready = _cond(compute_status(service, state, now=0, routing=Routing(managed=False)), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ProviderNotRouted")
    assert "does not manage its routes" in ready["message"]
    assert f"add a webhook for services {cs.provider.namespace}/webhook" in ready["message"]
    needs = desired([cs], state.mapper.lookup).needs
    live = Routing(managed=True, needs=needs, written=needs[route_key(cs)], live=needs[route_key(cs)])
    # Routed by name, seen live on the API server that answered the probe: that is all an install whose shipped
    # configuration does not route the gate's labels can say of the existing provider.
    by_route = _cond(compute_status(cs, state, now=0, routing=live), "Ready")
    assert (by_route["status"], by_route["reason"]) == ("True", "EnforcingByRoute")
    assert "another may hold it late" in by_route["message"]


def test_unserved_provider_type_is_not_ready(story):
    """A provider whose type is not served makes Ready False with ProviderTypeNotServed."""
    state, cs = story
    import attrs

    ghost = attrs.evolve(cs, provider=ObjectRef(cs.provider.group_resource.__class__("ghost.io", "ghosts"), "x", "y"))
    status = compute_status(ghost, state, now=0)
    assert _cond(status, "Ready")["status"] == "False"
    assert _cond(status, "Ready")["reason"] == "ProviderTypeNotServed"


@pytest.mark.parametrize("provider", [ObjectRef(GroupResource("", "namespaces"), "", "finalizer-namespace"),
                                      ObjectRef(CRDS, "", "coolresources.my.crd.group")])
def test_a_namespace_or_crd_provider_is_routed(story, provider):
    """Namespaces and CRDs have webhook rules of their own: as providers they are gated, so Ready is True
    (it said ProviderNotRouted, and CREATE warned, although their DELETEs reach the gate)."""
    import attrs

    from tests.test_decision import write

    state, cs = story
    as_provider = attrs.evolve(cs, provider=provider)
    ready = _cond(compute_status(as_provider, state, now=0), "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Enforcing"), ready
    body = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "p"},
            "spec": {"provider": {"group": provider.group_resource.group,
                                  "resource": provider.group_resource.resource, "name": provider.name},
                     "criteria": [{"type": "SpecificResource", "specificResource": {
                         "group": "apps", "resource": "deployments", "namespace": "elsewhere", "name": "x"}}]}}
    decision = write(state, body)
    assert decision.allowed, decision.message
    assert not [w for w in decision.warnings if "spec.provider" in w], decision.warnings


def test_replay_permission_and_intents_appear_only_when_replay_is_asked_for(story):
    """spec.replayDeletion: WhenTearingDown adds ReplayPermitted (Unknown until checked, then True or False naming
    the missing grant) and lists the recorded intents; without it neither appears."""
    import attrs

    from criticalsvc.api import ReplayDeletion
    from criticalsvc.replay import DeletionIntent

    state, cs = story
    # (the story's Finalizer criterion adds Stuck: tests/test_stuck.py)
    assert [c["type"] for c in compute_status(cs, state, now=1_700_000_000)["conditions"]] == ["Ready", "Blocking",
                                                                                              "Stuck"]
    replaying = attrs.evolve(cs, replay_deletion=ReplayDeletion.WHEN_TEARING_DOWN)
    unknown = _cond(compute_status(replaying, state, now=1_700_000_000), "ReplayPermitted")
    assert (unknown["status"], unknown["reason"]) == ("Unknown", "NotChecked")
    assert _cond(compute_status(replaying, state, now=1, replay_forbidden=[]), "ReplayPermitted")["status"] == "True"
    forbidden = _cond(compute_status(replaying, state, now=1, replay_forbidden=[GroupResource("apps", "deployments")]),
                      "ReplayPermitted")
    assert (forbidden["status"], forbidden["reason"]) == ("False", "Forbidden")
    assert "deployments.apps" in forbidden["message"] and "criticalsvc.io/aggregate-to-replay" in forbidden["message"]
    intent = DeletionIntent(cs.provider, "uid-1", "alice", 1_700_000_000.0, "Foreground", (cs.name,), armed_at=None)
    listed = compute_status(replaying, state, now=1_700_000_005, intents=[intent])["deletionIntents"]
    assert listed == [{"object": str(cs.provider), "uid": "uid-1", "user": "alice",
                       "requestedAt": "2023-11-14T22:13:20Z", "phase": "Waiting", "propagationPolicy": "Foreground",
                       "message": "waiting for what blocks it to be deleted"}]


def test_a_stored_condition_that_does_not_compile_makes_ready_false_naming_the_field(story):
    """A CriticalService stored with a condition that does not compile (the webhook was away) keeps
    protecting - its criterion counts every object - and Ready says why it can never hold."""
    from criticalsvc.api import parse_critical_service

    state, _cs = story
    raw = {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": "typo"},
           "spec": {"provider": {"group": "apps", "resource": "deployments", "namespace": "finalizer-namespace",
                                 "name": "finalizer-deployment"},
                    "criteria": [{"type": "Resources", "resources": {"resource": "pods"},
                                  "condition": "objekt.status.phase == 'Running'"}]}}
    typo = parse_critical_service(raw, lenient_conditions=True)
    ready = _cond(compute_status(typo, state, now=0), "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidCondition")
    assert ready["message"].startswith("spec.criteria[0].condition does not compile: undeclared reference to 'objekt'")
    # The same spec with a condition that compiles is Ready.
    fixed = parse_critical_service({**raw, "spec": {**raw["spec"], "criteria": [
        {**raw["spec"]["criteria"][0], "condition": "object.status.phase == 'Running'"}]}})
    assert _cond(compute_status(fixed, state, now=0), "Ready")["reason"] == "Enforcing"


COOL = GroupResource("my.crd.group", "coolresources")


def test_a_criterion_the_gate_cannot_read_makes_blocking_unknown_not_met(story):
    """The reference story without the reader role: the webhook refuses the provider's DELETE as unverifiable, so
    the status says Blocking Unknown (CannotVerify) with the webhook's reason - never CriteriaMet, never Unmet 0."""
    state, cs = story
    for obj in list(state.objects(COOL)):  # the CRs are gone: what is left readable would say "met"
        state.remove(obj.ref)
    state.remove(ObjectRef(CRDS, "", "coolresources.my.crd.group"))
    met = compute_status(cs, state, now=1)
    assert _cond(met, "Blocking")["status"] == "False"
    status = compute_status(cs, Unreadable(state, COOL), now=2, previous=met)
    blocking = _cond(status, "Blocking")
    assert (blocking["status"], blocking["reason"]) == ("Unknown", "CannotVerify")
    assert blocking["message"] == (
        "criticalsvc could not verify the cluster state, so it does not allow this yet: the gate may not list "
        'coolresources.my.crd.group (403 Forbidden): grant it get/list/watch with a ClusterRole labelled '
        'criticalsvc.io/aggregate-to-reader="true"')
    assert blocking["lastTransitionTime"] == "1970-01-01T00:00:02Z"
    assert status["unmetCriteria"] is None  # the merge patch removes it: the Unmet column is empty, not 0
    assert _cond(status, "Ready")["reason"] == "Enforcing"  # the provider's DELETE is refused: it is enforced
    assert not same_status(met, status)


def test_criteria_that_can_be_read_still_name_their_blockers_while_another_cannot(story):
    state, cs = story
    status = compute_status(cs, Unreadable(state, COOL), now=1)
    assert _cond(status, "Blocking")["status"] == "Unknown"
    # criterion 1 (the CRD) is readable and unmet: its index is its own, not shifted by the unreadable one
    assert [b["criterion"] for b in status["blockers"]] == [1]


def test_provider_uid_follows_the_provider_while_criteria_cannot_be_read(story):
    state, cs = story
    old = compute_status(cs, state, now=1)
    provider = state.get(cs.provider)
    state.upsert(KubeObject(provider.group_resource, provider.namespace, provider.name, uid="re-created"))
    status = compute_status(cs, Unreadable(state, COOL), now=2, previous=old)
    assert status["providerUID"] == "re-created"


def test_a_provider_whose_type_cannot_be_read_is_blocking_unknown_and_has_no_stale_uid(story):
    state, cs = story
    deployments = GroupResource("apps", "deployments")
    status = compute_status(cs, Unreadable(state, deployments), now=1)
    blocking = _cond(status, "Blocking")
    assert (blocking["status"], blocking["reason"]) == ("Unknown", "CannotVerify")
    assert "the gate may not list deployments.apps (403 Forbidden)" in blocking["message"]
    assert status["providerUID"] is None and status["unmetCriteria"] is None


def test_a_refused_confirmation_makes_met_criteria_blocking_unknown_not_may_go(story):
    """The caches see every criterion met but the fresh read confirming the provider's DELETE failed (a
    Finalizer criterion over 100,000 ConfigMaps cannot be LISTed in 2 s): the webhook refused it, so
    Blocking must not say "the provider may go" - it says CannotConfirm with the read's error. With the
    criteria unmet it stays CriteriaUnmet (that is the first reason to refuse)."""
    state, cs = story
    why = "a fresh read of configmaps got no answer within 2 s"
    unmet = _cond(compute_status(cs, state, now=0, refused_confirmation=why), "Blocking")
    assert (unmet["status"], unmet["reason"]) == ("True", "CriteriaUnmet")
    for obj in list(state.objects()):
        if obj.group_resource.group == "my.crd.group" or obj.group_resource == CRDS:
            state.remove(obj.ref)
    assert _cond(compute_status(cs, state, now=0), "Blocking")["reason"] == "CriteriaMet"
    blocking = _cond(compute_status(cs, state, now=0, refused_confirmation=why), "Blocking")
    assert (blocking["status"], blocking["reason"]) == ("Unknown", "CannotConfirm")
    assert why in blocking["message"] and str(cs.provider) in blocking["message"]
