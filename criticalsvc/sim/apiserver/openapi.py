"""OpenAPI documents, as pure functions of the served types' schemas.

`/openapi/v2` is an empty protobuf document: kubectl finds no schema there and skips client-side
validation. `/openapi/v3` lists one document per group version that has a schema (the CRD-backed
ones), so `kubectl explain criticalservices` works; each kind declares server-side `fieldValidation`,
so kubectl leaves validation to the server rather than check against a partial schema
(design/kubernetes-semantics.md §12).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from ...api import CRITICAL_SERVICES
from ...restmapper import ResourceType, group_version_path
from ..store import Store
from .registry import describing_crd, served_types

OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"

# The CriticalService schema when even the CRD manifest cannot be read (a wheel install without it).
FALLBACK_CRD: dict[str, Any] = {"spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema": {
    "type": "object",
    "description": "CriticalService names a provider workload and the criteria under which it may be deleted; "
                   "the criticalsvc deletion gate denies deleting it (or its namespace) until they are met.",
    "properties": {
        "spec": {"type": "object", "description": "The provider and the deletion criteria.",
                 "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "description": "Conditions, providerUID and blockers, written by the gate.",
                   "x-kubernetes-preserve-unknown-fields": True}}}}}]}}


def resource_schema(crd: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The schema of `version` of the CRD's kind, with apiVersion, kind and metadata declared as the
    real server's published document declares them."""
    schema: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    for v in (crd.get("spec") or {}).get("versions") or []:
        if isinstance(v, Mapping) and v.get("name") == version:
            found = ((v.get("schema") or {}).get("openAPIV3Schema"))
            if isinstance(found, Mapping):
                schema = copy.deepcopy(dict(found))
    properties = schema.setdefault("properties", {})
    properties.setdefault("apiVersion", {"type": "string", "description": (
        "APIVersion defines the versioned schema of this representation of an object.")})
    properties.setdefault("kind", {"type": "string", "description": (
        "Kind is a string value representing the REST resource this object represents.")})
    properties.setdefault("metadata", {"type": "object", "description": (
        "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/"
        "sig-architecture/api-conventions.md#metadata")})
    return schema


def schemas(store: Store, crd_path: Path | None) -> list[tuple[ResourceType, dict[str, Any]]]:
    """The served types that have a schema (CRD-backed ones), with it. Call holding the store."""
    result = []
    for t in served_types(store):
        crd = describing_crd(store, t, crd_path)
        if crd is None and t.group_resource == CRITICAL_SERVICES:
            crd = FALLBACK_CRD
        if crd is not None:
            result.append((t, resource_schema(crd, t.version)))
    return result


def documents(typed_schemas: Iterable[tuple[ResourceType, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """One OpenAPI v3 document per group version, keyed by the path it is served under (`apis/g/v`)."""
    docs: dict[str, dict[str, Any]] = {}
    for t, schema in typed_schemas:
        path = group_version_path(t.group, t.version).removeprefix("/")  # served as /openapi/v3/<path>
        doc = docs.setdefault(path, {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
                                     "paths": {}, "components": {"schemas": {}}})
        gvk = {"group": t.group, "version": t.version, "kind": t.kind}
        name = ".".join([*reversed(t.group.split(".")), t.version, t.kind])
        doc["components"]["schemas"][name] = {**schema, "x-kubernetes-group-version-kind": [gvk]}
        # Declaring fieldValidation makes kubectl leave validation to the server (it sends
        # fieldValidation=Strict), rather than validate against this partial document.
        doc["paths"][t.path(namespace="{namespace}", name="{name}")] = {"patch": {
            "operationId": f"patch{t.kind}", "x-kubernetes-group-version-kind": gvk,
            "x-kubernetes-action": "patch",
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}}}}
    return docs


def index(docs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`/openapi/v3`: where each document is, with its content hash (clients cache by it)."""
    return {"paths": {path: {"serverRelativeURL": f"/openapi/v3/{path}?hash={_hash(doc)}"}
                      for path, doc in docs.items()}}


def _hash(doc: Mapping[str, Any]) -> str:
    return hashlib.sha512(orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32].upper()
