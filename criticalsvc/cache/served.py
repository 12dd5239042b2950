"""ServedTypes: what the API server serves, kept current in the cache's RESTMapper.

The mapper starts empty and holds what discovery (discovery.py) reports plus every established CRD
in the CRD cache: the CRD watch learns a new type the moment it is established, before the next
discovery read, and a CRD change also asks for a discovery refresh. Discovery is the authority on
what is served and in which version; established CRDs only fill the gap until it has caught up.

Discovery is read when `start()`ed, again soon after a CRD change (`refresh`), after a partial
answer (a group failed: its types are unknown, not absent), and otherwise every `interval`, because
aggregated APIs appear and vanish without a CRD event. A failed read is retried with backoff, never
abandoned. Until the first read has succeeded, `discovered` is None and the guarded state answers
nothing (guarded.py).

Whenever the mapper may have changed, `on_change` runs (the watch set reconciles); after each
successful read `on_discovered` runs as well (the cache wakes whoever waits for readiness).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable

import structlog

from ..backoff import Backoff
from ..restmapper import ResourceType, RESTMapper
from .discovery import DiscoveryResult, discover, sync_mapper
from .transport import APIError, Transport

log = structlog.get_logger("criticalsvc.cache")

# Aggregated APIs appear and vanish without a CRD event; 5 min bounds how long such a change goes
# unseen (kubectl's discovery cache lives 6 h; we can afford to be much fresher).
DISCOVERY_INTERVAL = 300.0
# A teardown deletes CRDs by the dozen and each asks for discovery again: read back to back, discovery
# took ~6 % of a replica's CPU in the 50-stack teardown (py-spy), each read decoding and mapping every
# group's document on the event loop. At most one read per REFRESH_SPACING: a new CRD's type is known
# from the CRD watch meanwhile (crd_established), and a type that went away kept one second longer only
# makes the gate look for objects that are not there.
REFRESH_SPACING = 1.0


class ServedTypes:
    """The discovery loop and the established CRDs, feeding one RESTMapper; `start()`, then `stop()`."""

    def __init__(self, transport: Transport, mapper: RESTMapper, *, backoff: Backoff, interval: float,
                 timeout: float, rng: random.Random, on_change: Callable[[], None],
                 on_discovered: Callable[[], None], spacing: float = REFRESH_SPACING) -> None:
        self.transport = transport
        self.spacing = spacing
        self.mapper = mapper
        self.backoff = backoff
        self.interval = interval
        self.timeout = timeout
        self.rng = rng
        self.on_change = on_change
        self.on_discovered = on_discovered
        # The last successful discovery; None before the first one and once stopped.
        self.discovered: DiscoveryResult | None = None
        self.error: str | None = None  # why the last read failed, while it keeps failing
        self.discoveries = 0
        self._crd_types: dict[str, ResourceType] = {}  # established CRDs by name
        self._refresh = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._discovering = False

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="discovery")

    async def stop(self) -> None:
        self.discovered = None  # first: no question is answered from a store nobody keeps current
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def refresh(self) -> None:
        """Read discovery again soon (CRD changes call this)."""
        self._refresh.set()

    @property
    def pending(self) -> bool:
        """A discovery read is running or asked for (the mapper may be about to change)."""
        return self._discovering or self._refresh.is_set()

    # --- established CRDs (the CRD cache reports them) -------------------------------------------------
    def crd_established(self, name: str, t: ResourceType | None) -> None:
        """The CRD `name` now serves `t` (None: it is not established, or serves nothing usable)."""
        if t is not None:
            self._crd_types[name] = t
        else:
            self._crd_types.pop(name, None)

    def crds_kept(self, names: Iterable[str]) -> None:
        """Only the CRDs `names` exist (a fresh LIST of them)."""
        keep = set(names)
        for name in list(self._crd_types):
            if name not in keep:
                del self._crd_types[name]

    def crds_unknown(self) -> None:
        """The CRD cache is gone: no CRD is known until it lists again."""
        self._crd_types.clear()

    def sync(self) -> None:
        """Make the mapper serve what discovery and the established CRDs say, then tell `on_change`."""
        discovered = self.discovered.types if self.discovered is not None else ()
        sync_mapper(self.mapper, [*discovered, *self._crd_types.values()])
        self.on_change()

    async def _loop(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            self._refresh.clear()
            self._discovering = True
            try:
                result = await discover(self.transport, timeout=self.timeout)
            except Exception as exc:  # APIError, or a bug: either way discovery is retried, never abandoned
                failures += 1
                self.error = str(exc)
                if isinstance(exc, APIError):
                    log.warning("discovery failed", error=str(exc), failures=failures)
                else:
                    log.exception("discovery failed", failures=failures)
                wait = self.backoff.delay(failures, self.rng)
            else:
                failures = 0
                self.error = None
                if result.failed_groups:
                    log.warning("discovery incomplete", failed_groups=sorted(result.failed_groups))
                self.discovered = result
                self.discoveries += 1
                self.sync()
                self.on_discovered()
                # Retry a partial discovery soon; a complete one only on CRD changes or the interval.
                wait = self.backoff.delay(1, self.rng) * 10 if result.failed_groups else self.interval
            finally:
                self._discovering = False
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel() that arrives in the same loop
            # iteration as the event (a CRD change right after sync does that), and stop() then waits
            # on this task for the whole discovery interval. asyncio.timeout() re-raises the cancel.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._refresh.wait()
            if failures == 0 and (spare := began + self.spacing - loop.time()) > 0:  # failures: the backoff
                await asyncio.sleep(spare)


__all__ = ["DISCOVERY_INTERVAL", "REFRESH_SPACING", "ServedTypes"]
