"""`criticalsvc graph`: the dependency graph of all CriticalServices (text, DOT, mermaid), cycles marked.

An edge B -> A means "B's teardown must finish before A's provider may go" (criticalsvc.graph).
Exit 0 when there is no cycle, 1 when there is one (it is printed), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import networkx as nx

from ..graph import service_graph, to_dot, to_mermaid
from ._source import add_source_arguments, load_source


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "graph", help="the dependency graph of all CriticalServices, cycles marked",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("-o", "--output", choices=("text", "json", "dot", "mermaid"), default="text")
    # -n is accepted and changes nothing, as `kubectl get nodes -n x`: CriticalServices are cluster-scoped.
    add_source_arguments(p, namespace_help="ignored: CriticalServices are cluster-scoped (accepted, as kubectl "
                                           "accepts it for cluster-scoped resources)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    state = load_source(args)
    graph = service_graph(state.critical_services(), state)
    cycles = sorted((sorted(c) for c in nx.simple_cycles(graph)), key=lambda c: (len(c), c))
    in_cycle = {n for c in cycles for n in c}
    for n in graph.nodes:
        graph.nodes[n]["cycle"] = n in in_cycle
    out = sys.stdout
    if args.output == "dot":
        text = to_dot(graph, name="criticalservices")
        for n in sorted(in_cycle):  # mark cycle members red
            text = text.replace(f'  "{n}";', f'  "{n}" [color=red, penwidth=2];')
        out.write(text)
    elif args.output == "mermaid":
        text = to_mermaid(graph)
        if in_cycle:
            text += "  classDef cycle stroke:#d00,stroke-width:3px\n"
            ids = {n: f"n{i}" for i, n in enumerate(sorted(graph.nodes, key=str))}
            text += "".join(f"  class {ids[n]} cycle\n" for n in sorted(in_cycle))
        out.write(text)
    elif args.output == "json":
        json.dump({"nodes": sorted(graph.nodes),
                   "edges": [{"from": u, "to": v, "why": d.get("why", "")}
                             for u, v, d in sorted(graph.edges(data=True))],
                   "cycles": cycles}, out, indent=2)
        out.write("\n")
    else:
        order = [] if cycles else list(nx.topological_generations(graph))
        out.write(f"{graph.number_of_nodes()} CriticalServices, {graph.number_of_edges()} dependencies\n")
        for u, v, d in sorted(graph.edges(data=True)):
            out.write(f"  {u} -> {v}: {d.get('why', '')}\n")
        for i, gen in enumerate(order, start=1):
            out.write(f"teardown phase {i}: {', '.join(sorted(gen))}\n")
        for c in cycles:
            out.write(f"CYCLE: {' -> '.join([*c, c[0]])}\n")
    return 1 if cycles else 0
