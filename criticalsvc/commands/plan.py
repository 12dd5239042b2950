"""`criticalsvc plan -f BUNDLE`: the order in which the gate lets a bundle come apart.

Reads manifests (YAML streams, `kind: List`, directories, ManifestWork bundles), builds the
object-level teardown graph (criticalsvc.graph: content before its namespace, instances before their
CRD, what a criterion covers before the provider and its namespace, the CriticalService last) and
prints its topological generations as numbered phases: delete everything at once, and phase N is
gone before anything of phase N+1 can go.

Exit codes: 0 the order exists, 1 the bundle's CriticalServices wait for each other (the cycle is
printed), 2 bad input (one line naming the file and document).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import networkx as nx

from ..api import CriticalService, ObjectRef
from ..errors import MalformedManifest
from ..graph import find_service_cycle, plan, service_graph, to_dot, to_mermaid
from ..manifests import Manifest, load_path
from ..snapshot import build_state
from ..state import MemoryState


def add_bundle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--filename", action="append", required=True, metavar="BUNDLE",
                   help="manifests: a YAML/JSON file, a directory, or - for standard input (repeatable)")


def load_bundles(paths: Sequence[str]) -> list[Manifest]:
    """Every manifest of every -f, in order; an empty input is bad input, named."""
    manifests: list[Manifest] = []
    for path in paths:
        found = load_path(path)
        if not found:
            raise MalformedManifest("", "no objects in it", where=path)
        manifests.extend(found)
    return manifests


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="print the order in which the gate lets a bundle be torn down",
        description=__doc__.splitlines()[0] if __doc__ else None)
    add_bundle_arguments(p)
    p.add_argument("-o", "--output", choices=("text", "json", "dot", "mermaid"), default="text")
    p.set_defaults(run=run)


def _kind(state: MemoryState, ref: ObjectRef) -> str:
    t = state.mapper.lookup(ref.group_resource)
    return t.kind if t is not None else str(ref.group_resource)


def _display(state: MemoryState, ref: ObjectRef) -> str:
    return f"{_kind(state, ref)} {ref.key}"


def _ref_json(state: MemoryState, ref: ObjectRef) -> dict[str, str]:
    return {"group": ref.group_resource.group, "resource": ref.group_resource.resource, "kind": _kind(state, ref),
            "namespace": ref.namespace, "name": ref.name}


def run(args: argparse.Namespace) -> int:
    state = build_state(load_bundles(args.filename))
    services = sorted(state.critical_services(), key=lambda cs: cs.name)
    objects = sorted(state.objects(), key=lambda o: o.ref)
    sgraph = service_graph(services, state)
    service_cycle = find_service_cycle(sgraph)
    result = plan(objects, services, state)
    out = sys.stdout

    cycle_lines: list[str] = []
    if service_cycle is not None:
        # In waiting order: each one waits for the next (graph edges point from what goes first).
        waiting = list(reversed(service_cycle))
        cycle_lines.append("dependency cycle: " + " -> ".join([*waiting, waiting[0]]))
        for a, b in zip(waiting, [*waiting[1:], waiting[0]], strict=True):
            cycle_lines.append(f"  {sgraph.edges[b, a].get('why', f'{a} waits for {b}')}")
    elif result.cycle is not None:
        chain = [_display(state, r) for r in result.cycle]
        cycle_lines.append("dependency cycle between objects: " + " -> ".join([*chain, chain[0]]))

    if args.output == "json":
        json.dump({
            "objects": len(objects),
            "criticalServices": [cs.name for cs in services],
            "phases": [[_ref_json(state, r) for r in phase] for phase in result.phases],
            "edges": [{"from": _ref_json(state, u), "to": _ref_json(state, v), "why": d.get("why", "")}
                      for u, v, d in sorted(result.graph.edges(data=True), key=lambda e: (e[0], e[1]))],
            "cycle": None if not cycle_lines else {
                "services": list(reversed(service_cycle)) if service_cycle else None,
                "objects": [_ref_json(state, r) for r in result.cycle] if result.cycle else None,
                "message": cycle_lines[0]},
        }, out, indent=2)
        out.write("\n")
    elif args.output == "dot":
        out.write(to_dot(result.graph))
    elif args.output == "mermaid":
        out.write(to_mermaid(result.graph))
    else:
        out.write(_text(state, objects=len(objects), services=services, graph=result.graph,
                        phases=result.phases, files=args.filename, cycle=cycle_lines))
    if cycle_lines:
        if args.output in ("dot", "mermaid"):
            print("\n".join(cycle_lines), file=sys.stderr)
        return 1
    return 0


def _criterion_words(services: Sequence[CriticalService]) -> dict[str, str]:
    """graph.py labels an edge `NAME.spec.criteria[i]`; spell the criterion out next to it."""
    words = {}
    for cs in services:
        for i, c in enumerate(cs.criteria):
            words[f"{cs.name}.spec.criteria[{i}]"] = f"{cs.name}.spec.criteria[{i}]: {c}"
    return words


def _text(state: MemoryState, *, objects: int, services: Sequence[CriticalService], graph: nx.DiGraph,
          phases: Sequence[Sequence[ObjectRef]], files: Sequence[str], cycle: list[str]) -> str:
    names = [cs.name for cs in services]
    head = (f"Teardown plan for {objects} object{'s' if objects != 1 else ''} from {', '.join(files)} "
            f"({len(names)} CriticalService{'s' if len(names) != 1 else ''}"
            + (f": {', '.join(names)}" if names else "") + ").")
    if cycle:
        return "\n".join([head, "No teardown order exists: the CriticalServices wait for each other.", *cycle]) + "\n"
    words = _criterion_words(services)
    lines = [head, "Delete everything at once: the gate lets phase N go only after every earlier phase is gone.", ""]
    for i, phase in enumerate(phases, start=1):
        lines.append(f"phase {i}:")
        for ref in phase:
            lines.append(f"  {_display(state, ref)}")
            why: dict[str, int] = {}
            for _u, _v, d in graph.in_edges(ref, data=True):
                text = str(d.get("why", ""))
                why[text] = why.get(text, 0) + 1
            for text, n in sorted(why.items()):
                lines.append(f"      after {n} object{'s' if n != 1 else ''}: {words.get(text, text)}")
    return "\n".join(lines) + "\n"
