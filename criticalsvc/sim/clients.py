"""Clients that delete a bundle, each with its real retry behaviour.

    ManifestWorkAgent   the Open Cluster Management work agent removing a deleted ManifestWork's
                        resources: ONE pass of DELETEs (Background, UID precondition) in the sorted
                        order of the AppliedManifestWork's status; a refused object is dropped and
                        never sent again; it waits (50 ms·2ⁿ ≤ 60 s) only for what it deleted, then
                        removes the AppliedManifestWork, and the garbage collector deletes the refused
                        objects, which it owns (design/kubernetes-semantics.md §8)
    KubectlDelete       `kubectl delete -f BUNDLE --ignore-not-found`: one pass in file order, one
                        request at a time, no retry; a denial is printed and the pass continues [K1][K2].
                        `repeat=SECONDS` models a person (or a script) re-running it until it succeeds.
    NamespaceDelete     deletes the bundle's namespaces and leaves their content to the namespace
                        controller; what lives outside those namespaces (CRDs, CriticalServices, objects
                        in namespaces the bundle does not own) it deletes itself. Retries each refusal
                        (50 ms·2ⁿ ≤ 60 s) — a tenant-removal controller, not a person.

    OwnerDelete         a garbage-collected teardown: deletes the bundle's roots (objects no other object of
                        the bundle owns) once, with Background or Foreground propagation, and leaves
                        their dependents to the garbage collector (which retries a refusal with backoff
                        up to 1000 s, controllers/garbagecollector.py) - the way an Argo CD Application or a Helm-like
                        owner object takes a stack down.
    FluxKustomization   Flux's kustomize-controller (v1.9.6) finalizing a deleted Kustomization: a pass of
                        DELETEs (Background, no precondition) in ssa's reverse apply order, every object
                        tried even after a refusal; a refused pass is retried whole on Flux's rate limiter
                        (750 ms·2ⁿ ≤ 15 min); the finalizer goes once a pass is not refused (or, with
                        deletionPolicy WaitForTermination, once what it deleted is gone)
    HelmUninstall       `helm uninstall` (v3.22.0) of a release that is the bundle: ONE pass of Background DELETEs
                        in Helm's uninstall order by kind, each kind's objects at once and the next kind after
                        them, every object tried; a refused pass fails the command and nothing retries (the
                        gate's replay may finish it); CRDs from the chart's crds/ are never deleted
    ArgoCDApplication   Argo CD's application controller (v3.2.3) finalizing a deleted Application: the highest
                        sync wave of what it deletes (never a CRD) at once, Foreground (`argocd`) or Background
                        (`argocd-background`), nothing while any of its objects terminates; a pass on each
                        change of its objects and at the resync (180 s)
    IdealDelete         the yardstick, not a real deleter: after every change it deletes each object whose
                        DELETE the gate would allow now (it asks with a dry run first, so it is never
                        refused), and nothing else - each phase starts the moment the previous one
                        ends, so its teardown time is the critical path. benchmarks/replay.py divides
                        every other client's teardown time by it.

The garbage collector's retrying client is part of the garbage collector (controllers/garbagecollector.py).
Clients, like controllers, only call the store and `engine.schedule`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from ..api import CRDS, NAMESPACES, GroupResource, ObjectRef
from ..backoff import Backoff
from .controllers.base import delete_outcome, describe_error
from .engine import Engine
from .store import StatusError, Store, WatchEvent
from .timeline import GONE, NOT_FOUND, Timeline

CLIENTS = ("manifestwork", "kubectl", "namespace", "gc-background", "gc-foreground", "flux", "helm", "argocd",
           "argocd-background", "ideal")
FLUX_DELETION_POLICIES = ("MirrorPrune", "WaitForTermination")

# ssa's ReconcileOrder: the kinds Flux applies first (in this order) and last; every other kind sits between
# them, ordered by group, kind, namespace, name. DeleteAll sorts the inventory by it and reverses it.
# https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/sort.go#L36-L137
FLUX_APPLY_FIRST = ("CustomResourceDefinition", "Namespace", "ClusterRole", "ClusterClass", "RuntimeClass",
                    "PriorityClass", "StorageClass", "VolumeSnapshotClass", "IngressClass", "GatewayClass",
                    "ClusterRoleBinding", "ResourceQuota", "ServiceAccount", "Role", "RoleBinding", "ConfigMap",
                    "Secret", "Service", "LimitRange", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget")
FLUX_APPLY_LAST = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def flux_delete_order(objects: Iterable[tuple[ObjectRef, str]]) -> list[ObjectRef]:
    """(ref, kind) pairs in the order ssa's DeleteAll sends their DELETEs: its apply order, reversed."""
    def key(item: tuple[ObjectRef, str]) -> tuple[int, str, str, str, str]:
        ref, kind = item
        if kind in FLUX_APPLY_FIRST:
            index = -len(FLUX_APPLY_FIRST) + FLUX_APPLY_FIRST.index(kind)
        else:
            index = 1 + FLUX_APPLY_LAST.index(kind) if kind in FLUX_APPLY_LAST else 0
        return index, ref.group_resource.group, kind, ref.namespace, ref.name

    return [ref for ref, _kind in sorted(objects, key=key, reverse=True)]


# Helm's releaseutil.InstallOrder and UninstallOrder: kinds it does not list go last, by kind name; objects of one
# kind keep their place in the release's manifest.
# https://github.com/helm/helm/blob/v3.22.0/pkg/releaseutil/kind_sorter.go#L28-L110
HELM_INSTALL_ORDER = (
    "PriorityClass", "Namespace", "NetworkPolicy", "ResourceQuota", "LimitRange", "PodSecurityPolicy",
    "PodDisruptionBudget", "ServiceAccount", "Secret", "SecretList", "ConfigMap", "StorageClass", "PersistentVolume",
    "PersistentVolumeClaim", "CustomResourceDefinition", "ClusterRole", "ClusterRoleList", "ClusterRoleBinding",
    "ClusterRoleBindingList", "Role", "RoleList", "RoleBinding", "RoleBindingList", "Service", "DaemonSet", "Pod",
    "ReplicationController", "ReplicaSet", "Deployment", "HorizontalPodAutoscaler", "StatefulSet", "Job", "CronJob",
    "IngressClass", "Ingress", "APIService")
HELM_UNINSTALL_ORDER = (
    "APIService", "Ingress", "IngressClass", "Service", "CronJob", "Job", "StatefulSet", "HorizontalPodAutoscaler",
    "Deployment", "ReplicaSet", "ReplicationController", "Pod", "DaemonSet", "RoleBindingList", "RoleBinding",
    "RoleList", "Role", "ClusterRoleBindingList", "ClusterRoleBinding", "ClusterRoleList", "ClusterRole",
    "CustomResourceDefinition", "PersistentVolumeClaim", "PersistentVolume", "StorageClass", "ConfigMap",
    "SecretList", "Secret", "ServiceAccount", "PodDisruptionBudget", "PodSecurityPolicy", "LimitRange",
    "ResourceQuota", "NetworkPolicy", "Namespace", "PriorityClass")


def _helm_kind_rank(kind: str, order: Sequence[str]) -> tuple[int, str]:
    """releaseutil's lessByKind as a key: a listed kind by its place, any other after them by its name."""
    return (order.index(kind), "") if kind in order else (len(order), kind)


def helm_uninstall_order(objects: Iterable[tuple[ObjectRef, str]]) -> list[ObjectRef]:
    """(ref, kind) pairs of a chart's templates, in file order, in the order `helm uninstall` deletes them.

    `helm install` stores the release's manifest in InstallOrder (a stable sort, action.go renderResources);
    uninstall splits it into `manifest-<i>` entries, walks them in the string order of those keys (manifest-10
    before manifest-2: SortManifests sorts its file names with sort.Strings), and sorts them stably by
    UninstallOrder (https://github.com/helm/helm/blob/v3.22.0/pkg/releaseutil/manifest_sorter.go#L77-L110,
    https://github.com/helm/helm/blob/v3.22.0/pkg/action/uninstall.go#L211-L247)."""
    installed = sorted(objects, key=lambda item: _helm_kind_rank(item[1], HELM_INSTALL_ORDER))
    keyed = [(_helm_kind_rank(kind, HELM_UNINSTALL_ORDER), f"manifest-{i}", ref)
             for i, (ref, kind) in enumerate(installed)]
    return [ref for _rank, _key, ref in sorted(keyed, key=lambda item: (item[0], item[1]))]


class Client:
    """What the verdict needs to know about a client: what it deletes and whether it keeps trying."""

    actor: str
    retrying: bool
    refs: tuple[ObjectRef, ...]
    repeat: float | None = None  # a client re-run by a person every `repeat` seconds

    @property
    def settled(self) -> bool:
        """Nothing of the client's own is left once the bundle is gone (Flux's Kustomization may be)."""
        return True

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, actor: str, user: str) -> None:
        self.refs = tuple(refs)
        self.store, self.engine, self.timeline, self.rng = store, engine, timeline, rng
        self.actor, self.user = actor, user
        # The last refusal each object got, and when (timeline seconds).
        self.refused: dict[ObjectRef, tuple[float, str]] = {}
        self.attempted: dict[ObjectRef, None] = {}

    def start(self, delay: float = 0.0) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def _delete(self, ref: ObjectRef, propagation: str) -> bool:
        """One DELETE; True when the object is dealt with (gone, terminating, or not found)."""
        self.attempted[ref] = None
        try:
            result = self.store.delete(ref, user=self.user, propagation=propagation)
        except StatusError as exc:
            if exc.code == 404:
                self.refused.pop(ref, None)
                self.timeline.record(self.actor, "DELETE", ref, NOT_FOUND, "already gone")
                return True
            self.refused[ref] = (self.timeline.now(), exc.message)
            self.timeline.record(self.actor, "DELETE", ref, describe_error(exc), exc.message)
            return False
        self.refused.pop(ref, None)
        outcome, reason = delete_outcome(result)
        self.timeline.record(self.actor, "DELETE", ref, outcome, reason)
        return True


class _RetryingClient(Client):
    """Deletes every object at once and retries each refusal with its own exponential backoff."""

    BASE, CAP = 0.05, 60.0
    SPREAD = 0.01  # requests issued "at once" still reach the API server a few milliseconds apart
    propagation = "Background"
    retrying = True

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, actor: str, user: str) -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor=actor, user=user)
        self.pending: dict[ObjectRef, int] = {}
        self.backoff = Backoff(initial=self.BASE, maximum=self.CAP)

    def targets(self) -> list[ObjectRef]:
        return list(self.refs)

    def start(self, delay: float = 0.0) -> None:
        targets = self.targets()
        self.rng.shuffle(targets)  # parallel requests: no order to rely on
        for ref in targets:
            self.pending[ref] = 0
            self.engine.schedule(delay + self.rng.uniform(0.0, self.SPREAD), functools.partial(self._attempt, ref))

    def _attempt(self, ref: ObjectRef) -> None:
        if self._delete(ref, self.propagation):
            self.pending.pop(ref, None)
            return
        failures = self.pending.get(ref, 0) + 1
        self.pending[ref] = failures
        self.engine.schedule(self.backoff.delay(failures), lambda: self._attempt(ref))


class ManifestWorkAgent(Client):
    """The OCM work agent deleting one ManifestWork's resources, as its v1.3.1 source does.

    Before the teardown (apply time) every object is owned by the bundle's AppliedManifestWork, which
    carries the agent's finalizer (manifestwork_reconciler.go, manifestwork_controller.go). Deleting the
    ManifestWork deletes the AppliedManifestWork; its finalize controller then:

    - makes ONE pass over status.appliedResources, sorted by group, version, resource, namespace and name
      (appliedmanifestwork_reconciler.go#L106-L124): an object already terminating is waited for; any
      other gets a DELETE, Background, with a UID precondition (helpers.go#L172-L273);
    - drops a refused object from the list (never sent again); forgets a 404 or a 409;
    - resyncs at once after changing the list or failing (an update event; the framework's 5 ms requeue),
      else requeues 50 ms·2ⁿ ≤ 60 s (appliedmanifestwork_finalize_controller.go#L54-L135) until what
      it deleted is gone; then removes its finalizer: the AppliedManifestWork is gone.

    The garbage collector (controllers/garbagecollector.py) then deletes the refused objects, the
    AppliedManifestWork's orphans, retrying each refusal 5 ms·2ⁿ ≤ 1000 s. Upstream:
    https://github.com/open-cluster-management-io/ocm/blob/v1.3.1/pkg/work/helper/helpers.go#L172-L273
    """

    BASE, CAP = 0.05, 60.0  # the AppliedManifestWork finalize controller's own limiter
    REACTION = 0.01  # an update event back through the agent's informer, roughly
    retrying = True  # the garbage collector retries for it
    API_VERSION, KIND = "work.open-cluster-management.io/v1", "AppliedManifestWork"
    FINALIZER = "cluster.open-cluster-management.io/applied-manifest-work-cleanup"

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, bundle: str = "") -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng,
                         actor=f"manifestwork/{bundle or 'bundle'}",
                         user="system:serviceaccount:open-cluster-management-agent:klusterlet-work-sa")
        self.name = f"hubhash-{bundle or 'bundle'}".replace("/", "-")
        self.applied: list[ObjectRef] = []
        self.backoff = Backoff(initial=self.BASE, maximum=self.CAP)
        self.failures = 0
        self.owner: ObjectRef | None = None
        self.owner_uid = ""
        self.passes = 0

    def _own(self) -> None:
        """Apply time: the AppliedManifestWork, and its ownerReference on every object of the bundle."""
        created = self.store.create({"apiVersion": self.API_VERSION, "kind": self.KIND,
                                     "metadata": {"name": self.name, "finalizers": [self.FINALIZER]}},
                                    user=self.user, allow_unknown_kinds=True)
        self.owner_uid = str(created["metadata"]["uid"])
        self.owner = ObjectRef(self.store.gr_for(created), "", self.name)
        owner = {"apiVersion": self.API_VERSION, "kind": self.KIND, "name": self.name, "uid": self.owner_uid}
        for ref in self.refs:
            obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
            if obj is None:
                continue
            obj["metadata"]["ownerReferences"] = [*(obj["metadata"].get("ownerReferences") or []), owner]
            obj["metadata"].pop("resourceVersion", None)
            self.store.update(obj, user=self.user)
            self.applied.append(ref)

        def order(ref: ObjectRef) -> tuple[str, str, str, str, str]:
            t = self.store.mapper.lookup(ref.group_resource)
            return (ref.group_resource.group, t.version if t is not None else "", ref.group_resource.resource,
                    ref.namespace, ref.name)

        self.applied.sort(key=order)

    def start(self, delay: float = 0.0) -> None:
        self._own()
        self.engine.schedule(delay, self._delete_applied_manifestwork)

    def _delete_applied_manifestwork(self) -> None:
        assert self.owner is not None
        self.store.delete(self.owner, user=self.user, admission=False)
        self.engine.schedule(self.REACTION, self._sync)

    def _sync(self) -> None:
        self.passes += 1
        pending: list[ObjectRef] = []
        errors = 0
        for ref in self.applied:
            obj = self.store.state.get(ref)
            raw = self.store.get(ref.group_resource, ref.namespace, ref.name) or {}
            if obj is None or self.owner_uid not in {o.get("uid") for o in raw.get("metadata", {}).get(
                    "ownerReferences") or []}:
                continue  # gone, or not ours (helpers.go#L200-L218)
            if obj.terminating:
                pending.append(ref)
                continue
            self.attempted[ref] = None
            try:
                result = self.store.delete(ref, user=self.user, propagation="Background", uid=obj.uid)
            except StatusError as exc:
                if exc.code in (404, 409):
                    continue
                self.refused[ref] = (self.timeline.now(), exc.message)
                self.timeline.record(self.actor, "DELETE", ref, describe_error(exc), exc.message)
                errors += 1
                continue  # dropped: never sent again
            outcome, reason = delete_outcome(result)
            self.timeline.record(self.actor, "DELETE", ref, outcome, reason)
            pending.append(ref)
        changed = pending != self.applied
        self.applied = pending
        if changed or errors:
            self.engine.schedule(self.REACTION, self._sync)
        elif pending:
            self.failures += 1
            self.engine.schedule(self.backoff.delay(self.failures), self._sync)
        else:
            assert self.owner is not None
            self.store.remove_finalizer(self.owner, self.FINALIZER, user=self.user)

    def describe(self) -> str:
        return (f"the ManifestWork agent ({self.actor}) deletes everything once, in its sorted order, drops each "
                f"refusal, waits ({self.BASE * 1000:.0f} ms → {self.CAP:.0f} s) for what it deleted, then removes "
                "its AppliedManifestWork; the garbage collector deletes what was refused, retrying up to 1000 s")


class FluxKustomization(Client):
    """kustomize-controller v1.9.6 finalizing a deleted Kustomization whose inventory is the bundle.

    Apply time put every object of the bundle into status.inventory with Flux's owner labels (finalize
    skips an object without them; the bundle's objects all carry them here). Deleting the Kustomization
    sets its deletionTimestamp; its finalizer `finalizers.fluxcd.io` stays until `finalize` succeeds
    (kustomization_controller.go#L1225-L1306):

    - one pass of ssa DeleteAll over the inventory, in reverse apply order (`flux_delete_order`): per object
      a GET (gone: skipped) and a DELETE, Background, without a precondition; a refusal is noted and the pass
      goes on (manager_delete.go#L64-L120, https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/manager_delete.go);
    - a pass with any refusal returns the joined errors: controller-runtime requeues the Kustomization on
      Flux's rate limiter, 750 ms·2ⁿ ≤ 15 min (ItemExponentialFailureRateLimiter, fluxcd/pkg runtime
      v0.110.3 controller/rate_limiter.go), and the next pass sends every DELETE again, those accepted
      before too (an object still terminating is GET and DELETEd once more);
    - a pass without refusal removes the finalizer: the Kustomization is gone (`gone_at`). With
      deletionPolicy WaitForTermination it first polls every 2 s until what the pass deleted is gone
      (WaitForSetTermination, Interval 2 s; the timeout, spec.timeout, is not modelled).

    The Kustomization itself is not in the store (the gate never sees it: the routing sends it nothing);
    its finalizer's removal is on the timeline under `kustomization`.
    """

    LATENCY = 0.005  # one request's round trip; a pass sends a GET and a DELETE per object, one after another
    REACTION = 0.01  # the Kustomization's deletionTimestamp back through Flux's informer, roughly
    BACKOFF = Backoff(initial=0.75, maximum=900.0)
    WAIT_INTERVAL = 2.0  # WaitForSetTermination's poll
    FINALIZER = "finalizers.fluxcd.io"  # kustomizev1.KustomizationFinalizer
    retrying = True

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, bundle: str = "", deletion_policy: str = "MirrorPrune") -> None:
        name = (bundle or "bundle").replace("/", "-")
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor=f"flux/{name}",
                         user="system:serviceaccount:flux-system:kustomize-controller")
        if deletion_policy not in FLUX_DELETION_POLICIES:
            raise ValueError(f"unknown deletionPolicy {deletion_policy!r}; expected one of "
                             f"{', '.join(FLUX_DELETION_POLICIES)}")
        self.deletion_policy = deletion_policy
        self.kustomization = ObjectRef(GroupResource("kustomize.toolkit.fluxcd.io", "kustomizations"),
                                       "flux-system", name)
        self.order: list[ObjectRef] = []
        self.failures = 0
        self.passes: list[float] = []  # when each pass began (timeline seconds)
        self.gone_at: float | None = None

    @property
    def settled(self) -> bool:
        return self.gone_at is not None

    def start(self, delay: float = 0.0) -> None:
        def kind(ref: ObjectRef) -> str:
            t = self.store.mapper.lookup(ref.group_resource)
            return t.kind if t is not None else ref.group_resource.resource

        self.order = flux_delete_order((r, kind(r)) for r in self.refs)
        self.engine.schedule(delay + self.REACTION, self._pass)

    def _pass(self) -> None:
        self.passes.append(self.timeline.now())
        self._item(0, refused=False, deleted=())

    def _item(self, i: int, *, refused: bool, deleted: tuple[ObjectRef, ...]) -> None:
        if i == len(self.order):
            self._end_pass(refused=refused, deleted=deleted)
            return
        ref = self.order[i]
        if self.store.state.get(ref) is None:  # the GET's 404: DeletedAction, nothing sent
            self.engine.schedule(self.LATENCY, lambda: self._item(i + 1, refused=refused, deleted=deleted))
            return
        ok = self._delete(ref, "Background")
        self.engine.schedule(2 * self.LATENCY, lambda: self._item(i + 1, refused=refused or not ok,
                                                                    deleted=(*deleted, ref) if ok else deleted))

    def _end_pass(self, *, refused: bool, deleted: tuple[ObjectRef, ...]) -> None:
        if refused:
            self.failures += 1
            self.engine.schedule(self.BACKOFF.delay(self.failures), self._pass)
        elif self.deletion_policy == "WaitForTermination":
            self._wait(deleted)
        else:
            self._finalized()

    def _wait(self, deleted: tuple[ObjectRef, ...]) -> None:
        if any(self.store.state.get(r) is not None for r in deleted):
            self.engine.schedule(self.WAIT_INTERVAL, lambda: self._wait(deleted))
        else:
            self._finalized()

    def _finalized(self) -> None:
        self.gone_at = self.timeline.now()
        self.timeline.record(self.actor, "PATCH", self.kustomization, GONE, f"finalizer {self.FINALIZER} removed")

    def describe(self) -> str:
        waits = ", waiting for what it deleted to be gone" if self.deletion_policy == "WaitForTermination" else ""
        return (f"Flux's kustomize-controller ({self.actor}) deletes the Kustomization's inventory in reverse apply "
                f"order, every object each pass, and repeats the whole pass after a refusal "
                f"({self.BACKOFF.initial * 1000:.0f} ms doubling); the Kustomization goes once a pass is not "
                f"refused{waits} ({len(self.passes)} pass{'es' if len(self.passes) != 1 else ''})")


class HelmUninstall(Client):
    """`helm uninstall` (v3.22.0) of a release holding the bundle, as its source does.

    - The release's objects in Helm's uninstall order (`helm_uninstall_order`); with `crds_dir` the bundle's
      CustomResourceDefinitions came from the chart's crds/: they are not in the release's manifest, and Helm
      never deletes them (https://helm.sh/docs/chart_best_practices/custom_resource_definitions/).
    - One Background DELETE per object (`--cascade background`, the default), without a precondition: the
      objects of one kind at once (in no set order: a choice point), the next kind once they are all answered
      (kube.Client batchPerform); a
      refusal is collected and the pass goes on; a 404 counts as deleted
      (https://github.com/helm/helm/blob/v3.22.0/pkg/kube/client.go#L513-L628).
    - Any refusal fails the command ("failed to delete release"), the release stays `uninstalling`, and nothing
      sends those DELETEs again (uninstall.go#L123-L127): a person re-runs it, or the gate's replay finishes the
      teardown. `failed` says whether the pass was refused; `done_at` when the command returned.
    """

    LATENCY = 0.005  # one request's round trip; a kind's DELETEs are in flight together
    retrying = False

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, bundle: str = "", crds_dir: bool = False) -> None:
        name = (bundle or "bundle").replace("/", "-")
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor=f"helm/{name}",
                         user="kubernetes-admin")
        self.crds_dir = crds_dir
        self.order: list[ObjectRef] = []
        self.failed: bool | None = None
        self.done_at: float | None = None

    def _kind(self, ref: ObjectRef) -> str:
        t = self.store.mapper.lookup(ref.group_resource)
        return t.kind if t is not None else ref.group_resource.resource

    def start(self, delay: float = 0.0) -> None:
        kinds = [(r, self._kind(r)) for r in self.refs]
        self.order = helm_uninstall_order((r, k) for r, k in kinds
                                          if not (self.crds_dir and k == "CustomResourceDefinition"))
        self.engine.schedule(delay, lambda: self._kind_batch(0, failed=False))

    def _kind_batch(self, i: int, *, failed: bool) -> None:
        if i == len(self.order):
            self.failed, self.done_at = failed, self.timeline.now()
            return
        kind = self._kind(self.order[i])
        j = i
        while j < len(self.order) and self._kind(self.order[j]) == kind:
            j += 1
        batch = self.order[i:j]
        self.rng.shuffle(batch)  # one goroutine each: they reach the API server in no set order
        for ref in batch:
            failed = not self._delete(ref, "Background") or failed
        self.engine.schedule(self.LATENCY, lambda: self._kind_batch(j, failed=failed))

    def describe(self) -> str:
        kept = "; the CRDs in the chart's crds/ are never deleted" if self.crds_dir else ""
        return ("helm uninstall makes one pass in Helm's uninstall order by kind and does not retry a refused "
                f"DELETE{kept}")
class ArgoCDApplication(Client):
    """Argo CD v3.2.3's application controller finalizing a deleted Application whose managed objects are the
    bundle (finalizeApplicationDeletion,
    https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1191-L1283):

    - a pass lists the Application's live objects; while any of them has a deletionTimestamp (a CRD too) it
      sends nothing;
    - otherwise it takes what it would delete: never a CRD (shouldBeDeleted, `!kube.IsCRD(obj)`), nor an
      object annotated `argocd.argoproj.io/sync-options: Delete=false` or `helm.sh/resource-policy: keep`;
      keeps the highest sync wave of those (FilterObjectsForDeletion, controller/sort_delete.go) and sends
      their DELETEs at once (gitops-engine kube.RunAllAsync, goroutines: no order), propagation Foreground,
      or Background with the `/background` finalizer;
    - a refused DELETE fails the pass (the Application's DeletionError); once nothing it would delete is left,
      the finalizer goes (`gone_at`): the Application is gone, its CRDs stay.

    A pass comes when the controller processes the Application again: on a change of one of its objects (its
    cluster cache's watch requeues it, appcontroller.go handleObjectUpdated; modelled as REACTION after any
    change of the bundle's objects), and at the resync, every RESYNC seconds (`--app-resync`, default 180).
    The Application itself is not in the store (the gate never sees it); its finalizer's removal is on the
    timeline under `application`.
    """

    REACTION = 0.1  # an object's change, through the controller's cluster cache and app queue, to the next pass
    SPREAD = 0.01  # DELETEs sent "at once" reach the API server a few milliseconds apart
    RESYNC = 180.0  # --app-resync's default (ARGOCD_RECONCILIATION_TIMEOUT)
    FINALIZER = "resources-finalizer.argocd.argoproj.io"
    WAVE_ANNOTATION = "argocd.argoproj.io/sync-wave"
    retrying = True

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, bundle: str = "", propagation: str = "Foreground") -> None:
        name = (bundle or "bundle").replace("/", "-")
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor=f"argocd/{name}",
                         user="system:serviceaccount:argocd:argocd-application-controller")
        self.propagation = propagation
        self.application = ObjectRef(GroupResource("argoproj.io", "applications"), "argocd", name)
        self.passes: list[float] = []  # when each pass sent DELETEs (timeline seconds)
        self.gone_at: float | None = None
        self._scheduled = False
        self._unsubscribe: Callable[[], None] | None = None

    @property
    def settled(self) -> bool:
        return self.gone_at is not None

    def start(self, delay: float = 0.0) -> None:
        watched = set(self.refs)
        self._unsubscribe = self.store.subscribe(
            lambda event: self._soon() if self.store_ref(event) in watched else None)
        self.engine.schedule(delay + self.REACTION, self._pass)

    def store_ref(self, event: WatchEvent) -> ObjectRef:
        metadata = event.object.get("metadata") or {}
        namespace = "" if event.group_resource == NAMESPACES else str(metadata.get("namespace") or "")
        return ObjectRef(event.group_resource, namespace, str(metadata.get("name") or ""))

    def _soon(self) -> None:
        if not self._scheduled and self.gone_at is None:
            self._scheduled = True
            self.engine.schedule(self.REACTION, self._pass)

    def _pass(self, *, resync: bool = False) -> None:
        self._scheduled = False
        if self.gone_at is not None:
            return
        live = [(ref, obj) for ref in self.refs
                if (obj := self.store.get(ref.group_resource, ref.namespace, ref.name)) is not None]
        if any(obj["metadata"].get("deletionTimestamp") for _ref, obj in live):
            return self._resync(resync)
        doomed = [(ref, obj) for ref, obj in live if self.deletes(ref, obj)]
        if not doomed:
            self.gone_at = self.timeline.now()
            self.timeline.record(self.actor, "PATCH", self.application, GONE, f"finalizer {self.FINALIZER} removed")
            if self._unsubscribe is not None:
                self._unsubscribe()
            return None
        top = max(_wave(obj) for _ref, obj in doomed)
        wave = [ref for ref, obj in doomed if _wave(obj) == top]
        self.rng.shuffle(wave)
        self.passes.append(self.timeline.now())
        for ref in wave:
            self.engine.schedule(self.rng.uniform(0.0, self.SPREAD), functools.partial(self._send, ref))
        return self._resync(resync)

    def _send(self, ref: ObjectRef) -> None:
        self._delete(ref, self.propagation)

    def _resync(self, resync: bool) -> None:
        if resync or len(self.passes) <= 1:  # one resync timer for the Application, from its first pass on
            self.engine.schedule(self.RESYNC, functools.partial(self._pass, resync=True))

    @staticmethod
    def deletes(ref: ObjectRef, obj: Mapping[str, Any]) -> bool:
        """Whether the Application's deletion deletes `obj` (shouldBeDeleted)."""
        annotations = obj.get("metadata", {}).get("annotations") or {}
        options = str(annotations.get("argocd.argoproj.io/sync-options", ""))
        return (ref.group_resource != CRDS and "Delete=false" not in options.replace(" ", "").split(",")
                and annotations.get("helm.sh/resource-policy") != "keep")

    def describe(self) -> str:
        return (f"Argo CD's application controller ({self.actor}) deletes the Application's objects but its CRDs, "
                f"the highest sync wave at a time, all at once ({self.propagation}), and sends nothing while any "
                f"of them terminates; a pass comes on each change of them (and every {self.RESYNC:.0f} s); the "
                f"Application goes once nothing it deletes is left ({len(self.passes)} "
                f"pass{'es' if len(self.passes) != 1 else ''} that sent DELETEs)")


def _wave(obj: Mapping[str, Any]) -> int:
    """An object's sync wave (argocd.argoproj.io/sync-wave; 0 when absent or not an integer, as syncwaves.Wave)."""
    try:
        return int(str((obj.get("metadata", {}).get("annotations") or {}).get(ArgoCDApplication.WAVE_ANNOTATION,
                                                                               "0")))
    except ValueError:
        return 0


class NamespaceDelete(_RetryingClient):
    """Deletes the bundle's namespaces and whatever lies outside them; the namespace controller does the rest."""

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, bundle: str = "") -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng,
                         actor=f"namespace-cleanup/{bundle}" if bundle else "namespace-cleanup",
                         user="namespace-cleanup")

    def targets(self) -> list[ObjectRef]:
        namespaces = {r.name for r in self.refs if r.group_resource == NAMESPACES}
        return [r for r in self.refs if r.group_resource == NAMESPACES or r.namespace not in namespaces]

    def describe(self) -> str:
        return (f"{self.actor} deletes the bundle's namespaces (and what lives outside them), retrying each "
                f"refusal with backoff {self.BASE * 1000:.0f} ms → {self.CAP:.0f} s; the namespace "
                "controller deletes the content")


class KubectlDelete(Client):
    """`kubectl delete -f BUNDLE --ignore-not-found`: sequential, one pass, no retry [K1][K2]."""

    LATENCY = 0.01  # one request's round trip: kubectl waits for each DELETE before the next

    def __init__(self, refs: Sequence[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, repeat: float | None = None) -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor="kubectl",
                         user="kubernetes-admin")
        self.repeat = repeat
        self.retrying = repeat is not None
        self.runs = 0
        self.running = False

    def start(self, delay: float = 0.0) -> None:
        self.engine.schedule(delay, self._run)

    def _run(self) -> None:
        self.runs += 1
        self.running = True
        self._item(0, failed=False)

    def _item(self, i: int, *, failed: bool) -> None:
        if i == len(self.refs):
            self.running = False
            if failed and self.repeat is not None:
                self.engine.schedule(self.repeat, self._run)
            return
        ok = self._delete(self.refs[i], "Background")
        self.engine.schedule(self.LATENCY, lambda: self._item(i + 1, failed=failed or not ok))

    def describe(self) -> str:
        if self.repeat is None:
            return "kubectl delete -f makes one pass in file order and does not retry a refused DELETE"
        return (f"kubectl delete -f, re-run every {self.repeat:g} s until it succeeds "
                f"({self.runs} run{'s' if self.runs != 1 else ''})")


class OwnerDelete(Client):
    """Deletes the bundle's roots once; the garbage collector deletes the rest."""

    retrying = True  # the garbage collector retries for it

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random, propagation: str) -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor="owner-delete",
                         user="kubernetes-admin")
        self.propagation = propagation

    def roots(self) -> list[ObjectRef]:
        uids = {}
        for ref in self.refs:
            obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
            if obj is not None:
                uids[obj["metadata"].get("uid")] = ref
        roots = []
        for ref in self.refs:
            obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
            owners = (obj or {}).get("metadata", {}).get("ownerReferences") or []
            if obj is not None and not any(o.get("uid") in uids for o in owners):
                roots.append(ref)
        return roots

    def start(self, delay: float = 0.0) -> None:
        self.engine.schedule(delay, self._delete_roots)

    def _delete_roots(self) -> None:
        for ref in self.roots():
            self._delete(ref, self.propagation)

    def describe(self) -> str:
        return (f"deletes the bundle's root owners ({self.propagation} propagation) and leaves the rest to the "
                "garbage collector, which retries a refusal with backoff up to 1000 s")


class IdealDelete(Client):
    """The critical-path deleter: deletes what the gate allows, the moment it allows it."""

    retrying = True
    # Apart from its own, nothing the API server does can make a DELETE allowed without a watch event,
    # so reacting to every event (in the same virtual instant) is as early as any deleter can be.

    def __init__(self, refs: Iterable[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                 rng: random.Random) -> None:
        super().__init__(refs, store=store, engine=engine, timeline=timeline, rng=rng, actor="ideal",
                         user="kubernetes-admin")
        self.done: set[ObjectRef] = set()
        self._scheduled = False

    def start(self, delay: float = 0.0) -> None:
        self.store.subscribe(lambda event: self._soon())
        self.engine.schedule(delay, self._sweep)

    def _soon(self) -> None:
        if not self._scheduled and len(self.done) < len(self.refs):
            self._scheduled = True
            self.engine.schedule(0.0, self._sweep)

    def _sweep(self) -> None:
        self._scheduled = False
        for ref in self.refs:
            if ref in self.done:
                continue
            try:
                self.store.delete(ref, user=self.user, dry_run=True)
            except StatusError as exc:
                if exc.code == 404:
                    self.done.add(ref)
                continue
            self.done.add(ref)
            self._delete(ref, "Background")

    def describe(self) -> str:
        return "the ideal deleter deletes each object the moment the gate would allow it (the critical path)"


def make_client(kind: str, refs: Sequence[ObjectRef], *, store: Store, engine: Engine, timeline: Timeline,
                rng: random.Random, bundle: str = "", repeat: float | None = None,
                flux_deletion_policy: str = "MirrorPrune", helm_crds_dir: bool = False) -> Client:
    """A client by its `--client` name."""
    if kind == "manifestwork":
        return ManifestWorkAgent(refs, bundle=bundle, store=store, engine=engine, timeline=timeline, rng=rng)
    if kind == "namespace":
        return NamespaceDelete(refs, bundle=bundle, store=store, engine=engine, timeline=timeline, rng=rng)
    if kind == "kubectl":
        return KubectlDelete(refs, repeat=repeat, store=store, engine=engine, timeline=timeline, rng=rng)
    if kind in ("gc-background", "gc-foreground"):
        return OwnerDelete(refs, store=store, engine=engine, timeline=timeline, rng=rng,
                           propagation="Foreground" if kind == "gc-foreground" else "Background")
    if kind == "flux":
        return FluxKustomization(refs, bundle=bundle, deletion_policy=flux_deletion_policy, store=store,
                                 engine=engine, timeline=timeline, rng=rng)
    if kind == "helm":
        return HelmUninstall(refs, bundle=bundle, crds_dir=helm_crds_dir, store=store, engine=engine,
                             timeline=timeline, rng=rng)
    if kind in ("argocd", "argocd-background"):
        return ArgoCDApplication(refs, bundle=bundle, store=store, engine=engine, timeline=timeline, rng=rng,
                                 propagation="Background" if kind == "argocd-background" else "Foreground")
    if kind == "ideal":
        return IdealDelete(refs, store=store, engine=engine, timeline=timeline, rng=rng)
    raise ValueError(f"unknown client {kind!r}; expected one of {', '.join(CLIENTS)}")


__all__ = ["CLIENTS", "FLUX_DELETION_POLICIES", "ArgoCDApplication", "Client", "FluxKustomization", "HelmUninstall",
           "IdealDelete", "KubectlDelete", "ManifestWorkAgent", "NamespaceDelete", "OwnerDelete", "flux_delete_order",
           "helm_uninstall_order", "make_client"]
