"""Watch: one stream per request, fed from the store's event fan-out.

A watch subscribes a listener to the store (Store.subscribe) that puts each event on the stream's
queue, on the event loop's thread. Subscription and the initial events (or the backlog since the
requested resourceVersion) are taken atomically under the store's lock, so nothing is missed or
repeated. What the API server's watch cache does and this imitates: 410 Expired as an ERROR event for
a version older than the kept history, bookmarks (the `k8s.io/initial-events-end` one after the
initial events), timeoutSeconds, and selector transitions (an object that stops matching is DELETED
to this watch; design/kubernetes-semantics.md). A Table watch sends the column definitions with its
first event only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response, StreamingResponse

from ...restmapper import ResourceType
from ..store import StatusError, WatchEvent
from .context import APIServer, Closing
from .printing import OutputForm, printer, table
from .selectors import matcher


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    md = obj.get("metadata") or {}
    return str(md.get("namespace", "")), str(md.get("name", ""))


async def watch(standin: APIServer, *, t: ResourceType, namespace: str | None, params: Mapping[str, str],
                form: OutputForm) -> Response:
    """A watch of a collection (one namespace, or all of them), as a stream of JSON lines."""
    store = standin.store
    match = matcher(params)
    found_printer = await standin.read(lambda: printer(store, t, standin.crd_path)) if form.table else None
    if found_printer is not None:
        # a bad includeObject is a 400 before the stream starts
        table(found_printer, [], now=store.clock(), resource_version="", form=form)
    selective = bool(params.get("labelSelector") or params.get("fieldSelector"))
    gr = t.group_resource
    raw_rv = params.get("resourceVersion", "")
    send_initial = params.get("sendInitialEvents") == "true" or raw_rv in ("", "0")
    if not send_initial and not raw_rv.isdigit():
        raise StatusError(400, "BadRequest", f'resourceVersion: Invalid value: "{raw_rv}": must be an integer')
    floor = int(raw_rv) if raw_rv.isdigit() else 0
    bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
    try:
        timeout = float(params.get("timeoutSeconds") or standin.watch_timeout)
    except ValueError:
        raise StatusError(400, "BadRequest", "timeoutSeconds: must be a number") from None
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[WatchEvent | Closing] = asyncio.Queue()

    def in_scope(obj: Mapping[str, Any]) -> bool:
        return namespace is None or namespace == "" or (obj.get("metadata") or {}).get("namespace") == namespace

    def listener(event: WatchEvent) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the stream is over anyway
            loop.call_soon_threadsafe(queue.put_nowait, event)

    # With a selector, an object that stops (starts) matching is DELETED (ADDED) to this watch, as
    # in the watch cache. `seen` holds the keys this watch shows; for a watch from a resourceVersion
    # it starts as what matches at subscription (the state at that version is not kept).
    seen: set[tuple[str, str]] = set()

    def translate(kind: str, obj: Mapping[str, Any]) -> str | None:
        if not selective:
            return kind
        key = _key(obj)
        if kind == "DELETED":
            visible = key in seen or match(obj)
            seen.discard(key)
            return "DELETED" if visible else None
        if match(obj):
            shown = "ADDED" if kind == "ADDED" or key not in seen else kind
            seen.add(key)
            return shown
        if key in seen:
            seen.discard(key)
            return "DELETED"
        return None

    def subscribe() -> tuple[Callable[[], None], int, list[tuple[str, Mapping[str, Any]]]] | int:
        # Atomic under the data lock: nothing is missed or repeated between backlog and live events.
        current = store.resource_version
        objects = [o for o in store.list(gr, namespace or None) if match(o)]
        initial: list[tuple[str, Mapping[str, Any]]] = []
        if send_initial:
            initial = [("ADDED", o) for o in objects]
            seen.update(_key(o) for o in objects)
        else:
            backlog = store.events_since(floor)
            if backlog is None:  # too old: answer with the oldest version still known
                return store.events[0].resource_version - 1 if store.events else current
            seen.update(_key(o) for o in objects)
            for e in backlog:
                kind = translate(e.type, e.object) if e.group_resource == gr and in_scope(e.object) else None
                if kind is not None:
                    initial.append((kind, e.object))
        return store.subscribe(listener), current, initial

    subscribed = await standin.read(subscribe)
    if isinstance(subscribed, int):
        # The watch cache's answer to an expired version: HTTP 200, one ERROR event, 410 Expired.
        gone = StatusError(410, "Expired", f"too old resource version: {floor} ({subscribed})").status()
        return Response(orjson.dumps({"type": "ERROR", "object": gone}) + b"\n", media_type="application/json")
    unsubscribe, start_rv, initial = subscribed
    standin.watches.queues.add(queue)

    headers = [True]  # a Table watch sends the column definitions with the first event only

    def line(kind: str, obj: Mapping[str, Any]) -> bytes:
        if found_printer is not None:
            md = obj.get("metadata") or {}
            obj = table(found_printer, [dict(obj)], now=store.clock(),
                        resource_version=str(md.get("resourceVersion", "")), form=form, headers=headers[0],
                        is_list=False)
            headers[0] = False
        return orjson.dumps({"type": kind, "object": obj}) + b"\n"

    def bookmark(rv: int, *, initial_end: bool = False) -> bytes:
        md: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        return line("BOOKMARK", {"kind": t.kind, "apiVersion": t.api_version, "metadata": md})

    async def stream() -> AsyncIterator[bytes]:
        try:
            deadline = loop.time() + timeout
            for initial_kind, obj in initial:
                yield line(initial_kind, obj)
            last_rv = start_rv
            if bookmarks:
                yield bookmark(last_rv, initial_end=send_initial)
            next_bookmark = loop.time() + standin.bookmark_interval
            while True:
                now = loop.time()
                if now >= deadline:
                    return
                if bookmarks and now >= next_bookmark:
                    yield bookmark(last_rv)
                    next_bookmark = now + standin.bookmark_interval
                wait = min(deadline, next_bookmark) - now if bookmarks else deadline - now
                try:
                    event = await asyncio.wait_for(queue.get(), max(wait, 0.0))
                except TimeoutError:
                    continue
                if isinstance(event, Closing):
                    return
                last_rv = event.resource_version
                if event.group_resource != gr or event.resource_version <= floor or not in_scope(event.object):
                    continue
                shown = translate(event.type, event.object)
                if shown is not None:
                    yield line(shown, event.object)
        finally:
            standin.watches.queues.discard(queue)
            unsubscribe()

    return StreamingResponse(stream(), media_type="application/json")
