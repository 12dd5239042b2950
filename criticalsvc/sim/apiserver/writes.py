"""The write verbs on a resource: create, update, patch (merge, strategic merge, JSON patch).

Each decodes the body, then on the writer thread runs the registry strategy (strategy.py: keep what
an update may not change, default, validate) and the store's write, which calls the admission
webhooks (admission.py). Store semantics (finalizers, terminating namespaces and CRDs) are the
store's; nothing here re-implements them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...api import ObjectRef
from ...restmapper import ResourceType
from ..store import StatusError
from .admission import admitted_write
from .bodies import check_identity, dry_run, json_body, object_body, request_body
from .context import APIServer
from .patches import PatchError, json_patch, merge_patch, strategic_merge_patch
from .registry import BUILTIN
from .responses import json_response
from .strategy import default, existing, preserve, validate, write_status


async def create(standin: APIServer, request: Request, *, t: ResourceType, namespace: str, params: Mapping[str, str],
                 user: str) -> Response:
    """POST to a collection: 201 with the stored object."""
    body = object_body(await request_body(request), t)
    md = body.setdefault("metadata", {})
    if t.namespaced:
        if md.get("namespace") and md["namespace"] != namespace:
            raise StatusError(400, "BadRequest", "the namespace of the provided object does not match the "
                              "namespace sent on the request")
        md["namespace"] = namespace
    if not md.get("name") and md.get("generateName"):
        # apiserver's SimpleNameGenerator: 5 characters from an alphabet without vowels.
        md["name"] = md["generateName"] + "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789")
                                                  for _ in range(5))
    store = standin.store

    def op() -> dict[str, Any]:
        default(store, t, body)
        validate(store, t, body)
        return store.create(body, user=user, dry_run=dry_run(params))

    obj, warnings = await admitted_write(standin, op)
    return json_response(obj, status_code=201, warnings=warnings)


async def update(standin: APIServer, request: Request, *, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                 user: str) -> Response:
    """PUT of an object: the whole object replaced, but for what the strategy keeps (status, ...)."""
    body = object_body(await request_body(request), t)
    check_identity(body, t, ref)
    store = standin.store

    def op() -> dict[str, Any]:
        current = existing(store, t, ref)
        preserve(store, t, body, current)
        default(store, t, body)
        validate(store, t, body, current)
        return store.update(body, user=user, dry_run=dry_run(params))

    obj, warnings = await admitted_write(standin, op)
    return json_response(obj, warnings=warnings)


async def patch(standin: APIServer, request: Request, *, t: ResourceType, ref: ObjectRef, params: Mapping[str, str],
                user: str, status_only: bool = False) -> Response:
    """PATCH of an object, or with `status_only` of its status subresource."""
    apply = patcher(t, request.headers.get("content-type", "").split(";")[0].strip())
    body = json_body(await request.body())
    store = standin.store

    def op() -> dict[str, Any]:
        current = existing(store, t, ref)
        new = patched(apply, current, body)
        new["apiVersion"], new["kind"] = current["apiVersion"], current["kind"]
        check_identity(new, t, ref)
        if status_only:
            return write_status(store, t, ref, new, current, params)
        preserve(store, t, new, current)
        default(store, t, new)
        validate(store, t, new, current)
        return store.update(new, user=user, dry_run=dry_run(params))

    obj, warnings = await admitted_write(standin, op)
    return json_response(obj, warnings=warnings)


def patched(apply: Callable[[Any, Any], Any], current: Any, body: Any) -> dict[str, Any]:
    """`apply(current, body)`, or the 422 the API server answers when the patch cannot be applied."""
    try:
        new = apply(current, body)
    except PatchError as exc:
        raise StatusError(422, "Invalid", f"the server rejected our request due to an error in our "
                          f"request: {exc}") from exc
    if not isinstance(new, dict):
        raise StatusError(422, "Invalid", "the patched object is not a JSON object")
    return new


def patcher(t: ResourceType, content_type: str) -> Callable[[Any, Any], Any]:
    """The patch function for the request's Content-Type, or a 415."""
    if content_type == "application/merge-patch+json":
        return merge_patch
    if content_type == "application/json-patch+json":
        return json_patch
    if content_type == "application/strategic-merge-patch+json":
        if t.group_resource not in BUILTIN:
            # Custom resources have no Go struct tags to drive a strategic merge.
            raise StatusError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                              "accepted media types include: application/json-patch+json, "
                              "application/merge-patch+json, application/apply-patch+yaml")
        return strategic_merge_patch
    raise StatusError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                      f'"{content_type}" is not supported by the API-server stand-in; accepted media types '
                      "include: application/json-patch+json, application/merge-patch+json, "
                      "application/strategic-merge-patch+json")
