"""Stacks delivered by Flux's kustomize-controller (the real binary, v1.9.6) and torn down by Flux, on the real
control plane with the gate installed (tests/realcluster/flux.py: how it runs, and the source it reads).

What Flux does, read at the tags it is built from:
- Deleting a Kustomization (deletionPolicy MirrorPrune with prune: true, Delete, WaitForTermination) runs
  `finalize` before any source lookup: ssa ResourceManager.DeleteAll over status.inventory, one GET and one
  Background DELETE per object without precondition, every object tried even after a refusal, the errors
  joined; the finalizer stays and controller-runtime retries the whole pass on Flux's rate limiter
  (750 ms doubling to 15 min). Only objects with the Kustomization's owner labels are deleted.
  https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/internal/controller/kustomization_controller.go#L1225-L1307
  https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/manager_delete.go#L64-L120
  https://github.com/fluxcd/pkg/blob/runtime/v0.110.3/runtime/controller/rate_limiter.go#L28-L29
- The order is the reverse of the apply order: webhook configurations first, then the kinds Flux does
  not list (custom resources, Pods, NetworkPolicies...), Deployments, ConfigMaps, Namespaces, CRDs last.
  https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/sort.go#L36-L66
- WaitForTermination: once a pass has every DELETE accepted, it waits (2 s polls, spec.timeout) for the
  objects to be gone before removing the finalizer (#L1276-L1289).
- A reconcile that prunes objects removed from the source puts the refused ones back into the inventory
  (pruneSurvivors, since v1.9.0), marks Ready=False/PruneFailed and tries again at spec.retryInterval,
  without backoff (#L517-L526, #L1136-L1190, #L300-L311).

What a Flux user sees, checked here: every object goes, in the safe order (the Observer), with replay off
and on; while the gate refuses, the Kustomization stays (its finalizer `finalizers.fluxcd.io`) and Flux
records a Warning Event "pruning for deleted resource failed", or Ready=False PruneFailed for a prune; no
object of the inventory is left behind.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import yaml

from tests.backends import RealBackend
from tests.realcluster import build, examples, flux
from tests.realcluster.cluster import RealCluster
from tests.realcluster.flux import (
    FINALIZER,
    FLUX_NAMESPACE,
    OWNER_LABELS,
    ArtifactServer,
    FluxKustomization,
    KustomizationWatch,
    KustomizeController,
)
from tests.realcluster.teardown import Observer, RepeatingDeleter, Story, wait_for

pytestmark = pytest.mark.realcluster

EXAMPLE = "networkpolicies-outlive-pods.yaml"
TIMEOUT = 120

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def kustomize_controller(realcluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                         ) -> Iterator[tuple[KustomizeController, ArtifactServer]]:
    """kustomize-controller on the session's control plane, started once for the module, and the artifact server."""
    if build.cached_flux() is None and build.missing_toolchain() is not None:
        pytest.skip(build.missing_toolchain() or "")
    with flux.running(realcluster.plane, tmp_path_factory.mktemp("flux")) as running:
        yield running


@attrs.frozen
class Stack:
    """What one Kustomization delivers (file name -> YAML), its objects' paths, the order the gate promises,
    its CriticalServices, and the operator's roles (applied with kubectl, not delivered: a teardown never
    takes the gate's own grants away midway)."""

    story: Story
    files: dict[str, str]
    paths: dict[str, str]
    dependents: dict[str, list[str]]
    services: tuple[str, ...]
    roles: tuple[JSON, ...]

    @classmethod
    def make(cls, suffix: str, *, replay: bool, example: str | None = None) -> Stack:
        story = Story.make(suffix)
        docs = examples.delivered(story.objects, replay=replay)
        files = {"story.yaml": yaml.safe_dump_all(docs)}
        paths, dependents = story.paths(), story.dependents()
        roles = [yaml.safe_load(story.reader_role()), *examples.operator_roles(docs, f"flux-{suffix}")]
        if example is not None:
            example_docs = examples.documents(example)
            delivered = examples.delivered(example_docs, replay=replay)
            files[example] = yaml.safe_dump_all(delivered)
            docs += delivered
            planned = examples.plan(example)
            paths |= planned.paths
            for provider, needs in planned.dependents().items():
                dependents.setdefault(provider, []).extend(needs)
            roles += examples.operator_roles(example_docs, f"flux-{suffix}-example")
        services = tuple(d["metadata"]["name"] for d in docs if d["kind"] == "CriticalService")
        return cls(story, files, paths, dependents, services, tuple(roles))


@attrs.define
class Case:
    """One Kustomization of a test: its stack, how it is deleted, and what watches it during the teardown."""

    title: str
    stack: Stack
    kustomization: FluxKustomization
    deletion_policy: str | None = None
    observer: Observer | None = None
    watch: KustomizationWatch | None = None

    @classmethod
    def make(cls, realcluster: RealCluster, server: ArtifactServer, title: str, suffix: str, *, replay: bool,
             deletion_policy: str | None = None, example: str | None = None) -> Case:
        stack = Stack.make(suffix, replay=replay, example=example)
        return cls(title, stack, FluxKustomization(realcluster.admin, server, FLUX_NAMESPACE, f"stack-{suffix}"),
                   deletion_policy)

    @property
    def key(self) -> str:
        return f"Kustomization/{self.kustomization.name}"

    def start_watching(self, realcluster: RealCluster, *, with_kustomization: bool) -> None:
        paths = {**self.stack.paths, **({self.key: self.kustomization.path} if with_kustomization else {})}
        self.observer = Observer(realcluster.admin, paths, interval=0.0)
        self.watch = KustomizationWatch(self.kustomization)
        self.observer.start()
        self.watch.start()

    def stop_watching(self) -> None:
        for watcher in (self.observer, self.watch):
            if watcher is not None:
                watcher.stop()

    def left(self, realcluster: RealCluster) -> list[str]:
        return [k for k, p in self.stack.paths.items() if realcluster.admin.exists(p)]


@contextlib.contextmanager
def delivered_by_flux(realcluster: RealCluster, cases: list[Case]) -> Iterator[dict[str, str]]:
    """The operator's roles applied; each case's stack published as its GitRepository's artifact and applied
    by its Kustomization (prune: true) until Ready at that revision; every CriticalService Enforcing; each
    story's finalizer controller running. Yields each Kustomization's revision by name. Afterwards, whatever
    is left goes (after a failure), the roles last."""
    roles = [role for case in cases for role in case.stack.roles]
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    assert done.returncode == 0, done.stderr
    try:
        with contextlib.ExitStack() as controllers:
            for case in cases:
                controllers.enter_context(RealBackend(realcluster).finalizer_controller(case.stack.story))
            try:
                revisions = {}
                for case in cases:
                    case.kustomization.create_source()
                    revisions[case.kustomization.name] = case.kustomization.publish(case.stack.files)
                    case.kustomization.create(prune=True, deletion_policy=case.deletion_policy)
                wait_for(lambda: all(c.kustomization.ready(revisions[c.kustomization.name]) for c in cases),
                         timeout=TIMEOUT, interval=0.5,
                         what=f"every Kustomization Ready at {revisions}: {[c.kustomization.get() for c in cases]}")
                services = [s for case in cases for s in case.stack.services]
                wait_for(lambda: all(examples.enforcing(realcluster.admin, s) for s in services), timeout=TIMEOUT,
                         what=f"every CriticalService Enforcing: {services}")
                yield revisions
            finally:
                for case in cases:
                    case.stop_watching()
                    _clean_up(realcluster, case)
    finally:
        for role in roles:
            realcluster.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")


def _clean_up(realcluster: RealCluster, case: Case) -> None:
    """What a failed test leaves goes: the Kustomization without its finalizer, the stack deleted until gone."""
    for path in (case.kustomization.path, case.kustomization.source_path):
        if realcluster.admin.exists(path):
            realcluster.admin.merge_patch(path, {"metadata": {"finalizers": None}})
            realcluster.admin.delete(path)
    left = {k: p for k, p in case.stack.paths.items() if realcluster.admin.exists(p)}
    if left:
        RepeatingDeleter(realcluster.admin, left).run(timeout=120)


def _refusals(realcluster: RealCluster) -> float:
    return sum(g.metric("criticalsvc_decisions_total", operation="DELETE", result="denied")
               for g in realcluster.gate.replicas)


def _replays(realcluster: RealCluster) -> float:
    return sum(g.metric("criticalsvc_deletion_replays_total") for g in realcluster.gate.replicas)


def test_deleting_kustomizations_tears_their_stacks_down_in_order(
        realcluster: RealCluster, kustomize_controller: tuple[KustomizeController, ArtifactServer]) -> None:
    """Three Kustomizations (prune: true) deleted at once: the reference story and the NetworkPolicy example with
    deletionPolicy MirrorPrune (the default) and replay off; the story with MirrorPrune and replay on; the story
    with WaitForTermination. Flux's finalize is refused pass after pass while the gate holds the providers, each
    Kustomization keeps its finalizer meanwhile, and every stack goes in the safe order; nothing of an inventory
    is left. With WaitForTermination the Kustomization goes only after the last of its objects."""
    _, server = kustomize_controller
    run = uuid.uuid4().hex[:4]
    cases = [
        Case.make(realcluster, server, "MirrorPrune, replay off, with the NetworkPolicy example", f"fxd-off-{run}",
                  replay=False, deletion_policy="MirrorPrune", example=EXAMPLE),
        Case.make(realcluster, server, "MirrorPrune, replay on", f"fxd-on-{run}", replay=True,
                  deletion_policy="MirrorPrune"),
        Case.make(realcluster, server, "WaitForTermination, replay off", f"fxd-wait-{run}", replay=False,
                  deletion_policy="WaitForTermination"),
    ]
    with delivered_by_flux(realcluster, cases):
        for case in cases:
            k = case.kustomization
            inventory = k.inventory()
            assert len(inventory) == len(case.stack.paths), inventory
            labels = (realcluster.admin.get(case.stack.story.deployment_path) or {})["metadata"].get("labels") or {}
            assert [labels.get(label) for label in OWNER_LABELS] == [k.name, FLUX_NAMESPACE], labels
            assert (k.get() or {})["metadata"]["finalizers"] == [FINALIZER]
        refused, replays = _refusals(realcluster), _replays(realcluster)
        for case in cases:
            case.start_watching(realcluster, with_kustomization=True)
        started = time.monotonic()
        for case in cases:
            assert realcluster.admin.delete(case.kustomization.path).status_code == 200
        wait_for(lambda: not any(case.left(realcluster) or case.kustomization.get() for case in cases),
                 timeout=TIMEOUT, interval=0.5,
                 what=f"every stack and Kustomization gone: left {[c.left(realcluster) for c in cases]}")
        wait_for(lambda: all(c.observer is not None and set(c.stack.paths) | {c.key} <= set(c.observer.first_gone)
                             for c in cases), timeout=30, what="the observers' last round")
        for case in cases:
            case.stop_watching()
        took = time.monotonic() - started
        refused, replays = _refusals(realcluster) - refused, _replays(realcluster) - replays
        events = {case.key: case.kustomization.events() for case in cases}
    print(f"Flux, 3 Kustomizations deleted at once: all gone in {took:.1f} s; the gate refused {refused:.0f} "
          f"DELETEs, replayed {replays:.0f}")
    assert refused > 0, "the gate refused none of Flux's DELETEs: the stacks were not protected"
    assert replays > 0, "replay on for one stack, yet the gate replayed nothing"
    for case in cases:
        observer, watch = case.observer, case.watch
        assert observer is not None and watch is not None
        gone = (observer.gone_at[case.key] - started) if case.key in observer.gone_at else float("nan")
        warnings = [(e["reason"], e["message"], e.get("count")) for e in events[case.key] if e["type"] == "Warning"]
        deleting = [s for s in watch.snapshots if s.deleting]
        print(f"  {case.title}: Kustomization gone after {gone:.1f} s; order {observer.order()}; Warning events "
              f"{warnings}; Ready while deleting {sorted({(s.ready, s.reason) for s in deleting})}")
        assert observer.order_violations(case.stack.dependents) == [], observer.order()
        # What a Flux user sees while the gate refuses: the Kustomization stays (its finalizer), a Warning Event.
        assert deleting and all(s.finalizers == (FINALIZER,) for s in deleting), watch.snapshots
        assert "pruning for deleted resource failed" in {m for _, m, _ in warnings}, warnings
        if case.deletion_policy == "WaitForTermination":
            last = max(observer.first_gone[k] for k in case.stack.paths)
            assert observer.first_gone[case.key] > last, observer.order()


def test_removing_stacks_from_their_sources_prunes_them_in_order(
        realcluster: RealCluster, kustomize_controller: tuple[KustomizeController, ArtifactServer]) -> None:
    """Two Kustomizations, each with the story and a ConfigMap (replay off, with the NetworkPolicy example too;
    replay on); a new revision of each source keeps only the ConfigMap: Flux's reconcile prunes the story, the
    refused objects stay in the inventory (pruneSurvivors), Ready=False PruneFailed, retried at retryInterval
    until the story is gone in the safe order; then Ready=True at the new revision with only the ConfigMap in
    the inventory."""
    _, server = kustomize_controller
    run = uuid.uuid4().hex[:4]
    cases = [Case.make(realcluster, server, "replay off, with the NetworkPolicy example", f"fxp-off-{run}",
                       replay=False, example=EXAMPLE),
             Case.make(realcluster, server, "replay on", f"fxp-on-{run}", replay=True)]
    kept: dict[str, JSON] = {}
    for case in cases:
        name = f"kept-{case.kustomization.name}"
        kept[case.key] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
                          "data": {"kept": "yes"}}
        case.stack = attrs.evolve(case.stack, files={**case.stack.files, "kept.yaml": yaml.safe_dump(kept[case.key])})
    with delivered_by_flux(realcluster, cases):
        before = {case.key: case.kustomization.inventory() for case in cases}
        refused = _refusals(realcluster)
        for case in cases:
            case.start_watching(realcluster, with_kustomization=False)
        started = time.monotonic()
        revisions = {case.key: case.kustomization.publish({"kept.yaml": yaml.safe_dump(kept[case.key])})
                     for case in cases}
        wait_for(lambda: not any(case.left(realcluster) for case in cases), timeout=TIMEOUT, interval=0.5,
                 what=f"the stories pruned: left {[c.left(realcluster) for c in cases]}")
        took = time.monotonic() - started
        wait_for(lambda: all(c.observer is not None and set(c.stack.paths) <= set(c.observer.first_gone)
                             for c in cases), timeout=30, what="the observers' last round")
        wait_for(lambda: all(c.kustomization.ready(revisions[c.key]) for c in cases), timeout=TIMEOUT, interval=0.5,
                 what=f"Ready at {revisions}: {[c.kustomization.get() for c in cases]}")
        for case in cases:
            case.stop_watching()
        refused = _refusals(realcluster) - refused
        print(f"Flux, 2 stories pruned from their sources at once: gone in {took:.1f} s; the gate refused "
              f"{refused:.0f} DELETEs")
        assert refused > 0
        for case in cases:
            observer, watch, k = case.observer, case.watch, case.kustomization
            assert observer is not None and watch is not None
            failed = [s for s in watch.snapshots if s.reason == "PruneFailed"]
            print(f"  {case.title}: order {observer.order()}; {len(failed)} PruneFailed states, the first "
                  f"{failed[:1]}")
            assert observer.order_violations(case.stack.dependents) == [], observer.order()
            assert k.inventory() == [i for i in before[case.key] if "_kept-" in i], k.inventory()
            assert realcluster.admin.exists(f"/api/v1/namespaces/default/configmaps/kept-{k.name}")
            assert failed and all(s.ready == "False" for s in failed), watch.snapshots
            # pruneSurvivors: what the gate refused is still in the inventory while the prune fails.
            assert any(case.stack.story.name("finalizer-deployment") in i for i in failed[0].inventory), failed[0]
        for case in cases:
            assert realcluster.admin.delete(case.kustomization.path).status_code == 200
        configmaps = [f"/api/v1/namespaces/default/configmaps/kept-{c.kustomization.name}" for c in cases]
        wait_for(lambda: not any(realcluster.admin.exists(p) for p in [*configmaps, *(c.kustomization.path
                                                                                    for c in cases)]),
                 timeout=60, what="the kept ConfigMaps deleted with their Kustomizations")


def test_the_source_crds_come_from_the_pinned_source_controller_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """The source CRDs are read from source-controller v1.9.0 in the Go module cache, whose hash must be the one
    pinned in flux.py (nothing imports that module, so no go.sum line checks it): another hash is refused."""
    if build.missing_toolchain() is not None:
        pytest.skip(build.missing_toolchain() or "")
    assert flux.source_controller_dir().name == f"source-controller@{flux.SOURCE_CONTROLLER_VERSION}"
    monkeypatch.setattr(flux, "SOURCE_CONTROLLER_SUM", "h1:not-the-pinned-hash=")
    with pytest.raises(RuntimeError, match="not h1:not-the-pinned-hash="):
        flux.source_controller_dir()
