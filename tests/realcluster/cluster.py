"""One real cluster with the gate installed, on one kube-apiserver or several behind a balancer: what the
`realcluster` fixture, the modules with a cluster of their own and `up` start."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest

from . import build
from .build import Binaries
from .client import Client
from .controlplane import ControlPlane
from .gate import InstalledGate, install


@attrs.define
class RealCluster:
    plane: ControlPlane
    gate: InstalledGate
    admin: Client

    @property
    def kubeconfig(self) -> Path:
        return self.plane.admin_kubeconfig

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60, kubeconfig: Path | None = None) -> Any:
        """kubectl as the admin, through the balancer (or `kubeconfig`, e.g. `plane.kubeconfig_for(i)`)."""
        return self.plane.kubectl(*args, input=input, timeout=timeout, kubeconfig=kubeconfig)

    def logs(self) -> str:
        return f"{self.plane.logs()}\n{self.gate.logs()}"


def built_binaries() -> Binaries:
    """The selected Kubernetes version's binaries, built if missing; skips the test, saying what is
    missing, when they cannot be built here (no Go toolchain)."""
    binaries = build.cached(build.selected_minor())
    if binaries is None:
        reason = build.missing_toolchain()
        if reason is not None:
            pytest.skip(reason)
        binaries = build.ensure_built(build.selected_minor())
    return binaries


@contextlib.contextmanager
def real_cluster(binaries: Binaries, directory: Path, *, replicas: int = 1, workloads: bool = True,
                 apiservers: int = 1, lagging: Sequence[int] = ()) -> Iterator[RealCluster]:
    """etcd, `apiservers` kube-apiservers (behind a balancer when more than one; those in `lagging` read
    their webhook configurations through a pausable proxy, `plane.webhook_lag(i)`), kube-controller-manager
    (and with `workloads` kube-scheduler, kwok and its Node: pods run), the install applied, `replicas`
    gates serving (through the balancer)."""
    plane = ControlPlane(binaries, directory, workloads=workloads, apiservers=apiservers, lagging=lagging)
    gate: InstalledGate | None = None
    admin: Client | None = None
    try:
        plane.start()
        gate = install(plane, directory / "gate")
        if replicas == 1:
            gate.start()
        else:
            gate.start_behind_service(replicas)
        admin = Client(plane.admin_kubeconfig)
        yield RealCluster(plane, gate, admin)
    finally:
        if admin is not None:
            admin.close()
        if gate is not None:
            gate.stop()
        plane.stop()

