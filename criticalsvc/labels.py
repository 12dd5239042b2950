"""Label selectors (metav1.LabelSelector): parsing and matching.

Semantics follow apimachinery's `LabelSelectorAsSelector`: all requirements are ANDed; an empty
selector matches everything; `In`/`NotIn` need values, `Exists`/`DoesNotExist` must have none;
`NotIn` and `DoesNotExist` match objects that lack the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from .errors import InvalidSpec

Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
_OPERATORS: tuple[Operator, ...] = ("In", "NotIn", "Exists", "DoesNotExist")
# The CriticalService CRD's maxItems for a selector's matchExpressions (see api.MAX_CRITERIA).
MAX_EXPRESSIONS = 32


@attrs.frozen(cache_hash=True)  # part of every route a selector needs, hashed at each lookup of it
class Requirement:
    key: str
    operator: Operator
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        match self.operator:
            case "In":
                return labels.get(self.key) in self.values
            case "NotIn":
                return labels.get(self.key) not in self.values
            case "Exists":
                return self.key in labels
            case "DoesNotExist":
                return self.key not in labels

    def __str__(self) -> str:
        match self.operator:
            case "Exists":
                return self.key
            case "DoesNotExist":
                return f"!{self.key}"
            case "In" if len(self.values) == 1:
                return f"{self.key}={next(iter(self.values))}"
            case _:
                verb = "in" if self.operator == "In" else "notin"
                return f"{self.key} {verb} ({','.join(sorted(self.values))})"


@attrs.frozen(cache_hash=True)
class LabelSelector:
    """A parsed selector; `requirements` are ANDed."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def is_empty(self) -> bool:
        return not self.requirements

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def may_overlap(a: LabelSelector, b: LabelSelector) -> bool:
    """Can one set of labels match both selectors? Exact, not a guess: the requirements are ANDed, so
    the question is, key by key, whether some value (or the key's absence) meets all of them.

    A key with DoesNotExist can be met only by absence, which In and Exists refuse and NotIn accepts;
    otherwise In narrows the key to the values its lists share, NotIn removes values, and a key left
    with Exists or NotIn only is met by a value no NotIn names (there are always more strings).
    """
    keys: dict[str, list[Requirement]] = {}
    for r in (*a.requirements, *b.requirements):
        keys.setdefault(r.key, []).append(r)
    for requirements in keys.values():
        allowed: frozenset[str] | None = None  # None: any value
        forbidden: set[str] = set()
        present = absent = False
        for r in requirements:
            if r.operator == "In":
                allowed = r.values if allowed is None else allowed & r.values
                present = True
            elif r.operator == "NotIn":
                forbidden |= r.values
            elif r.operator == "Exists":
                present = True
            else:
                absent = True
        if absent and present:
            return False
        if not absent and allowed is not None and not allowed - forbidden:
            return False
    return True


def parse_label_selector(raw: Any, path: str) -> LabelSelector:
    """Parse a metav1.LabelSelector mapping; errors name the field under `path`."""
    if raw is None:
        return LabelSelector()
    if not isinstance(raw, Mapping):
        raise InvalidSpec(path, "must be an object with matchLabels and/or matchExpressions")
    unknown = set(raw) - {"matchLabels", "matchExpressions"}
    if unknown:
        raise InvalidSpec(f"{path}.{sorted(unknown)[0]}", "unknown field")
    requirements: list[Requirement] = []
    match_labels = raw.get("matchLabels") or {}
    if not isinstance(match_labels, Mapping):
        raise InvalidSpec(f"{path}.matchLabels", "must be a map of strings")
    for key, value in match_labels.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidSpec(f"{path}.matchLabels", "must be a map of strings")
        requirements.append(Requirement(key, "In", frozenset([value])))
    expressions = raw.get("matchExpressions") or []
    if not isinstance(expressions, list):
        raise InvalidSpec(f"{path}.matchExpressions", "must be a list")
    if len(expressions) > MAX_EXPRESSIONS:
        raise InvalidSpec(f"{path}.matchExpressions",
                          f"Too many: {len(expressions)}: must have at most {MAX_EXPRESSIONS} items")
    for i, expr in enumerate(expressions):
        here = f"{path}.matchExpressions[{i}]"
        if not isinstance(expr, Mapping):
            raise InvalidSpec(here, "must be an object")
        key, operator, values = expr.get("key"), expr.get("operator"), expr.get("values")
        if not isinstance(key, str) or not key:
            raise InvalidSpec(f"{here}.key", "required")
        if operator not in _OPERATORS:
            raise InvalidSpec(f"{here}.operator", f"must be one of {', '.join(_OPERATORS)}")
        if operator in ("In", "NotIn"):
            if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
                raise InvalidSpec(f"{here}.values", f"must be a non-empty list of strings for {operator}")
        elif values:
            raise InvalidSpec(f"{here}.values", f"must be empty for {operator}")
        requirements.append(Requirement(key, operator, frozenset(values or ())))
    return LabelSelector(tuple(requirements))
