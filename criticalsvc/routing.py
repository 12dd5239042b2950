"""Which requests the API server sends to the gate: only those that may concern something protected.

The shipped ValidatingWebhookConfiguration `criticalsvc` (deploy/base/webhook.yaml) is the user's object
and routes only what is the gate's whatever the CriticalServices say: CREATE/UPDATE/DELETE of
CriticalServices, the DELETE of the CriticalService CRD, and the DELETE of any object labelled
`criticalsvc.io/deletion-protected: Always`. Everything a CriticalService adds is routed by a second
configuration the gate writes itself, `criticalsvc-providers`, rendered here from the CriticalServices and
the REST mapper, with the API server's own filters (rules, objectSelector, namespaceSelector and
matchConditions, evaluated inside kube-apiserver at no call):

    webhook namespaces.gate.criticalsvc.io      DELETE of the namespaces that hold a provider, by name
    webhook provider-crds.gate.criticalsvc.io   DELETE of the CRDs whose instances are providers, by name
    webhook providers.gate.criticalsvc.io       DELETE of each provider: by namespace/name, or by its
                                                selector on the stored object's labels
    webhook updates.gate.criticalsvc.io         UPDATE of the providers whose updates are held, and of their
                                                `scale` subresource when scaling to 0 is refused
    webhook probe.gate.criticalsvc.io           a dry-run CREATE only the gate sends: it tells the gate that
                                                the API server routes this very configuration (see below)

A request none of them matches never reaches the gate: it pays no round trip, and an outage of every
replica does not refuse it (design/routing.md has the figures).

The routes are spread over SHARDS such configurations, `criticalsvc-providers` and `criticalsvc-providers-1`
.. `-7`, each with the webhooks above for its routes and a probe of its own, by a stable hash of the namespace
each route points into (or the cluster-scoped name): a new CriticalService rewrites one of them, which is what
the API server validates and recompiles, not all of them (webhookconfigurations.py).

Each DELETE webhook's rules name the provider types; its one matchCondition is a disjunction, per type,
of a membership test on `namespace/name` and of the label selectors, evaluated on `oldObject` (a
DELETE's `object` is null; a deletecollection's item has `request.name` "" and its name in oldObject).
The API server evaluates them on the stored object, so a label that makes an object a selected provider
protects it from the moment it is written, before the gate has seen it. Semantics this relies on, read at
the pinned Kubernetes (k8s.io/apiserver v0.37.2):

* all of a webhook's matchConditions must be true; a false one skips the webhook; an evaluation error
  with no false condition rejects the request under failurePolicy Fail, without calling the webhook
  (pkg/admission/plugin/webhook/matchconditions/matcher.go), so every expression here guards each field
  it reads (`has()`, `!= null`) and cannot error on any object;
* at most 64 conditions per webhook, each compiled at write time (the write is refused if it does not
  compile: the router reports RoutingFailed); an expression's source is at most 100,000 code points
  (cel-go's parser default, parser/parser.go), its runtime cost at most 1,000,000 and a webhook's
  conditions together 2,500,000 (pkg/apis/cel/config.go);
* `request.resource` is the resource the rule matched (the equivalent one under matchPolicy Equivalent:
  pkg/admission/plugin/cel/condition.go, CreateAdmissionRequest), so a clause keyed on it is the type;
* the objectSelector of an UPDATE matches on `object` or `oldObject`; a Scale carries no labels
  (scaleFromDeployment), so a selected provider's `scale` updates are routed by namespace and by the
  replicas they ask for, never by labels.

A set that does not fit (an expression past MAX_EXPRESSION_CHARS) is routed more broadly, never less: its
webhook loses its matchCondition (every request of its types is sent), and `Routing.broad` says why;
so does a provider selector without a namespace over a namespaced type, whose members may appear in any
namespace at any moment: every namespace DELETE is routed then.

No window. A CriticalService is Enforcing only once the API server is known to route what it needs: each
configuration carries a probe webhook whose URL path holds the digest of all its other webhooks; the
router sends a dry-run CREATE that only that probe webhook matches (its shard's probe ConfigMap), and the
gate answers it with a denial naming the digest it was called on. The digest coming back means the API
server that answered holds exactly that configuration (an informer holds each object whole), so every
route in it is live.

Each object is owned by the shipped configuration (a cluster-scoped owner for a cluster-scoped dependent):
deleting `criticalsvc`, the documented way out of an outage and the uninstall step, lets the garbage
collector delete this one too (https://kubernetes.io/docs/concepts/architecture/garbage-collection/#owners-dependents).
It is created once some route is needed, then kept (with no webhook but the probe when nothing needs one).

Pure: `needed_routes` and `desired` compute, `covers` is the same routing as a Python predicate (the simulator's,
and the oracle the rendered CEL is tested against). criticalsvc/webhookconfigurations.py renders the routes as the
configurations the API server holds and compares them with what is stored; `Routing` is what status reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from .api import (
    CRDS,
    NAMESPACES,
    PROTECTED_LABEL,
    UPDATES_HELD_LABEL,
    CriticalService,
    GroupResource,
    HoldUpdates,
    ObjectRef,
    ScaleToZero,
)
from .labels import LabelSelector
from .restmapper import ResourceType

SHIPPED_CONFIGURATION = "criticalsvc"
PROVIDERS_CONFIGURATION = "criticalsvc-providers"
NAMESPACES_WEBHOOK = "namespaces.gate.criticalsvc.io"
CRDS_WEBHOOK = "provider-crds.gate.criticalsvc.io"
DELETE_WEBHOOK = "providers.gate.criticalsvc.io"
UPDATE_WEBHOOK = "updates.gate.criticalsvc.io"
PROBE_WEBHOOK = "probe.gate.criticalsvc.io"
# The shipped configuration's webhooks that route by the gate's labels (deploy/base/webhook.yaml (4), (5);
# criticalsvc/protectionlabels.py): present, an object's stored label routes it on every API server.
LABELS_WEBHOOK = "protected.gate.criticalsvc.io"
LABELLED_UPDATES_WEBHOOK = "protected-updates.gate.criticalsvc.io"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "criticalsvc"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"
KIND = "ValidatingWebhookConfiguration"
# The shipped webhook whose clientConfig, namespaceSelector and failurePolicy the owned ones copy: a DELETE
# webhook of namespaced objects (deploy/base/webhook.yaml (3)), present in every shipped configuration.
TEMPLATE_WEBHOOK = "labelled.gate.criticalsvc.io"
SCALE = "scale"
# The probe: a dry-run CREATE of this ConfigMap in the gate's namespace (its Role may create ConfigMaps
# there, for replay's intents); only the probe webhook matches it, and nothing is ever stored.
PROBE_CONFIGMAP = "criticalsvc-routing-probe"  # shard 0's; shard i's ends in -i (probe_configmap)
PROBE_PATH = "/probe/"
PROBE_MESSAGE = "criticalsvc routing probe: the API server routes configuration"
# cel-go refuses an expression past 100,000 code points; a margin for the guards around the lists.
MAX_EXPRESSION_CHARS = 90_000

# The API server never sends admission requests for these (IsExemptAdmissionConfigurationResource,
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/predicates/rules/rules.go):
# a rule for them would route nothing.
EXEMPT = frozenset(GroupResource("admissionregistration.k8s.io", r) for r in (
    "validatingwebhookconfigurations", "mutatingwebhookconfigurations", "validatingadmissionpolicies",
    "validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"))


@attrs.frozen(cache_hash=True)  # remembered per CriticalService and looked up in sets of every route, at 10,000 often
class Route:
    """Some requests the API server must send the gate: `operation` on `group_resource` (`deployments/scale`
    for the subresource), narrowed to objects in `namespace` (None: any, or cluster-scoped), to the one
    object `name`, to the objects `selector` selects, or (`to_zero`, a `scale` update only) to the updates
    that ask for 0 replicas, or (`replicas_change`) to those that change the replicas. With none of these,
    every such request is routed."""

    operation: str
    group_resource: GroupResource
    namespace: str | None = None
    name: str | None = None
    selector: LabelSelector | None = None
    to_zero: bool = False
    replicas_change: bool = False

    @property
    def broad(self) -> bool:
        return self.name is None and self.selector is None and not self.to_zero and not self.replicas_change

    def sort_key(self) -> tuple[str, ...]:
        return (self.operation, self.group_resource.group, self.group_resource.resource, self.namespace or "",
                self.name or "", str(self.selector or ""), str(self.to_zero), str(self.replicas_change))

    def __str__(self) -> str:
        # kubectl's spelling with the subresource last: `UPDATE deployments.apps/scale`.
        resource, _, sub = self.group_resource.resource.partition("/")
        what = f"{self.operation} {GroupResource(self.group_resource.group, resource)}{'/' + sub if sub else ''}"
        where = f"{self.namespace}/" if self.namespace else ""
        if self.name is not None:
            return f"{what} {where}{self.name}"
        if self.selector is not None:
            return f"{what} {where}({self.selector or 'everything'})"
        if self.to_zero:
            return f"{what} {where}(to 0 replicas)"
        if self.replicas_change:
            return f"{what} {where}(changing replicas)"
        return f"{what} {where or 'everything'}".rstrip("/")


@attrs.frozen
class Call:
    """What the API server matches a webhook on, for one request (the Python side of the CEL below).

    `name` is the object's (a deletecollection item's comes from oldObject), "" when nothing tells;
    `labels` are those of `object` and `oldObject` that exist; `replicas` and `old_replicas` are what a
    `scale` update asks for and what it had (None when unreadable; absent is 0, the field is omitempty)."""

    operation: str
    group_resource: GroupResource  # with "/<subresource>" for a subresource
    namespace: str
    name: str
    labels: tuple[Mapping[str, str], ...] = ()
    replicas: int | None = None
    old_replicas: int | None = None


def call_of(*, operation: str, group_resource: GroupResource, namespace: str, name: str,
            obj: Mapping[str, Any] | None, old: Mapping[str, Any] | None) -> Call:
    """A Call from the pieces of an admission request (`name` as `request.name`, possibly "")."""
    if not name and isinstance(old, Mapping):
        name = str(_metadata(old).get("name") or "")
    labels = tuple(_labels(o) for o in (obj, old) if isinstance(o, Mapping))
    if group_resource.resource.endswith(f"/{SCALE}"):
        return Call(operation, group_resource, namespace, name, labels, _scale_replicas(obj), _scale_replicas(old))
    return Call(operation, group_resource, namespace, name, labels)


def _scale_replicas(scale: Mapping[str, Any] | None) -> int | None:
    """A Scale's spec.replicas: 0 when absent (omitempty), None when there is no Scale or it is not a number."""
    if not isinstance(scale, Mapping):
        return None
    spec = scale.get("spec")
    value = spec.get("replicas", 0) if isinstance(spec, Mapping) else 0
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def covers(route: Route, call: Call) -> bool:
    """Whether `route` sends `call` to the gate (what the rendered webhook does, as a Python predicate)."""
    if call.operation != route.operation or call.group_resource != route.group_resource:
        return False
    if not call.name:
        return True  # nothing identifies the object: the gate decides (and refuses what it cannot identify)
    if route.namespace is not None and call.namespace != route.namespace:
        return False
    if route.name is not None:
        return call.name == route.name
    if route.selector is not None:
        return any(route.selector.matches(labels) for labels in call.labels or ({},))
    if route.to_zero or route.replicas_change:
        zero = route.to_zero and (call.replicas is None or call.replicas == 0)
        change = route.replicas_change and (call.replicas is None or call.replicas != call.old_replicas)
        return zero or change
    return True


# Whether an object carries the gate's labels (protectionlabels.carries on the cached object): a route by name is
# not needed for an object whose label the shipped configuration already routes, on every API server.
Carried = Callable[[ObjectRef, frozenset[str]], bool]


def needed_routes(cs: CriticalService, provider_type: ResourceType, carried: Carried | None = None) -> frozenset[Route]:
    """Every route `cs` needs, beyond the shipped configuration's, for its provider of type `provider_type`.

    With `carried` (the shipped configuration routes the gate's labels), an object by name whose label is stored
    needs no route of its own: the label routes its DELETE (and held UPDATE) on every API server. The routes by
    name stay for what does not exist yet or is not labelled yet - a provider created under the name of an
    absent one is routed from its CREATE on, until the gate labels it - and the routes by selector and of
    `scale` (a Scale carries no labels) stay whole."""
    gr = provider_type.group_resource
    if gr in EXEMPT:
        return frozenset()
    provider = cs.provider
    namespace = provider.namespace or None

    def unless_labelled(route: Route, ref: ObjectRef,
                        labels: frozenset[str] = frozenset({PROTECTED_LABEL})) -> set[Route]:
        return set() if carried is not None and carried(ref, labels) else {route}

    if isinstance(provider, ObjectRef):
        narrow: dict[str, Any] = {"namespace": namespace if provider_type.namespaced else None, "name": provider.name}
        ref = ObjectRef(gr, provider.namespace if provider_type.namespaced else "", provider.name)
        routes = unless_labelled(Route("DELETE", gr, **narrow), ref)
    else:
        narrow = {"namespace": namespace if provider_type.namespaced else None, "selector": provider.selector}
        routes = {Route("DELETE", gr, **narrow)}
    if provider_type.namespaced:
        # Deleting the namespace would take the provider down; a selector without a namespace may gain a
        # member in any namespace at any moment, so every namespace DELETE must reach the gate.
        routes |= unless_labelled(Route("DELETE", NAMESPACES, name=namespace), ObjectRef(NAMESPACES, "", namespace)) \
            if namespace else {Route("DELETE", NAMESPACES)}
    if "." in gr.group:
        # A CRD's name is <plural>.<group>, and a CRD's group has a dot (the API server enforces both): CRD
        # cleanup deletes the instances without admission, so the CRD's DELETE is the provider's.
        crd = f"{gr.resource}.{gr.group}"
        routes |= unless_labelled(Route("DELETE", CRDS, name=crd), ObjectRef(CRDS, "", crd))
    if cs.hold_updates == HoldUpdates.WHILE_BLOCKING or cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING:
        update = Route("UPDATE", gr, **narrow)
        routes |= unless_labelled(update, ref, frozenset({PROTECTED_LABEL, UPDATES_HELD_LABEL})) \
            if isinstance(provider, ObjectRef) else {update}
    # `kubectl scale` updates the `scale` subresource: held updates hold a change of replicas there too, and
    # scaleToZero refuses 0 there (decision._decide_update).
    hold, to_zero = cs.hold_updates == HoldUpdates.WHILE_BLOCKING, cs.scale_to_zero == ScaleToZero.DENY_WHILE_BLOCKING
    if hold or to_zero:
        scale = GroupResource(gr.group, f"{gr.resource}/{SCALE}")
        if isinstance(provider, ObjectRef):
            routes.add(Route("UPDATE", scale, **narrow))
        else:  # a Scale carries no labels to select on: narrowed by what the update asks for instead
            routes.add(Route("UPDATE", scale, namespace=narrow["namespace"], to_zero=to_zero, replicas_change=hold))
    return frozenset(routes)


@attrs.frozen
class RouteKey:
    """What a CriticalService's routes depend on: its name and the spec fields needed_routes reads. Not the
    whole value, whose status-fed fields (provider_uid, deletion_timestamp) change as the status writer writes:
    a key on those would make Ready flap after every status write until the router's next round."""

    name: str
    provider: Any
    hold_updates: HoldUpdates
    scale_to_zero: ScaleToZero


def route_key(cs: CriticalService) -> RouteKey:
    return RouteKey(cs.name, cs.provider, cs.hold_updates, cs.scale_to_zero)


@attrs.frozen
class Desired:
    """What the CriticalServices need routed: per CriticalService (by route_key) its routes, and the served
    version and scope of every provider type (a webhook rule names both)."""

    needs: Mapping[RouteKey, frozenset[Route]]
    types: Mapping[GroupResource, ResourceType]

    @property
    def routes(self) -> frozenset[Route]:
        return frozenset().union(*self.needs.values())


def desired(services: Iterable[CriticalService], lookup: Callable[[GroupResource], ResourceType | None],
            carried: Carried | None = None, *,
            needed: Callable[[CriticalService, ResourceType], frozenset[Route]] | None = None) -> Desired:
    """The routes the owned configuration must hold. A provider whose type is not served gets none (no
    request for it can come); it is routed once discovery or a CRD makes the type known. `carried`: as for
    needed_routes; `needed`: needed_routes with `carried` (a caller may remember what did not change)."""
    needs: dict[RouteKey, frozenset[Route]] = {}
    types: dict[GroupResource, ResourceType] = {}
    for cs in services:
        t = lookup(cs.provider.group_resource)
        if t is None:
            continue
        types[t.group_resource] = t
        needs[route_key(cs)] = needed(cs, t) if needed is not None else needed_routes(cs, t, carried)
    return Desired(needs, types)



# --- what status needs ----------------------------------------------------------------------------------
@attrs.frozen
class Routing:
    """What status needs to know about routing (criticalsvc/status.py), as the router last saw it.

    `managed`: the gate writes the owned configuration (serve --manage-provider-webhooks).
    `needs`: each cached CriticalService's routes, as the router computed them (absent: not yet).
    `written`: the routes of the configuration as last written or read; `live`: those the API server was
    seen routing (the probe came back with the digest of a configuration holding them).
    `broad`: routes sent more broadly than they need, and why. `error`: why the last sync failed, or None.
    `labelled`: the shipped configuration, as last read, routes the gate's labels (routes_labels)."""

    managed: bool = False
    needs: Mapping[RouteKey, frozenset[Route]] = attrs.field(factory=dict)
    written: frozenset[Route] = frozenset()
    live: frozenset[Route] = frozenset()
    broad: Mapping[Route, str] = attrs.field(factory=dict)
    error: str | None = None
    labelled: bool = False

    def needs_of(self, cs: CriticalService) -> frozenset[Route] | None:
        """The routes `cs` needs as the router last computed them; None: not computed yet for this spec."""
        return self.needs.get(route_key(cs))

    def enforced(self, cs: CriticalService) -> bool:
        needs = self.needs_of(cs)
        return needs is not None and needs <= self.live


def routes_labels(shipped: Mapping[str, Any] | None) -> bool:
    """Whether the shipped configuration routes DELETEs and label-removing UPDATEs by the gate's labels."""
    names = {w.get("name") for w in (shipped or {}).get("webhooks") or [] if isinstance(w, Mapping)}
    return {LABELS_WEBHOOK, LABELLED_UPDATES_WEBHOOK} <= names


def not_routed(cs: CriticalService, provider_type: GroupResource) -> str:
    """Why a provider is not protected when the gate does not write its routes, and what to do about it.

    Short enough for an admission warning (256 characters)."""
    return (f"the gate does not manage its routes (--no-manage-provider-webhooks), and the shipped configuration "
            f"sends no DELETE of {provider_type}: add a webhook for {cs.provider} or let the gate route it")


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    md = obj.get("metadata")
    return md if isinstance(md, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _metadata(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}
