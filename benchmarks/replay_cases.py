"""What benchmarks/replay.py (the simulator) and benchmarks/replay_real.py (the real control plane) share: the
cases, in the order of the table, and the table. Both import this; neither imports the other's table, so
imports run one way: replay -> replay_real -> replay_cases (the `benchmarks-one-way` contract in .importlinter).
"""

from __future__ import annotations

from typing import Any

ROOT_OWNER = "stack-root"
# (deleter, replay on?) in the order of the table.
CASES = (("kubectl", False), ("kubectl", True), ("kubectl-rerun", False), ("manifestwork", False),
         ("manifestwork", True), ("namespace", False), ("namespace", True), ("gc-background", False),
         ("gc-background", True), ("gc-foreground", False), ("gc-foreground", True), ("flux", False), ("flux", True),
         ("helm", False), ("helm", True))


def render(rows: list[dict[str, Any]], title: str) -> str:
    out = [title, f"{'deleter':<15} {'replay':<7} {'done':>5} {'makespan s':>11} {'ideal s':>8} {'ratio':>7} "
                  f"{'worst':>7} {'refused':>8} {'replayed':>9}"]
    for r in rows:
        done = f"{r['completed']}/{r['seeds']}"
        if "makespanSeconds" in r:
            span, ratio, worst = f"{r['makespanSeconds']:.2f}", f"{r['ratioMean']:.3f}", f"{r['ratioMax']:.3f}"
        else:
            span, ratio, worst = "stuck", "-", "-"
        out.append(f"{r['deleter']:<15} {'on' if r['replay'] else 'off':<7} {done:>5} {span:>11} "
                   f"{r['idealSeconds']:>8.2f} {ratio:>7} {worst:>7} {r['refusals']:>8} {r['replayed']:>9}")
    return "\n".join(out)
