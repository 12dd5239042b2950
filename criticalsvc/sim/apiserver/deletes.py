"""The delete verbs: delete (DeleteOptions: propagationPolicy, preconditions, dryRun) and
deletecollection (label and field selectors). Finalizers, propagation and admission are the store's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...api import ObjectRef
from ...restmapper import ResourceType
from ..store import DeleteResult, StatusError
from .admission import admitted_write
from .bodies import request_body
from .context import APIServer
from .responses import json_response
from .selectors import matcher
from .strategy import existing


async def delete(standin: APIServer, request: Request, *, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                 user: str) -> Response:
    """DELETE of an object: a Success Status when it is gone, the object when it is only marked."""
    options = delete_options(await request_body(request), params)
    store = standin.store

    def op() -> DeleteResult:
        current = existing(store, t, ref)
        rv = options["resource_version"]
        if rv is not None and rv != current["metadata"].get("resourceVersion"):
            raise StatusError(409, "Conflict", f"Operation cannot be fulfilled on {t.group_resource} "
                              f'"{ref.name}": Precondition failed: ResourceVersion in precondition: {rv}, '
                              f"ResourceVersion in object meta: {current['metadata'].get('resourceVersion')}")
        return store.delete(ref, user=user, dry_run=options["dry_run"], propagation=options["propagation"],
                            uid=options["uid"])

    result, warnings = await admitted_write(standin, op)
    if result.outcome == "deleted":
        md = result.object["metadata"]
        return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "details": {"name": ref.name, "group": t.group, "kind": t.plural,
                                          "uid": md.get("uid", "")}}, warnings=warnings)
    return json_response(result.object, warnings=warnings)


async def delete_collection(standin: APIServer, request: Request, *, t: ResourceType, namespace: str | None,
                            params: Mapping[str, str], user: str) -> Response:
    """DELETE of a collection: every matching object deleted, the results listed."""
    options = delete_options(await request_body(request), params)
    match = matcher(params)
    store = standin.store
    results, warnings = await admitted_write(standin, lambda: store.delete_collection(
        t.group_resource, namespace or None if t.namespaced else "", user=user,
        dry_run=options["dry_run"], where=match))
    return json_response({"kind": f"{t.kind}List", "apiVersion": t.api_version,
                          "metadata": {"resourceVersion": str(store.resource_version)},
                          "items": [r.object for r in results]}, warnings=warnings)


def delete_options(body: Any, params: Mapping[str, str]) -> dict[str, Any]:
    """metav1.DeleteOptions from the body and the query (the query wins, as in the API server)."""
    body = body if isinstance(body, Mapping) else {}
    preconditions = body.get("preconditions") or {}
    propagation = params.get("propagationPolicy") or body.get("propagationPolicy")
    orphan = params.get("orphanDependents", body.get("orphanDependents"))
    if propagation is None and orphan is not None:
        propagation = "Orphan" if str(orphan).lower() == "true" else "Background"
    if propagation not in (None, "Background", "Foreground", "Orphan"):
        raise StatusError(422, "Invalid", f'DeleteOptions.propagationPolicy: Unsupported value: "{propagation}": '
                          'supported values: "Foreground", "Background", "Orphan"')
    dry = body.get("dryRun") or []
    return {"propagation": propagation or "Background", "uid": preconditions.get("uid"),
            "resource_version": preconditions.get("resourceVersion"),
            "dry_run": params.get("dryRun") == "All" or "All" in dry}
