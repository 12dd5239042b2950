"""`criticalsvc simulate -f BUNDLE`: delete a bundle in a simulated cluster and watch the gate order it.

Loads the bundle into the simulated control plane (criticalsvc.sim: the real gate as its webhook,
Kubernetes' namespace controller, CRD cleanup and garbage collector, and an operator per Finalizer
criterion), deletes all of it the way the chosen client would, and prints what happened, in virtual
time, and the verdict. `--no-gate` runs the same teardown without the gate: what it saves you from.

The text explains its words once (DENIED, marked, gone), lists the warnings the gate returned for
DELETEs it let through (`enforcement: Warn`: what Enforce would have refused), and ends with what to
try next (plan, explain, the same teardown with or without the gate) above the verdict line.

`-o gantt` draws the same run as a Mermaid Gantt chart and `-o svg` as an SVG (criticalsvc.picture):
a bar per object from its first DELETE until it was gone, refusals marked, grouped by the plan's phases.

Exit codes: 0 the teardown completed, 1 it got stuck (what holds each remaining object is printed),
2 bad input (one line naming the file and document; several bad documents: one line each).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..api import NAMESPACES, CriticalService, Enforcement, GroupResource, ObjectRef, parse_critical_service
from ..errors import MalformedManifest
from ..graph import plan
from ..manifests import Manifest
from ..picture import Picture, to_gantt, to_svg
from ..sim.cluster import Cluster, TeardownVerdict
from ..sim.timeline import REMOVED, Event, render_text, to_picture
from ..snapshot import build_state, is_critical_service
from ..state import provider_objects
from .plan import add_bundle_arguments, load_bundles

WIDTH = 120  # fixed, so the output is the same in a terminal, a pipe and a test

CLIENT_WORDS = {
    "manifestwork": ("the ManifestWork agent: one pass of DELETEs, refusals dropped; the garbage collector "
                     "deletes what was refused, retrying up to 1000 s"),
    "kubectl": "kubectl delete -f: one pass in file order, no retry",
    "namespace": "namespace deletion: the bundle's namespaces (and what lives outside them), retried; "
                 "the namespace controller deletes the content",
    "gc-background": "the garbage collector: the bundle's root owners deleted (Background), the rest by the garbage "
                     "collector, each refusal retried with backoff 5 ms → 1000 s",
    "gc-foreground": "the garbage collector: the bundle's root owners deleted (Foreground), the rest by the garbage "
                     "collector, each refusal retried with backoff 5 ms → 1000 s",
    "flux": ("Flux's kustomize-controller deleting a Kustomization: every object of its inventory each pass, in "
             "reverse apply order; the whole pass again after a refusal (750 ms doubling)"),
    "helm": ("helm uninstall: one pass in Helm's uninstall order by kind, each kind at once, no retry (with "
             "--helm-crds-dir the CRDs came from the chart's crds/ and are never deleted)"),
    "argocd": ("Argo CD deleting an Application (resources-finalizer.argocd.argoproj.io): the highest sync wave of "
               "its objects at once (Foreground), never a CRD, nothing while any of them terminates; again on each "
               "change of them"),
    "argocd-background": ("Argo CD deleting an Application (resources-finalizer.argocd.argoproj.io/background): as "
                          "argocd, Background"),
    "ideal": "the ideal deleter: each object the moment the gate allows it (the shortest possible teardown)",
}


# The simulator is only imported by the commands that use it.
from ..sim.clients import CLIENTS, FLUX_DELETION_POLICIES  # noqa: E402
from ..verify.explorer import inert_types  # noqa: E402
from ..verify.interleavings import ChoiceError, ChoiceRandom, Path  # noqa: E402
from ..verify.interleavings import parse as parse_choices  # noqa: E402


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "simulate", help="delete a bundle in a simulated cluster and show the order the gate enforces",
        description=__doc__.splitlines()[0] if __doc__ else None)
    add_bundle_arguments(p)
    p.add_argument("--client", choices=CLIENTS, default="manifestwork",
                   help="who deletes the bundle (default: manifestwork); gc-background/gc-foreground delete its root "
                        "owners and leave the rest to the garbage collector; ideal deletes each object the moment the "
                        "gate allows it (the shortest possible teardown)")
    p.add_argument("--no-gate", action="store_true", help="run the same teardown without the gate")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed for the interleaving: request order, reconcile delays (default 0)")
    p.add_argument("-o", "--output", choices=("text", "json", "gantt", "svg"), default="text",
                   help="gantt: a Mermaid Gantt chart of the run (GitHub renders it); svg: the same as an SVG")
    p.add_argument("--legacy-namespace-deletion", action="store_true",
                   help="delete namespace content in any order (Kubernetes < 1.33) instead of pods first")
    p.add_argument("--repeat", type=float, metavar="SECONDS",
                   help="with --client kubectl: re-run `kubectl delete -f` every SECONDS until it succeeds")
    p.add_argument("--interleaving", metavar="CHOICES",
                   help="instead of --seed: the explicit choices (e.g. 3.0.1; - for none) of `criticalsvc verify`, "
                        "which prints them with each bundle it finds (criticalsvc/verify/interleavings.py)")
    p.add_argument("--flux-deletion-policy", choices=FLUX_DELETION_POLICIES, default=None,
                   help="with --client flux: the Kustomization's spec.deletionPolicy (default MirrorPrune); "
                        "WaitForTermination removes its finalizer only once what it deleted is gone")
    p.add_argument("--helm-crds-dir", action="store_true",
                   help="with --client helm: the bundle's CRDs are in the chart's crds/, which Helm never deletes")
    p.set_defaults(run=run)


# Said once, under the heading: the words the story below uses.
WORDS = ("Words: DENIED = the gate refused the DELETE (a retrying client tries again later); marked = the DELETE was "
         "accepted and the object got a deletionTimestamp, but it stays until its finalizers are removed (\"waits "
         "for\" names them); gone = removed from the API; deleted at once = it had no finalizers; a finalizer is "
         "removed by the controller that owns it, so an object whose controller is gone stays forever.")


@attrs.frozen
class GateWarning:
    """A warning the gate returned with an admission response (enforcement: Warn: the request went through)."""

    time: float
    operation: str
    ref: ObjectRef
    text: str
    count: int = 1
    last: float = 0.0

    def to_dict(self, describe: Any) -> dict[str, Any]:
        return {"time": round(self.time, 6), "last": round(self.last or self.time, 6), "count": self.count,
                "operation": self.operation, "object": describe(self.ref), "warning": self.text}


def record_warnings(cluster: Cluster) -> list[GateWarning]:
    """Wrap the cluster's webhooks so that every warning they return is kept, with when and for what."""
    seen: list[GateWarning] = []

    def wrap(hook: Any) -> Any:
        def recording(review: dict[str, Any]) -> dict[str, Any]:
            reply: dict[str, Any] = hook(review)
            response = reply.get("response") if isinstance(reply, Mapping) else None
            if not isinstance(response, Mapping):
                return reply
            # A refusal's warnings repeat its message (decision._waiting), which the timeline shows; the ones kept
            # are those of what went through (enforcement: Warn, break-glass, CREATE warnings).
            warnings = response.get("warnings") if response.get("allowed") is not False else None
            if warnings:
                request = review.get("request") or {}
                resource = request.get("resource") or {}
                gr = GroupResource(str(resource.get("group", "")), str(resource.get("resource", "")))
                ref = ObjectRef(gr, "" if gr == NAMESPACES else str(request.get("namespace") or ""),
                                str(request.get("name") or ""))
                now = cluster.timeline.now()
                for text in warnings:
                    w = GateWarning(now, str(request.get("operation", "")), ref, str(text))
                    for i, old in enumerate(seen):  # a retried request warns again: one line, counted
                        if (old.operation, old.ref, old.text) == (w.operation, w.ref, w.text):
                            seen[i] = attrs.evolve(old, count=old.count + 1, last=now)
                            break
                    else:
                        seen.append(w)
            return reply

        return recording

    for webhook in cluster.store.webhooks:
        webhook.hook = wrap(webhook.hook)
    return seen


def run(args: argparse.Namespace) -> int:
    if args.repeat is not None and (args.client != "kubectl" or args.repeat <= 0):
        raise MalformedManifest("--repeat", "needs --client kubectl and a positive number of seconds")
    if args.flux_deletion_policy is not None and args.client != "flux":
        raise MalformedManifest("--flux-deletion-policy", "needs --client flux")
    if args.helm_crds_dir and args.client != "helm":
        raise MalformedManifest("--helm-crds-dir", "needs --client helm")
    manifests = load_bundles(args.filename, check_crds=True)
    choices = None
    if args.interleaving is not None:
        choices = ChoiceRandom(Path(parse_choices(args.interleaving)))
    cluster = Cluster(gate=not args.no_gate, seed=args.seed,
                      ordered_namespace_deletion=not args.legacy_namespace_deletion, rng=choices)
    if choices is not None:
        choices.inert = inert_types(cluster.store)
    warnings = record_warnings(cluster)
    cluster.load(manifests)
    loaded = len(warnings)  # warnings while creating the bundle are not part of the teardown
    cluster.teardown(args.client, repeat=args.repeat, flux_deletion_policy=args.flux_deletion_policy or "MirrorPrune",
                     helm_crds_dir=args.helm_crds_dir)
    verdict = cluster.run()
    if choices is not None and len(choices.path.taken) < len(choices.path.prefix):
        raise ChoiceError(f"{args.interleaving}: this teardown met only {len(choices.path.taken)} choice points; "
                          "the interleaving was recorded for another bundle or client")
    teardown_warnings = warnings[loaded:]
    services = _services(manifests)
    if args.output == "json":
        json.dump(to_json(cluster, verdict, args, warnings=teardown_warnings, services=services),
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.output in ("gantt", "svg"):
        drawn = picture(cluster, manifests, args)
        sys.stdout.write(to_gantt(drawn) if args.output == "gantt" else to_svg(drawn))
    else:
        sys.stdout.write(to_text(cluster, verdict, args, warnings=teardown_warnings, services=services))
    return 0 if verdict.completed else 1


def picture(cluster: Cluster, manifests: Sequence[Manifest], args: argparse.Namespace) -> Picture:
    """The run as a picture, each object in its phase of the plan (`criticalsvc plan`) for the same bundle."""
    state = build_state(manifests)
    result = plan(sorted(state.objects(), key=lambda o: o.ref), state.critical_services(), state)
    phases = {ref: i for i, phase in enumerate(result.phases, start=1) for ref in phase}
    order = [(ref, None if m.marked is None else m.marked[0], None if m.gone is None else m.gone[0])
             for ref, m in cluster.order()]
    title = (f"Teardown of {', '.join(args.filename)} by {args.client}, gate {'off' if args.no_gate else 'on'}, "
             f"seed {args.seed} (virtual time)")
    return to_picture(cluster.timeline.events, order=order, describe=cluster.describe, phases=phases, title=title)


def _services(manifests: Sequence[Manifest]) -> list[tuple[CriticalService, Manifest]]:
    out = []
    for m in manifests:
        if is_critical_service(m.obj):
            try:
                out.append((parse_critical_service(m.obj), m))
            except Exception:  # the cluster accepted it; a hint is not worth failing for
                continue
    return out


def _quiet(e: Event) -> bool:
    # A propagation finalizer dropped from an object that still has others says nothing to a reader.
    return e.outcome == REMOVED and e.actor == "garbage-collector"


def _wrap(text: str, indent: str = "  ", subsequent: str = "    ") -> list[str]:
    return textwrap.wrap(text, width=WIDTH, initial_indent=indent, subsequent_indent=subsequent,
                         break_on_hyphens=False)


def _warn_deletes(warnings: Sequence[GateWarning]) -> int:
    return len({w.ref for w in warnings if w.operation == "DELETE"})


def _source_of(m: Manifest, files: Sequence[str]) -> str | None:
    """The -f argument a manifest came from, if it can be read again (not standard input)."""
    for f in files:
        if f != "-" and (m.where == f or m.where.startswith(f)):
            return f
    return None


def next_steps(cluster: Cluster, args: argparse.Namespace, *, warnings: Sequence[GateWarning],
               services: Sequence[tuple[CriticalService, Manifest]], stuck: bool) -> list[tuple[str, str]]:
    """(command, what it shows) to try after this run."""
    files = " ".join(f"-f {shlex.quote(f)}" for f in args.filename)
    steps = [(f"criticalsvc plan {files}", "the order the gate enforces, as numbered phases")]
    for cs, m in services[:1]:
        source = _source_of(m, args.filename)
        # A provider selector: its first object in the bundle stands for the set.
        provider = cs.provider if isinstance(cs.provider, ObjectRef) else \
            next((o.ref for o in provider_objects(cs.provider, cluster.store.state)), None)
        if provider is None:
            continue
        t = cluster.store.mapper.lookup(provider.group_resource)
        kind = (cluster.kinds.get(provider.group_resource) or (t.kind if t is not None else
                                                                 provider.group_resource.resource)).lower()
        ns = f" -n {provider.namespace}" if provider.namespace else ""
        state = f" --state {shlex.quote(source)}" if source else " --state BUNDLE.yaml"
        steps.append((f"criticalsvc explain {kind}/{provider.name}{ns}{state}",
                      f"the gate's answer for {cluster.describe(provider)} before the teardown, "
                      "criterion by criterion"))
    if warnings:
        warned = sorted({cs.name for cs, _m in services if cs.enforcement == Enforcement.WARN})
        if warned:
            steps.append((f"criticalsvc simulate {files}",
                          f"again after setting enforcement: Enforce in {', '.join(warned)} (or removing the "
                          "field): the gate then holds back what it warned about"))
    if args.no_gate:
        steps.append((f"criticalsvc simulate {files}", "the same teardown with the gate"))
    else:
        steps.append((f"criticalsvc simulate {files} --no-gate", "the same teardown without the gate"
                      + (": what the gate saves you from" if not stuck else "")))
    steps.append(("criticalsvc serve --embedded --kubeconfig-out /tmp/k &",
                  "a live stand-in cluster for the real kubectl and explain --kubeconfig /tmp/k (README)"))
    return steps


def to_text(cluster: Cluster, verdict: TeardownVerdict, args: argparse.Namespace, *,
            warnings: Sequence[GateWarning] = (), services: Sequence[tuple[CriticalService, Manifest]] = ()) -> str:
    n_bundles = len(cluster.bundles)
    total = sum(len(v) for v in cluster.bundles.values())
    client = CLIENT_WORDS[args.client]
    if args.client == "kubectl" and args.repeat:
        client = f"kubectl delete -f, re-run every {args.repeat:g} s until it succeeds"
    ns_mode = "any order (before Kubernetes 1.33)" if args.legacy_namespace_deletion else \
        "pods first (Kubernetes ≥ 1.33)"
    out = [
        f"Tearing down {total} object{'s' if total != 1 else ''} from {', '.join(args.filename)} "
        f"({n_bundles} bundle{'s' if n_bundles != 1 else ''}), all at once.",
        f"  deleted by: {client}",
        f"  gate: {'OFF (--no-gate)' if args.no_gate else 'on'};  namespace content: {ns_mode};  seed: {args.seed}",
        *_wrap(WORDS, indent="", subsequent="  "),
        "",
        "What happened (virtual time since the delete; identical retries folded into one line):",
        render_text(cluster.timeline.events, short=cluster.describe, width=WIDTH, hide=_quiet).rstrip("\n"),
        "",
    ]
    if warnings:
        deletes = _warn_deletes(warnings)
        out.append(f"Warnings from the gate (enforcement: Warn): it let {deletes} DELETE{'s' if deletes != 1 else ''} "
                   "through that Enforce would have refused:" if deletes else "Warnings from the gate:")
        for w in warnings:
            head = f"  +{w.time:9.3f}s  {w.operation} {cluster.describe(w.ref)}"
            if w.count > 1:
                head += f" [×{w.count}, last at +{w.last:.3f}s]"
            out.append(head + ":")
            out += _wrap(w.text, indent=" " * 17, subsequent=" " * 17)
        out.append("")
    out.append("Order (marked: deletion started; gone: removed from the API):")
    name_w = min(max((len(cluster.describe(r)) for r, _m in cluster.order()), default=0), 70)
    for ref, mark in cluster.order():
        gone = f"gone +{mark.gone[0]:.3f}s" if mark.gone else "STILL HERE"
        if mark.marked is not None and mark.marked == mark.gone:
            out.append(f"  {cluster.describe(ref):<{name_w}}  {'deleted at once':<18}  {gone}")
            continue
        marked = f"marked +{mark.marked[0]:.3f}s" if mark.marked else "never marked"
        out.append(f"  {cluster.describe(ref):<{name_w}}  {marked:<18}  {gone}")
    if verdict.remaining:
        out += ["", "What holds each remaining object:"]
        for hold in verdict.remaining:
            state = "terminating" if hold.terminating else "not deleted"
            out.append(f"  {cluster.describe(hold.ref)} ({state})")
            for reason in hold.reasons:
                out.append(f"    - {reason}")
    steps = next_steps(cluster, args, warnings=warnings, services=services, stuck=not verdict.completed)
    out += ["", "Try next:"]
    for command, what in steps:
        out += _wrap(f"# {what}", indent="  ", subsequent="  # ")
        out.append(f"  {command}")
    out += ["", summary(verdict, warnings), ""]
    return "\n".join(out)


def summary(verdict: TeardownVerdict, warnings: Sequence[GateWarning]) -> str:
    """The verdict's line, and, when the gate only warned, that it did."""
    text = verdict.summary()
    deletes = _warn_deletes(warnings)
    if deletes:
        text += (f" The gate only warned (enforcement: Warn) and let {deletes} DELETE{'s' if deletes != 1 else ''} "
                 "through that Enforce would have refused (see Warnings above).")
    return text


def to_json(cluster: Cluster, verdict: TeardownVerdict, args: argparse.Namespace, *,
            warnings: Sequence[GateWarning] = (),
            services: Sequence[tuple[CriticalService, Manifest]] = ()) -> dict[str, Any]:
    def ref_dict(ref: Any) -> dict[str, str]:
        return {"group": ref.group_resource.group, "resource": ref.group_resource.resource,
                "namespace": ref.namespace, "name": ref.name, "display": cluster.describe(ref)}

    return {
        "files": list(args.filename),
        "client": args.client,
        "gate": not args.no_gate,
        "seed": args.seed,
        "orderedNamespaceDeletion": not args.legacy_namespace_deletion,
        "bundles": {name: [ref_dict(r) for r in refs] for name, refs in cluster.bundles.items()},
        "events": cluster.timeline.to_json(),
        "order": [{"object": ref_dict(ref),
                   "marked": None if m.marked is None else {"time": round(m.marked[0], 6), "seq": m.marked[1]},
                   "gone": None if m.gone is None else {"time": round(m.gone[0], 6), "seq": m.gone[1]}}
                  for ref, m in cluster.order()],
        "verdict": verdict.to_dict(),
        "warnings": [w.to_dict(cluster.describe) for w in warnings],
        "next": [{"command": c, "shows": what}
                 for c, what in next_steps(cluster, args, warnings=warnings, services=services,
                                           stuck=not verdict.completed)],
    }
