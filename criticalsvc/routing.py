"""Which requests the API server must send to the gate, beyond what the shipped configuration routes.

The shipped ValidatingWebhookConfiguration `criticalsvc` (deploy/base/webhook.yaml) sends the gate the
DELETEs of namespaces, apps workloads, CRDs and CriticalServices: a fixed list, because a user's GitOps
tool owns that object. A CriticalService may name a provider of any type (a ConfigMap, a PVC, a custom
resource), and may ask for UPDATEs of it to be held (`spec.holdUpdates: WhileBlocking`) or for scaling
it to zero to be refused (`spec.scaleToZero: DenyWhileBlocking`). Those requests reach the gate only
through a second configuration the gate writes itself, `criticalsvc-providers`:

    webhook providers.gate.criticalsvc.io   DELETE of each provider type the shipped one does not route;
                                            objectSelector deletion-protected NotIn [Always], as the shipped
                                            kind-specific webhooks: a labelled object is reviewed by the
                                            labelled-objects webhook alone
    webhook updates.gate.criticalsvc.io     UPDATE of the provider types whose CriticalServices hold
                                            updates or deny scaling to zero, and UPDATE of `<plural>/scale`
                                            for the latter (`kubectl scale` goes through the subresource)

Every rule names one group, one version and one resource, never `*`: the gate is asked about nothing
it does not decide. clientConfig (service or url, and caBundle), namespaceSelector and failurePolicy are
copied from the shipped configuration's webhooks, so a renewed certificate (or cert-manager's CA
injection) and an outside-the-cluster URL carry over on the next sync. The object is owned by the
shipped configuration (a cluster-scoped owner for a cluster-scoped dependent): deleting `criticalsvc`,
the documented way out of an outage and the uninstall step, lets the garbage collector delete this one
too (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents).

No provider needs a route: the configuration is written with `webhooks: []` rather than deleted. It is
created only once some route is needed; after that it stays, empty, so a CriticalService that comes and
goes costs one update each way and never a create/delete pair, and the gate needs no `delete` grant.

Pure: `desired_routes` and `render` compute, `routes_of` reads a stored object back, and
`same_configuration` compares what a writer would write with what is stored, ignoring server-set fields.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .api import (
    CRITICAL_SERVICES,
    DELETION_PROTECTED_ALWAYS,
    DELETION_PROTECTED_LABEL,
    GATED_DELETES,
    CriticalService,
    GroupResource,
    HoldUpdates,
    ScaleToZero,
)
from .restmapper import ResourceType

SHIPPED_CONFIGURATION = "criticalsvc"
PROVIDERS_CONFIGURATION = "criticalsvc-providers"
DELETE_WEBHOOK = "providers.gate.criticalsvc.io"
UPDATE_WEBHOOK = "updates.gate.criticalsvc.io"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "criticalsvc"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
KIND = "ValidatingWebhookConfiguration"
# The shipped webhook whose settings the owned ones copy: a kind-specific DELETE webhook, with the
# namespaceSelector and the objectSelector a provider's DELETE needs (deploy/base/webhook.yaml (2)).
TEMPLATE_WEBHOOK = "workloads.gate.criticalsvc.io"
SCALE = "scale"

# The API server never sends admission requests for these (IsExemptAdmissionConfigurationResource,
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules/rules.go):
# a rule for them would route nothing.
EXEMPT = frozenset(GroupResource("admissionregistration.k8s.io", r) for r in (
    "validatingwebhookconfigurations", "mutatingwebhookconfigurations", "validatingadmissionpolicies",
    "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"))


@attrs.frozen(order=True)
class Route:
    """One (operation, group/resource[/subresource]) the API server sends to the gate."""

    operation: str
    group_resource: GroupResource  # resource "deployments/scale" for a subresource

    def __str__(self) -> str:
        # kubectl's spelling with the subresource last: `UPDATE deployments.apps/scale`.
        resource, _, sub = self.group_resource.resource.partition("/")
        return f"{self.operation} {GroupResource(self.group_resource.group, resource)}{'/' + sub if sub else ''}"


# Operations and resources the shipped configuration already sends (deploy/base/webhook.yaml; the
# CriticalServices webhook (3) reviews their CREATE/UPDATE too). tests/test_routing.py checks the file.
STATIC_ROUTES: frozenset[Route] = frozenset({Route("DELETE", gr) for gr in GATED_DELETES}
                                            | {Route("UPDATE", CRITICAL_SERVICES), Route("CREATE", CRITICAL_SERVICES)})


@attrs.frozen(order=True)
class RouteRule:
    """A Route with what a webhook rule also needs: the served version and the scope."""

    route: Route
    version: str
    namespaced: bool

    def render(self) -> dict[str, Any]:
        return {"apiGroups": [self.route.group_resource.group], "apiVersions": [self.version],
                "operations": [self.route.operation], "resources": [self.route.group_resource.resource],
                "scope": "Namespaced" if self.namespaced else "Cluster"}


def needed_routes(cs: CriticalService, provider_type: GroupResource) -> frozenset[Route]:
    """Every route `cs` needs to be enforced as specified, static ones included."""
    routes = {Route("DELETE", provider_type)}
    if cs.hold_updates == HoldUpdates.WHILE_BLOCKING or cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING:
        routes.add(Route("UPDATE", provider_type))
    if cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING:
        routes.add(Route("UPDATE", GroupResource(provider_type.group, f"{provider_type.resource}/{SCALE}")))
    return frozenset(r for r in routes if r.group_resource not in EXEMPT)


def is_static(route: Route) -> bool:
    return route in STATIC_ROUTES


def desired_routes(services: Iterable[CriticalService],
                   lookup: Callable[[GroupResource], ResourceType | None]) -> frozenset[RouteRule]:
    """The rules the owned configuration must hold: what the CriticalServices need and the shipped
    configuration does not route. A provider whose type is not served gets none (no request for it can
    come); it is routed once discovery or a CRD makes the type known and the mapper changes."""
    rules: set[RouteRule] = set()
    for cs in services:
        t = lookup(cs.provider.group_resource)
        if t is None:
            continue
        for route in needed_routes(cs, t.group_resource):
            if not is_static(route):
                rules.add(RouteRule(route, t.version, t.namespaced))
    return frozenset(rules)


def template_webhook(shipped: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The shipped webhook whose clientConfig, namespaceSelector and failurePolicy the owned ones copy."""
    webhooks = [w for w in shipped.get("webhooks") or [] if isinstance(w, Mapping)]
    named = [w for w in webhooks if w.get("name") == TEMPLATE_WEBHOOK]
    with_client = [w for w in webhooks if isinstance(w.get("clientConfig"), Mapping)]
    found = named or with_client
    return found[0] if found else None


def render(rules: Iterable[RouteRule], shipped: Mapping[str, Any]) -> dict[str, Any]:
    """The whole owned configuration for `rules`, its settings copied from the stored `shipped` one.

    Raises ValueError when `shipped` has no webhook to copy a clientConfig from, or no uid to own it by."""
    template = template_webhook(shipped)
    metadata = shipped.get("metadata") or {}
    if template is None:
        raise ValueError(f"ValidatingWebhookConfiguration {metadata.get('name')} has no webhook to copy from")
    if not metadata.get("uid"):
        raise ValueError(f"ValidatingWebhookConfiguration {metadata.get('name')} has no uid (not a stored object)")
    ordered = sorted(rules)
    deletes = [r.render() for r in ordered if r.route.operation == "DELETE"]
    updates = [r.render() for r in ordered if r.route.operation == "UPDATE"]
    webhooks: list[dict[str, Any]] = []
    if deletes:
        webhooks.append(_webhook(DELETE_WEBHOOK, deletes, template, object_selector={"matchExpressions": [
            {"key": DELETION_PROTECTED_LABEL, "operator": "NotIn", "values": [DELETION_PROTECTED_ALWAYS]}]}))
    if updates:
        # No objectSelector: the labelled-objects webhook reviews DELETEs only, so an UPDATE of a labelled
        # provider would otherwise reach no webhook.
        webhooks.append(_webhook(UPDATE_WEBHOOK, updates, template, object_selector={}))
    return {
        "apiVersion": ADMISSION_API_VERSION, "kind": KIND,
        "metadata": {
            "name": PROVIDERS_CONFIGURATION,
            "labels": {"app.kubernetes.io/name": "criticalsvc", MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [{"apiVersion": ADMISSION_API_VERSION, "kind": KIND,
                                 "name": str(metadata.get("name") or SHIPPED_CONFIGURATION),
                                 "uid": str(metadata["uid"])}],
        },
        "webhooks": webhooks,
    }


def _webhook(name: str, rules: list[dict[str, Any]], template: Mapping[str, Any], *,
             object_selector: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "rules": rules,
        "namespaceSelector": copy.deepcopy(template.get("namespaceSelector") or {}),
        "objectSelector": object_selector,
        # The operator's choice on the shipped configuration (the Helm chart's `failurePolicy`), Fail by default.
        "failurePolicy": template.get("failurePolicy") or "Fail",
        "sideEffects": "NoneOnDryRun",
        "matchPolicy": "Equivalent",
        "timeoutSeconds": 5,
        "admissionReviewVersions": ["v1"],
        "clientConfig": copy.deepcopy(dict(template["clientConfig"])),
    }


def routes_of(config: Mapping[str, Any] | None) -> frozenset[Route]:
    """Every (operation, group/resource[/subresource]) a stored configuration's rules name.

    Wildcards are read literally (`*`), so a hand-edited rule with one does not count as routing a type."""
    routes: set[Route] = set()
    for webhook in (config or {}).get("webhooks") or []:
        for rule in webhook.get("rules") or [] if isinstance(webhook, Mapping) else []:
            if not isinstance(rule, Mapping):
                continue
            for operation in rule.get("operations") or []:
                for group in rule.get("apiGroups") or []:
                    for resource in rule.get("resources") or []:
                        routes.add(Route(str(operation), GroupResource(str(group), str(resource))))
    return frozenset(routes)


# admissionregistration/v1 defaults the API server fills in (SetDefaults_ValidatingWebhook, SetDefaults_Rule,
# SetDefaults_ServiceReference:
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/apis/admissionregistration/v1/defaults.go).
_WEBHOOK_DEFAULTS = {"failurePolicy": "Fail", "matchPolicy": "Equivalent", "namespaceSelector": {},
                     "objectSelector": {}, "timeoutSeconds": 10}


def _normal_webhook(webhook: Mapping[str, Any]) -> dict[str, Any]:
    out = {**_WEBHOOK_DEFAULTS, **copy.deepcopy(dict(webhook))}
    out["rules"] = [{"scope": "*", **rule} for rule in out.get("rules") or []]
    client = out.get("clientConfig") or {}
    if isinstance(client.get("service"), Mapping):
        client["service"] = {"port": 443, **client["service"]}
    out["clientConfig"] = client
    return out


def same_configuration(stored: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether writing `desired` over `stored` would change anything the API server keeps.

    Compared: webhooks (with the server's defaults applied to both), the ownerReferences, and the labels
    the gate sets. Ignored: resourceVersion, uid, generation, creationTimestamp, managedFields, and labels
    or annotations someone else added."""
    if stored is None:
        return False
    meta, want = stored.get("metadata") or {}, desired.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in (want.get("labels") or {}).items()):
        return False
    owners = [{k: o.get(k) for k in ("apiVersion", "kind", "name", "uid")} for o in meta.get("ownerReferences") or []]
    if owners != want.get("ownerReferences", []):
        return False
    return [_normal_webhook(w) for w in stored.get("webhooks") or []] == \
        [_normal_webhook(w) for w in desired.get("webhooks") or []]


def for_update(desired: Mapping[str, Any], stored: Mapping[str, Any]) -> dict[str, Any]:
    """`desired` as a PUT body over `stored`: its resourceVersion (the API server's optimistic concurrency:
    a Conflict if someone wrote in between), and the labels and annotations others added, kept."""
    body = copy.deepcopy(dict(desired))
    meta = stored.get("metadata") or {}
    body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
    body["metadata"]["labels"] = {**(meta.get("labels") or {}), **body["metadata"]["labels"]}
    if meta.get("annotations"):
        body["metadata"]["annotations"] = dict(meta["annotations"])
    return body


@attrs.frozen
class RoutingFacts:
    """What status needs to know about routing (criticalsvc/status.py).

    `managed`: the gate writes the owned configuration (serve --manage-provider-webhooks).
    `routed`: what the owned configuration routes, as the router last read or wrote it (empty before).
    `error`: why the router's last sync failed (an API error such as RBAC's Forbidden), or None."""

    managed: bool = False
    routed: frozenset[Route] = frozenset()
    error: str | None = None

    def routes(self, route: Route) -> bool:
        return is_static(route) or route in self.routed


def not_routed(cs: CriticalService, provider_type: GroupResource) -> str:
    """Why a provider of an unrouted type is only half protected, and what to do about it.

    Short enough for an admission warning (256 characters): the routed types are in GATED_DELETES.
    """
    where = f"only deleting its namespace {cs.provider.namespace} is gated" if cs.provider.namespace else \
        "nothing is gated"
    return (f"the webhook configuration sends no DELETE of {provider_type} to the gate, so {where}; add "
            f"{provider_type} to its workloads rule to gate {cs.provider} itself")
