"""CriticalServices of mixed kinds for the routing benchmarks (realcluster's unprotected cells, routingscale).

Pure: `critical_service(i)` is the i-th of a population, so a population of 10 is the first 10 of one of
1,000. By index modulo 8:

    0, 1   a named Deployment provider        protected-<k>/dep-<i>
    2, 3   a named ConfigMap provider         protected-<k>/cm-<i>
    4      a selected Deployment provider     selector app=sel-<i> in protected-<k>
    5      a selected ConfigMap provider      selector app=sel-<i> in protected-<k>
    6      a named ConfigMap, holdUpdates     protected-<k>/held-<i>  (updates.gate: UPDATE by name)
    7      a named Deployment, holdUpdates    protected-<k>/held-<i>  (UPDATE and UPDATE of /scale)

with k = i mod NAMESPACES; `cluster_wide` more (`cw-<j>`) select Deployments labelled tier=cw-<j> in every
namespace (no namespace: design/routing.md routes every namespace DELETE then, RoutedNarrowly=False/Broad).
Each has one SpecificResource criterion, ConfigMap `blocker` in namespace CRITERIA_NAMESPACE (not the
provider's: a selected ConfigMap provider whose criterion could be one of its own members is refused as a
dependency cycle), which nobody creates: the criteria are met. The providers are not created either:
routing reads the spec only (routing.needed_routes), and the unprotected requests measured never touch them.
"""

from __future__ import annotations

from typing import Any

NAMESPACES = 20
CRITERIA_NAMESPACE = "criteria"
KINDS = 8


def protected_namespace(i: int) -> str:
    return f"protected-{i % NAMESPACES}"


def critical_service(i: int) -> dict[str, Any]:
    """The i-th CriticalService of the mixed population."""
    ns, kind = protected_namespace(i), i % KINDS
    deployment: dict[str, Any] = {"group": "apps", "resource": "deployments"}
    configmap: dict[str, Any] = {"resource": "configmaps"}
    spec: dict[str, Any] = {}
    provider: dict[str, Any]
    if kind in (0, 1):
        provider = {**deployment, "namespace": ns, "name": f"dep-{i}"}
    elif kind in (2, 3):
        provider = {**configmap, "namespace": ns, "name": f"cm-{i}"}
    elif kind in (4, 5):
        provider = {**(deployment if kind == 4 else configmap), "namespace": ns,
                    "selector": {"matchLabels": {"app": f"sel-{i}"}}}
    else:
        provider = {**(configmap if kind == 6 else deployment), "namespace": ns, "name": f"held-{i}"}
        spec["holdUpdates"] = "WhileBlocking"
    return _body(f"pop-{i}", provider, spec)


def cluster_wide_service(j: int) -> dict[str, Any]:
    """A selector without a namespace: every namespace DELETE is routed (broad, said in status)."""
    provider = {"group": "apps", "resource": "deployments", "selector": {"matchLabels": {"tier": f"cw-{j}"}}}
    return _body(f"cw-{j}", provider, {})


def _body(name: str, provider: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "criticalsvc.io/v1alpha1", "kind": "CriticalService", "metadata": {"name": name},
            "spec": {"provider": provider, "criteria": [{"type": "SpecificResource", "specificResource": {
                "resource": "configmaps", "namespace": CRITERIA_NAMESPACE, "name": "blocker"}}], **spec}}


def population(count: int, cluster_wide: int = 0) -> list[dict[str, Any]]:
    return [critical_service(i) for i in range(count)] + [cluster_wide_service(j) for j in range(cluster_wide)]


def namespaces(count: int) -> list[str]:
    return sorted({protected_namespace(i) for i in range(min(count, NAMESPACES))} | {CRITERIA_NAMESPACE})


def rendered_size(configurations: list[dict[str, Any]]) -> dict[str, Any]:
    """The size of criticalsvc-providers as rendered or stored, its shards together: JSON bytes (compact, as stored)
    in all and of the largest shard (what one write carries), the configurations, their webhooks, and the longest
    matchCondition expression in characters (routing.MAX_EXPRESSION_CHARS is 90,000)."""
    import json

    sizes = [len(json.dumps(c, separators=(",", ":"))) for c in configurations]
    webhooks = [w for c in configurations for w in c.get("webhooks", [])]
    lengths = [len(c["expression"]) for w in webhooks for c in w.get("matchConditions", [])]
    return {"bytes": sum(sizes), "largestBytes": max(sizes, default=0), "configurations": len(configurations),
            "webhooks": len(webhooks), "matchConditions": len(lengths),
            "longestExpressionChars": max(lengths, default=0),
            "webhooksWithoutCondition": sorted({w["name"] for w in webhooks if not w.get("matchConditions")})}


def render_offline(services: list[dict[str, Any]], shipped: dict[str, Any]) -> dict[str, Any]:
    """criticalsvc-providers (every shard) as the router would render it for `services` (built-in types only: the
    REST mapper's defaults), with what goes broad and why; no cluster."""
    from criticalsvc.api import parse_critical_service
    from criticalsvc.restmapper import RESTMapper
    from criticalsvc.routing import desired
    from criticalsvc.webhookconfigurations import render_all

    shipped = {**shipped, "metadata": {"uid": "00000000-0000-4000-8000-000000000000", **shipped["metadata"]}}
    wanted = desired([parse_critical_service(s) for s in services], RESTMapper().lookup)
    rendered = render_all(wanted, shipped, probe_namespace="criticalsvc-system")
    return {**rendered_size([r.configuration for r in rendered]), "routes": len(wanted.routes),
            "broad": sorted({reason for r in rendered for reason in r.broad.values()})}
