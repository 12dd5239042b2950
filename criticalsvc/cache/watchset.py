"""WatchSet: which types the cache watches and how, and what their events do to the memory state.

What is watched. Always: CriticalServices, Namespaces and CustomResourceDefinitions. Besides, every
group/resource that some CriticalService names — its provider's, and each criterion's — once it
resolves (plural, singular, short name or Kind) through the mapper (served.py). A resource gets its
reflector when the first CriticalService names it and loses it (and its objects) `unwatch_after`
seconds after the last one stopped naming it; the set is recomputed whenever a CriticalService or the
mapper changes, synchronously in the event handler, so a decision never sees a CriticalService whose
resources are not at least registered as "needed". A type that is not served any more, or is wanted in
another version or scope, loses its reflector at once.

Conditions. A type that a criterion's condition (criticalsvc/condition.py) is about is watched with
whole objects, not metadata only, because a condition reads spec and status; as an object enters the
cache, the conditions of the criteria it is a candidate of are evaluated on it and only their outcomes
are kept (criticalsvc/projection.py `project_for`, criticalsvc/objects.py), so decisions evaluate no
CEL. When the conditioned criteria on a type change (a CriticalService adds, edits or drops one, or
moves one to another namespace), a successor reflector lists the type again with the new set, make
before break: until its LIST arrives the old reflector stays the one decisions read (guarded.py sees
it synced), so one tenant's edit does not make every decision on the type "cannot verify" meanwhile.
That is safe because an object that carries no outcome of a condition counts (state.py, `_counting`):
a criterion whose condition is new blocks on every candidate until the successor's LIST has evaluated
it, and criteria whose conditions did not change keep their outcomes. The successor's pages are applied
as they come (its objects gain the new outcomes); when its LIST is complete, what no page held is
forgotten and it takes over; the old one is stopped. If the old reflector had not synced
yet there is nothing to keep, and it is simply replaced.

Events. Each reflector writes through its own sink into the shared MemoryState: objects are projected
to their slim form, CriticalServices are parsed, and established CRDs are reported to the served
types (which refresh the mapper and ask discovery to look again). A sink whose reflector was replaced
or dropped ignores what that reflector still had in hand.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import structlog

from .. import criteria
from ..api import CRDS, CRITICAL_SERVICES, NAMESPACES, Criterion, CriticalService, GroupResource, ObjectRef
from ..backoff import Backoff
from ..errors import InvalidInput
from ..objects import WORKLOADS, KubeObject, project
from ..restmapper import ResourceType, resource_type_from_crd
from ..state import MemoryState
from .reflector import Reflector
from .served import ServedTypes
from .transport import Transport

log = structlog.get_logger("criticalsvc.cache")

ALWAYS_WATCHED = (CRITICAL_SERVICES, NAMESPACES, CRDS)
# How long a cache stays after the last CriticalService naming its type went. Stacks are created and
# torn down again and again (a CI namespace per run, GitOps previews): dropping the watch at once and
# starting it again with the next stack made every such CriticalService's first decisions - its own
# CREATE's cycle check among them - wait for a fresh LIST, and refused them meanwhile (measured on a
# real control plane: 382 watch restarts of deployments.apps in a 2-minute create/teardown soak).
UNWATCH_AFTER = 300.0
# Resources whose specs the state needs (parse_critical_service, resource_type_from_crd); all other
# resources are mirrored from metadata only.
# Deployments and StatefulSets too, so their projections keep spec.replicas and status.availableReplicas (two
# ints, objects.Workload): whether a provider runs to remove a finalizer (criticalsvc/stuck.py).
_FULL_OBJECTS = frozenset({CRITICAL_SERVICES, CRDS}) | WORKLOADS


def _established(crd: Mapping[str, Any]) -> bool:
    status = crd.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    return any(isinstance(c, Mapping) and c.get("type") == "Established" and c.get("status") == "True"
               for c in conditions or [])


def _watch_key(t: ResourceType) -> tuple[str, str, str, bool]:
    # What a reflector's requests depend on; a new short name or singular must not restart a watch.
    return (t.group, t.version, t.plural, t.namespaced)


class _StoreSink:
    """Applies one reflector's events to the shared MemoryState, projecting its objects for the conditioned
    criteria it was started for; ignores a reflector that was replaced."""

    def __init__(self, owner: WatchSet, conditioned: frozenset[Criterion]) -> None:
        self.owner = owner
        self.conditioned = conditioned
        self.reflector: Reflector | None = None  # set once the reflector exists
        # The (namespace, name) of every object the pages of the LIST under way held.
        self.listed: set[tuple[str, str]] = set()

    def _current(self, gr: GroupResource) -> bool:
        # A dropped reflector may still deliver what it had in hand when it was cancelled.
        return self.reflector is not None and self.owner.reflector(gr) is self.reflector

    def _successor(self, gr: GroupResource) -> bool:
        return self.reflector is not None and self.owner.successors.get(gr) is self.reflector

    def list_page(self, gr: GroupResource, items: Sequence[Mapping[str, Any]], *, first: bool) -> None:
        self.owner.changes += 1
        # A successor's pages are applied while its predecessor is still the one decisions read: an
        # object it re-projects gains the new outcomes; one it has not reached yet keeps the old ones, and
        # a criterion whose condition is new counts it (fail closed) until then.
        if self._current(gr) or self._successor(gr):
            if first:
                self.listed = set()
            self.owner._list_page(gr, items, self.conditioned, self.listed)

    def list_done(self, gr: GroupResource) -> None:
        self.owner.changes += 1
        if self.reflector is not None:
            self.owner._take_over(gr, self.reflector)  # a successor's LIST is complete: it becomes current
        if self._current(gr):
            listed, self.listed = self.listed, set()
            self.owner._list_done(gr, listed)
            self.owner.on_event()  # a LIST after a watch restart may carry what the lost events did

    def upsert(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        if self._current(gr):
            self.owner.changes += 1
            self.owner._upsert(gr, obj, self.conditioned)
            self.owner._after_change(gr)
            self.owner.on_event()

    def delete(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        if self._current(gr):
            self.owner.changes += 1
            self.owner._delete(gr, obj)
            self.owner._after_change(gr)
            self.owner.on_event()


class WatchSet:
    """One reflector per needed type, mirrored into `memory`; `reconcile()` whenever the need may change."""

    def __init__(self, transport: Transport, memory: MemoryState, served: ServedTypes, *, backoff: Backoff,
                 watch_seconds: tuple[int, int], metadata_only: bool, unwatch_after: float,
                 rng: random.Random, notify: Callable[[], None],
                 on_watch_restart: Callable[[str], None] | None = None) -> None:
        self.transport = transport
        self.memory = memory
        self.served = served
        # Counts what the sinks applied (pages, events, ends of LISTs): unchanged, nothing in `memory` changed.
        self.changes = 0
        self.backoff = backoff
        self.watch_seconds = watch_seconds
        self.metadata_only = metadata_only
        self.unwatch_after = unwatch_after
        self.rng = rng
        self.notify = notify  # the set of reflectors, or whether one has synced, changed
        # Called after every event applied to `memory` (an object added, changed or deleted, a LIST complete),
        # synchronously in the handler: CacheState wakes whoever waits for the next change (the replayer).
        self.on_event: Callable[[], None] = lambda: None
        self.on_watch_restart = on_watch_restart
        self.reflectors: dict[GroupResource, Reflector] = {}
        # Reflectors listing a type again for changed conditions, not read until their LIST is complete.
        self.successors: dict[GroupResource, Reflector] = {}
        # The criteria with conditions the newest reflector of each type evaluates (see "Conditions" above).
        self._conditioned: dict[GroupResource, frozenset[Criterion]] = {}
        # Watched types no CriticalService names any more, since when (monotonic); dropped after unwatch_after.
        self._unneeded_since: dict[GroupResource, float] = {}
        self._reconcile_skipped = False  # the last CriticalService event changed nothing reconcile() reads
        self.restarts: Counter[str] = Counter()
        self._stopping: set[asyncio.Task[None]] = set()

    def reflector(self, gr: GroupResource) -> Reflector | None:
        return self.reflectors.get(gr)

    def exact_version(self, gr: GroupResource) -> str | None:
        """The resourceVersion whose state `memory` holds of `gr`, exactly; None when no one version does.

        Exact while the reflector decisions read is watching: its LIST was complete and every event since
        was applied in order (criticalsvc/cache/catchup.py, step 2). Not while it lists (pages of a newer
        snapshot over the old state), nor while a successor lists beside it (its pages may be older than
        events already applied)."""
        reflector = self.reflectors.get(gr)
        if reflector is None or gr in self.successors or not reflector.watching:
            return None
        return reflector.resource_version

    async def stop(self) -> None:
        """Stop every reflector, those being dropped included."""
        reflectors = [*self.reflectors.values(), *self.successors.values()]
        self.reflectors.clear()
        self.successors.clear()
        await asyncio.gather(*(r.stop() for r in reflectors), *self._stopping, return_exceptions=True)

    # --- which resources are watched -------------------------------------------------------------------
    def _needed(self) -> dict[GroupResource, ResourceType]:
        named: list[GroupResource] = list(ALWAYS_WATCHED)
        for cs in self.memory.critical_services():
            named.append(cs.provider.group_resource)
            named.extend(criteria.named_resource(c) for c in cs.criteria)
        needed: dict[GroupResource, ResourceType] = {}
        for gr in named:
            t = self.memory.mapper.lookup(gr)
            if t is not None:
                needed.setdefault(t.group_resource, t)
        return needed

    def reconcile(self) -> None:
        """Start, replace and drop reflectors to match what the CriticalServices name now."""
        if self.served.discovered is None or not self.served.running:
            return
        needed = self._needed()
        conditioned = criteria.conditioned_criteria(self.memory.critical_services(), self.memory)
        now = time.monotonic()
        for gr, reflector in list(self.reflectors.items()):
            same_conditions = self._conditioned.get(gr, frozenset()) == conditioned.get(gr, frozenset())
            same_watch = gr in needed and _watch_key(needed[gr]) == _watch_key(reflector.resource)
            if same_watch and same_conditions:
                self._unneeded_since.pop(gr, None)
            elif same_watch and reflector.synced.is_set():
                self._unneeded_since.pop(gr, None)
                self._succeed(needed[gr], conditioned.get(gr, frozenset()))
            elif gr in needed or self.memory.mapper.lookup(gr) is None:
                self._drop(gr)  # another version or scope is wanted, or the type is no longer served
            elif now - self._unneeded_since.setdefault(gr, now) >= self.unwatch_after:
                self._drop(gr)
            elif self._unneeded_since[gr] == now:  # newly unneeded: look again when its time is up
                asyncio.get_running_loop().call_later(self.unwatch_after, self.reconcile)
        for gr, t in needed.items():
            if gr not in self.reflectors:
                self._watch(t, conditioned.get(gr, frozenset()))

    def _reflector(self, t: ResourceType, conditioned: frozenset[Criterion]) -> Reflector:
        gr = t.group_resource
        sink = _StoreSink(self, conditioned)
        self._conditioned[gr] = conditioned
        reflector = Reflector(transport=self.transport, resource=t, sink=sink,
                              metadata_only=self.metadata_only and gr not in _FULL_OBJECTS and not conditioned,
                              backoff=self.backoff,
                              watch_seconds=self.watch_seconds, on_restart=self._on_restart,
                              on_synced=lambda _gr: self.notify(), rng=random.Random(self.rng.random()))
        sink.reflector = reflector
        return reflector

    def _watch(self, t: ResourceType, conditioned: frozenset[Criterion]) -> None:
        reflector = self._reflector(t, conditioned)
        self.reflectors[t.group_resource] = reflector
        log.info("watching", resource=str(t.group_resource), version=t.version,
                 conditions=sorted({str(c.condition) for c in conditioned}) or None)
        reflector.start()
        self.notify()

    def _succeed(self, t: ResourceType, conditioned: frozenset[Criterion]) -> None:
        """List `t` again for a changed set of conditions, beside the reflector decisions still read."""
        gr = t.group_resource
        earlier = self.successors.pop(gr, None)
        if earlier is not None:  # the conditions changed again before its LIST arrived
            self._stop(earlier)
        reflector = self._reflector(t, conditioned)
        self.successors[gr] = reflector
        log.info("listing again for changed conditions", resource=str(gr), version=t.version,
                 conditions=sorted({str(c.condition) for c in conditioned}) or None)
        reflector.start()

    def _take_over(self, gr: GroupResource, reflector: Reflector) -> None:
        """A successor's LIST arrived: it becomes the reflector decisions read, and its predecessor stops."""
        if self.successors.get(gr) is not reflector:
            return
        del self.successors[gr]
        previous = self.reflectors.get(gr)
        self.reflectors[gr] = reflector
        if previous is not None:
            self._stop(previous)
        self.notify()

    def _stop(self, reflector: Reflector) -> None:
        task = asyncio.get_running_loop().create_task(reflector.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def _drop(self, gr: GroupResource) -> None:
        reflector = self.reflectors.pop(gr)
        successor = self.successors.pop(gr, None)
        self._conditioned.pop(gr, None)
        self._unneeded_since.pop(gr, None)
        log.info("no longer watching", resource=str(gr))
        self._stop(reflector)
        if successor is not None:
            self._stop(successor)
        self.memory.clear_resource(gr)
        if gr == CRITICAL_SERVICES:
            for cs in list(self.memory.critical_services()):
                self.memory.remove_critical_service(cs.name)
        if gr == CRDS:
            self.served.crds_unknown()
        self.notify()

    def _on_restart(self, gr: GroupResource, why: str) -> None:
        self.restarts[str(gr)] += 1
        if self.on_watch_restart is not None:
            self.on_watch_restart(str(gr))

    # --- applying events ------------------------------------------------------------------------------
    def _list_page(self, gr: GroupResource, items: Sequence[Mapping[str, Any]],
                   conditioned: frozenset[Criterion], keep: set[tuple[str, str]]) -> None:
        for obj in items:
            kept = self._upsert(gr, obj, conditioned)
            if kept is not None:
                keep.add((kept.namespace, kept.name))

    def _list_done(self, gr: GroupResource, keep: set[tuple[str, str]]) -> None:
        for old in list(self.memory.objects(gr)):
            if (old.namespace, old.name) not in keep:
                self._forget(old.ref)
        if gr == CRITICAL_SERVICES:
            for cs in list(self.memory.critical_services()):
                if ("", cs.name) not in keep:
                    self.memory.remove_critical_service(cs.name)
        if gr == CRDS:
            self.served.crds_kept(name for _ns, name in keep)
        self._reconcile_skipped = False  # a LIST may have added or removed any CriticalService
        self._after_change(gr)

    def _upsert(self, gr: GroupResource, obj: Mapping[str, Any],
                conditioned: frozenset[Criterion]) -> KubeObject | None:
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
            self._reconcile_skipped = False
            return
        for c in cs.criteria:
            if c.condition is not None and c.condition.error is not None:
                # Only the webhook can refuse such a spec (the CRD schema cannot compile CEL); one written
                # while it was absent keeps protecting, every object of the criterion counting.
                log.warning("condition does not compile; every object of its criterion counts as blocking",
                            critical_service=cs.name, error=c.condition.error)
        old = self.memory.critical_service(cs.name)
        self.memory.upsert_critical_service(cs)
        self._reconcile_skipped = not self._changes_watches(old, cs)

    def _delete(self, gr: GroupResource, obj: Mapping[str, Any]) -> None:
        metadata: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
        name = metadata.get("name")
        if not isinstance(name, str):
            return
        namespace = metadata.get("namespace") or ""
        self._forget(ObjectRef(gr, str(namespace), name))

    def _forget(self, ref: ObjectRef) -> None:
        self._reconcile_skipped = False  # a CriticalService gone may leave a type unneeded
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
            skipped, self._reconcile_skipped = self._reconcile_skipped, False
            if not skipped:
                self.reconcile()

    def _changes_watches(self, old: CriticalService | None, cs: CriticalService) -> bool:
        """Could this upsert change what reconcile() starts, replaces or drops? Not when the same spec was there
        before (a status write, a label), nor when a new one names only types watched now and no condition:
        reconcile reads every CriticalService, and running it at each of 10,000 CREATEs and their status writes
        kept the gate's CriticalService cache minutes behind (`python -m benchmarks realcluster --services
        10,1000,10000`)."""
        if old is not None and (old.provider, old.criteria) == (cs.provider, cs.criteria):
            return False
        if any(c.condition is not None for c in cs.criteria):
            return True
        for gr in (cs.provider.group_resource, *(criteria.named_resource(c) for c in cs.criteria)):
            t = self.memory.mapper.lookup(gr)
            if t is None:
                continue  # not served: nothing to watch (a CRD established later reconciles)
            reflector = self.reflectors.get(t.group_resource)
            if reflector is None or _watch_key(t) != _watch_key(reflector.resource) \
                    or t.group_resource in self._unneeded_since:
                return True
        return old is not None  # a changed spec may leave a type unneeded


__all__ = ["ALWAYS_WATCHED", "UNWATCH_AFTER", "WatchSet"]
