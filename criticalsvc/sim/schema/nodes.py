"""Reading a structural schema node, and field paths as apimachinery's field.Path prints them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def properties_of(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    found = schema.get("properties")
    return found if isinstance(found, Mapping) else {}


def child(parent: str | None, name: str) -> str:
    """field.Path.Child(name).String() (a nil parent starts a new path)."""
    return name if parent is None else f"{parent}.{name}"
