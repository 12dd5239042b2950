"""Label and field selectors as the query string carries them (`labelSelector=`, `fieldSelector=`).

The label syntax is k8s.io/apimachinery pkg/labels/selector.go (Parse): `app=web,tier!=db,env in (a,b),
!legacy`; the parsed selector is criticalsvc.labels.LabelSelector, the one the gate uses. Field
selectors accept any dotted path (the real server allows a few fields per type; a client of this
stand-in that asks for another one gets an answer instead of a 400).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from ...labels import LabelSelector, Requirement
from ..store import StatusError

_REQUIREMENT = re.compile(
    r"^\s*(?:(?P<not>!)\s*(?P<nkey>[^\s=!(),]+)"
    r"|(?P<key>[^\s=!(),]+)\s*(?:(?P<op>==|=|!=)\s*(?P<value>[^\s,()]*)"
    r"|\s+(?P<setop>in|notin)\s*\((?P<values>[^()]*)\))?)\s*$")


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def parse_label_selector_text(text: str) -> LabelSelector:
    """A `labelSelector` query value (`app=web,tier!=db,env in (a,b),!legacy`); 400 if malformed."""
    requirements: list[Requirement] = []
    for part in _split_top(text):
        m = _REQUIREMENT.match(part)
        if m is None:
            raise StatusError(400, "BadRequest", f'unable to parse requirement: found "{part.strip()}", '
                              "expected: key, key=value, key!=value, key in (...), key notin (...) or !key")
        if m["not"]:
            requirements.append(Requirement(m["nkey"], "DoesNotExist"))
        elif m["op"]:
            requirements.append(Requirement(m["key"], "NotIn" if m["op"] == "!=" else "In",
                                            frozenset([m["value"]])))
        elif m["setop"]:
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], "In" if m["setop"] == "in" else "NotIn", values))
        else:
            requirements.append(Requirement(m["key"], "Exists"))
    return LabelSelector(tuple(requirements))


FieldRequirement = tuple[tuple[str, ...], bool, str]  # (path, equal?, value)


def parse_field_selector(text: str) -> list[FieldRequirement]:
    """A `fieldSelector` (`metadata.name=x,metadata.namespace!=y`); any dotted path is accepted."""
    result: list[FieldRequirement] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", part)
        if m is None:
            raise StatusError(400, "BadRequest", f'invalid field selector: "{part}": expected field=value or '
                              "field!=value")
        result.append((tuple(m[1].split(".")), m[2] != "!=", m[3]))
    return result


def _field(obj: Any, path: tuple[str, ...]) -> str:
    for key in path:
        obj = obj.get(key) if isinstance(obj, Mapping) else None
    if obj is None:
        return ""
    if isinstance(obj, bool):
        return str(obj).lower()
    return str(obj)


def matcher(params: Mapping[str, str]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an object matches the request's label and field selectors (both optional)."""
    labels = parse_label_selector_text(params.get("labelSelector", ""))
    fields = parse_field_selector(params.get("fieldSelector", ""))

    def match(obj: Mapping[str, Any]) -> bool:
        md = obj.get("metadata") or {}
        if not labels.matches(md.get("labels") or {}):
            return False
        return all((_field(obj, path) == value) == equal for path, equal, value in fields)

    return match
