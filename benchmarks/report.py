"""The benchmark report: one JSON file (bench-results/results.json) and a readable table.

Not a benchmark itself (`python -m benchmarks` skips it). Each benchmark returns a "section", a
JSON-able dict; `write()` puts the sections under `benchmarks` next to a `machine` description, so
numbers from two machines are never compared without seeing that they came from two machines.

A section may carry a `table`: {"columns": [...], "rows": [[...], ...]} which `render()` prints as
aligned text; everything else in a section is printed as `key  value` lines.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from criticalsvc.timestamps import format_rfc3339

RESULTS_DIR = Path("bench-results")
RESULTS_FILE = RESULTS_DIR / "results.json"


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores, CPU model, memory, Python."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
                break
    except (OSError, ValueError, IndexError):
        pass
    return {
        "nproc": os.cpu_count(),
        "cpuModel": cpu or platform.processor() or "unknown",
        "memTotalMiB": mem_kib // 1024,
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of an already sorted, non-empty sequence."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


def write(sections: Mapping[str, Any], path: Path = RESULTS_FILE) -> Path:
    """Write {"machine", "createdAt", "benchmarks": sections} as JSON to `path`; return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": machine(), "createdAt": format_rfc3339(time.time()),
           "benchmarks": dict(sections)}
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in columns]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def render_section(name: str, section: Mapping[str, Any]) -> str:
    out = [f"== {name}"]
    scalars = {k: v for k, v in section.items() if k not in ("table", "tables") and not isinstance(v, (dict, list))}
    if scalars:
        width = max(len(k) for k in scalars)
        out += [f"  {k:<{width}}  {_fmt(v)}" for k, v in scalars.items()]
    tables = list(section.get("tables", []))
    if "table" in section:
        tables.insert(0, section["table"])
    for table in tables:
        if table.get("title"):
            out.append(f"  -- {table['title']}")
        out.append(render_table(table["columns"], table["rows"]))
    return "\n".join(out)


def render(sections: Mapping[str, Any]) -> str:
    m = machine()
    head = f"machine: {m['nproc']} x {m['cpuModel']}, {m['memTotalMiB']} MiB, Python {m['python']}"
    return "\n\n".join([head] + [render_section(k, v) for k, v in sections.items()])


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    return str(value)


def emit(name: str, section: Mapping[str, Any], *, as_json: bool) -> None:
    """What a benchmark's main() prints: one JSON line (for `all`) or the rendered section."""
    if as_json:
        print(json.dumps(section), flush=True)
    else:
        print(render_section(name, section), flush=True)
