"""`python -m benchmarks NAME [ARGS...]` runs benchmarks/NAME.py's `main(ARGS)`; with no NAME, every
benchmark module in turn with its defaults. A benchmark is any module here with `main(argv) -> int`,
so adding one needs no change to this file."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def available() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    names = available()
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        print("available:", ", ".join(names) or "(none)")
        return 0
    if not argv:
        worst = 0
        for name in names:
            print(f"== {name}", flush=True)
            worst = max(worst, int(importlib.import_module(f"benchmarks.{name}").main([])))
        return worst
    name, rest = argv[0], argv[1:]
    if name not in names:
        print(f"python -m benchmarks: no benchmark {name!r}; available: {', '.join(names) or '(none)'}",
              file=sys.stderr)
        return 2
    return int(importlib.import_module(f"benchmarks.{name}").main(rest))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
