"""The slim projection of a Kubernetes object that the gate reasons about.

Caches hold these, never whole client objects: keys, uid, labels, finalizers and deletionTimestamp
are all that a criterion or a decision reads. Labels are stored as given (a dict shared with the
source where possible) because selectors need them; nothing else of the object is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .api import GroupResource, ObjectRef
from .errors import MalformedManifest

_EMPTY: Mapping[str, str] = {}


@attrs.frozen(eq=True, hash=False)
class KubeObject:
    group_resource: GroupResource
    namespace: str
    name: str
    uid: str = ""
    labels: Mapping[str, str] = _EMPTY
    finalizers: tuple[str, ...] = ()
    deletion_timestamp: str | None = None

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
    labels = metadata.get("labels") or _EMPTY
    if not isinstance(labels, Mapping):
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
