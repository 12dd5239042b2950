"""`criticalsvc explain KIND/NAME [-n NS]`: would a DELETE be allowed now, and if not, why?"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from ..api import NAMESPACES, ObjectRef
from ..discover.diagnose import Diagnosis, diagnose
from ..errors import InvalidInput
from ..explain import explain, render_text
from ._source import add_source_arguments, default_namespace, load_source


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "explain", help="why can't I delete this? the gate's answer, criterion by criterion",
        description="Show whether deleting KIND/NAME would be allowed now, and exactly what blocks it.")
    p.add_argument("target", metavar="KIND/NAME", help="e.g. deployment/finalizer-deployment, ns/payments, csvc/x")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.add_argument("--gate-namespace", default="criticalsvc-system", metavar="NS",
                   help="where the gate keeps its deletion intents (default %(default)s)")
    add_source_arguments(p, namespace_help="namespace of a namespaced object (default, as in kubectl: the kubeconfig "
                                           "context's namespace, else \"default\")")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    kind, sep, name = args.target.partition("/")
    if not sep or not kind or not name:
        raise InvalidInput("KIND/NAME", f"expected KIND/NAME (e.g. deployment/web), got {args.target!r}")
    state = load_source(args)
    gr = state.mapper.resolve_name(kind)
    if gr is None:
        raise InvalidInput("KIND/NAME", f"the server doesn't have a resource type {kind!r}")
    t = state.mapper.lookup(gr)
    namespaced = t.namespaced if t is not None else bool(args.namespace)
    namespace = args.namespace
    if namespaced and not namespace:
        namespace = default_namespace(args)  # as kubectl: the context's namespace, else "default"
    target = ObjectRef(gr, namespace if namespaced and gr != NAMESPACES else "", name)
    obj = None
    if not args.state and t is not None:
        # The object as the API server would send it as oldObject: a type no CriticalService names is not in the
        # snapshot, but its labels still count; and the annotations of one that is say which tool would delete it
        # (criticalsvc/deleters.py: a teardown stuck on what that tool never deletes).
        from ..livesnapshot import read_object

        obj = read_object(t, namespace=target.namespace, name=name, kubeconfig=args.kubeconfig, context=args.context)
    intents: tuple[Any, ...] = ()
    if not args.state:
        from ..livesnapshot import read_deletion_intents

        intents = tuple(read_deletion_intents(namespace=args.gate_namespace, kubeconfig=args.kubeconfig,
                                              context=args.context) or ())
    result = explain(target, state, obj=obj, intents=intents)
    stored = state.get(target)
    deleting = (stored is not None and stored.terminating) or \
        bool(((obj or {}).get("metadata") or {}).get("deletionTimestamp"))
    if deleting:
        result = attrs.evolve(result, diagnosis=_diagnose(args, target))
    if args.output == "json":
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(result))
    return 0 if result.decision.allowed else 1


def _diagnose(args: argparse.Namespace, target: ObjectRef) -> Diagnosis | None:
    """Why `target`, terminating, does not go: read what the diagnosis needs (snapshot or live) and trace it."""
    from ..discover.inventory import from_objects
    from ..discover.propose import access_questions
    from ..discover.rbac import review

    if args.state:
        from ..manifests import load_path

        inv = from_objects(m.obj for m in load_path(args.state))
        answers = {q: review(q, inv) for q in access_questions(inv, gate_namespace=args.gate_namespace)}
    else:
        from ..discover.read import read_cluster

        where = target.name if target.group_resource == NAMESPACES else target.namespace or None
        read, answers = read_cluster(kubeconfig=args.kubeconfig, context=args.context, namespace=where,
                                     questions_for=lambda i: access_questions(i, gate_namespace=args.gate_namespace))
        inv = read.inventory
    return diagnose(target, inv, answers, gate_namespace=args.gate_namespace)
