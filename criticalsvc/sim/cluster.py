"""A simulated cluster: the store, the gate as its webhook, the controllers, a teardown and a verdict.

    cluster = Cluster(seed=0)                  # gate on, ordered namespace deletion (Kubernetes ≥ 1.33)
    cluster.load(load_path("bundle.yaml"))     # namespaces and CRDs first, then the rest, then CriticalServices
    cluster.teardown("manifestwork")           # one client per bundle, all starting at once
    verdict = cluster.run()                    # completed, or stuck: what holds each remaining object

Loading follows what `kubectl apply` twice would leave behind: namespaces and CRDs first (so the
objects they serve can be created), CriticalServices last (so the gate checks each new one against the
others; a cycle is refused then, never discovered later as a hang). A namespace the bundle uses but
does not contain is created as part of the cluster, not of the teardown. ownerReferences written
without a uid are resolved to the owner in the bundle, as if it had been created first.

When does a run end? When every object of the teardown is gone (completed), or when nothing has
changed for STALL_WINDOW of virtual time (stuck). The window is sound because each actor's next
attempt comes at most its backoff cap after the last change, and the state it decides on is frozen
meanwhile: the slowest are the garbage collector and the CRD cleanup, capped at 1000 s [Q1], plus the
CRD cleanup's 60 s poll [C1], a client's 60 s cap, the namespace controller's 5 s grace and 8 s
requeue [N4] — 1,133 s in all, so 1,200 s without a change means nothing ever will. (Changes to
status conditions alone do not count: a stuck controller rewrites them forever.)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import PurePath
from typing import Any, Literal

import attrs

from ..admission import parse_review
from ..api import CRDS, CRITICAL_SERVICES, NAMESPACES, GroupResource, ObjectRef
from ..decision import decide
from ..errors import InvalidInput, MalformedManifest
from ..manifests import Manifest
from ..objects import project
from ..restmapper import resource_type_from_crd
from .clients import CLIENTS, Client, HelmUninstall, make_client
from .controllers.finalizers import FinalizerController
from .controllers.garbagecollector import FOREGROUND, ORPHAN
from .controllers.manager import Controllers, start_controllers
from .engine import Engine, VirtualEngine
from .replayer import Replayer
from .store import (
    CRD_CLEANUP_FINALIZER,
    NAMESPACE_FINALIZER,
    StatusError,
    Store,
    WatchEvent,
    gate_hook,
)
from .timeline import Timeline, gate_message
from .webhooks import DEFAULT_RULES, ProviderRoutesRule, RegisteredWebhook, WebhookRule

STALL_WINDOW = 1200.0
MAX_TIME = 7 * 24 * 3600.0  # a safety net far beyond any backoff: a week of virtual time
LOAD_USER = "kubernetes-admin"


@attrs.frozen
class Hold:
    """One object left behind, and everything that holds it."""

    ref: ObjectRef
    terminating: bool
    reasons: tuple[str, ...]
    blocked_by: tuple[str, ...] = ()  # CriticalServices whose criteria the gate enforces on it

    def to_dict(self) -> dict[str, Any]:
        return {"object": _ref_dict(self.ref), "terminating": self.terminating, "reasons": list(self.reasons),
                "blockedBy": list(self.blocked_by)}


@attrs.frozen
class TeardownVerdict:
    """How a simulated teardown ended: every object gone, or stuck with what remains and why."""

    completed: bool
    elapsed: float  # virtual seconds from the start to the last object gone, or to the last change when stuck
    total: int  # objects in the teardown
    remaining: tuple[Hold, ...]
    denials: int  # refused DELETEs along the way (every retry counts)
    hint: str = ""  # what a person could do about a stuck teardown

    @property
    def stuck(self) -> bool:
        return not self.completed

    def summary(self) -> str:
        if self.completed:
            refused = f"; the gate refused {self.denials} DELETEs along the way" if self.denials else ""
            return (f"COMPLETED: all {self.total} objects are gone after {self.elapsed:.1f} s (virtual time)"
                    f"{refused}.")
        text = (f"STUCK: {len(self.remaining)} of {self.total} objects remain; nothing has changed since "
                f"+{self.elapsed:.1f} s and nothing will.")
        return f"{text} {self.hint}" if self.hint else text

    def to_dict(self) -> dict[str, Any]:
        return {"completed": self.completed, "elapsed": round(self.elapsed, 6), "total": self.total,
                "denials": self.denials, "remaining": [h.to_dict() for h in self.remaining], "hint": self.hint,
                "summary": self.summary()}


def _ref_dict(ref: ObjectRef) -> dict[str, str]:
    return {"group": ref.group_resource.group, "resource": ref.group_resource.resource,
            "namespace": ref.namespace, "name": ref.name}


@attrs.frozen
class Mark:
    """When an object's deletion started (marked) and when it left the API (gone): (time, seq)."""

    marked: tuple[float, int] | None = None
    gone: tuple[float, int] | None = None


class Cluster:
    """The simulated control plane, assembled. See the module docstring for the life cycle."""

    def __init__(self, *, engine: Engine | None = None, gate: bool = True, seed: int = 0,
                 ordered_namespace_deletion: bool = True,
                 failure_policy: Literal["Fail", "Ignore"] = "Fail",
                 finalizer_delay: tuple[float, float] = FinalizerController.DELAY,
                 replayer: Callable[[Store, Engine, Timeline], Replayer] | None = Replayer,
                 rng: random.Random | None = None) -> None:
        self.engine: Engine = engine or VirtualEngine()
        self.store = Store(clock=self.engine.now)
        self.gate = gate
        self.timeline = Timeline(self.engine.now, seq=lambda: self.store.resource_version)
        # The gate's replay of refused deletions: it acts only for CriticalServices that ask for it
        # (spec.replayDeletion: WhenTearingDown), so it is always there, as in the live gate's leader.
        self.replayer = replayer(self.store, self.engine, self.timeline) if gate and replayer is not None else None
        if gate:
            hook = gate_hook(self.store, on_decision=self.replayer.record if self.replayer is not None else None,
                             manages_routes=True)
            # The shipped rules plus the ones the gate's router writes (criticalsvc/routing.py), as deploy/ with
            # serve's default --manage-provider-webhooks.
            rules: tuple[WebhookRule | ProviderRoutesRule, ...] = (*DEFAULT_RULES, ProviderRoutesRule(self.store.state))
            self.store.webhooks.append(RegisteredWebhook(hook, rules=rules, failure_policy=failure_policy))
        self.seed = seed
        self.rng = rng or random.Random(seed)
        # The controllers draw from a stream of their own, so the same seed gives the same finalizer and
        # reconcile delays whichever client deletes: teardown times of different clients compare. An `rng`
        # given (criticalsvc.verify's choice points) is the one source of every choice, clients' and controllers'.
        self.controller_rng = rng or random.Random(f"controllers-{seed}")
        self.controllers: Controllers = start_controllers(
            self.store, self.engine, timeline=self.timeline, rng=self.controller_rng,
            ordered_namespace_deletion=ordered_namespace_deletion, finalizer_delay=finalizer_delay)
        self.bundles: dict[str, list[ObjectRef]] = {}
        self.kinds: dict[GroupResource, str] = {}  # remembered: a CRD's kind is unknown once it is gone
        self.outside: list[ObjectRef] = []  # created for the bundle, not part of it (a namespace it uses)
        self.clients: list[Client] = []
        self.marks: dict[ObjectRef, Mark] = {}
        self._teardown: dict[ObjectRef, None] = {}
        self._remaining: dict[ObjectRef, None] = {}
        self._started: float | None = None
        self._last_gone = 0.0
        self._signature: dict[ObjectRef, tuple[Any, ...]] = {}
        self._last_change = self.timeline.now()
        self.store.subscribe(self._track)

    # --- bookkeeping from the watch ---------------------------------------------------------------
    def _track(self, event: WatchEvent) -> None:
        md = event.object["metadata"]
        ref = ObjectRef(event.group_resource, md.get("namespace", "") or "", md["name"])
        now, seq = self.timeline.now(), event.resource_version
        mark = self.marks.get(ref, Mark())
        if event.type == "DELETED":
            self.marks[ref] = attrs.evolve(mark, gone=(now, seq),
                                           marked=mark.marked or (now, seq))
            self._signature.pop(ref, None)
            self._last_change = now
            if ref in self._remaining:
                del self._remaining[ref]
                self._last_gone = now
            return
        if md.get("deletionTimestamp") and mark.marked is None:
            self.marks[ref] = attrs.evolve(mark, marked=(now, seq))
        spec_finalizers = (event.object.get("spec") or {}).get("finalizers") if event.group_resource == NAMESPACES \
            else None
        signature = (md.get("deletionTimestamp"), tuple(md.get("finalizers") or ()), repr(spec_finalizers),
                     repr(md.get("ownerReferences")))
        if self._signature.get(ref) != signature:
            self._signature[ref] = signature
            self._last_change = now

    # --- load -----------------------------------------------------------------------------------------
    def load(self, manifests: Iterable[Manifest]) -> list[ObjectRef]:
        """Create a bundle's objects; raises InvalidInput naming the file and document of a refused one."""
        manifests = list(manifests)
        mapper = self.store.mapper
        for m in manifests:
            if mapper.resource_for_kind(m.api_version, m.kind) == CRDS and resource_type_from_crd(m.obj) is None:
                raise MalformedManifest("spec", "a CustomResourceDefinition needs spec.group, spec.names.plural "
                                        "and spec.names.kind", where=m.where)
        for m in manifests:
            try:
                project(m.obj, mapper.resource_for_kind(m.api_version, m.kind))
            except InvalidInput as exc:
                raise exc.located(m.where) from None

        def rank(m: Manifest) -> int:
            gr = mapper.resource_for_kind(m.api_version, m.kind)
            return {NAMESPACES: 0, CRDS: 1, CRITICAL_SERVICES: 3}.get(gr, 2)

        ordered = sorted(manifests, key=rank)  # stable: file order within each rank
        self._create_missing_namespaces(manifests)
        created: dict[int, ObjectRef] = {}
        waiting = list(ordered)
        while waiting:
            progress, later = False, []
            for m in waiting:
                obj = self._resolve_owners(m, final=False)
                namespace = str((m.obj.get("metadata") or {}).get("namespace") or "")
                if obj is None or (namespace and not self.store.exists(NAMESPACES, "", namespace)):
                    later.append(m)  # its owner, or its namespace (itself waiting for an owner), comes first
                    continue
                created[id(m)] = self._create(m, obj)
                progress = True
            if not progress:
                m = later[0]
                self._resolve_owners(m, final=True)  # raises, naming the unresolvable owner
            waiting = later
        refs = []
        for m in manifests:
            ref = created[id(m)]
            self.bundles.setdefault(m.bundle or "bundle", []).append(ref)
            refs.append(ref)
        return refs

    def _create_missing_namespaces(self, manifests: Sequence[Manifest]) -> None:
        mapper = self.store.mapper
        own = {str((m.obj.get("metadata") or {}).get("name")) for m in manifests
               if mapper.resource_for_kind(m.api_version, m.kind) == NAMESPACES}
        crd_kinds = {(t.group, t.kind): t for m in manifests if (t := resource_type_from_crd(m.obj)) is not None
                     and mapper.resource_for_kind(m.api_version, m.kind) == CRDS}
        for m in manifests:
            group = m.api_version.rpartition("/")[0] if "/" in m.api_version else ""
            t = crd_kinds.get((group, m.kind)) or mapper.for_kind(group, m.kind)
            namespaced = t.namespaced if t is not None else bool((m.obj.get("metadata") or {}).get("namespace"))
            ns = str((m.obj.get("metadata") or {}).get("namespace") or "default") if namespaced else ""
            if ns and ns not in own and not self.store.exists(NAMESPACES, "", ns):
                self.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, user=LOAD_USER)
                self.outside.append(ObjectRef(NAMESPACES, "", ns))

    def _resolve_owners(self, m: Manifest, *, final: bool) -> dict[str, Any] | None:
        """The manifest with ownerReference uids filled in; None while an owner in the bundle is missing."""
        obj: dict[str, Any] = dict(m.obj)
        owners = (obj.get("metadata") or {}).get("ownerReferences")
        if not owners:
            return obj
        if not isinstance(owners, list):
            raise MalformedManifest("metadata.ownerReferences", "must be a list", where=m.where)
        resolved = []
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        for i, o in enumerate(owners):
            path = f"metadata.ownerReferences[{i}]"
            if not isinstance(o, Mapping) or not all(isinstance(o.get(k), str) and o.get(k)
                                                     for k in ("apiVersion", "kind", "name")):
                raise MalformedManifest(path, "apiVersion, kind and name are required", where=m.where)
            gr = self.store.mapper.resource_for_kind(o["apiVersion"], o["kind"])
            t = self.store.mapper.lookup(gr)
            owner = self.store.get(gr, namespace if t is None or t.namespaced else "", o["name"])
            if owner is not None:
                resolved.append({**o, "uid": owner["metadata"]["uid"]})
            elif o.get("uid"):
                resolved.append(dict(o))  # an owner outside the bundle: dangling, so the GC deletes this [G1]
            elif final:
                raise MalformedManifest(f"{path}.uid", f"required: {o['kind']} {o['name']} is not in the bundle "
                                        "(or the ownerReferences form a cycle)", where=m.where)
            else:
                return None
        obj["metadata"] = {**obj["metadata"], "ownerReferences": resolved}
        return obj

    def _create(self, m: Manifest, obj: Mapping[str, Any]) -> ObjectRef:
        try:
            stored = self.store.create(obj, user=LOAD_USER, allow_unknown_kinds=True)
        except StatusError as exc:
            raise MalformedManifest("", f"{m.kind} {(m.obj.get('metadata') or {}).get('name')!r} cannot be "
                                    f"created: {exc.message}", where=m.where) from None
        md = stored["metadata"]
        gr = self.store.gr_for(stored)
        self.kinds.setdefault(gr, str(stored["kind"]))
        return ObjectRef(gr, md.get("namespace", "") or "", md["name"])

    def describe(self, ref: ObjectRef) -> str:
        """`Kind namespace/name`, the way a person names an object."""
        kind = self.kinds.get(ref.group_resource)
        if kind is None:
            t = self.store.mapper.lookup(ref.group_resource)
            kind = t.kind if t is not None else str(ref.group_resource)
        return f"{kind} {ref.key}"

    # --- teardown -------------------------------------------------------------------------------------
    def teardown(self, client: str = "manifestwork", *, bundles: Iterable[str] | None = None,
                 repeat: float | None = None, delay: float = 0.0,
                 flux_deletion_policy: str = "MirrorPrune", helm_crds_dir: bool = False) -> list[Client]:
        """Start deleting `bundles` (default: all) with `client`: one per bundle, kubectl one for all."""
        if client not in CLIENTS:
            raise ValueError(f"unknown client {client!r}; expected one of {', '.join(CLIENTS)}")
        names = list(self.bundles) if bundles is None else list(bundles)
        groups = [(" ".join(names), [r for n in names for r in self.bundles[n]])] if client == "kubectl" \
            else [(n, self.bundles[n]) for n in names]
        started = []
        for bundle, refs in groups:
            c = make_client(client, refs, store=self.store, engine=self.engine, timeline=self.timeline,
                            rng=self.rng, bundle=_bundle_name(bundle), repeat=repeat,
                            flux_deletion_policy=flux_deletion_policy, helm_crds_dir=helm_crds_dir)
            for r in refs:
                self._teardown[r] = None
                if self.store.state.get(r) is not None:
                    self._remaining[r] = None
            c.start(delay)
            started.append(c)
        self.clients.extend(started)
        if self._started is None:
            self._started = self.timeline.now() + delay
        return started

    @property
    def completed(self) -> bool:
        return bool(self._teardown) and not self._remaining

    def stalled(self) -> bool:
        return self.timeline.now() - self._last_change > self._stall_window()

    def _stall_window(self) -> float:
        return max([STALL_WINDOW, *(2 * c.repeat for c in self.clients if c.repeat)])

    def run(self, *, max_time: float = MAX_TIME) -> TeardownVerdict:
        """Run the virtual engine until the teardown completes or gets stuck; then judge it."""
        if not isinstance(self.engine, VirtualEngine):
            raise TypeError("run() drives a VirtualEngine; a real-time engine runs by itself")
        deadline = self.engine.now() + max_time
        # A client may still have work once the objects are gone (Flux removing its Kustomization's finalizer).
        self.engine.run(until=deadline, stop=lambda: (self.completed and all(c.settled for c in self.clients))
                        or self.stalled())
        return self.verdict()

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass (a stateful test's step)."""
        if not isinstance(self.engine, VirtualEngine):
            raise TypeError("advance() drives a VirtualEngine")
        self.engine.run(until=self.engine.now() + seconds, stop=lambda: self.completed)

    # --- verdict --------------------------------------------------------------------------------------
    def verdict(self) -> TeardownVerdict:
        start = self._started or 0.0
        remaining = [r for r in self._teardown if self.store.state.get(r) is not None]
        holds = tuple(self.hold(r) for r in sorted(remaining, key=_verdict_order))
        denials = sum(1 for e in self.timeline.events if e.outcome == "denied")
        if not remaining:
            return TeardownVerdict(True, max(0.0, self._last_gone - start), len(self._teardown), (), denials)
        return TeardownVerdict(False, max(0.0, self._last_change - start), len(self._teardown), holds, denials,
                               self._hint(holds))

    def _hint(self, holds: Sequence[Hold]) -> str:
        gave_up = [h for h in holds if any("does not retry" in r for r in h.reasons)]
        lost = [h for h in holds if any("stays forever" in r for r in h.reasons)]
        hints = []
        if lost:
            tail = ": the teardown the gate exists to prevent." if not self.gate else "."
            hints.append(f"{len(lost)} object{'s carry' if len(lost) != 1 else ' carries'} a finalizer whose "
                         f"controller was taken down first{tail}")
        if gave_up:
            now = sum(1 for h in gave_up if not h.blocked_by)
            helm = any(isinstance(c, HelmUninstall) for c in self.clients)
            hints.append(f"{'helm uninstall' if helm else 'kubectl'} gave up on {len(gave_up)} refused "
                         f"object{'s' if len(gave_up) != 1 else ''}" + (f" ({now} would be allowed now)" if now else "")
                         + (": run it again, or give the CriticalService replayDeletion: WhenTearingDown." if helm
                            else ": run it again, or simulate a person re-running it with --repeat SECONDS."))
        return " ".join(hints)

    def order(self) -> list[tuple[ObjectRef, Mark]]:
        """Teardown objects by the moment they were gone (then marked); those still here last."""
        never = (float("inf"), 1 << 62)
        return sorted(((r, self.marks.get(r, Mark())) for r in self._teardown),
                      key=lambda rm: (rm[1].gone or never, rm[1].marked or never, _verdict_order(rm[0])))

    def hold(self, ref: ObjectRef) -> Hold:
        """What keeps `ref` in the API, in words a person can act on."""
        obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
        if obj is None:
            return Hold(ref, False, ("gone",))
        md = obj["metadata"]
        if md.get("deletionTimestamp"):
            reasons = [self._finalizer_hold(ref, obj, f) for f in md.get("finalizers") or []]
            spec_finalizers = (obj.get("spec") or {}).get("finalizers") or []
            if ref.group_resource == NAMESPACES and NAMESPACE_FINALIZER in spec_finalizers:
                reasons.insert(0, self._namespace_hold(ref, obj))
            return Hold(ref, True, tuple(reasons) or ("terminating",))
        return self._refusal_hold(ref, obj)

    def _finalizer_hold(self, ref: ObjectRef, obj: Mapping[str, Any], finalizer: str) -> str:
        if finalizer == CRD_CLEANUP_FINALIZER:
            t = resource_type_from_crd(obj)
            left = list(self.store.refs(t.group_resource)) if t is not None else []
            if left:
                first = ", ".join(r.key for r in left[:3])
                return (f"CRD waiting for its {len(left)} instance{'s' if len(left) != 1 else ''} to be gone "
                        f"(first: {first}) [finalizer {CRD_CLEANUP_FINALIZER}]")
            return f"finalizer {CRD_CLEANUP_FINALIZER}: the CRD cleanup has not finished"
        if finalizer in (FOREGROUND, ORPHAN):
            n = len(self.controllers.garbage_collector.dependents(str(obj["metadata"].get("uid", ""))))
            return f"finalizer {finalizer}: the garbage collector is waiting for {n} dependents"
        controllers = self.controllers.finalizers.for_finalizer(ref.group_resource, finalizer)
        if not controllers:
            return (f"finalizer {finalizer}: no controller in this cluster removes it (no CriticalService names it "
                    "in a Finalizer criterion)")
        states = [(c, *c.running()) for c in controllers]
        if any(up for _c, up, _why in states):
            return f"finalizer {finalizer}: its controller has not removed it yet"
        why = "; ".join(reason for _c, _up, reason in states)
        return f"finalizer {finalizer} stays forever: {why}"

    def _namespace_hold(self, ref: ObjectRef, obj: Mapping[str, Any]) -> str:
        counts: dict[str, int] = {}
        for t in self.store.mapper.types():
            if t.namespaced:
                n = len(list(self.store.refs(t.group_resource, ref.name)))
                if n:
                    counts[str(t.group_resource)] = n
        content = ", ".join(f"{gr} has {n}" for gr, n in sorted(counts.items())) or "none left"
        text = f"namespace waiting for its content to be deleted ({content})"
        failure = next((c for c in (obj.get("status") or {}).get("conditions") or []
                        if c.get("type") == "NamespaceDeletionContentFailure" and c.get("status") == "True"), None)
        if failure is not None:
            text += f"; the namespace controller keeps failing: {gate_message(failure.get('message', ''))}"
        return text

    def _refusal_hold(self, ref: ObjectRef, obj: Mapping[str, Any]) -> Hold:
        reasons: list[str] = []
        blocked_by: tuple[str, ...] = ()
        allowed_now = True
        if self.gate:
            review = self.store.admission_review("DELETE", ref.group_resource, None, obj, name=ref.name,
                                                 namespace=ref.name if ref.group_resource == NAMESPACES
                                                 else ref.namespace, user="criticalsvc-simulate", dry_run=True)
            decision = decide(parse_review(review), self.store.state)
            if not decision.allowed:
                allowed_now = False
                blocked_by = decision.blocking
                who = f"CriticalService {', '.join(blocked_by)}" if blocked_by else "the gate"
                reasons.append(f"DELETE denied by {who}: "
                               + decision.message.removeprefix(f"{ref} may not be deleted yet: "))
        tried = [c for c in self.clients if ref in c.attempted]
        gc_denial = self.controllers.garbage_collector.denied.get(ref)
        for c in tried:
            refused = c.refused.get(ref)
            if refused is None:
                continue
            if c.retrying:
                reasons.append(f"{c.actor} keeps retrying ({c.describe()})")
            elif allowed_now:
                reasons.append(f"{c.actor} was refused at +{refused[0]:.3f}s and does not retry; the gate would "
                               "allow it now: delete it again")
            else:
                reasons.append(f"{c.actor} was refused at +{refused[0]:.3f}s and does not retry")
        if gc_denial is not None:
            reasons.append("the garbage collector keeps retrying (backoff up to 1000 s)")
        if not tried and gc_denial is None:
            reasons.append("no client deleted it (it is not in a bundle being deleted, and no controller deletes it)")
        return Hold(ref, False, tuple(reasons), blocked_by)


def _bundle_name(bundle: str) -> str:
    """`manifestwork/NAME` -> NAME; a file's path -> its stem (the ManifestWork a file would become)."""
    if bundle.startswith("manifestwork/"):
        return bundle.removeprefix("manifestwork/")
    return PurePath(bundle).stem if bundle.endswith((".yaml", ".yml", ".json")) else bundle


def _verdict_order(ref: ObjectRef) -> tuple[int, str]:
    # Content first, then what waits for it: namespaced objects, CRDs, namespaces, CriticalServices.
    gr = ref.group_resource
    rank = 3 if gr == CRITICAL_SERVICES else 2 if gr == NAMESPACES else 1 if gr == CRDS else 0
    return rank, str(ref)


__all__ = ["MAX_TIME", "STALL_WINDOW", "Cluster", "Hold", "Mark", "TeardownVerdict"]
