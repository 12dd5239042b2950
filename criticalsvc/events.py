"""Kubernetes Events for denied deletions and held updates, rate-limited (pure: the writer posts what this returns).

A retrying deleter (the namespace controller backs off to 60 s, the ManifestWork agent too, the
garbage collector to 1000 s) asks again and again; one Event per denial would flood etcd. Like
client-go's EventCorrelator, repeats of the same (CriticalService, object, reason) within a window
become one Event whose `count` grows, and a token bucket caps the total rate.
"""

from __future__ import annotations

from typing import Any

import attrs

from .api import API_VERSION, KIND, ObjectRef
from .timestamps import format_rfc3339

# client-go's EventSourceObjectSpamFilter defaults: burst 25, one token per 5 minutes per source;
# we refill faster (one per 10 s) because a denial is news to whoever is waiting on the teardown.
BURST = 25
REFILL_SECONDS = 10.0
# Repeats of the same denial inside this window increment `count` instead of creating an Event.
AGGREGATE_WINDOW = 600.0


@attrs.define
class EventRecorder:
    burst: int = BURST
    refill_seconds: float = REFILL_SECONDS
    window: float = AGGREGATE_WINDOW
    _tokens: float = attrs.field(init=False, default=0.0)
    _last: float | None = attrs.field(init=False, default=None)
    _seen: dict[tuple[str, str, str, str], tuple[float, int, str]] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._tokens = float(self.burst)

    def denial(self, *, service: str, service_uid: str, target: ObjectRef, message: str, now: float,
               user: str = "", operation: str = "DELETE") -> dict[str, Any] | None:
        """The Event to create or update for this denial, or None when rate-limited. `operation` is the
        request's: a held UPDATE (spec.holdUpdates, spec.scaleToZero) is reported as UpdateBlocked."""
        # The uid is part of the key: a CriticalService re-created under the same name is another
        # object, and its denials must not be counted onto the old one's Event (which names the old uid).
        key = (service, service_uid, str(target), operation)
        previous = self._seen.get(key)
        if previous is not None and now - previous[0] < self.window:
            first, count, name = previous
            self._seen[key] = (first, count + 1, name)
            return self._event(name, service, service_uid, target, message, first, now, count + 1, user, operation)
        if not self._take(now):
            return None
        name = f"{service}.{int(now * 1000):x}"
        self._seen[key] = (now, 1, name)
        if len(self._seen) > 4096:  # bounded memory: forget the oldest aggregates
            for k in sorted(self._seen, key=lambda k: self._seen[k][0])[:1024]:
                del self._seen[k]
        return self._event(name, service, service_uid, target, message, now, now, 1, user, operation)

    def _take(self, now: float) -> bool:
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) / self.refill_seconds)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    @staticmethod
    def _event(name: str, service: str, service_uid: str, target: ObjectRef, message: str, first: float,
               last: float, count: int, user: str, operation: str = "DELETE") -> dict[str, Any]:
        deletion = operation == "DELETE"
        what = "deletion" if deletion else "update"
        note = f"{what} of {target} denied" + (f" (requested by {user})" if user else "") + f": {message}"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            # CriticalServices are cluster-scoped; their Events live in "default", as for Nodes.
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": service, "uid": service_uid},
            "reason": "DeletionBlocked" if deletion else "UpdateBlocked",
            "message": note[:1024],
            "type": "Warning",
            "source": {"component": "criticalsvc"},
            "reportingComponent": "criticalsvc.io/gate",
            "reportingInstance": "criticalsvc",
            "firstTimestamp": format_rfc3339(first),
            "lastTimestamp": format_rfc3339(last),
            "count": count,
        }


def object_event(*, involved: dict[str, Any], reason: str, message: str, now: float, warning: bool = False,
                 name_hint: str = "") -> dict[str, Any]:
    """A one-off core/v1 Event about any object (`involved`: apiVersion, kind, name, uid, and namespace for
    a namespaced object), e.g. a replayed deletion. It lives in the object's namespace, or in "default"
    for a cluster-scoped object, as the API server requires of an Event without eventTime."""
    namespace = str(involved.get("namespace") or "default")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name_hint or involved.get('name', 'object')}.{int(now * 1000):x}"[:253],
                     "namespace": namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": "criticalsvc"},
        "reportingComponent": "criticalsvc.io/gate",
        "reportingInstance": "criticalsvc",
        "firstTimestamp": format_rfc3339(now),
        "lastTimestamp": format_rfc3339(now),
        "count": 1,
    }
