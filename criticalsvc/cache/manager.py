"""CacheState: the live service's ClusterState, fed by watches and discovery.

What is watched. Always: CriticalServices, Namespaces and CustomResourceDefinitions. Besides, every
group/resource that some CriticalService names — its provider's, and each criterion's — once it
resolves (plural, singular, short name or Kind) through the mapper. A resource gets its reflector
when the first CriticalService names it and loses it (and its objects) when the last one stops
naming it; the set is recomputed whenever a CriticalService or the mapper changes, synchronously in
the event handler, so a decision never sees a CriticalService whose resources are not at least
registered as "needed".

Conditions. A type that a criterion's condition (criticalsvc/condition.py) is about is watched with
whole objects, not metadata only, because a condition reads spec and status; as an object enters the
cache, the conditions of the criteria it is a candidate of are evaluated on it and only their outcomes
are kept (criticalsvc/criteria.py `project_for`, criticalsvc/objects.py), so decisions evaluate no
CEL. When the conditioned criteria on a type change (a CriticalService adds, edits or drops one, or
moves one to another namespace), its reflector is replaced: the fresh LIST evaluates the
new set on every object, and until it has synced the decisions that need the type are refused, as
for any syncing type - never decided on objects whose outcome is unknown.

What is served. The mapper holds what the served types (served.py: the discovery loop plus the
established CRDs) say. A name that does not resolve is a type that is not served, so its criteria
hold; when its CRD appears the type resolves, the reconciliation starts its reflector, and the
criterion starts counting objects.

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
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs
import structlog

from .. import criteria
from ..api import CRDS, CRITICAL_SERVICES, NAMESPACES, Criterion, CriticalService, GroupResource, ObjectRef
from ..backoff import Backoff
from ..condition import Condition
from ..errors import InvalidInput, StateUnavailable
from ..labels import LabelSelector
from ..objects import KubeObject, project
from ..restmapper import ResourceType, RESTMapper, resource_type_from_crd
from ..state import ClusterState, MemoryState
from .discovery import TIMEOUT as DISCOVERY_TIMEOUT
from .discovery import DiscoveryResult
from .reflector import DEFAULT_BACKOFF, WATCH_SECONDS, Reflector
from .served import DISCOVERY_INTERVAL, ServedTypes
from .transport import Transport

log = structlog.get_logger("criticalsvc.cache")

ALWAYS_WATCHED = (CRITICAL_SERVICES, NAMESPACES, CRDS)
# How long a cache stays after the last CriticalService naming its type went. Stacks are created and
# torn down again and again (a CI namespace per run, GitOps previews): dropping the watch at once and
# starting it again with the next stack made every such CriticalService's first decisions - its own
# CREATE's cycle check among them - wait for a fresh LIST, and refused them meanwhile (measured on a
# real control plane: 382 watch restarts of deployments.apps in a 2-minute create/teardown soak).
UNWATCH_AFTER = 300.0
# The label of deploy/base/rbac.yaml's aggregated reader role: what an operator adds to let the gate
# read a type a criterion names.
READER_AGGREGATION_LABEL = "criticalsvc.io/aggregate-to-reader"
# Resources whose specs the state needs (parse_critical_service, resource_type_from_crd); all other
# resources are mirrored from metadata only.
_FULL_OBJECTS = frozenset({CRITICAL_SERVICES, CRDS})


def _established(crd: Mapping[str, Any]) -> bool:
    status = crd.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return any(isinstance(c, Mapping) and c.get("type") == "Established" and c.get("status") == "True"
               for c in conditions or [])


def _watch_key(t: ResourceType) -> tuple[str, str, str, bool]:
    # What a reflector's requests depend on; a new short name or singular must not restart a watch.
    return (t.group, t.version, t.plural, t.namespaced)


class _StoreSink:
    """Applies one reflector's events to the shared MemoryState; ignores a reflector that was replaced."""

    def __init__(self, owner: CacheState) -> None:
        self.owner = owner
        self.reflector: Reflector | None = None  # set once the reflector exists

    def _current(self, gr: GroupResource) -> bool:
        # A dropped reflector may still deliver what it had in hand when it was cancelled.
        return self.reflector is not None and self.owner._reflectors.get(gr) is self.reflector

    def replace(self, gr: GroupResource, items: Sequence[Mapping[str, Any]]) -> None:
        if self._current(gr):
            self.owner._replace(gr, items)

    def upsert(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        if self._current(gr):
            self.owner._upsert(gr, obj)
            self.owner._after_change(gr)

    def delete(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        if self._current(gr):
            self.owner._delete(gr, obj)
            self.owner._after_change(gr)


class CacheState:
    """Watch-fed caches implementing ClusterState; `start()` them, then wait for `ready`."""

    def __init__(self, transport: Transport, *, backoff: Backoff = DEFAULT_BACKOFF,
                 discovery_interval: float = DISCOVERY_INTERVAL, discovery_timeout: float = DISCOVERY_TIMEOUT,
                 watch_seconds: tuple[int, int] = WATCH_SECONDS, metadata_only: bool = True,
                 on_watch_restart: Callable[[str], None] | None = None, rng: random.Random | None = None,
                 unwatch_after: float = UNWATCH_AFTER) -> None:
        self.transport = transport
        self.unwatch_after = unwatch_after
        self.backoff = backoff
        self.discovery_interval = discovery_interval
        self.discovery_timeout = discovery_timeout
        self.watch_seconds = watch_seconds
        self.metadata_only = metadata_only
        self.on_watch_restart = on_watch_restart
        self.rng = rng or random.Random()
        self.memory = MemoryState(RESTMapper(()))
        self.served = ServedTypes(transport, self.memory.mapper, backoff=backoff, interval=discovery_interval,
                                  timeout=discovery_timeout, rng=self.rng, on_change=self._reconcile,
                                  on_discovered=self._notify)
        self._reflectors: dict[GroupResource, Reflector] = {}
        # The criteria with conditions each reflector's objects are evaluated for (see "Conditions" above).
        self._conditioned: dict[GroupResource, frozenset[Criterion]] = {}
        # Watched types no CriticalService names any more, since when (monotonic); dropped after unwatch_after.
        self._unneeded_since: dict[GroupResource, float] = {}
        # Set the first time every cache has synced; see `ready`.
        self._was_ready = False
        self._restarts: Counter[str] = Counter()
        self._changed = asyncio.Event()
        self._stopping: set[asyncio.Task[None]] = set()

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
        reflectors = list(self._reflectors.values())
        self._reflectors.clear()
        await asyncio.gather(*(r.stop() for r in reflectors), *self._stopping, return_exceptions=True)

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
        considered = ALWAYS_WATCHED if self._was_ready else tuple(self._reflectors)
        ready = all((r := self._reflectors.get(gr)) is not None and
                    (r.synced.is_set() or (r.forbidden and gr not in ALWAYS_WATCHED)) for gr in considered)
        if ready and not self._was_ready:
            self._was_ready = True
        return ready

    def forbidden(self) -> list[str]:
        """Resources some CriticalService names that the gate's RBAC does not let it list."""
        return sorted(str(gr) for gr, r in self._reflectors.items() if r.forbidden and not r.synced.is_set())

    def unsynced(self) -> list[str]:
        """What keeps the state from being ready, for /readyz and logs."""
        if self.served.discovered is None:
            return [f"discovery ({self.served.error})" if self.served.error else "discovery"]
        return sorted(str(gr) for gr, r in self._reflectors.items() if not r.synced.is_set())

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until `ready` (True) or until `timeout` seconds have passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.ready:
            self._changed.clear()
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):  # not wait_for: see ServedTypes._loop
                    await self._changed.wait()
        return True

    def counts(self) -> dict[str, int]:
        """Objects held per watched resource (criticalsvc_cache_objects{resource})."""
        return {str(gr): sum(1 for _ in self.memory.objects(gr)) for gr in self._reflectors}

    @property
    def watch_restarts(self) -> dict[str, int]:
        """Watches that had to start over, per resource, since start (criticalsvc_watch_restarts_total)."""
        return dict(self._restarts)

    def watched(self) -> list[GroupResource]:
        return sorted(self._reflectors)

    def reflector(self, gr: GroupResource) -> Reflector | None:
        return self._reflectors.get(gr)

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

    # --- which resources are watched -------------------------------------------------------------------
    def _needed(self) -> dict[GroupResource, ResourceType]:
        named: list[GroupResource] = list(ALWAYS_WATCHED)
        for cs in self.memory.critical_services():
            named.append(cs.provider.group_resource)
            named.extend(criteria.named_resource(c) for c in cs.criteria)
        needed: dict[GroupResource, ResourceType] = {}
        for gr in named:
            t = self.mapper.lookup(gr)
            if t is not None:
                needed.setdefault(t.group_resource, t)
        return needed

    def _reconcile(self) -> None:
        if self.served.discovered is None or not self.served.running:
            return
        needed = self._needed()
        conditioned = criteria.conditioned_criteria(self.memory.critical_services(), self.memory)
        now = time.monotonic()
        for gr, reflector in list(self._reflectors.items()):
            same_conditions = self._conditioned.get(gr, frozenset()) == conditioned.get(gr, frozenset())
            if gr in needed and _watch_key(needed[gr]) == _watch_key(reflector.resource) and same_conditions:
                self._unneeded_since.pop(gr, None)
            elif gr in needed or self.mapper.lookup(gr) is None:
                self._drop(gr)  # another version or scope is wanted, or the type is no longer served
            elif now - self._unneeded_since.setdefault(gr, now) >= self.unwatch_after:
                self._drop(gr)
            elif self._unneeded_since[gr] == now:  # newly unneeded: look again when its time is up
                asyncio.get_running_loop().call_later(self.unwatch_after, self._reconcile)
        for gr, t in needed.items():
            if gr not in self._reflectors:
                self._watch(t, conditioned.get(gr, frozenset()))

    def _watch(self, t: ResourceType, conditioned: frozenset[Criterion]) -> None:
        gr = t.group_resource
        sink = _StoreSink(self)
        self._conditioned[gr] = conditioned
        reflector = Reflector(transport=self.transport, resource=t, sink=sink,
                              metadata_only=self.metadata_only and gr not in _FULL_OBJECTS and not conditioned,
                              backoff=self.backoff,
                              watch_seconds=self.watch_seconds, on_restart=self._on_restart,
                              on_synced=lambda _gr: self._notify(), rng=random.Random(self.rng.random()))
        sink.reflector = reflector
        self._reflectors[gr] = reflector
        log.info("watching", resource=str(gr), version=t.version,
                 conditions=sorted({str(c.condition) for c in conditioned}) or None)
        reflector.start()
        self._notify()

    def _drop(self, gr: GroupResource) -> None:
        reflector = self._reflectors.pop(gr)
        self._conditioned.pop(gr, None)
        self._unneeded_since.pop(gr, None)
        log.info("no longer watching", resource=str(gr))
        task = asyncio.get_running_loop().create_task(reflector.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)
        self.memory.clear_resource(gr)
        if gr == CRITICAL_SERVICES:
            for cs in list(self.memory.critical_services()):
                self.memory.remove_critical_service(cs.name)
        if gr == CRDS:
            self.served.crds_unknown()
        self._notify()

    def _on_restart(self, gr: GroupResource, why: str) -> None:
        self._restarts[str(gr)] += 1
        if self.on_watch_restart is not None:
            self.on_watch_restart(str(gr))

    def _notify(self) -> None:
        self._changed.set()

    # --- applying events ------------------------------------------------------------------------------
    def _replace(self, gr: GroupResource, items: Sequence[Mapping[str, Any]]) -> None:
        keep: set[tuple[str, str]] = set()
        for obj in items:
            kept = self._upsert(gr, obj)
            if kept is not None:
                keep.add((kept.namespace, kept.name))
        for old in list(self.memory.objects(gr)):
            if (old.namespace, old.name) not in keep:
                self._forget(old.ref)
        if gr == CRITICAL_SERVICES:
            for cs in list(self.memory.critical_services()):
                if ("", cs.name) not in keep:
                    self.memory.remove_critical_service(cs.name)
        if gr == CRDS:
            self.served.crds_kept(name for _ns, name in keep)
        self._after_change(gr)

    def _upsert(self, gr: GroupResource, obj: Mapping[str, Any]) -> KubeObject | None:
        conditioned = self._conditioned.get(gr, frozenset())
        try:
            slim = criteria.project_for(obj, gr, conditioned) if conditioned else project(obj, gr)
        except InvalidInput as exc:
            log.warning("object ignored", resource=str(gr), error=str(exc))
            return None
        if slim.outcomes:
            self._log_condition_errors(slim)
        self.memory.upsert(slim)
        if gr == CRITICAL_SERVICES:
            self._upsert_service(obj, slim)
        elif gr == CRDS:
            self.served.crd_established(slim.name, resource_type_from_crd(obj) if _established(obj) else None)
        return slim

    def _log_condition_errors(self, slim: KubeObject) -> None:
        # Once per change of outcome, not per event: a pod's status changes every few seconds.
        old = self.memory.get(slim.ref)
        for condition, outcome in zip(slim.outcomes[::2], slim.outcomes[1::2], strict=True):
            before = dict(zip(old.outcomes[::2], old.outcomes[1::2], strict=True)).get(condition) if old else None
            if isinstance(outcome, str) and outcome != before:
                log.warning("condition could not be evaluated; the object counts as blocking",
                            resource=str(slim.group_resource), object=slim.key, condition=condition, error=outcome)

    def _upsert_service(self, obj: Mapping[str, Any], slim: KubeObject) -> None:
        from ..api import parse_critical_service

        try:
            cs = parse_critical_service(obj, lenient_conditions=True)
        except InvalidInput as exc:
            # The CRD schema and the webhook reject such specs; one that slipped past protects nothing.
            log.warning("CriticalService ignored", critical_service=slim.name, error=str(exc))
            self.memory.remove_critical_service(slim.name)
            return
        for c in cs.criteria:
            if c.condition is not None and c.condition.error is not None:
                # Only the webhook can refuse such a spec (the CRD schema cannot compile CEL); one written
                # while it was absent keeps protecting, every object of the criterion counting.
                log.warning("condition does not compile; every object of its criterion counts as blocking",
                            critical_service=cs.name, error=c.condition.error)
        self.memory.upsert_critical_service(cs)

    def _delete(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        metadata: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
        name = metadata.get("name")
        if not isinstance(name, str):
            return
        namespace = metadata.get("namespace") or ""
        self._forget(ObjectRef(gr, str(namespace), name))

    def _forget(self, ref: ObjectRef) -> None:
        self.memory.remove(ref)
        if ref.group_resource == CRITICAL_SERVICES:
            self.memory.remove_critical_service(ref.name)
        elif ref.group_resource == CRDS:
            self.served.crd_established(ref.name, None)

    def _after_change(self, gr: GroupResource) -> None:
        if gr == CRDS:
            self.served.sync()  # the mapper may serve another set of types, and the watch set follows
            self.served.refresh()
        elif gr == CRITICAL_SERVICES:
            self._reconcile()

    # --- ClusterState ---------------------------------------------------------------------------------
    def _require_discovery(self) -> DiscoveryResult:
        if self.served.discovered is None:
            raise StateUnavailable("API discovery has not completed yet")
        return self.served.discovered

    def _require(self, gr: GroupResource) -> None:
        self._require_discovery()
        reflector = self._reflectors.get(gr)
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
