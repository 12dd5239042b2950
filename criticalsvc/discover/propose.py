"""The CriticalServices that would protect what a cluster already depends on (pure).

For each workload that serves something, one CriticalService naming it as the provider, with a criterion per
thing it serves - each "may go only once that is gone":

    serves                                    criterion                                      evidence
    a validating or mutating webhook          SpecificResource: the webhook configuration    exact (serving.py)
    a CRD's conversion webhook                SpecificResource: the CRD                      exact
    an APIService (spec.service)              SpecificResource: the APIService               exact
    a finalizer found on live objects         Finalizer: no object of the type carries it    inferred (finalizers.py)

and, beside them, the read grants the gate needs for the criteria's types (a ClusterRole aggregated into its
reader role, deploy/base/rbac.yaml) and everything left out, with the reason. A workload of the gate's own
install is left out: the gate does not gate itself (design/discover.md).

`access_questions` lists the SubjectAccessReviews the finalizer inference needs; the caller answers them
(the API server live, rbac.review on a snapshot) and hands the answers to `propose`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..api import (
    CRDS,
    CRITICAL_SERVICES,
    NAMESPACES,
    ROUTED_PROVIDERS,
    Criterion,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    SpecificResourceCriterion,
)
from ..webhookconfigurations import CONFIGURATION_NAMES
from .finalizers import Candidate, Confidence, best, is_builtin, name_score
from .inventory import APISERVICES, FinalizerUse, Inventory, Webhook, Workload
from .rbac import SUPERUSER_PROBE, AccessAnswer, AccessQuestion
from .serving import Index, Trace, trace_service

# The label and annotations a proposal carries, so an applied one says where it came from and why.
DISCOVERED_LABEL = "criticalsvc.io/discovered"
CONFIDENCE_ANNOTATION = "criticalsvc.io/discovery-confidence"
EVIDENCE_ANNOTATION = "criticalsvc.io/discovery-evidence"
READER_AGGREGATION_LABEL = "criticalsvc.io/aggregate-to-reader"
GRANT_NAME = "criticalsvc-read-discovered"
# The types the shipped reader role already covers (deploy/base/rbac.yaml, criticalsvc-reader-builtin).
READ_BY_DEFAULT = frozenset({CRITICAL_SERVICES, NAMESPACES, CRDS, *ROUTED_PROVIDERS})
# The gate's own install: its workloads carry this label (deploy/base), and its finalizers this prefix.
OWN_NAME_LABEL = ("app.kubernetes.io/name", "criticalsvc")
OWN_FINALIZER_PREFIX = "criticalsvc.io/"
# The gate's own webhook configurations: the shipped one (deploy/base/webhook.yaml; serve --webhook-configuration
# names another) and the ones its leader writes (criticalsvc/webhookconfigurations.py). Pointed at the gate by url
# when it runs outside the cluster, they are its own install all the same.
OWN_CONFIGURATIONS = frozenset({"criticalsvc", *CONFIGURATION_NAMES})
UPDATE = "update"
_RANK = {Confidence.HIGH: 0, Confidence.MEDIUM: 1, Confidence.LOW: 2}


@attrs.frozen
class Dependency:
    """One criterion of a proposal, and why."""

    criterion: Criterion
    confidence: Confidence
    evidence: str
    consequence: str  # what goes wrong if the provider goes first


@attrs.frozen
class Proposal:
    provider: ObjectRef
    kind: str
    dependencies: tuple[Dependency, ...]

    @property
    def name(self) -> str:
        suffix = {"StatefulSet": "-sts", "DaemonSet": "-ds"}.get(self.kind, "")
        return f"{self.provider.namespace}-{self.provider.name}{suffix}"[:253]

    @property
    def confidence(self) -> Confidence:
        return max((d.confidence for d in self.dependencies), key=_RANK.__getitem__)


@attrs.frozen
class Skipped:
    subject: str
    reason: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.reason}"


@attrs.frozen
class Discovery:
    proposals: tuple[Proposal, ...]
    grants: tuple[GroupResource, ...]  # criteria types the gate's reader role does not cover yet
    skipped: tuple[Skipped, ...]
    objects: int = 0


def _own(w: Workload | None, gate_namespace: str) -> bool:
    return w is not None and (w.ref.namespace == gate_namespace or OWN_NAME_LABEL in w.labels)


def _consumers(uses: list[FinalizerUse]) -> list[FinalizerUse]:
    return [u for u in uses if not is_builtin(u.finalizer) and not u.finalizer.startswith(OWN_FINALIZER_PREFIX)]


def access_questions(inv: Inventory, *, gate_namespace: str = "criticalsvc-system") -> list[AccessQuestion]:
    """The SubjectAccessReviews `propose` needs: per ServiceAccount running a workload, may it update each
    type carrying a finalizer not the cluster's own, and may it update anything at all (SUPERUSER_PROBE)."""
    accounts = sorted({(w.ref.namespace, w.service_account) for w in inv.workloads if not _own(w, gate_namespace)})
    types = sorted({(u.group_resource, _where(u)) for u in _consumers(list(inv.finalizers))})
    out = [AccessQuestion(a, UPDATE, SUPERUSER_PROBE) for a in accounts]
    out += [AccessQuestion(a, UPDATE, gr, ns) for a in accounts for gr, ns in types]
    return out


def _where(u: FinalizerUse) -> str:
    # Carriers in one namespace: a Role there may be what grants the controller; else it needs a cluster grant.
    return next(iter(u.namespaces)) if len(u.namespaces) == 1 else ""


def propose(inv: Inventory, answers: Mapping[AccessQuestion, AccessAnswer], *,
            gate_namespace: str = "criticalsvc-system") -> Discovery:
    index = Index(inv)
    found: dict[ObjectRef, list[Dependency]] = {}
    skipped: list[Skipped] = []

    def serve(subject: str, trace: Trace, criterion: Criterion, consequence: str) -> None:
        if not trace.resolved:
            skipped.append(Skipped(subject, f"no workload found behind it: {trace.problem}"))
            return
        for ref in trace.workloads:
            if _own(index.workloads.get(ref), gate_namespace):
                skipped.append(Skipped(subject, f"served by {ref}, the gate's own install"))
                continue
            found.setdefault(ref, []).append(Dependency(criterion, Confidence.HIGH, f"{subject} -> {trace.evidence}",
                                                        consequence))

    by_configuration: dict[tuple[GroupResource, str], list[Webhook]] = {}
    for w in inv.webhooks:
        by_configuration.setdefault((w.configuration, w.configuration_name), []).append(w)
    for (gr, name), hooks in sorted(by_configuration.items()):
        kind = hooks[0].kind
        if name in OWN_CONFIGURATIONS:
            skipped.append(Skipped(f"{kind} {name}", "the gate's own install"))
            continue
        for w in hooks:
            if w.service is None:
                where = f"clientConfig.url {w.url}" if w.url else "no clientConfig.service"
                skipped.append(Skipped(f"{kind} {name} webhook {w.name}",
                                       f"{where}: served from outside the cluster, no workload here to protect"))
        by_service: dict[Any, list[Webhook]] = {}
        for w in hooks:
            if w.service is not None:
                by_service.setdefault(w.service, []).append(w)
        for service, served in by_service.items():
            names = ", ".join(w.name for w in served)
            serve(f"{kind} {name} (webhooks {names})", trace_service(service, index),
                  SpecificResourceCriterion(ObjectRef(gr, "", name)), _webhook_consequence(served))
    for c in inv.conversions:
        subject = f"CustomResourceDefinition {c.crd_name} (conversion webhook)"
        if c.service is None:
            skipped.append(Skipped(subject, f"clientConfig.url {c.url}: served from outside the cluster"))
            continue
        serve(subject, trace_service(c.service, index), SpecificResourceCriterion(ObjectRef(CRDS, "", c.crd_name)),
              f"with no server, reading or writing {c.crd_name} in any version but the stored one fails, and so "
              "does deleting the CRD's objects with it")
    for a in inv.apiservices:
        if a.service is None:
            continue  # served by kube-apiserver itself
        serve(f"APIService {a.name}", trace_service(a.service, index),
              SpecificResourceCriterion(ObjectRef(APISERVICES, "", a.name)),
              f"with no server, discovery of {a.name} fails: no namespace can finish deleting "
              "(NamespaceDeletionDiscoveryFailure) and the garbage collector stops collecting")
    for u in inv.finalizers:
        if is_builtin(u.finalizer):
            skipped.append(Skipped(f"finalizer {u.finalizer} on {u.group_resource}",
                                   "processed by Kubernetes itself (kube-controller-manager or the API server)"))
            continue
        if u.finalizer.startswith(OWN_FINALIZER_PREFIX):
            skipped.append(Skipped(f"finalizer {u.finalizer} on {u.group_resource}", "the gate's own"))
            continue
        _finalizer(u, inv, answers, gate_namespace, found, skipped)
    proposals = tuple(sorted((Proposal(ref, index.workloads[ref].kind if ref in index.workloads else "Deployment",
                                       tuple(deps)) for ref, deps in found.items()), key=lambda p: p.provider))
    types = {_criterion_type(d.criterion) for p in proposals for d in p.dependencies}
    grants = tuple(sorted(t for t in types if t not in READ_BY_DEFAULT))
    return Discovery(proposals, grants, tuple(skipped), inv.objects)


def in_namespace(d: Discovery, namespace: str) -> Discovery:
    """The part of a whole cluster's discovery about the workloads in `namespace` (`discover -n`): their proposals,
    the grants those need, and what was skipped naming something there (a Service, a workload).

    The inference itself stays the whole cluster's: the objects carrying a finalizer that a namespace's controller
    processes live anywhere (cert-manager's Challenges sit in the users' namespaces), and "the only account that may
    update the type" is a statement about every account."""
    proposals = tuple(p for p in d.proposals if p.provider.namespace == namespace)
    types = {_criterion_type(dep.criterion) for p in proposals for dep in p.dependencies}
    where = f" {namespace}/"
    skipped = tuple(s for s in d.skipped if where in f" {s.subject} {s.reason}")
    return attrs.evolve(d, proposals=proposals, grants=tuple(g for g in d.grants if g in types), skipped=skipped)


def _criterion_type(c: Criterion) -> GroupResource:
    return c.target.group_resource if isinstance(c, SpecificResourceCriterion) else c.group_resource


def _webhook_consequence(hooks: list[Webhook]) -> str:
    parts = []
    for w in hooks:
        rules = "; ".join(str(r) for r in w.rules) or "no rules"
        narrowed = " (only where its namespaceSelector/objectSelector match)" if \
            w.namespace_selector or w.object_selector else ""
        if w.failure_policy == "Fail":
            parts.append(f"{w.name} is failurePolicy Fail: with no server the API server refuses every {rules}"
                         f"{narrowed}")
        else:
            parts.append(f"{w.name} is failurePolicy Ignore: with no server {rules} pass unchecked{narrowed}")
    return "; ".join(parts)


def _finalizer(u: FinalizerUse, inv: Inventory, answers: Mapping[AccessQuestion, AccessAnswer], gate_namespace: str,
               found: dict[ObjectRef, list[Dependency]], skipped: list[Skipped]) -> None:
    subject = f"finalizer {u.finalizer} on {u.group_resource}"
    where = _where(u)
    allowed: list[tuple[Workload, AccessAnswer]] = []
    superusers: list[tuple[Workload, AccessAnswer]] = []
    unanswered = 0
    for w in inv.workloads:
        if _own(w, gate_namespace):
            continue
        account = (w.ref.namespace, w.service_account)
        answer = answers.get(AccessQuestion(account, UPDATE, u.group_resource, where))
        if answer is None or answer.allowed is None:
            unanswered += 1
            continue
        if not answer.allowed:
            continue
        probe = answers.get(AccessQuestion(account, UPDATE, SUPERUSER_PROBE))
        (superusers if probe is not None and probe.allowed else allowed).append((w, answer))
    seen = f"found on {u.count} {u.group_resource}" + (f" ({u.terminating} terminating)" if u.terminating else "") + \
        f" (first: {', '.join(e.key for e in u.examples)})"
    consequence = (f"with no controller, every {u.group_resource} carrying {u.finalizer} hangs in deletion, and its "
                   "namespace with it (NamespaceFinalizersRemaining)")
    criterion = FinalizerCriterion(u.group_resource, u.finalizer)

    def sar(w: Workload, a: AccessAnswer) -> str:
        scope = f" in namespace {where}" if where else ""
        return (f"SubjectAccessReview: system:serviceaccount:{w.ref.namespace}:{w.service_account} may update "
                f"{u.group_resource}{scope}" + (f" ({a.reason})" if a.reason else ""))

    def scored(pool: list[tuple[Workload, AccessAnswer]]) -> list[Candidate]:
        return best(name_score(u.group_resource, u.finalizer, w) for w, _ in pool)

    by_ref = {w.ref: (w, a) for w, a in allowed + superusers}
    top = scored(allowed + superusers)
    if top:
        pick = top[0]
        w, a = by_ref[pick.workload]
        superuser = (w, a) in superusers
        others = [c.workload for c in top[1:]]
        # The type's own group in the workload's name (score 3) or being the only account that may: convincing,
        # unless that account may update every type anyway; a tie is a guess.
        confidence = Confidence.LOW if others else \
            Confidence.HIGH if not superuser and (pick.score >= 3 or len(allowed) == 1) else Confidence.MEDIUM
        rest = [x.ref for x, _ in allowed + superusers if x.ref != pick.workload]
        evidence = f"{subject}: {seen}; {sar(w, a)}" + (", but it may update every type" if superuser else "") + \
            f"; names: {', '.join(pick.matched)}" + \
            (f"; as well matched: {', '.join(map(str, others))}" if others else "") + \
            (f"; may update it too: {_few(rest)}" if rest else "")
        found.setdefault(pick.workload, []).append(Dependency(criterion, confidence, evidence, consequence))
        return
    if len(allowed) == 1:
        w, a = allowed[0]
        found.setdefault(w.ref, []).append(Dependency(
            criterion, Confidence.MEDIUM, f"{subject}: {seen}; {sar(w, a)}, the only workload's that may (no name "
            "matches)", consequence))
        return
    if unanswered and not allowed and not superusers:
        # No access answers (a snapshot without RBAC): names alone, said so.
        top = best(name_score(u.group_resource, u.finalizer, w) for w in inv.workloads if not _own(w, gate_namespace))
        if len(top) == 1:
            found.setdefault(top[0].workload, []).append(Dependency(
                criterion, Confidence.LOW, f"{subject}: {seen}; names: {', '.join(top[0].matched)}; access not "
                "checked (no SubjectAccessReview answers)", consequence))
            return
    if allowed:
        skipped.append(Skipped(subject, f"{seen}; {len(allowed)} workloads may update it and no name tells which "
                                        f"processes it: {_few([w.ref for w, _ in allowed])}"))
    elif unanswered:
        why = next((a.reason for a in answers.values() if a.allowed is None and a.reason), "")
        skipped.append(Skipped(subject, f"{seen}; whose ServiceAccount may update it could not be asked"
                                        f"{f' ({why})' if why else ''}, and no workload's name matches it"))
    else:
        skipped.append(Skipped(subject, f"{seen}; no workload's ServiceAccount may update it (its controller runs "
                                        "outside the cluster, or is gone)"))


def _few(refs: list[ObjectRef], n: int = 4) -> str:
    shown = ", ".join(str(r) for r in refs[:n])
    return shown + (f" and {len(refs) - n} more" if len(refs) > n else "")
