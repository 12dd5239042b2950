"""What the verb handlers take: the stand-in's state and its two ways into the store, as a Protocol.

The handlers (dispatch and below) name this, not StandIn: standin.py dispatches to them, and implements
APIServer (a Protocol, so structurally), so imports run one way, server -> standin -> dispatch -> handlers ->
context (the `standin-request-path` contract in .importlinter). The open watch streams (`Watches`) live here
too, as both the stand-in (which closes them at shutdown) and the watch handler (which opens them) use them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

from ..store import Store, WatchEvent

T = TypeVar("T")


class APIServer(Protocol):
    """The stand-in as its handlers see it (criticalsvc/sim/apiserver/standin.py StandIn implements it)."""

    store: Store
    watches: Watches
    crd_path: Path | None
    default_user: str
    bookmark_interval: float
    watch_timeout: float
    # Discovery served without the aggregated form, and aggregated groups marked Stale (dispatch.py).
    aggregated_discovery: bool
    stale_groups: set[str]

    async def read(self, fn: Callable[[], T]) -> T:
        """Run `fn` on a reader thread holding the store's data lock."""
        ...

    async def write(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the one writer thread holding the store."""
        ...


class Closing:
    """Sentinel put on watch queues when the stand-in stops."""


class Watches:
    """The open watch streams; `close_all` ends them (at shutdown), from any thread."""

    def __init__(self) -> None:
        self.queues: set[asyncio.Queue[WatchEvent | Closing]] = set()
        self.loop: asyncio.AbstractEventLoop | None = None  # the serving loop, once started

    def __len__(self) -> int:
        return len(self.queues)

    def close_all(self) -> None:
        """End all open watch streams now (before a graceful server shutdown); callable from any thread."""
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and running is not loop:
            with contextlib.suppress(RuntimeError):  # the loop is closed: no stream is left to end
                loop.call_soon_threadsafe(self.close_all)
            return
        for queue in list(self.queues):
            queue.put_nowait(Closing())
