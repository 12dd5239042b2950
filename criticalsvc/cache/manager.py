"""CacheState: the live service's ClusterState, composed of the served types, the watch set and the
guarded state.

    served.py    ServedTypes: the discovery loop and the established CRDs -> the RESTMapper
    watchset.py  WatchSet: one reflector per type some CriticalService names (plus the always-watched
                 ones), its events projected into one MemoryState
    guarded.py   GuardedState: that MemoryState as a ClusterState, refusing what is not synced yet

They are wired here, one way each: discovery changing the mapper makes the watch set reconcile; the
watch set reports established CRDs to the served types and asks them to rediscover; the guarded state
reads both to decide whether it may answer. Both discovery and the watch set wake `wait_ready`.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Collection, Mapping

from ..api import CRDS, CriticalService, GroupResource, ObjectRef
from ..backoff import Backoff
from ..condition import Condition
from ..labels import LabelSelector
from ..objects import KubeObject
from ..restmapper import ResourceType, RESTMapper
from ..state import ClusterState, MemoryState
from .catchup import MirrorView
from .discovery import TIMEOUT as DISCOVERY_TIMEOUT
from .guarded import GuardedState
from .reflector import DEFAULT_BACKOFF, WATCH_SECONDS, Reflector
from .served import DISCOVERY_INTERVAL, ServedTypes
from .transport import Transport
from .watchset import ALWAYS_WATCHED, UNWATCH_AFTER, WatchSet


async def next_signal(waiters: list[asyncio.Future[None]], timeout: float) -> bool:
    """Wait on a future added to `waiters` (the signaller sets every one it finds): True when signalled, False
    after `timeout` seconds. Added before the first await, so a signal after the caller's last look is never
    missed (one event loop)."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiters.append(waiter)
    try:
        async with asyncio.timeout(timeout):
            await waiter
        return True
    except TimeoutError:
        return False
    finally:
        with contextlib.suppress(ValueError):
            waiters.remove(waiter)

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
        self.guarded = GuardedState(self.memory, self.served, self.watches)
        # Set the first time every cache has synced; see `ready`.
        self._was_ready = False
        self._changed = asyncio.Event()
        self._change_waiters: list[asyncio.Future[None]] = []
        self._notified = 0
        self._event_waiters: list[asyncio.Future[None]] = []
        self.watches.on_event = self._on_event

    # --- lifecycle ------------------------------------------------------------------------------------
    @property
    def state(self) -> ClusterState:
        """The ClusterState to decide on (the name fits the server's state-source protocol)."""
        return self.guarded

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
        (GuardedState: StateUnavailable -> a DENY naming it). Were readiness to drop instead, every replica
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

    def syncing(self) -> bool:
        """Some cache may still sync, or discovery is under way: an answer refused now may be given soon (a
        cache the gate may not list, 403, is not counted: it waits for a grant, not for time)."""
        if self.served.discovered is None or self.served.pending:
            return True
        return any(not r.synced.is_set() and not r.forbidden for r in self.watches.reflectors.values())

    async def wait_changed(self, timeout: float) -> bool:
        """Return True at the next change of the caches (a reflector synced, the watch set or discovery changed),
        False after `timeout` seconds without one. Registered before the first await: a change after the
        caller's last look at the state is never missed (one event loop)."""
        return await next_signal(self._change_waiters, timeout)

    async def wait_event(self, timeout: float) -> bool:
        """Return True at the next change of what the state answers - an object event as well as what wakes
        `wait_changed` - and False after `timeout` seconds without one. Registered before the first await, like
        `wait_changed`; a caller that must not miss an event between two waits compares `changes` too."""
        return await next_signal(self._event_waiters, timeout)

    def _on_event(self) -> None:
        for waiter in self._event_waiters:
            if not waiter.done():
                waiter.set_result(None)

    @property
    def changes(self) -> int:
        """Grows whenever what the state answers may have changed: an object, a LIST, a sync, the watch set,
        discovery, a watch failing (403 included). Equal at two moments: the same answers (the status writer
        skips a pass on it)."""
        return self.watches.changes + self._notified + sum(self.watches.restarts.values())

    def _notify(self) -> None:
        self._notified += 1
        self._changed.set()
        for waiter in self._change_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._on_event()

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

    def exact_version(self, gr: GroupResource) -> str | None:
        """The resourceVersion whose state the cache holds of gr, exactly (WatchSet.exact_version)."""
        return self.watches.exact_version(gr)

    def watched_type(self, gr: GroupResource) -> ResourceType | None:
        """The served type the cache watches gr as, if it does."""
        reflector = self.watches.reflector(gr)
        return reflector.resource if reflector is not None else None

    def count(self, gr: GroupResource) -> int:
        """Objects of gr the cache holds."""
        return self.memory.count(gr)

    def defined_by_crd(self, gr: GroupResource) -> bool:
        """Whether the cache holds a CustomResourceDefinition of gr (so kube-apiserver serves and stores it)."""
        return self.memory.get(ObjectRef(CRDS, "", f"{gr.resource}.{gr.group}")) is not None

    def carriers(self, gr: GroupResource, finalizer: str) -> MirrorView | None:
        """The objects of gr carrying `finalizer` and the version they are the state at, taken in one step
        of the event loop; None when the cache holds gr at no exact version (see WatchSet.exact_version)."""
        version = self.watches.exact_version(gr)
        if version is None:
            return None
        held = self.memory.with_finalizer(gr, finalizer)
        return MirrorView(version, {(o.namespace, o.name): o for o in held}, self.memory.count(gr))

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

    # --- ClusterState: the guarded state's answers ---------------------------------------------------------
    def resolve(self, gr: GroupResource) -> GroupResource | None:
        return self.guarded.resolve(gr)

    def get(self, ref: ObjectRef) -> KubeObject | None:
        return self.guarded.get(ref)

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]:
        return self.guarded.with_finalizer(gr, finalizer, condition=condition)

    def select(self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
               condition: Condition | None = None) -> Collection[KubeObject]:
        return self.guarded.select(gr, namespace=namespace, selector=selector, condition=condition)

    def critical_services(self) -> Collection[CriticalService]:
        return self.guarded.critical_services()

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        return self.guarded.protecting(provider, labels)

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        return self.guarded.hosted_in(namespace)


__all__ = ["ALWAYS_WATCHED", "DISCOVERY_INTERVAL", "CacheState"]
