"""All the controllers, started together on one store and engine, as kube-controller-manager starts them."""

from __future__ import annotations

import random

import attrs

from ..engine import Engine
from ..store import Store
from ..timeline import Timeline
from .crdcleanup import CRDCleanupController
from .finalizers import FinalizerController, FinalizerControllers
from .garbagecollector import GarbageCollector
from .namespace import NamespaceController


@attrs.define
class Controllers:
    namespace: NamespaceController
    crd_cleanup: CRDCleanupController
    garbage_collector: GarbageCollector
    finalizers: FinalizerControllers
    timeline: Timeline  # every call the controllers made


def start_controllers(store: Store, engine: Engine, *, timeline: Timeline | None = None,
                      rng: random.Random | None = None, ordered_namespace_deletion: bool = True,
                      finalizer_delay: tuple[float, float] = FinalizerController.DELAY) -> Controllers:
    """Start every controller on `store`; they act as events arrive and as `engine` runs timers."""
    if timeline is None:
        timeline = Timeline(engine.now, seq=lambda: store.resource_version)
    if rng is None:
        rng = random.Random(0)
    return Controllers(
        namespace=NamespaceController(store=store, engine=engine, timeline=timeline, rng=rng,
                                      ordered=ordered_namespace_deletion),
        crd_cleanup=CRDCleanupController(store=store, engine=engine, timeline=timeline),
        garbage_collector=GarbageCollector(store=store, engine=engine, timeline=timeline),
        finalizers=FinalizerControllers(store=store, engine=engine, timeline=timeline, rng=rng,
                                        delay=finalizer_delay),
        timeline=timeline,
    )

