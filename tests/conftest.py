"""Shared fixtures and the hypothesis profiles.

Profiles: `ci` (derandomized, no deadline: deterministic on a noisy 2-core machine), `dev` (random,
fewer examples), `big` (deep runs: `nox -s scenarios -- --big`). HYPOTHESIS_PROFILE selects one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tests.backends import Backend
    from tests.realcluster.cluster import RealCluster

settings.register_profile(
    "ci", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.register_profile(
    "big", deadline=None, max_examples=5000, suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# --- the real control plane (tests marked `realcluster`) ---------------------------------------------

# CI runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`, noxfile.py): every test of the
# real control plane goes to ONE worker, which alone starts the session's `realcluster` (and the clusters
# of the modules that start their own: HA, faults, concurrent), while the other worker runs the CPU-bound
# unit and property tests. The realcluster tests mostly wait on controllers (backoffs, GC, the namespace
# controller), so the two overlap well on 2 cores. Plain `pytest` (no xdist) is unchanged.
REALCLUSTER_GROUP = "realcluster"


def _needs_the_real_control_plane(item: pytest.Item) -> bool:
    return item.get_closest_marker("realcluster") is not None or "realcluster" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("dist", "no") != "loadgroup":
        return
    real = [item for item in items if _needs_the_real_control_plane(item)]
    for item in real:
        item.add_marker(pytest.mark.xdist_group(REALCLUSTER_GROUP))
    # The group is one work unit, scheduled in collection order: put it first, so that its (longest)
    # worker starts at once and the other worker takes the rest one test at a time.
    chosen = set(map(id, real))
    items[:] = real + [item for item in items if id(item) not in chosen]


@pytest.fixture(scope="session")
def realcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """kube-apiserver, kube-controller-manager and etcd built from the Kubernetes Go modules, with the
    gate installed as a user installs it; one per test session. Skips, saying what is missing, when
    the binaries cannot be built here (no Go toolchain)."""
    from tests.realcluster.cluster import built_binaries, real_cluster

    with real_cluster(built_binaries(), tmp_path_factory.mktemp("realcluster")) as cluster:
        yield cluster


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failing realcluster test carries the tails of the control plane's and the gate's logs."""
    report = yield
    funcargs = getattr(item, "funcargs", {}) if report.failed else {}
    if "realcluster" in getattr(item, "fixturenames", ()):
        cluster = funcargs.get("realcluster")
        if cluster is not None:
            report.sections.append(("realcluster logs", cluster.logs()))
    # Flux's kustomize-controller (tests/test_realcluster_flux*.py): its log says why it did what it did.
    flux = funcargs.get("kustomize_controller")
    if flux is not None:
        report.sections.append(("kustomize-controller log", flux[0].logs(80)))
    plane = funcargs.get("flux_plane")
    if plane is not None:
        report.sections.append(("the Flux gate module's control plane, kustomize-controller and gate", plane.logs()))
    plane = funcargs.get("apiservers_plane")
    if plane is not None:
        report.sections.append(("the three API servers' control plane", plane.logs()))
    return report


@pytest.fixture(params=["standin", pytest.param("real", marks=pytest.mark.realcluster)])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The test runs once on the stand-in (a fresh `serve --embedded`) and once on the real control
    plane (the session's; tests use unique names there)."""
    from tests.backends import Embedded, RealBackend, StandInBackend

    if request.param == "real":
        yield RealBackend(request.getfixturevalue("realcluster"))
        return
    embedded = Embedded(tmp_path)
    backend = StandInBackend(embedded, tmp_path)
    try:
        yield backend
    finally:
        backend.admin.close()
        code, _ = embedded.stop()
        embedded.log.close()
        assert code == 0, "serve --embedded did not shut down cleanly within 10 s of SIGTERM"


@pytest.fixture
def namespace(cluster: Backend) -> Iterator[str]:
    """A fresh namespace on the `cluster`, deleted afterwards."""
    from tests.backends import unique

    name = unique("api")
    created = cluster.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                          "metadata": {"name": name}})
    assert created.status_code == 201, created.text
    yield name
    cluster.admin.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Any]:
    """`criticalsvc serve --embedded` for one test; it must shut down cleanly on SIGTERM."""
    from tests.backends import Embedded

    e = Embedded(tmp_path)
    try:
        yield e
    finally:
        code, _seconds = e.stop()
        log = e.output()
        e.log.close()
        assert code == 0, f"serve --embedded did not shut down cleanly within 10 s of SIGTERM:\n{log}"
