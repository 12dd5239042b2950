"""kubectl's JSONPath, the subset CRD printer columns use (k8s.io/client-go/util/jsonpath): fields
(dots escaped with a backslash), ['keys'], recursive descent (..name), indexes, slices and unions
([0], [-1], [1:3], [0,2], [*]), and filters ([?(@.a == "x")]). `text` writes a result as PrintResults
does. tables.py evaluates the printer columns with it; a printer column is parsed once per CRD.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

Steps = list[tuple[str, Any]]


class JSONPathError(ValueError):
    """An expression this JSONPath subset cannot parse."""


_TOKEN = re.compile(r"""
    \.\.(?P<recursive>[A-Za-z0-9_\-$]*)              # ..name (recursive descent)
  | \.(?P<field>(?:\\.|[^.\[\\])+)                   # .field (dots escaped with \)
  | \[\s*(?P<quote>['"])(?P<key>.*?)(?P=quote)\s*\]  # ['key']
  | \[\s*\?\(\s*(?P<filter>.*?)\s*\)\s*\]            # [?(@.a == "x")]
  | \[\s*(?P<index>[-0-9:*,\s]+)\s*\]                # [0], [*], [1:3], [0,2]
""", re.VERBOSE)
_FILTER = re.compile(r"^@(?P<path>(?:\.[^\s=!<>]+|\[[^\]]*\])*)\s*(?:(?P<op>==|!=|<=|>=|<|>)\s*(?P<value>.+))?$")


def parse(expression: str) -> Steps:
    """The steps of a JSONPath expression (`{.a.b}`, `.a[*].b`, `$.a[?(@.x=="y")]`); JSONPathError if not one."""
    text = expression.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    if text and not text.startswith((".", "[")):
        text = "." + text
    steps: Steps = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise JSONPathError(f"unrecognized column definition {expression!r}")
        pos = m.end()
        if m["recursive"] is not None:
            steps.append(("recursive", m["recursive"]))
        elif m["field"] is not None:
            steps.append(("field", re.sub(r"\\(.)", r"\1", m["field"])))
        elif m["key"] is not None:
            steps.append(("field", m["key"]))
        elif m["filter"] is not None:
            f = _FILTER.match(m["filter"])
            if f is None:
                raise JSONPathError(f"unrecognized filter in {expression!r}")
            steps.append(("filter", (parse(f["path"] or ""), f["op"], _literal(f["value"]))))
        else:
            steps.append(("index", m["index"].strip()))
    return steps


def _literal(text: str | None) -> Any:
    if text is None:
        return None
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        return text


def walk(values: list[Any], steps: Sequence[tuple[str, Any]]) -> list[Any]:
    """Every value the parsed `steps` select, starting from each of `values`."""
    for kind, arg in steps:
        out: list[Any] = []
        for v in values:
            if kind == "field":
                if arg == "*":
                    out.extend(v.values() if isinstance(v, Mapping) else v if isinstance(v, list) else [])
                elif isinstance(v, Mapping) and arg in v:
                    out.append(v[arg])
            elif kind == "recursive":
                out.extend(_descend(v, arg))
            elif kind == "index":
                out.extend(_index(v, arg))
            elif kind == "filter" and isinstance(v, list):
                path, op, expected = arg
                out.extend(item for item in v if _test(walk([item], path), op, expected))
        values = out
    return values


def _descend(value: Any, name: str) -> list[Any]:
    found: list[Any] = []
    children = list(value.values()) if isinstance(value, Mapping) else value if isinstance(value, list) else []
    if isinstance(value, Mapping) and name in value:
        found.append(value[name])
    for child in children:
        found.extend(_descend(child, name))
    return found


def _index(value: Any, spec: str) -> list[Any]:
    if not isinstance(value, list):
        return []
    if spec == "*":
        return list(value)
    if "," in spec:
        return [x for part in spec.split(",") for x in _index(value, part.strip())]
    if ":" in spec:
        parts = [int(p) if p.strip() else None for p in spec.split(":")]
        return value[slice(*parts[:3])]
    i = int(spec)
    i = i + len(value) if i < 0 else i
    return [value[i]] if 0 <= i < len(value) else []


def _test(found: list[Any], op: str | None, expected: Any) -> bool:
    if op is None:
        return bool(found)
    if not found:
        return False
    actual = found[0]
    if op == "==":
        return bool(actual == expected)
    if op == "!=":
        return bool(actual != expected)
    try:
        return bool({"<": actual < expected, ">": actual > expected, "<=": actual <= expected,
                     ">=": actual >= expected}[op])
    except TypeError:
        return False


def find(expression: str, obj: Any) -> list[Any]:
    """Every value `expression` (kubectl JSONPath, as in a CRD printer column) selects in `obj`."""
    return walk([obj], parse(expression))


def text(value: Any) -> str:
    """How JSONPath PrintResults writes one value: text for scalars, JSON for maps and lists."""
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    return str(value)
