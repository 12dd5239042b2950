"""How a CriticalService becomes enforced, explored: the leader's labelling and routing interleaved, with an API
server whose webhook configuration lags (design/routing.md, "No window, on every API server").

The teardown families (criticalsvc/verify/explorer.py) start from CriticalServices already enforced: the leader's
labels stored (`label`), the simulator routing each other request by the CriticalServices stored at that instant
(sim/webhooks.py ProviderRoutesRule). This model starts one step earlier, at each CriticalService's CREATE, and runs
the leader's loops as steps of their own, each step the pure function the live loop calls:

* the labeller (criticalsvc/labeller.py): protectionlabels.wanted and to_add on the store's state, then one merge
  patch per object (protectionlabels.merge_patch), sent through admission as the leader's PATCH is;
* the router (criticalsvc/webhookrouter.py): routing.desired with protectionlabels.carried_in (the shipped
  configuration routes the labels), stored as a new version of criticalsvc-providers when it changed; what was seen
  live narrows with it at once, as WebhookRouter.sync narrows it;
* the router's probe: answered by the API server holding the newest version, or by the lagging one holding any
  older version (the routes it proves are those that version and the newest share, as WebhookRouter.probe counts
  them; version 0, nothing written yet, lets the probe through: nothing proven). The lagging API server answers at
  most one probe per run, so every run ends;
* status (criticalsvc/status.py compute_status), recomputed after every step as the status writer does on every
  change the leader reports.

A deleter's requests are asked after every step, as dry runs: they change nothing, so asking them all after each
step is every place a deleter's step could take among the leader's (a DELETE admitted for real before any Ready
claimed protection is no violation, and one after it is already one).

The choice points (criticalsvc/verify/interleavings.py `pick`) are which loop moves next, which object the
labeller's next PATCH commits for, and which API server answers a probe; every path is explored (a run has a few
dozen points at most). After each step the oracle (criticalsvc/verify/oracle.py EnforcementOracle) asks about every
DELETE a CriticalService forbids, and every UPDATE removing the gate's label, as dry runs through every version of
criticalsvc-providers written so far: an API server lagging on webhook configurations may hold any of them, and its
configuration informer applies them in order (design/routing.md, point 4). Each reaches the real gate
(decision.decide) when the shipped webhooks (deploy/base/webhook.yaml, sim/webhooks.py DEFAULT_RULES) or that
version route it, their objectSelectors matched on the stored object as kube-apiserver matches them
(sim/webhooks.py `selects`: predicates/object/matcher.go at v1.37.2).

Not modelled, and said in design/routing.md: the provider created, re-created or deleted after its CriticalService
(the catalogue exists first); CriticalServices deleted (the labeller's `stale` removal); a shipped configuration
without the label webhooks (the upgrade, issue 34's deliverable 4, and a downgrade); the gate's own caches lagging
the store (the sim's webhook reads the store); RBAC (the stand-in grants every PATCH, so `EnforcingByRoute` never
arises); and leader changes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import attrs

from .. import protectionlabels, routing
from ..api import PROTECTED_LABEL, ObjectRef
from ..manifests import Manifest
from ..sim.apiserver.patches import merge_patch
from ..sim.cluster import Cluster
from ..sim.store import StatusError
from ..sim.webhooks import DEFAULT_RULES, WrittenRoutesRule
from ..status import compute_status
from .configurations import Configuration, critical_service, objects
from .interleavings import Path, paths, pick, render
from .oracle import EnforcementOracle, Violation

LEADER = "system:serviceaccount:criticalsvc-system:criticalsvc"
ADMIN = "kubernetes-admin"
# A run's steps: the labeller's PATCHes (at most 4 objects per CriticalService in the catalogue), the router's
# writes and probes. Far above what a run takes; reaching it means the leader's loops never settle.
MAX_STEPS = 64
# Every path (a run meets fewer choice points than this).
DEPTH = MAX_STEPS


@attrs.frozen
class EnforcementRun:
    """One interleaving of the leader's steps, and what the oracle said."""

    config: Configuration
    choices: tuple[int, ...]
    steps: tuple[str, ...]
    violations: tuple[Violation, ...]

    @property
    def properties(self) -> frozenset[str]:
        return frozenset(v.property for v in self.violations)

    def describe(self) -> str:
        """The path as `criticalsvc verify` prints it: the steps taken, in order."""
        return f"leader's steps (choices {render(self.choices)}): " + "; ".join(self.steps or ("none",))


class Model:
    """The simulated store with the gate, the leader's state, and the versions of criticalsvc-providers written.

    Built once per configuration (the CREATEs through the gate cost more than a run's steps); `reset` puts the store
    back as the CREATEs left it before each run, and the answers of the gate (to a request, on an object with given
    labels, through given routes) and of status (in a given state) are kept across runs: nothing else differs."""

    def __init__(self, config: Configuration, *, cluster_factory: Callable[..., Cluster] = Cluster) -> None:
        self.config = config
        self.cluster = cluster_factory(replayer=None)
        self.store = self.cluster.store
        self.state = self.store.state
        self.history: list[frozenset[routing.Route]] = [frozenset()]
        self.serve(0)
        self.cluster.load(Manifest(d, f"document {n + 1}") for n, d in enumerate(objects(config)))
        for i in range(len(config.services)):
            self.store.create(critical_service(config, i, replay=False), user=ADMIN)
        self._initial = {r: self.store.get(r.group_resource, r.namespace, r.name) for r in self.store.refs()}
        self.oracle = EnforcementOracle(self.store, config)
        self._answers: dict[tuple[Any, ...], bool] = {}
        self._ready: dict[tuple[Any, ...], list[str]] = {}
        self.reset(Path())

    def reset(self, path: Path) -> None:
        """Before a run along `path`: the objects as the CREATEs left them, nothing written, nothing seen live."""
        self.path = path
        self.history = [frozenset()]  # version 0: criticalsvc-providers not written
        self.written = 0  # the newest version
        self.live: frozenset[routing.Route] = frozenset()
        self.needs: dict[routing.RouteKey, frozenset[routing.Route]] = {}
        self.lagging_answered = False
        self.label_errors: dict[ObjectRef, str] = {}
        webhooks, self.store.webhooks = self.store.webhooks, []  # putting back is no request anyone sends
        try:
            for ref, obj in self._initial.items():
                now = self.store.get(ref.group_resource, ref.namespace, ref.name)
                labels = obj["metadata"].get("labels") if obj is not None else None
                if now is not None and now["metadata"].get("labels") != labels:
                    self.store.update({**now, "metadata": {**now["metadata"], "labels": labels}})
        finally:
            self.store.webhooks = webhooks
        self.serve(0)
        self.oracle.reset()

    # --- the API servers ------------------------------------------------------------------------------
    def serve(self, version: int) -> None:
        """Requests from now on meet an API server holding `version` of criticalsvc-providers."""
        for webhook in self.store.webhooks:
            webhook.rules = (*DEFAULT_RULES, WrittenRoutesRule(self.history[version]))

    def where(self, version: int) -> str:
        if version == 0:
            return "an API server that has read no criticalsvc-providers yet"
        routes = ", ".join(sorted(str(r) for r in self.history[version])) or "no route"
        newest = " (the newest)" if version == self.written else ""
        return f"an API server holding criticalsvc-providers version {version}{newest} ({routes})"

    def admitted(self, verb: str, ref: ObjectRef) -> list[str]:
        """A dry-run DELETE of `ref` (verb DELETE), or UPDATE removing the gate's label (UNLABEL), sent to an API server
        holding each distinct version written so far: where it was admitted."""
        out = []
        seen: set[frozenset[routing.Route]] = set()
        for version in range(len(self.history)):
            routes = self.history[version]
            if routes in seen:
                continue
            seen.add(routes)
            obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
            if obj is None:
                continue
            key = (verb, ref, tuple(sorted((obj["metadata"].get("labels") or {}).items())), routes)
            if key not in self._answers:
                self.serve(version)
                try:
                    if verb == "DELETE":
                        self.store.delete(ref, user=ADMIN, dry_run=True)
                    else:
                        self.store.update(merge_patch(obj, {"metadata": {"labels": {PROTECTED_LABEL: None}}}),
                                          user=ADMIN, dry_run=True)
                    self._answers[key] = True
                except StatusError:
                    self._answers[key] = False
                finally:
                    self.serve(self.written)
            if self._answers[key]:
                out.append(self.where(version))
        return out

    # --- the leader -----------------------------------------------------------------------------------
    def desired(self) -> routing.Desired:
        return routing.desired(self.state.critical_services(), self.state.mapper.lookup,
                               protectionlabels.carried_in(self.state))

    def to_label(self) -> list[tuple[ObjectRef, frozenset[str]]]:
        want = protectionlabels.wanted(self.state.critical_services(), self.state)
        return sorted(((r, a) for r, a in protectionlabels.to_add(want, self.state).items()
                       if r not in self.label_errors), key=lambda item: protectionlabels.order_key(item[0]))

    def enabled(self) -> list[str]:
        out = []
        if self.to_label():
            out.append("labeller")
        if self.desired().routes != self.history[self.written]:
            out.append("router")
        if self.written and not self.history[self.written] <= self.live:
            out.append("probe")
        return out

    def labeller(self) -> str:
        ref, add = pick(self.path, self.to_label())
        obj = self.store.get(ref.group_resource, ref.namespace, ref.name)
        assert obj is not None  # to_add lists only what exists
        try:
            self.store.update(merge_patch(obj, protectionlabels.merge_patch(add=add)), user=LEADER)
        except StatusError as exc:
            self.label_errors[ref] = exc.message
            return f"the labeller's PATCH of {ref} refused: {exc.message}"
        return f"the labeller labels {ref}"

    def router(self) -> str:
        wanted = self.desired()
        self.history.append(wanted.routes)
        self.written = len(self.history) - 1
        self.needs = dict(wanted.needs)
        self.live &= wanted.routes  # narrowing is immediate; widening waits for the probe
        self.serve(self.written)
        return f"the router writes version {self.written}"

    def probe(self) -> str:
        # An older version routing what the newest does answers as the newest would; of equal ones, the first.
        older = {} if self.lagging_answered else {self.history[v]: v for v in reversed(range(self.written))}
        older.pop(self.history[self.written], None)
        versions = [self.written, *sorted(older.values())]
        version = pick(self.path, versions)
        if version != self.written:
            self.lagging_answered = True
        if version:
            self.live = self.history[version] & self.history[self.written]
        return f"the probe is answered by {self.where(version)}"

    def ready(self) -> list[str]:
        key = self.signature()
        if key not in self._ready:
            self._ready[key] = self._compute_ready()
        return self._ready[key]

    def _compute_ready(self) -> list[str]:
        facts = routing.Routing(managed=True, needs=self.needs, written=self.history[self.written], live=self.live,
                                labelled=True)
        by_name = {cs.name: cs for cs in self.state.critical_services()}
        out = []
        for i in range(len(self.config.services)):
            status = compute_status(by_name[f"cs{i}"], self.state, now=0.0, routing=facts,
                                    lookup=self.state.mapper.lookup, label_errors=self.label_errors)
            out.append(next(str(c["reason"]) for c in status["conditions"] if c["type"] == "Ready"))
        return out


    def signature(self) -> tuple[Any, ...]:
        """All a step and the oracle read that steps change: the labels still to write, the versions written and the
        newest, what was seen live, whether the lagging API server answered."""
        # The versions as a set of route sets: a lagging probe reads which routes some version holds, not when; once
        # the lagging API server has answered, only the newest counts. (Requests meet every version, but version 0,
        # routing nothing, admits whatever a later one does: the older versions change no verdict.)
        older = frozenset() if self.lagging_answered else frozenset(self.history)
        return (tuple(self.to_label()), older, self.history[self.written], self.live, self.lagging_answered,
                tuple(sorted(self.label_errors, key=protectionlabels.order_key)))


def label(cluster: Cluster) -> int:
    """Store the labels the leader writes once the CriticalServices are created (the state Ready=Enforcing stands
    on); the number written. Without admission: that the gate admits its own label writes is what `Model.labeller`
    checks, every way; a teardown needs only their outcome (and would pay a gate call per write)."""
    state, written = cluster.store.state, 0
    missing = protectionlabels.to_add(protectionlabels.wanted(state.critical_services(), state), state)
    webhooks, cluster.store.webhooks = cluster.store.webhooks, []
    try:
        for ref, add in sorted(missing.items(), key=lambda item: protectionlabels.order_key(item[0])):
            obj = cluster.store.get(ref.group_resource, ref.namespace, ref.name)
            if obj is not None:
                cluster.store.update(merge_patch(obj, protectionlabels.merge_patch(add=add)), user=LEADER)
                written += 1
    finally:
        cluster.store.webhooks = webhooks
    return written


def run_one(config: Configuration, path: Path, *, cluster_factory: Callable[..., Cluster] = Cluster,
            model: Model | None = None, seen: dict[tuple[Any, ...], tuple[int, ...]] | None = None) -> EnforcementRun:
    """The CriticalServices of `config` created, then the leader's steps along `path` until none is left to take.

    `seen`: the states earlier runs of the same search reached, each with the choices that first reached it; a run
    that reaches one by other choices stops there. Sound for the depth-first search of `explore_one`: the choices
    open at a state, and the oracle's verdicts, depend on the state alone, and every continuation from a state is
    enumerated (by the runs replaying the choices that first reached it) before the search returns to a choice made
    before it, so a state met again has had every continuation judged."""
    model = model or Model(config, cluster_factory=cluster_factory)
    model.reset(path)
    steps: list[str] = []
    model.oracle.judge_step(ready=model.ready(), admitted=model.admitted, after="the CREATE")
    for _ in range(MAX_STEPS):
        actors = model.enabled()
        if not actors:
            break
        step = getattr(model, pick(path, actors))()
        steps.append(step)
        if seen is not None:
            state, prefix = model.signature(), tuple(path.taken)
            if seen.setdefault(state, prefix) != prefix:  # reached before by other choices (a replay takes the same)
                return EnforcementRun(config, prefix, tuple(steps), tuple(model.oracle.violations))
        model.oracle.judge_step(ready=model.ready(), admitted=model.admitted, after=step)
    else:
        raise RuntimeError(f"{config.label()}: the leader's loops did not settle within {MAX_STEPS} steps: "
                           f"{'; '.join(steps[-4:])}")
    model.oracle.judge_end(ready=model.ready())
    return EnforcementRun(config, tuple(path.taken), tuple(steps), tuple(model.oracle.violations))


@attrs.define
class Explored:
    """What one configuration's enforcement runs came to."""

    runs: int = 0
    findings: list[EnforcementRun] = attrs.field(factory=list)


def explore_one(config: Configuration, *, limit: int | None = None,
                cluster_factory: Callable[..., Cluster] = Cluster) -> Explored:
    """Every interleaving of the leader's steps for `config` (admitted); the first violating one is kept."""
    out = Explored()
    seen: dict[tuple[Any, ...], tuple[int, ...]] = {}
    model = Model(config, cluster_factory=cluster_factory)
    for _path, run in paths(lambda p: run_one(config, p, model=model, seen=seen), depth=DEPTH, limit=limit):
        out.runs += 1
        if run.violations:
            out.findings.append(run)
            break
    return out


def manifests(config: Configuration) -> list[dict[str, Any]]:
    """The bundle of a finding: the catalogue objects, then the CriticalServices in CREATE order."""
    return [*objects(config), *(copy.deepcopy(critical_service(config, i, replay=False))
                                for i in range(len(config.services)))]


__all__ = ["EnforcementRun", "Explored", "Model", "explore_one", "manifests", "run_one"]

