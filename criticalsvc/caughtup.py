"""The confirmation on the caught-up cache: one consistent read, and the cache for the rest.

An ALLOW of a protected deletion must be decided on the cluster as it was after the request arrived
(criticalsvc/live.py). The fresh reads of live.py do it by reading every question again; at 100,000
objects of a type that is a LIST no budget holds. Here it is done with the gate's own caches instead:

1. **One consistent read.** `LIST criticalservices?limit=1` without resourceVersion (catchup.fresh_version):
   kube-apiserver answers it from its watch cache once that cache has reached etcd's current revision, so its
   `metadata.resourceVersion` (the target) is at least the revision of every write made before the request
   arrived (design/kubernetes-semantics.md §13). A resourceVersion is an etcd revision, one counter for every
   type stored in that etcd, so this one version bounds them all.
2. **The types the decision reads.** `decide` runs on the cache through `ReadTypes`, which notes every type
   it reads: the CriticalServices, the provider's type when a selector's labels are looked up, each
   criterion's, the namespace's.
3. **Each of them current.** For each type, criticalsvc/cache/current.py proves the cache holds it as at the
   target or later: at once when its exact version is already past the target, else with a watch from that
   version until a bookmark past it, and the cache applying what that watch showed.

   Waking a lagging type. A lagging type gets a consistent read of its own (`?limit=1`) before its watch:
   kube-apiserver's watch cache of a type moves past its last event only when that type is read consistently
   (it then asks etcd for a progress notification, watch_cache.go `waitUntilFreshLocked`), and a watcher gets
   no bookmark at its own version (cache_watcher.go `process`). Measured on v1.37.2: after the CriticalServices'
   `?limit=1` answered 251, watches of ConfigMaps from 240 (their last write) got no bookmark in three 3 s
   watches; after a `?limit=1` of ConfigMaps answered 258, the next got BOOKMARK 258 1.43 s in. So "one read"
   holds when every type read is already past the target; each lagging type costs one more small read and a
   bookmark (design/kubernetes-semantics.md §13.1).
4. **The decision.** `decide` runs again on the cache, and in the same step of the event loop (no await in
   between, so no event is applied meanwhile) every type it read is checked to be still proven. A type read
   now that was not read before (a CriticalService written after the target, which the cache already shows,
   names another) is proven in another round. The answer is the cache's decision at that moment: every
   type it read is at the target or past it.

What it does not cover, it refuses to answer (CatchUpFailed), and the caller decides on fresh reads: a name
the cache does not resolve (a CRD created a moment ago: the fresh read asks discovery), a type without a
single version (listing, or not watched), a 410, a decision the cache itself cannot make (UNVERIFIABLE).

Several API servers. The consistent read is answered by one, the probes may reach another. Each watch
cache serves events in revision order and a bookmark promises every event of its type up to its version;
so a lagging API server makes the probe wait (its bookmarks are short of the target), never wrong.

One etcd. The target bounds a type only if the type is stored in the etcd the CriticalServices are: its
versions are then revisions of the same counter. That holds for every custom resource kube-apiserver serves
from a CRD (they use the main --etcd-servers; `--etcd-servers-overrides` "applies only to resources compiled
into this server binary", staging/src/k8s.io/apiserver/pkg/server/options/etcd.go) and for the types compiled
into kube-apiserver unless such an override moves them (`separate_storage` names those, as `serve
--separate-storage`). A type of any other group (an aggregated API server's: its own storage, its own
counter) gets its own target, from its own `?limit=1` read: one more small read for each such type.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Collection, Coroutine, Iterable, Mapping
from typing import Any, Protocol

import attrs

from .admission import AdmissionRequest
from .api import CRITICAL_SERVICES, VERSION, CriticalService, GroupResource, ObjectRef
from .cache.catchup import CatchUpFailed, compare_resource_versions, fresh_version
from .cache.current import Current, NoSingleVersion, prove_current
from .cache.transport import Transport
from .condition import Condition
from .decision import Decision, Rule, decide
from .labels import LabelSelector
from .objects import KubeObject
from .restmapper import ResourceType
from .state import ClusterState

# Rounds: each may add the types of a CriticalService the cache showed only after the round before.
MAX_ROUNDS = 4
# The groups kube-apiserver v1.37.2 stores in its own etcd (the RESTStorageProviders of
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controlplane/instance.go, with the CRDs and the
# aggregator's APIServices), so in the etcd of the CriticalServices unless --etcd-servers-overrides moves a type.
KUBE_APISERVER_GROUPS = frozenset({
    "", "admissionregistration.k8s.io", "apiextensions.k8s.io", "apiregistration.k8s.io", "apps", "autoscaling",
    "batch", "certificates.k8s.io", "coordination.k8s.io", "discovery.k8s.io", "events.k8s.io",
    "flowcontrol.apiserver.k8s.io", "internal.apiserver.k8s.io", "lifecycle.k8s.io", "networking.k8s.io",
    "node.k8s.io", "policy", "rbac.authorization.k8s.io", "resource.k8s.io", "scheduling.k8s.io", "storage.k8s.io",
    "storagemigration.k8s.io"})
# The CriticalService type when the cache's mapper does not know it yet (it is ours).
_SERVICES_TYPE = ResourceType("criticalsvc.io", VERSION, "CriticalService", "criticalservices", "criticalservice",
                              False, ("csvc",))


class CurrentCache(Protocol):
    """The gate's cache, as this confirmation reads it (criticalsvc/cache/manager.py CacheState)."""

    @property
    def state(self) -> ClusterState: ...

    def exact_version(self, gr: GroupResource) -> str | None: ...

    def watched_type(self, gr: GroupResource) -> ResourceType | None: ...

    def wait_event(self, timeout: float) -> Awaitable[bool]: ...

    def count(self, gr: GroupResource) -> int: ...

    def defined_by_crd(self, gr: GroupResource) -> bool: ...


class ReadTypes:
    """A ClusterState that answers from `inner` and notes which types it read, and any name it could not resolve."""

    def __init__(self, inner: ClusterState) -> None:
        self.inner = inner
        self.types: set[GroupResource] = set()
        self.unresolved: set[GroupResource] = set()

    def resolve(self, gr: GroupResource) -> GroupResource | None:
        found = self.inner.resolve(gr)
        if found is None:
            self.unresolved.add(gr)
        return found

    def _read(self, gr: GroupResource) -> GroupResource:
        resolved = self.resolve(gr) or gr
        self.types.add(resolved)
        return resolved

    def get(self, ref: ObjectRef) -> KubeObject | None:
        self._read(ref.group_resource)
        return self.inner.get(ref)

    def with_finalizer(self, gr: GroupResource, finalizer: str, *,
                       condition: Condition | None = None) -> Collection[KubeObject]:
        self._read(gr)
        return self.inner.with_finalizer(gr, finalizer, condition=condition)

    def select(self, gr: GroupResource, *, namespace: str | None, selector: LabelSelector | None,
               condition: Condition | None = None) -> Collection[KubeObject]:
        self._read(gr)
        return self.inner.select(gr, namespace=namespace, selector=selector, condition=condition)

    def critical_services(self) -> Collection[CriticalService]:
        self.types.add(CRITICAL_SERVICES)
        return self.inner.critical_services()

    def protecting(self, provider: ObjectRef, labels: Mapping[str, str] | None = None) -> Collection[CriticalService]:
        self.types.add(CRITICAL_SERVICES)
        if labels is None:  # the state may look the provider's labels up in its own copy
            self._read(provider.group_resource)
        return self.inner.protecting(provider, labels)

    def hosted_in(self, namespace: str) -> Collection[CriticalService]:
        self.types.add(CRITICAL_SERVICES)
        return self.inner.hosted_in(namespace)


@attrs.frozen
class CaughtUpDecision:
    """The decision on the caught-up cache, and what it took."""

    decision: Decision
    target: str
    rounds: int
    watches: int  # probe watches opened, all types together (0: every type was already past the target)
    types: frozenset[GroupResource]


async def _all(proofs: Iterable[Coroutine[Any, Any, Current]]) -> list[Current]:
    """Every proof, or the first failure, with the others stopped (their watches closed) rather than left running."""
    tasks = [asyncio.ensure_future(p) for p in proofs]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
    failures = [exc for task in tasks if task.done() and not task.cancelled()
                and (exc := task.exception()) is not None]  # every one retrieved, the first raised
    if failures:
        raise failures[0]
    return [task.result() for task in tasks]


class CaughtUpReader:
    """Decides a request on the cache, caught up to one consistent read made for it (steps 1-4 above)."""

    def __init__(self, transport: Transport, cache: CurrentCache, *, max_rounds: int = MAX_ROUNDS,
                 separate_storage: frozenset[GroupResource] = frozenset()) -> None:
        self.transport = transport
        self.cache = cache
        self.max_rounds = max_rounds
        # Types kube-apiserver stores in another etcd (its --etcd-servers-overrides): each gets its own target.
        self.separate_storage = separate_storage

    def shares_target(self, gr: GroupResource) -> bool:
        """Whether gr is stored in the CriticalServices' etcd, so their version bounds it ("One etcd" above)."""
        if gr in self.separate_storage:
            return False
        if gr.group in KUBE_APISERVER_GROUPS or gr == CRITICAL_SERVICES:
            return True
        return self.cache.defined_by_crd(gr)

    async def decide(self, request: AdmissionRequest, *, deadline: float) -> CaughtUpDecision:
        """Raises CatchUpFailed (NoSingleVersion, MirrorExpired) when the cache cannot answer, TimeoutError past
        `deadline`, or the transport's APIError."""
        services = self.cache.watched_type(CRITICAL_SERVICES) or _SERVICES_TYPE
        target = await fresh_version(self.transport, services, deadline)
        proven: dict[GroupResource, Current] = {}
        watches = 0
        for round_ in range(1, self.max_rounds + 1):
            reads = ReadTypes(self.cache.state)
            decision = decide(request, reads)
            if reads.unresolved:
                raise CatchUpFailed("the cache does not resolve " + ", ".join(sorted(map(str, reads.unresolved))))
            if decision.rule == Rule.UNVERIFIABLE:
                raise CatchUpFailed(decision.message)
            types = frozenset(reads.types | {CRITICAL_SERVICES})
            stale = [gr for gr in sorted(types) if gr not in proven or
                     not proven[gr].holds(self.cache.exact_version(gr))]
            if not stale:  # checked in the same step as the decision: it was made on the proven state
                return CaughtUpDecision(decision, target, round_, watches, types)
            for proof in await _all(self._prove(gr, target, deadline) for gr in stale):
                proven[proof.group_resource] = proof
                watches += proof.watches
        raise CatchUpFailed(f"the types to read kept changing for {self.max_rounds} rounds")

    async def _prove(self, gr: GroupResource, target: str, deadline: float) -> Current:
        resource = self.cache.watched_type(gr)
        if resource is None:
            raise NoSingleVersion(f"the gate does not watch {gr}")
        exact = self.cache.exact_version(gr)
        if exact is None:
            raise NoSingleVersion(f"the cache holds {gr} at no single resourceVersion (listing, or not watched)")
        if self.shares_target(gr) and compare_resource_versions(exact, target) >= 0:
            return Current(gr, target, exact, watches=0)
        # Behind the version, or counted apart: the type's own consistent read first. kube-apiserver's watch cache
        # of a type catches up with etcd only when that type is read consistently (or written): until then its
        # bookmarks stay at its last event and the probe would wait for none ("Waking a lagging type" above).
        # Read after the target's, its version is at least the target's in the same etcd.
        own = await fresh_version(self.transport, resource, deadline)
        return await prove_current(self.transport, resource, exact=lambda: self.cache.exact_version(gr),
                                   changed=self.cache.wait_event, target=own, deadline=deadline)


__all__ = ["MAX_ROUNDS", "CaughtUpDecision", "CaughtUpReader", "CurrentCache", "ReadTypes"]
