"""A request path parsed into what it asks for, as kube-apiserver's RequestInfoFactory parses it.

    /apis/apps/v1/namespaces/shop/deployments/web/scale
     |    |    |             |    |           |   subresource
     |    |    api_version   |    resource    name
     |    api_group          namespace
     api_prefix

The verb comes from the method, refined for collections: GET is `list` (`watch` with `?watch=true`
or the deprecated `/watch/` prefix), DELETE `deletecollection`. Upstream:
https://github.com/kubernetes/kubernetes/blob/master/staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go

Where this parser differs, it keeps what the stand-in has always answered: `namespace` is None when the
path names none (upstream: ""); `/namespaces/<ns>/...` is a namespace scope only when something
follows that is not the namespace's own `status` or `finalize`; the watch prefix is honoured on
collections only; a method without a verb (HEAD) keeps its lowercased name, and the handlers answer 405.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

_METHOD_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
# Subresources of a namespace itself: /api/v1/namespaces/<name>/status is not a namespace scope.
NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


@attrs.frozen
class RequestInfo:
    """What a request asks for. A non-resource request (`/version`, discovery, OpenAPI, health) has
    `is_resource_request` False and, under /api or /apis, as much of the group version as it names."""

    path: str
    method: str
    verb: str
    is_resource_request: bool = False
    api_prefix: str = ""  # "api" (the core group) or "apis"
    api_group: str = ""
    api_version: str = ""
    namespace: str | None = None  # None: the path names no namespace
    resource: str = ""
    name: str = ""
    subresource: str = ""
    parts: tuple[str, ...] = ()  # resource, name, subresource, and whatever follows (never served)


def parse_request_info(method: str, path: str, query: Mapping[str, str]) -> RequestInfo:
    """Parse `path` (and the `watch` query parameter) into a RequestInfo; never fails."""
    verb = _METHOD_VERBS.get(method, method.lower())
    segments = [p for p in path.split("/") if p]
    if not segments or segments[0] not in ("api", "apis"):
        return RequestInfo(path, method, verb)
    prefix = segments[0]
    group, rest = ("", segments[1:]) if prefix == "api" else (segments[1] if len(segments) > 1 else "", segments[2:])
    if not rest:
        return RequestInfo(path, method, verb, api_prefix=prefix, api_group=group)
    version, rest = rest[0], rest[1:]
    watch = False
    if rest and rest[0] == "watch":  # the deprecated /watch/ prefix
        watch, rest = True, rest[1:]
    if not rest:
        return RequestInfo(path, method, verb, api_prefix=prefix, api_group=group, api_version=version)
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3 and not (len(rest) == 3 and rest[2] in NAMESPACE_SUBRESOURCES):
        namespace, rest = rest[1], rest[2:]
    name = rest[1] if len(rest) > 1 else ""
    if not name and method == "GET":
        verb = "watch" if watch or query.get("watch") in ("true", "1") else "list"
    elif not name and method == "DELETE":
        verb = "deletecollection"
    return RequestInfo(path, method, verb, True, prefix, group, version, namespace, rest[0], name,
                       rest[2] if len(rest) > 2 else "", tuple(rest))
