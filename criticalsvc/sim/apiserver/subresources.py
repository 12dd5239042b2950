"""The subresources: `status` (get, update, patch), a Namespace's `finalize` (update), and the
autoscaling/v1 `scale` of Deployments, ReplicaSets and StatefulSets (`kubectl scale`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ...api import NAMESPACES, ObjectRef
from ...restmapper import ResourceType
from ..store import StatusError, not_found, scale_of
from .admission import admitted_write
from .bodies import check_identity, dry_run, json_body, object_body, request_body
from .context import APIServer
from .registry import SCALABLE, SCALE_TYPE, has_status
from .requestinfo import RequestInfo
from .responses import conflict, json_response, method_not_allowed, not_served
from .strategy import existing, write_status
from .writes import patch, patched, patcher


async def subresource(standin: APIServer, request: Request, info: RequestInfo, *, t: ResourceType, ref: ObjectRef,
                      params: Mapping[str, str], user: str) -> Response:
    """A request to `<object>/<subresource>`."""
    sub = info.subresource
    if sub == "scale" and t.group_resource in SCALABLE:
        return await _scale(standin, request, info, t=t, ref=ref, params=params, user=user)
    if sub == "finalize" and t.group_resource == NAMESPACES:
        if info.verb != "update":
            raise method_not_allowed(info.method)
        return await _finalize(standin, request, ref)
    store = standin.store
    if sub != "status" or not await standin.read(lambda: has_status(store, t)):
        raise not_served()
    if info.verb == "get":
        obj = await standin.read(lambda: store.get(ref.group_resource, ref.namespace, ref.name))
        if obj is None:
            raise not_found(t.group_resource, ref.name)
        return json_response(obj)
    if info.verb == "patch":
        return await patch(standin, request, t=t, ref=ref, params=params, user=user, status_only=True)
    if info.verb != "update":
        raise method_not_allowed(info.method)
    body = object_body(await request_body(request), t)
    check_identity(body, t, ref)

    def op() -> dict[str, Any]:
        current = existing(store, t, ref)
        return write_status(store, t, ref, body, current, params)

    obj, _ = await admitted_write(standin, op)
    return json_response(obj)


async def _scale(standin: APIServer, request: Request, info: RequestInfo, *, t: ResourceType, ref: ObjectRef,
                 params: Mapping[str, str], user: str) -> Response:
    """The autoscaling/v1 Scale of a Deployment, ReplicaSet or StatefulSet (`kubectl scale`): a
    write sets the workload's spec.replicas, reviewed as an UPDATE with subResource `scale` whose
    objects are Scales (Store.update)."""
    store = standin.store
    if info.verb == "get":
        obj = await standin.read(lambda: existing(store, t, ref))
        return json_response(scale_of(obj))
    if info.verb == "update":
        body: Any = object_body(await request_body(request), SCALE_TYPE)
        check_identity(body, SCALE_TYPE, ref)
        apply: Callable[[Any, Any], Any] = lambda _current, replacement: replacement  # noqa: E731
    elif info.verb == "patch":
        apply = patcher(t, request.headers.get("content-type", "").split(";")[0].strip())
        body = json_body(await request.body())
    else:
        raise method_not_allowed(info.method)

    def op() -> dict[str, Any]:
        current = existing(store, t, ref)
        scale = patched(apply, scale_of(current), body)
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        if rv and rv != current["metadata"].get("resourceVersion"):
            raise conflict(t.group_resource, ref.name)
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            message = f"Invalid value: {orjson.dumps(replicas).decode()}: must be greater than or equal to 0"
            raise StatusError(422, "Invalid", f'Scale.autoscaling "{ref.name}" is invalid: spec.replicas: '
                              f"{message}", details={"name": ref.name, "group": "autoscaling", "kind": "Scale",
                                                     "causes": [{"reason": "FieldValueInvalid", "message": message,
                                                                 "field": "spec.replicas"}]})
        updated = copy.deepcopy(current)
        updated.setdefault("spec", {})["replicas"] = replicas
        updated["metadata"].pop("resourceVersion", None)
        return scale_of(store.update(updated, user=user, dry_run=dry_run(params), subresource="scale"))

    scale, warnings = await admitted_write(standin, op)
    return json_response(scale, warnings=warnings)


async def _finalize(standin: APIServer, request: Request, ref: ObjectRef) -> Response:
    """PUT namespaces/<name>/finalize: only removing every spec.finalizer is supported."""
    body = await request_body(request)
    finalizers = ((body.get("spec") or {}) if isinstance(body, Mapping) else {}).get("finalizers") or []
    store = standin.store

    def op() -> dict[str, Any]:
        current = store.get(NAMESPACES, "", ref.name)
        if current is None:
            raise not_found(NAMESPACES, ref.name)
        if list(finalizers) == list((current.get("spec") or {}).get("finalizers") or []):
            return current
        if finalizers:
            raise StatusError(422, "Invalid", f'namespaces "{ref.name}" is invalid: spec.finalizers: the '
                              "API-server stand-in only supports removing all of them")
        obj = store.finalize_namespace(ref.name)
        if obj is None:
            raise not_found(NAMESPACES, ref.name)
        return obj

    obj, _ = await admitted_write(standin, op)
    return json_response(obj)
