"""Ratcheting (CRDValidationRatcheting): the old value each node of an update corresponds to, and
whether it is unchanged (apiserver pkg/cel/common/equality.go CorrelatedObject; apiextensions-apiserver
pkg/apiserver/validation/ratcheting.go). An error on an unchanged node is dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .nodes import properties_of


class Correlation:
    """common.CorrelatedObject: a node of the new object with the old value it corresponds to."""

    __slots__ = ("_children", "_equal", "new", "old", "schema")

    def __init__(self, new: Any, old: Any, schema: Mapping[str, Any] | None) -> None:
        self.new, self.old, self.schema = new, old, schema
        self._equal: bool | None = None
        self._children: dict[Any, Correlation | None] = {}

    def key(self, field: str) -> Correlation | None:
        if self.schema is None:
            return None
        if field in self._children:
            return self._children[field]
        child: Correlation | None = None
        if isinstance(self.old, Mapping) and isinstance(self.new, Mapping) and field in self.old and field in self.new:
            sub = properties_of(self.schema).get(field)
            if sub is None and isinstance(self.schema.get("additionalProperties"), Mapping):
                sub = self.schema["additionalProperties"]
            if isinstance(sub, Mapping):
                child = Correlation(self.new[field], self.old[field], sub)
        self._children[field] = child
        return child

    def index(self, i: int) -> Correlation | None:
        if self.schema is None:
            return None
        if i in self._children:
            return self._children[i]
        child: Correlation | None = None
        items = self.schema.get("items")
        if isinstance(self.new, list) and i < len(self.new) and isinstance(items, Mapping):
            old_item = map_list_get(self.schema, self.old, self.new[i])
            if old_item is not None:
                child = Correlation(self.new[i], old_item, items)
        self._children[i] = child
        return child

    def equal(self) -> bool:
        """CachedDeepEqual."""
        if self._equal is None:
            self._equal = self._compute_equal()
        return self._equal

    def _compute_equal(self) -> bool:
        new, old = self.new, self.old
        if new is None and old is None:
            return True
        if new is None or old is None:
            return False
        if isinstance(old, list) != isinstance(new, list) or isinstance(old, Mapping) != isinstance(new, Mapping):
            return False
        if isinstance(old, list):
            if len(old) != len(new):
                return False
            for i in range(len(new)):
                child = self.index(i)
                if child is None:  # not correlatable: a map list is then unequal, others compare whole
                    is_map_list = self.schema is not None and self.schema.get("x-kubernetes-list-type") == "map"
                    return not is_map_list and deep_equal(old, new)
                if not child.equal():
                    return False
            return True
        if isinstance(old, Mapping):
            if len(old) != len(new):
                return False
            for key in new:
                child = self.key(key)
                if child is None or not child.equal():
                    return False
            return True
        return deep_equal(old, new)


def map_list_get(schema: Mapping[str, Any], old: Any, item: Any) -> Any:
    """The old item of a list-type=map list with the same map keys as `item`, else None."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(old, list) or not isinstance(item, Mapping):
        return None
    keys = schema.get("x-kubernetes-list-map-keys") or ()
    wanted = [item.get(k) for k in keys]
    for candidate in old:
        if isinstance(candidate, Mapping) and all(
                deep_equal(candidate.get(k), w) for k, w in zip(keys, wanted, strict=True)):
            return candidate
    return None


def deep_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual of decoded JSON (an int is never equal to a float or a bool)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@attrs.frozen
class Ratchet:
    """ratchetingOptions: the current correlation, or the nearest correlated ancestor once lost."""

    current: Correlation | None
    parent: Correlation | None

    def key(self, field: str, *, root: bool) -> Ratchet:
        if self.current is None:
            return self
        if root and field in ("apiVersion", "kind"):
            return Ratchet(None, None)
        return Ratchet(self.current.key(field), self.current)

    def index(self, i: int) -> Ratchet:
        if self.current is None:
            return self
        return Ratchet(self.current.index(i), self.current)

    def should_ratchet(self) -> bool:
        if self.current is not None:
            return self.current.equal()
        return self.parent is not None and self.parent.equal()
