"""GuardedState: the ClusterState the webhook decides on, answering only from caches that are current.

Every question raises StateUnavailable (the decision then denies, the server answers 503 before the
cache is ready) while:
  * discovery has not completed once, or the name's API group failed discovery (served.py);
  * the resource asked about is needed but its reflector has not finished its first LIST (watchset.py).
The refusal names the resource, and for a resource the gate's RBAC does not let it list (403) the grant
that is missing, so the denial tells an operator what to do.

A resource that no CriticalService names is answered from an empty store: no criterion can be about
it. The only such questions are an old-style DELETE without oldObject (nothing protects an object
no CriticalService names) and the cycle check of a CriticalService being created, whose provider's
type may not be watched yet: the check then sees that provider without labels, so a self-loop made
only by a label selector matching the provider's own labels is caught at the next update instead.

Concurrency. Everything runs in one asyncio event loop: reflectors apply events synchronously
between awaits, and `decide` is synchronous, so a decision always sees one consistent moment of the
caches without locks.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

import attrs

from ..api import CRITICAL_SERVICES, CriticalService, GroupResource, ObjectRef
from ..condition import Condition
from ..errors import StateUnavailable
from ..labels import LabelSelector
from ..objects import KubeObject
from ..state import MemoryState
from .discovery import DiscoveryResult
from .served import ServedTypes
from .watchset import WatchSet

# The label of deploy/base/rbac.yaml's aggregated reader role: what an operator adds to let the gate
# read a type a criterion names.
READER_AGGREGATION_LABEL = "criticalsvc.io/aggregate-to-reader"


class GuardedState:
    """`memory` as a ClusterState, refusing each question whose answer the caches do not hold yet."""

    def __init__(self, memory: MemoryState, served: ServedTypes, watches: WatchSet) -> None:
        self.memory = memory
        self.served = served
        self.watches = watches

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
        hit = self.memory.mapper.resolve(gr)
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

    def writes(self, gr: GroupResource, namespace: str | None) -> int:
        return self.memory.writes(gr, namespace)

    def critical_services(self) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        return self.memory.critical_services()

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        if labels is None and self.memory.selects_in(provider.group_resource.group):
            # The object's labels decide, read from a cache that is current, as get() reads them.
            stored = self.get(provider)
            labels = stored.labels if stored is not None else {}
        return self.memory.protecting(provider, labels)

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        self._require(CRITICAL_SERVICES)
        return self.memory.hosted_in(namespace)


__all__ = ["READER_AGGREGATION_LABEL", "GuardedState"]
