"""A reflector: one list-then-watch loop that mirrors one group/resource into a sink.

The loop, per resource (kopf's watcher and client-go's reflector are the models):

    LIST (paged, 500 per page, no resourceVersion: a consistent read)  -> sink.list_page(items) per page,
                                                                          sink.list_done() after the last
         take resourceVersion from the LIST's metadata                  -> synced is set
    WATCH from that version, allowWatchBookmarks=true, timeoutSeconds 5-10 min (random, as client-go)
         ADDED / MODIFIED  -> sink.upsert(obj)       DELETED -> sink.delete(obj)
         BOOKMARK          -> only the resourceVersion moves on
         every event's resourceVersion is remembered; a stream that ends is re-opened from it
    410 Gone (as an ERROR event or as the HTTP status) -> LIST again: the version is too old and the
         events in between are lost, so only a fresh LIST can bring the mirror back in line; at once
         the first time, with backoff when 410s repeat without an event in between
    any other failure (dropped connection, 5xx, timeout) -> wait, then re-open the watch from the last
         version (or LIST again if none); the wait is 0.5 s doubling to 30 s, jittered, and starts
         over once a LIST or an event succeeds

Each such start-over counts in `restarts` (and calls `on_restart`), which feeds
criticalsvc_watch_restarts_total. A stream the server closes cleanly after its timeoutSeconds is
normal and does not count; one that closes at once without an event is treated as a failure, so a
misbehaving server cannot make the loop spin.

`synced` is set after the first successful LIST and stays set through reconnects: a mirror that is
briefly behind is still the best cache there is (every ALLOW of a protected deletion is confirmed
with a fresh read; a denial from a slightly stale cache is safe). Only the first sync gates
readiness.

Objects travel as plain JSON from the transport to the sink and no further: the sink projects them
into slim KubeObjects (criticalsvc.objects.project) at once. An unexpected exception (a bug, a
malformed answer) is logged and handled like a failure followed by a fresh LIST: a reflector never
stops silently while `synced` says its mirror is good.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from ..api import GroupResource
from ..backoff import Backoff
from ..restmapper import ResourceType
from .transport import (
    ACCEPT_METADATA,
    ACCEPT_METADATA_LIST,
    APIError,
    APIStatusError,
    Transport,
    TransportError,
    list_items,
)

log = structlog.get_logger("criticalsvc.cache")

JSON = dict[str, Any]

# Pages of 500 keep a LIST of a large resource from timing out or ballooning one response
# (kubectl and client-go's pager use 500 too).
PAGE_SIZE = 500
# A LIST of 500 metadata-only objects is ~0.5 MB; 30 s also covers a loaded API server.
LIST_TIMEOUT = 30.0
# client-go watches for a random 5-10 min so reconnects of many clients spread out; the server closes
# the stream at timeoutSeconds and the client gives up 30 s after that if the close never arrives
# (a half-open connection).
WATCH_SECONDS = (300, 600)
WATCH_GRACE = 30.0
# A stream that ends this soon without a single event is a failure, not a normal expiry.
MIN_HEALTHY_STREAM = 1.0
# The longest the watch loop applies events before it lets the event loop run what waits (reviews). The
# transport hands over a whole read's worth of events (up to 64 KiB: dozens of objects) without
# awaiting in between, and each costs a projection and, for a conditioned type, a CEL evaluation
# (~150 us, far more on a busy machine): measured on the real control plane under 80 writes/s of churn,
# the loop was held on the CPU for 9 ms at p99 (criticalsvc_event_loop_lag_cpu_seconds), every review
# arriving meanwhile waiting it out. 2 ms is the gate's decision budget (issue 21).
LOOP_SLICE = 0.002


class Sink(Protocol):
    """Where a reflector's objects go (a cache store); calls come from the event loop only.

    A LIST is handed over a page at a time: `list_page` takes each page's objects as it arrives (`first` for
    the first page of a LIST), `list_done` ends the LIST, and the sink forgets what no page of it held. The
    pages were collected and handed over at once before: at 100,000 ConfigMaps a replica held every raw
    object of the LIST (3.4 KB each, decoded) until the last page came, and its RSS kept that high-water
    mark (~4 KB per cached object where ~0.5 KB is the live cost; python -m benchmarks realscale,
    design/operations.md "Real scale"). A LIST that fails half-way leaves its pages applied and nothing
    forgotten: more objects than the truth, never fewer, until the next LIST completes.
    """

    def list_page(self, gr: GroupResource, items: Sequence[Mapping[str, Any]], *, first: bool) -> None: ...

    def list_done(self, gr: GroupResource) -> None: ...

    def upsert(self, gr: GroupResource, obj: Mapping[str, Any]) -> None: ...

    def delete(self, gr: GroupResource, obj: Mapping[str, Any]) -> None: ...


DEFAULT_BACKOFF = Backoff()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


class _Gone(Exception):
    """The watch's resourceVersion expired (410): list again."""


class Reflector:
    """Mirrors one resource into `sink`; `start()` runs it as a task until `stop()`."""

    def __init__(self, *, transport: Transport, resource: ResourceType, sink: Sink,
                 metadata_only: bool = True, backoff: Backoff = DEFAULT_BACKOFF,
                 watch_seconds: tuple[int, int] = WATCH_SECONDS, list_timeout: float = LIST_TIMEOUT,
                 page_size: int = PAGE_SIZE, on_restart: Callable[[GroupResource, str], None] | None = None,
                 on_synced: Callable[[GroupResource], None] | None = None,
                 rng: random.Random | None = None, loop_slice: float = LOOP_SLICE) -> None:
        self.transport = transport
        self.loop_slice = loop_slice
        self.resource = resource
        self.gr = resource.group_resource
        self.sink = sink
        self.metadata_only = metadata_only
        self.backoff = backoff
        self.watch_seconds = watch_seconds
        self.list_timeout = list_timeout
        self.page_size = page_size
        self.on_restart = on_restart
        self.on_synced = on_synced
        self.rng = rng or random.Random()
        self.synced = asyncio.Event()
        self.restarts = 0
        self.lists = 0
        self.resource_version: str | None = None
        # True while a watch stream is open (the server has accepted it): for diagnostics and tests.
        self.watching = False
        self.last_error: str | None = None
        self.forbidden = False  # the last LIST or WATCH was refused with 403 Forbidden
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._gones = 0
        self.sleep: Callable[[float], Awaitable[None]] = asyncio.sleep  # tests record the waits

    def __repr__(self) -> str:
        return f"<Reflector {self.gr} rv={self.resource_version} synced={self.synced.is_set()}>"

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"reflector {self.gr}")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        path = self.resource.path()
        while True:
            try:
                if self.resource_version is None:
                    await self._list(path)
                await self._watch(path)
                continue  # a normal expiry: re-open from the remembered version at once
            except _Gone:
                delay = self._gone("410 Gone: resourceVersion too old, listing again")
            except APIStatusError as exc:
                # 403: the gate's RBAC does not cover this type (a criterion names a type nobody granted
                # it); that is configuration, not a passing fault, and the cache manager says so.
                self.forbidden = exc.code == 403
                delay = self._gone(f"410 Gone: {exc.message}") if exc.gone else self._failed(str(exc))
            except APIError as exc:
                delay = self._failed(str(exc))
            except Exception as exc:  # a bug (ours or the server's): never let the mirror silently stop
                log.exception("reflector failed", resource=str(self.gr))
                self.resource_version = None  # whatever was half-applied, a fresh LIST replaces it
                delay = self._failed(f"unexpected {type(exc).__name__}: {exc}")
            if delay:
                await self.sleep(delay)

    def _failed(self, why: str) -> float:
        self._restart(why)
        self._failures += 1
        return self.backoff.delay(self._failures, self.rng)

    def _gone(self, why: str) -> float:
        # The first 410 is routine (the version aged out while the watch was away): list again at once,
        # since waiting only widens the gap. 410s in a row with no event between them mean something
        # is wrong with the server; they back off like any failure.
        self.resource_version = None
        self._restart(why)
        self._gones += 1
        return self.backoff.delay(self._gones - 1, self.rng) if self._gones > 1 else 0.0

    def _restart(self, why: str) -> None:
        self.restarts += 1
        self.last_error = why
        log.info("watch restarting", resource=str(self.gr), reason=why, restarts=self.restarts)
        if self.on_restart is not None:
            self.on_restart(self.gr, why)

    async def _list(self, path: str) -> None:
        params: list[tuple[str, str]] = [("limit", str(self.page_size))]
        resource_version = ""
        accept = ACCEPT_METADATA_LIST if self.metadata_only else "application/json"
        first = True
        while True:
            # No resourceVersion: a consistent (quorum) read; "0" could serve a stale watch-cache copy.
            page = await self.transport.get(path, params, timeout=self.list_timeout, accept=accept)
            metadata = _mapping(page.get("metadata"))
            page_items = list_items(page)
            if page_items is None:
                raise TransportError(f"LIST {path}: the answer has no items")
            self.sink.list_page(self.gr, [i for i in page_items if isinstance(i, dict)], first=first)
            first = False
            del page, page_items  # a page's raw objects go before the next one comes
            resource_version = str(metadata.get("resourceVersion") or resource_version)
            token = metadata.get("continue")
            if not token:
                break
            # An expired continue token is a 410 like an expired watch: the caller lists from scratch.
            params = [("limit", str(self.page_size)), ("continue", str(token))]
        if not resource_version:
            raise TransportError(f"LIST {path}: the answer has no metadata.resourceVersion")
        self.sink.list_done(self.gr)
        self.resource_version = resource_version
        self.lists += 1
        self._failures = 0
        self.forbidden = False
        if not self.synced.is_set():
            self.synced.set()
            if self.on_synced is not None:
                self.on_synced(self.gr)

    async def _watch(self, path: str) -> None:
        assert self.resource_version is not None
        seconds = self.rng.randint(*self.watch_seconds)
        params = [("watch", "true"), ("resourceVersion", self.resource_version), ("allowWatchBookmarks", "true"),
                  ("timeoutSeconds", str(seconds))]
        accept = ACCEPT_METADATA if self.metadata_only else "application/json"
        opened = time.monotonic()
        events = 0
        async with self.transport.stream(path, params, timeout=seconds + WATCH_GRACE, accept=accept) as stream:
            self.watching = True
            try:
                slice_started = time.perf_counter()
                async for event in stream:
                    self._handle(event)
                    events += 1
                    self._failures = 0
                    if time.perf_counter() - slice_started > self.loop_slice:
                        await asyncio.sleep(0)  # let the reviews queued behind this burst of events run
                        slice_started = time.perf_counter()
            finally:
                self.watching = False
        if events == 0 and time.monotonic() - opened < MIN_HEALTHY_STREAM:
            raise TransportError(f"watch {path}: the server closed the stream at once")

    def _handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise TransportError(f"watch {self.gr}: an event without an object")
        if kind == "ERROR":
            code = obj.get("code")
            if code == 410:
                raise _Gone()
            raise APIStatusError(int(code) if isinstance(code, int) else 500, str(obj.get("reason") or ""),
                                 str(obj.get("message") or "error event in the watch stream"))
        metadata = _mapping(obj.get("metadata"))
        rv = metadata.get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return
        self._gones = 0
        if kind in ("ADDED", "MODIFIED"):
            self.sink.upsert(self.gr, obj)
        elif kind == "DELETED":
            self.sink.delete(self.gr, obj)
        else:
            log.warning("unknown watch event type ignored", resource=str(self.gr), type=str(kind))
            return
        if rv:
            self.resource_version = str(rv)


__all__ = [
    "DEFAULT_BACKOFF",
    "LIST_TIMEOUT",
    "PAGE_SIZE",
    "WATCH_SECONDS",
    "Reflector",
    "Sink",
]
