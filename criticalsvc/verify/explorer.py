"""The bounded model checker: every configuration, deleter, replay mode and interleaving within a bound.

For each configuration (criticalsvc/verify/configurations.py) the CriticalServices are created in order
through the real gate (the simulator's webhook runs `decision.decide` on each CREATE); a configuration
with a refused CREATE is not run (its admitted part is a configuration of its own). Every admitted one is
torn down by every deleter the project models (criticalsvc/sim/clients.py), replay off and on, along every
interleaving within the bound's depth (criticalsvc/verify/interleavings.py), each run judged by the
independent oracle (criticalsvc/verify/oracle.py). A violation is minimized (fewer CriticalServices, fewer
criteria, fewer objects, no label: each kept only if the same property still fails for the same deleter and
replay mode) and comes out as a bundle file `criticalsvc simulate -f` loads, with the command that replays it.

Deleters (DELETERS): `kubectl` (one pass in file order, no retry; the file order is the run's first choice
points, so every order a user may write is explored), `kubectl-repeat` (re-run every 30 s), `namespace`
(the bundle's namespaces and what lies outside them, retried; the namespace controller empties them),
`manifestwork` (the OCM agent's one sorted pass; the garbage collector retries what it was refused) and
`gc` (a ClusterRole owning everything is deleted; the garbage collector deletes the rest, retrying) and `flux`
(Flux's kustomize-controller finalizing a deleted Kustomization whose inventory is the bundle: every object each
pass in ssa's reverse apply order, the whole pass repeated on its rate limiter after a refusal; deletionPolicy
MirrorPrune, criticalsvc/sim/clients.py FluxKustomization) and `helm` (`helm uninstall` of a release that is the
bundle: one pass in Helm's uninstall order by kind, no retry, criticalsvc/sim/clients.py HelmUninstall) and `argocd`,
`argocd-background` (Argo CD finalizing a deleted Application whose managed objects are the bundle: the highest sync
wave at a time, nothing while any of them terminates, never a CRD; Foreground, or Background with the `/background`
finalizer; criticalsvc/sim/clients.py ArgoCDApplication). `argocd-background` is explored only when asked for
(`--deleter argocd-background`, EXTRA_DELETERS): it differs from `argocd` only in the propagation of its DELETEs, and
the pair doubled Argo CD's share of the CI bounds' time (about 11 s of CPU each over `ci`, `ci-pairs`, `ci-triples`).
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs

from ..api import GroupResource
from ..errors import MalformedManifest
from ..manifests import Manifest
from ..sim.cluster import Cluster
from ..sim.store import Store
from . import enforcement
from .configurations import (
    OBJECTS,
    Bound,
    Configuration,
    Service,
    bundle_yaml,
    configurations,
    critical_service,
    objects,
)
from .interleavings import ChoiceRandom, Path, paths, render
from .oracle import Oracle, Violation

DELETERS = ("kubectl", "kubectl-repeat", "namespace", "manifestwork", "gc", "flux", "helm", "argocd")
EXTRA_DELETERS = ("argocd-background",)  # explored only when named (module docstring)
REPEAT = 30.0  # kubectl-repeat: a person re-running `kubectl delete -f` every 30 s
CLIENT = {"kubectl": "kubectl", "kubectl-repeat": "kubectl", "namespace": "namespace", "manifestwork": "manifestwork",
          "gc": "gc-background", "flux": "flux", "helm": "helm", "argocd": "argocd",
          "argocd-background": "argocd-background"}


def inert_types(store: Store) -> Callable[[Any], bool]:
    """The partial-order reduction (criticalsvc/verify/interleavings.py): a resource type none of whose objects
    lives in a terminating namespace is a no-op in the namespace controller's pass, wherever it goes."""
    namespaces = GroupResource("", "namespaces")

    def inert(x: Any) -> bool:
        if not isinstance(x, GroupResource):
            return False
        # The store's indexed state, not store.list: that deep-copies every object, per type, per pass.
        terminating = [r.name for r in store.refs(namespaces)
                       if (n := store.state.get(r)) is not None and n.terminating]
        return not any(next(iter(store.refs(x, ns)), None) is not None for ns in terminating)
    return inert


def manifests(config: Configuration, *, deleter: str, replay: bool) -> list[dict[str, Any]]:
    owned = deleter == "gc"
    return [*objects(config, owned=owned),
            *(critical_service(config, i, replay=replay, owned=owned) for i in range(len(config.services)))]


@attrs.frozen
class Run:
    """One teardown: where it went and what the oracle said."""

    config: Configuration
    deleter: str
    replay: bool
    order: tuple[int, ...]  # the bundle's documents in file order (kubectl's choice points)
    choices: tuple[int, ...]  # the simulator's choices after the file order (`simulate --interleaving`)
    violations: tuple[Violation, ...]
    completed: bool
    trace: int = 0  # a hash of what the API server did, in order: equal for equivalent interleavings

    @property
    def properties(self) -> frozenset[str]:
        return frozenset(v.property for v in self.violations)


def admitted(config: Configuration, *, cluster_factory: Callable[..., Cluster] = Cluster) -> str | None:
    """None when every CREATE of `config` is admitted by the real gate (the factory's: none without one), else
    the refusal."""
    cluster = cluster_factory()
    cluster.load(_manifests(objects(config)))
    for i in range(len(config.services)):
        try:
            cluster.load(_manifests([critical_service(config, i, replay=False)], start=len(config.objects) + i))
        except MalformedManifest as exc:
            return str(exc)
    return None


def _manifests(docs: Sequence[dict[str, Any]], *, start: int = 0) -> list[Manifest]:
    return [Manifest(d, f"document {start + i + 1}") for i, d in enumerate(docs)]


def run_one(config: Configuration, path: Path, *, deleter: str, replay: bool,
            cluster_factory: Callable[..., Cluster] = Cluster) -> Run:
    """Tear `config` down once along `path`; the first choices order a kubectl bundle file."""
    docs = manifests(config, deleter=deleter, replay=replay)
    rng = ChoiceRandom(path)
    order = list(range(len(docs)))
    if deleter.startswith("kubectl"):
        rng.shuffle(order)  # the file order kubectl deletes in
    file_choices = len(path.taken)
    cluster = cluster_factory(rng=rng)
    rng.inert = inert_types(cluster.store)
    oracle = Oracle(cluster.store, config)
    cluster.load(_manifests([docs[i] for i in order]))
    enforcement.label(cluster)
    cluster.teardown(CLIENT[deleter], repeat=REPEAT if deleter == "kubectl-repeat" else None)
    verdict = cluster.run()
    refused = {r for c in cluster.clients for r in c.refused}
    oracle.judge(verdict, deleter=deleter, replay=replay, refused=refused)
    trace = hash(tuple((e.actor, e.verb, str(e.ref), e.outcome) for e in cluster.timeline.events))
    return Run(config, deleter, replay, tuple(order), tuple(path.taken[file_choices:]), tuple(oracle.violations),
               verdict.completed, trace)


@attrs.define
class Finding:
    """A violation, minimized: the smallest configuration and the first interleaving that still shows it."""

    first: Run  # as found
    minimal: Run  # as minimized

    @property
    def key(self) -> tuple[str, bool, str, str]:
        m = self.minimal
        return m.deleter, m.replay, ",".join(sorted(m.properties)), m.config.label()

    def command(self, path: str) -> str:
        m = self.minimal
        repeat = f" --repeat {REPEAT:g}" if m.deleter == "kubectl-repeat" else ""
        return f"criticalsvc simulate -f {path} --client {CLIENT[m.deleter]}{repeat} --interleaving {render(m.choices)}"

    def bundle(self, path: str) -> str:
        m = self.minimal
        docs = manifests(m.config, deleter=m.deleter, replay=m.replay)
        lines = [f"Found by `criticalsvc verify`: {m.config.label()}; deleter {m.deleter}, replay "
                 f"{'on' if m.replay else 'off'}.", f"Replay: {self.command(path)}", "What the oracle saw:",
                 *(f"  {v.property}: {_short(v.text)}" for v in m.violations)]
        return bundle_yaml([docs[i] for i in m.order], header="\n".join(lines))


def _short(text: str, limit: int = 150) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@attrs.define
class Report:
    bound: Bound
    deleters: tuple[str, ...] = DELETERS
    configurations: int = 0  # enumerated
    done: int = 0  # of which decided (refused, or every teardown run)
    refused: int = 0  # not admitted (a CREATE closed a cycle): not run
    inferred: int = 0  # of which refused because a smaller configuration inside them was (not simulated)
    runs: int = 0  # teardowns simulated (configuration x deleter x replay x interleaving)
    distinct: int = 0  # of the simulated ones, distinct traces (the store's event sequence), per family
    truncated: int = 0  # run families whose tree within the depth was cut at `limit`
    seconds: float = 0.0
    jobs: int = 1
    findings: dict[tuple[str, bool, str, str], Finding] = attrs.field(factory=dict)
    enforced: int = 0  # configurations whose leader's steps were explored (criticalsvc/verify/enforcement.py)
    enforcement_runs: int = 0
    enforcement_findings: list[enforcement.EnforcementRun] = attrs.field(factory=list)

    def summary(self) -> str:
        admitted = self.configurations - self.refused
        families = admitted * len(self.deleters) * 2
        return (f"bound: {self.bound.describe()}\n"
                f"{self.configurations} configurations enumerated, {self.refused} refused at CREATE "
                f"({self.inferred} of them inferred from a refused part), {admitted} admitted; {admitted} x "
                f"{len(self.deleters)} deleters x 2 replay modes = {families} teardown families; "
                f"{self.runs} interleavings run ({self.distinct} distinct traces"
                f"{f', {self.truncated} families cut at the limit' if self.truncated else ''}) "
                f"in {self.seconds:.1f} s on {self.jobs} process(es); "
                f"{len(self.findings)} distinct minimized violation(s)\n"
                f"enforcement: the leader's labelling and routing, with an API server lagging on webhook "
                f"configurations, explored for {self.enforced} configuration(s): {self.enforcement_runs} "
                f"interleavings; {len(self.enforcement_findings)} violating")

    def add(self, one: _One) -> None:
        self.runs += one.runs
        self.distinct += one.distinct
        self.truncated += one.truncated
        for finding in one.findings:
            self.findings.setdefault(finding.key, finding)
        self.enforced += one.enforced
        self.enforcement_runs += one.enforcement_runs
        self.enforcement_findings.extend(one.enforcement_findings)


def family(config: Configuration, *, deleter: str, replay: bool, depth: int, limit: int | None = None,
           cluster_factory: Callable[..., Cluster] = Cluster) -> Iterator[Run]:
    """Every interleaving within `depth` of one (configuration, deleter, replay)."""
    for _path, result in paths(lambda p: run_one(config, p, deleter=deleter, replay=replay,
                                                 cluster_factory=cluster_factory), depth=depth, limit=limit):
        yield result


@attrs.define
class _One:
    """What one configuration's teardowns came to (a worker's answer)."""

    refusal: str | None = None
    runs: int = 0
    distinct: int = 0
    truncated: int = 0
    findings: list[Finding] = attrs.field(factory=list)
    enforced: int = 0
    enforcement_runs: int = 0
    enforcement_findings: list[enforcement.EnforcementRun] = attrs.field(factory=list)


def explore_one(config: Configuration, *, depth: int, limit: int | None = 5000, deleters: Sequence[str] = DELETERS,
                cluster_factory: Callable[..., Cluster] = Cluster,
                admission: Callable[[Configuration], str | None] | None = None, enforce: bool = False) -> _One:
    """Admit `config` through the gate and, if admitted, tear it down every way within `depth`; with `enforce`,
    explore the leader's steps that make it enforced too (criticalsvc/verify/enforcement.py)."""
    admission = admission or _Admission(cluster_factory)
    one = _One(refusal=admission(config))
    if one.refusal is not None:
        return one
    if enforce:
        explored = enforcement.explore_one(config, limit=limit, cluster_factory=cluster_factory)
        one.enforced, one.enforcement_runs, one.enforcement_findings = 1, explored.runs, explored.findings
    for deleter in deleters:
        for replay in (False, True):
            traces: set[int] = set()
            n = 0
            for r in family(config, deleter=deleter, replay=replay, depth=depth, limit=limit,
                            cluster_factory=cluster_factory):
                n += 1
                traces.add(r.trace)
                if r.violations:
                    minimal = minimize(r, depth=depth, cluster_factory=cluster_factory, admission=admission)
                    one.findings.append(Finding(r, minimal))
                    break  # one violating interleaving per family is enough: it is minimized next
            one.runs += n
            one.distinct += len(traces)
            one.truncated += limit is not None and n >= limit
    return one


# A worker's arguments (multiprocessing): set once per process by _init, read by _work.
_WORKER: dict[str, Any] = {}


def _init(depth: int, limit: int | None, deleters: Sequence[str], cluster_factory: Callable[..., Cluster]) -> None:
    _WORKER.update(depth=depth, limit=limit, deleters=tuple(deleters), cluster_factory=cluster_factory,
                   admission=_Admission(cluster_factory))


def _work(item: tuple[Configuration, bool]) -> tuple[Configuration, _One]:
    config, enforce = item
    return config, explore_one(config, enforce=enforce, **_WORKER)


def _parts(config: Configuration) -> Iterator[Configuration]:
    """The configurations one CriticalService smaller (each a multiset, in canonical order)."""
    s = config.services
    for i in range(len(s)):
        if i == 0 or s[i] != s[i - 1]:
            yield attrs.evolve(config, services=s[:i] + s[i + 1:])


def explore(bound: Bound, *, limit: int | None = 5000, deleters: Sequence[str] = DELETERS,
            cluster_factory: Callable[..., Cluster] = Cluster,
            only: Callable[[Configuration], bool] = lambda _c: True,
            progress: Callable[[Report], None] | None = None, jobs: int = 1) -> Report:
    """The whole search; `limit` caps the interleavings of one family (reported when reached).

    Configurations go level by level (1 CriticalService, then 2, ...), each level's across `jobs` processes
    (the runs are independent: each builds its own simulated cluster; `cluster_factory` must then pickle).
    **The admission reduction**: a configuration containing a configuration one CriticalService smaller that
    was refused is refused without a simulation. The cycle check refuses exactly a CREATE that closes a cycle
    (graph.check_no_cycle), a cycle among some CriticalServices is one among any set containing them, and in
    whatever order the larger set is created, the CREATE that closes its last edge is refused."""
    report = Report(bound, deleters=tuple(deleters), jobs=jobs)
    started = time.monotonic()
    levels: dict[tuple[bool, int], list[Configuration]] = {}
    for config in configurations(bound):
        if only(config):
            levels.setdefault((config.protected, len(config.services)), []).append(config)
    refused: set[Configuration] = set()
    enforced = _enforced(bound, levels, _Admission(cluster_factory))
    pool = multiprocessing.get_context("fork").Pool(
        jobs, _init, (bound.depth, limit, tuple(deleters), cluster_factory)) if jobs > 1 else None
    try:
        _init(bound.depth, limit, deleters, cluster_factory)
        for key in sorted(levels):
            todo = []
            for config in levels[key]:
                report.configurations += 1
                if any(part in refused for part in _parts(config)):
                    refused.add(config)
                    report.refused += 1
                    report.inferred += 1
                    report.done += 1
                else:
                    todo.append((config, config in enforced))
            answers = pool.imap_unordered(_work, todo, chunksize=4) if pool is not None else map(_work, todo)
            for config, one in answers:
                if one.refusal is not None:
                    refused.add(config)
                    report.refused += 1
                report.done += 1
                report.add(one)
                if progress is not None:
                    progress(report)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    # Enumeration order (the configuration found in, then the deleter, then replay), whatever the workers' timing.
    rank = {config: i for i, config in enumerate(c for key in sorted(levels) for c in levels[key])}
    report.findings = dict(sorted(report.findings.items(), key=lambda kv: (
        rank.get(kv[1].first.config, -1), list(deleters).index(kv[1].first.deleter), kv[1].first.replay)))
    report.seconds = time.monotonic() - started
    return report


def _enforced(bound: Bound, levels: dict[tuple[bool, int], list[Configuration]],
              admission: Callable[[Configuration], str | None]) -> set[Configuration]:
    """The configurations whose leader's steps are explored (Bound.enforcement): with `providers`, the first admitted
    one of each provider (and deletion-protected label), of one CriticalService. What the leader labels and routes,
    and what status says, depend on the providers alone; the criteria decide only what the gate refuses, which the
    teardowns explore for every configuration. Two CriticalServices take `all`: their labels interleave (a
    Deployment's and a Widget's, 5 objects, pass 20,000 interleavings)."""
    every = [c for key in sorted(levels) for c in levels[key]]
    if bound.enforcement == "all":
        return set(every)
    out: dict[tuple[Any, ...], Configuration] = {}
    if bound.enforcement == "providers":
        for config in (c for c in every if len(c.services) == 1):
            key = (config.services[0].provider, config.protected)
            if key not in out and admission(config) is None:
                out[key] = config
    return set(out.values())


class _Admission:
    """`admitted`, remembered for one search: minimization asks again about the same smaller configurations."""

    def __init__(self, cluster_factory: Callable[..., Cluster]) -> None:
        self.cluster_factory = cluster_factory
        self._seen: dict[Configuration, str | None] = {}

    def __call__(self, config: Configuration) -> str | None:
        if config not in self._seen:
            self._seen[config] = admitted(config, cluster_factory=self.cluster_factory)
        return self._seen[config]


def _smaller(config: Configuration) -> Iterator[Configuration]:
    """One step smaller: a CriticalService, a criterion, the label or an object less."""
    s = config.services
    for i in range(len(s)):
        if len(s) > 1:
            yield attrs.evolve(config, services=s[:i] + s[i + 1:])
        if len(s[i].criteria) > 1:
            for j in range(len(s[i].criteria)):
                fewer = Service(s[i].provider, s[i].criteria[:j] + s[i].criteria[j + 1:])
                yield attrs.evolve(config, services=(*s[:i], fewer, *s[i + 1:]))
    if config.protected:
        yield attrs.evolve(config, protected=False)
    for key in config.objects:
        if key not in ("ns-a", "ns-b") and not (key == "crd" and "widget" in config.objects):
            yield attrs.evolve(config, objects=tuple(k for k in config.objects if k != key))


def minimize(found: Run, *, depth: int, cluster_factory: Callable[..., Cluster] = Cluster,
             admission: Callable[[Configuration], str | None] = admitted) -> Run:
    """Greedy minimization: take any one-step-smaller admitted configuration that still violates the same
    properties under the same deleter and replay mode (within `depth`), until none does."""
    current = found
    progress = True
    while progress:
        progress = False
        for smaller in _smaller(current.config):
            if admission(smaller) is not None:
                continue
            for r in family(smaller, deleter=found.deleter, replay=found.replay, depth=depth, limit=200,
                            cluster_factory=cluster_factory):
                subjects = {v.subject for v in r.violations}
                if r.properties >= found.properties and subjects <= {v.subject for v in current.violations}:
                    current, progress = r, True
                    break
            if progress:
                break
    return current


__all__ = ["DELETERS", "EXTRA_DELETERS", "OBJECTS", "Finding", "Report", "Run", "admitted", "explore", "explore_one",
           "family", "minimize", "run_one"]
