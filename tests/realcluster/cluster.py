"""One real cluster with the gate installed: what the `realcluster` fixture and `up` both start."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

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

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 60) -> Any:
        return self.plane.kubectl(*args, input=input, timeout=timeout)

    def logs(self) -> str:
        return f"{self.plane.logs()}\n{self.gate.logs()}"


@contextlib.contextmanager
def real_cluster(binaries: Binaries, directory: Path, *, replicas: int = 1) -> Iterator[RealCluster]:
    """etcd, kube-apiserver and kube-controller-manager, the install applied, `replicas` gates serving."""
    plane = ControlPlane(binaries, directory)
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

