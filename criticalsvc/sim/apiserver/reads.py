"""The read verbs: get and list (watch has its own module), in each answer form printing.py knows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import Response

from ...api import ObjectRef
from ...restmapper import ResourceType
from .. import tables
from ..store import not_found
from .context import APIServer
from .printing import OutputForm, printer, table
from .responses import json_response
from .selectors import matcher


async def get(standin: APIServer, *, t: ResourceType, ref: ObjectRef, form: OutputForm) -> Response:
    """GET of one object: as stored, or as a one-row Table."""
    store = standin.store

    def op() -> tuple[dict[str, Any] | None, tables.Printer | None]:
        found = store.get(ref.group_resource, ref.namespace, ref.name)
        return found, (printer(store, t, standin.crd_path) if form.table and found is not None else None)

    obj, found_printer = await standin.read(op)
    if obj is None:
        raise not_found(t.group_resource, ref.name)
    if found_printer is not None:
        return json_response(table(found_printer, [obj], now=store.clock(),
                                   resource_version=str(obj["metadata"].get("resourceVersion", "")),
                                   form=form, is_list=False))
    return json_response(obj)


async def list_objects(standin: APIServer, *, t: ResourceType, namespace: str | None, params: Mapping[str, str],
                       form: OutputForm) -> Response:
    """GET of a collection (one namespace, or all of them): a <Kind>List, a Table or a metadata-only list."""
    store = standin.store
    match = matcher(params)

    def op() -> tuple[int, list[dict[str, Any]], tables.Printer | None]:
        items = store.list(t.group_resource, namespace or None)
        return (store.resource_version, [o for o in items if match(o)],
                printer(store, t, standin.crd_path) if form.table else None)

    rv, items, found_printer = await standin.read(op)
    if found_printer is not None:
        return json_response(table(found_printer, items, now=store.clock(), resource_version=str(rv), form=form))
    if form.metadata_list:
        # As the real API server encodes it: an empty list's items are `null` (a nil Go slice).
        partial = [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}
                   for o in items]
        return json_response({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                              "metadata": {"resourceVersion": str(rv)}, "items": partial or None})
    return json_response({"kind": f"{t.kind}List", "apiVersion": t.api_version,
                          "metadata": {"resourceVersion": str(rv)}, "items": items})
