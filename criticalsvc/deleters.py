"""Who is tearing a stack down, and what that deleter will never delete (pure; a hint with its evidence).

The gate orders a teardown; it does not perform it. When a criterion waits for an object that the tool
tearing the stack down never deletes, the wait cannot end on its own: the provider is refused on every
pass, for ever, and the tool's user sees the same refusal again and again. Two such tools, read at source:

- Argo CD deletes no CustomResourceDefinition when it deletes an Application (the cascade of
  resources-finalizer.argocd.argoproj.io): `shouldBeDeleted` is `!kube.IsCRD(obj) && ...`, and it skips
  objects annotated `argocd.argoproj.io/sync-options: Delete=false` or `helm.sh/resource-policy: keep`.
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1165-L1170
- Helm never deletes the CRDs of a chart's crds/ directory: `helm install` creates them apart
  (installCRDs) and they are not in the release's manifest, which is all that `helm uninstall` deletes;
  it also keeps objects annotated `helm.sh/resource-policy: keep`. Objects it templated carry its
  release annotations (setMetadataVisitor); crds/ ones carry none.
  https://github.com/helm/helm/blob/v3.22.0/pkg/action/install.go#L263-L270
  https://github.com/helm/helm/blob/v3.22.0/pkg/action/uninstall.go#L211-L235
  https://github.com/helm/helm/blob/v3.22.0/pkg/action/validate.go#L33-L38

Evidence of the deleter, all of it public in the request or the objects (never a guess from names alone):

    the request's user       system:serviceaccount:<ns>:argocd-application-controller   Argo CD
    the object's annotation  argocd.argoproj.io/tracking-id (Argo CD v3's default tracking)  Argo CD
    the object's annotation  meta.helm.sh/release-name (on what Helm templated)             Helm

The label app.kubernetes.io/instance is not evidence: Argo CD's label tracking writes it, and so do most
Helm charts. What this module answers is a hint for a person (the refusal message, status, explain);
it never changes what the gate allows.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from .api import CRDS, GroupResource, SpecificResourceCriterion
from .criteria import Verdict
from .errors import StateUnavailable
from .objects import CRD_KEPT_ANNOTATIONS, KubeObject
from .state import ClusterState

ARGOCD_TRACKING_ANNOTATION = "argocd.argoproj.io/tracking-id"
ARGOCD_SYNC_OPTIONS_ANNOTATION = "argocd.argoproj.io/sync-options"
HELM_RELEASE_ANNOTATION = "meta.helm.sh/release-name"
HELM_RELEASE_NAMESPACE_ANNOTATION = "meta.helm.sh/release-namespace"
HELM_RESOURCE_POLICY_ANNOTATION = "helm.sh/resource-policy"
# The application controller's ServiceAccount, in whatever namespace Argo CD is installed
# (manifests/base/application-controller-roles/argocd-application-controller-sa.yaml).
_ARGOCD_CONTROLLER_USER = re.compile(r"system:serviceaccount:([^:]+):argocd-application-controller")
assert set(CRD_KEPT_ANNOTATIONS) >= {ARGOCD_TRACKING_ANNOTATION, ARGOCD_SYNC_OPTIONS_ANNOTATION,
                                     HELM_RELEASE_ANNOTATION, HELM_RESOURCE_POLICY_ANNOTATION}


class Tool(enum.StrEnum):
    ARGO_CD = "Argo CD"
    HELM = "Helm"


@attrs.frozen
class Deleter:
    """A tool that is deleting, what of it (an Application, a release; "" when not known), and why we think so."""

    tool: Tool
    owner: str
    evidence: str

    def __str__(self) -> str:
        what = {Tool.ARGO_CD: "Application", Tool.HELM: "release"}[self.tool]
        return f"{self.tool}" + (f" ({what} {self.owner})" if self.owner else "")


@attrs.frozen
class LeftBehind:
    """An object a criterion waits for, which `deleter` never deletes: why, and the way out."""

    deleter: Deleter
    target: str  # "customresourcedefinitions/<name>", as kubectl takes it
    why: str
    way_out: str

    @property
    def message(self) -> str:
        return f"{self.why}: {self.way_out}"


def of_request(username: str, metadata: Mapping[str, Any] | None) -> Deleter | None:
    """The deleter of a DELETE, from who sent it and the object's own annotations (its oldObject); None when
    nothing says."""
    annotations = _strings((metadata or {}).get("annotations"))
    tracking = annotations.get(ARGOCD_TRACKING_ANNOTATION)
    found = _ARGOCD_CONTROLLER_USER.fullmatch(username or "")
    if found is not None:
        return Deleter(Tool.ARGO_CD, _argocd_app(tracking), f"the request's user {username}")
    if tracking:
        return Deleter(Tool.ARGO_CD, _argocd_app(tracking), f"annotation {ARGOCD_TRACKING_ANNOTATION}={tracking}")
    release = annotations.get(HELM_RELEASE_ANNOTATION)
    if release:
        return Deleter(Tool.HELM, release, f"annotation {HELM_RELEASE_ANNOTATION}={release}")
    return None


def _argocd_app(tracking: str | None) -> str:
    """The Application of a tracking id `<app>:<group>/<kind>:<namespace>/<name>` (`<namespace>_<app>` for an
    Application outside Argo CD's own namespace)."""
    return tracking.split(":", 1)[0] if tracking and ":" in tracking else ""


def never_deletes(deleter: Deleter, obj: KubeObject) -> str | None:
    """Why `deleter` will never delete `obj` (one clause), or None when it may. Only CRDs are judged: the gate
    keeps their annotations (objects.CustomResourceDefinition); of any other object it cannot tell."""
    if obj.group_resource != CRDS:
        return None
    annotations = dict(getattr(obj, "annotations", ()))
    kept = annotations.get(HELM_RESOURCE_POLICY_ANNOTATION) == "keep"
    if deleter.tool == Tool.ARGO_CD:
        return "Argo CD does not delete CRDs when it deletes an Application"
    if deleter.tool == Tool.HELM:
        if kept:
            return f"Helm keeps what is annotated {HELM_RESOURCE_POLICY_ANNOTATION}=keep"
        if annotations.get(HELM_RELEASE_ANNOTATION) != deleter.owner:
            return (f"Helm does not delete CRDs it did not template for this release (a chart's crds/ directory: "
                    f"customresourcedefinitions/{obj.name} has no {HELM_RELEASE_ANNOTATION}={deleter.owner})")
    return None


def left_behind(deleter: Deleter | None, unmet: Iterable[Verdict], state: ClusterState,
                service: str = "") -> LeftBehind | None:
    """The first object one of `unmet` waits for that `deleter` never deletes and nobody is deleting now (not
    terminating), with the way out; None when there is none or the deleter is not known."""
    if deleter is None:
        return None
    for verdict in unmet:
        criterion = verdict.criterion
        if verdict.satisfied or not isinstance(criterion, SpecificResourceCriterion) or not verdict.examples:
            continue
        try:
            obj = state.get(verdict.examples[0])
        except StateUnavailable:
            continue
        if obj is None or obj.terminating:
            continue
        why = never_deletes(deleter, obj)
        if why is None:
            continue
        return LeftBehind(deleter, f"customresourcedefinitions/{obj.name}", why, _way_out(obj.name, service))
    return None


def _way_out(crd: str, service: str) -> str:
    plural, _, group = crd.partition(".")  # a CRD's name is <plural>.<group>
    instances = GroupResource(group, plural)
    whose = f"CriticalService {service}'s" if service else "the CriticalService's"
    return (f"delete customresourcedefinitions/{crd} yourself (kubectl delete customresourcedefinitions {crd}: "
            f"the API server deletes its remaining instances first, while their controller still runs), or let "
            f"the CRD stay: replace {whose} SpecificResource criterion on it with {{type: Resources, resources: "
            f"{{group: {instances.group}, resource: {instances.resource}}}}} (met once no instance remains, whether "
            f"or not the CRD exists)")


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}
