"""CacheState: the live service's ClusterState, composed of the served types and the watch set.

    served.py    ServedTypes: the discovery loop and the established CRDs -> the RESTMapper
    watchset.py  WatchSet: one reflector per type some CriticalService names (plus the always-watched
                 ones), its events projected into one MemoryState

They are wired here, one way each: discovery changing the mapper makes the watch set reconcile; the
watch set reports established CRDs to the served types and asks them to rediscover. Both wake
`wait_ready`.

When the state answers. Every question raises StateUnavailable (the decision then denies, the server
answers 503 before `ready`) while:
  * discovery has not completed once, or the name's API group failed discovery;
  * the resource asked about is needed but its reflector has not finished its first LIST.
A resource that no CriticalService names is answered from an empty store: no criterion can be about
it. The only such questions are an old-style DELETE without oldObject (nothing protects an object
no CriticalService names) and the cycle check of a CriticalService being created, whose provider's
type may not be watched yet: the check then sees that provider without labels, so a self-loop made
only by a label selector matching the provider's own labels is caught at the next update instead.

`ready` is true once discovery has completed and every needed reflector has synced; after that it
stays true while discovery and the always-watched caches answer. A newly named resource that is still
syncing (usually milliseconds; for long when it cannot be listed) refuses only the decisions that need
it, as a resource the gate's RBAC does not let it list (403) does: both are a gap in one answer, not in
the gate. Dropping readiness for them made every replica answer 503 at once, and every gated request of
the whole cluster failed with "failed calling webhook" (seen on a real control plane, both for a type
nobody had granted and for a new CriticalService's types). The refused decisions carry a message naming
the resource (and the missing grant). The object shape fits the server's StateSource (`ready`, `state`,
`unsynced()`, `counts()`) and the status writer's; `watch_restarts`
and `on_watch_restart` feed criticalsvc_watch_restarts_total.

Concurrency. Everything runs in one asyncio event loop: reflectors apply events synchronously
between awaits, and `decide` is synchronous, so a decision always sees one consistent moment of the
caches without locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Collection

import attrs

from ..api import CRITICAL_SERVICES, CriticalService, GroupResource, ObjectRef
from ..backoff import Backoff
from ..condition import Condition
from ..errors import StateUnavailable
from ..labels import LabelSelector
from ..objects import KubeObject
from ..restmapper import RESTMapper
from ..state import ClusterState, MemoryState
from .discovery import TIMEOUT as DISCOVERY_TIMEOUT
from .discovery import DiscoveryResult
from .reflector import DEFAULT_BACKOFF, WATCH_SECONDS, Reflector
from .served import DISCOVERY_INTERVAL, ServedTypes
from .transport import Transport
from .watchset import ALWAYS_WATCHED, UNWATCH_AFTER, WatchSet

# The label of deploy/base/rbac.yaml's aggregated reader role: what an operator adds to let the gate
# read a type a criterion names.
READER_AGGREGATION_LABEL = "criticalsvc.io/aggregate-to-reader"


class CacheState:
    """Watch-fed caches implementing ClusterState; `start()` them, then wait for `ready`."""

    def __init__(self, transport: Transport, *, backoff: Backoff = DEFAULT_BACKOFF,
                 discovery_interval: float = DISCOVERY_INTERVAL, discovery_timeout: float = DISCOVERY_TIMEOUT,
                 watch_seconds: tuple[int, int] = WATCH_SECONDS, metadata_only: bool = True,
                 on_watch_restart: Callable[[str], None] | None = None, rng: random.Random | None = None,
                 unwatch_after: float = UNWATCH_AFTER) -> None:
        # The settings as given; the parts below hold the ones they use.
        self.transport = transport
        self.unwatch_after = unwatch_after
        self.backoff = backoff
        self.discovery_interval = discovery_interval
        self.discovery_timeout = discovery_timeout
        self.watch_seconds = watch_seconds
        self.metadata_only = metadata_only
        self.on_watch_restart = on_watch_restart
        # One generator for discovery's backoff and every reflector's seed, so one seed replays a run.
        self.rng = rng or random.Random()
        self.memory = MemoryState(RESTMapper(()))
        self.served = ServedTypes(transport, self.memory.mapper, backoff=backoff, interval=discovery_interval,
                                  timeout=discovery_timeout, rng=self.rng,
                                  on_change=lambda: self.watches.reconcile(), on_discovered=self._notify)
        self.watches = WatchSet(transport, self.memory, self.served, backoff=backoff, watch_seconds=watch_seconds,
                                metadata_only=metadata_only, unwatch_after=unwatch_after, rng=self.rng,
                                notify=self._notify, on_watch_restart=on_watch_restart)
        # Set the first time every cache has synced; see `ready`.
        self._was_ready = False
        self._changed = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------------------
    @property
    def state(self) -> ClusterState:
        """The ClusterState to decide on (this object; the name fits the server's state-source protocol)."""
        return self

    @property
    def mapper(self) -> RESTMapper:
        return self.memory.mapper

    async def start(self) -> None:
        """Begin discovery and the watches; returns at once (poll `ready` or `await wait_ready()`)."""
        self.served.start()

    async def stop(self) -> None:
        """Stop every watch and the discovery loop; from then on the state answers nothing."""
        await self.served.stop()
        await self.watches.stop()

    async def __aenter__(self) -> CacheState:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def ready(self) -> bool:
        """True once discovery and every cache have synced; after that, while discovery and the caches of
        ALWAYS_WATCHED stay answerable.

        A type that a new CriticalService names starts a cache of its own, which syncs for a moment (or
        for long, when it cannot be listed): meanwhile only the decisions that need it are refused
        (`_require`: StateUnavailable -> a DENY naming it). Were readiness to drop instead, every replica
        would see the same new CriticalService at once and answer 503 to every review, so the API server
        would fail unrelated DELETEs and CREATEs cluster-wide ("failed calling webhook": measured on a
        real control plane, 27 such failures in a 2-minute create/teardown soak).
        """
        if self.served.discovered is None or not self.served.running:
            return False
        reflectors = self.watches.reflectors
        considered = ALWAYS_WATCHED if self._was_ready else tuple(reflectors)
        ready = all((r := reflectors.get(gr)) is not None and
                    (r.synced.is_set() or (r.forbidden and gr not in ALWAYS_WATCHED)) for gr in considered)
        if ready and not self._was_ready:
            self._was_ready = True
        return ready

    def forbidden(self) -> list[str]:
        """Resources some CriticalService names that the gate's RBAC does not let it list."""
        return sorted(str(gr) for gr, r in self.watches.reflectors.items() if r.forbidden and not r.synced.is_set())

    def unsynced(self) -> list[str]:
        """What keeps the state from being ready, for /readyz and logs."""
        if self.served.discovered is None:
            return [f"discovery ({self.served.error})" if self.served.error else "discovery"]
        return sorted(str(gr) for gr, r in self.watches.reflectors.items() if not r.synced.is_set())

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until `ready` (True) or until `timeout` seconds have passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready:
            self._changed.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancel() that arrives in the same loop
            # iteration as the event, so the waiter could not be stopped; asyncio.timeout() re-raises it.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
        return True

    def _notify(self) -> None:
        self._changed.set()

    def counts(self) -> dict[str, int]:
        """Objects held per watched resource (criticalsvc_cache_objects{resource})."""
        return {str(gr): sum(1 for _ in self.memory.objects(gr)) for gr in self.watches.reflectors}

    @property
    def watch_restarts(self) -> dict[str, int]:
        """Watches that had to start over, per resource, since start (criticalsvc_watch_restarts_total)."""
        return dict(self.watches.restarts)

    def watched(self) -> list[GroupResource]:
        return sorted(self.watches.reflectors)

    def reflector(self, gr: GroupResource) -> Reflector | None:
        return self.watches.reflector(gr)

    # --- discovery ------------------------------------------------------------------------------------
    def refresh_discovery(self) -> None:
        """Read discovery again soon (CRD changes call this)."""
        self.served.refresh()

    @property
    def discovery_pending(self) -> bool:
        """A discovery read is running or asked for (the mapper may be about to change)."""
        return self.served.pending

    @property
    def discovery_error(self) -> str | None:
        return self.served.error

    @property
    def discoveries(self) -> int:
        return self.served.discoveries

    # --- ClusterState ---------------------------------------------------------------------------------
    def _require_discovery(self) -> DiscoveryResult:
        if self.served.discovered is None:
            raise StateUnavailable("API discovery has not completed yet")
        return self.served.discovered

    def _require(self, gr: GroupResource) -> None:
        self._require_discovery()
        reflector = self.watches.reflector(gr)
        if reflector is not None and not reflector.synced.is_set():
            if reflector.forbidden:
                raise StateUnavailable(f"the gate may not list {gr} (403 Forbidden): grant it get/list/watch with a "
                                       f"ClusterRole labelled {READER_AGGREGATION_LABEL}=\"true\"")
            why = f" (last error: {reflector.last_error})" if reflector.last_error else ""
            raise StateUnavailable(f"the {gr} cache has not synced yet{why}")

    def resolve(self, gr: GroupResource) -> GroupResource | None:
        discovered = self._require_discovery()
        hit = self.mapper.resolve(gr)
        if hit is None and gr.group in discovered.failed_groups:
            raise StateUnavailable(f"discovery of API group {gr.group} failed, so whether {gr} is served is "
                                   "unknown")
        return hit

    def get(self, ref: ObjectRef) -> KubeObject | None:
        gr = self.resolve(ref.group_resource) or ref.group_resource
        self._require(gr)
        return self.memory.get(attrs.evolve(ref, group_resource=gr))

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]:
        self._require(gr)
        return self.memory.with_finalizer(gr, finalizer, condition=condition)

    def select(self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
               condition: Condition | None = None) -> Collection[KubeObject]:
        self._require(gr)
        return self.memory.select(gr, namespace=namespace, selector=selector, condition=condition)

    def critical_services(self) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        return self.memory.critical_services()

    def protecting(self, provider: ObjectRef) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        return self.memory.protecting(provider)

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        return self.memory.hosted_in(namespace)



__all__ = ["ALWAYS_WATCHED", "DISCOVERY_INTERVAL", "CacheState"]
