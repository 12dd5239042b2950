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
    CRDS,
    CRITICAL_SERVICES,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    NAMESPACES,
    ROUTED_PROVIDERS,
    GroupResource,
)
from ..labels import LabelSelector, Requirement
from ..routing import Route, desired_routes
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


@attrs.frozen
class WebhookRule:
    operations: frozenset[str]
    group_resources: frozenset[GroupResource]  # ANY_RESOURCE matches every (non-exempt) resource
    # The objectSelector of the webhook entry this rule stands for (deploy/ has one per entry).
    object_selector: LabelSelector = attrs.field(factory=LabelSelector)

    def matches(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                old: Mapping[str, Any] | None) -> bool:
        if operation not in self.operations:
            return False
        if gr not in self.group_resources and (ANY_RESOURCE not in self.group_resources or gr in EXEMPT
                                               or "/" in gr.resource):
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

# The rules deploy/ registers (issues 5 and 11): the gate sees DELETEs of namespaces, workloads and CRDs
# (unless labelled, see the next rule), of CriticalServices, and of every object of any type labelled
# criticalsvc.io/deletion-protected=Always; and CREATE/UPDATE of CriticalServices.
DEFAULT_RULES: tuple[WebhookRule, ...] = (
    WebhookRule(frozenset({"DELETE"}), frozenset({NAMESPACES, *ROUTED_PROVIDERS, CRDS}),
                NOT_DELETION_PROTECTED_SELECTOR),
    WebhookRule(frozenset({"DELETE", "CREATE", "UPDATE"}), frozenset({CRITICAL_SERVICES})),
    WebhookRule(frozenset({"DELETE"}), frozenset({ANY_RESOURCE}), DELETION_PROTECTED_SELECTOR),
)


@attrs.frozen
class ProviderRoutesRule:
    """The rules of the gate's own configuration criticalsvc-providers (criticalsvc/routing.py), from the
    CriticalServices in `state` at each request: the same pure function the live router writes from, so
    the simulator routes a ConfigMap or custom-resource provider as a cluster whose gate manages routes
    does. The simplest faithful model: the live router's lag (about a second, a poll) is not simulated,
    so a route exists from the moment its CriticalService is stored. DELETEs carry the kind-specific
    webhooks' objectSelector (labelled objects go to the labelled-objects rule alone)."""

    state: MemoryState

    def matches(self, operation: str, gr: GroupResource, obj: Mapping[str, Any] | None,
                old: Mapping[str, Any] | None) -> bool:
        if gr in EXEMPT:
            return False
        rules = desired_routes(self.state.critical_services(), self.state.mapper.lookup)
        if Route(operation, gr) not in {r.route for r in rules}:
            return False
        return operation != "DELETE" or selects(NOT_DELETION_PROTECTED_SELECTOR, obj, old)


@attrs.define
class RegisteredWebhook:
    """A registered validating webhook, as a ValidatingWebhookConfiguration entry describes it."""

    hook: AdmissionHook
    rules: tuple[WebhookRule | ProviderRoutesRule, ...] = DEFAULT_RULES
    failure_policy: Literal["Fail", "Ignore"] = "Fail"
    name: str = WEBHOOK_NAME
    # namespaceSelector exclusions by name (kubernetes.io/metadata.name NotIn [...]).
    excluded_namespaces: frozenset[str] = frozenset({"kube-system", "criticalsvc-system"})

    def matches(self, operation: str, gr: GroupResource, namespace: str,
                obj: Mapping[str, Any] | None = None, old: Mapping[str, Any] | None = None) -> bool:
        """Whether this webhook reviews the request: `obj`/`old` are the request's object and oldObject
        (a rule with an objectSelector never matches when both are None)."""
        if namespace and namespace in self.excluded_namespaces:
            return False
        return any(r.matches(operation, gr, obj, old) for r in self.rules)
