"""Who is tearing a stack down, and what it never deletes (criticalsvc/deleters.py), as a user meets it: the
refusal message Argo CD shows as DeletionError (or Helm prints), the Stuck condition, `criticalsvc explain`.
The hint never changes what is allowed."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from criticalsvc import deleters
from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import CRDS, GroupResource, ObjectRef
from criticalsvc.decision import Rule, decide
from criticalsvc.deleters import Deleter, Tool
from criticalsvc.explain import explain, render_text
from criticalsvc.manifests import load_path
from criticalsvc.objects import CustomResourceDefinition, project
from criticalsvc.snapshot import build_state
from criticalsvc.state import MemoryState
from criticalsvc.status import compute_status
from tests.realcluster.teardown import STORY

ARGOCD_USER = "system:serviceaccount:argocd:argocd-application-controller"
CRD = "coolresources.my.crd.group"
DEPLOYMENTS = GroupResource("apps", "deployments")
DEPLOYMENT = ObjectRef(DEPLOYMENTS, "finalizer-namespace", "finalizer-deployment")
NAMESPACE = ObjectRef(GroupResource("", "namespaces"), "", "finalizer-namespace")
TRACKING = "stack:apps/Deployment:finalizer-namespace/finalizer-deployment"


def torn_down(crd_annotations: dict[str, str] | None = None, *, crd_terminating: bool = False) -> MemoryState:
    """The reference story once its CRs are gone (the Finalizer criterion holds), its CRD still there: where an
    Argo CD Application's deletion stops."""
    manifests = [m for m in load_path(STORY) if m.kind != "CoolResource"]
    for m in manifests:
        if m.kind == "CustomResourceDefinition":
            m.obj["metadata"]["annotations"] = dict(crd_annotations or {})
            if crd_terminating:
                m.obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return build_state(manifests)


def delete_request(ref: ObjectRef, *, user: str = "alice", annotations: dict[str, str] | None = None
                   ) -> AdmissionRequest:
    metadata: dict[str, Any] = {"name": ref.name, "annotations": annotations or {}}
    if ref.namespace:
        metadata["namespace"] = ref.namespace
    return AdmissionRequest(uid="1", group_resource=ref.group_resource, operation="DELETE", name=ref.name,
                            namespace=ref.namespace or (ref.name if ref.group_resource.resource == "namespaces"
                                                        else ""),
                            old_object={"metadata": metadata}, username=user)


# --- the evidence ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("user", "annotations", "expected"), [
    (ARGOCD_USER, {}, Deleter(Tool.ARGO_CD, "", f"the request's user {ARGOCD_USER}")),
    ("system:serviceaccount:gitops:argocd-application-controller", {deleters.ARGOCD_TRACKING_ANNOTATION: TRACKING},
     Deleter(Tool.ARGO_CD, "stack", "the request's user system:serviceaccount:gitops:argocd-application-controller")),
    ("alice", {deleters.ARGOCD_TRACKING_ANNOTATION: TRACKING},
     Deleter(Tool.ARGO_CD, "stack", f"annotation argocd.argoproj.io/tracking-id={TRACKING}")),
    ("alice", {"meta.helm.sh/release-name": "stack-on", "meta.helm.sh/release-namespace": "default"},
     Deleter(Tool.HELM, "stack-on", "annotation meta.helm.sh/release-name=stack-on")),
    # Neither a label both tools write, nor another Argo CD component, nor a person, is evidence.
    ("alice", {}, None),
    ("system:serviceaccount:argocd:argocd-server", {}, None),
    ("system:serviceaccount:argocd:argocd-application-controller-x", {}, None),
])
def test_the_deleter_comes_from_the_requests_user_or_the_objects_annotations(
        user: str, annotations: dict[str, str], expected: Deleter | None) -> None:
    metadata = {"name": "x", "labels": {"app.kubernetes.io/instance": "stack"}, "annotations": annotations}
    assert deleters.of_request(user, metadata) == expected


def test_a_crds_projection_keeps_only_the_annotations_that_name_its_manager() -> None:
    obj = {"metadata": {"name": CRD, "annotations": {
        "argocd.argoproj.io/tracking-id": "stack:apiextensions.k8s.io/CustomResourceDefinition:/x",
        "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 5000 + "}", "helm.sh/resource-policy": "keep"}}}
    crd = project(obj, CRDS)
    assert isinstance(crd, CustomResourceDefinition)
    assert dict(crd.annotations) == {"argocd.argoproj.io/tracking-id": obj["metadata"]["annotations"][
        "argocd.argoproj.io/tracking-id"], "helm.sh/resource-policy": "keep"}
    assert not hasattr(project({"metadata": {"name": "d", "annotations": {"a": "b"}}}, GroupResource("", "pods")),
                       "annotations")


# --- the refusal message -----------------------------------------------------------------------------------
def test_argo_cds_refusal_names_the_crd_it_never_deletes_and_the_way_out() -> None:
    state = torn_down({deleters.ARGOCD_TRACKING_ANNOTATION: "stack:apiextensions.k8s.io/CustomResourceDefinition:/"
                       + CRD})
    decision = decide(delete_request(DEPLOYMENT, user=ARGOCD_USER,
                                     annotations={deleters.ARGOCD_TRACKING_ANNOTATION: TRACKING}), state)
    assert not decision.allowed and decision.rule == Rule.BLOCKED
    assert (f"still exists. Argo CD does not delete CRDs when it deletes an Application: delete "
            f"customresourcedefinitions/{CRD} yourself (kubectl delete customresourcedefinitions {CRD}"
            ) in decision.message, decision.message
    assert ("or let the CRD stay: replace CriticalService for-finalizer-deployment's SpecificResource criterion on "
            "it with {type: Resources, resources: {group: my.crd.group, resource: coolresources}} (met once no "
            "instance remains, whether or not the CRD exists)") in decision.message, decision.message
    assert f"[Argo CD (Application stack): the request's user {ARGOCD_USER}]" in decision.message
    # The provider's namespace, deleted in the same wave, says the same.
    namespace = decide(delete_request(NAMESPACE, user=ARGOCD_USER), state)
    assert not namespace.allowed and "Argo CD does not delete CRDs" in namespace.message, namespace.message


def test_the_hint_never_changes_what_is_allowed() -> None:
    """The same request from a person, from Argo CD, from Helm: the same rule and the same answer; only Argo
    CD's and Helm's carry the hint. Once the CRD is gone the provider goes, whoever asks."""
    state = torn_down()
    asked = {user: decide(delete_request(DEPLOYMENT, user=user), state) for user in ("alice", ARGOCD_USER)}
    helm = decide(delete_request(DEPLOYMENT, annotations={"meta.helm.sh/release-name": "stack"}), state)
    assert {(d.allowed, d.rule) for d in [*asked.values(), helm]} == {(False, Rule.BLOCKED)}
    assert "yourself" not in asked["alice"].message
    assert "Argo CD does not delete CRDs" in asked[ARGOCD_USER].message
    assert "Helm does not delete CRDs it did not template" in helm.message
    gone = build_state([m for m in load_path(STORY) if m.kind not in ("CoolResource", "CustomResourceDefinition")])
    assert decide(delete_request(DEPLOYMENT, user=ARGOCD_USER), gone).allowed


@pytest.mark.parametrize(("annotations", "hint"), [
    ({}, "Helm does not delete CRDs it did not template for this release (a chart's crds/ directory"),
    ({"meta.helm.sh/release-name": "other"}, "Helm does not delete CRDs it did not template for this release"),
    ({"meta.helm.sh/release-name": "stack", "helm.sh/resource-policy": "keep"},
     "Helm keeps what is annotated helm.sh/resource-policy=keep"),
    ({"meta.helm.sh/release-name": "stack"}, None),  # templated by the release: its uninstall deletes it
])
def test_helm_leaves_the_crds_of_a_charts_crds_directory(annotations: dict[str, str], hint: str | None) -> None:
    decision = decide(delete_request(DEPLOYMENT, annotations={"meta.helm.sh/release-name": "stack"}),
                      torn_down(annotations))
    assert not decision.allowed
    if hint is None:
        assert "yourself" not in decision.message, decision.message
    else:
        assert hint in decision.message and f"delete customresourcedefinitions/{CRD} yourself" in decision.message


def test_a_crd_being_deleted_is_no_longer_left_behind() -> None:
    decision = decide(delete_request(DEPLOYMENT, user=ARGOCD_USER), torn_down(crd_terminating=True))
    assert not decision.allowed and "yourself" not in decision.message, decision.message


# --- status and explain ------------------------------------------------------------------------------------
def test_the_stuck_condition_says_what_is_left_behind_by_whom_and_the_way_out() -> None:
    state = torn_down()
    cs = next(iter(state.critical_services()))
    argo = deleters.of_request(ARGOCD_USER, {})

    def stuck(**kw: Any) -> dict[str, Any]:
        status = compute_status(cs, state, now=1000.0, **kw)
        return next(c for c in status["conditions"] if c["type"] == "Stuck")

    assert stuck()["status"] == "False" and stuck()["reason"] == "NoFinalizerPending"
    found = stuck(deleter=argo)
    assert (found["status"], found["reason"]) == ("True", "DeleterNeverDeletes"), found
    assert found["message"].startswith(
        f"customresourcedefinitions/{CRD} still exists and nobody is deleting it; the teardown of "
        f"{cs.provider} by Argo CD (the request's user {ARGOCD_USER}) waits for it and cannot finish on its own. "
        "Argo CD does not delete CRDs when it deletes an Application. Way out: delete "
        f"customresourcedefinitions/{CRD} yourself"), found["message"]
    deleting = copy.deepcopy(torn_down(crd_terminating=True))
    cs = next(iter(deleting.critical_services()))
    assert next(c for c in compute_status(cs, deleting, now=1000.0, deleter=argo)["conditions"]
                if c["type"] == "Stuck")["reason"] == "NoFinalizerPending"


def test_explain_reads_the_deleter_off_the_object() -> None:
    obj = {"metadata": {"name": DEPLOYMENT.name, "namespace": DEPLOYMENT.namespace,
                        "annotations": {deleters.ARGOCD_TRACKING_ANNOTATION: TRACKING}}}
    text = render_text(explain(DEPLOYMENT, torn_down(), obj=obj))
    assert "STUCK (DeleterNeverDeletes): customresourcedefinitions/coolresources.my.crd.group still exists" in text
    assert "Argo CD does not delete CRDs when it deletes an Application" in text
    plain = render_text(explain(DEPLOYMENT, torn_down()))
    assert "STUCK" not in plain and "yourself" not in plain
