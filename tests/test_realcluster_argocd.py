"""Stacks delivered by Argo CD (the real application controller and repo-server, v3.2.3) from a local Git
repository and torn down by Argo CD, on the real control plane with the gate installed (tests/realcluster/
argocd.py: how it runs).

What Argo CD does, read at the tag it is built from:
- Deleting an Application that carries resources-finalizer.argocd.argoproj.io runs finalizeApplicationDeletion
  on every pass of the controller: if any object it tracks is terminating, it does nothing more this pass;
  otherwise it deletes, all at once, the objects of the highest sync wave among those it would delete
  (FilterObjectsForDeletion), with propagationPolicy Foreground, or Background with the `/background` variant
  of the finalizer; a refused DELETE makes the pass fail, recorded as the Application's DeletionError
  condition and a Warning Event "Unable to delete application resources: ...". The finalizer goes once nothing
  it would delete is left.
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1191-L1283
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1054-L1064
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/sort_delete.go#L24-L40
- It never deletes a CRD on an Application's deletion (shouldBeDeleted: `!kube.IsCRD(obj) && ...`):
  https://github.com/argoproj/argo-cd/blob/v3.2.3/controller/appcontroller.go#L1165-L1170
- A sync with prune deletes what left the source, waves in reverse; a refused prune fails the sync operation,
  which `syncPolicy.retry` retries with backoff. Measured here, it left the CRD in place too.

What an Argo CD user sees, checked here: each stack goes in the safe order (the Observer), with replay off
and on, with sync waves; while the gate refuses, the Application stays (its finalizer) with a DeletionError
condition and a Warning Event in the gate's words. With the reference story's criteria (the CRD must be gone
before the operator) the teardown cannot finish on its own, since Argo CD leaves the CRD: the gate says so
where the user looks (DeletionError, the CriticalService's Stuck condition) and the way out it gives finishes
it. With the criterion design/criticalservice.md proposes for Argo CD (no instance left, the CRD may stay) it
finishes by itself.
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
from tests.realcluster import argocd, build, examples
from tests.realcluster.argocd import (
    BACKGROUND_FINALIZER,
    RESOURCES_FINALIZER,
    SYNC_WAVE_ANNOTATION,
    TRACKING_ANNOTATION,
    Application,
    ApplicationWatch,
    ArgoCD,
    GitRepository,
)
from tests.realcluster.cluster import RealCluster
from tests.realcluster.teardown import Observer, RepeatingDeleter, Story, wait_for

pytestmark = pytest.mark.realcluster

TIMEOUT = 150
# Syncing several Applications at once from Git (repo-server clones, manifests, the apply) on a busy 2-core machine.
SYNC_TIMEOUT = 300
CRITICAL_SERVICES = examples.CRITICAL_SERVICES

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def argo(realcluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ArgoCD]:
    """Argo CD on the session's control plane, started once for the module."""
    if build.cached_argocd() is None and build.missing_toolchain() is not None:
        pytest.skip(build.missing_toolchain() or "")
    with argocd.running(realcluster.plane, tmp_path_factory.mktemp("argocd")) as running:
        yield running


@attrs.frozen
class Stack:
    """The reference story (names made unique by `suffix`) as one Application delivers it, with the criteria of
    `criteria`: "reference" (Finalizer and SpecificResource on the CRD, as shipped), "finalizer" (the Finalizer
    criterion alone), or "instances" (Finalizer, and Resources on the CR type: no instance left, the CRD may
    stay). `waves`: the app's part (its namespace and CRs) in sync wave 1, the operator's in wave 0."""

    story: Story
    docs: tuple[JSON, ...]
    criteria: str
    roles: tuple[JSON, ...]

    @classmethod
    def make(cls, suffix: str, *, replay: bool, criteria: str = "finalizer", waves: bool = False) -> Stack:
        story = Story.make(suffix)
        docs = examples.delivered(story.objects, replay=replay)
        for d in docs:
            if d["kind"] == "CriticalService":
                finalizer, crd = d["spec"]["criteria"]
                d["spec"]["criteria"] = {
                    "reference": [finalizer, crd], "finalizer": [finalizer],
                    "instances": [finalizer, {"type": "Resources", "resources": {
                        "group": story.group, "resource": "coolresources"}}]}[criteria]
            if waves and (d["kind"] == "CoolResource" or d["metadata"]["name"] == story.cr_namespace):
                d["metadata"].setdefault("annotations", {})[SYNC_WAVE_ANNOTATION] = "1"
        roles = [yaml.safe_load(story.reader_role()), *examples.operator_roles(docs, f"argocd-{suffix}")]
        return cls(story, tuple(docs), criteria, tuple(roles))

    @property
    def crd_key(self) -> str:
        return f"CustomResourceDefinition/{self.story.crd_name}"

    def paths(self) -> dict[str, str]:
        """What Argo CD deletes when the Application goes: everything but the CRD."""
        return {k: p for k, p in self.story.paths().items() if k != self.crd_key}

    def dependents(self) -> dict[str, list[str]]:
        """The safe order among what Argo CD deletes (the CRD, which it leaves, taken out)."""
        return {k: [d for d in v if d != self.crd_key] for k, v in self.story.dependents().items()}


@attrs.define
class Case:
    """One Application of a test: its stack, its repository, and what watches it during the teardown."""

    title: str
    stack: Stack
    repo: GitRepository
    app: Application
    observer: Observer | None = None
    watch: ApplicationWatch | None = None
    revision: str = ""
    extra: dict[str, str] = attrs.field(factory=dict)  # more files of the repository, beside stack.yaml

    @classmethod
    def make(cls, realcluster: RealCluster, argo: ArgoCD, title: str, suffix: str, *, replay: bool,
             criteria: str = "finalizer", finalizer: str = RESOURCES_FINALIZER, waves: bool = False) -> Case:
        repo = GitRepository(argo.directory / "git" / suffix).init()
        return cls(title, Stack.make(suffix, replay=replay, criteria=criteria, waves=waves), repo,
                   Application(realcluster.admin, f"stack-{suffix}", repo.url, finalizer=finalizer))

    @property
    def key(self) -> str:
        return f"Application/{self.app.name}"

    def start_watching(self, realcluster: RealCluster, paths: dict[str, str]) -> None:
        self.observer = Observer(realcluster.admin, {**paths, self.key: self.app.url}, interval=0.0)
        self.watch = ApplicationWatch(self.app)
        self.observer.start()
        self.watch.start()

    def stop_watching(self) -> None:
        for watcher in (self.observer, self.watch):
            if watcher is not None:
                watcher.stop()

    def left(self, realcluster: RealCluster) -> list[str]:
        return [k for k, p in self.stack.paths().items() if realcluster.admin.exists(p)]

    def deletion_errors(self) -> list[str]:
        assert self.watch is not None
        return [m for s in self.watch.snapshots for t, m in s.conditions if t == "DeletionError"]


@contextlib.contextmanager
def delivered_by_argocd(realcluster: RealCluster, argo: ArgoCD, cases: list[Case]) -> Iterator[None]:
    """The operator's roles applied; each case's stack committed to its repository (with its extra files) and
    synced by its Application until Synced at that commit; every CriticalService Enforcing; each story's
    finalizer controller running. Afterwards, whatever is left goes (after a failure), the roles last."""
    roles = [role for case in cases for role in case.stack.roles]
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    assert done.returncode == 0, done.stderr
    try:
        with contextlib.ExitStack() as controllers:
            for case in cases:
                controllers.enter_context(RealBackend(realcluster).finalizer_controller(case.stack.story))
            try:
                for case in cases:
                    case.revision = case.repo.commit({"stack.yaml": yaml.safe_dump_all(case.stack.docs),
                                                      **case.extra}, "the stack")
                    case.app.create()
                wait_for(lambda: argo.check_alive() or all(c.app.synced(c.revision) for c in cases),
                         timeout=SYNC_TIMEOUT, interval=0.5,
                         what=f"every Application Synced: {[(c.app.name, c.app.get()) for c in cases]}")
                services = [c.stack.story.critical_service for c in cases]
                wait_for(lambda: all(examples.enforcing(realcluster.admin, s) for s in services), timeout=TIMEOUT,
                         what=f"every CriticalService Enforcing: {services}")
                yield
            finally:
                for case in cases:
                    case.stop_watching()
                    _clean_up(realcluster, case)
    finally:
        for role in roles:
            realcluster.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")


def _clean_up(realcluster: RealCluster, case: Case) -> None:
    """What a test leaves goes: the Application without its finalizer, the stack (CRD included) until gone."""
    if realcluster.admin.exists(case.app.url):
        realcluster.admin.merge_patch(case.app.url, {"metadata": {"finalizers": None}})
        realcluster.admin.delete(case.app.url)
    left = {k: p for k, p in case.stack.story.paths().items() if realcluster.admin.exists(p)}
    if left:
        RepeatingDeleter(realcluster.admin, left).run(timeout=120)


def _refusals(realcluster: RealCluster) -> float:
    return sum(g.metric("criticalsvc_decisions_total", operation="DELETE", result="denied")
               for g in realcluster.gate.replicas)


def _stuck(realcluster: RealCluster, name: str) -> JSON:
    status = (realcluster.admin.get(f"{CRITICAL_SERVICES}/{name}") or {}).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c.get("type") == "Stuck"), {})


def _told(realcluster: RealCluster, case: Case) -> tuple[list[str], JSON]:
    return case.deletion_errors()[-1:], _stuck(realcluster, case.stack.story.critical_service)


def _warnings(case: Case) -> list[str]:
    return [str(e.get("message")) for e in case.app.events() if e.get("type") == "Warning"]


def test_deleting_applications_tears_their_stacks_down_in_order(realcluster: RealCluster, argo: ArgoCD) -> None:
    """Four Applications deleted at once, each a stack whose CriticalService lets the CRD stay (Argo CD never
    deletes it): the Finalizer criterion alone, Foreground, replay off; the same with the `/background`
    finalizer and replay on; the same in two sync waves (the app's CRs in wave 1 go first, alone); and
    Finalizer with Resources on the CR type (design/criticalservice.md's proposal for Argo CD). Argo CD's
    passes are refused while the CRs are there, each Application keeps its finalizer with DeletionError in the
    gate's words, every stack goes in the safe order, each Application last; the CRDs stay, as Argo CD leaves
    them."""
    run = uuid.uuid4().hex[:4]
    cases = [
        Case.make(realcluster, argo, "Finalizer only, Foreground, replay off", f"ad-fg-{run}", replay=False),
        Case.make(realcluster, argo, "Finalizer only, Background, replay on", f"ad-bg-{run}", replay=True,
                  finalizer=BACKGROUND_FINALIZER),
        Case.make(realcluster, argo, "Finalizer only, sync waves, replay off", f"ad-wv-{run}", replay=False,
                  waves=True),
        Case.make(realcluster, argo, "Finalizer and Resources on the CR type, replay off", f"ad-in-{run}",
                  replay=False, criteria="instances"),
    ]
    with delivered_by_argocd(realcluster, argo, cases):
        for case in cases:
            deployment = realcluster.admin.get(case.stack.story.deployment_path) or {}
            tracking = deployment["metadata"].get("annotations", {}).get(TRACKING_ANNOTATION, "")
            assert tracking.startswith(f"{case.app.name}:apps/Deployment:"), deployment["metadata"]
        refused = _refusals(realcluster)
        for case in cases:
            case.start_watching(realcluster, case.stack.paths())
        started = time.monotonic()
        for case in cases:
            case.app.delete()
        wait_for(lambda: argo.check_alive() or not any(c.left(realcluster) or c.app.get() for c in cases),
                 timeout=TIMEOUT, interval=0.5,
                 what=f"every stack and Application gone: left {[(c.left(realcluster), c.app.get()) for c in cases]}")
        wait_for(lambda: all(c.observer is not None and set(c.stack.paths()) | {c.key} <= set(c.observer.first_gone)
                             for c in cases), timeout=30, what="the observers' last round")
        took = time.monotonic() - started
        for case in cases:
            case.stop_watching()
        refused = _refusals(realcluster) - refused
        print(f"Argo CD, {len(cases)} Applications deleted at once: all gone in {took:.1f} s; the gate refused "
              f"{refused:.0f} DELETEs")
        assert refused > 0, "the gate refused none of Argo CD's DELETEs: the stacks were not protected"
        for case in cases:
            observer, watch = case.observer, case.watch
            assert observer is not None and watch is not None
            gone = observer.gone_at[case.key] - started
            errors = case.deletion_errors()
            print(f"  {case.title}: Application gone after {gone:.1f} s; order {observer.order()}; "
                  f"{len(errors)} DeletionError states, the first {errors[:1]}")
            assert observer.order_violations(case.stack.dependents()) == [], observer.order()
            # The Application goes last, once nothing it deletes is left.
            assert observer.first_gone[case.key] > max(observer.first_gone[k] for k in case.stack.paths())
            # Argo CD leaves the CRD.
            assert realcluster.admin.exists(case.stack.story.paths()[case.stack.crd_key])
            deleting = [s for s in watch.snapshots if s.deleting]
            assert deleting and all(case.app.finalizer in s.finalizers for s in deleting), watch.snapshots
            if "waves" not in case.title:
                # Refused while the CRs were there: what the user sees says why, in the gate's words (the pass's
                # first error: its DELETEs go out at once, and whichever refusal returns first is the condition).
                # With replay on, a DELETE Argo CD sends just after the gate replayed it may find it gone: a NotFound
                # DeletionError, which the next pass clears.
                assert any('webhook "' in m and "may not be deleted yet" in m for m in errors), errors
                assert all("may not be deleted yet" in m or ("not found" in m and "replay on" in case.title)
                           for m in errors), errors
        waves = next(c for c in cases if "waves" in c.title)
        assert waves.observer is not None
        # Wave 1 (the CRs and their namespace) is gone before anything of wave 0 is even marked.
        story = waves.stack.story
        wave1 = [k for k in story.paths() if k.startswith("CoolResource/")] + [f"Namespace/{story.cr_namespace}"]
        wave0 = [k for k in waves.stack.paths() if k not in wave1]
        assert max(waves.observer.first_gone[k] for k in wave1) < min(waves.observer.marked[k] for k in wave0), \
            waves.observer.order()


def test_the_reference_story_is_reported_stuck_and_the_way_out_finishes_it(
        realcluster: RealCluster, argo: ArgoCD) -> None:
    """The reference story's criteria (Finalizer and SpecificResource on the CRD), replay off and on: Argo CD
    deletes the CRs and their namespace, then is refused the operator on every pass, since the CRD it never
    deletes is still there. The user is told so where they look: DeletionError and the Warning Event carry
    the gate's way out ("Argo CD does not delete CRDs when it deletes an Application: delete
    customresourcedefinitions/X yourself ..."), and so does the CriticalService's Stuck condition
    (DeleterNeverDeletes). Following it (kubectl delete customresourcedefinitions X) finishes the teardown in
    the safe order."""
    run = uuid.uuid4().hex[:4]
    cases = [Case.make(realcluster, argo, "reference criteria, replay off", f"as-off-{run}", replay=False,
                       criteria="reference"),
             Case.make(realcluster, argo, "reference criteria, replay on", f"as-on-{run}", replay=True,
                       criteria="reference")]
    with delivered_by_argocd(realcluster, argo, cases):
        for case in cases:
            case.start_watching(realcluster, case.stack.story.paths())
        started = time.monotonic()
        for case in cases:
            case.app.delete()
        way_out = {c.key: f"Argo CD does not delete CRDs when it deletes an Application: delete "
                          f"customresourcedefinitions/{c.stack.story.crd_name} yourself" for c in cases}

        def waiting(case: Case) -> list[str]:
            story = case.stack.story
            return [f"Namespace/{story.namespace}", f"Deployment/{story.name('finalizer-deployment')}",
                    f"CriticalService/{story.critical_service}"]

        def told(case: Case) -> bool:
            argo.check_alive()
            # Said from the first refused pass on (the CRD criterion can never be met), and still said once the
            # CRs and their namespace are gone and only what waits for the CRD is left.
            return (any(way_out[case.key] in m for m in case.deletion_errors())
                    and _stuck(realcluster, case.stack.story.critical_service).get("reason") == "DeleterNeverDeletes"
                    and case.left(realcluster) == waiting(case))

        wait_for(lambda: all(told(c) for c in cases), timeout=TIMEOUT, interval=0.5,
                 what=f"the way out in DeletionError and Stuck: {[_told(realcluster, c) for c in cases]}")
        stuck_after = time.monotonic() - started
        for case in cases:
            story = case.stack.story
            # The CRs and their namespace are gone; the operator, its namespace, the CriticalService, the CRD and
            # the Application stay.
            assert realcluster.admin.exists(case.app.url) and realcluster.admin.exists(
                story.paths()[case.stack.crd_key])
            stuck = _stuck(realcluster, story.critical_service)
            print(f"  {case.title}: stuck after {stuck_after:.1f} s; Stuck: {stuck['message']}")
            assert stuck["status"] == "True"
            assert stuck["message"].startswith(f"customresourcedefinitions/{story.crd_name} still exists and nobody is "
                                               "deleting it; the teardown of "), stuck["message"]
            assert "system:serviceaccount:argocd:argocd-application-controller" in stuck["message"]
            assert (f"Argo CD does not delete CRDs when it deletes an Application. Way out: delete "
                    f"customresourcedefinitions/{story.crd_name} yourself") in stuck["message"], stuck["message"]
            assert any(way_out[case.key] in m for m in _warnings(case)), _warnings(case)
        # The way out, as the message gives it.
        for case in cases:
            done = realcluster.kubectl("delete", "customresourcedefinitions", case.stack.story.crd_name, "--wait=false")
            assert done.returncode == 0, done.stderr
        wait_for(lambda: argo.check_alive() or not any(c.left(realcluster) or c.app.get() for c in cases),
                 timeout=TIMEOUT, interval=0.5,
                 what=f"every stack and Application gone: left {[(c.left(realcluster), c.app.get()) for c in cases]}")
        wait_for(lambda: all(c.observer is not None and set(c.stack.story.paths()) | {c.key}
                             <= set(c.observer.first_gone) for c in cases), timeout=30,
                 what="the observers' last round")
        for case in cases:
            case.stop_watching()
            assert case.observer is not None
            print(f"  {case.title}: order {case.observer.order()}")
            assert case.observer.order_violations(case.stack.story.dependents()) == [], case.observer.order()


def test_a_commit_removing_the_stack_is_pruned_in_order(realcluster: RealCluster, argo: ArgoCD) -> None:
    """Two Applications, each with a stack whose CriticalService lets the CRD stay (Finalizer, and Resources on
    the CR type) and a ConfigMap (replay off; on); a commit keeps only the ConfigMap: the sync's prune is refused
    while the gate holds the operator, the operation fails with the gate's message and `syncPolicy.retry`
    retries it until the stack is gone in the safe order; then Synced at the new commit with the ConfigMap.
    (With the reference story's criteria, the prune was seen never to delete the CRD while the rest of its
    pass was refused, so the operator waited for ever: design/replay.md, "What an Argo CD user sees".)"""
    run = uuid.uuid4().hex[:4]
    cases = [Case.make(realcluster, argo, "Finalizer and Resources, replay off", f"ap-off-{run}", replay=False,
                       criteria="instances"),
             Case.make(realcluster, argo, "Finalizer and Resources, replay on", f"ap-on-{run}", replay=True,
                       criteria="instances")]
    for case in cases:
        case.extra = {"kept.yaml": yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": f"kept-{case.app.name}", "namespace": "default"}, "data": {"kept": "yes"}})}
    with delivered_by_argocd(realcluster, argo, cases):
        refused = _refusals(realcluster)
        for case in cases:
            case.start_watching(realcluster, case.stack.paths())
        started = time.monotonic()
        for case in cases:
            case.revision = case.repo.commit({"stack.yaml": None}, "the stack goes")
            case.app.refresh()
        wait_for(lambda: argo.check_alive() or not any(case.left(realcluster) for case in cases),
                 timeout=TIMEOUT, interval=0.5,
                 what=f"the stacks pruned: left {[c.left(realcluster) for c in cases]}")
        took = time.monotonic() - started
        wait_for(lambda: all(c.observer is not None and set(c.stack.paths()) <= set(c.observer.first_gone)
                             for c in cases), timeout=30, what="the observers' last round")
        wait_for(lambda: all(c.app.synced(c.revision) for c in cases), timeout=TIMEOUT, interval=0.5,
                 what=f"Synced at the new commit: {[c.app.get() for c in cases]}")
        for case in cases:
            case.stop_watching()
        refused = _refusals(realcluster) - refused
        print(f"Argo CD, 2 stacks pruned at once: gone in {took:.1f} s; the gate refused {refused:.0f} DELETEs")
        assert refused > 0
        for case in cases:
            observer, watch = case.observer, case.watch
            assert observer is not None and watch is not None
            failed = [s for s in watch.snapshots if "may not be deleted yet" in s.operation_message]
            crd = realcluster.admin.exists(case.stack.story.paths()[case.stack.crd_key])
            print(f"  {case.title}: order {observer.order()}; {len(failed)} refused sync states, the first "
                  f"{failed[:1]}; CRD {'left' if crd else 'pruned'}")
            assert observer.order_violations(case.stack.dependents()) == [], observer.order()
            assert failed, watch.snapshots
            assert realcluster.admin.exists(f"/api/v1/namespaces/default/configmaps/kept-{case.app.name}")
        for case in cases:
            case.app.delete()
        configmaps = [f"/api/v1/namespaces/default/configmaps/kept-{c.app.name}" for c in cases]
        wait_for(lambda: not any(realcluster.admin.exists(p) for p in [*configmaps, *(c.app.url for c in cases)]),
                 timeout=60, what="the kept ConfigMaps deleted with their Applications")
