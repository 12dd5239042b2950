"""`helm uninstall OPERATOR APP`: two releases uninstalled in one command (the real helm v3.22.0), on the real control
plane with the gate installed, replay on (tests/test_realcluster_helm.py has the charts, the releases and what Helm
does, read at its source).

Helm uninstalls the releases in the order named and stops at the first that fails, never reaching the rest
(https://github.com/helm/helm/blob/v3.22.0/cmd/helm/uninstall.go#L58-L68). Kept out of `nox -s tests` and run by
`nox -s realcluster-slow`: 20 s on the warm control plane (two split stacks synced, refused, replayed and
uninstalled again), more than CI's budget has room for.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest

from tests.realcluster.cluster import RealCluster
from tests.realcluster.helm import Helm
from tests.realcluster.teardown import Observer, wait_for

# The fixtures `helm` and `helm_binary` (which `helm` asks for) come with the helpers.
from tests.test_realcluster_helm import (  # noqa: F401
    TIMEOUT,
    Case,
    helm,
    helm_binary,
    installed,
    refused_outright,
    report,
)

pytestmark = pytest.mark.realcluster


def test_one_command_uninstalling_the_operator_and_the_app(realcluster: RealCluster, helm: Helm,  # noqa: F811
                                                           tmp_path: Path) -> None:
    """`helm uninstall OP APP` and `helm uninstall APP OP` (the operator's release: its namespace, Deployment, CRD
    and CriticalService; the app's: its namespace and the CRs), replay on, two stacks at once. Helm uninstalls the
    releases in the order named and stops at the first that fails (cmd/helm/uninstall.go#L58-L68). Operator first:
    its pass is refused (the Deployment, its namespace, the CriticalService), helm exits 1 naming the operator's
    release, the gate's warnings above, and never touches the app's, which stays `deployed`; the CRD the pass
    deleted takes the CRs with it and replay finishes the operator's part, leaving the app's namespace. App first:
    the app goes, then the operator's pass is refused and replay finishes it. Either way the safe order holds at
    every store event, and one more `helm uninstall` of what `helm list -a` still lists exits 0."""
    cases = [Case.make(tmp_path, "operator named first", "hn-op", replay=True, split=True),
             Case.make(tmp_path, "app named first", "hn-app", replay=True, split=True)]
    op_first, app_first = cases

    def named(case: Case) -> list[str]:
        operator, app = case.releases  # in install order: the operator's, then the app's
        return [operator, app] if case is op_first else [app, operator]

    with installed(realcluster, helm, cases):
        for case in cases:
            case.observer = Observer(realcluster.admin, case.paths, interval=0.0)
            case.observer.start()
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(cases)) as pool:
            outcomes = list(pool.map(lambda c: helm.run("uninstall", *named(c)), cases))
        for case, outcome in zip(cases, outcomes, strict=True):
            operator, app = case.releases
            s = case.story
            refused_outright(outcome, operator)
            assert f"failed to delete release: {app}" not in outcome.stderr, str(outcome)
            deployment = f"deployments.apps {s.namespace}/{s.name('finalizer-deployment')}"
            assert f"{deployment} may not be deleted while" in outcome.stderr, str(outcome)
            assert f"{deployment}: the gate deletes it once that is over" in outcome.stderr, str(outcome)
            said = [line for line in outcome.stdout.splitlines() if line.endswith("uninstalled")]
            assert said == ([] if case is op_first else [f'release "{app}" uninstalled']), outcome.stdout
            print(f"  helm uninstall {' '.join(named(case))}: {outcome}\n{outcome.stdout}")
        listed = helm.releases()
        (op_release, app_release), (op_release2, app_release2) = (list(c.releases) for c in cases)
        assert {r: listed.get(r) for r in (op_release, app_release, op_release2, app_release2)} == {
            op_release: "uninstalling", app_release: "deployed", op_release2: "uninstalling", app_release2: None}
        # Replay finishes what the operator's pass was refused; the app's namespace stays with its release.
        app_namespace = f"Namespace/{op_first.story.cr_namespace}"
        wait_for(lambda: op_first.left(realcluster) == {app_namespace} and not app_first.left(realcluster),
                 timeout=TIMEOUT, what=f"replay to finish: left {[c.left(realcluster) for c in cases]}")
        finished = time.monotonic() - started
        listed = helm.releases()
        again = [helm.run("uninstall", *[r for r in named(case) if r in listed]) for case in cases]
        # Operator first left both records (the app's to uninstall, the operator's to purge); app first, the operator's.
        assert [o.args[1:3] for o in again] == [(op_release, app_release), (op_release2, "--namespace")]
        for outcome in again:
            assert outcome.returncode == 0, str(outcome)
        assert not set(helm.releases()) & {r for c in cases for r in c.releases}
        wait_for(lambda: not any(c.left(realcluster) for c in cases), timeout=TIMEOUT, what="every stack gone")
        for case in cases:
            observer = case.observer
            assert observer is not None
            wait_for(lambda: set(case.paths) <= set(observer.first_gone), timeout=30,  # noqa: B023
                     what="the observer's last round")
            print(report(case, started))
            assert observer.order_violations(case.dependents) == [], observer.order()
        print(f"  replay done {finished:.1f} s after the uninstalls; re-runs: "
              f"{[f'{o.args[:3]} exit {o.returncode}' for o in again]}")
