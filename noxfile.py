"""Sessions: tests (the default CI run), scenarios (big property profile), explore (the model checker's large
bound), operators (discover against real projects' installs), mutants, lint, typecheck, bench."""

import os
import shutil

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session) -> None:
    session.install("-e", ".[test]")


@nox.session
def tests(session: nox.Session) -> None:
    """The full test suite; HYPOTHESIS_PROFILE=ci (set by .ci/run) derandomizes it.

    With a Go toolchain on PATH the real control plane is built first (once per version, cached
    outside the checkout; minutes when cold) so that the `realcluster` tests run; without one they
    skip, saying so.
    """
    _install(session)
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")}
    if shutil.which("go") is not None:
        session.run("python", "-m", "tests.realcluster", "build")
    # Two workers: one owns the real control plane (every realcluster test, one xdist_group: see
    # tests/conftest.py), the other runs the unit and property tests meanwhile. `-- -n0` (or any -n,
    # --dist, -p no:xdist) to choose otherwise.
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a.endswith("no:xdist") for a in session.posargs)
    parallel = [] if chosen else ["-n", "2", "--dist", "loadgroup"]
    # The slowest tests, printed at every run: where CI's time goes (issue #22) stays visible.
    durations = [] if any(a.startswith("--durations") for a in session.posargs) else ["--durations=40"]
    # Left to `nox -s operators` and `nox -s realcluster-slow` (real projects and real binaries that take
    # minutes of CI's 20-minute budget: see there) unless files are named.
    apart = [] if session.posargs else [f"--ignore={OPERATORS_TEST}", *(f"--ignore=tests/{name}" for name in
                                                                      SLOW_REALCLUSTER)]
    # pytest exits 5 when nothing was collected (e.g. -k matched nothing); that is not a failure here.
    session.run("pytest", *parallel, *durations, *apart, *session.posargs, env=env, success_codes=[0, 5])


OPERATORS_TEST = "tests/test_realcluster_discover.py"


@nox.session
def operators(session: nox.Session) -> None:
    """`criticalsvc discover` against cert-manager, Kyverno, Crossplane and Flux installed on the real control plane,
    checked against design/discover.md's table, and each one's teardown with and without discover's proposals. Not
    in the CI run: installing them (30 CRDs, Kyverno's alone 90,000 lines) nine times and tearing them down take
    6.5 minutes (382 s measured, 370 s of it pytest's) of a 20-minute budget."""
    _install(session)
    if shutil.which("go") is not None:
        session.run("python", "-m", "tests.realcluster", "build")
    session.run("pytest", "-p", "no:xdist", OPERATORS_TEST, *session.posargs)


# Real-binary tests that take minutes, kept out of `nox -s tests` (CI's 20-minute budget):
# Argo CD's (its application controller reacts to changes on its own schedule, and each test syncs stacks from
# Git before deleting them; 449 s warm; see the file's docstring and README "Deleting an Argo CD Application"),
# `helm uninstall OPERATOR APP` in one command (20 s warm, over the ~15 s a CI addition may take), and the HA
# harness shown with Kubernetes alone (~25 s: a lagging API server admits what the others refuse, no gate
# installed); the gate on three API servers, one lagging, stays in CI (tests/test_realcluster_apiservers_gate.py).
SLOW_REALCLUSTER = ("test_realcluster_argocd.py", "test_realcluster_helm_releases.py", "test_realcluster_apiservers.py")


@nox.session(name="realcluster-slow")
def realcluster_slow(session: nox.Session) -> None:
    """The slow real-binary tests (SLOW_REALCLUSTER: Argo CD's real application controller and repo-server; helm
    uninstalling two releases in one command; the HA harness with Kubernetes alone), one file at a time on one
    worker; builds what they need first (cached outside the checkout; Argo CD ~17 min
    cold, which is why `nox -s tests` does not build it)."""
    _install(session)
    session.run("python", "-m", "tests.realcluster", "build", "--argocd")
    files = session.posargs or [f"tests/{name}" for name in SLOW_REALCLUSTER]
    session.run("pytest", "-p", "no:xdist", "--durations=20", *files)


@nox.session
def realcluster(session: nox.Session) -> None:
    """The real control plane for people: `nox -s realcluster -- up --kubeconfig-out PATH` (Ctrl-C stops it)."""
    _install(session)
    session.run("python", "-m", "tests.realcluster", *(session.posargs or ["up"]))


@nox.session
def scenarios(session: nox.Session) -> None:
    """Teardown scenario properties; `-- --big` runs the deep profile."""
    _install(session)
    profile = "big" if "--big" in session.posargs else "ci"
    args = [a for a in session.posargs if a != "--big"]
    session.run("pytest", "tests/test_scenarios.py", *args, env={"HYPOTHESIS_PROFILE": profile})


@nox.session
def explore(session: nox.Session) -> None:
    """The bounded model checker at its large bound (design/criticalservice.md §7): every pair of CriticalServices
    over the catalogue, with and without the deletion-protected label, every deleter, replay off and on. CI runs
    the `ci` and `ci-pairs` bounds in tests/test_verify.py. `-- --bound large,depth=2` (or any bound) to go further;
    minimized bundles of what it finds go to verify-findings/. Exit 1 when something is found."""
    _install(session)
    args = session.posargs or ["--bound", "large", "--jobs", "2"]
    session.run("criticalsvc", "verify", *args)


@nox.session
def mutants(session: nox.Session) -> None:
    """One-line mutants of the safety checks, each of which the non-realcluster tests must catch
    (tests/mutants.py; `-- --list`, or `-- NAME...` for some). Not part of the default run."""
    _install(session)
    session.run("python", "-m", "tests.mutants", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff", "import-linter")
    _install(session)
    session.run("ruff", "check", "criticalsvc", "tests")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("mypy", "types-PyYAML")
    _install(session)
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (not part of the test run); writes bench-results/results.json and prints a table.

    `nox -s bench` runs them all; `nox -s bench -- latency --duration 10` runs one with its options.
    The latency benchmark needs wrk (Debian package `wrk`): installed here when missing and apt-get
    can run (root), as .ci/run does for kubectl; otherwise that benchmark reports itself skipped.
    """
    session.install("-e", ".[test,bench]")
    if shutil.which("wrk") is None and shutil.which("apt-get") and os.geteuid() == 0:
        session.run("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk",
                    external=True, success_codes=[0, 100])
    session.run("python", "-m", "benchmarks", *session.posargs)
