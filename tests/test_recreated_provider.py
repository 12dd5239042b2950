"""spec.recreatedProvider (the seed's orphan intent): a teardown stuck behind a provider re-created under its name.

The DELETE of the CriticalService is what the intent may let through, and only when the object under the
provider's name is a re-creation (its uid is not status.previousProviderUID) and every criterion holds; never
a provider's DELETE, never without a re-creation the gate has seen. Exercised through the AdmissionReview wire
format, as the API server sends it, and through the status the gate writes.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubefakes import state_with
from test_decision import PODS, PROVIDER, cs_obj, delete, deploy, ns, resources, review

from criticalsvc.admission import parse_review, render_response
from criticalsvc.api import BREAK_GLASS_ANNOTATION, CRITICAL_SERVICES, GroupResource, parse_critical_service
from criticalsvc.decision import Rule, decide
from criticalsvc.errors import InvalidSpec
from criticalsvc.explain import explain, render_text
from criticalsvc.objects import KubeObject
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status

DEPLOYMENTS = GroupResource("apps", "deployments")
OLD_UID, NEW_UID = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


def web_cs(intent: str | None = None, *, provider_uid: str | None = NEW_UID,
           previous_uid: str | None = OLD_UID) -> dict[str, Any]:
    """CriticalService web (Deployment app/web, until no pod app=web), as stored: with the status the gate wrote."""
    obj = cs_obj("web", PROVIDER, resources("", "pods", "app", {"matchLabels": {"app": "web"}}))
    if intent is not None:
        obj["spec"]["recreatedProvider"] = intent
    status: dict[str, Any] = {}
    if provider_uid:
        status["providerUID"] = provider_uid
    if previous_uid:
        status["previousProviderUID"] = previous_uid
    obj["status"] = status
    return obj


def cluster(cs: dict[str, Any], *, provider_uid: str | None = NEW_UID, pods: int = 0) -> MemoryState:
    objects = [ns("app"), *([deploy("app", "web", uid=provider_uid)] if provider_uid else []),
               *(KubeObject(PODS, "app", f"web-{i}", labels={"app": "web"}) for i in range(pods))]
    return state_with(cs, objects=objects)


def delete_cs(cs: dict[str, Any], state: MemoryState, **kw: Any) -> Any:
    return delete(state, CRITICAL_SERVICES, "web", old=cs, **kw)


# --- the CriticalService's own DELETE ----------------------------------------------------------------------
def test_without_the_intent_a_recreated_provider_keeps_its_critical_service_and_the_refusal_says_what_to_set():
    cs = web_cs()
    d = delete_cs(cs, cluster(cs))
    assert not d.allowed and d.rule == Rule.BLOCKED
    assert f"was deleted and re-created (uid {NEW_UID}, before {OLD_UID})" in d.message
    assert "set spec.recreatedProvider: Orphan on CriticalService web" in d.message


def test_with_orphan_the_critical_service_goes_past_a_recreated_provider_and_says_so():
    cs = web_cs("Orphan")
    d = delete_cs(cs, cluster(cs))
    assert d.allowed and d.rule == Rule.RECREATED_PROVIDER_ORPHANED
    assert any("no longer protected" in w for w in d.warnings)
    # Confirmed on a fresh read like every protected ALLOW, and audited.
    assert d.protected
    audit = render_response("u", d)["response"]["auditAnnotations"]
    assert audit["rule"] == "recreated-provider-orphaned" and audit["recreated-provider"] == "Orphan"


@pytest.mark.parametrize(("case", "cs", "provider_uid"), [
    ("the provider there is the one protected", web_cs("Orphan", provider_uid=OLD_UID, previous_uid=None), OLD_UID),
    ("no re-creation seen yet (status lost or never written)", web_cs("Orphan", provider_uid=None, previous_uid=None),
     NEW_UID),
    ("the status says the earlier object is back", web_cs("Orphan"), OLD_UID),
])
def test_orphan_does_nothing_unless_the_provider_there_is_a_recreation(case: str, cs: dict[str, Any],
                                                                       provider_uid: str) -> None:
    d = delete_cs(cs, cluster(cs, provider_uid=provider_uid))
    assert not d.allowed and d.rule == Rule.BLOCKED, case
    assert "lets it go only once the gate has seen the provider re-created" in d.message


def test_orphan_keeps_a_recreated_provider_protected_while_a_criterion_is_unmet():
    """The re-created object is needed again (a pod app=web is back): orphaning it would drop live protection."""
    cs = web_cs("Orphan")
    d = delete_cs(cs, cluster(cs, pods=1))
    assert not d.allowed and d.rule == Rule.BLOCKED
    assert ("spec.recreatedProvider is Orphan, but it is let go only while every criterion holds, and pods app/web-0"
            in d.message)


def test_orphan_never_lets_the_provider_itself_go_while_its_criteria_are_unmet():
    cs = web_cs("Orphan")
    d = delete(cluster(cs, pods=1), DEPLOYMENTS, "web", "app")
    assert not d.allowed and d.rule == Rule.BLOCKED


def test_orphan_is_not_break_glass_but_break_glass_still_works_on_the_critical_service():
    cs = web_cs(provider_uid=OLD_UID, previous_uid=None)
    cs["metadata"]["annotations"] = {BREAK_GLASS_ANNOTATION: "ticket 42"}
    d = delete_cs(cs, cluster(cs, provider_uid=OLD_UID))
    assert d.allowed and d.rule == Rule.BREAK_GLASS


def test_orphan_with_a_selector_provider_is_refused_with_the_field_path():
    obj = web_cs("Orphan")
    obj["spec"]["provider"] = {"group": "apps", "resource": "deployments", "namespace": "app",
                               "selector": {"matchLabels": {"app": "web"}}}
    with pytest.raises(InvalidSpec, match=r"^spec.recreatedProvider: Orphan needs a provider named by"):
        parse_critical_service(obj)


# --- setting the intent (an UPDATE of the CriticalService, reviewed by the gate) ---------------------------
def test_setting_the_intent_is_allowed_warned_and_audited_with_who_set_it():
    old = web_cs()
    new = copy.deepcopy(old)
    new["spec"]["recreatedProvider"] = "Orphan"
    d = decide(parse_review(review("UPDATE", CRITICAL_SERVICES, "web", obj=new, old=old)), cluster(old))
    assert d.allowed and d.rule == Rule.RECREATED_PROVIDER_INTENT
    assert any("set to Orphan by alice" in w for w in d.warnings)
    assert render_response("u", d)["response"]["auditAnnotations"]["recreated-provider"] == "Orphan set by alice"


def test_an_invalid_intent_is_refused_with_the_field_path_never_allowed():
    old = web_cs()
    new = copy.deepcopy(old)
    new["spec"]["recreatedProvider"] = "BestEffort"
    d = decide(parse_review(review("UPDATE", CRITICAL_SERVICES, "web", obj=new, old=old)), cluster(old))
    assert not d.allowed and d.rule == Rule.INVALID_SPEC
    assert "spec.recreatedProvider: must be Protect or Orphan" in d.message


# --- status and explain ----------------------------------------------------------------------------------
def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_status_records_the_uid_seen_before_a_recreation_and_keeps_it():
    cs_json = web_cs(provider_uid=OLD_UID, previous_uid=None)
    first = compute_status(parse_critical_service(cs_json), cluster(cs_json, provider_uid=OLD_UID), now=0)
    assert first["providerUID"] == OLD_UID and "previousProviderUID" not in first
    assert "ProviderRecreated" not in conditions(first)
    # The provider is deleted and re-created: the next status names both uids.
    cs_json["status"] = first
    second = compute_status(parse_critical_service(cs_json), cluster(cs_json, provider_uid=NEW_UID), now=10,
                            previous=first)
    assert (second["providerUID"], second["previousProviderUID"]) == (NEW_UID, OLD_UID)
    assert conditions(second)["ProviderRecreated"]["reason"] == "Protected"
    # Recomputed later: nothing moves (no flapping, lastTransitionTime kept).
    cs_json["status"] = second
    third = compute_status(parse_critical_service(cs_json), cluster(cs_json, provider_uid=NEW_UID), now=20,
                           previous=second)
    assert third["previousProviderUID"] == OLD_UID
    assert conditions(third)["ProviderRecreated"] == conditions(second)["ProviderRecreated"]


def test_status_says_when_the_intent_is_in_effect_and_explain_agrees():
    cs_json = web_cs("Orphan")
    state = cluster(cs_json)
    status = compute_status(parse_critical_service(cs_json), state, now=0, previous=cs_json["status"])
    cond = conditions(status)["ProviderRecreated"]
    assert (cond["status"], cond["reason"]) == ("True", "Orphaned")
    assert cond["observedGeneration"] == 1 and cond["lastTransitionTime"]
    text = render_text(explain(parse_critical_service(cs_json).ref, state, obj=cs_json))
    assert "ALLOWED" in text and "rule: recreated-provider-orphaned" in text
    assert f"recreatedProvider: Orphan - this CriticalService may go while deployments.apps app/web is a re-created " \
        f"object and every criterion holds (the gate saw uid {OLD_UID} there before)" in text
    # With the same provider there, Orphan is not in effect and the status says why.
    same = web_cs("Orphan", provider_uid=OLD_UID, previous_uid=None)
    status = compute_status(parse_critical_service(same), cluster(same, provider_uid=OLD_UID), now=0)
    assert conditions(status)["ProviderRecreated"]["reason"] == "SameProvider"
