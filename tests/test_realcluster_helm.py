"""`helm uninstall` (the real helm, v3.22.0) of releases holding guarded stacks, on the real control plane with
the gate installed (tests/realcluster/helm.py: the charts and the CLI).

What Helm does, read at v3.22.0 (design/helm.md has the links):
- `helm uninstall` makes ONE pass: the release's manifest sorted by kind (releaseutil.UninstallOrder: Deployment
  before CustomResourceDefinition before Namespace; kinds it does not list, custom resources and
  CriticalServices, last, by kind name), one Background DELETE per object, the objects of one kind at once and
  the next kind after them; every object is tried, the errors collected (pkg/kube/client.go `rdelete`).
- Any refused DELETE ends the command with `Error: failed to delete release: NAME`; the per-object errors go
  only to the debug log (pkg/action/uninstall.go#L123-L127), the release stays `uninstalling`, nothing retries,
  and `--wait` is never reached. Warnings of the API server's answers are printed (client-go's default
  warning handler, klog on stderr): that is where the gate's "until: ..." reaches a Helm user.
- A CRD in the chart's crds/ is installed before the templates and never deleted.

What a Helm user sees, checked here: with replay the stack goes by itself in the safe order although helm
exits 1, and one more `helm uninstall` removes the release record; without replay exactly the provider, its
namespace and the CriticalService are left, and re-running `helm uninstall` finishes it in the safe order.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from tests.backends import RealBackend
from tests.realcluster import build, examples
from tests.realcluster import helm as helmcli
from tests.realcluster.cluster import RealCluster
from tests.realcluster.helm import Helm, Outcome
from tests.realcluster.teardown import Observer, RepeatingDeleter, Story, wait_for

pytestmark = pytest.mark.realcluster

RELEASE_NAMESPACE = "default"  # the release records (Secrets) live outside the stack they install
TIMEOUT = 90
RERUN = 1.0  # a person re-running `helm uninstall` after it failed, every second

JSON = dict[str, Any]


@pytest.fixture(scope="module")
def helm_binary() -> Path:
    path = helmcli.binary()
    if path is None:
        pytest.skip(build.missing_toolchain() or "helm is not built")
    return path


@pytest.fixture
def helm(helm_binary: Path, realcluster: RealCluster, tmp_path: Path) -> Helm:
    """helm as one user runs it: its own home (and discovery cache), the cluster's admin kubeconfig."""
    return Helm(helm_binary, tmp_path / "home", realcluster.kubeconfig, RELEASE_NAMESPACE)


@attrs.define
class Case:
    """One stack of a test: the story, how its charts split it into releases, replay, and what happened."""

    title: str
    story: Story
    replay: bool
    releases: dict[str, Path]  # release name -> chart, in install order
    wait: bool = False  # `helm uninstall --wait`
    elsewhere: bool = False  # once replay is done, first try `helm uninstall` from a machine without the cache
    debug: bool = False  # the first re-run with --debug, which prints the refusals' messages
    finalizer_only: bool = False  # the CriticalService without its criterion on the CRD (Crossplane's order)
    crd_in_templates: bool = True  # else in crds/: Helm never deletes it
    waits_for_crd: bool = False  # a CRD in crds/ and a criterion on it: the user deletes the CRD
    observer: Observer | None = None
    first: dict[str, Outcome] = attrs.Factory(dict)  # the first `helm uninstall` of each release
    reruns: list[Outcome] = attrs.Factory(list)
    left_when_done: set[str] | None = None  # what was left when the last `helm uninstall` exited 0

    @classmethod
    def make(cls, tmp: Path, title: str, prefix: str, *, replay: bool, split: bool = False,
             crds_dir: bool = False, **kw: Any) -> Case:
        story = Story.make(f"{prefix}-{uuid.uuid4().hex[:4]}")
        docs = examples.delivered(story.objects, replay=replay)
        if kw.get("finalizer_only"):
            for doc in docs:
                if doc["kind"] == "CriticalService":
                    doc["spec"]["criteria"] = [c for c in doc["spec"]["criteria"] if c["type"] == "Finalizer"]
        crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"] if crds_dir else []
        docs = [d for d in docs if d not in crds]
        base = tmp / story.suffix
        if split:  # the operator's release (its namespace, Deployment, CRD, CriticalService), then the app's
            app = [d for d in docs if d["kind"] == "CoolResource"
                   or (d["kind"] == "Namespace" and d["metadata"]["name"] == story.cr_namespace)]
            releases = {f"op-{story.suffix}": helmcli.write_chart(base / "operator", "operator",
                                                                  [d for d in docs if d not in app], crds=crds),
                        f"app-{story.suffix}": helmcli.write_chart(base / "app", "app", app)}
        else:
            releases = {f"stack-{story.suffix}": helmcli.write_chart(base / "stack", "stack", docs, crds=crds)}
        waits = crds_dir and not kw.get("finalizer_only")
        return cls(title, story, replay, releases, crd_in_templates=not crds_dir, waits_for_crd=waits, **kw)

    @property
    def paths(self) -> dict[str, str]:
        return self.story.paths()

    @property
    def crd(self) -> str:
        return f"CustomResourceDefinition/{self.story.crd_name}"

    @property
    def held(self) -> set[str]:
        """What the gate holds back from one pass: the provider, its namespace, the CriticalService."""
        s = self.story
        return {f"Deployment/{s.name('finalizer-deployment')}", f"Namespace/{s.namespace}",
                f"CriticalService/{s.critical_service}"}

    @property
    def dependents(self) -> dict[str, list[str]]:
        if not self.finalizer_only:
            return self.story.dependents()
        return {k: [d for d in v if d != self.crd] for k, v in self.story.dependents().items()}

    def left(self, realcluster: RealCluster) -> set[str]:
        return {k for k, p in self.paths.items() if realcluster.admin.exists(p)}

    def uninstall_args(self) -> tuple[str, ...]:
        return ("--wait", "--timeout", f"{TIMEOUT}s") if self.wait else ()


@contextlib.contextmanager
def installed(realcluster: RealCluster, helm: Helm, cases: list[Case]) -> Iterator[None]:
    """The operator's roles applied (a reader and a replay role per stack); each story's finalizer controller
    running; every release installed; every CriticalService Enforcing and its provider's DELETE refused. Afterwards
    whatever is left goes (after a failure), the release records and the roles last."""
    roles = [r for c in cases for r in examples.operator_roles(examples.delivered(c.story.objects, replay=True),
                                                              f"helm-{c.story.suffix}")]
    done = realcluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    assert done.returncode == 0, done.stderr
    try:
        with contextlib.ExitStack() as controllers:
            for case in cases:
                controllers.enter_context(RealBackend(realcluster).finalizer_controller(case.story))
            try:
                with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:  # the operator's release first
                    list(pool.map(lambda c: [helm.install(r, chart) for r, chart in c.releases.items()], cases))
                for case in cases:
                    wait_for(lambda: protected(realcluster, case), timeout=TIMEOUT,  # noqa: B023 (called at once)
                             what=f"CriticalService {case.story.critical_service} Enforcing, "
                                  f"{case.story.deployment_path}'s DELETE refused")
                yield
            finally:
                for case in cases:
                    if case.observer is not None:
                        case.observer.stop()
                    _clean_up(realcluster, case)
    finally:
        for role in roles:
            realcluster.admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role['metadata']['name']}")


def protected(realcluster: RealCluster, case: Case) -> bool:
    """The CriticalService is Enforcing and a dry-run DELETE of its provider is refused."""
    return (examples.enforcing(realcluster.admin, case.story.critical_service)
            and realcluster.admin.delete(case.story.deployment_path, params={"dryRun": "All"}).status_code == 403)


def _clean_up(realcluster: RealCluster, case: Case) -> None:
    left = {k: p for k, p in case.paths.items() if realcluster.admin.exists(p)}
    if left:
        RepeatingDeleter(realcluster.admin, left).run(timeout=120)
    for release in case.releases:
        realcluster.kubectl("delete", "secret", "-n", RELEASE_NAMESPACE, "-l", f"owner=helm,name={release}")


def uninstall_at_once(realcluster: RealCluster, helm: Helm, cases: list[Case]) -> float:
    """Every case's observer started, then `helm uninstall` of every release at once; when they were started."""
    for case in cases:
        # Not what stays (a crds/ CRD): a watch that waits for it would only be closed at the end.
        watched = {k: path for k, path in case.paths.items() if k not in expected_left(case)}
        case.observer = Observer(realcluster.admin, watched, interval=0.0)
        case.observer.start()
    jobs = [(case, release) for case in cases for release in case.releases]
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = pool.map(lambda job: helm.run("uninstall", job[1], *job[0].uninstall_args()), jobs)
        for (case, release), outcome in zip(jobs, outcomes, strict=True):
            case.first[release] = outcome
    return started


def uninstall_until_done(realcluster: RealCluster, helm: Helm, case: Case, releases: list[str]) -> None:
    """Re-run `helm uninstall` of `releases` every RERUN s until each exits 0 (what a user does; nothing else
    deletes what the gate refused without replay); what is left right after the last run is `left_when_done`."""
    deadline = time.monotonic() + TIMEOUT
    pending = list(releases)
    while pending:
        for release in list(pending):
            debug = ("--debug",) if case.debug and not case.reruns else ()
            outcome = helm.run("uninstall", release, *case.uninstall_args(), *debug)
            case.reruns.append(outcome)
            if outcome.returncode == 0:
                pending.remove(release)
                case.left_when_done = case.left(realcluster)
        if pending:
            assert time.monotonic() < deadline, f"{case.title}: helm uninstall still fails: {case.reruns[-1]}"
            time.sleep(RERUN)


def refused_outright(outcome: Outcome, release: str) -> None:
    """Helm's one line for a refused pass, and the gate's reason beside it (the denial's warning)."""
    assert outcome.returncode == 1, str(outcome)
    assert f"Error: failed to delete release: {release}" in outcome.stderr, str(outcome)


def report(case: Case, started: float) -> str:
    observer = case.observer
    assert observer is not None
    gone = {k: round(observer.gone_at[k] - started, 1) for k in observer.order() if k in observer.gone_at}
    firsts = "; ".join(f"{r}: exit {o.returncode} after {o.took:.1f} s" for r, o in case.first.items())
    return (f"  {case.title}: first uninstall {firsts}; re-runs {len(case.reruns)} "
            f"(exits {[o.returncode for o in case.reruns]}); gone at {gone}\n"
            + "\n".join(f"    {r} said:\n{o.stderr}" for r, o in case.first.items()))


def expected_left(case: Case) -> set[str]:
    """What is left in the end: a CRD in crds/, which helm never deletes (unless the user deleted it)."""
    return set() if case.crd_in_templates or case.waits_for_crd else {case.crd}


def tear_down(realcluster: RealCluster, helm: Helm, cases: list[Case], title: str) -> None:
    """Every release of `cases` uninstalled at once, then what a user sees and does, checked case by case:

    - the first `helm uninstall` of a release holding what the gate refuses exits 1 with Helm's one line as soon as
      its pass is refused (--wait too), the gate's warnings above it saying what the provider waits for and what
      happens then, and the release is listed `uninstalling`; the other releases go;
    - with replay everything goes by itself; without it exactly the provider, its namespace and the CriticalService
      are left, none of them being deleted;
    - re-running `helm uninstall` of the refused releases every second finishes (with replay: the first re-run
      just removes the record); with --wait the run that exits 0 returns once everything is gone;
    - every object went in the safe order, the release records are gone, and nothing but a crds/ CRD is left."""
    started = uninstall_at_once(realcluster, helm, cases)
    refused: dict[str, Case] = {}
    for case in cases:
        for release, first in case.first.items():
            holds = case.held & {f"{d['kind']}/{d['metadata']['name']}" for d in _chart_objects(case.releases[release])}
            if holds:
                refused_outright(first, release)
                assert first.took < 15, f"{case.title}: helm waited although its pass was refused: {first}"
                refused[release] = case
            else:
                assert first.returncode == 0, str(first)
    listed = helm.releases()
    assert {r: listed.get(r) for c in cases for r in c.releases} == {
        r: "uninstalling" if r in refused else None for c in cases for r in c.releases}, listed
    for release in refused:
        status = helm.status(release)
        assert status["info"]["status"] == "uninstalling", status
    with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:  # each user following their own
        list(pool.map(lambda c: follow(realcluster, helm, c, [r for r in c.releases if r in refused]), cases))
    wait_for(lambda: all(c.left(realcluster) == expected_left(c) for c in cases), timeout=TIMEOUT,
             what="every stack gone")
    assert not set(helm.releases()) & {r for c in cases for r in c.releases}
    print(f"Helm, {title}:")
    for case in cases:
        observer = case.observer
        assert observer is not None
        expected = set(case.paths) - expected_left(case)
        wait_for(lambda: expected <= set(observer.first_gone), timeout=30,  # noqa: B023
                 what="the observer's last round")
        print(report(case, started))
        print(f"  ({title}: the last check {time.monotonic() - started:.1f} s after the first uninstall)")
        assert observer.order_violations(case.dependents) == [], observer.order()


def follow(realcluster: RealCluster, helm: Helm, case: Case, refused: list[str]) -> None:
    """One case after its first `helm uninstall`: the gate's words in helm's output; replay finishing it, or exactly
    what the gate holds left; then `helm uninstall` re-run until it exits 0."""
    s = case.story
    deployment = f"deployments.apps {s.namespace}/{s.name('finalizer-deployment')}"
    for release in refused:
        said = case.first[release].stderr
        assert f"{deployment} may not be deleted while" in said, said
        then = "the gate deletes it once that is over" if case.replay else "delete it again once that is over"
        assert f"{deployment}: {then}" in said, said
        if case.waits_for_crd:
            assert f"customresourcedefinitions.apiextensions.k8s.io {s.crd_name} still exists" in said, said
    if case.replay:
        if case.waits_for_crd:
            user_deletes_the_crd(realcluster, case)
        wait_for(lambda: case.left(realcluster) == expected_left(case), timeout=TIMEOUT,
                 what=f"{case.title}: replay to finish: left {case.left(realcluster)}")
    else:
        rest = set(case.paths) - case.held - expected_left(case)
        wait_for(lambda: not (case.left(realcluster) & rest), timeout=TIMEOUT,
                 what=f"{case.title}: all but what the gate holds gone: left {case.left(realcluster)}")
        assert case.left(realcluster) == case.held | expected_left(case)
        assert not any((realcluster.admin.get(case.paths[k]) or {})["metadata"].get("deletionTimestamp")
                       for k in case.held), "an object the gate refused is being deleted without replay"
    if case.elsewhere:
        from_elsewhere(realcluster, helm, case, refused)
    uninstall_until_done(realcluster, helm, case, refused)
    if case.wait:
        assert case.left_when_done == expected_left(case), \
            f"{case.title}: --wait returned 0 while {case.left_when_done} were left"
    if case.debug:  # only --debug shows the refusals' messages (by then the CriticalService's), the gate's words
        said = case.reruns[0].stderr
        assert "uninstall: Failed to delete release: [admission webhook" in said, said
        assert f"denied the request: criticalservices.criticalsvc.io {s.critical_service} may not be deleted yet: " \
            in said, said
        print(f"  {case.title}: the first re-run, with --debug:\n{said}")
    if case.replay:
        assert [o.returncode for o in case.reruns] == [0] * len(refused), case.reruns
    else:
        assert len(case.reruns) > len(refused), f"{case.title}: helm uninstall finished at once: {case.reruns}"


def from_elsewhere(realcluster: RealCluster, helm: Helm, case: Case, refused: list[str]) -> None:
    """The stack gone by replay, `helm uninstall` run again from a machine whose discovery cache never saw the CRD:
    helm cannot map the release's CRs any more and fails with the same one line (the reason only with --debug);
    the record stays `uninstalling`."""
    other = attrs.evolve(helm, home=helm.home.parent / f"elsewhere-{case.story.suffix}")
    for release in refused:
        again = other.run("uninstall", release, "--debug")
        assert again.returncode == 1 and f"Error: failed to delete release: {release}" in again.stderr, str(again)
        assert "unable to build kubernetes objects for delete" in again.stderr, str(again)
        assert helm.releases().get(release) == "uninstalling"
        print(f"  {case.title}: `helm uninstall {release}` from elsewhere: {again}")


def user_deletes_the_crd(realcluster: RealCluster, case: Case) -> None:
    """A CRD in crds/ and a criterion on it: the teardown waits until the user deletes the CRD (helm never will),
    and the gate's refusal says so; once deleted, replay finishes the teardown."""
    rest = set(case.paths) - case.held - {case.crd}
    wait_for(lambda: not (case.left(realcluster) & rest), timeout=TIMEOUT,
             what=f"{case.title}: all but what the gate holds and the CRD gone: left {case.left(realcluster)}")
    assert case.left(realcluster) == case.held | {case.crd}
    refusal = realcluster.admin.delete(case.story.deployment_path, params={"dryRun": "All"})
    assert refusal.status_code == 403, refusal.text
    assert f"customresourcedefinitions.apiextensions.k8s.io {case.story.crd_name} still exists" in \
        refusal.json()["message"], refusal.text
    done = realcluster.kubectl("delete", f"crd/{case.story.crd_name}", "--wait=false")
    assert done.returncode == 0, done.stderr


def _chart_objects(chart: Path) -> list[JSON]:
    return [d for f in sorted((chart / "templates").glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text().replace("{{- if .Values.instances }}", "")
                                        .replace("{{- end }}", "")) if d]


def test_releases_with_whole_stacks_and_split_stacks(realcluster: RealCluster, helm: Helm, tmp_path: Path) -> None:
    """Six stacks uninstalled at once: one release holding the whole story (the CRD in templates/) with replay on
    and off, with and without --wait; and the operator (its namespace, Deployment, CRD, CriticalService) and the
    app (its namespace, the CRs) in two releases, replay on and off. See `tear_down` for what is checked; and, once
    replay is done, a `helm uninstall` from a machine whose discovery cache never saw the CRD fails (`from_elsewhere`)
    while the user's own finishes; only `--debug` prints the refusals' messages. First: a chart with its CRD and
    its instances in templates/ cannot be installed in one step (helm maps every object before creating any)."""
    one_step = Case.make(tmp_path, "one step", "hl-one", replay=True)
    (release, chart), = one_step.releases.items()
    done = helm.run("install", release, str(chart), "--set", "instances=true")
    assert done.returncode == 1 and "ensure CRDs are installed first" in done.stderr, str(done)
    assert release not in helm.releases()
    cases = [Case.make(tmp_path, "one release, replay on", "hl-on", replay=True, elsewhere=True),
             Case.make(tmp_path, "one release, replay on, --wait", "hl-onw", replay=True, wait=True),
             Case.make(tmp_path, "one release, replay off", "hl-off", replay=False, debug=True),
             Case.make(tmp_path, "one release, replay off, --wait", "hl-offw", replay=False, wait=True),
             Case.make(tmp_path, "operator and app releases, replay on", "hs-on", replay=True, split=True),
             Case.make(tmp_path, "operator and app releases, replay off", "hs-off", replay=False, split=True)]
    with installed(realcluster, helm, cases):
        tear_down(realcluster, helm, cases, "whole and split stacks uninstalled at once")


def test_a_chart_with_its_crd_in_crds(realcluster: RealCluster, helm: Helm, tmp_path: Path) -> None:
    """Three stacks whose CRD lives in the chart's crds/ (installed first, never deleted by helm), uninstalled at
    once: with the story's criterion on the CRD (replay on) the provider waits for the CRD, the gate says so, and
    once the user deletes the CRD replay finishes the teardown; with a Finalizer criterion only (Crossplane's
    order) the teardown finishes, replay on and off, and the CRD is left. See `tear_down` for what is checked."""
    cases = [Case.make(tmp_path, "crds/, criterion on the CRD, replay on", "hc-crd", replay=True, crds_dir=True),
             Case.make(tmp_path, "crds/, Finalizer only, replay on", "hc-on", replay=True, crds_dir=True,
                       finalizer_only=True),
             Case.make(tmp_path, "crds/, Finalizer only, replay off", "hc-off", replay=False, crds_dir=True,
                       finalizer_only=True)]
    with installed(realcluster, helm, cases):
        tear_down(realcluster, helm, cases, "charts with their CRD in crds/")
