"""The validating webhooks the simulated API server calls, and which requests each one reviews.

A RegisteredWebhook stands for one ValidatingWebhookConfiguration entry: its rules (operations and
resources), objectSelector and namespaceSelector exclusions, failurePolicy and the hook that answers
an AdmissionReview. Matching follows the API server's admission webhook predicates
(k8s.io/apiserver pkg/admission/plugin/webhook/predicates: rules, object, namespace). The store calls
the matching hooks on every write (store.py); webhook_client.py makes a hook of an HTTPS URL and
registers webhooks from ValidatingWebhookConfiguration objects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from ..api import (
    CRD_NAME,
    CRDS,
    CRITICAL_SERVICES,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    PROTECTED_LABEL,
    GroupResource,
)
from ..labels import LabelSelector, Requirement
from ..routing import Route, call_of, covers, desired
from ..state import MemoryState

WEBHOOK_NAME = "gate.criticalsvc.io"

# An admission hook receives an AdmissionReview request (dict) and returns the AdmissionReview reply
# (dict); raising means the call failed (transport error, timeout) and failurePolicy applies.
AdmissionHook = Callable[[dict[str, Any]], dict[str, Any]]


# IsExemptAdmissionConfigurationResource: never sent to webhooks, so a broken webhook can be removed [D5].
EXEMPT = frozenset({
    GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations"),
    GroupResource("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
    GroupResource("admissionregistration.k8s.io", "validatingadmissionpolicies"),
    GroupResource("admissionregistration.k8s.io", "validatingadmissionpolicybindings"),
})
# In a WebhookRule: every resource of every group (top-level resources only, as `resources: ["*"]`).
ANY_RESOURCE = GroupResource("*", "*")
# A request to a subresource is matched as `<resource>/<subresource>` (GroupResource("apps",
# "deployments/scale")), as a rule names it (predicates/rules/rules.go [D5]); `*` never matches one.


def selects(selector: LabelSelector, obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> bool:
    """A webhook's objectSelector as the API server applies it (predicates/object/matcher.go): an empty
    selector matches every request; otherwise `object` or `oldObject` must match, and a null object never
    matches, so on DELETE only oldObject's labels count."""
    if selector.is_empty:
        return True
    return _labels_match(selector, obj) or _labels_match(selector, old)


def _labels_match(selector: LabelSelector, obj: Mapping[str, Any] | None) -> bool:
    if not isinstance(obj, Mapping):
        return False
    metadata = obj.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    return selector.matches(labels if isinstance(labels, Mapping) else {})


class MatchConditionError(Exception):
    """A webhook's matchConditions could not be evaluated (none false): under failurePolicy Fail the API
    server refuses the request without calling the webhook (matchconditions/matcher.go)."""


@attrs.frozen
class WebhookRule:
    operations: frozenset[str]
    group_resources: frozenset[GroupResource]  # ANY_RESOURCE matches every (non-exempt) resource
    # The objectSelector of the webhook entry this rule stands for (deploy/ has one per entry).
    object_selector: LabelSelector = attrs.field(factory=LabelSelector)
    # The names its matchCondition lets through (None: any); "" stands for a request nothing names.
    names: frozenset[str] | None = None

    def matches(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                old: Mapping[str, Any] | None, *, name: str = "", namespace: str = "") -> bool:
        if operation not in self.operations:
            return False
        if gr not in self.group_resources and (ANY_RESOURCE not in self.group_resources or gr in EXEMPT
                                               or "/" in gr.resource):
            return False
        if self.names is not None:
            call = call_of(operation=operation, group_resource=gr, namespace=namespace, name=name, obj=obj, old=old)
            if call.name not in self.names:
                return False
        return selects(self.object_selector, obj, old)


# criticalsvc.io/deletion-protected In [Always]: the objectSelector of deploy/'s labelled-objects webhook.
DELETION_PROTECTED_SELECTOR = LabelSelector((
    Requirement(DELETION_PROTECTED_LABEL, "In", frozenset({DELETION_PROTECTED_ALWAYS})),))
# ... and NotIn [Always]: the kind-specific DELETE webhooks leave labelled objects to that one, so each
# DELETE is reviewed by one webhook (the API server calls matching webhooks in parallel and answers with
# whichever denial comes first, so two would make the webhook named in the message a race [D1]).
NOT_DELETION_PROTECTED_SELECTOR = LabelSelector((
    Requirement(DELETION_PROTECTED_LABEL, "NotIn", frozenset({DELETION_PROTECTED_ALWAYS})),))
# The gate's own label (deploy/base/webhook.yaml (4) and (5)).
LABELLED_SELECTOR = LabelSelector((Requirement(PROTECTED_LABEL, "Exists"),))
PROTECTED_SELECTOR = LabelSelector((Requirement(PROTECTED_LABEL, "Exists"),
                                    *NOT_DELETION_PROTECTED_SELECTOR.requirements))

# The rules deploy/ registers: the gate sees CREATE/UPDATE/DELETE of CriticalServices, the DELETE of the
# CriticalService CRD (unless labelled, see the last rule), and the DELETE of every object of any type
# labelled criticalsvc.io/deletion-protected=Always. What CriticalServices protect is the ProviderRoutesRule's.
DEFAULT_RULES: tuple[WebhookRule, ...] = (
    WebhookRule(frozenset({"DELETE", "CREATE", "UPDATE"}), frozenset({CRITICAL_SERVICES})),
    WebhookRule(frozenset({"DELETE"}), frozenset({CRDS}), NOT_DELETION_PROTECTED_SELECTOR,
                names=frozenset({"", CRD_NAME})),
    WebhookRule(frozenset({"DELETE"}), frozenset({ANY_RESOURCE}), DELETION_PROTECTED_SELECTOR),
    # What the gate labelled criticalsvc.io/protected (criticalsvc/protectionlabels.py): its DELETE, and its
    # UPDATEs (the shipped matchCondition narrows those to the ones that remove the label or that a
    # CriticalService holds; the gate decides the rest as unprotected, so sending all of them is the same).
    WebhookRule(frozenset({"DELETE"}), frozenset({ANY_RESOURCE}), PROTECTED_SELECTOR),
    WebhookRule(frozenset({"UPDATE"}), frozenset({ANY_RESOURCE}), LABELLED_SELECTOR),
)


# What criticalsvc-providers' webhooks select once the shipped configuration routes the gate's labels
# (webhookconfigurations.py): a DELETE of an object carrying criticalsvc.io/protected, and an UPDATE of one, are the
# shipped protected.gate's and protected-updates.gate's alone.
NOT_CARRIED_SELECTOR = LabelSelector((Requirement(PROTECTED_LABEL, "DoesNotExist"),))
NOT_LABELLED_NOR_CARRIED_SELECTOR = LabelSelector((*NOT_DELETION_PROTECTED_SELECTOR.requirements,
                                                   *NOT_CARRIED_SELECTOR.requirements))


@attrs.frozen
class ProviderRoutesRule:
    """The routes of the gate's own configuration criticalsvc-providers (criticalsvc/routing.py), from the
    CriticalServices in `state` at each request: the same pure function the live router renders from, as
    the Python predicate the rendered CEL is tested against (routing.covers), so the simulator sends the
    gate exactly the requests a cluster whose gate manages routes sends it: a provider's, its namespace's
    and its CRD's DELETEs, its held UPDATEs, and nothing else. The simplest faithful model: the live
    router's lag (a poll, then the probe) is not simulated, so a route exists from the moment its
    CriticalService is stored. What carries the gate's label goes to the shipped rules alone (the rendered
    objectSelectors, once the shipped configuration routes the labels), so its route by name, which the live router
    drops once the label is stored, routes nothing here either; in a simulation where nothing labels, every provider
    is routed by name."""

    state: MemoryState

    def matches(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                old: Mapping[str, Any] | None, *, name: str = "", namespace: str = "") -> bool:
        if gr in EXEMPT:
            return False
        call = call_of(operation=operation, group_resource=gr, namespace=namespace, name=name, obj=obj, old=old)
        routes = desired(self.state.critical_services(), self.state.mapper.lookup).routes
        if not any(covers(r, call) for r in routes):
            return False
        return selects(NOT_LABELLED_NOR_CARRIED_SELECTOR if operation == "DELETE" else NOT_CARRIED_SELECTOR, obj, old)


@attrs.frozen
class WrittenRoutesRule:
    """criticalsvc-providers as one written version of it holds its routes, with the objectSelectors the rendering
    gives them when the shipped configuration routes the labels: what an API server whose configuration informer
    lags still serves from (design/routing.md, "No window, on every API server"). ProviderRoutesRule is the
    configuration that is always current; the explorer (criticalsvc/verify/enforcement.py) gives each API server
    of its model one of these, written by the leader it models, so a request can meet any version."""

    routes: frozenset[Route]

    def matches(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                old: Mapping[str, Any] | None, *, name: str = "", namespace: str = "") -> bool:
        if gr in EXEMPT or not self.routes:
            return False
        call = call_of(operation=operation, group_resource=gr, namespace=namespace, name=name, obj=obj, old=old)
        if not any(covers(r, call) for r in self.routes):
            return False
        return selects(NOT_LABELLED_NOR_CARRIED_SELECTOR if operation == "DELETE" else NOT_CARRIED_SELECTOR, obj, old)


@attrs.define
class RegisteredWebhook:
    """A registered validating webhook, as a ValidatingWebhookConfiguration entry describes it."""

    hook: AdmissionHook
    rules: tuple[WebhookRule | ProviderRoutesRule | WrittenRoutesRule, ...] = DEFAULT_RULES
    failure_policy: Literal["Fail", "Ignore"] = "Fail"
    name: str = WEBHOOK_NAME
    # namespaceSelector exclusions by name (kubernetes.io/metadata.name NotIn [...]).
    excluded_namespaces: frozenset[str] = frozenset({"kube-system", "criticalsvc-system"})

    def matches(self, operation: str, gr: GroupResource, namespace: str,
                obj: Mapping[str, Any] | None = None, old: Mapping[str, Any] | None = None, *, name: str = "",
                request: Callable[[], Mapping[str, Any]] | None = None) -> bool:
        """Whether this webhook reviews the request: `obj`/`old` are the request's object and oldObject
        (a rule with an objectSelector never matches when both are None), `name` the request's name ("" for
        a deletecollection's item); `request` builds the AdmissionRequest (for matchConditions)."""
        if namespace and namespace in self.excluded_namespaces:
            return False
        return any(r.matches(operation, gr, obj, old, name=name, namespace=namespace) for r in self.rules)
