"""Current at a version: proving that the cache holds a type as it was at (or after) a consistent read.

A confirmation (criticalsvc/caughtup.py) reads one fresh resourceVersion, the target, with one consistent
read made after the request arrived. The cache answers for a type only once that type's state in the cache
is the state at the target or later. This module proves that for one type, from the cache's own
`exact_version` (criticalsvc/cache/watchset.py: the version whose state the store holds, exactly, or
None while no single version describes it):

1. **Already there.** The exact version is at or past the target: nothing to read.
2. **A probe.** Otherwise a watch is opened from the exact version, metadata only, with bookmarks, and read
   until an event or a BOOKMARK at or past the target arrives (catchup.py says when the bookmark comes:
   0-2.25 s after the watch opens on kube-apiserver v1.37.2; a bookmark short of the target re-opens the
   watch from it). Every change of the type between the exact version and the target then came through
   the probe, in order; `floor` is the version of the last of them (the exact version if there was none).
   The probe applies nothing: the cache's own reflector receives the same events.
3. **The cache at the floor.** Once the cache's exact version is at or past `floor`, the state it holds is
   the state at the target: no change of the type lies after `floor` up to the target. The proof holds
   for as long as that stays true (the caller checks it again in the same step of the event loop as the
   decision it makes on the cache, so a re-list that went back to an older version is caught).

Versions compare as integers (catchup.compare_resource_versions). Every failure raises, and the caller
decides on fresh reads instead, or denies: a 410 (MirrorExpired: the exact version left the API server's
window), a type the cache holds at no single version (NoSingleVersion: listing, a successor listing beside
it, no reflector at all), a timeout (TimeoutError) or an unreadable answer (CatchUpFailed, APIError).

Soundness does not depend on which API server answers. The target is a revision of the etcd all these
types share; the probe may reach another API server whose watch cache lags the one that answered the
consistent read: then its bookmarks are short of the target and the probe waits for one that is not.
What it costs does depend: a type with no change since its exact version waits for a bookmark, and
kube-apiserver sends none sooner (design/kubernetes-semantics.md §13).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from ..api import GroupResource
from ..restmapper import ResourceType
from .catchup import WATCH_SECONDS, CatchUpFailed, MirrorExpired, compare_resource_versions
from .transport import ACCEPT_METADATA, APIStatusError, Transport


class NoSingleVersion(CatchUpFailed):
    """The cache holds the type at no one version (listing, a successor listing beside it, not watched)."""


@attrs.frozen
class Current:
    """The cache holds `group_resource` as at or after `target` while its exact version is at or past `floor`."""

    group_resource: GroupResource
    target: str
    floor: str
    watches: int  # probe watches opened (0: the cache was already past the target)

    def holds(self, exact: str | None) -> bool:
        """Whether a cache at exact version `exact` (None: no single version) still holds the proven state."""
        return exact is not None and compare_resource_versions(exact, self.floor) >= 0


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the confirmation budget is spent")
    return left


async def prove_current(transport: Transport, resource: ResourceType, *, exact: Callable[[], str | None],
                        changed: Callable[[float], Awaitable[bool]], target: str, deadline: float,
                        watch_seconds: int = WATCH_SECONDS) -> Current:
    """Wait until the cache holds `resource` as at `target` or later (steps 1-3 above).

    `exact()` is the cache's exact version of the type now; `changed(timeout)` returns at the cache's next
    applied event (True) or after `timeout` seconds (False)."""
    gr = resource.group_resource
    start = exact()
    if start is None:
        raise NoSingleVersion(f"the cache holds {gr} at no single resourceVersion (listing, or not watched)")
    if compare_resource_versions(start, target) >= 0:
        return Current(gr, target, start, watches=0)
    floor = reached = start
    path = resource.path()
    watches = 0
    while compare_resource_versions(reached, target) < 0:
        left = _left(deadline)
        params = [("watch", "true"), ("resourceVersion", reached), ("allowWatchBookmarks", "true"),
                  ("timeoutSeconds", str(watch_seconds))]
        watches += 1
        expired = MirrorExpired(f"watch {path} from resourceVersion {reached}: 410 Gone, the API server no longer "
                                "holds the events since the cache's version")
        try:
            async with transport.stream(path, params, timeout=min(left, watch_seconds + 1.0),
                                        accept=ACCEPT_METADATA) as stream:
                async for event in stream:
                    kind, obj = event.get("type"), event.get("object")
                    if not isinstance(obj, dict):
                        raise CatchUpFailed(f"watch {path}: an event without an object")
                    if kind == "ERROR":
                        code = obj.get("code")
                        if code == 410:
                            raise expired
                        raise APIStatusError(int(code) if isinstance(code, int) else 500, str(obj.get("reason") or ""),
                                             str(obj.get("message") or "error event in the watch stream"))
                    if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                        raise CatchUpFailed(f"watch {path}: an event of unknown type {kind!r}")
                    version = _metadata(obj).get("resourceVersion")
                    if not isinstance(version, str) or not version:
                        raise CatchUpFailed(f"watch {path}: a {kind} event without metadata.resourceVersion")
                    compare_resource_versions(version, reached)  # well formed, or fail
                    # A change at or before the target is one the cache must have applied; one after it is not
                    # needed (the decision may be made on the state at the target) and ends the probe.
                    if kind != "BOOKMARK" and compare_resource_versions(version, target) <= 0:
                        floor = version
                    reached = version
                    if compare_resource_versions(reached, target) >= 0:
                        break
        except APIStatusError as exc:  # 410 as an HTTP status (etcd's answer) rather than an ERROR event
            if exc.gone:
                raise expired from exc
            raise
        # A stream that ended at its timeout short of the target is opened again from where it got to.
    proof = Current(gr, target, floor, watches)
    while True:
        now = exact()
        if now is None:
            raise NoSingleVersion(f"the cache of {gr} started listing while it was being caught up")
        if proof.holds(now):
            return proof
        # Registered before the first await: an event applied after this look is not missed.
        await changed(_left(deadline))


__all__ = ["Current", "NoSingleVersion", "prove_current"]
