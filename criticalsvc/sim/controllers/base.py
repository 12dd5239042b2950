"""What every controller shares: the object an event is about, and how a call's outcome is recorded
on the timeline (sim/timeline.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...api import ObjectRef
from ..store import DeleteResult, StatusError, WatchEvent
from ..timeline import DELETED, DENIED, FAILED, MARKED


def ref_of(event: WatchEvent) -> ObjectRef:
    """The object a watch event is about."""
    md = event.object["metadata"]
    return ObjectRef(event.group_resource, md.get("namespace", "") or "", md["name"])


def waits_for(obj: Mapping[str, Any]) -> str:
    """What a marked object waits for (its finalizers), as the timeline shows it."""
    finalizers = list(obj["metadata"].get("finalizers") or [])
    finalizers += [f"spec.finalizers: {f}" for f in (obj.get("spec") or {}).get("finalizers") or []
                   if obj.get("kind") == "Namespace"]
    return "waits for " + ", ".join(finalizers) if finalizers else ""


def delete_outcome(result: DeleteResult) -> tuple[str, str]:
    """A DELETE's result as a timeline outcome and reason."""
    if result.outcome == "deleted":
        return DELETED, ""
    if result.outcome == "marked":
        return MARKED, waits_for(result.object)
    return "unchanged", "already terminating"


def describe_error(exc: StatusError) -> str:
    """DENIED for an admission denial, FAILED for anything else (a webhook that cannot be called, ...)."""
    return DENIED if exc.message.startswith("admission webhook") else FAILED
