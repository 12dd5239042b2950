"""The gate installed on the real control plane as a user installs it, running outside the cluster.

    criticalsvc certs --out DIR --san 127.0.0.1
    criticalsvc manifests --ca-bundle-from DIR --webhook-url https://127.0.0.1:PORT | kubectl apply -f -
    kubectl create token criticalsvc -n criticalsvc-system     -> a kubeconfig with that token
    criticalsvc serve --kubeconfig ... --tls-cert DIR/tls.crt --tls-key DIR/tls.key --listen 127.0.0.1:PORT

The CRD, the ServiceAccount, the shipped least-privilege RBAC and the webhook configuration are the
ones `criticalsvc manifests` prints; the gate authenticates with its ServiceAccount's token, so every
read and write it makes is checked by the real RBAC authorizer. Each `GateProcess` is one
`criticalsvc serve` replica (its own log, its own ops port), started and stopped by the tests.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx
from cryptography import x509

from .controlplane import ControlPlane, ControlPlaneError, Process, free_port, poll, write_kubeconfig
from .loadbalancer import Backend, LoadBalancer
from .secretvolume import project

GATE_NAMESPACE = "criticalsvc-system"
SERVICE_ACCOUNT = "criticalsvc"
TOKEN_DURATION = "48h"
READY_TIMEOUT = 60.0


def criticalsvc(*args: str, input: str | None = None) -> str:
    """Run the CLI as a user would; its stdout (raises with stderr on failure)."""
    done = subprocess.run([sys.executable, "-m", "criticalsvc", *args], capture_output=True, text=True, input=input,
                          check=False, timeout=120)
    if done.returncode != 0:
        raise ControlPlaneError(f"criticalsvc {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def served_certificate(port: int, ca: Path) -> x509.Certificate:
    """The certificate the gate presents on a new handshake to `port`, verified as the API server verifies
    it (the caBundle's CA, the name 127.0.0.1)."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
            context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


SHUTDOWN_DELAY = 1.5
SECRET_KEYS = ("ca.crt", "tls.crt", "tls.key")  # the keys of the Secret `criticalsvc certs` writes (secret.yaml)


@attrs.define
class GateProcess:
    """One `criticalsvc serve` replica in live mode."""

    process: Process
    port_file: Path
    certs: Path  # the directory its --tls-cert and --tls-key are in
    ops_url: str = ""
    webhook_port: int = 0
    ops_port: int = 0

    def start(self, *, timeout: float = READY_TIMEOUT) -> GateProcess:
        self.port_file.unlink(missing_ok=True)
        self.process.start()
        poll(self.port_file.exists, timeout=timeout, what=f"{self.process.name} to listen",
             alive=self.process.check_alive, interval=0.05)
        ports = json.loads(self.port_file.read_text())
        self.ops_url = f"http://127.0.0.1:{ports['ops_listen']}"
        poll(self.ready, timeout=timeout, what=f"{self.process.name} /readyz", alive=self.process.check_alive)
        return self

    def ready(self) -> bool:
        return httpx.get(f"{self.ops_url}/readyz", timeout=2).status_code == 200

    def metrics(self) -> str:
        return httpx.get(f"{self.ops_url}/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`, on this replica's /metrics now."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def served_certificate(self, ca: Path) -> x509.Certificate:
        """The certificate this replica presents on a new handshake to its own port."""
        return served_certificate(self.webhook_port, ca)

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.stop(grace=0)


@attrs.define
class InstalledGate:
    """The install (certificates, manifests, token) and the replicas serving it."""

    plane: ControlPlane
    directory: Path
    port: int
    kubeconfig: Path
    certs: Path
    replicas: list[GateProcess] = attrs.field(factory=list)
    balancer: LoadBalancer | None = None  # set when the replicas run behind a stand-in for the Service

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def replica(self, index: int = 0, *, webhook_port: int | None = None, ops_port: int = 0,
                certs: Path | None = None, extra_args: tuple[str, ...] = ()) -> GateProcess:
        name = f"gate-{index}"
        port = webhook_port or self.port
        certs = certs or self.certs
        return GateProcess(Process(name, [
            sys.executable, "-m", "criticalsvc", "serve", "--kubeconfig", str(self.kubeconfig),
            "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
            "--listen", f"127.0.0.1:{port}", "--ops-listen", f"127.0.0.1:{ops_port}",
            "--port-file", str(self.directory / f"{name}.ports.json"), "--identity", name,
            "--lease-namespace", GATE_NAMESPACE, "--log-level", "info", *extra_args,
        ], self.directory / f"{name}.log"), self.directory / f"{name}.ports.json", certs, webhook_port=port,
            ops_port=ops_port)

    def start(self) -> GateProcess:
        """One replica serving the webhook port itself (no Service in between)."""
        gate = self.replica(len(self.replicas)).start()
        self.replicas.append(gate)
        return gate

    def start_behind_service(self, replicas: int, *, timeout: float = READY_TIMEOUT) -> list[GateProcess]:
        """`replicas` replicas on ports of their own behind a loopback load balancer on the webhook port,
        which routes only to replicas whose /readyz answers 200 (as a Service's endpoints would); each
        started once the one before is ready, within `timeout` seconds."""
        self.balancer = LoadBalancer(self.port).start()
        for _ in range(replicas):
            self.add_replica(timeout=timeout)
        return self.replicas

    def add_replica(self, *, timeout: float = READY_TIMEOUT) -> GateProcess:
        """One more replica behind the load balancer (ports fixed for its lifetime, so restarts keep them),
        serving the pair from a Secret volume of its own (`<name>.tls`, tests/realcluster/secretvolume.py),
        as each pod's kubelet keeps its own copy of the Secret."""
        assert self.balancer is not None, "start_behind_service first"
        index = len(self.replicas)
        volume = self.directory / f"gate-{index}.tls"
        project(volume, {name: (self.certs / name).read_bytes() for name in SECRET_KEYS})
        # As the shipped Deployment does (--shutdown-delay 5), a stopping replica answers, not ready, until
        # the balancer's next health checks have taken it out (every 0.25 s here, so 1.5 s is plenty).
        gate = self.replica(index, webhook_port=free_port(), ops_port=free_port(), certs=volume,
                            extra_args=("--shutdown-delay", str(SHUTDOWN_DELAY)))
        self.replicas.append(gate)
        self.balancer.set_backends([Backend(g.process.name, g.webhook_port, g.ops_port) for g in self.replicas])
        return gate.start(timeout=timeout)

    def stop(self) -> None:
        for gate in self.replicas:
            gate.stop()
        if self.balancer is not None:
            self.balancer.stop()
            self.balancer = None

    def restart(self) -> GateProcess:
        """Stop every replica and start a single one on the webhook port."""
        self.stop()
        self.replicas.clear()
        return self.start()

    @contextlib.contextmanager
    def restarted_with(self, *args: str) -> Iterator[GateProcess]:
        """The gate restarted as one replica with `serve` options `args` for the block; restarted as it was after."""
        self.stop()
        self.replicas.clear()
        gate = self.replica(0, extra_args=args).start()
        self.replicas.append(gate)
        try:
            yield gate
        finally:
            self.restart()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Every replica stopped (SIGSTOP: a hung node - the process holds its sockets and answers nothing), then
        continued."""
        processes = [r.process for r in self.replicas]
        for process in processes:
            process.signal(signal.SIGSTOP)
        try:
            yield
        finally:
            for process in processes:
                process.signal(signal.SIGCONT)

    def logs(self, lines: int = 60) -> str:
        return "\n".join(f"--- {g.process.name} ({g.process.log_path}) ---\n{g.process.tail(lines)}"
                         for g in self.replicas)


def install(plane: ControlPlane, directory: Path) -> InstalledGate:
    """Apply the install with the webhooks pointed at a loopback port, and mint the gate's token."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_dir = directory / "certs"
    criticalsvc("certs", "--out", str(cert_dir), "--san", "127.0.0.1")
    port = free_port()
    manifests = criticalsvc("manifests", "--ca-bundle-from", str(cert_dir), "--webhook-url", f"https://127.0.0.1:{port}")
    applied = plane.kubectl("apply", "-f", "-", input=manifests)
    if applied.returncode != 0:
        raise ControlPlaneError(f"kubectl apply of the install failed: {applied.stderr.strip()}")
    return outside_gate(plane, directory, port=port, cert_dir=cert_dir)


def outside_gate(plane: ControlPlane, directory: Path, *, port: int, cert_dir: Path) -> InstalledGate:
    """The gate of an install whose webhooks call https://127.0.0.1:PORT (by `criticalsvc manifests` or the
    Helm chart): a kubeconfig with its ServiceAccount's token, and the serving pair from `cert_dir`."""
    directory.mkdir(parents=True, exist_ok=True)
    token = plane.kubectl("create", "token", SERVICE_ACCOUNT, "-n", GATE_NAMESPACE, "--duration", TOKEN_DURATION)
    if token.returncode != 0:
        raise ControlPlaneError(f"kubectl create token failed: {token.stderr.strip()}")
    kubeconfig = write_kubeconfig(directory / "gate.kubeconfig", server=plane.url, ca_cert=plane.pki.ca_cert,
                                  name="criticalsvc-gate", user={"token": token.stdout.strip()})
    return InstalledGate(plane, directory, port, kubeconfig, cert_dir)
