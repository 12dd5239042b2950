"""Discovery documents, as pure functions of what is served (registry.served_groups).

`/api` and `/apis` in the legacy form (APIVersions, APIGroupList) or, when the client asks for it, the
aggregated apidiscovery.k8s.io/v2 form (k8s.io/apiserver pkg/endpoints/discovery/aggregated); `/apis/<g>`
(APIGroup) and `/api/v1`, `/apis/<g>/<v>` (APIResourceList); `/version`. CRD groups appear as the
CRD is created and go when it is gone, because the store's mapper follows the CRDs
(design/kubernetes-semantics.md §12).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .registry import BUILTIN_GROUPS, SCALE_KIND, SUBRESOURCE_VERBS, Served, subresources

ServedGroups = Mapping[str, Mapping[str, list[Served]]]

SERVER_VERSION = {
    # minor "32": the Cloud SDK kubectl dispatcher runs the kubectl matching the server's minor, and
    # 1.32 is the one measured against this stand-in (design/kubernetes-semantics.md §12).
    "major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "", "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z", "goVersion": "go1.23.3", "compiler": "gc", "platform": "linux/amd64",
}
DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
ROOT_PATHS = {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/openapi/v2", "/openapi/v3", "/readyz",
                        "/version"]}


def wants_aggregated(accept: str) -> bool:
    """True when Accept offers apidiscovery v2 (kubectl 1.28 offers only v2beta1: it gets the legacy form)."""
    for media in accept.split(","):
        params = dict(p.strip().partition("=")[::2] for p in media.split(";")[1:])
        if params.get("g") == "apidiscovery.k8s.io" and params.get("v") == "v2" \
                and params.get("as") == "APIGroupDiscoveryList":
            return True
    return False


def api_versions(server_address: str) -> dict[str, Any]:
    """`/api` in the legacy form."""
    return {"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]}


def named_groups(groups: ServedGroups) -> dict[str, Mapping[str, list[Served]]]:
    """The named groups (not the core group ""), built-in groups first, as `/apis` lists them."""
    return {g: vs for g, vs in sorted(groups.items(), key=lambda kv: _group_order(kv[0])) if g}


def api_group_list(named: ServedGroups) -> dict[str, Any]:
    """`/apis` in the legacy form."""
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(g, list(vs)) for g, vs in named.items()]}


def api_group(group: str, versions: list[str]) -> dict[str, Any]:
    """`/apis/<group>`: its versions, the preferred one first."""
    ordered = sorted(versions, key=_version_order)
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def api_resource_list(group: str, version: str, entries: Iterable[Served]) -> dict[str, Any]:
    """`/api/v1` or `/apis/<group>/<version>`: the resources and subresources of one group version."""
    gv = f"{group}/{version}" if group else version
    resources: list[dict[str, Any]] = []
    for t, status, categories, verbs in entries:
        resource: dict[str, Any] = {"name": t.plural, "singularName": t.singular, "namespaced": t.namespaced,
                                    "kind": t.kind, "verbs": list(verbs)}
        if t.short_names:
            resource["shortNames"] = list(t.short_names)
        if categories:
            resource["categories"] = list(categories)
        resources.append(resource)
        for sub in subresources(t, status):
            entry: dict[str, Any] = {"name": f"{t.plural}/{sub}", "singularName": "", "namespaced": t.namespaced,
                                     "kind": t.kind, "verbs": SUBRESOURCE_VERBS[sub]}
            if sub == "scale":
                entry.update(SCALE_KIND)
            resources.append(entry)
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def aggregated(groups: ServedGroups, stale: Iterable[str] = ()) -> dict[str, Any]:
    """An apidiscovery.k8s.io/v2 APIGroupDiscoveryList (design/kubernetes-semantics.md §12); a group in
    `stale` is marked `Stale`, as for an aggregated API whose backend does not answer."""
    items = []
    for group, versions in groups.items():
        entries = []
        for version in sorted(versions, key=_version_order):  # the preferred version first
            resources = []
            for t, status, categories, verbs in versions[version]:
                kind = {"group": t.group, "version": t.version, "kind": t.kind}
                resource: dict[str, Any] = {
                    "resource": t.plural, "responseKind": kind, "scope": "Namespaced" if t.namespaced else "Cluster",
                    "singularResource": t.singular, "verbs": list(verbs)}
                if t.short_names:
                    resource["shortNames"] = list(t.short_names)
                if categories:
                    resource["categories"] = list(categories)
                subs = subresources(t, status)
                if subs:
                    resource["subresources"] = [{"subresource": s, "responseKind": SCALE_KIND if s == "scale" else kind,
                                                 "verbs": SUBRESOURCE_VERBS[s]} for s in subs]
                resources.append(resource)
            entries.append({"version": version, "resources": resources,
                            "freshness": "Stale" if group in stale else "Current"})
        items.append({"metadata": {"name": group}, "versions": entries})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}


def _version_order(version: str) -> tuple[int, int, int]:
    """Kubernetes version priority: GA > beta > alpha, then by number (v1 > v1beta2 > v1alpha1)."""
    m = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if m is None:
        return (3, 0, 0)
    stability = {"alpha": 2, "beta": 1, None: 0}[m[2]]
    return (stability, -int(m[1]), -int(m[3] or 0))


def _group_order(group: str) -> tuple[int, str]:
    return (0 if group in BUILTIN_GROUPS else 1, group)
