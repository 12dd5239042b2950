"""Every admission rule of criticalsvc.decision, exercised through the AdmissionReview wire format."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubefakes import Unreadable, state_with

from criticalsvc.admission import AdmissionRequest, parse_review, render_response, render_review
from criticalsvc.api import (
    BREAK_GLASS_ANNOTATION,
    CRD_NAME,
    CRITICAL_SERVICES,
    DELETION_PROTECTED_LABEL,
    CriticalService,
    GroupResource,
    ObjectRef,
    parse_critical_service,
)
from criticalsvc.decision import MESSAGE_LIMIT, WARNING_LIMIT, Decision, Rule, decide
from criticalsvc.errors import StateUnavailable
from criticalsvc.manifests import Manifest, load_path
from criticalsvc.objects import KubeObject
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState

EXAMPLES = Path(__file__).parent.parent / "api" / "examples"
STORY = str(EXAMPLES / "reference-story.yaml")
CS_NAME = "for-finalizer-deployment"
DEPLOYMENTS = GroupResource("apps", "deployments")
PODS = GroupResource("", "pods")
NAMESPACES = GroupResource("", "namespaces")
_AUTO = object()


# --- builders -------------------------------------------------------------------------------------
def story(drop: Callable[[Manifest], bool] = lambda m: False) -> MemoryState:
    """The reference story as a state, without the manifests `drop` selects."""
    return build_state([m for m in load_path(STORY) if not drop(m)])


def is_cool(m: Manifest) -> bool:
    """The CRs and their CRD: what has to be gone before the provider may go."""
    return m.kind == "CoolResource" or m.obj["metadata"]["name"] == "coolresources.my.crd.group"


def review(operation: str, gr: GroupResource, name: str, namespace: str = "", *, obj: Any = None,
           old: Any = _AUTO, sub_resource: str = "", dry_run: bool = False) -> dict[str, Any]:
    """An AdmissionReview v1 as the API server sends it; on DELETE `oldObject` is the stored object."""
    if old is _AUTO:
        md = {"name": name} if gr == NAMESPACES or not namespace else {"name": name, "namespace": namespace}
        old = {"metadata": md} if operation == "DELETE" else None
    request = AdmissionRequest(uid="req-1", group_resource=gr, operation=operation, name=name, namespace=namespace,
                               object=obj, old_object=old, sub_resource=sub_resource, dry_run=dry_run,
                               username="alice")
    return dict(render_review(request))


def delete(state: Any, gr: GroupResource, name: str, namespace: str = "", **kw: Any) -> Decision:
    return decide(parse_review(review("DELETE", gr, name, namespace, **kw)), state)


def old_with(name: str, namespace: str = "", *, labels: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, deletion_timestamp: str | None = None) -> dict[str, Any]:
    md: dict[str, Any] = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    if namespace:
        md["namespace"] = namespace
    if deletion_timestamp:
        md["deletionTimestamp"] = deletion_timestamp
    return {"metadata": md}


def cs_obj(name: str, provider: tuple[str, str, str, str], *criteria: dict[str, Any],
           enforcement: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    group, resource, namespace, pname = provider
    spec: dict[str, Any] = {"provider": {"group": group, "resource": resource, "namespace": namespace,
                                         "name": pname},
                            "criteria": list(criteria)}
    if enforcement:
        spec["enforcement"] = enforcement
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService",
            "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def specific(group: str, resource: str, namespace: str, name: str) -> dict[str, Any]:
    return {"type": "SpecificResource",
            "specificResource": {"group": group, "resource": resource, "namespace": namespace, "name": name}}


def resources(group: str, resource: str, namespace: str = "", selector: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"group": group, "resource": resource}
    if namespace:
        body["namespace"] = namespace
    if selector is not None:
        body["selector"] = selector
    return {"type": "Resources", "resources": body}


def finalizer(group: str, resource: str, name: str) -> dict[str, Any]:
    return {"type": "Finalizer", "finalizer": {"group": group, "resource": resource, "finalizerName": name}}


def deploy(namespace: str, name: str, **kw: Any) -> KubeObject:
    return KubeObject(DEPLOYMENTS, namespace, name, **kw)


def ns(name: str, **kw: Any) -> KubeObject:
    return KubeObject(NAMESPACES, "", name, **kw)


PROVIDER = ("apps", "deployments", "app", "web")


def guarded_web(**kw: Any) -> MemoryState:
    """Deployment app/web protected until no pod labelled app=web exists; one such pod exists."""
    return state_with(
        cs_obj("web", PROVIDER, resources("", "pods", "app", {"matchLabels": {"app": "web"}}), **kw),
        objects=[ns("app"), deploy("app", "web"), KubeObject(PODS, "app", "web-1", labels={"app": "web"})])


# --- DELETE of a provider ---------------------------------------------------------------------------
def test_provider_delete_is_denied_while_crs_carry_the_finalizer():
    """The reference story's Deployment may not go while CRs carry the finalizer and the CRD exists."""
    d = delete(story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    assert not d.allowed and d.rule is Rule.BLOCKED and d.code == 403 and d.reason == "Forbidden"
    assert d.blocking == (CS_NAME,) and d.protected
    assert d.message.startswith("deployments.apps finalizer-namespace/finalizer-deployment may not be deleted yet")
    assert f"CriticalService {CS_NAME} protects it" in d.message
    assert ("coolresources.my.crd.group objects still carry finalizer my.crd.group/super-important "
            "(3 objects; first: cool-apps/alpha, cool-apps/beta, cool-apps/gamma)") in d.message
    assert "customresourcedefinitions.apiextensions.k8s.io coolresources.my.crd.group still exists" in d.message


def test_a_refusal_repeats_what_it_waits_for_as_warnings_and_what_happens_then():
    """`helm uninstall` prints a refused DELETE's warnings, not its message: each unmet clause is a warning of
    its own (within the warning limit), then what happens once they hold: replay, or delete it again."""
    d = delete(story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    ref = "deployments.apps finalizer-namespace/finalizer-deployment"
    assert d.warnings == ()  # explain and the logs show the message once
    assert d.waiting == (
        f"{ref} may not be deleted while coolresources.my.crd.group objects still carry finalizer "
        "my.crd.group/super-important (3 objects; first: cool-apps/alpha, cool-apps/beta, cool-apps/gamma)",
        f"{ref} may not be deleted while customresourcedefinitions.apiextensions.k8s.io coolresources.my.crd.group "
        "still exists",
        f"{ref}: delete it again once that is over, or set spec.replayDeletion: WhenTearingDown on CriticalService "
        f"{CS_NAME}")
    assert all(len(w) <= WARNING_LIMIT for w in d.waiting)
    assert render_response("req-1", d)["response"]["warnings"] == list(d.waiting)
    replaying = story(lambda m: m.kind == "CriticalService")
    cs = dict(story_cs_old())
    cs["spec"] = {**cs["spec"], "replayDeletion": "WhenTearingDown"}
    replaying.upsert_critical_service(parse_critical_service(cs))
    d = delete(replaying, CSVC, CS_NAME, old=cs)
    assert d.waiting == (
        f"criticalservices.criticalsvc.io {CS_NAME} may not be deleted while its provider deployments.apps "
        "finalizer-namespace/finalizer-deployment still exists; a CriticalService goes after its provider",
        f"criticalservices.criticalsvc.io {CS_NAME}: the gate deletes it once that is over (replayDeletion: "
        "WhenTearingDown)")


def test_provider_delete_names_only_the_unmet_criterion():
    """With the CRs gone but the CRD still there, only the SpecificResource criterion is named."""
    d = delete(story(lambda m: m.kind == "CoolResource"), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    assert not d.allowed
    assert "coolresources.my.crd.group still exists" in d.message and "finalizer" not in d.message.split("until:")[1]


def test_crs_without_the_finalizer_do_not_block():
    """CRs that no longer carry the finalizer do not hold the Finalizer criterion back."""
    state = story(lambda m: m.obj["metadata"]["name"] == "coolresources.my.crd.group")
    for obj in list(state.objects(GroupResource("my.crd.group", "coolresources"))):
        state.upsert(KubeObject(obj.group_resource, obj.namespace, obj.name, finalizers=("other.io/f",)))
    d = delete(state, DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    assert d.allowed and d.rule is Rule.CRITERIA_MET


def test_provider_delete_is_allowed_once_crd_and_crs_are_gone():
    """With the CRD and its CRs gone every criterion holds and the provider may go."""
    d = delete(story(is_cool), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    assert d.allowed and d.rule is Rule.CRITERIA_MET and d.protected and not d.warnings


def test_every_protecting_service_must_be_satisfied():
    """Two CriticalServices protect one provider: one unmet criterion among them is enough to deny."""
    state = guarded_web()
    state.upsert_critical_service(parse_critical_service(cs_obj("web-2", PROVIDER, resources("", "configmaps"))))
    d = delete(state, DEPLOYMENTS, "web", "app")
    assert not d.allowed and d.blocking == ("web",)
    state.remove(ObjectRef(PODS, "app", "web-1"))
    assert delete(state, DEPLOYMENTS, "web", "app").allowed
    state.upsert(KubeObject(GroupResource("", "configmaps"), "x", "c"))
    assert delete(state, DEPLOYMENTS, "web", "app").blocking == ("web-2",)


def test_same_name_elsewhere_is_not_protected():
    """A Deployment of the provider's name in another namespace, or a StatefulSet of that name, is not gated."""
    state = guarded_web()
    assert delete(state, DEPLOYMENTS, "web", "other").rule is Rule.UNPROTECTED
    assert delete(state, GroupResource("apps", "statefulsets"), "web", "app").rule is Rule.UNPROTECTED


# --- DELETE of a namespace ----------------------------------------------------------------------------
def test_namespace_delete_is_denied_while_its_provider_is_protected():
    """Deleting the provider's namespace (request namespace == its own name) is denied while criteria are unmet."""
    d = delete(story(), NAMESPACES, "finalizer-namespace", "finalizer-namespace")
    assert not d.allowed and d.blocking == (CS_NAME,)
    assert d.message.startswith("namespaces finalizer-namespace may not be deleted yet")
    assert "lives in this namespace" in d.message


def test_namespace_delete_is_allowed_once_criteria_hold():
    """The provider's namespace may go once the CRD and CRs are gone."""
    d = delete(story(is_cool), NAMESPACES, "finalizer-namespace", "finalizer-namespace")
    assert d.allowed and d.rule is Rule.CRITERIA_MET


def test_namespace_without_providers_is_not_gated():
    """A namespace that hosts no provider (the CRs' own namespace) may go at any time."""
    d = delete(story(), NAMESPACES, "cool-apps", "cool-apps")
    assert d.allowed and d.rule is Rule.UNPROTECTED


def test_namespace_whose_provider_is_already_gone_may_go():
    """A namespace whose provider no longer exists cannot take it down, so its deletion is allowed."""
    state = story(lambda m: m.kind == "Deployment")
    d = delete(state, NAMESPACES, "finalizer-namespace", "finalizer-namespace")
    assert d.allowed


# --- DELETE of a CriticalService ------------------------------------------------------------------------
CSVC = GroupResource("criticalsvc.io", "criticalservices")


def story_cs_old() -> Mapping[str, Any]:
    return next(m.obj for m in load_path(STORY) if m.kind == "CriticalService")


def test_critical_service_delete_is_denied_while_its_provider_exists():
    """A CriticalService may not be deleted while its provider exists, even with all criteria met."""
    d = delete(story(is_cool), CSVC, CS_NAME, old=story_cs_old())
    assert not d.allowed and d.blocking == (CS_NAME,)
    assert ("finalizer-namespace/finalizer-deployment still exists; a CriticalService goes after its provider"
            in d.message)


def test_critical_service_delete_is_denied_while_its_provider_terminates():
    """A terminating provider still holds its CriticalService back, and the message says it is terminating."""
    state = story(is_cool)
    state.upsert(deploy("finalizer-namespace", "finalizer-deployment", deletion_timestamp="2026-01-01T00:00:00Z"))
    d = delete(state, CSVC, CS_NAME, old=story_cs_old())
    assert not d.allowed and "finalizer-namespace/finalizer-deployment is terminating" in d.message


def test_critical_service_delete_waits_for_a_terminating_provider_namespace():
    """With the provider gone but its namespace still terminating, the CriticalService stays."""
    state = story(lambda m: is_cool(m) or m.kind == "Deployment")
    state.upsert(ns("finalizer-namespace", deletion_timestamp="2026-01-01T00:00:00Z"))
    d = delete(state, CSVC, CS_NAME, old=story_cs_old())
    assert not d.allowed and "namespace finalizer-namespace is still terminating" in d.message


def test_critical_service_delete_is_allowed_after_its_provider():
    """Once the provider is gone (and its namespace is not terminating) the CriticalService may go."""
    state = story(lambda m: is_cool(m) or m.kind == "Deployment")
    assert delete(state, CSVC, CS_NAME, old=story_cs_old()).allowed
    state.remove(ObjectRef(NAMESPACES, "", "finalizer-namespace"))
    assert delete(state, CSVC, CS_NAME, old=story_cs_old()).allowed


def test_critical_service_delete_without_old_object_reads_the_state():
    """A CriticalService DELETE with oldObject null is judged from the CriticalService in the state."""
    d = delete(story(), CSVC, CS_NAME, old=None)
    assert not d.allowed and d.blocking == (CS_NAME,)


# --- DELETE of the CriticalService CRD --------------------------------------------------------------------
def test_crd_delete_is_denied_while_any_critical_service_exists():
    """The criticalservices CRD may not go while a CriticalService exists; the message counts them."""
    state = story()
    state.upsert_critical_service(parse_critical_service(cs_obj("another", PROVIDER, resources("", "pods"))))
    d = delete(state, GroupResource("apiextensions.k8s.io", "customresourcedefinitions"), CRD_NAME)
    assert not d.allowed and d.code == 403
    assert f"2 CriticalServices still exist (first: another, {CS_NAME})" in d.message


def test_crd_delete_is_allowed_without_critical_services():
    """With no CriticalService left the CRD may go; other CRDs are not gated by this rule."""
    crds = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
    assert delete(MemoryState(), crds, CRD_NAME).allowed
    assert delete(story(), crds, "coolresources.my.crd.group").rule is Rule.UNPROTECTED


def usage(drop: Callable[[Manifest], bool] = lambda m: False) -> MemoryState:
    """Crossplane's Usage example as a state: the Cluster prod-cluster (a custom resource) is the provider,
    protected while the Release app-release exists."""
    return build_state([m for m in load_path(str(EXAMPLES / "crossplane-usage.yaml")) if not drop(m)])


def test_the_crd_of_a_protected_provider_may_not_go_while_its_criteria_are_unmet():
    """CRD cleanup would delete the provider without admission, so its CRD waits as the provider does."""
    crds = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
    d = delete(usage(), crds, "clusters.compute.example.org")
    assert not d.allowed and d.code == 403 and d.blocking == ("prod-cluster-used-by-app-release",)
    assert "an instance of this CRD" in d.message and "releases.helm.example.org app-release" in d.message
    # the user's CRD is not the provider's: it goes; so does the provider's once the user is gone...
    assert delete(usage(), crds, "releases.helm.example.org").allowed
    no_release = usage(lambda m: m.kind == "Release")
    assert delete(no_release, crds, "clusters.compute.example.org").allowed
    # ... and once the provider itself is gone there is nothing the CRD could take down.
    assert delete(usage(lambda m: m.kind == "Cluster"), crds, "clusters.compute.example.org").rule is Rule.UNPROTECTED


# --- deletion-protected, break-glass, enforcement ---------------------------------------------------------
def test_deletion_protected_label_denies_even_with_break_glass():
    """`deletion-protected: Always` denies the delete of any object, break-glass notwithstanding."""
    old = old_with("cfg", "app", labels={DELETION_PROTECTED_LABEL: "Always"},
                   annotations={BREAK_GLASS_ANNOTATION: "incident 7"})
    d = delete(MemoryState(), GroupResource("", "configmaps"), "cfg", "app", old=old)
    assert not d.allowed and d.rule is Rule.DELETION_PROTECTED and d.code == 403
    assert "criticalsvc.io/deletion-protected=Always; remove the label" in d.message
    old["metadata"]["labels"][DELETION_PROTECTED_LABEL] = "Never"
    assert delete(MemoryState(), GroupResource("", "configmaps"), "cfg", "app", old=old).allowed


def test_break_glass_allows_with_a_warning():
    """A non-empty break-glass reason lets a blocked delete through, warns, and records the reason."""
    old = old_with("web", "app", annotations={BREAK_GLASS_ANNOTATION: " incident 42 "})
    d = delete(guarded_web(), DEPLOYMENTS, "web", "app", old=old)
    assert d.allowed and d.rule is Rule.BREAK_GLASS and d.break_glass == "incident 42"
    assert d.warnings[0].startswith("break-glass (incident 42): allowed although deployments.apps app/web")
    assert render_response("req-1", d)["response"]["auditAnnotations"]["break-glass"] == "incident 42"


@pytest.mark.parametrize("reason", ["", "   "])
def test_empty_break_glass_reason_is_not_honoured(reason):
    """A break-glass annotation without a reason does not lift the denial."""
    old = old_with("web", "app", annotations={BREAK_GLASS_ANNOTATION: reason})
    d = delete(guarded_web(), DEPLOYMENTS, "web", "app", old=old)
    assert not d.allowed and d.break_glass is None


def test_warn_enforcement_allows_with_the_denial_as_warning():
    """enforcement Warn allows the delete and carries the would-be denial as a warning."""
    d = delete(guarded_web(enforcement="Warn"), DEPLOYMENTS, "web", "app")
    assert d.allowed and d.rule is Rule.WARN_ONLY and d.blocking == ("web",)
    (warning,) = d.warnings
    assert warning.startswith("(enforcement: Warn) would deny deleting deployments.apps app/web: "
                              "CriticalService web protects it until: pods app/web-1")
    assert render_response("req-1", d)["response"]["warnings"] == [warning]


def test_warn_does_not_soften_an_enforced_service():
    """A Warn service and an Enforce service on one provider: denied, the Warn one still warns."""
    state = guarded_web(enforcement="Warn")
    state.upsert_critical_service(parse_critical_service(cs_obj("strict", PROVIDER, resources("", "pods", "app"))))
    d = delete(state, DEPLOYMENTS, "web", "app")
    assert not d.allowed and d.blocking == ("strict", "web")
    assert "CriticalService strict" in d.message and "CriticalService web" not in d.message
    assert len(d.warnings) == 1 and "CriticalService web" in d.warnings[0]
    # On the wire the refusal's own warnings (what it waits for, then what to do) come first.
    assert render_response("req-1", d)["response"]["warnings"] == [*d.waiting, *d.warnings]
    assert d.waiting and not any("CriticalService web" in w for w in d.waiting)


def test_warnings_stay_within_the_api_server_limit():
    """Each warning is cut to 256 characters, the length the API server keeps."""
    many = [resources("", "pods", "app", {"matchLabels": {f"key-{i:02d}": "some-long-value"}}) for i in range(12)]
    state = state_with(cs_obj("web", PROVIDER, *many, enforcement="Warn"),
                       objects=[deploy("app", "web"),
                                KubeObject(PODS, "app", "p", labels={f"key-{i:02d}": "some-long-value"
                                                                     for i in range(12)})])
    d = delete(state, DEPLOYMENTS, "web", "app")
    assert d.allowed and d.warnings and all(len(w) <= WARNING_LIMIT for w in d.warnings)
    assert d.warnings[0].endswith("…")  # it was longer and has been cut


# --- wire facts ---------------------------------------------------------------------------------------------
def test_deletecollection_item_takes_its_name_from_old_object():
    """An item of a deletecollection (name "") is judged by oldObject.metadata.name: denied like a named delete."""
    with open(EXAMPLES / "reviews" / "delete-namespace-collection-item.json") as f:
        request = parse_review(json.load(f))
    assert request.name == ""
    d = decide(request, story())
    named = delete(story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    assert not d.allowed and d.message == named.message


def test_render_review_writes_what_the_api_server_sends():
    """render_review rebuilds the example DELETE review field for field from the request parse_review read."""
    with open(EXAMPLES / "reviews" / "delete-provider.json") as f:
        sent = json.load(f)
    assert parse_review(sent).propagation_policy == "Background"
    assert render_review(parse_review(sent)) == sent


_OBJECTS = st.one_of(st.none(), st.fixed_dictionaries({"metadata": st.fixed_dictionaries(
    {}, optional={"name": st.sampled_from(["web", "app"]), "labels": st.just({"app": "web"})})}))
REQUESTS = st.builds(
    AdmissionRequest, uid=st.text(min_size=1, max_size=8),
    group_resource=st.sampled_from([DEPLOYMENTS, NAMESPACES, CSVC, GroupResource("my.crd.group", "coolresources")]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"]), name=st.sampled_from(["", "web", "é"]),
    namespace=st.sampled_from(["", "app"]), object=_OBJECTS, old_object=_OBJECTS,
    sub_resource=st.sampled_from(["", "status"]), kind=st.sampled_from(["", "Deployment"]), dry_run=st.booleans(),
    username=st.sampled_from(["", "alice"]))


@given(REQUESTS)
def test_parse_review_reads_back_what_render_review_wrote(request_):
    """render_review is the inverse of parse_review: any request survives the round trip unchanged."""
    assert parse_review(render_review(request_)) == request_


def test_null_old_object_falls_back_to_the_state():
    """A named DELETE without oldObject reads the stored object's labels and deletionTimestamp from the state."""
    state = guarded_web()
    assert not delete(state, DEPLOYMENTS, "web", "app", old=None).allowed
    state.upsert(deploy("app", "web", labels={DELETION_PROTECTED_LABEL: "Always"}))
    assert delete(state, DEPLOYMENTS, "web", "app", old=None).rule is Rule.DELETION_PROTECTED
    state.upsert(deploy("app", "web", deletion_timestamp="2026-01-01T00:00:00Z"))
    assert delete(state, DEPLOYMENTS, "web", "app", old=None).rule is Rule.ALREADY_TERMINATING


@pytest.mark.parametrize(
    ("gr", "namespace"),
    [(DEPLOYMENTS, "app"), (DEPLOYMENTS, ""), (NAMESPACES, ""), (CSVC, ""),
     (GroupResource("apiextensions.k8s.io", "customresourcedefinitions"), "")])
def test_unidentifiable_delete_of_a_gated_type_is_denied(gr, namespace):
    """Without a name and without oldObject a DELETE of a gated type is denied: it could be a provider."""
    d = delete(guarded_web(), gr, "", namespace, old=None)
    assert not d.allowed and d.rule is Rule.UNIDENTIFIED and d.code == 403


def test_unidentifiable_delete_of_a_gated_type_nothing_protects_there_is_allowed():
    """Without a name and oldObject, a gated type in a namespace no CriticalService names is not gated."""
    assert delete(guarded_web(), DEPLOYMENTS, "", "elsewhere", old=None).rule is Rule.NOT_GATED


@pytest.mark.parametrize("name", ["cfg", ""])
def test_a_delete_without_old_object_of_another_type_is_denied(name):
    """Only the labelled-objects webhook sends other types, by oldObject's label; the gate keeps no copy of
    them, so a DELETE without oldObject (named or not) is denied, saying it cannot read the label."""
    d = delete(guarded_web(), GroupResource("", "configmaps"), name, "app", old=None)
    assert not d.allowed and d.rule is Rule.UNIDENTIFIED and d.code == 403
    what = "configmaps app/cfg (the request has no oldObject)" if name else \
        "the configmaps being deleted (the request has no name and no oldObject)"
    assert d.message == (f"criticalsvc cannot read the labels of {what}, so it does not allow it: it must see "
                         "whether criticalsvc.io/deletion-protected is set")


LABELLED_KINDS = [
    (GroupResource("", "configmaps"), "app", "configmaps app/keep"),
    (GroupResource("", "services"), "app", "services app/keep"),
    (GroupResource("", "persistentvolumeclaims"), "app", "persistentvolumeclaims app/keep"),
    (GroupResource("rbac.authorization.k8s.io", "clusterroles"), "", "clusterroles.rbac.authorization.k8s.io keep"),
    (GroupResource("my.crd.group", "coolresources"), "cool-apps", "coolresources.my.crd.group cool-apps/keep"),
    (GroupResource("widgets.example.com", "widgets"), "app", "widgets.widgets.example.com app/keep"),
]


@pytest.mark.parametrize(("gr", "namespace", "shown"), LABELLED_KINDS, ids=[str(k[0]) for k in LABELLED_KINDS])
def test_the_label_denies_an_object_of_any_type_from_old_object_alone(gr, namespace, shown):
    """Any group/resource, served or not, cached or not: the label in oldObject denies with the label message,
    even when the state cannot answer (discovery failed); without the label the object is not protected."""
    old = old_with("keep", namespace, labels={DELETION_PROTECTED_LABEL: "Always"})
    expected = (f"{shown} is labelled criticalsvc.io/deletion-protected=Always; remove the label to delete it")
    for state in (MemoryState(), story(), FlakyState(story(), "resolve"), FlakyState(story(), "get")):
        d = delete(state, gr, "keep", namespace, old=old)
        assert (d.allowed, d.rule, d.code, d.message) == (False, Rule.DELETION_PROTECTED, 403, expected)
    assert delete(story(), gr, "", namespace, old=old).message == expected  # a deletecollection item
    d = delete(story(), gr, "keep", namespace, old=old_with("keep", namespace, labels={"app": "x"}))
    assert d.allowed and d.rule is Rule.UNPROTECTED
    terminating = old_with("keep", namespace, labels={DELETION_PROTECTED_LABEL: "Always"},
                           deletion_timestamp="2026-01-01T00:00:00Z")
    assert delete(story(), gr, "keep", namespace, old=terminating).rule is Rule.ALREADY_TERMINATING


@pytest.mark.parametrize("make", [lambda: (story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace"),
                                  lambda: (story(is_cool), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace"),
                                  lambda: (story(), NAMESPACES, "finalizer-namespace", "finalizer-namespace")])
def test_dry_run_gets_the_same_answer(make):
    """A dry-run DELETE gets exactly the decision the real one gets, and leaves the state untouched."""
    state, gr, name, namespace = make()
    before = sorted(o.ref for o in state.objects())
    assert delete(state, gr, name, namespace, dry_run=True) == delete(state, gr, name, namespace)
    assert sorted(o.ref for o in state.objects()) == before


def test_already_terminating_object_is_allowed():
    """A repeated DELETE of an object that already has deletionTimestamp is allowed: it already passed."""
    old = old_with("finalizer-deployment", "finalizer-namespace", deletion_timestamp="2026-01-01T00:00:00Z")
    d = delete(story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace", old=old)
    assert d.allowed and d.rule is Rule.ALREADY_TERMINATING


def test_denial_on_the_wire_is_403_forbidden():
    """A denial renders as an AdmissionReview v1 with the uid echoed and status 403/Forbidden/Failure."""
    d = delete(story(), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace")
    out = render_response("req-1", d)
    assert out["apiVersion"] == "admission.k8s.io/v1" and out["kind"] == "AdmissionReview"
    response = out["response"]
    assert response["uid"] == "req-1" and response["allowed"] is False
    assert response["status"] == {"code": 403, "reason": "Forbidden", "message": d.message, "status": "Failure"}
    assert response["auditAnnotations"] == {"rule": "blocked", "blocking": CS_NAME}


def test_allow_on_the_wire_carries_no_status():
    """An ALLOW renders with allowed true, no status and no warnings key when there are none."""
    out = render_response("req-2", delete(story(is_cool), DEPLOYMENTS, "finalizer-deployment", "finalizer-namespace"))
    assert out["response"] == {"uid": "req-2", "allowed": True, "auditAnnotations": {"rule": "criteria-met"}}


def test_many_blockers_give_a_message_under_a_kilobyte():
    """Forty unmet services with 500 blocking objects each still give one message under ~1 KB."""
    pods = [KubeObject(PODS, "app", f"pod-{i:03d}", finalizers=("example.com/f",)) for i in range(500)]
    services = [cs_obj(f"cs-{i:02d}", PROVIDER, finalizer("", "pods", "example.com/f"), resources("", "pods", "app"))
                for i in range(40)]
    d = delete(state_with(*services, objects=[deploy("app", "web"), *pods]), DEPLOYMENTS, "web", "app")
    assert not d.allowed and len(d.blocking) == 40
    assert len(d.message) <= MESSAGE_LIMIT and len(d.message.encode()) <= 1024
    assert d.message.startswith("deployments.apps app/web may not be deleted yet: CriticalService cs-00 protects it")
    assert "(500 objects; first: app/pod-000, app/pod-001, app/pod-002)" in d.message
    assert d.message.endswith("more characters)")


# --- a state that cannot answer ----------------------------------------------------------------------------
class FlakyState:
    """A ClusterState whose `broken` question raises StateUnavailable; everything else is a MemoryState."""

    def __init__(self, inner: MemoryState, broken: str) -> None:
        self._inner, self._broken = inner, broken

    def __getattr__(self, name: str) -> Any:
        if name == self._broken:
            def fail(*args: Any, **kwargs: Any) -> Any:
                raise StateUnavailable("the pods cache has not synced yet")
            return fail
        return getattr(self._inner, name)


@pytest.mark.parametrize(("broken", "name"), [("select", "web"), ("get", "web"), ("protecting", "web"),
                                             ("resolve", "web"), ("critical_services", "")])
def test_state_unavailable_denies(broken, name):
    """When the state cannot answer, a gated DELETE is denied with 403 and the reason, never allowed."""
    request = review("DELETE", DEPLOYMENTS, name, "app", old=None)
    d = decide(parse_review(request), FlakyState(guarded_web(), broken))
    assert not d.allowed and d.rule is Rule.UNVERIFIABLE and d.code == 403
    assert "could not verify the cluster state" in d.message and "has not synced yet" in d.message


def test_state_unavailable_denies_a_namespace_delete():
    """A namespace DELETE whose hosted services cannot be checked is denied."""
    d = decide(parse_review(review("DELETE", NAMESPACES, "app", "app")), FlakyState(guarded_web(), "hosted_in"))
    assert not d.allowed and d.rule is Rule.UNVERIFIABLE


# --- CREATE / UPDATE of a CriticalService ------------------------------------------------------------------
def write(state: Any, obj: dict[str, Any], *, operation: str = "CREATE", old: Any = None,
          sub_resource: str = "") -> Decision:
    name = obj.get("metadata", {}).get("name", "")
    return decide(parse_review(review(operation, CSVC, name, obj=obj, old=old, sub_resource=sub_resource)), state)


def test_invalid_spec_is_rejected_with_422_naming_the_path():
    """A CREATE with a broken spec is rejected 422 Invalid, naming the service and the field path."""
    obj = cs_obj("broken", PROVIDER, resources("", "pods"), finalizer("my.crd.group", "coolresources", ""))
    d = write(MemoryState(), obj)
    assert not d.allowed and d.rule is Rule.INVALID_SPEC and (d.code, d.reason) == (422, "Invalid")
    assert d.message == 'CriticalService "broken" is invalid: spec.criteria[1].finalizer.finalizerName: required'
    assert render_response("u", d)["response"]["status"]["code"] == 422


def test_valid_spec_is_allowed():
    """A CREATE of a valid CriticalService that closes no cycle is allowed."""
    d = write(story(), cs_obj("new", PROVIDER, resources("", "pods", "other")))
    assert d.allowed and d.rule is Rule.VALID_SPEC and not d.warnings


def _pair(first: str, other: str) -> dict[str, Any]:
    """CriticalService `first` (provider ns-first/first) waiting for Deployment ns-other/other."""
    return cs_obj(first, ("apps", "deployments", f"ns-{first}", first),
                  specific("apps", "Deployment", f"ns-{other}", other))


def test_cycle_is_rejected_naming_it():
    """Two services each waiting for the other's provider: the second CREATE is denied, naming the cycle."""
    d = write(state_with(_pair("a", "b")), _pair("b", "a"))
    assert not d.allowed and d.rule is Rule.CYCLE and d.code == 403
    assert d.message == ('CriticalService "b" would close a dependency cycle: b -> a -> b; no teardown of these '
                         "could ever finish (b.spec.criteria[0] waits for its provider deployments.apps ns-a/a of a; "
                         "a.spec.criteria[0] waits for its provider deployments.apps ns-b/b of b)")


def test_chain_is_not_a_cycle():
    """A service waiting for another's provider, without the way back, is allowed."""
    other = cs_obj("a", ("apps", "deployments", "ns-a", "a"), resources("", "pods", "x"))
    assert write(state_with(other), _pair("b", "a")).allowed


@pytest.mark.parametrize(
    ("criterion", "labels"),
    [(specific("apps", "deployments", "app", "web"), None),
     (resources("apps", "Deployment", "app"), None),
     (specific("", "Namespace", "", "app"), None),
     (resources("", "namespaces", "", {"matchLabels": {"kubernetes.io/metadata.name": "app"}}), None),
     (resources("criticalsvc.io", "CriticalService", "", {"matchLabels": {"tier": "gold"}}), {"tier": "gold"})],
    ids=["own-provider", "own-provider-by-selector", "own-namespace", "own-namespace-by-label", "itself"])
def test_self_cycle_is_rejected(criterion, labels):
    """A criterion covering the service's own provider, own namespace or itself is a cycle of one."""
    d = write(MemoryState(), cs_obj("web", PROVIDER, criterion, labels=labels))
    assert not d.allowed and d.rule is Rule.CYCLE and "dependency cycle: web -> web" in d.message


def test_metadata_only_update_is_allowed_even_in_a_cycle():
    """An UPDATE that changes only metadata is allowed although the same spec would be rejected on CREATE."""
    stored = _pair("b", "a")
    state = state_with(_pair("a", "b"), stored)
    relabelled = json.loads(json.dumps(stored))
    relabelled["metadata"]["labels"] = {"owner": "team-x"}
    assert write(state, relabelled, operation="CREATE").rule is Rule.CYCLE
    d = write(state, relabelled, operation="UPDATE", old=stored)
    assert d.allowed and d.rule is Rule.VALID_SPEC


def test_spec_update_is_checked_against_the_others():
    """An UPDATE changing the spec is checked for cycles, with its own old version left out."""
    state = state_with(_pair("a", "b"), cs_obj("b", ("apps", "deployments", "ns-b", "b"), resources("", "pods", "x")))
    old = cs_obj("b", ("apps", "deployments", "ns-b", "b"), resources("", "pods", "x"))
    assert write(state, _pair("b", "a"), operation="UPDATE", old=old).rule is Rule.CYCLE
    assert write(state, cs_obj("b", ("apps", "deployments", "ns-b", "b"), resources("", "pods", "y")),
                 operation="UPDATE", old=old).allowed


def test_criterion_in_the_providers_own_namespace_warns_when_another_is_not():
    """Criteria in the provider's own namespace beside one that is not (partly confined): each in-namespace
    criterion warns that the namespace stays refused until its objects are gone (tests/test_namespace_order.py
    has the fully confined case, which does not warn)."""
    d = write(MemoryState(), cs_obj("web", PROVIDER, resources("", "pods", "other"), resources("", "pods", "app"),
                                    specific("", "configmaps", "app", "cfg")))
    assert d.allowed and d.rule is Rule.VALID_SPEC
    assert [w.split(":")[0] for w in d.warnings] == ["spec.criteria[1]", "spec.criteria[2]"]
    assert d.warnings[0] == ("spec.criteria[1]: its objects live in the provider's namespace app, but "
                             "spec.criteria[0]'s do not, so deleting app is refused until these are gone too: "
                             "delete them first")


def test_unserved_types_warn():
    """A provider or criterion naming a type that is not served (yet) is allowed with a warning."""
    d = write(MemoryState(), cs_obj("g", ("example.com", "gadgets", "ns", "g"), resources("example.com", "Gizmo")))
    assert d.allowed
    assert d.warnings == (
        "spec.provider: gadgets.example.com is not served (yet); nothing is protected until it is",
        "spec.criteria[0]: Gizmo.example.com is not served (yet); the criterion holds until it is")


def test_a_provider_of_an_unrouted_type_warns_with_the_rule_to_add():
    """A gate that does not manage its routes: a Service as provider is allowed, with a warning that nothing sends
    its DELETEs and what to do (the shipped configuration routes no provider type itself)."""
    obj = cs_obj("svc", ("", "services", "ns", "webhook"), resources("", "pods", "other"))
    assert write(MemoryState(), obj).warnings == ()  # a default gate routes it itself
    d = decide(parse_review(review("CREATE", CSVC, "svc", obj=obj)), MemoryState(), manages_routes=False)
    assert d.allowed and d.rule is Rule.VALID_SPEC
    assert len(d.warnings) == 1 and d.warnings[0].startswith("spec.provider: the gate does not manage its routes "
                                                              "(--no-manage-provider-webhooks), and the shipped "
                                                              "configuration sends no DELETE of services")
    assert "add a webhook for services ns/webhook" in d.warnings[0]


def test_status_subresource_writes_are_not_gated():
    """An UPDATE of the status subresource is allowed whatever the object looks like."""
    obj = cs_obj("broken", PROVIDER, {"type": "Nope"})
    d = write(MemoryState(), obj, operation="UPDATE", old=obj, sub_resource="status")
    assert d.allowed and d.rule is Rule.NOT_GATED


def test_writes_of_other_types_are_not_gated():
    """CREATE of anything but a CriticalService, and CONNECT, are not the gate's business; an UPDATE is only
    when a CriticalService holds updates or scaling to zero (tests/test_updates.py), which this one does not."""
    for operation in ("CREATE", "UPDATE", "CONNECT"):
        d = decide(parse_review(review(operation, DEPLOYMENTS, "web", "app", obj={"metadata": {"name": "web"}})),
                   guarded_web())
        assert d.allowed and d.rule is (Rule.UNPROTECTED if operation == "UPDATE" else Rule.NOT_GATED)


def test_unsynced_state_denies_a_critical_service_create():
    """A CREATE whose cycle check cannot read the existing services is denied, not guessed."""
    d = write(FlakyState(MemoryState(), "critical_services"), cs_obj("x", PROVIDER, resources("", "pods", "o")))
    assert not d.allowed and d.rule is Rule.UNVERIFIABLE


def test_parsed_service_equals_for_same_spec():
    """Two parses of one spec are equal values (labels excluded), which metadata-only UPDATEs rely on."""
    a = parse_critical_service(cs_obj("x", PROVIDER, resources("", "pods"), labels={"a": "1"}))
    b = parse_critical_service(cs_obj("x", PROVIDER, resources("", "pods"), labels={"a": "2"}))
    assert isinstance(a, CriticalService) and a == b
    assert a.criteria[0] != parse_critical_service(cs_obj("x", PROVIDER, resources("", "pods", "n"))).criteria[0]


# --- a type the gate cannot read holds up only what needs it (issue: one tenant never blocks another) -------
PVCS = GroupResource("", "persistentvolumeclaims")
# Team A's CriticalService: a claim as provider and claims as criterion; the gate may not list claims.
TEAM_A = cs_obj("team-a", ("", "persistentvolumeclaims", "shop", "data"), resources("", "persistentvolumeclaims",
                                                                                    "shop"))
TEAM_B = cs_obj("team-b", ("apps", "deployments", "kube-system", "coredns"), specific("apps", "deployments",
                                                                                      "kube-system", "user"))


def _write(cs: dict[str, Any], state: Any) -> Decision:
    return decide(parse_review(review("CREATE", CRITICAL_SERVICES, cs["metadata"]["name"], obj=cs, old=None)), state,
                  manages_routes=True)


def test_an_unreadable_type_of_another_critical_service_does_not_hold_up_this_ones_create_or_deletes():
    """Team B's CREATE, and the DELETEs its CriticalService guards, are decided as if team A's did not exist."""
    objects = [deploy("kube-system", "coredns"), deploy("kube-system", "user"), ns("kube-system"), ns("shop")]
    blind = Unreadable(state_with(TEAM_A, objects=objects), PVCS)
    assert _write(TEAM_B, blind).rule == Rule.VALID_SPEC
    with_b = Unreadable(state_with(TEAM_A, TEAM_B, objects=objects), PVCS)
    denied = delete(with_b, DEPLOYMENTS, "coredns", "kube-system")
    assert denied.rule == Rule.BLOCKED and "kube-system/user still exists" in denied.message
    assert delete(with_b, NAMESPACES, "kube-system").rule == Rule.BLOCKED
    # ... and what needs the unreadable type is still refused as unverifiable, never allowed.
    assert delete(with_b, PVCS, "data", "shop").rule == Rule.UNVERIFIABLE
    assert delete(with_b, NAMESPACES, "shop").rule == Rule.UNVERIFIABLE


def test_a_cycle_that_rests_on_an_unreadable_provider_is_neither_allowed_nor_called_a_cycle():
    """Team C waits for team A's claim (whose labels the gate cannot read) and protects a claim team A's criterion
    covers: whether that closes a cycle is unknowable, so the CREATE is refused as unverifiable, naming the grant."""
    team_c = cs_obj("team-c", ("", "persistentvolumeclaims", "shop", "cache"),
                    specific("", "persistentvolumeclaims", "shop", "data"))
    decision = _write(team_c, Unreadable(state_with(TEAM_A, objects=[ns("shop")]), PVCS))
    assert decision.rule == Rule.UNVERIFIABLE and not decision.allowed
    assert "the gate may not list persistentvolumeclaims (403 Forbidden)" in decision.message
    assert "team-c" in decision.message and "team-a" in decision.message


def test_a_cycle_of_readable_objects_is_still_a_cycle_beside_an_unreadable_provider():
    loop = cs_obj("loop", ("apps", "deployments", "kube-system", "coredns"),
                  specific("apps", "deployments", "kube-system", "coredns"))
    decision = _write(loop, Unreadable(state_with(TEAM_A, objects=[deploy("kube-system", "coredns")]), PVCS))
    assert decision.rule == Rule.CYCLE
