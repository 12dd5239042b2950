"""`criticalsvc verify`: check every configuration within a bound, torn down every way the simulator knows.

A bounded model checker over the simulator (criticalsvc/verify, design/criticalservice.md §7): every set of
CriticalServices over a fixed catalogue of objects that the gate admits, torn down by every deleter, replay
off and on, along every interleaving to the bound's depth, judged for safety and liveness by an oracle
independent of the decision code. Each violation is minimized and written as a bundle file, with the
`criticalsvc simulate` command that replays it. For the first configuration of each set of providers (the bound's
`enforcement`), it also explores every interleaving of the leader's labelling and routing after the CREATEs, with an
API server lagging on webhook configurations (criticalsvc/verify/enforcement.py); a violation there is printed with
the leader's steps that led to it.

Exit codes: 0 nothing found, 1 violations found (each printed, its bundle written), 2 bad input.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path
from typing import Any

from ..errors import InvalidInput
from ..sim.cluster import Cluster
from ..verify.configurations import BOUNDS, parse_bound
from ..verify.explorer import DELETERS, EXTRA_DELETERS, Report, explore


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "verify", help="explore every configuration within a bound, torn down every way, for stuck or unsafe teardowns",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--bound", default="ci", metavar="BOUND",
                   help=f"{' or '.join(BOUNDS)} (default ci), or key=value,... over one: services, criteria, depth, "
                        "protected=yes|no, providers and criteria_menu (+-separated keys), "
                        "enforcement=providers|all|off (whose leader's steps to explore with a lagging API server), "
                        "e.g. large,depth=3")
    p.add_argument("--deleter", action="append", choices=(*DELETERS, *EXTRA_DELETERS), metavar="DELETER",
                   help=f"only these deleters (repeatable; default: {', '.join(DELETERS)}; also "
                        f"{', '.join(EXTRA_DELETERS)})")
    p.add_argument("--limit", type=int, default=5000, metavar="N",
                   help="at most N interleavings per configuration, deleter and replay mode (default 5000; a family "
                        "cut there is counted in the summary)")
    p.add_argument("--out", default="verify-findings", metavar="DIR",
                   help="where the minimized bundles go (default verify-findings/, written only when something is "
                        "found)")
    p.add_argument("--no-gate", action="store_true",
                   help="the negative control: the same search without the gate (everything is admitted)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="processes to spread the configurations over (default 1; the counts and findings do not "
                        "depend on it)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    bound = parse_bound(args.bound)
    if args.limit < 1:
        raise InvalidInput("--limit", f"{args.limit}: expected a positive number of interleavings")

    if args.jobs < 1:
        raise InvalidInput("--jobs", f"{args.jobs}: expected a positive number of processes")
    factory = functools.partial(Cluster, gate=not args.no_gate)  # a partial pickles: the workers get it

    def progress(report: Report) -> None:
        if not args.quiet and report.done % 200 == 0:
            print(f"  {report.done} of {report.configurations} configurations, {report.runs} interleavings, "
                  f"{len(report.findings)} finding(s) so far", file=sys.stderr)

    report = explore(bound, limit=args.limit, deleters=args.deleter or DELETERS, cluster_factory=factory,
                     progress=progress, jobs=args.jobs)
    out = Path(args.out)
    print(report.summary())
    for n, finding in enumerate(report.findings.values(), 1):
        m = finding.minimal
        path = out / f"finding-{n:03d}.yaml"
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(finding.bundle(str(path)))
        print(f"\n{n}. {m.config.label()}: deleter {m.deleter}, replay {'on' if m.replay else 'off'}")
        for v in m.violations:
            print(f"   {v.property}: {v.text}")
        print(f"   bundle: {path}\n   replay: {finding.command(str(path))}")
    for n, run in enumerate(report.enforcement_findings, len(report.findings) + 1):
        print(f"\n{n}. {run.config.label()}: created, then {run.describe()}")
        for v in run.violations:
            print(f"   {v.property}: {v.text}")
    return 1 if report.findings or report.enforcement_findings else 0
