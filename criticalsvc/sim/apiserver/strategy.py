"""The registry strategies of a write, before admission: defaulting, validation, what an update keeps,
and the status subresource's own update.

Upstream: k8s.io/apiserver pkg/registry/rest (create.go BeforeCreate, update.go BeforeUpdate run the
strategy's PrepareForCreate/Update and Validate before the validating admission webhooks), and for
custom resources apiextensions-apiserver pkg/registry/customresource (strategy.go, status_strategy.go).
Every function here takes the Store and must run on the writer thread, holding it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ...api import NAMESPACES, ObjectRef
from ...restmapper import ResourceType
from ..schema.defaulting import apply_defaults
from ..schema.fielderrors import invalid_status
from ..schema.validation import served_schema
from ..schema.validation import validate as validate_schema
from ..store import StatusError, Store, not_found
from .bodies import dry_run
from .registry import BUILTIN, has_status, stored_crd
from .responses import conflict


def existing(store: Store, t: ResourceType, ref: ObjectRef) -> dict[str, Any]:
    """The stored object `ref`, or a 404 NotFound as the API server answers a write to a missing one."""
    current = store.get(ref.group_resource, ref.namespace, ref.name)
    if current is None:
        raise not_found(t.group_resource, ref.name)
    return current


def default(store: Store, t: ResourceType, obj: dict[str, Any]) -> None:
    """The `default`s of a custom resource's structural schema, as the API server applies them to
    every write (apiextensions-apiserver structural/defaulting)."""
    crd = stored_crd(store, t)
    for v in ((crd or {}).get("spec") or {}).get("versions") or []:
        if isinstance(v, Mapping) and v.get("name") == t.version:
            schema = (v.get("schema") or {}).get("openAPIV3Schema")
            if isinstance(schema, Mapping):
                apply_defaults(obj, schema)


def validate(store: Store, t: ResourceType, obj: Mapping[str, Any], current: Mapping[str, Any] | None = None, *,
             status: bool = False) -> None:
    """A custom resource write checked against its CRD's schema (sim/schema: OpenAPI, then CEL rules;
    an update ratchets what it leaves unchanged), as the registry checks it after defaulting and
    before the validating webhooks: 422 Invalid, one cause per field error. Built-in types are not
    checked here, nor writes the real server refuses before validating (a stale resourceVersion:
    409; a create while the CRD terminates: 403), which the store then refuses."""
    if not t.group or t.group_resource in BUILTIN:
        return
    crd = stored_crd(store, t)
    if crd is None:
        return
    if current is None and (crd.get("metadata") or {}).get("deletionTimestamp"):
        return
    rv = (obj.get("metadata") or {}).get("resourceVersion")
    if current is not None and rv and rv != (current.get("metadata") or {}).get("resourceVersion"):
        return
    found = served_schema(crd, t.version)
    if found is None:
        return
    errors = validate_schema(obj, found, current, status_only=status)
    if errors:
        name = str((obj.get("metadata") or {}).get("name") or "")
        status_body = invalid_status(t.group, t.kind, name, errors)
        raise StatusError(422, "Invalid", status_body["message"], details=status_body["details"])


def preserve(store: Store, t: ResourceType, new: dict[str, Any], current: Mapping[str, Any]) -> None:
    """What the registry strategies keep on a main-resource update: status, a namespace's finalizers."""
    if has_status(store, t):
        if "status" in current:
            new["status"] = copy.deepcopy(current["status"])
        else:
            new.pop("status", None)
    if t.group_resource == NAMESPACES:
        new.setdefault("spec", {})["finalizers"] = list((current.get("spec") or {}).get("finalizers") or [])


def write_status(store: Store, t: ResourceType, ref: ObjectRef, new: Mapping[str, Any], current: Mapping[str, Any],
                 params: Mapping[str, str]) -> dict[str, Any]:
    """An update of the status subresource: only `status` changes, validated against the status schema."""
    rv = (new.get("metadata") or {}).get("resourceVersion")
    if rv and rv != current["metadata"]["resourceVersion"]:
        raise conflict(t.group_resource, ref.name)
    # statusStrategy.PrepareForUpdate: the stored object with the new status (or none), then validated.
    candidate = {k: v for k, v in current.items() if k != "status"}
    if "status" in new:
        candidate["status"] = new["status"]
    validate(store, t, candidate, current, status=True)
    status = new.get("status")
    status = dict(status) if isinstance(status, Mapping) else {}
    if dry_run(params):
        return {**copy.deepcopy(dict(current)), "status": status}
    obj = store.set_status(ref, status)
    if obj is None:
        raise not_found(t.group_resource, ref.name)
    return obj

