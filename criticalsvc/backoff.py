"""Exponential backoff: how long to wait after consecutive failures.

One shape for both users: the watch caches' reflectors (jittered, so a herd of them does not reconnect
in step) and the simulator's client-go work queues and retrying clients (exact, as client-go's
ItemExponentialFailureRateLimiter is, so a seeded simulation replays identically; [Q1] in
design/kubernetes-semantics.md).
"""

from __future__ import annotations

import random

import attrs

# 2⁶⁴ times any sensible initial delay is far past any maximum, while a float power raises
# OverflowError at 2¹⁰²⁴ (1,025 failures in a row: some hours of API server outage for a reflector
# retrying every 15-30 s), so the exponent stops at 64.
_MAX_EXPONENT = 64


@attrs.frozen
class Backoff:
    """Waits between failed attempts: `initial` after the first failure, times `factor` after each
    further one, at most `maximum`."""

    initial: float = 0.5
    maximum: float = 30.0
    factor: float = 2.0

    def delay(self, failures: int, rng: random.Random | None = None) -> float:
        """The wait after `failures` consecutive failures; with `rng`, scaled by 0.5-1.0 ("equal jitter":
        at least half the delay, so waiters that failed together do not retry together)."""
        exponent = min(max(0, failures - 1), _MAX_EXPONENT)
        wait = float(min(self.maximum, self.initial * self.factor**exponent))
        return wait if rng is None else wait * (0.5 + rng.random() / 2)


__all__ = ["Backoff"]
