"""Stacks delivered by Flux's kustomize-controller (the real binary, v1.9.6) and torn down by Flux, on the real
control plane with the gate installed (tests/realcluster/flux.py: how it runs, and the source it reads).

What Flux does, read at the tags it is built from:
- Deleting a Kustomization (deletionPolicy MirrorPrune with prune: true, Delete, WaitForTermination) runs
  `finalize` before any source lookup: ssa ResourceManager.DeleteAll over status.inventory, one GET and one
  Background DELETE per object without precondition, every object tried even after a refusal, the errors
  joined; the finalizer stays and controller-runtime retries the whole pass on Flux's rate limiter
  (750 ms doubling to 15 min). Only objects with the Kustomization's owner labels are deleted.
  https://github.com/fluxcd/kustomize-controller/blob/v1.9.6/internal/controller/kustomization_controller.go#L1225-L1307
  https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/manager_delete.go#L62-L120
  https://github.com/fluxcd/pkg/blob/runtime/v0.110.3/runtime/controller/rate_limiter.go#L28-L29
- The order is the reverse of the apply order: webhook configurations first, then the kinds Flux does
  not list (custom resources, Pods, NetworkPolicies...), Deployments, ConfigMaps, Namespaces, CRDs last.
  https://github.com/fluxcd/pkg/blob/ssa/v0.76.2/ssa/sort.go#L34-L64
- WaitForTermination: once a pass has every DELETE accepted, it waits (2 s polls, spec.timeout) for the
  objects to be gone before removing the finalizer (#L1283-L1296).
- A reconcile that prunes objects removed from the source puts the refused ones back into the inventory
  (pruneSurvivors, since v1.9.0), marks Ready=False/PruneFailed and tries again at spec.retryInterval,
  without backoff (#L514-L525, #L1136-L1190, #L300-L311).

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


@contextlib.contextmanager
def delivered_by_flux(realcluster: RealCluster, kustomization: FluxKustomization, stack: Stack, *,
                      deletion_policy: str | None = None) -> Iterator[str]:
    """The operator's roles applied, the stack published as the GitRepository's artifact and applied by a
    Kustomization (prune: true) until Ready at that revision, every CriticalService Enforcing, and the story's
    finalizer controller running; yields the revision. Afterwards, whatever is left goes (after a failure)."""
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(stack.roles))
    assert done.returncode == 0, done.stderr
    try:
        with RealBackend(realcluster).finalizer_controller(stack.story):
            kustomization.create_source()
            revision = kustomization.publish(stack.files)
            kustomization.create(prune=True, deletion_policy=deletion_policy)
            wait_for(lambda: kustomization.ready(revision), timeout=TIMEOUT, interval=0.5,
                     what=f"Kustomization {kustomization.name} Ready at {revision}: {kustomization.get()}")
            wait_for(lambda: all(examples.enforcing(realcluster.admin, s) for s in stack.services), timeout=TIMEOUT,
                     what=f"every CriticalService Enforcing: {stack.services}")
            yield revision
    finally:
        _clean_up(realcluster, kustomization, stack)


def _clean_up(realcluster: RealCluster, kustomization: FluxKustomization, stack: Stack) -> None:
    for path in (kustomization.path, kustomization.source_path):
        if realcluster.admin.exists(path):
            realcluster.admin.merge_patch(path, {"metadata": {"finalizers": None}})
            realcluster.admin.delete(path)
    left = {k: p for k, p in stack.paths.items() if realcluster.admin.exists(p)}
    if left:
        with RealBackend(realcluster).finalizer_controller(stack.story):
            RepeatingDeleter(realcluster.admin, left).run(timeout=120)
    for role in stack.roles:
        realcluster.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")


def _refusals(realcluster: RealCluster) -> float:
    return sum(g.metric("criticalsvc_decisions_total", operation="DELETE", result="denied")
               for g in realcluster.gate.replicas)


def _replays(realcluster: RealCluster) -> float:
    return sum(g.metric("criticalsvc_deletion_replays_total") for g in realcluster.gate.replicas)


def _gone_in_order(realcluster: RealCluster, observer: Observer, stack: Stack, watch: KustomizationWatch,
                   kustomization_key: str) -> None:
    """Wait until the stack and its Kustomization are gone; the order is the gate's."""
    every = [*stack.paths.values(), watch.kustomization.path]
    try:
        wait_for(lambda: not any(realcluster.admin.exists(p) for p in every), timeout=TIMEOUT, interval=0.5,
                 what=f"the stack gone: left {[k for k, p in stack.paths.items() if realcluster.admin.exists(p)]}, "
                      f"the Kustomization {watch.kustomization.get()}")
        wait_for(lambda: set(stack.paths) | {kustomization_key} <= set(observer.first_gone), timeout=30,
                 what="the observer's last round")
    finally:
        observer.stop()
        watch.stop()
    assert observer.order_violations(stack.dependents) == [], observer.order()


@pytest.mark.parametrize("replay", [False, True], ids=["replay-off", "replay-on"])
def test_deleting_the_kustomization_tears_the_stack_down_in_order(
        realcluster: RealCluster, kustomize_controller: tuple[KustomizeController, ArtifactServer],
        replay: bool) -> None:
    """The reference story and the NetworkPolicy example in one Kustomization (prune: true, deletionPolicy
    MirrorPrune, the default), deleted: Flux's finalize is refused pass after pass while the gate holds the
    providers, and finishes in the safe order; nothing of its inventory is left."""
    _, server = kustomize_controller
    mode = "on" if replay else "off"
    suffix = f"fxd{mode}-{uuid.uuid4().hex[:4]}"
    stack = Stack.make(suffix, replay=replay, example=EXAMPLE)
    kustomization = FluxKustomization(realcluster.admin, server, FLUX_NAMESPACE, f"stack-{suffix}")
    key = f"Kustomization/{kustomization.name}"
    with delivered_by_flux(realcluster, kustomization, stack, deletion_policy="MirrorPrune"):
        inventory = kustomization.inventory()
        assert len(inventory) == len(stack.paths), inventory
        deployment = realcluster.admin.get(stack.story.deployment_path) or {}
        labels = deployment["metadata"].get("labels") or {}
        assert [labels.get(label) for label in OWNER_LABELS] == [kustomization.name, FLUX_NAMESPACE], labels
        assert (kustomization.get() or {})["metadata"]["finalizers"] == [FINALIZER]
        refused, replays = _refusals(realcluster), _replays(realcluster)
        observer = Observer(realcluster.admin, {**stack.paths, key: kustomization.path}, interval=0.0)
        watch = KustomizationWatch(kustomization)
        observer.start()
        watch.start()
        started = time.monotonic()
        assert realcluster.admin.delete(kustomization.path).status_code == 200
        _gone_in_order(realcluster, observer, stack, watch, key)
        took = time.monotonic() - started
        refused, replays = _refusals(realcluster) - refused, _replays(realcluster) - replays
        events = kustomization.events()
    reasons = [(e["type"], e["reason"], e["message"][:80]) for e in events]
    print(f"Flux, Kustomization deleted (MirrorPrune), replay {mode}: all gone in {took:.1f} s; the gate refused "
          f"{refused:.0f} DELETEs, replayed {replays:.0f}; order {observer.order()}; events {reasons}")
    assert refused > 0, "the gate refused none of Flux's DELETEs: the stack was not protected"
    deleting = [s for s in watch.snapshots if s.deleting]
    assert deleting and all(s.finalizers == (FINALIZER,) for s in deleting), watch.snapshots
    assert ("Warning", "pruning for deleted resource failed") in {(t, m) for t, _, m in reasons}, reasons
    # Everything was gone before the Kustomization but what was still terminating when Flux's last pass had
    # every DELETE accepted (MirrorPrune does not wait).
    if replay:
        assert replays > 0, "replay on, yet the gate replayed nothing"


def test_wait_for_termination_keeps_the_kustomization_until_everything_is_gone(
        realcluster: RealCluster, kustomize_controller: tuple[KustomizeController, ArtifactServer]) -> None:
    """deletionPolicy WaitForTermination: the same refusals, and the Kustomization goes only once every object
    of its inventory is gone (Flux waits for the last pass's objects to terminate)."""
    _, server = kustomize_controller
    suffix = f"fxw-{uuid.uuid4().hex[:4]}"
    stack = Stack.make(suffix, replay=False)
    kustomization = FluxKustomization(realcluster.admin, server, FLUX_NAMESPACE, f"stack-{suffix}")
    key = f"Kustomization/{kustomization.name}"
    with delivered_by_flux(realcluster, kustomization, stack, deletion_policy="WaitForTermination"):
        observer = Observer(realcluster.admin, {**stack.paths, key: kustomization.path}, interval=0.0)
        watch = KustomizationWatch(kustomization)
        observer.start()
        watch.start()
        started = time.monotonic()
        assert realcluster.admin.delete(kustomization.path).status_code == 200
        _gone_in_order(realcluster, observer, stack, watch, key)
        took = time.monotonic() - started
    print(f"Flux, Kustomization deleted (WaitForTermination): all gone in {took:.1f} s; order {observer.order()}")
    last = max(observer.first_gone[k] for k in stack.paths)
    assert observer.first_gone[key] > last, observer.order()


@pytest.mark.parametrize("replay", [False, True], ids=["replay-off", "replay-on"])
def test_removing_the_stack_from_the_source_prunes_it_in_order(
        realcluster: RealCluster, kustomize_controller: tuple[KustomizeController, ArtifactServer],
        replay: bool) -> None:
    """The story removed from the source (a new revision keeps one ConfigMap): Flux's reconcile prunes it, the
    refused objects stay in the inventory, Ready=False PruneFailed, retried at retryInterval until the story is
    gone in the safe order; then Ready=True at the new revision with only the ConfigMap in the inventory."""
    _, server = kustomize_controller
    mode = "on" if replay else "off"
    suffix = f"fxp{mode}-{uuid.uuid4().hex[:4]}"
    stack = Stack.make(suffix, replay=replay)
    kept = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"kept-{suffix}", "namespace": "default"},
            "data": {"kept": "yes"}}
    stack = attrs.evolve(stack, files={**stack.files, "kept.yaml": yaml.safe_dump(kept)})
    kustomization = FluxKustomization(realcluster.admin, server, FLUX_NAMESPACE, f"stack-{suffix}")
    kept_path = f"/api/v1/namespaces/default/configmaps/kept-{suffix}"
    with delivered_by_flux(realcluster, kustomization, stack):
        before = kustomization.inventory()
        refused = _refusals(realcluster)
        observer = Observer(realcluster.admin, stack.paths, interval=0.0)
        watch = KustomizationWatch(kustomization)
        observer.start()
        watch.start()
        started = time.monotonic()
        revision = kustomization.publish({"kept.yaml": yaml.safe_dump(kept)})
        try:
            wait_for(lambda: not any(realcluster.admin.exists(p) for p in stack.paths.values()), timeout=TIMEOUT,
                     interval=0.5, what=f"the story pruned: {kustomization.get()}")
            wait_for(lambda: set(stack.paths) <= set(observer.first_gone), timeout=30, what="the observer")
            took = time.monotonic() - started
            wait_for(lambda: kustomization.ready(revision), timeout=TIMEOUT, interval=0.5,
                     what=f"Ready at {revision}: {kustomization.get()}")
        finally:
            observer.stop()
            watch.stop()
        refused = _refusals(realcluster) - refused
        assert observer.order_violations(stack.dependents) == [], observer.order()
        assert kustomization.inventory() == [i for i in before if "_kept-" in i], kustomization.inventory()
        assert realcluster.admin.exists(kept_path)
        failed = [s for s in watch.snapshots if s.reason == "PruneFailed"]
        print(f"Flux, the story pruned from the source, replay {mode}: gone in {took:.1f} s, the gate refused "
              f"{refused:.0f} DELETEs; {len(failed)} PruneFailed states, e.g. {failed[:1]}")
        assert refused > 0
        assert failed and all(s.ready == "False" for s in failed), watch.snapshots
        # pruneSurvivors: the refused objects are still in the inventory while the prune fails.
        assert any(stack.story.name("finalizer-deployment") in i for i in failed[0].inventory), failed[0]
        assert realcluster.admin.delete(kustomization.path).status_code == 200
        wait_for(lambda: not realcluster.admin.exists(kept_path) and kustomization.get() is None, timeout=60,
                 what="the kept ConfigMap deleted with its Kustomization")
