"""Which workload processes a finalizer: the inferred half of discovery (pure).

A finalizer names no controller. Two kinds of evidence point at one, and a proposal shows both:

  - access: the workload's ServiceAccount may `update` the finalizer's type (removing a finalizer is an
    update of the object; SubjectAccessReview, criticalsvc/discover/rbac.py). Necessary, not sufficient:
    a ServiceAccount that may update every type (cluster-admin) proves nothing about this one, and is only
    considered when its name matches too;
  - names: the words of the type's API group and of the finalizer's prefix (cert-manager.io,
    kustomize.toolkit.fluxcd.io) against the workload's name, namespace, ServiceAccount and
    app.kubernetes.io labels. The type's own group weighs most: Flux's four controllers may all update
    every Flux type, and only kustomize-controller's name says it reconciles kustomize.toolkit.fluxcd.io.

Finalizers the cluster processes itself are left out: the garbage collector's `orphan` and
`foregroundDeletion` (https://github.com/kubernetes/apimachinery/blob/v0.37.2/pkg/apis/meta/v1/types.go,
FinalizerOrphanDependents, FinalizerDeleteDependents), and every finalizer under kubernetes.io or k8s.io
(pv-protection, pvc-protection, customresourcecleanup.apiextensions.k8s.io, service.kubernetes.io/...),
whose controllers run in kube-controller-manager or the API server. x-k8s.io (Kubernetes SIGs' add-ons, such
as Cluster API) is not the cluster's own: those controllers are installed like any other.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable

import attrs

from ..api import GroupResource, ObjectRef
from .inventory import Workload

BUILTIN_FINALIZERS = frozenset({"orphan", "foregroundDeletion", "kubernetes"})

# Words that say nothing about which project a name belongs to.
_GENERIC = frozenset({
    "io", "com", "org", "net", "dev", "sh", "cloud", "k8s", "x-k8s", "kubernetes", "finalizer", "finalizers",
    "controller", "controllers", "operator", "manager", "system", "api", "apis", "apps", "app", "v1", "v1alpha1",
    "v1beta1", "v2", "protection", "cleanup", "www", "the", "and", "default", "webhook", "server", "core",
    "resources", "resource", "group", "crd", "my", "example",
})
_WORDS = re.compile(r"[a-z0-9]+")
# Labels that name the application a workload belongs to (the recommended labels,
# https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/).
_NAME_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/instance",
                "app.kubernetes.io/component", "app")


def is_builtin(finalizer: str) -> bool:
    """Is `finalizer` processed by Kubernetes itself (see the module docstring)?"""
    if finalizer in BUILTIN_FINALIZERS:
        return True
    domain = finalizer.partition("/")[0] if "/" in finalizer else ""
    if not domain:
        return False
    if domain.endswith("x-k8s.io"):
        return False
    return domain in ("kubernetes.io", "k8s.io") or domain.endswith((".kubernetes.io", ".k8s.io"))


def words(text: str) -> set[str]:
    """The distinctive words of a name: `cert-manager.io` -> {cert, manager, cert-manager}."""
    text = text.lower()
    found = {w for w in _WORDS.findall(text) if len(w) >= 3 and w not in _GENERIC}
    # Hyphenated names are one word too: cert-manager, kube-prometheus.
    for part in re.split(r"[./:_]", text):
        if "-" in part and part not in _GENERIC and len(part) >= 3:
            found.add(part)
    return found


class Confidence(enum.StrEnum):
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


@attrs.frozen
class Candidate:
    workload: ObjectRef
    score: int
    matched: tuple[str, ...]  # which words matched, and where


def name_score(gr: GroupResource, finalizer: str, workload: Workload) -> Candidate:
    """How well `workload`'s names match the finalizer's type and prefix (0: not at all)."""
    labels = dict(workload.labels) | dict(workload.template_labels)
    own = {"name": words(workload.ref.name), "ServiceAccount": words(workload.service_account),
           "namespace": words(workload.ref.namespace),
           "labels": set().union(*(words(labels.get(k, "")) for k in _NAME_LABELS))}
    first = gr.group.split(".")[0] if gr.group else ""
    sources = [("group", words(first), 3), ("group", words(gr.group), 2),
               ("finalizer", words(finalizer.partition("/")[0] if "/" in finalizer else finalizer), 2)]
    score = 0
    places: dict[str, set[str]] = {}
    for _what, wanted, weight in sources:
        for where, have in own.items():
            hits = wanted & have
            if hits:
                score += weight if where in ("name", "ServiceAccount") else 1
                for hit in hits:
                    places.setdefault(hit, set()).add(where)
    # A word that is the workload's whole name (less a -controller/-manager/-operator suffix) names the project's
    # core controller: cert-manager, not cert-manager-webhook; crossplane, not crossplane-rbac-manager.
    core = re.sub(r"-(controller|manager|operator)$", "", workload.ref.name)
    if workload.ref.name in places or core in places:
        score += 2
        places.setdefault(workload.ref.name if workload.ref.name in places else core, set()).add("whole name")
    # "cert-manager in name, namespace", not also "cert": a word inside a matched hyphenated one says nothing more.
    shown = [w for w in sorted(places) if not any(w != o and w in o.split("-") for o in places)]
    matched = [f"{w} in {', '.join(sorted(places[w]))}" for w in shown]
    return Candidate(workload.ref, score, tuple(matched))


def best(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates with the highest score above 0, in order."""
    ranked = sorted((c for c in candidates if c.score > 0), key=lambda c: (-c.score, c.workload))
    return [c for c in ranked if c.score == ranked[0].score] if ranked else []
