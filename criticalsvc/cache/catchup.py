"""Catching the mirror up: a type too large to LIST, read as fresh as a LIST, from the gate's own cache.

A Finalizer criterion asks "does any object of this type carry finalizer f?". No selector exists for
finalizers, so the fresh read that confirms an ALLOW (criticalsvc/live.py) LISTs the whole type; at
100,000 objects that LIST does not fit the confirmation's budget and the provider's DELETE is refused
as "could not verify" for as long as the type is that large (design/operations.md, "Real scale").

What the fresh LIST guarantees is this: the decision is made on the type's state at a resourceVersion
the API server reached after the confirmation began, so nothing written before the request arrived
is missed. The same holds for the gate's mirror of the type (its reflector's store) once it is known
to hold every event up to such a version. Here is how that is known, with the API server's own tools:

1. **A fresh version.** A LIST with `limit=1` and no resourceVersion is a consistent read: kube-apiserver
   asks etcd for its current revision and serves the answer once its watch cache has reached it
   ([delegator.go `ShouldDelegateList`](https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/storage/cacher/delegator/interface.go#L38-L62),
   consistent reads from the cache, KEP-2340); the answer's `metadata.resourceVersion` (the target) is
   at least the revision when the confirmation began. One object on the wire, not 100,000.
2. **The mirror's version.** Between two awaits of the event loop, the reflector's store holds exactly
   the state at its `resource_version` (its LIST, then every event in order). The caller takes that
   view (the objects carrying f, and the version) in one synchronous step, and only from a reflector
   that is watching, is the one decisions read, and has no successor listing beside it (a successor's
   pages mix an older snapshot into the store: criticalsvc/cache/watchset.py).
3. **The events in between.** A watch opened from the mirror's version delivers every change of the
   type after it, in order; a BOOKMARK event says every change up to its version was sent
   ([API concepts, watch bookmarks](https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks)).
   Once an event or a bookmark at or past the target has arrived, the view with those events applied
   is the state at a version past the target. Versions of one resource compare as integers: the rule
   kube-apiserver publishes for clients in
   [apimachinery `CompareResourceVersion`](https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apimachinery/pkg/util/resourceversion/resourceversion.go);
   a version that is not such an integer makes the catch-up fail (the caller then LISTs).

How soon the bookmark comes. kube-apiserver sends a watcher a bookmark about once a minute, or 2 s
before the watch's own deadline, whichever is first, on a timer that ticks about once a second
([cache_watcher.go `nextBookmarkTime`](https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go#L233-L269),
[cacher.go `dispatchEvents`](https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go#L904-L960)).
So the watch asks for `timeoutSeconds=3`: its bookmark is due 1 s in, and arrives 0-2.25 s after the
watch opens. Its version is the last the cache dispatched, which the consistent read of step 1 has
just pushed past the target (the cache asked etcd for progress to serve it). Any event of the type
past the target ends the wait sooner. A bookmark short of the target (another API server behind a load
balancer that has not caught up) re-opens the watch from it, until the caller's deadline.

A read started when the criterion turned met (before the DELETE) would be cheaper still but is not
enough on its own: it cannot see a carrier added between it and the request. Started then and followed
by the watch, it is what the mirror already is.

Failure is never an ALLOW: a 410 (the mirror's version has left the API server's window), a timeout or
an unreadable answer raise, and the caller falls back to the LIST or denies with "could not verify".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ..objects import KubeObject
from ..restmapper import ResourceType
from .transport import ACCEPT_METADATA_LIST, APIStatusError, Transport, TransportError

# The watch's own timeoutSeconds: its bookmark is due 2 s before that, so 1 s in (3 is the least that
# gets one: with 2 the bookmark time has passed when the watcher registers).
WATCH_SECONDS = 3


class CatchUpFailed(TransportError):
    """The mirror could not be brought up to the fresh version: why, in one line."""


class MirrorExpired(CatchUpFailed):
    """410: the API server no longer holds the events after the mirror's version."""


def compare_resource_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as `a` is older than, the same as or newer than `b` (two versions of one resource).

    As apimachinery's CompareResourceVersion: positive integers without leading zeros, of any length.
    Raises CatchUpFailed for anything else (an API server whose versions are not comparable)."""
    for v in (a, b):
        if not (v.isascii() and v.isdigit() and v[0] != "0"):
            raise CatchUpFailed(f"resourceVersion {v!r} is not a positive integer; versions cannot be compared")
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


@attrs.frozen
class MirrorView:
    """What the mirror held of one type at `resource_version`: the objects a question keeps (e.g. those
    carrying a finalizer), keyed by (namespace, name), and how many objects of the type it held in all."""

    resource_version: str
    objects: Mapping[tuple[str, str], KubeObject]
    total: int


@attrs.frozen
class CaughtUp:
    objects: list[KubeObject]
    resource_version: str  # the version the answer is the state at (>= target)
    target: str
    watches: int  # watch streams opened (0 when the mirror was already past the target)


def _metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


async def fresh_version(transport: Transport, resource: ResourceType, deadline: float) -> str:
    """A resourceVersion of `resource` at least as new as the API server's revision now (step 1)."""
    page = await transport.get(resource.path(), [("limit", "1")], timeout=_left(deadline),
                               accept=ACCEPT_METADATA_LIST)
    version = _metadata(page).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise CatchUpFailed(f"LIST {resource.path()}?limit=1: the answer has no metadata.resourceVersion")
    return version


async def catch_up(transport: Transport, resource: ResourceType, view: MirrorView, *,
                   keep: Callable[[Mapping[str, Any]], KubeObject | None], accept: str, deadline: float,
                   watch_seconds: int = WATCH_SECONDS) -> CaughtUp:
    """`view` brought to a version at least as new as a consistent read made now.

    `keep(raw)` projects an object from an event and says whether the question keeps it (None: drop it
    from the answer). Raises CatchUpFailed (MirrorExpired for a 410), TimeoutError past `deadline`, or
    the transport's APIError."""
    target = await fresh_version(transport, resource, deadline)
    reached = view.resource_version
    objects = dict(view.objects)
    if compare_resource_versions(reached, target) >= 0:
        return CaughtUp(list(objects.values()), reached, target, watches=0)
    path = resource.path()
    watches = 0
    while True:
        left = _left(deadline)
        params = [("watch", "true"), ("resourceVersion", reached), ("allowWatchBookmarks", "true"),
                  ("timeoutSeconds", str(watch_seconds))]
        watches += 1
        expired = MirrorExpired(f"watch {path} from resourceVersion {reached}: 410 Gone, the API server no longer "
                                "holds the events since the mirror's version")
        try:
            async with transport.stream(path, params, timeout=min(left, watch_seconds + 1.0), accept=accept) as stream:
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
                    metadata = _metadata(obj)
                    key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
                    if kind in ("ADDED", "MODIFIED"):
                        kept = keep(obj)
                        if kept is None:
                            objects.pop(key, None)
                        else:
                            objects[key] = kept
                    elif kind == "DELETED":
                        objects.pop(key, None)
                    elif kind != "BOOKMARK":
                        raise CatchUpFailed(f"watch {path}: an event of unknown type {kind!r}")
                    version = metadata.get("resourceVersion")
                    if isinstance(version, str) and version:
                        compare_resource_versions(version, reached)  # well formed, or fail
                        reached = version
                    if compare_resource_versions(reached, target) >= 0:
                        return CaughtUp(list(objects.values()), reached, target, watches)
        except APIStatusError as exc:  # 410 as an HTTP status (etcd's answer) rather than an ERROR event
            if exc.gone:
                raise expired from exc
            raise
        # The stream ended at its timeout short of the target: open it again from where it got to.


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the confirmation budget is spent")
    return left


__all__ = ["WATCH_SECONDS", "CatchUpFailed", "CaughtUp", "MirrorExpired", "MirrorView", "catch_up",
           "compare_resource_versions", "fresh_version"]
