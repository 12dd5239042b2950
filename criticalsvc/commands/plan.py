"""`criticalsvc plan -f BUNDLE`: the order in which the gate lets a bundle come apart.

Reads manifests (YAML streams, `kind: List`, directories, ManifestWork bundles), builds the
object-level teardown graph (criticalsvc.graph: content before its namespace, instances before their
CRD, what a criterion covers before the provider and its namespace, the CriticalService last) and
prints its topological generations as numbered phases: delete everything at once, and phase N is
gone before anything of phase N+1 can go. `-o gantt` and `-o svg` draw the phases as a picture
(criticalsvc.picture), `-o dot` and `-o mermaid` the graph.

Exit codes: 0 the order exists, 1 the bundle's CriticalServices wait for each other (the cycle is
printed), 2 bad input (one line naming the file and document).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import networkx as nx

from ..api import CriticalService, ObjectRef
from ..errors import InvalidInput, MalformedManifest
from ..graph import find_service_cycle, plan, service_graph, to_dot, to_mermaid
from ..manifests import Manifest
from ..picture import plan_picture, to_gantt, to_svg
from ..snapshot import build_state
from ..state import MemoryState


def add_bundle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-f", "--filename", action="append", required=True, metavar="BUNDLE",
                   help="manifests: a YAML/JSON file, a directory, or - for standard input (repeatable)")


class InvalidDocuments(MalformedManifest):
    """Several documents of the bundles are unusable: all of them are reported at once, one line each,
    naming the file, the document, its kind and name, and the field."""

    def __init__(self, path: str, problem: str, *, where: str = "",
                 problems: Sequence[tuple[str, InvalidInput]] = ()) -> None:
        self.problems = list(problems)
        super().__init__(path, problem, where=where)

    @classmethod
    def of(cls, problems: Sequence[tuple[str, InvalidInput]]) -> InvalidDocuments:
        lines = [f"{len(problems)} invalid documents; fix them all, then run again:"]
        for label, exc in problems:
            where = f"{exc.where} ({label})" if exc.where and label else exc.where or label
            lines.append("  " + ": ".join(p for p in (where, exc.path, exc.problem) if p))
        return cls("", "\n".join(lines), problems=problems)


# (position for sorting: -f index, document number, nesting), "Kind name" of the document, the error
_Problem = tuple[tuple[int, ...], str, InvalidInput]


def load_bundles(paths: Sequence[str], *, check_crds: bool = False) -> list[Manifest]:
    """Every manifest of every -f, in order; an empty input is bad input, named.

    A bad document does not stop the reading: every unusable document of every file is found (its
    shape, its metadata, a CriticalService spec, with `check_crds` a CRD without group/names), and
    when there are several they are all reported at once (InvalidDocuments). A single one is raised
    as before, by the first step that meets it, in the words that step uses."""
    manifests: list[Manifest] = []
    problems: list[_Problem] = []
    positions: dict[int, tuple[int, ...]] = {}
    for i, path in enumerate(paths):
        found, errors = _read(path, (i,), positions)
        if not found and not errors:
            errors.append(((i,), "", MalformedManifest("", "no objects in it", where=path)))
        manifests.extend(found)
        problems.extend(errors)
    structural = len(problems)
    problems.extend(_check(manifests, positions, check_crds=check_crds))
    if len(problems) >= 2:
        problems.sort(key=lambda p: p[0])
        raise InvalidDocuments.of([(label, exc) for _pos, label, exc in problems])
    if structural:
        raise problems[0][2]
    return manifests  # a single problem found by _check is raised by the command itself, as before


def _read(path: str, position: tuple[int, ...], positions: dict[int, tuple[int, ...]]
          ) -> tuple[list[Manifest], list[_Problem]]:
    """manifests.load_path, document by document: the usable manifests and every unusable document."""
    from pathlib import Path

    from ..manifests import _documents, _expand

    if path != "-" and Path(path).is_dir():
        files = sorted(f for f in Path(path).rglob("*") if f.suffix in (".yaml", ".yml", ".json") and f.is_file())
        if not files:
            return [], [(position, "", MalformedManifest("", "no .yaml, .yml or .json files in this directory",
                                                         where=path))]
        found: list[Manifest] = []
        errors: list[_Problem] = []
        for j, f in enumerate(files):
            more, errs = _read(str(f), (*position, j), positions)
            found += more
            errors += errs
        return found, errors
    where = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return [], [(position, "", MalformedManifest("", "no such file", where=path))]
    except (OSError, UnicodeDecodeError) as exc:
        return [], [(position, "", MalformedManifest("", f"cannot read: {exc}", where=path))]
    try:
        if text.lstrip().startswith(("{", "[")):  # JSON, as manifests.load_text reads it
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise MalformedManifest("", f"line {exc.lineno}: not valid JSON: {exc.msg}", where=where) from None
            docs = [(doc, f"{where}: document {i}") for i, doc in
                    enumerate(parsed if isinstance(parsed, list) else [parsed], start=1)]
        else:
            docs = list(_documents(text, where))
    except MalformedManifest as exc:  # not YAML (or JSON) at all
        return [], [(position, "", exc)]
    found, errors = [], []
    for k, (doc, doc_where) in enumerate(docs):
        try:
            expanded = list(_expand(doc, doc_where, where))
        except MalformedManifest as exc:
            errors.append(((*position, k), _label(_nested(doc, exc.where[len(doc_where):])), exc))
            continue
        for m in expanded:
            positions[id(m)] = (*position, k)
        found += expanded
    return found, errors


def _check(manifests: Sequence[Manifest], positions: dict[int, tuple[int, ...]], *, check_crds: bool
           ) -> list[_Problem]:
    """snapshot.build_state's checks, each document on its own: every problem, not only the first."""
    problems: list[_Problem] = []
    with contextlib.suppress(Exception):  # anything but invalid input is the command's to report, in its own words
        build_state(manifests, check_crds=check_crds,
                    on_invalid=lambda m, exc: problems.append((positions.get(id(m), ()), _label(m.obj), exc)))
    return problems


def _nested(doc: Any, suffix: str) -> Any:
    """The object inside a List or ManifestWork document that an error's location points at."""
    for key, index in re.findall(r"(items|spec\.workload\.manifests)\[(\d+)\]", suffix):
        try:
            doc = doc["items"][int(index)] if key == "items" else doc["spec"]["workload"]["manifests"][int(index)]
        except (KeyError, IndexError, TypeError):
            break
    return doc


def _label(doc: Any) -> str:
    """`Kind name` of a document, as far as it says."""
    if not isinstance(doc, Mapping):
        return "not an object"
    kind = doc.get("kind") if isinstance(doc.get("kind"), str) and doc.get("kind") else "no kind"
    metadata = doc.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return f"{kind} {name}" if isinstance(name, str) and name else f"{kind}, no name"


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "plan", help="print the order in which the gate lets a bundle be torn down",
        description=__doc__.splitlines()[0] if __doc__ else None)
    add_bundle_arguments(p)
    p.add_argument("-o", "--output", choices=("text", "json", "dot", "mermaid", "gantt", "svg"), default="text",
                   help="dot, mermaid: the teardown graph; gantt (Mermaid), svg: the phases as a picture")
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
    elif args.output in ("gantt", "svg"):
        drawn = plan_picture([[_display(state, r) for r in phase] for phase in result.phases],
                             title=f"Teardown plan for {', '.join(args.filename)}")
        out.write(to_gantt(drawn) if args.output == "gantt" else to_svg(drawn))
    else:
        out.write(_text(state, objects=len(objects), services=services, graph=result.graph,
                        phases=result.phases, files=args.filename, cycle=cycle_lines))
    if cycle_lines:
        if args.output in ("dot", "mermaid", "gantt", "svg"):
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
