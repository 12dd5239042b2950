"""Pruning: what the real server drops before it validates (apiextensions-apiserver
schema/pruning/algorithm.go, schema/defaulting/prunenulls.go); only the validated copy is pruned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .nodes import properties_of

_META_FIELDS = frozenset({"apiVersion", "kind", "metadata"})


def pruned(value: Any, schema: Mapping[str, Any] | None, *, root: bool = False) -> Any:
    """A copy of `value` with undeclared fields and non-nullable, non-defaulted nulls removed
    (structuralpruning.Prune, then PruneNonNullableNullsWithoutDefaults)."""
    if isinstance(value, Mapping):
        if schema is None:
            return {}
        embedded = root or schema.get("x-kubernetes-embedded-resource") is True
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        properties = properties_of(schema)
        extra = schema.get("additionalProperties")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if embedded and key in _META_FIELDS:
                sub = properties.get(key)
                if item is None and sub is not None and _drops_null(sub):
                    continue
                out[key] = _copy(item)
                continue
            if key in properties:
                sub = properties[key]
            elif isinstance(extra, Mapping):
                sub = extra
            elif extra is True or preserve:
                out[key] = _copy(item)
                continue
            else:
                continue
            if item is None and _drops_null(sub):
                continue
            out[key] = pruned(item, sub)
        return out
    if isinstance(value, list):
        items = schema.get("items") if schema is not None else None
        if schema is not None and schema.get("x-kubernetes-preserve-unknown-fields") is True and not isinstance(
                items, Mapping):
            return _copy(value)
        return [pruned(item, items if isinstance(items, Mapping) else None) for item in value]
    return value


def _drops_null(schema: Mapping[str, Any]) -> bool:
    return not schema.get("nullable") and "default" not in schema


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
