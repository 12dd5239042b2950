"""Exponential backoff, shared by the watch caches (jittered) and the simulator's work queues (exact)."""

from __future__ import annotations

import random

from criticalsvc.backoff import Backoff


def test_backoff_doubles_to_its_cap_with_jitter() -> None:
    """Delays start at 0.5 s, double per failure, stop at 30 s, and stay within half to all of that."""
    b, rng = Backoff(), random.Random(7)
    for failures, base in [(1, 0.5), (2, 1.0), (3, 2.0), (7, 30.0), (50, 30.0)]:
        delay = b.delay(failures, rng)
        assert base / 2 <= delay <= base


def test_backoff_without_jitter_is_exact() -> None:
    """Without a random source the delay is initial·factorⁿ⁻¹ exactly, as client-go's rate limiter waits."""
    b = Backoff(initial=0.005, maximum=1000.0)
    assert [b.delay(n) for n in (1, 2, 3, 18, 19)] == [0.005, 0.01, 0.02, 655.36, 1000.0]


def test_backoff_after_thousands_of_failures_is_the_maximum() -> None:
    """Thousands of failures in a row (hours of outage) still give the maximum, not a float overflow."""
    assert Backoff().delay(5000) == 30.0
    assert 15.0 <= Backoff().delay(5000, random.Random(1)) <= 30.0
