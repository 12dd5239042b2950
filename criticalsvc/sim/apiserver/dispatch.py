"""The request path: parse the request (requestinfo.py), then hand it to the handler for its verb.

    /, /healthz, /livez, /readyz, /version     answered here
    /api, /apis, /apis/<g>, /api/v1, /apis/<g>/<v>   discovery.py documents
    /openapi/v2, /openapi/v3[/<gv>]            openapi.py documents
    resources:  get, list  -> reads.py      watch -> watch.py
                create, update, patch -> writes.py   delete, deletecollection -> deletes.py
                <object>/status|scale|finalize -> subresources.py   the self-subject reviews -> reviews.py

As kube-apiserver does it: k8s.io/apiserver pkg/endpoints/filters/requestinfo.go attaches the
RequestInfo, pkg/endpoints/installer.go registers one handler per verb and resource
(pkg/endpoints/handlers: get.go, create.go, update.go, patch.go, delete.go, watch.go).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...api import GroupResource, ObjectRef
from . import discovery, openapi, reads, writes
from .context import APIServer
from .deletes import delete, delete_collection
from .printing import output_form
from .registry import REVIEWS, served_groups
from .requestinfo import RequestInfo, parse_request_info
from .responses import json_response, method_not_allowed, not_served
from .reviews import review
from .subresources import subresource
from .watch import watch

_HEALTH = ("healthz", "livez", "readyz")


async def handle(standin: APIServer, request: Request) -> Response:
    """Answer one request (StatusErrors propagate: the caller turns them into a metav1.Status)."""
    params = dict(request.query_params.items())
    info = parse_request_info(request.method, request.url.path, params)
    if info.api_prefix == "api" and info.api_version not in ("", "v1"):
        raise not_served()
    if info.is_resource_request:
        return await _resource(standin, request, info, params)
    parts = [p for p in info.path.split("/") if p]
    if not parts:
        return json_response(discovery.ROOT_PATHS)
    if len(parts) == 1 and parts[0] in _HEALTH:
        return Response(b"ok", media_type="text/plain")
    if parts == ["version"]:
        return json_response(discovery.SERVER_VERSION)
    if parts[0] == "openapi":
        return await _openapi(standin, parts[1:])
    if info.api_prefix:
        return await _discovery(standin, request, info)
    raise not_served()


async def _discovery(standin: APIServer, request: Request, info: RequestInfo) -> Response:
    """/api, /apis, /apis/<group>, /api/v1 and /apis/<group>/<version>."""
    if info.api_version and info.verb != "get":
        raise method_not_allowed(info.method)
    groups = await standin.read(lambda: served_groups(standin.store, standin.crd_path))
    aggregated = standin.aggregated_discovery and discovery.wants_aggregated(request.headers.get("accept", ""))
    if info.api_version:
        entries = groups.get(info.api_group, {}).get(info.api_version)
        if entries is None:
            raise not_served()
        return json_response(discovery.api_resource_list(info.api_group, info.api_version, entries))
    if info.api_prefix == "api":
        if aggregated:
            return json_response(discovery.aggregated({"": groups.get("", {})}, standin.stale_groups),
                                 media_type=discovery.DISCOVERY_V2)
        return json_response(discovery.api_versions(request.url.netloc))
    if info.api_group:
        if info.api_group not in groups:
            raise not_served()
        return json_response(discovery.api_group(info.api_group, list(groups[info.api_group])))
    named = discovery.named_groups(groups)
    if aggregated:
        return json_response(discovery.aggregated(named, standin.stale_groups), media_type=discovery.DISCOVERY_V2)
    return json_response(discovery.api_group_list(named))


async def _openapi(standin: APIServer, rest: list[str]) -> Response:
    if rest == ["v2"]:
        # An empty protobuf document: kubectl finds no schema and skips client-side validation.
        return Response(b"", media_type=openapi.OPENAPI_V2_PROTOBUF)
    if not rest or rest[0] != "v3":
        raise not_served()
    documents = openapi.documents(await standin.read(lambda: openapi.schemas(standin.store, standin.crd_path)))
    if len(rest) == 1:
        return json_response(openapi.index(documents))
    doc = documents.get("/".join(rest[1:]))
    if doc is None:
        raise not_served()
    return json_response(doc)


async def _resource(standin: APIServer, request: Request, info: RequestInfo, params: dict[str, Any]) -> Response:
    if len(info.parts) > 3:
        raise not_served()
    group, version, namespace = info.api_group, info.api_version, info.namespace
    found = REVIEWS.get(GroupResource(group, info.resource))
    if found is not None and found.version == version and not info.name and namespace is None:
        if info.verb != "create":
            raise method_not_allowed(info.method)
        return await review(standin, request, found)
    t = await standin.read(lambda: standin.store.mapper.lookup(GroupResource(group, info.resource)))
    if t is None or t.plural != info.resource or t.version != version:
        raise not_served()
    if namespace is not None and not t.namespaced:
        raise not_served()
    if info.name and t.namespaced and namespace is None:
        raise not_served()
    if not t.namespaced:
        namespace = ""
    user = request.headers.get("impersonate-user") or standin.default_user
    if not info.name:
        if info.verb in ("list", "watch"):
            form = output_form(request.headers.get("accept", ""), params)
            if info.verb == "watch":
                return await watch(standin, t=t, namespace=namespace, params=params, form=form)
            return await reads.list_objects(standin, t=t, namespace=namespace, params=params, form=form)
        if info.verb == "create":
            if namespace is None:
                raise method_not_allowed(info.method)
            return await writes.create(standin, request, t=t, namespace=namespace, params=params, user=user)
        if info.verb == "deletecollection":
            return await delete_collection(standin, request, t=t, namespace=namespace, params=params, user=user)
        raise method_not_allowed(info.method)
    assert namespace is not None
    ref = ObjectRef(t.group_resource, namespace, info.name)
    if info.subresource:
        return await subresource(standin, request, info, t=t, ref=ref, params=params, user=user)
    if info.verb == "get":
        return await reads.get(standin, t=t, ref=ref, form=output_form(request.headers.get("accept", ""), params))
    if info.verb == "update":
        return await writes.update(standin, request, t=t, ref=ref, params=params, user=user)
    if info.verb == "patch":
        return await writes.patch(standin, request, t=t, ref=ref, params=params, user=user)
    if info.verb == "delete":
        return await delete(standin, request, t=t, ref=ref, params=params, user=user)
    raise method_not_allowed(info.method)
