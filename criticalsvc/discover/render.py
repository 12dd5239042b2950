"""A Discovery as manifests to review and apply: YAML with a comment per CriticalService, or a JSON List.

Each CriticalService also carries its confidence and evidence as annotations (EVIDENCE_ANNOTATION), so what
was applied still says why after the comments are gone. The read grant comes last, as a ClusterRole labelled
for aggregation into the gate's reader role; what was skipped ends the YAML as comments (JSON: `skipped`
lines for stderr, from `skipped_lines`).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from ..api import API_VERSION, KIND, Criterion, FinalizerCriterion, GroupResource, SpecificResourceCriterion
from .propose import (
    CONFIDENCE_ANNOTATION,
    DISCOVERED_LABEL,
    EVIDENCE_ANNOTATION,
    GRANT_NAME,
    READER_AGGREGATION_LABEL,
    Discovery,
    Proposal,
)

# libyaml's dumper when PyYAML has it (~10x faster than the pure-Python one), else the pure one: same output.
_Dumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# An annotation value may be large (256 KiB for all of an object's), but a reviewer reads the first lines.
MAX_EVIDENCE = 4000


def criterion_manifest(c: Criterion) -> dict[str, Any]:
    if isinstance(c, FinalizerCriterion):
        return {"type": "Finalizer", "finalizer": {"group": c.group_resource.group,
                                                   "resource": c.group_resource.resource,
                                                   "finalizerName": c.finalizer_name}}
    if isinstance(c, SpecificResourceCriterion):
        t = c.target
        body = {"group": t.group_resource.group, "resource": t.group_resource.resource, "name": t.name}
        if t.namespace:
            body["namespace"] = t.namespace
        return {"type": "SpecificResource", "specificResource": body}
    raise TypeError(f"discover proposes no {type(c).__name__}")


def manifest(p: Proposal, *, enforcement: str = "Enforce") -> dict[str, Any]:
    evidence = "\n".join(d.evidence for d in p.dependencies)
    spec: dict[str, Any] = {
        "provider": {"group": p.provider.group_resource.group, "resource": p.provider.group_resource.resource,
                     "namespace": p.provider.namespace, "name": p.provider.name},
        "criteria": [criterion_manifest(d.criterion) for d in p.dependencies],
    }
    if enforcement != "Enforce":
        spec["enforcement"] = enforcement
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": p.name, "labels": {DISCOVERED_LABEL: "true"},
                         "annotations": {CONFIDENCE_ANNOTATION: p.confidence.value,
                                         EVIDENCE_ANNOTATION: evidence[:MAX_EVIDENCE]}},
            "spec": spec}


def grant_manifest(grants: tuple[GroupResource, ...]) -> dict[str, Any]:
    by_group: dict[str, list[str]] = {}
    for gr in grants:
        by_group.setdefault(gr.group, []).append(gr.resource)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": GRANT_NAME, "labels": {READER_AGGREGATION_LABEL: "true",
                                                        DISCOVERED_LABEL: "true"}},
            "rules": [{"apiGroups": [g], "resources": sorted(rs), "verbs": ["get", "list", "watch"]}
                      for g, rs in sorted(by_group.items())]}


def manifests(d: Discovery, *, enforcement: str = "Enforce") -> list[dict[str, Any]]:
    out = [manifest(p, enforcement=enforcement) for p in d.proposals]
    if d.grants:
        out.append(grant_manifest(d.grants))
    return out


def _dump(obj: Any) -> str:
    return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=120))


def _comment(text: str) -> str:
    return "\n".join(f"# {line}".rstrip() for line in text.splitlines()) + "\n"


def skipped_lines(d: Discovery) -> list[str]:
    return [f"skipped {s}" for s in d.skipped]


def render_yaml(d: Discovery, *, enforcement: str = "Enforce") -> str:
    docs = []
    header = (f"CriticalServices proposed by `criticalsvc discover` from {d.objects} objects: "
              f"{len(d.proposals)} proposal(s), {len(d.skipped)} thing(s) skipped (listed at the end).\n"
              "Review each: the evidence says why its provider may go only once its criteria hold.")
    docs.append(_comment(header).rstrip("\n"))
    for p in d.proposals:
        lines = [f"{p.kind} {p.provider.namespace}/{p.provider.name} (confidence: {p.confidence.value})"]
        for i, dep in enumerate(p.dependencies):
            lines.append(f"criteria[{i}] ({dep.confidence.value}): {dep.evidence}")
            lines.append(f"  if it went first: {dep.consequence}")
        body = _dump(manifest(p, enforcement=enforcement))
        docs.append(_comment("\n".join(lines)) + body.rstrip("\n"))
    if d.grants:
        why = ("The gate reads every type its criteria name; this grant adds the ones its shipped reader role "
               "does not cover (aggregated into criticalsvc-reader).")
        docs.append(_comment(why) + _dump(grant_manifest(d.grants)).rstrip("\n"))
    text = "\n---\n".join(docs) + "\n"
    if d.skipped:
        text += _comment("Skipped:\n" + "\n".join(f"- {s}" for s in d.skipped))
    return text


def render_json(d: Discovery, *, enforcement: str = "Enforce") -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests(d, enforcement=enforcement)},
                      indent=2) + "\n"
