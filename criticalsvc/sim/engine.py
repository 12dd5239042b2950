"""Time for the simulated control plane: one scheduling interface, two clocks.

Controllers and clients never sleep; they `schedule(delay, callback)` and read `now()`. The virtual
engine runs callbacks in (time, sequence) order and jumps the clock, so a teardown of minutes of
backoff runs in milliseconds and replays identically for a seed; the real-time engine maps the same
calls onto an asyncio loop for the HTTP stand-in, where a kubectl user watches things happen.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

Callback = Callable[[], None]


class Engine(Protocol):
    def now(self) -> float: ...

    def schedule(self, delay: float, callback: Callback) -> None: ...


class VirtualEngine:
    """Discrete-event time. `run_until(t)` / `run()` execute scheduled callbacks in order."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self.start = start
        self._queue: list[tuple[float, int, Callback]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def elapsed(self) -> float:
        return self._now - self.start

    def schedule(self, delay: float, callback: Callback) -> None:
        heapq.heappush(self._queue, (self._now + max(0.0, delay), next(self._seq), callback))

    def pending(self) -> int:
        return len(self._queue)

    def step(self) -> bool:
        if not self._queue:
            return False
        when, _, callback = heapq.heappop(self._queue)
        self._now = max(self._now, when)
        callback()
        return True

    def run(self, *, until: float | None = None, stop: Callable[[], bool] | None = None,
            max_steps: int = 10_000_000) -> None:
        """Run until the queue is empty, virtual time passes `until` (absolute), or `stop()` is true."""
        for _ in range(max_steps):
            if stop is not None and stop():
                return
            if not self._queue or (until is not None and self._queue[0][0] > until):
                if until is not None:
                    self._now = max(self._now, until)
                return
            self.step()
        raise RuntimeError(f"simulation did not settle within {max_steps} steps")


class RealTimeEngine:
    """Wall-clock time on an asyncio loop (the embedded API server's face)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop

    def now(self) -> float:
        return time.time()

    def schedule(self, delay: float, callback: Callback) -> None:
        loop = self._loop or asyncio.get_running_loop()
        loop.call_soon_threadsafe(loop.call_later, max(0.0, delay), callback)
