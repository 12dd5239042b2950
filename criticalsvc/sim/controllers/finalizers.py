"""The operators: one finalizer controller per (provider, resource, finalizer) a Finalizer criterion names."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterable

from ...api import (
    CRITICAL_SERVICES,
    NAMESPACES,
    CriticalService,
    FinalizerCriterion,
    GroupResource,
    ObjectRef,
    Provider,
    ProviderSelector,
    parse_critical_service,
)
from ...errors import InvalidInput
from ...state import provider_objects
from ..engine import Engine
from ..store import StatusError, Store, WatchEvent
from ..timeline import GONE, NOT_RUNNING, REMOVED, Timeline
from .base import describe_error, ref_of, waits_for


class FinalizerController:
    """The operator behind a CriticalService's Finalizer criterion: its provider runs it.

    When an object of the criterion's resource that carries the finalizer is being deleted, the
    operator cleans up and removes the finalizer after a reconcile delay (seeded, 0.5-2 s) — but only
    if, at that moment, its provider exists, is not terminating, and the provider's namespace is not
    terminating (Kubernetes ≥ 1.33 deletes a Terminating namespace's pods first [E1], so its workload
    is as good as gone). A controller that is not running never comes back here: the finalizer stays.
    """

    DELAY = (0.5, 2.0)

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline, rng: random.Random,
                 provider: Provider, criterion: FinalizerCriterion, service: str = "",
                 delay: tuple[float, float] = DELAY) -> None:
        self.store, self.engine, self.timeline, self.rng = store, engine, timeline, rng
        self.provider, self.criterion, self.service = provider, criterion, service
        self.delay = delay
        self.actor = provider.key if isinstance(provider, ObjectRef) else str(provider)
        name = provider.name if isinstance(provider, ObjectRef) else "selected-provider"
        self.user = f"system:serviceaccount:{provider.namespace or 'default'}:{name}"
        self._pending: dict[ObjectRef, None] = {}
        self._reported: dict[ObjectRef, None] = {}
        gr = store.state.resolve(criterion.group_resource)
        if gr is not None:
            for obj in list(store.state.with_finalizer(gr, criterion.finalizer_name)):
                self.observe(obj.ref, obj.finalizers, obj.terminating)

    @property
    def finalizer(self) -> str:
        return self.criterion.finalizer_name

    def running(self) -> tuple[bool, str]:
        """Is the operator's workload up? (False, why) when it is not."""
        if isinstance(self.provider, ProviderSelector):
            # A set of providers runs the controller while any of them runs.
            state = self.store.state
            up = any(not o.terminating and not self._namespace_terminating(o.namespace)
                     for o in provider_objects(self.provider, state))
            return (True, "running") if up else (False, f"no object of {self.provider}, which runs its "
                                                        "controller, is running")
        provider = self.store.state.get(self.provider)
        if provider is None:
            return False, f"{self.provider}, which runs its controller, is gone"
        if provider.terminating:
            return False, f"{self.provider}, which runs its controller, is being deleted"
        if self.provider.namespace:
            ns = self.store.state.get(ObjectRef(NAMESPACES, "", self.provider.namespace))
            if ns is not None and ns.terminating:
                return False, (f"the namespace {self.provider.namespace} of {self.provider}, which runs its "
                               "controller, is terminating")
        return True, "running"

    def _namespace_terminating(self, namespace: str) -> bool:
        ns = self.store.state.get(ObjectRef(NAMESPACES, "", namespace)) if namespace else None
        return ns is not None and ns.terminating

    def handles(self, gr: GroupResource) -> bool:
        return self.store.state.resolve(self.criterion.group_resource) == gr

    def observe(self, ref: ObjectRef, finalizers: Iterable[str], terminating: bool) -> None:
        if not terminating or self.finalizer not in finalizers or ref in self._pending:
            return
        self._pending[ref] = None
        self.engine.schedule(self.rng.uniform(*self.delay), lambda: self._reconcile(ref))

    def _reconcile(self, ref: ObjectRef) -> None:
        self._pending.pop(ref, None)
        obj = self.store.state.get(ref)
        if obj is None or self.finalizer not in obj.finalizers:
            return
        up, why = self.running()
        if not up:
            if ref not in self._reported:
                self._reported[ref] = None
                self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, NOT_RUNNING,
                                     f"the finalizer stays: {why}")
            return
        try:
            result = self.store.remove_finalizer(ref, self.finalizer, user=self.user)
        except StatusError as exc:
            self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, describe_error(exc),
                                 exc.message)
            self._pending[ref] = None
            self.engine.schedule(self.delay[1], lambda: self._reconcile(ref))
            return
        gone = not self.store.exists(ref.group_resource, ref.namespace, ref.name)
        self.timeline.record(self.actor, f"remove finalizer {self.finalizer}", ref, GONE if gone else REMOVED,
                             "" if gone or result is None else waits_for(result))


class FinalizerControllers:
    """Starts a FinalizerController for each distinct (provider, resource, finalizer) that any
    CriticalService names in a Finalizer criterion, as CriticalServices appear. Deleting the
    CriticalService does not stop the operator: its provider workload is what runs it."""

    def __init__(self, *, store: Store, engine: Engine, timeline: Timeline, rng: random.Random,
                 delay: tuple[float, float] = FinalizerController.DELAY) -> None:
        self.store, self.engine, self.timeline, self.rng, self.delay = store, engine, timeline, rng, delay
        self.controllers: dict[tuple[Provider, GroupResource, str], FinalizerController] = {}
        self._by_finalizer: dict[str, list[FinalizerController]] = {}
        store.subscribe(self._on_event)
        for cs in list(store.state.critical_services()):
            self.start(cs)

    def start(self, cs: CriticalService) -> list[FinalizerController]:
        started = []
        for c in cs.criteria:
            if not isinstance(c, FinalizerCriterion):
                continue
            key = (cs.provider, c.group_resource, c.finalizer_name)
            if key in self.controllers:
                continue
            ctrl = FinalizerController(store=self.store, engine=self.engine, timeline=self.timeline, rng=self.rng,
                                       provider=cs.provider, criterion=c, service=cs.name, delay=self.delay)
            self.controllers[key] = ctrl
            self._by_finalizer.setdefault(c.finalizer_name, []).append(ctrl)
            started.append(ctrl)
        return started

    def for_finalizer(self, gr: GroupResource, finalizer: str) -> list[FinalizerController]:
        return [c for c in self._by_finalizer.get(finalizer, ()) if c.handles(gr)]

    def _on_event(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            return
        if event.group_resource == CRITICAL_SERVICES:
            with contextlib.suppress(InvalidInput):  # an invalid CriticalService names no operator
                self.start(parse_critical_service(event.object))
            return
        md = event.object["metadata"]
        if not md.get("deletionTimestamp"):
            return
        finalizers = md.get("finalizers") or []
        for f in finalizers:
            for ctrl in self.for_finalizer(event.group_resource, f):
                ctrl.observe(ref_of(event), finalizers, True)
