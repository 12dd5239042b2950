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
- a uid in the canonical UUID form the API server generates is held as a 128-bit int (44 bytes, not
  85 for the 36-character string) and rendered back on read; any other uid is kept as given.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from .api import GroupResource, ObjectRef
from .errors import MalformedManifest

_intern = sys.intern


class Labels(Mapping[str, str]):
    """An object's labels: an immutable Mapping stored as one flat tuple (k1, v1, k2, v2, ...) sorted by key.

    Objects carry a few labels each, so a linear scan for `get` is as fast as hashing and the tuple
    is half the size of a dict. Keys are interned (few distinct keys across a cluster); values are
    not (an instance label is unique per object, and interning it would only add a table entry).
    """

    __slots__ = ("_flat",)
    _flat: tuple[str, ...]

    def __init__(self, labels: Mapping[str, str] | None = None) -> None:
        flat: list[str] = []
        if labels:
            for key in sorted(labels):
                flat += (_intern(key), labels[key])
        object.__setattr__(self, "_flat", tuple(flat))

    @classmethod
    def of(cls, labels: Mapping[str, str] | None) -> Labels:
        """`labels` as a Labels (as is when it already is one; the shared empty one when empty)."""
        if isinstance(labels, Labels):
            return labels
        return cls(labels) if labels else NO_LABELS

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Labels are immutable")

    def __getitem__(self, key: str) -> str:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == key:
                return flat[i + 1]
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        flat = self._flat
        for i in range(0, len(flat), 2):
            if flat[i] == key:
                return flat[i + 1]
        return default

    def __contains__(self, key: object) -> bool:
        return key in self._flat[::2]

    def __iter__(self) -> Iterator[str]:
        return iter(self._flat[::2])

    def __len__(self) -> int:
        return len(self._flat) // 2

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Labels):
            return self._flat == other._flat
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._flat)

    def __repr__(self) -> str:
        return f"Labels({dict(self.items())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Labels, (dict(self.items()),))


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


def project(obj: Mapping[str, Any], group_resource: GroupResource) -> KubeObject:
    """A full object (JSON) -> its slim projection; raises MalformedManifest on a bad metadata block."""
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
    return KubeObject(
        group_resource=group_resource,
        namespace=namespace,
        name=name,
        uid=str(metadata.get("uid") or ""),
        labels=labels,
        finalizers=tuple(finalizers),
        deletion_timestamp=str(deletion) if deletion else None,
    )
