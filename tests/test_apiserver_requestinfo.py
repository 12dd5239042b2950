"""criticalsvc.sim.apiserver.requestinfo: a request path parsed as kube-apiserver's RequestInfoFactory parses it."""

from __future__ import annotations

import pytest

from criticalsvc.sim.apiserver.requestinfo import RequestInfo, parse_request_info


def parse(method: str, path: str, **query: str) -> RequestInfo:
    return parse_request_info(method, path, query)


@pytest.mark.parametrize(("method", "path", "query", "verb"), [
    ("GET", "/api/v1/namespaces/shop/pods", {}, "list"),
    ("GET", "/api/v1/namespaces/shop/pods", {"watch": "true"}, "watch"),
    ("GET", "/api/v1/namespaces/shop/pods", {"watch": "1"}, "watch"),
    ("GET", "/api/v1/watch/namespaces/shop/pods", {}, "watch"),
    ("GET", "/api/v1/namespaces/shop/pods/web", {"watch": "true"}, "get"),
    ("POST", "/api/v1/namespaces/shop/pods", {}, "create"),
    ("PUT", "/api/v1/namespaces/shop/pods/web", {}, "update"),
    ("PATCH", "/api/v1/namespaces/shop/pods/web", {}, "patch"),
    ("DELETE", "/api/v1/namespaces/shop/pods/web", {}, "delete"),
    ("DELETE", "/api/v1/namespaces/shop/pods", {}, "deletecollection"),
    ("HEAD", "/api/v1/namespaces/shop/pods/web", {}, "head"),
])
def test_the_verb_comes_from_the_method_refined_for_collections(method: str, path: str, query: dict[str, str],
                                                                 verb: str) -> None:
    """GET of a collection is list (watch with ?watch=true or /watch/), DELETE of one deletecollection."""
    assert parse_request_info(method, path, query).verb == verb


def test_a_namespaced_subresource_is_taken_apart() -> None:
    """Group, version, namespace, resource, name and subresource each land in their field."""
    info = parse("PUT", "/apis/apps/v1/namespaces/shop/deployments/web/scale")
    assert info.is_resource_request
    assert (info.api_prefix, info.api_group, info.api_version) == ("apis", "apps", "v1")
    assert (info.namespace, info.resource, info.name, info.subresource) == ("shop", "deployments", "web", "scale")


@pytest.mark.parametrize(("path", "name", "subresource"), [
    ("/api/v1/namespaces/shop", "shop", ""),
    ("/api/v1/namespaces/shop/status", "shop", "status"),
    ("/api/v1/namespaces/shop/finalize", "shop", "finalize"),
])
def test_a_namespace_itself_is_not_a_namespace_scope(path: str, name: str, subresource: str) -> None:
    """/namespaces/<name>, its status and finalize address the Namespace object, not a scope (namespace None)."""
    info = parse("GET", path)
    assert (info.namespace, info.resource, info.name, info.subresource) == (None, "namespaces", name, subresource)


def test_a_cluster_wide_list_names_no_namespace() -> None:
    """A collection path without /namespaces/<ns>/ has namespace None (upstream says "")."""
    info = parse("GET", "/apis/criticalsvc.io/v1alpha1/criticalservices")
    assert (info.namespace, info.resource, info.verb) == (None, "criticalservices", "list")


@pytest.mark.parametrize(("path", "prefix", "group", "version"), [
    ("/", "", "", ""),
    ("/version", "", "", ""),
    ("/openapi/v3/apis/apps/v1", "", "", ""),
    ("/api", "api", "", ""),
    ("/apis", "apis", "", ""),
    ("/apis/apps", "apis", "apps", ""),
    ("/api/v1", "api", "", "v1"),
    ("/apis/apps/v1", "apis", "apps", "v1"),
    ("/apis/apps/v1/watch", "apis", "apps", "v1"),
])
def test_discovery_and_other_paths_are_not_resource_requests(path: str, prefix: str, group: str,
                                                             version: str) -> None:
    """Discovery, /version, OpenAPI and health paths carry as much of the group version as they name."""
    info = parse("GET", path)
    assert not info.is_resource_request
    assert (info.api_prefix, info.api_group, info.api_version) == (prefix, group, version)


def test_what_follows_a_subresource_is_kept_for_the_dispatcher_to_refuse() -> None:
    """Segments past the subresource stay in `parts`, so the dispatcher can answer 404."""
    info = parse("GET", "/api/v1/namespaces/shop/pods/web/status/extra")
    assert info.parts == ("pods", "web", "status", "extra")
