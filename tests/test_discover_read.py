"""discover's live reads (criticalsvc/discover/read.py) against a fake API server: what is read whole, what only
as metadata, paging, a type that cannot be listed, and the SubjectAccessReviews it sends."""

from __future__ import annotations

import asyncio
from typing import Any

from criticalsvc.api import GroupResource
from criticalsvc.cache import APIStatusError
from criticalsvc.cache.transport import ACCEPT_METADATA_LIST
from criticalsvc.discover.propose import access_questions, propose
from criticalsvc.discover.read import SUBJECT_ACCESS_REVIEWS, read_inventory, review_access
from tests.discover_cluster import custom, deployment

RESOURCES = {
    "/api/v1": [("namespaces", "Namespace", False), ("configmaps", "ConfigMap", True)],
    "/apis/apps/v1": [("deployments", "Deployment", True)],
    "/apis/my.crd.group/v1": [("coolresources", "CoolResource", True)],
    "/apis/secret.example.com/v1": [("secrets", "Secret", True)],
}


class FakeCluster:
    """Discovery in the legacy form, LISTs with `limit`/`continue` paging, and SubjectAccessReviews answered from
    `allowed` (user, resource) pairs; every GET recorded with its Accept header."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]], allowed: set[tuple[str, str]], *,
                 resources: dict[str, list[tuple[str, str, bool]]] | None = None) -> None:
        self.resources = RESOURCES if resources is None else resources
        self.objects = objects
        self.allowed = allowed
        self.gets: list[tuple[str, dict[str, str], str]] = []
        self.reviews: list[dict[str, Any]] = []

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        params = dict(params)
        self.gets.append((path, params, accept))
        if path == "/api":
            return {"versions": ["v1"]}
        if path == "/apis":
            return {"kind": "APIGroupList", "groups": [
                {"name": g, "versions": [{"version": "v1"}], "preferredVersion": {"version": "v1"}}
                for g in sorted({p.split("/")[2] for p in self.resources if p.startswith("/apis/")})]}
        if path in self.resources:
            return {"resources": [{"name": n, "kind": k, "namespaced": ns, "verbs": ["list", "watch", "update"]}
                                  for n, k, ns in self.resources[path]]}
        if path.startswith("/apis/secret.example.com"):
            raise APIStatusError(403, "Forbidden", "secrets.secret.example.com is forbidden")
        items = self.objects.get(path.rsplit("/", 1)[1], [])
        limit, start = int(params["limit"]), int(params.get("continue") or 0)
        page = items[start:start + limit]
        more = str(start + limit) if start + limit < len(items) else ""
        return {"items": page, "metadata": {"continue": more}}

    async def send(self, verb: str, path: str, payload: Any = None, *, timeout: float) -> Any:
        assert (verb, path) == ("POST", SUBJECT_ACCESS_REVIEWS)
        self.reviews.append(payload)
        spec = payload["spec"]
        return {"status": {"allowed": (spec["user"], spec["resourceAttributes"]["resource"]) in self.allowed}}


def test_reads_bodies_only_where_they_matter_and_pages_through(monkeypatch):
    """Deployments are read whole, ConfigMaps and custom resources metadata-only, a long list page by page; a type
    the reader may not list is reported, not fatal; SubjectAccessReviews name the ServiceAccount's user and groups,
    and their answers make the proposal."""
    monkeypatch.setattr("criticalsvc.discover.read.PAGE", 2)
    cms = [custom("v1", "ConfigMap", "a", f"cm{i}") for i in range(5)]
    cool = [custom("my.crd.group/v1", "CoolResource", "a", "x", finalizers=["my.crd.group/super-important"])]
    fake = FakeCluster({"configmaps": cms, "coolresources": cool,
                        "deployments": [deployment("ops", "cool-operator", sa="cool"),
                                        deployment("ops", "bystander", sa="other")]},
                       allowed={("system:serviceaccount:ops:cool", "coolresources")})
    read = asyncio.run(read_inventory(fake))
    accept = {p.rsplit("/", 1)[1]: a for p, _params, a in fake.gets if "limit" in _params}
    assert accept["deployments"] == "application/json"
    assert accept["configmaps"] == accept["coolresources"] == ACCEPT_METADATA_LIST
    assert [p.get("continue", "") for path, p, _ in fake.gets if path.endswith("/configmaps")] == ["", "2", "4"]
    assert read.inventory.objects == 8
    assert read.unreadable == ("secrets.secret.example.com: 403 Forbidden: secrets.secret.example.com is forbidden",)
    answers = asyncio.run(review_access(fake, access_questions(read.inventory)))
    sent = fake.reviews[0]["spec"]
    assert sent["groups"][:2] == ["system:serviceaccounts", f"system:serviceaccounts:{sent['user'].split(':')[2]}"]
    (p,) = propose(read.inventory, answers).proposals
    assert p.provider.name == "cool-operator"
    assert p.dependencies[0].criterion.group_resource == GroupResource("my.crd.group", "coolresources")
