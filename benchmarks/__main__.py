"""`python -m benchmarks NAME [ARGS...]` runs benchmarks/NAME.py's `main(ARGS)`.

`python -m benchmarks` (or `python -m benchmarks all`) runs every benchmark with its defaults, each
in its own process (so peak RSS and tracemalloc figures of one are not inflated by another), writes
bench-results/results.json and prints a table. A benchmark is any module here with
`main(argv) -> int` that accepts `--json` (print one JSON object, its report section, as the last
line of standard output), so adding one needs no change to this file.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import time
from pathlib import Path

# Modules here that are helpers, not benchmarks.
NOT_BENCHMARKS = frozenset({"report", "replay_real", "replay_cases", "ideal"})  # replay_real: `replay --real`
# Run by name only, never by `all`: peers builds other projects and starts a control plane per tool;
# realscale loads 110,000 objects into a control plane of its own (~25 minutes).
BY_NAME_ONLY = frozenset({"peers", "realscale"})
# The order `all` runs them in: the load test first, on a quiet machine.
ORDER = ("latency", "scale", "coldstart", "teardown")


def available() -> list[str]:
    here = Path(__file__).parent
    names = [m.name for m in pkgutil.iter_modules([str(here)])
             if not m.name.startswith("_") and m.name not in NOT_BENCHMARKS]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def run_all(argv: list[str]) -> int:
    from . import report

    worst = 0
    sections: dict[str, object] = {}
    for name in (n for n in available() if n not in BY_NAME_ONLY):
        print(f"== {name} (running)", file=sys.stderr, flush=True)
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "benchmarks", name, "--json"],
                              stdout=subprocess.PIPE, text=True, check=False)
        elapsed = round(time.perf_counter() - started, 1)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        try:
            section = json.loads(lines[-1]) if lines else None
        except json.JSONDecodeError:
            section = None
        if not isinstance(section, dict):
            section = {"error": f"exit {proc.returncode}, no JSON result", "output": proc.stdout[-2000:]}
        section["exitCode"] = proc.returncode
        section["benchmarkWallSeconds"] = elapsed
        sections[name] = section
        worst = max(worst, 1 if proc.returncode else 0)
        print(f"   {name}: exit {proc.returncode} in {elapsed} s", file=sys.stderr, flush=True)
    path = report.write(sections)
    print(report.render(sections))
    print(f"\nwrote {path}")
    return worst


def main(argv: list[str]) -> int:
    names = available()
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("available:", ", ".join(["all", *names]) or "(none)")
        return 0
    if not argv or argv[0] == "all":
        return run_all(argv[1:])
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"python -m benchmarks: no benchmark {name!r}; available: all, {', '.join(names) or '(none)'}",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(f"benchmarks.{name}").main(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
