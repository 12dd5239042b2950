"""client-go's work queue: one pending run per key (the earliest wins) and a per-key failure count.

The 10 qps token bucket client-go adds on top is left out (teardowns here stay far below 10 syncs per
second); upstream: k8s.io/client-go util/workqueue (delaying_queue.go, default_rate_limiters.go) [Q1].
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from ...backoff import Backoff
from ..engine import Engine

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """client-go's rate-limited delaying queue, as much of it as a single-threaded model needs.

    `add_after` keeps one pending run per key, the earliest; `add_rate_limited` waits base·2ⁿ (n =
    failures so far) and counts a failure; `forget` resets the count, as a successful sync does.
    """

    def __init__(self, engine: Engine, process: Callable[[K], None], *, base: float, cap: float) -> None:
        self._engine = engine
        self._process = process
        self.backoff = Backoff(initial=base, maximum=cap)  # client-go's ItemExponentialFailureRateLimiter [Q1]
        self._due: dict[K, float] = {}
        self._failures: dict[K, int] = {}

    def add(self, key: K) -> None:
        self.add_after(key, 0.0)

    def add_after(self, key: K, delay: float) -> None:
        delay = max(0.0, delay)
        due = self._engine.now() + delay
        current = self._due.get(key)
        if current is not None and current <= due:
            return
        self._due[key] = due
        self._engine.schedule(delay, lambda: self._fire(key, due))

    def add_rate_limited(self, key: K) -> float:
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def pending(self, key: K) -> bool:
        return key in self._due

    def _fire(self, key: K, due: float) -> None:
        if self._due.get(key) != due:
            return  # superseded by an earlier run
        del self._due[key]
        self._process(key)
