"""The slim projection of a Kubernetes object that the gate reasons about.

Caches hold these, never whole client objects: keys, uid, labels, finalizers and deletionTimestamp
are all that a criterion or a decision reads; nothing else of the object is kept.

A cache holds one of these per object of every watched type (hundreds of thousands in a big
cluster), so the projection is built for size (issue 6's goal: <= 500 bytes per cached object):

- labels are a `Labels`: one flat, sorted tuple behind a read-only Mapping (~110 bytes for two
  labels, where a dict costs ~230), because selectors need them but nothing writes them;
- namespaces, finalizer names and label keys are interned, and equal finalizer lists share one
  tuple: thousands of objects share a handful of each, and a JSON decoder hands every object fresh
  copies;
- the outcomes of the conditions that criteria put on the object's type (criticalsvc/condition.py) are
  evaluated once, when the object is projected, and kept as one flat tuple (expression, outcome, ...)
  shared by every object with the same outcomes: a pointer per object, where keeping the `status`
  a condition reads would cost kilobytes;
- a uid in the canonical UUID form the API server generates is held as a 128-bit int (44 bytes, not
  85 for the 36-character string) and rendered back on read; any other uid is kept as given.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from .api import CRDS, GroupResource, ObjectRef
from .condition import Condition, Outcome, evaluate_condition
from .errors import MalformedManifest

_intern = sys.intern


class Labels(tuple, Mapping[str, str]):  # type: ignore[type-arg]
    """An object's labels: an immutable Mapping that *is* one flat tuple (k1, v1, k2, v2, ...) sorted by key.

    Objects carry a few labels each, so a linear scan for `get` is as fast as hashing, and a tuple is
    a third of a dict's size; being the tuple itself (not an object holding one) saves another 40
    bytes per cached object. Every tuple method a Mapping also has is overridden to mean the Mapping
    one. Keys are interned (few distinct keys across a cluster); values are not (an instance label is
    unique per object, and interning it would only add a table entry).
    """

    __slots__ = ()

    def __new__(cls, labels: Mapping[str, str] | None = None) -> Labels:
        flat: list[str] = []
        if labels:
            for key in sorted(labels):
                flat += (_intern(key), labels[key])
        return super().__new__(cls, flat)

    @classmethod
    def of(cls, labels: Mapping[str, str] | None) -> Labels:
        """`labels` as a Labels (as is when it already is one; the shared empty one when empty)."""
        if isinstance(labels, Labels):
            return labels
        return cls(labels) if labels else NO_LABELS

    def __getitem__(self, key: str) -> str:  # type: ignore[override]
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[no-any-return]

    def get(self, key: str, default: Any = None) -> Any:
        getitem, n = tuple.__getitem__, tuple.__len__(self)
        for i in range(0, n, 2):
            if getitem(self, i) == key:
                return getitem(self, i + 1)
        return default

    def __contains__(self, key: object) -> bool:
        return key in tuple.__getitem__(self, slice(0, None, 2))

    def __iter__(self) -> Iterator[str]:
        return iter(tuple.__getitem__(self, slice(0, None, 2)))

    def __len__(self) -> int:
        return tuple.__len__(self) // 2

    def keys(self) -> Any:
        return tuple.__getitem__(self, slice(0, None, 2))

    def items(self) -> Any:
        flat = tuple.__getitem__(self, slice(None))
        return list(zip(flat[::2], flat[1::2], strict=True))

    def values(self) -> Any:
        return tuple.__getitem__(self, slice(1, None, 2))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Labels):
            return tuple.__eq__(self, other)
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return tuple.__hash__(self)

    def __repr__(self) -> str:
        return f"Labels({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Labels, (dict(self.items()),))


_MISSING = object()
NO_LABELS = Labels()


# Distinct finalizer lists in a cluster are few (one or two per controller); more than this many is
# not a cluster we size for, and then lists simply stop being shared.
_SHARED_FINALIZER_LISTS = 4096
_finalizer_lists: dict[tuple[str, ...], tuple[str, ...]] = {}


def _finalizers(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    key = tuple(value)
    shared = _finalizer_lists.get(key)
    if shared is None:
        shared = tuple(_intern(f) for f in key)
        if len(_finalizer_lists) < _SHARED_FINALIZER_LISTS:
            _finalizer_lists[shared] = shared
    return shared


# Distinct outcome tuples are few (one per combination of outcomes and error texts); past this many
# they stop being shared, as finalizer lists do.
_SHARED_OUTCOMES = 4096
_outcome_tuples: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _outcomes(value: Any) -> tuple[Any, ...]:
    if not value:
        return ()
    key = tuple(value)
    shared = _outcome_tuples.get(key)
    if shared is None:
        shared = key
        if len(_outcome_tuples) < _SHARED_OUTCOMES:
            _outcome_tuples[shared] = shared
    return shared


def _compact_uid(value: str | int) -> str | int:
    if isinstance(value, int) or len(value) != 36:
        return value
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return value
    # Only a uid that renders back exactly (lowercase, hyphenated) is stored as an int.
    return parsed.int if str(parsed) == value else value


def _namespace(value: str) -> str:
    return _intern(value)


def _labels(value: Mapping[str, str] | None) -> Labels:
    return Labels.of(value)


@attrs.frozen(eq=True, hash=False)
class KubeObject:
    group_resource: GroupResource
    namespace: str = attrs.field(converter=_namespace)
    name: str
    # The uid as given, or as an int when it is a canonical UUID (see the module docstring); read `uid`.
    _uid: str | int = attrs.field(default="", converter=_compact_uid)
    labels: Labels = attrs.field(default=NO_LABELS, converter=_labels)
    finalizers: tuple[str, ...] = attrs.field(default=(), converter=_finalizers)
    deletion_timestamp: str | None = None
    # (expression, Outcome, expression, Outcome, ...), sorted by expression; read `outcome()`.
    outcomes: tuple[Any, ...] = attrs.field(default=(), converter=_outcomes)

    def outcome(self, condition: Condition) -> Outcome | None:
        """The condition's outcome on this object, or None when it was not evaluated (its CriticalService
        arrived after the object, and the state has not re-read the object since)."""
        outcomes = self.outcomes
        for i in range(0, len(outcomes), 2):
            if outcomes[i] == condition.expression:
                return outcomes[i + 1]  # type: ignore[no-any-return]
        return None

    @property
    def uid(self) -> str:
        raw = self._uid
        return raw if isinstance(raw, str) else str(uuid.UUID(int=raw))

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef(self.group_resource, self.namespace, self.name)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def terminating(self) -> bool:
        return self.deletion_timestamp is not None


# The provider types whose availability the gate reads (spec.replicas, status.availableReplicas), to tell
# whether a finalizer's controller runs (criticalsvc/stuck.py). Caches watch them whole (cache/watchset.py).
WORKLOADS = frozenset({GroupResource("apps", "deployments"), GroupResource("apps", "statefulsets")})


@attrs.frozen(eq=True, hash=False)
class Workload(KubeObject):
    """A Deployment or StatefulSet, with how many replicas it asks for and how many are available.

    A subclass rather than two more fields of KubeObject: the slots cost every cached object of every type
    8 bytes each, and only these two types need them. None: not known (a metadata-only projection)."""

    replicas: int | None = None
    available_replicas: int | None = None


# The annotations a CRD's projection keeps: which tool manages it, and whether that tool will ever delete it
# (criticalsvc/deleters.py reads them; Argo CD's tracking and sync options, Helm's release and resource policy).
CRD_KEPT_ANNOTATIONS = ("argocd.argoproj.io/tracking-id", "argocd.argoproj.io/sync-options",
                        "meta.helm.sh/release-name", "meta.helm.sh/release-namespace", "helm.sh/resource-policy")


@attrs.frozen(eq=True, hash=False)
class CustomResourceDefinition(KubeObject):
    """A CRD, with the few annotations (CRD_KEPT_ANNOTATIONS) that say which tool manages it: whether the tool
    tearing a stack down will ever delete it (criticalsvc/deleters.py). A subclass, as Workload: a cluster has
    tens of CRDs, and no other object pays for the field."""

    annotations: tuple[tuple[str, str], ...] = ()


def _kept_annotations(metadata: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping):
        return ()
    return tuple((key, annotations[key]) for key in CRD_KEPT_ANNOTATIONS if isinstance(annotations.get(key), str))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _availability(obj: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(spec.replicas, status.availableReplicas) of a whole workload; (None, None) for metadata only. An
    absent spec.replicas is the API's default, 1 (apps/v1 DeploymentSpec, StatefulSetSpec); an absent
    status.availableReplicas is 0 (omitempty drops a zero)."""
    spec, status = obj.get("spec"), obj.get("status")
    if not isinstance(spec, Mapping):
        return None, None
    replicas = _count(spec.get("replicas", 1))
    available = _count((status if isinstance(status, Mapping) else {}).get("availableReplicas", 0))
    return replicas, available


def project(obj: Mapping[str, Any], group_resource: GroupResource,
            conditions: Iterable[Condition] = ()) -> KubeObject:
    """A full object (JSON) -> its slim projection, with the outcome of each of `conditions` on it;
    raises MalformedManifest on a bad metadata block. Conditions need the whole object: a
    metadata-only one (PartialObjectMetadata) has no spec or status to read, so they error on it."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise MalformedManifest("metadata", "required")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedManifest("metadata.name", "required")
    namespace = metadata.get("namespace") or ""
    if not isinstance(namespace, str):
        raise MalformedManifest("metadata.namespace", "must be a string")
    labels = metadata.get("labels") or NO_LABELS
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise MalformedManifest("metadata.labels", "must be a map of strings")
    finalizers = metadata.get("finalizers") or ()
    if not isinstance(finalizers, list | tuple) or not all(isinstance(f, str) for f in finalizers):
        raise MalformedManifest("metadata.finalizers", "must be a list of strings")
    deletion = metadata.get("deletionTimestamp") or None
    extra: dict[str, Any] = {}
    kind: type[KubeObject] = KubeObject
    if group_resource in WORKLOADS:
        kind = Workload
        extra["replicas"], extra["available_replicas"] = _availability(obj)
    elif group_resource == CRDS:
        kind = CustomResourceDefinition
        extra["annotations"] = _kept_annotations(metadata)
    return kind(
        group_resource=group_resource,
        namespace=namespace,
        name=name,
        uid=str(metadata.get("uid") or ""),
        labels=labels,
        finalizers=tuple(finalizers),
        deletion_timestamp=str(deletion) if deletion else None,
        outcomes=evaluate_all(conditions, obj),
        **extra,
    )


def evaluate_all(conditions: Iterable[Condition], obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """The flat (expression, outcome, ...) tuple of `conditions` on `obj`, sorted by expression."""
    flat: list[Any] = []
    for condition in sorted(set(conditions), key=lambda c: c.expression):
        flat += (_intern(condition.expression), evaluate_condition(condition, obj))
    return tuple(flat)
