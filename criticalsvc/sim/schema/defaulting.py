"""Defaulting: a custom resource's structural-schema `default`s, applied to every write before it is
validated (apiextensions-apiserver pkg/apiserver/schema/defaulting/algorithm.go, Default)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


def apply_defaults(value: Any, schema: Mapping[str, Any]) -> None:
    """structuraldefaulting.Default: fill missing (or null, unless nullable) properties with their
    schema `default`, then recurse into properties, additionalProperties and array items."""
    if isinstance(value, dict):
        found = schema.get("properties")
        properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        for key, prop in properties.items():
            if isinstance(prop, Mapping) and "default" in prop and (
                    key not in value or (value[key] is None and not prop.get("nullable"))):
                value[key] = copy.deepcopy(prop["default"])
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            prop = properties.get(key)
            if isinstance(prop, Mapping):
                apply_defaults(item, prop)
            elif isinstance(extra, Mapping):
                apply_defaults(item, extra)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            apply_defaults(item, schema["items"])
