"""The facts `discover` and the diagnosis reason about, typed at the boundary (pure).

An `InventoryBuilder` takes objects one at a time - from a snapshot's manifests or a live LIST page, whole
or metadata-only (PartialObjectMetadata) - and keeps of each only what a question below needs:

    webhook configurations   each webhook's clientConfig (service or url), failurePolicy and rules
    CRDs                     the conversion webhook's service, if any
    APIServices              spec.service and the Available condition
    Services, EndpointSlices the selector; the endpoints' pods and readiness
    Pods, ReplicaSets        labels and the controller ownerReference (metadata is enough)
    Deployments, StatefulSets, DaemonSets   pod template labels, serviceAccountName, replicas
    Namespaces               phase, conditions, spec.finalizers
    RBAC                     roles and bindings (a snapshot's stand-in for SubjectAccessReviews)
    any object               its finalizers (counted per type) and, when it is terminating, itself

Malformed pieces are skipped, not raised: discovery reads what a cluster holds, and an API server has
already validated it; a hand-written snapshot with a broken webhook simply yields no proposal for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..api import CRDS, NAMESPACES, GroupResource, ObjectRef

VALIDATING = GroupResource("admissionregistration.k8s.io", "validatingwebhookconfigurations")
MUTATING = GroupResource("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
APISERVICES = GroupResource("apiregistration.k8s.io", "apiservices")
SERVICES = GroupResource("", "services")
ENDPOINTSLICES = GroupResource("discovery.k8s.io", "endpointslices")
PODS = GroupResource("", "pods")
REPLICASETS = GroupResource("apps", "replicasets")
DEPLOYMENTS = GroupResource("apps", "deployments")
STATEFULSETS = GroupResource("apps", "statefulsets")
DAEMONSETS = GroupResource("apps", "daemonsets")
WORKLOAD_TYPES = (DEPLOYMENTS, STATEFULSETS, DAEMONSETS)
CLUSTERROLES = GroupResource("rbac.authorization.k8s.io", "clusterroles")
CLUSTERROLEBINDINGS = GroupResource("rbac.authorization.k8s.io", "clusterrolebindings")
ROLES = GroupResource("rbac.authorization.k8s.io", "roles")
ROLEBINDINGS = GroupResource("rbac.authorization.k8s.io", "rolebindings")
# The types read whole (their spec or status matters); every other type is read metadata-only.
WHOLE = frozenset({VALIDATING, MUTATING, CRDS, APISERVICES, SERVICES, ENDPOINTSLICES, NAMESPACES, *WORKLOAD_TYPES,
                   CLUSTERROLES, CLUSTERROLEBINDINGS, ROLES, ROLEBINDINGS})
# Read for their metadata (labels, ownerReferences), not only for finalizers.
OWNED = frozenset({PODS, REPLICASETS})
# The EndpointSlice label naming its Service (discovery/v1 LabelServiceName).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
EXAMPLES = 3  # objects named per finalizer: enough to look at, short enough for a comment
MAX_TERMINATING = 10_000  # terminating objects kept for the diagnosis; past that, a cluster has other problems


@attrs.frozen
class ServiceRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"Service {self.namespace}/{self.name}"


@attrs.frozen
class Rule:
    """One admission rule of a webhook (admissionregistration/v1 RuleWithOperations)."""

    operations: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]

    def __str__(self) -> str:
        operations = "every operation" if "*" in self.operations else "/".join(self.operations)
        resources = "every resource" if "*" in self.resources else ",".join(self.resources)
        groups = "every group" if "*" in self.api_groups else ",".join(g or "core" for g in self.api_groups)
        return f"{operations} of {resources} ({groups})"


@attrs.frozen
class Webhook:
    configuration: GroupResource  # VALIDATING or MUTATING
    configuration_name: str
    name: str
    service: ServiceRef | None
    url: str | None
    failure_policy: str  # Fail (the v1 default) or Ignore
    rules: tuple[Rule, ...]
    namespace_selector: bool  # a non-empty namespaceSelector narrows it
    object_selector: bool

    @property
    def configuration_ref(self) -> ObjectRef:
        return ObjectRef(self.configuration, "", self.configuration_name)

    @property
    def kind(self) -> str:
        return "ValidatingWebhookConfiguration" if self.configuration == VALIDATING else \
            "MutatingWebhookConfiguration"


@attrs.frozen
class Conversion:
    """A CRD whose conversion strategy is Webhook."""

    crd_name: str
    service: ServiceRef | None
    url: str | None


@attrs.frozen
class APIService:
    name: str
    service: ServiceRef | None  # None: served by kube-apiserver itself (a "Local" APIService)
    available: str | None  # the Available condition's status, None when absent
    reason: str = ""
    message: str = ""


@attrs.frozen
class Service:
    namespace: str
    name: str
    selector: tuple[tuple[str, str], ...] | None  # None: no selector (endpoints managed by hand)


@attrs.frozen
class Endpoint:
    pod: ObjectRef | None  # targetRef when it names a Pod
    ready: bool


@attrs.frozen
class EndpointSlice:
    namespace: str
    service_name: str
    endpoints: tuple[Endpoint, ...]


@attrs.frozen
class Owned:
    """A Pod or ReplicaSet: its labels and controller (kind, name), if any."""

    ref: ObjectRef
    labels: tuple[tuple[str, str], ...]
    controller: tuple[str, str] | None
    deletion_timestamp: str | None = None


@attrs.frozen
class Workload:
    """A Deployment, StatefulSet or DaemonSet."""

    ref: ObjectRef
    labels: tuple[tuple[str, str], ...]
    template_labels: tuple[tuple[str, str], ...]
    service_account: str
    replicas: int | None  # None for a DaemonSet
    available: int | None
    deletion_timestamp: str | None = None

    @property
    def kind(self) -> str:
        return {DEPLOYMENTS: "Deployment", STATEFULSETS: "StatefulSet", DAEMONSETS: "DaemonSet"}[
            self.ref.group_resource]


@attrs.frozen
class NamespaceCondition:
    type: str
    status: str
    reason: str
    message: str


@attrs.frozen
class Namespace:
    name: str
    phase: str
    conditions: tuple[NamespaceCondition, ...]
    deletion_timestamp: str | None
    spec_finalizers: tuple[str, ...] = ()


@attrs.frozen
class FinalizerUse:
    """A finalizer found on live objects of one type."""

    group_resource: GroupResource
    finalizer: str
    count: int
    namespaces: frozenset[str]
    examples: tuple[ObjectRef, ...]
    terminating: int = 0  # how many of them are being deleted (waiting for it now)


@attrs.frozen
class Terminating:
    ref: ObjectRef
    finalizers: tuple[str, ...]
    deletion_timestamp: str


@attrs.frozen
class PolicyRule:
    verbs: tuple[str, ...]
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    resource_names: tuple[str, ...] = ()


@attrs.frozen
class Role:
    namespace: str  # "" for a ClusterRole
    name: str
    rules: tuple[PolicyRule, ...]


@attrs.frozen
class Subject:
    kind: str
    namespace: str
    name: str


@attrs.frozen
class Binding:
    namespace: str  # "" for a ClusterRoleBinding
    name: str
    role_kind: str  # ClusterRole or Role
    role_name: str
    subjects: tuple[Subject, ...]


@attrs.frozen
class Inventory:
    webhooks: tuple[Webhook, ...] = ()
    conversions: tuple[Conversion, ...] = ()
    apiservices: tuple[APIService, ...] = ()
    services: tuple[Service, ...] = ()
    endpoint_slices: tuple[EndpointSlice, ...] = ()
    pods: tuple[Owned, ...] = ()
    replicasets: tuple[Owned, ...] = ()
    workloads: tuple[Workload, ...] = ()
    namespaces: tuple[Namespace, ...] = ()
    finalizers: tuple[FinalizerUse, ...] = ()
    terminating: tuple[Terminating, ...] = ()
    roles: tuple[Role, ...] = ()
    bindings: tuple[Binding, ...] = ()
    # Whether RBAC objects were read (a snapshot without them cannot answer access questions).
    has_rbac: bool = False
    objects: int = 0  # how many objects were read, of every type

    def service(self, ref: ServiceRef) -> Service | None:
        return next((s for s in self.services if s.namespace == ref.namespace and s.name == ref.name), None)

    def workload(self, ref: ObjectRef) -> Workload | None:
        return next((w for w in self.workloads if w.ref == ref), None)

    def namespace(self, name: str) -> Namespace | None:
        return next((n for n in self.namespaces if n.name == name), None)


def _m(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _l(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _s(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _labels(value: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in _m(value).items() if isinstance(k, str) and isinstance(v, str)))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _service_ref(client_config: Mapping[str, Any], default_namespace: str = "") -> ServiceRef | None:
    svc = _m(client_config.get("service"))
    name = _s(svc.get("name"))
    namespace = _s(svc.get("namespace")) or default_namespace
    return ServiceRef(namespace, name) if name and namespace else None


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in _l(value) if isinstance(v, str))


class InventoryBuilder:
    """Collects an Inventory from objects, one at a time (see the module docstring)."""

    def __init__(self) -> None:
        self.webhooks: list[Webhook] = []
        self.conversions: list[Conversion] = []
        self.apiservices: list[APIService] = []
        self.services: list[Service] = []
        self.slices: list[EndpointSlice] = []
        self.pods: list[Owned] = []
        self.replicasets: list[Owned] = []
        self.workloads: list[Workload] = []
        self.namespaces: list[Namespace] = []
        self.roles: list[Role] = []
        self.bindings: list[Binding] = []
        self.has_rbac = False
        self.objects = 0
        self.terminating: list[Terminating] = []
        # (type, finalizer) -> [count, namespaces, examples, terminating]
        self._finalizers: dict[tuple[GroupResource, str], list[Any]] = {}

    def add_all(self, gr: GroupResource, objs: Iterable[Mapping[str, Any]]) -> None:
        for obj in objs:
            self.add(gr, obj)

    def add(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        """One object of type `gr`, whole or metadata-only."""
        metadata = _m(obj.get("metadata"))
        name = _s(metadata.get("name"))
        if not name:
            return
        self.objects += 1
        namespace = _s(metadata.get("namespace"))
        ref = ObjectRef(gr, namespace, name)
        deletion = _s(metadata.get("deletionTimestamp")) or None
        finalizers = _strs(metadata.get("finalizers"))
        for f in finalizers:
            entry = self._finalizers.setdefault((gr, f), [0, set(), [], 0])
            entry[0] += 1
            entry[1].add(namespace)
            if len(entry[2]) < EXAMPLES:
                entry[2].append(ref)
            entry[3] += deletion is not None
        if deletion is not None and len(self.terminating) < MAX_TERMINATING:
            self.terminating.append(Terminating(ref, finalizers, deletion))
        spec, status = _m(obj.get("spec")), _m(obj.get("status"))
        if gr in (VALIDATING, MUTATING):
            self._webhooks(gr, name, obj)
        elif gr == CRDS:
            conversion = _m(spec.get("conversion"))
            if conversion.get("strategy") == "Webhook":
                cc = _m(_m(conversion.get("webhook")).get("clientConfig"))
                self.conversions.append(Conversion(name, _service_ref(cc), _s(cc.get("url")) or None))
        elif gr == APISERVICES:
            condition = next((c for c in map(_m, _l(status.get("conditions"))) if c.get("type") == "Available"), {})
            self.apiservices.append(APIService(
                name, _service_ref(spec), _s(condition.get("status")) or None, _s(condition.get("reason")),
                _s(condition.get("message"))))
        elif gr == SERVICES:
            selector = spec.get("selector")
            self.services.append(Service(namespace, name, _labels(selector) if isinstance(selector, Mapping) and
                                         selector else None))
        elif gr == ENDPOINTSLICES:
            endpoints = []
            for e in map(_m, _l(obj.get("endpoints"))):
                target = _m(e.get("targetRef"))
                pod = ObjectRef(PODS, _s(target.get("namespace")) or namespace, _s(target.get("name"))) \
                    if target.get("kind") == "Pod" and target.get("name") else None
                # discovery/v1 EndpointConditions: a nil ready is to be read as ready.
                endpoints.append(Endpoint(pod, _m(e.get("conditions")).get("ready") is not False))
            service = _s(_m(metadata.get("labels")).get(SERVICE_NAME_LABEL))
            if service:
                self.slices.append(EndpointSlice(namespace, service, tuple(endpoints)))
        elif gr in OWNED:
            controller = next(((_s(o.get("kind")), _s(o.get("name"))) for o in map(_m, _l(metadata.get(
                "ownerReferences"))) if o.get("controller") is True), None)
            owned = self.pods if gr == PODS else self.replicasets
            owned.append(Owned(ref, _labels(metadata.get("labels")), controller, deletion))
        elif gr in WORKLOAD_TYPES:
            template = _m(spec.get("template"))
            pod_spec = _m(template.get("spec"))
            replicas = None if gr == DAEMONSETS else _int(spec.get("replicas", 1))
            ready = _int(status.get("numberAvailable" if gr == DAEMONSETS else "availableReplicas", 0))
            self.workloads.append(Workload(
                ref, _labels(metadata.get("labels")), _labels(_m(template.get("metadata")).get("labels")),
                _s(pod_spec.get("serviceAccountName")) or _s(pod_spec.get("serviceAccount")) or "default",
                replicas, ready, deletion))
        elif gr == NAMESPACES:
            conditions = tuple(NamespaceCondition(_s(c.get("type")), _s(c.get("status")), _s(c.get("reason")),
                                                  _s(c.get("message"))) for c in map(_m, _l(status.get("conditions"))))
            self.namespaces.append(Namespace(name, _s(status.get("phase")), conditions, deletion,
                                             _strs(spec.get("finalizers"))))
        elif gr in (CLUSTERROLES, ROLES):
            self.has_rbac = True
            rules = tuple(PolicyRule(_strs(r.get("verbs")), _strs(r.get("apiGroups")), _strs(r.get("resources")),
                                     _strs(r.get("resourceNames"))) for r in map(_m, _l(obj.get("rules"))))
            self.roles.append(Role(namespace if gr == ROLES else "", name, rules))
        elif gr in (CLUSTERROLEBINDINGS, ROLEBINDINGS):
            self.has_rbac = True
            role = _m(obj.get("roleRef"))
            subjects = tuple(Subject(_s(s.get("kind")), _s(s.get("namespace")), _s(s.get("name")))
                             for s in map(_m, _l(obj.get("subjects"))))
            self.bindings.append(Binding(namespace if gr == ROLEBINDINGS else "", name, _s(role.get("kind")),
                                         _s(role.get("name")), subjects))

    def _webhooks(self, gr: GroupResource, configuration: str, obj: Mapping[str, Any]) -> None:
        for w in map(_m, _l(obj.get("webhooks"))):
            cc = _m(w.get("clientConfig"))
            rules = tuple(Rule(_strs(r.get("operations")), _strs(r.get("apiGroups")), _strs(r.get("resources")))
                          for r in map(_m, _l(w.get("rules"))))
            self.webhooks.append(Webhook(
                gr, configuration, _s(w.get("name")), _service_ref(cc), _s(cc.get("url")) or None,
                _s(w.get("failurePolicy")) or "Fail", rules,
                bool(_m(w.get("namespaceSelector")).get("matchLabels") or
                     _m(w.get("namespaceSelector")).get("matchExpressions")),
                bool(_m(w.get("objectSelector")).get("matchLabels") or
                     _m(w.get("objectSelector")).get("matchExpressions"))))

    def build(self) -> Inventory:
        uses = tuple(FinalizerUse(gr, f, count, frozenset(nss), tuple(examples), term)
                     for (gr, f), (count, nss, examples, term) in sorted(self._finalizers.items()))
        return Inventory(tuple(self.webhooks), tuple(self.conversions), tuple(self.apiservices), tuple(self.services),
                         tuple(self.slices), tuple(self.pods), tuple(self.replicasets), tuple(self.workloads),
                         tuple(self.namespaces), uses, tuple(self.terminating), tuple(self.roles),
                         tuple(self.bindings), self.has_rbac, self.objects)


def from_objects(objs: Iterable[Mapping[str, Any]]) -> Inventory:
    """The inventory of a snapshot: whole objects (`kubectl get ... -o yaml`), their types from their apiVersion
    and kind, the snapshot's own CRDs first so that a custom resource maps to its plural."""
    from ..restmapper import RESTMapper

    objs = [o for o in objs if isinstance(o, Mapping)]
    mapper = RESTMapper()
    for o in objs:
        if o.get("kind") == "CustomResourceDefinition":
            mapper.learn_crd(o)
    builder = InventoryBuilder()
    for o in objs:
        builder.add(mapper.resource_for_kind(_s(o.get("apiVersion")), _s(o.get("kind"))), o)
    return builder.build()
