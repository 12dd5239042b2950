"""The examples of api/examples/ as a teardown case on the real control plane: what an operator sets up
before an example's CriticalServices can be enforced, what is delivered, and the order the gate promises.

- `operator_roles`: the ClusterRoles an operator applies with kubectl (not delivered with the stack, so a
  teardown never takes the gate's own grants away midway): the example's own ClusterRoles, a reader role
  for every type its CriticalServices name (providers and criteria: pods, networkpolicies, configmaps,
  the custom types...), aggregated into criticalsvc-reader, and a replay role for every provider type,
  aggregated into criticalsvc-replay (deploy/base/rbac.yaml). The routes of provider types (configmaps,
  networkpolicies, persistentvolumeclaims, custom types) the gate writes itself once a CriticalService
  exists (criticalsvc/routing.py); `enforcing` waits until each CriticalService says so (Ready, Enforcing).
- `safe_order`: the pairs (first, then) of `criticalsvc plan -o json` the gate enforces: every edge a
  criterion makes, and a CriticalService after its provider (after the provider's namespace only when the
  namespace is the provider: the gate lets a CriticalService go while its provider's namespace is not
  terminating). Content before its namespace and instances before their CRD are the API server's.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import yaml

from .client import Client

EXAMPLES = Path(__file__).resolve().parents[2] / "api" / "examples"
CRITICAL_SERVICES = "/apis/criticalsvc.io/v1alpha1/criticalservices"
# The examples a ManifestWork teardown cannot take apart here, and why.
NOT_TORN_DOWN = {
    "labelled-objects.yaml": "its objects are labelled criticalsvc.io/deletion-protected=Always: no deleter takes "
                             "them until a person removes the label (that is the example)",
    "warn-enforcement.yaml": "enforcement: Warn allows the unsafe order on purpose, and its Certificates' finalizer "
                             "is removed by cert-controller's pods, which do not run here: once the Deployment is "
                             "gone first, they stay Terminating (what the audit mode warns of)",
    "webhook-provider.yaml": "its labelled Widgets cannot be created: the ValidatingWebhookConfiguration "
                             "(failurePolicy: Fail, CREATE included) calls widget-webhook's pods, which do not run "
                             "here, so the agent's apply of the ManifestWork never completes",
    "replay.yaml": "an overlay of reference-story.yaml (its CriticalService with replay on), not a stack",
    "reference-story.yaml": "torn down as a ManifestWork on its own, with its finalizer's controller "
                            "(test_reference_story_as_a_manifestwork)",
}

JSON = dict[str, Any]


def torn_down() -> list[str]:
    """The examples delivered as ManifestWorks, by file name."""
    return sorted(p.name for p in EXAMPLES.glob("*.yaml") if p.name not in NOT_TORN_DOWN)


def documents(example: str) -> list[JSON]:
    return [d for d in yaml.safe_load_all((EXAMPLES / example).read_text(encoding="utf-8")) if d]


def key(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def _named_types(spec: Any) -> Iterator[tuple[str, str]]:
    """(group, resource) of every object reference in a CriticalService spec (provider, criteria)."""
    if isinstance(spec, dict):
        if isinstance(spec.get("resource"), str):
            yield spec.get("group", ""), spec["resource"]
        for value in spec.values():
            yield from _named_types(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _named_types(value)


def operator_roles(docs: Iterable[JSON], name: str) -> list[JSON]:
    """The example's own ClusterRoles, and a reader and a replay role named after `name` (see above)."""
    docs = list(docs)
    services = [d for d in docs if d["kind"] == "CriticalService"]
    read = sorted({t for s in services for t in _named_types(s["spec"])})
    providers = sorted({(s["spec"]["provider"].get("group", ""), s["spec"]["provider"]["resource"])
                        for s in services} | {("", "namespaces"), ("criticalsvc.io", "criticalservices")})

    def role(kind: str, types: list[tuple[str, str]], verbs: list[str]) -> JSON:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": f"criticalsvc-{kind}-{name}",
                             "labels": {f"criticalsvc.io/aggregate-to-{kind}": "true"}},
                "rules": [{"apiGroups": [g], "resources": [r], "verbs": verbs} for g, r in types]}

    return [*(d for d in docs if d["kind"] == "ClusterRole"), role("reader", read, ["get", "list", "watch"]),
            role("replay", providers, ["delete"])]


def delivered(docs: Iterable[JSON], *, replay: bool) -> list[JSON]:
    """What the stack's ManifestWork carries: everything but the ClusterRoles, every CriticalService with
    replayDeletion WhenTearingDown when `replay`, without it otherwise."""
    out = []
    for d in docs:
        if d["kind"] == "ClusterRole":
            continue
        d = copy.deepcopy(d)
        if d["kind"] == "CriticalService":
            if replay:
                d["spec"]["replayDeletion"] = "WhenTearingDown"
            else:
                d["spec"].pop("replayDeletion", None)
        out.append(d)
    return out


@attrs.frozen
class Planned:
    """An example's objects (key -> REST path) and the safe order the gate enforces, from its plan."""

    paths: dict[str, str]
    order: tuple[tuple[str, str], ...]  # (goes first, goes after)

    def dependents(self) -> dict[str, list[str]]:
        """What the Observer checks: provider -> what must be gone first."""
        found: dict[str, list[str]] = {}
        for first, then in self.order:
            found.setdefault(then, []).append(first)
        return found


def plan(example: str) -> Planned:
    """`criticalsvc plan -f <example> -o json`: REST paths of every object, and the enforced edges."""
    docs = documents(example)
    out = json.loads(subprocess.run([sys.executable, "-m", "criticalsvc", "plan", "-f", str(EXAMPLES / example),
                                     "-o", "json"], capture_output=True, text=True, check=True).stdout)
    version = {key(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d["apiVersion"]
               for d in docs}

    def ref_key(o: JSON) -> str:
        return key(o["kind"], o["namespace"], o["name"])

    paths = {}
    for phase in out["phases"]:
        for o in phase:
            if o["kind"] == "ClusterRole":
                continue
            api_version = version[ref_key(o)]
            base = f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"
            middle = f"/namespaces/{o['namespace']}" if o["namespace"] else ""
            paths[ref_key(o)] = f"{base}{middle}/{o['resource']}/{o['name']}"
    providers = {d["metadata"]["name"]: d["spec"]["provider"] for d in docs if d["kind"] == "CriticalService"}

    def enforced(edge: JSON) -> bool:
        first, then = edge["from"], edge["to"]
        if ".spec.criteria[" in edge["why"]:
            return True
        return (then["kind"] == "CriticalService" and "goes after what it protects" in edge["why"]
                and (first["kind"] != "Namespace" or providers[then["name"]].get("resource") == "namespaces"))

    order = tuple((ref_key(e["from"]), ref_key(e["to"])) for e in out["edges"] if enforced(e))
    return Planned(paths, order)


def enforcing(client: Client, name: str) -> bool:
    """The CriticalService's Ready condition is True (Enforcing: its provider type routed, its caches synced)."""
    status = (client.get(f"{CRITICAL_SERVICES}/{name}") or {}).get("status") or {}
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
