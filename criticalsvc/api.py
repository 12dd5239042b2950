"""The CriticalService API (criticalsvc.io/v1alpha1) as frozen value types, and its parser.

The parser is the single place where the CR's JSON becomes typed values. Every rule the CRD's
OpenAPI schema states is checked here again, because the webhook also sees objects that bypassed
the schema (a snapshot file, an older CRD version, `kubectl --validate=false` against a stand-in).
Errors carry the path of the offending field: `spec.criteria[1].finalizer.finalizerName: required`.

Resource names are kept as written. A `resource` may be a plural resource (`customresourcedefinitions`)
or a Kind (`CustomResourceDefinition`, as in the design's own example); the REST mapper resolves it
when the criteria are evaluated, because the CRD that serves it may be created after the
CriticalService (freedom of creation order is the point of the design).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import attrs

from .condition import Condition, compile_condition
from .errors import InvalidSpec
from .labels import LabelSelector, parse_label_selector

GROUP = "criticalsvc.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "CriticalService"
PLURAL = "criticalservices"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Annotations and labels the gate reads from the object being deleted.
BREAK_GLASS_ANNOTATION = f"{GROUP}/break-glass"
DELETION_PROTECTED_LABEL = f"{GROUP}/deletion-protected"
DELETION_PROTECTED_ALWAYS = "Always"
# Labels the gate's leader writes on what a CriticalService protects (criticalsvc/protectionlabels.py): the
# shipped configuration routes a DELETE of anything carrying PROTECTED_LABEL, and an UPDATE of it that removes
# the label or that UPDATES_HELD_LABEL asks to see, by objectSelector - evaluated on the stored object by every
# API server alike, so no configuration lag can open a window (design/routing.md).
PROTECTED_LABEL = f"{GROUP}/protected"
UPDATES_HELD_LABEL = f"{GROUP}/updates-held"
LABEL_VALUE = "true"
# On an object: `criticalsvc.io/replay-deletion: Never` cancels a recorded deletion intent for it and
# keeps new ones from being recorded (criticalsvc/replay.py).
REPLAY_DELETION_ANNOTATION = f"{GROUP}/replay-deletion"
# The CRD's maxItems for spec.criteria (api/criticalservices.criticalsvc.io.yaml; tests/test_api.py keeps
# the two equal): the API server enforces it on writes, and the parser too, so that a snapshot or a
# review the API server never saw cannot hand `decide` an unbounded list to walk on every DELETE.
MAX_CRITERIA = 64

# DNS-1123 subdomain (object names) and label (namespaces), as apimachinery validates them.
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A resource is a lowercase plural or a Kind; both are DNS-label-ish words without dots.
_RESOURCE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
# metav1 finalizer names are qualified names: optional DNS prefix, '/', name.
_FINALIZER = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


# cache_hash: a group/resource is a dict key on every lookup of every decision (indexes, the REST
# mapper), and the instances are long-lived and shared, so hashing once per instance pays.
@attrs.frozen(order=True, cache_hash=True)
class GroupResource:
    """A resource within an API group; the core group is ""."""

    group: str
    resource: str

    def __str__(self) -> str:
        # kubectl's spelling: `deployments.apps`, `pods` for the core group.
        return f"{self.resource}.{self.group}" if self.group else self.resource


NAMESPACES = GroupResource("", "namespaces")
# The provider types whose DELETEs the shipped webhook configuration sends to the gate
# (deploy/base/webhook.yaml, rule "workloads"; tests/test_deploy.py keeps the two equal). A provider of
# another type is routed by the gate's own configuration criticalsvc-providers (criticalsvc/routing.py),
# or, with serve --no-manage-provider-webhooks, only through its namespace until the operator adds a rule.
ROUTED_PROVIDERS = frozenset({GroupResource("apps", "deployments"), GroupResource("apps", "statefulsets"),
                              GroupResource("apps", "daemonsets")})
CRDS = GroupResource("apiextensions.k8s.io", "customresourcedefinitions")
CRITICAL_SERVICES = GroupResource(GROUP, PLURAL)
# Every type whose DELETEs the shipped configuration sends to the gate: the workloads rule plus the
# namespaces, CRDs and CriticalServices rules. A provider of one of these types is gated itself.
GATED_DELETES = ROUTED_PROVIDERS | {NAMESPACES, CRDS, CRITICAL_SERVICES}


@attrs.frozen(order=True, cache_hash=True)  # a key of the caches, the routes and the labels: hashed very often
class ObjectRef:
    """One object: its group/resource, namespace ("" when cluster-scoped) and name."""

    group_resource: GroupResource
    namespace: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return f"{self.group_resource} {self.key}"


@attrs.frozen
class ProviderSelector:
    """A provider that is a set: every object of `group_resource` (in `namespace`, when given) whose labels
    match `selector` - "every PVC labelled app=db in namespace shop" (spec.provider.selector, issue 11).

    The set is evaluated whenever the gate decides, like a named provider is looked up then: an object
    labelled into it later is protected from then on, and one relabelled out of it is not.
    """

    group_resource: GroupResource
    namespace: str | None
    selector: LabelSelector

    def matches(self, namespace: str, labels: Mapping[str, str]) -> bool:
        """Is an object of this type, in `namespace` ("" when cluster-scoped) with `labels`, in the set?"""
        return (self.namespace is None or namespace == self.namespace) and self.selector.matches(labels)

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        sel = f" matching {self.selector}" if not self.selector.is_empty else ""
        return f"every {self.group_resource}{where}{sel}"


# What spec.provider names: one object, or a set of them by label selector.
Provider = ObjectRef | ProviderSelector


class Enforcement(enum.StrEnum):
    ENFORCE = "Enforce"
    WARN = "Warn"


class ReplayDeletion(enum.StrEnum):
    """spec.replayDeletion: may the gate re-issue a DELETE it refused, once the criteria hold?

    Never (the default) leaves retrying to the deleter. WhenTearingDown records a refused deletion as
    an intent and replays it when the criteria are met, but only while everything still blocking it is
    itself going away (criticalsvc/replay.py; design/replay.md).
    """

    NEVER = "Never"
    WHEN_TEARING_DOWN = "WhenTearingDown"


class HoldUpdates(enum.StrEnum):
    """spec.holdUpdates: are UPDATEs of the provider held while its criteria are unmet?

    WhileBlocking is the object-lock design: the provider is the locked object and a criterion names
    the lock. An update that only removes finalizers, or touches only status or bookkeeping metadata,
    is never held, because holding it would wedge the very teardown the gate orders.
    """

    NEVER = "Never"
    WHILE_BLOCKING = "WhileBlocking"


class RecreatedProvider(enum.StrEnum):
    """spec.recreatedProvider: what the CriticalService does when its named provider is deleted and re-created
    under the same name (a new uid) - the seed's "best-effort/orphan" intent (design/criticalservice.md §6).

    Protect (the default) protects the new object as it protected the old one, so the CriticalService goes only
    after it. Orphan lets the CriticalService's own DELETE through while the object under the provider's name
    is not the one it protected before (status.previousProviderUID) and every criterion holds, leaving the new
    object unprotected; it never lets a provider's DELETE through. Settable at any time, meant to be set on a
    teardown stuck behind a re-created provider.
    """

    PROTECT = "Protect"
    ORPHAN = "Orphan"


class ScaleToZero(enum.StrEnum):
    """spec.scaleToZero: may the provider workload be scaled to zero replicas while its criteria are
    unmet (through its spec or its scale subresource)? A controller scaled to zero removes no finalizer."""

    ALLOW = "Allow"
    DENY_WHILE_BLOCKING = "DenyWhileBlocking"


@attrs.frozen
class FinalizerCriterion:
    """Met when no object of `group_resource` still carries `finalizer_name`."""

    group_resource: GroupResource
    finalizer_name: str
    condition: Condition | None = None

    def __str__(self) -> str:
        return f"no {self.group_resource} carries finalizer {self.finalizer_name}{_where(self.condition)}"


@attrs.frozen
class SpecificResourceCriterion:
    """Met when the object `target` no longer exists (a terminating object still exists)."""

    target: ObjectRef
    condition: Condition | None = None

    def __str__(self) -> str:
        return f"{self.target} is gone{_where(self.condition)}"


@attrs.frozen
class ResourcesCriterion:
    """Met when no object of `group_resource` (in `namespace`, matching `selector`) exists."""

    group_resource: GroupResource
    namespace: str | None
    selector: LabelSelector
    condition: Condition | None = None

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        sel = f" matching {self.selector}" if not self.selector.is_empty else ""
        return f"no {self.group_resource}{where}{sel} exists{_where(self.condition)}"


Criterion = FinalizerCriterion | SpecificResourceCriterion | ResourcesCriterion


def _where(condition: Condition | None) -> str:
    # Every criterion type may carry one (criticalsvc/condition.py): only objects it is true for count.
    return f" (counting only objects where {condition})" if condition is not None else ""

_E = TypeVar("_E", bound=enum.StrEnum)
_CRITERION_MEMBERS = {"Finalizer": "finalizer", "SpecificResource": "specificResource", "Resources": "resources"}


@attrs.frozen
class CriticalService:
    """A parsed CriticalService: what it protects, and when that may go away."""

    name: str
    provider: Provider
    criteria: tuple[Criterion, ...]
    enforcement: Enforcement = Enforcement.ENFORCE
    replay_deletion: ReplayDeletion = ReplayDeletion.NEVER
    hold_updates: HoldUpdates = HoldUpdates.NEVER
    scale_to_zero: ScaleToZero = ScaleToZero.ALLOW
    recreated_provider: RecreatedProvider = RecreatedProvider.PROTECT
    uid: str = ""
    labels: Mapping[str, str] = attrs.field(factory=dict, eq=False, hash=False)
    deletion_timestamp: str | None = None
    provider_uid: str | None = None
    # status.previousProviderUID: the uid the provider had before the one in provider_uid (a re-creation the
    # gate saw); what spec.recreatedProvider: Orphan compares against.
    previous_provider_uid: str | None = None

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(CRITICAL_SERVICES, "", self.name)


def parse_critical_service(obj: Any, *, lenient_conditions: bool = False) -> CriticalService:
    """A CriticalService object (the whole CR as JSON) -> CriticalService; raises InvalidSpec.

    `lenient_conditions`: a condition that does not compile is kept as one that errors on every
    object (so each counts) instead of refusing the whole spec; for states, which must not drop a
    stored CriticalService's protection (criticalsvc/condition.py, `compile_condition`).
    """
    if not isinstance(obj, Mapping):
        raise InvalidSpec("", "a CriticalService must be a JSON object")
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise InvalidSpec("metadata", "required")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidSpec("metadata.name", "required")
    if metadata.get("namespace"):
        raise InvalidSpec("metadata.namespace", "CriticalService is cluster-scoped; remove the namespace")
    spec = parse_spec(obj.get("spec"), lenient_conditions=lenient_conditions)
    status: Mapping[str, Any] = obj["status"] if isinstance(obj.get("status"), Mapping) else {}
    labels: Mapping[str, str] = metadata["labels"] if isinstance(metadata.get("labels"), Mapping) else {}
    provider_uid = status.get("providerUID")
    previous_uid = status.get("previousProviderUID")
    return attrs.evolve(
        spec,
        name=name,
        uid=str(metadata.get("uid") or ""),
        labels=dict(labels),
        deletion_timestamp=metadata.get("deletionTimestamp") or None,
        provider_uid=provider_uid if isinstance(provider_uid, str) else None,
        previous_provider_uid=previous_uid if isinstance(previous_uid, str) and previous_uid else None,
    )


def parse_spec(spec: Any, *, lenient_conditions: bool = False) -> CriticalService:
    """Parse `.spec`; the result has an empty name (the caller fills in metadata)."""
    if not isinstance(spec, Mapping):
        raise InvalidSpec("spec", "required")
    _no_unknown(spec, {"provider", "criteria", "enforcement", "replayDeletion", "holdUpdates", "scaleToZero",
                       "recreatedProvider"}, "spec")
    provider = _parse_provider(spec.get("provider"), "spec.provider")
    raw_enforcement = spec.get("enforcement", Enforcement.ENFORCE.value)
    try:
        enforcement = Enforcement(raw_enforcement)
    except ValueError:
        raise InvalidSpec("spec.enforcement", "must be Enforce or Warn") from None
    raw_replay = spec.get("replayDeletion", ReplayDeletion.NEVER.value)
    try:
        replay_deletion = ReplayDeletion(raw_replay)
    except ValueError:
        raise InvalidSpec("spec.replayDeletion", "must be Never or WhenTearingDown") from None
    hold_updates = _enum(HoldUpdates, spec.get("holdUpdates", HoldUpdates.NEVER.value), "spec.holdUpdates")
    scale_to_zero = _enum(ScaleToZero, spec.get("scaleToZero", ScaleToZero.ALLOW.value), "spec.scaleToZero")
    recreated = _enum(RecreatedProvider, spec.get("recreatedProvider", RecreatedProvider.PROTECT.value),
                      "spec.recreatedProvider")
    if recreated == RecreatedProvider.ORPHAN and isinstance(provider, ProviderSelector):
        # A set has no one object that could be re-created: its members come and go by design.
        raise InvalidSpec("spec.recreatedProvider", "Orphan needs a provider named by spec.provider.name, "
                          "not a selector")
    raw_criteria = spec.get("criteria")
    if not isinstance(raw_criteria, list) or not raw_criteria:
        raise InvalidSpec("spec.criteria", "required: a non-empty list")
    if len(raw_criteria) > MAX_CRITERIA:
        raise InvalidSpec("spec.criteria", too_many(len(raw_criteria), MAX_CRITERIA))
    criteria = tuple(_parse_criterion(c, f"spec.criteria[{i}]", lenient_conditions)
                     for i, c in enumerate(raw_criteria))
    return CriticalService(name="", provider=provider, criteria=criteria, enforcement=enforcement,
                           replay_deletion=replay_deletion, hold_updates=hold_updates, scale_to_zero=scale_to_zero,
                           recreated_provider=recreated)


def _enum(kind: type[_E], raw: Any, path: str) -> _E:
    try:
        return kind(raw)
    except ValueError:
        raise InvalidSpec(path, f"must be {' or '.join(m.value for m in kind)}") from None


def too_many(count: int, limit: int) -> str:
    """The API server's wording for a list over its schema's maxItems."""
    return f"Too many: {count}: must have at most {limit} items"


def _parse_criterion(raw: Any, path: str, lenient_conditions: bool = False) -> Criterion:
    if not isinstance(raw, Mapping):
        raise InvalidSpec(path, "must be an object")
    kind = raw.get("type")
    if not isinstance(kind, str) or kind not in _CRITERION_MEMBERS:  # a list or object is unhashable
        raise InvalidSpec(f"{path}.type", "must be one of Finalizer, SpecificResource, Resources")
    member = _CRITERION_MEMBERS[kind]
    _no_unknown(raw, {"type", "condition", *_CRITERION_MEMBERS.values()}, path)
    # Exactly the member named by `type` is set: a discriminated union, as in Kubernetes APIs.
    for other in _CRITERION_MEMBERS.values():
        if other != member and raw.get(other) is not None:
            raise InvalidSpec(f"{path}.{other}", f"must not be set when type is {kind}")
    body = raw.get(member)
    here = f"{path}.{member}"
    if not isinstance(body, Mapping):
        raise InvalidSpec(here, f"required when type is {kind}")
    condition = compile_condition(raw["condition"], f"{path}.condition", lenient=lenient_conditions) \
        if raw.get("condition") is not None else None
    if kind == "Finalizer":
        _no_unknown(body, {"group", "resource", "finalizerName"}, here)
        finalizer = _required_str(body, "finalizerName", here)
        if not _FINALIZER.fullmatch(finalizer) or len(finalizer) > 316:
            raise InvalidSpec(f"{here}.finalizerName", f"{finalizer!r} is not a valid finalizer name")
        return FinalizerCriterion(_parse_group_resource(body, here), finalizer, condition)
    if kind == "SpecificResource":
        return SpecificResourceCriterion(_parse_object_ref(body, here, name_required=True), condition)
    _no_unknown(body, {"group", "resource", "namespace", "selector"}, here)
    namespace = _optional_namespace(body, here)
    selector = parse_label_selector(body.get("selector"), f"{here}.selector")
    return ResourcesCriterion(_parse_group_resource(body, here), namespace, selector, condition)


def _parse_provider(raw: Any, path: str) -> Provider:
    """One object by name, or (issue 11) every object of the type matching a label selector.

    `selector: {}` is allowed and means every object of the type (in the namespace, when given): that is
    what an empty metav1.LabelSelector means in the Kubernetes API that selects a set to protect, the
    PodDisruptionBudget (policy/v1 PodDisruptionBudgetSpec.selector: "an empty ({}) selector will select
    all pods within the namespace"; https://github.com/kubernetes/api/blob/master/policy/v1/types.go),
    and "every PVC in namespace shop" is a set worth protecting; refusing it would only make users invent
    a label. Because such a set may span the whole cluster, the webhook warns when it has no namespace
    (decision.py, `_spec_warnings`).
    """
    if not isinstance(raw, Mapping):
        raise InvalidSpec(path, "required")
    _no_unknown(raw, {"group", "resource", "namespace", "name", "selector"}, path)
    # A null is absent, as the API server prunes it; the CRD's CEL rule says the same (has()).
    if (raw.get("name") is None) == (raw.get("selector") is None):
        raise InvalidSpec(path, "set exactly one of name and selector")
    if raw.get("selector") is None:
        return _parse_object_ref({k: v for k, v in raw.items() if k != "selector"}, path, name_required=True)
    selector = parse_label_selector(raw["selector"], f"{path}.selector")
    return ProviderSelector(_parse_group_resource(raw, path), _optional_namespace(raw, path), selector)


def _parse_object_ref(raw: Any, path: str, *, name_required: bool) -> ObjectRef:
    if not isinstance(raw, Mapping):
        raise InvalidSpec(path, "required")
    _no_unknown(raw, {"group", "resource", "namespace", "name"}, path)
    gr = _parse_group_resource(raw, path)
    name = _required_str(raw, "name", path) if name_required else str(raw.get("name") or "")
    # Most kinds name objects with DNS-1123 subdomains, but some allow more (e.g. RBAC kinds allow ':'),
    # so only what no kind accepts is rejected.
    if len(name) > 253 or "/" in name:
        raise InvalidSpec(f"{path}.name", f"{name!r} is not a valid object name")
    return ObjectRef(gr, _optional_namespace(raw, path) or "", name)


def _parse_group_resource(raw: Mapping[str, Any], path: str) -> GroupResource:
    group = raw.get("group", "")
    if group is None:
        group = ""
    if not isinstance(group, str):
        raise InvalidSpec(f"{path}.group", "must be a string (\"\" for the core group)")
    if group and not _DNS1123_SUBDOMAIN.fullmatch(group):
        raise InvalidSpec(f"{path}.group", f"{group!r} is not a valid API group")
    resource = _required_str(raw, "resource", path)
    if not _RESOURCE.fullmatch(resource):
        raise InvalidSpec(f"{path}.resource", f"{resource!r} is not a resource name or Kind")
    return GroupResource(group, resource)


def _optional_namespace(raw: Mapping[str, Any], path: str) -> str | None:
    namespace = raw.get("namespace")
    if namespace in (None, ""):
        return None
    if not isinstance(namespace, str) or not _DNS1123_LABEL.fullmatch(namespace) or len(namespace) > 63:
        raise InvalidSpec(f"{path}.namespace", f"{namespace!r} is not a valid namespace name")
    return namespace


def _required_str(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = raw.get(key)
    if value is None or value == "":
        raise InvalidSpec(f"{path}.{key}", "required")
    if not isinstance(value, str):
        raise InvalidSpec(f"{path}.{key}", "must be a string")
    return value


def _no_unknown(raw: Mapping[str, Any], known: set[str], path: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise InvalidSpec(f"{path}.{unknown[0]}", "unknown field")
