"""The event-loop lag probe: a loop held by blocking work shows up in criticalsvc_event_loop_lag_seconds."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Callable

import pytest

from criticalsvc.metrics import Metrics, probe_event_loop_lag, time_garbage_collections

pytestmark = pytest.mark.anyio

BLOCK = 0.4  # seconds the loop is held: far above the probe's interval and any scheduling noise


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _samples(metrics: Metrics, name: str = "criticalsvc_event_loop_lag_seconds") -> dict[str, float]:
    """A histogram's samples from the exposition a scrape sees: bucket counts by le, count, sum."""
    out = {}
    for line in metrics.exposition()[0].decode().splitlines():
        if line.startswith(name) and line[len(name)] in "_{":
            head, _, value = line.rpartition(" ")
            out[head.removeprefix(name)] = float(value)
    return out


CPU = "criticalsvc_event_loop_lag_cpu_seconds"


def _spin(seconds: float) -> None:
    """Hold the loop on the CPU (a long synchronous step of ours)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def test_a_blocked_loop_is_seen_as_lag() -> None:
    metrics = Metrics()
    probe = asyncio.create_task(probe_event_loop_lag(metrics))
    try:
        await _until(lambda: _samples(metrics)["_count"] >= 3, "the probe's first samples")
        before = _samples(metrics)
        time.sleep(BLOCK)  # what a long synchronous step (a big decode, a GC pause) does to the loop
        await _until(lambda: _samples(metrics)["_count"] > before["_count"], "the probe to run again")
        after = _samples(metrics)
    finally:
        probe.cancel()
    # The stall is one sample of about BLOCK seconds: above the 0.25 s bucket, and in the sum.
    above = lambda s: s['_bucket{le="+Inf"}'] - s['_bucket{le="0.25"}']  # noqa: E731
    assert above(after) - above(before) == 1, (before, after)
    assert after["_sum"] - before["_sum"] >= BLOCK * 0.9, (before, after)


async def test_lag_on_the_cpu_is_told_from_lag_the_process_was_not_run() -> None:
    """Spinning on the loop (our own work) is lag on the CPU; sleeping in it (as a process the OS does not
    run) is lag, but not on the CPU."""
    metrics = Metrics()
    probe = asyncio.create_task(probe_event_loop_lag(metrics))
    try:
        await _until(lambda: _samples(metrics)["_count"] >= 3, "the probe's first samples")
        for hold in (_spin, time.sleep):
            before = _samples(metrics, CPU)
            cpu = time.thread_time()
            hold(BLOCK)
            held_on_cpu = time.thread_time() - cpu  # on a busy machine even a spin gets only part of a core
            await _until(lambda b=before: _samples(metrics, CPU)["_count"] > b["_count"], "the probe to run again")
            on_cpu = _samples(metrics, CPU)["_sum"] - before["_sum"]
            if hold is _spin:
                assert on_cpu >= held_on_cpu * 0.9, (on_cpu, held_on_cpu)
            else:
                assert held_on_cpu < 0.01 and on_cpu < 0.05, (on_cpu, held_on_cpu)
    finally:
        probe.cancel()


def test_garbage_collections_are_timed_by_generation() -> None:
    metrics = Metrics()
    stop = time_garbage_collections(metrics)
    try:
        gc.collect(2)
        gc.collect(0)
    finally:
        stop()
    counted = _gc_counts(metrics)
    gc.collect(2)  # after the undo: not counted
    assert counted.get("2", 0) >= 1 and counted.get("0", 0) >= 1, counted
    assert _gc_counts(metrics) == counted


def _gc_counts(metrics: Metrics) -> dict[str, float]:
    prefix = 'criticalsvc_gc_pause_seconds_count{generation="'
    return {line[len(prefix)].split('"')[0]: float(line.rpartition(" ")[2])
            for line in metrics.exposition()[0].decode().splitlines() if line.startswith(prefix)}


class _Syncing:
    """A state source that becomes ready when told (CacheState's wait_ready, in small)."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()

    async def wait_ready(self, timeout: float | None = None) -> bool:
        await self.synced.wait()
        return True


async def test_the_heap_is_frozen_again_once_the_caches_have_synced() -> None:
    """What the caches hold at sync time moves out of the collector's reach (gc.freeze), not before."""
    from criticalsvc.commands.serve import freeze_heap_when_synced

    source = _Syncing()
    gc.unfreeze()
    try:
        task = asyncio.create_task(freeze_heap_when_synced(source))
        await asyncio.sleep(0.05)
        assert gc.get_freeze_count() == 0 and not task.done()  # not synced yet: nothing frozen
        cached = [{"object": i} for i in range(1000)]  # what the caches fill in while syncing
        source.synced.set()
        assert await asyncio.wait_for(task, 10) is True
        assert gc.get_freeze_count() >= len(cached)
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("slow", [0.0, 60.0])
async def test_a_slow_full_collection_freezes_the_heap_again(slow: float) -> None:
    """What is cached after the sync (10,000 CriticalServices created one by one) is walked by every full collection
    until it is frozen too: after a full collection slower than `slow`, the heap is frozen again. The negative control
    (no collection is that slow) freezes nothing."""
    from criticalsvc.commands.serve import refreeze_after_slow_collections

    gc.unfreeze()
    task = asyncio.create_task(refreeze_after_slow_collections(slow=slow, every=0.0, check=0.05))
    try:
        cached = [{"object": i} for i in range(20000)]  # cached after the sync
        await asyncio.sleep(0.01)
        gc.collect()  # a full collection
        await asyncio.sleep(0.2)
        if slow == 0.0:
            assert gc.get_freeze_count() >= len(cached)
        else:
            assert gc.get_freeze_count() == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.unfreeze()
