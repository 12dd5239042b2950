"""Discovery: which resources the API server serves, read into a RESTMapper.

The gate must know what is served, not guess it: a criterion naming a type that is not served is met
(no instance can exist), so a type missing from the mapper by mistake would silently lift a
protection. The mapper therefore starts empty and is filled from the API server's own discovery
documents: the aggregated form where the server offers it (see `discover`), else the legacy ones,
which every server since 1.0 and the stand-in serve:

    GET /api                     {"versions": ["v1"]}
    GET /api/v1                  APIResourceList of the core group
    GET /apis                    APIGroupList: every group, its versions and the preferred one
    GET /apis/<group>/<version>  APIResourceList of one group version

Within a group the preferred version wins, then the others in the server's order, as kubectl's
priority mapper does. Subresources (`deployments/status`) are skipped, and so are resources that
cannot be listed and watched (`tokenreviews`, `bindings`): nothing of them persists for a criterion
to wait for, and a cache of them could never sync.

A group whose version document fails (an aggregated API whose backend is down answers 503) is
reported in `failed_groups` rather than dropped silently: the state then refuses to answer about that
group (StateUnavailable) instead of calling its types "not served".

Discovery is re-read when CustomResourceDefinitions change and periodically (aggregated APIs come
and go without a CRD event); ServedTypes (served.py) owns that schedule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ..api import GroupResource
from ..restmapper import ResourceType, RESTMapper, group_version_path
from .transport import APIError, APIStatusError, Transport

# Discovery documents are small (the largest, /api/v1, is ~20 KiB); 10 s is generous and still well
# under the time a starting replica may take before its readiness probe gives up (30 s by default).
TIMEOUT = 10.0
# The aggregated discovery form (apidiscovery.k8s.io/v2), with plain JSON as the fallback, as kubectl asks.
ACCEPT_AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
# A cluster with many aggregated APIs has ~60 group versions; 8 concurrent GETs keep startup short
# without a burst the API server's priority-and-fairness would queue.
CONCURRENCY = 8


@attrs.frozen
class DiscoveryResult:
    types: tuple[ResourceType, ...]
    # Groups whose resource lists could not be read: their types are unknown, not absent.
    failed_groups: frozenset[str] = frozenset()


def parse_resource_list(doc: Mapping[str, Any], group: str, version: str) -> list[ResourceType]:
    """An APIResourceList -> the listable, watchable top-level resources it names."""
    out: list[ResourceType] = []
    resources = doc.get("resources")
    for r in resources if isinstance(resources, list) else []:
        if not isinstance(r, Mapping):
            continue
        name, kind = r.get("name"), r.get("kind")
        if not isinstance(name, str) or not isinstance(kind, str) or not name or "/" in name:
            continue
        verbs = r.get("verbs")
        if isinstance(verbs, list) and not {"list", "watch"} <= set(verbs):
            continue
        short = r.get("shortNames")
        out.append(ResourceType(
            group=group, version=version, kind=kind, plural=name,
            singular=str(r.get("singularName") or kind.lower()),
            namespaced=bool(r.get("namespaced", False)),
            short_names=tuple(str(s) for s in short) if isinstance(short, list) else (),
        ))
    return out


def _versions(group_doc: Mapping[str, Any]) -> list[str]:
    """A group's versions, the preferred one first."""
    versions = [v.get("version") for v in group_doc.get("versions") or [] if isinstance(v, Mapping)]
    ordered = [v for v in versions if isinstance(v, str) and v]
    preferred = group_doc.get("preferredVersion")
    if isinstance(preferred, Mapping) and preferred.get("version") in ordered:
        ordered.remove(preferred["version"])
        ordered.insert(0, preferred["version"])
    return ordered


async def discover_group(transport: Transport, group: str, versions: Iterable[str] | None = None, *,
                         timeout: float = TIMEOUT) -> list[ResourceType] | None:
    """The served types of one group (preferred version first), or None when the group is not served.

    `versions` skips the group document when the caller already has it. Raises APIError when the
    server could not say (anything but 404 for the group document).
    """
    if versions is None:
        try:
            if group:
                versions = _versions(await transport.get(f"/apis/{group}", timeout=timeout))
            else:
                core = await transport.get("/api", timeout=timeout)
                versions = [v for v in core.get("versions") or [] if isinstance(v, str)]
        except APIStatusError as exc:
            if exc.not_found:
                return None
            raise
    seen: dict[str, ResourceType] = {}
    for version in versions:
        try:
            doc = await transport.get(group_version_path(group, version), timeout=timeout)
        except APIStatusError as exc:
            if exc.not_found:
                continue  # a version removed between the two reads
            raise
        for t in parse_resource_list(doc, group, version):
            seen.setdefault(t.plural, t)
    return list(seen.values())


def parse_aggregated(doc: Mapping[str, Any]) -> tuple[list[ResourceType], set[str]] | None:
    """An APIGroupDiscoveryList -> (types, groups whose discovery is stale); None if `doc` is not one.

    Versions come preferred first; a resource's fields are renamed to the APIResourceList ones and
    read by `parse_resource_list`, so both forms obey the same rules. A version marked `Stale` (an
    aggregated API whose backend did not answer) makes its group unknown, as a failed legacy read does.
    """
    if doc.get("kind") != "APIGroupDiscoveryList" or not isinstance(doc.get("items"), list):
        return None
    types: list[ResourceType] = []
    stale: set[str] = set()
    for item in doc["items"]:
        if not isinstance(item, Mapping):
            continue
        meta = item.get("metadata")
        group = str(meta.get("name") or "") if isinstance(meta, Mapping) else ""
        seen: dict[str, ResourceType] = {}
        for v in item.get("versions") or []:
            if not isinstance(v, Mapping) or not isinstance(v.get("version"), str):
                continue
            if v.get("freshness") == "Stale":
                stale.add(group)  # its resources are the last ones the backend answered: not trusted
            legacy = [{"name": r.get("resource"), "kind": (r.get("responseKind") or {}).get("kind"),
                       "verbs": r.get("verbs"), "shortNames": r.get("shortNames"),
                       "singularName": r.get("singularResource"), "namespaced": r.get("scope") == "Namespaced"}
                      for r in v.get("resources") or [] if isinstance(r, Mapping)]
            for t in parse_resource_list({"resources": legacy}, group, v["version"]):
                seen.setdefault(t.plural, t)
        if group not in stale:
            types.extend(seen.values())
    return types, stale


async def discover(transport: Transport, *, timeout: float = TIMEOUT,
                   concurrency: int = CONCURRENCY) -> DiscoveryResult:
    """Every served type. Raises APIError when the group list itself cannot be read.

    Aggregated discovery first (apidiscovery.k8s.io/v2, GA in Kubernetes 1.30: `/api` and `/apis`
    each answer every group's resources in one document, so a discovery is 2 requests). Measured on a
    real 1.37 API server, the legacy walk below is ~52 requests, and the gate re-reads discovery on
    every CRD change. A server that does not offer the aggregated form (the stand-in, older or
    proxied servers) answers the plain documents, and the legacy walk follows.
    https://github.com/kubernetes/enhancements/tree/master/keps/sig-api-machinery/3352-aggregated-discovery
    """
    # /apis first: a server without the aggregated form answers the plain APIGroupList (the Accept
    # header offers it as the fallback), which the legacy walk uses as it is - no extra request.
    groups_doc = await transport.get("/apis", timeout=timeout, accept=ACCEPT_AGGREGATED)
    aggregated = parse_aggregated(groups_doc)
    if aggregated is not None:
        core = parse_aggregated(await transport.get("/api", timeout=timeout, accept=ACCEPT_AGGREGATED))
        if core is not None:
            if "" in core[1]:
                raise APIError("the core group's discovery is stale")  # nothing can be decided without it
            return DiscoveryResult(tuple(core[0] + aggregated[0]), frozenset(aggregated[1]))
        groups_doc = await transport.get("/apis", timeout=timeout)  # mixed answers: walk the plain form
    groups: list[tuple[str, list[str] | None]] = [("", None)]
    for g in groups_doc.get("groups") or []:
        if isinstance(g, Mapping) and isinstance(g.get("name"), str):
            groups.append((g["name"], _versions(g)))
    limit = asyncio.Semaphore(concurrency)

    async def one(group: str, versions: list[str] | None) -> tuple[str, list[ResourceType] | APIError | None]:
        async with limit:
            try:
                return group, await discover_group(transport, group, versions, timeout=timeout)
            except APIError as exc:
                return group, exc

    types: list[ResourceType] = []
    failed: set[str] = set()
    for group, outcome in await asyncio.gather(*(one(g, v) for g, v in groups)):
        if isinstance(outcome, APIError):
            if not group:
                raise outcome  # without the core group nothing can be decided
            failed.add(group)
        elif outcome:
            types.extend(outcome)
    return DiscoveryResult(tuple(types), frozenset(failed))


def sync_mapper(mapper: RESTMapper, types: Iterable[ResourceType]) -> bool:
    """Make `mapper` serve exactly `types`; True when anything changed."""
    wanted: dict[GroupResource, ResourceType] = {}
    for t in types:
        wanted.setdefault(t.group_resource, t)
    current = {t.group_resource: t for t in mapper.types()}
    changed = False
    for gr in current.keys() - wanted.keys():
        mapper.remove(gr)
        changed = True
    for gr, t in wanted.items():
        if current.get(gr) != t:
            if gr in current:
                mapper.remove(gr)  # drop the old spellings (short names, kind) before adding the new ones
            mapper.add(t)
            changed = True
    return changed


__all__ = [
    "CONCURRENCY",
    "TIMEOUT",
    "DiscoveryResult",
    "discover",
    "discover_group",
    "parse_resource_list",
    "sync_mapper",
]
