"""A real Kubernetes control plane on loopback that runs workloads: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, and kwok playing the kubelet of one fake Node.

What runs, and why it is enough for the gate:
- etcd, one member, its data in the run's directory.
- kube-apiserver with what a production cluster has on the paths the gate uses: RBAC authorization,
  client-certificate and ServiceAccount-token authentication (issuer and signing keys, so
  TokenRequest works and the gate authenticates as its ServiceAccount), the default admission chain
  with ValidatingAdmissionWebhook, and a serving certificate for 127.0.0.1 from a CA of the run.
  Its binaries are stamped with the release they are built from (tests/realcluster/build.py), so
  `kubectl version`, GET /version and Helm's `kubeVersion` see that release.
- kube-controller-manager with the controllers a teardown meets: the namespace controller, the
  garbage collector, the Deployment and ReplicaSet controllers, the ServiceAccount and token
  controllers, ClusterRole aggregation (the gate's reader role is aggregated) and PVC protection;
  with workloads (the default of `real_cluster`, so of the shared `realcluster` fixture and `up`),
  also the node-lifecycle, Job, PersistentVolume binder and PV protection controllers.
- With workloads, kube-scheduler binds pods to one fake Node (`kwok-node-0`), and kwok
  (sigs.k8s.io/kwok, out of cluster, managing only the Nodes annotated `kwok.x-k8s.io/node: fake`)
  plays its kubelet with the stages kwok's module ships: the Node becomes Ready and heartbeats; a
  pod bound to it becomes Ready and Running, a Job's pod then Succeeded; a deleted pod is
  first marked (deletionTimestamp, grace period) by the API server, and goes when kwok, as a kubelet
  would after its containers stopped, deletes it with grace period 0. So Deployments become
  Available, Jobs Complete, and a namespace deletion waits for its pods' graceful deletion, as on a
  real cluster. No container runs: a pod's IP (127.1.0.0/16) and the Node's (127.0.0.1) are
  addresses nothing listens on.
- Without workloads (`ControlPlane(..., workloads=False)`, the default of the tests that start a
  plane of their own): no scheduler and no Node, pods stay Pending, and a pod never bound to a node
  goes at once on DELETE (no graceful termination without a kubelet to run it).

More than one API server (`apiservers=N`, as kubeadm's HA control plane runs them; one by default):
- N kube-apiservers over the one etcd, each on its own port with its own log and audit log, all with
  the same flags otherwise: one serving pair (its SANs hold 127.0.0.1, which names every port), one
  client CA, one ServiceAccount signing key (a token one issues, another accepts).
  `--endpoint-reconciler-type none` stays: nothing here reads the `kubernetes` Service's endpoints,
  so no API server has to publish itself.
- A loopback TCP balancer (tests/realcluster/loadbalancer.py) in front of them: each new connection to
  the next API server, TLS passed through. `url` and `admin_kubeconfig` point at it, so the admin's
  kubectl runs, the gate (its kubeconfig is written from `url`) and Flux spread over the API servers
  as clients of a load-balanced control plane do; `urls[i]` and `kubeconfig_for(i)` reach API server
  i alone. The control plane's own clients are pinned, as on kubeadm's nodes: the controller manager
  to API server 0, the scheduler to 1, kwok to 2 (modulo N).
- Each API server has its own webhook configuration informer, fed by its own watch cache, and
  nothing in Kubernetes bounds how far one lags behind another. `lagging=(i, ...)` makes that lag a
  test's to decide: API server i reads its webhook configurations (`lagging_resources`: validating,
  and optionally mutating) from etcd through a proxy, `webhook_lag(i)`, that holds the bytes while
  paused, so its watch stalls - the informer still serves the configuration it had - and resumed, it
  catches up from where it stopped. Every other resource it reads directly, so its writes of
  anything else go through while paused. Two side effects, both of the proxy and not of a real lag:
  while paused, that API server's /readyz fails (it checks each etcd override's health, so nothing
  waits on it then), and a pause of more than ~40 s makes its etcd client re-dial (gRPC keepalive
  30 s + 10 s timeout) before it catches up on resume.
  Why it is enough: the hazard is per API server, between a webhook configuration stored and that
  API server's informer holding it, and this produces exactly that state on a real kube-apiserver,
  for as long as a test needs, with everything else of the cluster current.
- One limit: kube-apiserver names its identity Lease after a hash of the host name
  (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/server/config.go#L404-L431),
  so the N API servers of one machine share one Lease in kube-system (label
  apiserver.kubernetes.io/identity=kube-apiserver), each renewing it as its holder in turn: counting
  API servers by their identity Leases finds one here.

Every process listens on a free loopback port (asked of the kernel), writes its log to a file in the
run's directory (kept, and printed by `ControlPlane.logs()`, when a test fails), is polled for
readiness rather than waited for, and is stopped with SIGTERM (SIGKILL after a grace period).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import attrs
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from criticalsvc import certs

from .build import Binaries
from .loadbalancer import Backend, LoadBalancer

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
ADMISSION_REGISTRATION = "admissionregistration.k8s.io"
VALIDATING_WEBHOOK_CONFIGURATIONS = "validatingwebhookconfigurations"
MUTATING_WEBHOOK_CONFIGURATIONS = "mutatingwebhookconfigurations"
# What a lagging API server may read late (`lagging_resources`): the resources its admission plugins'
# webhook informers watch.
WEBHOOK_CONFIGURATIONS = (VALIDATING_WEBHOOK_CONFIGURATIONS, MUTATING_WEBHOOK_CONFIGURATIONS)
ISSUER = "https://kubernetes.default.svc.cluster.local"
# The controllers a teardown meets (kube-controller-manager --help lists the names; the *-controller
# spelling is accepted since 1.28, the one before it still as an alias).
CONTROLLERS = (
    "namespace-controller", "garbage-collector-controller", "deployment-controller", "replicaset-controller",
    "serviceaccount-controller", "serviceaccount-token-controller", "clusterrole-aggregation-controller",
    # The API server's StorageObjectInUseProtection admission puts kubernetes.io/pvc-protection on every
    # PVC; only this controller takes it off, so without it a deleted PVC (and its namespace) stays forever.
    "persistentvolumeclaim-protection-controller",
)
# With workloads: NodeLifecycle takes the not-ready taint off the fake Node once kwok reports it Ready
# (and would taint it again if kwok stopped heartbeating); the Job controller runs Jobs to Complete;
# the PV binder binds a claim to its volume (Bound, as the conditions examples read), and PV
# protection takes kubernetes.io/pv-protection off a deleted, unbound volume.
WORKLOAD_CONTROLLERS = ("node-lifecycle-controller", "job-controller", "persistentvolume-binder-controller",
                        "persistentvolume-protection-controller")
KWOK_NODE = "kwok-node-0"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# What the fake Node offers the scheduler: room for every pod the tests and benchmarks create.
KWOK_NODE_RESOURCES = {"cpu": "64", "memory": "256Gi", "pods": "1000"}
KWOK_POD_CIDR = "127.1.0.0/16"  # loopback: a pod's IP is a value in its status, never a destination
# Every request of the gate's ServiceAccount, at Metadata level, once (when complete; a watch also
# when its response starts): what the gate costs the API server, counted by the tests and benchmarks.
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["system:serviceaccount:criticalsvc-system:criticalsvc"]
- level: None
"""
READY_TIMEOUT = 120.0  # a cold kube-apiserver on 2 busy cores takes ~10-20 s to install its APIs
STOP_GRACE = 10.0


class ControlPlaneError(RuntimeError):
    """A process of the control plane did not start, or died; the message carries its log's tail."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def poll(check: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1,
         alive: Callable[[], None] | None = None) -> None:
    """Call `check` until it returns True; `alive` raises when waiting is pointless (a process died)."""
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None:
            alive()
        with contextlib.suppress(Exception):
            if check():
                return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@attrs.define
class Process:
    """One control-plane process, its command line and its log file."""

    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = attrs.field(factory=dict)  # set in the process' environment, over ours

    def start(self) -> None:
        log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")} | self.env
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env=env, start_new_session=True)
        log.close()

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise ControlPlaneError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, grace: float = STOP_GRACE) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGCONT)  # a paused (SIGSTOP) process must run to exit
        self.popen.terminate()
        try:
            self.popen.wait(grace)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@attrs.frozen
class PKI:
    """The run's CA, the API server's serving pair, an admin client pair and the ServiceAccount key."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path


def _client_cert(ca: certs.KeyPair, *, user: str, groups: Sequence[str]) -> certs.KeyPair:
    """A client certificate: CN is the user name, each O a group (how kube-apiserver reads x509 clients)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
                        + [x509.NameAttribute(NameOID.COMMON_NAME, user)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca.key, hashes.SHA256()))
    return certs.KeyPair(key, cert)


def make_pki(directory: Path) -> PKI:
    directory.mkdir(parents=True, exist_ok=True)
    ca = certs.make_ca("criticalsvc-realcluster-ca")
    serving = certs.make_serving_cert(
        ca, ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"], ["127.0.0.1", "10.96.0.1"])
    admin = _client_cert(ca, user="criticalsvc-test-admin", groups=["system:masters"])
    sa = ec.generate_private_key(ec.SECP256R1())
    pki = PKI(*(directory / n for n in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key", "admin.crt",
                                        "admin.key", "sa.key", "sa.pub")))
    for path, data, private in (
        (pki.ca_cert, certs.cert_pem(ca.cert), False), (pki.ca_key, certs.key_pem(ca.key), True),
        (pki.apiserver_cert, certs.cert_pem(serving.cert), False),
        (pki.apiserver_key, certs.key_pem(serving.key), True),
        (pki.admin_cert, certs.cert_pem(admin.cert), False), (pki.admin_key, certs.key_pem(admin.key), True),
        (pki.sa_key, certs.key_pem(sa), True),
        (pki.sa_pub, sa.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo), False),
    ):
        certs.write_pem(path, data, private=private)
    return pki


def write_kubeconfig(path: Path, *, server: str, ca_cert: Path, user: dict[str, str], name: str,
                     namespace: str | None = None) -> Path:
    """A kubeconfig with the CA embedded; `user` is a kubeconfig user entry (client cert or token)."""
    context: dict[str, str] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": name, "preferences": {},
           "clusters": [{"name": name, "cluster": {"server": server,
                                                   "certificate-authority-data": base64.b64encode(
                                                       ca_cert.read_bytes()).decode()}}],
           "users": [{"name": name, "user": user}], "contexts": [{"name": name, "context": context}]}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


@attrs.define
class WebhookLag:
    """API server i's view of its webhook configurations, through a proxy to etcd a test can pause:
    `pause()` holds the bytes (the API server's watch on those resources stalls, as a lagging informer
    does; nothing is dropped), `resume()` lets them flow, `with lag:` is paused inside the block.

    While paused, that API server's own reads and writes of webhook configurations wait too (a GET or
    LIST is a consistent read, from etcd through the same proxy; `kubectl get
    validatingwebhookconfigurations` times out), and so does its /readyz: send those through another
    API server. Everything else it serves at once."""

    index: int
    resources: tuple[str, ...]
    proxy: LoadBalancer

    def pause(self) -> None:
        self.proxy.pause()

    def resume(self) -> None:
        self.proxy.resume()

    @property
    def paused(self) -> bool:
        return self.proxy.paused

    def __enter__(self) -> WebhookLag:
        self.pause()
        return self

    def __exit__(self, *exc: object) -> None:
        self.resume()


def _indexes(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _resources(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _valid_apiservers(_: object, __: object, value: int) -> None:
    if value < 1:
        raise ValueError(f"ControlPlane(apiservers={value}): at least one kube-apiserver")


@attrs.define
class ControlPlane:
    """etcd + `apiservers` kube-apiservers (+ a balancer in front when more than one) +
    kube-controller-manager in `directory`, and with `workloads` kube-scheduler + kwok and its Node;
    `start()`, then `stop()`. Each API server index in `lagging` reads `lagging_resources` through a
    pausable proxy to etcd (`webhook_lag(i)`)."""

    binaries: Binaries
    directory: Path
    workloads: bool = False
    apiservers: int = attrs.field(default=1, validator=_valid_apiservers)
    lagging: tuple[int, ...] = attrs.field(default=(), converter=_indexes)
    lagging_resources: tuple[str, ...] = attrs.field(default=(VALIDATING_WEBHOOK_CONFIGURATIONS,),
                                                     converter=_resources)
    pki: PKI = attrs.field(init=False)
    etcd: Process = attrs.field(init=False)
    kube_apiservers: list[Process] = attrs.field(init=False, factory=list)
    controller_manager: Process = attrs.field(init=False)
    scheduler: Process = attrs.field(init=False)
    kwok: Process = attrs.field(init=False)
    apiserver_ports: list[int] = attrs.field(init=False, factory=list)
    etcd_url: str = attrs.field(init=False, default="")
    admin_kubeconfig: Path = attrs.field(init=False)
    balancer: LoadBalancer | None = attrs.field(init=False, default=None)  # in front of the API servers, N > 1
    _lags: dict[int, WebhookLag] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        wrong = [i for i in self.lagging if not 0 <= i < self.apiservers]
        if wrong:
            raise ValueError(f"ControlPlane(lagging={self.lagging}): no API server {wrong[0]} among "
                             f"{self.apiservers} (indexes 0..{self.apiservers - 1})")
        unknown = [r for r in self.lagging_resources if r not in WEBHOOK_CONFIGURATIONS]
        if unknown:
            raise ValueError(f"ControlPlane(lagging_resources={self.lagging_resources}): {unknown[0]!r} is not "
                             f"one of {', '.join(WEBHOOK_CONFIGURATIONS)}")

    @property
    def apiserver(self) -> Process:
        """API server 0 (the only one unless `apiservers` > 1)."""
        return self.kube_apiservers[0]

    @property
    def apiserver_port(self) -> int:
        return self.apiserver_ports[0] if self.apiserver_ports else 0

    @property
    def urls(self) -> list[str]:
        """Each API server's own URL, by index."""
        return [f"https://127.0.0.1:{port}" for port in self.apiserver_ports]

    @property
    def url(self) -> str:
        """Where clients go: the API server, or with more than one the balancer in front of them all."""
        return self.balancer.url if self.balancer is not None else f"https://127.0.0.1:{self.apiserver_port}"

    def kubeconfig_for(self, index: int) -> Path:
        """The admin's kubeconfig pinned to API server `index` (with one API server, `admin_kubeconfig`)."""
        self._check_index(index, "kubeconfig_for")
        if self.apiservers == 1:
            return self.admin_kubeconfig
        return self.directory / f"admin-apiserver-{index}.kubeconfig"

    def webhook_lag(self, index: int) -> WebhookLag:
        """API server `index`'s pausable view of its webhook configurations (it must be in `lagging`)."""
        self._check_index(index, "webhook_lag")
        if index not in self._lags:
            raise ValueError(f"webhook_lag({index}): API server {index} is not lagging (ControlPlane(lagging="
                             f"{self.lagging}) decides which read their webhook configurations through a proxy)")
        return self._lags[index]

    def _check_index(self, index: int, what: str) -> None:
        if not 0 <= index < self.apiservers:
            raise ValueError(f"{what}({index}): no API server {index} among {self.apiservers} "
                             f"(indexes 0..{self.apiservers - 1})")

    def _suffix(self, index: int) -> str:
        """How API server `index`'s files and process are told apart: nothing when it is the only one."""
        return "" if self.apiservers == 1 else f"-{index}"

    def processes(self) -> list[Process]:
        before = [p for p in (getattr(self, "etcd", None),) if p is not None]
        after = [p for p in (getattr(self, n, None) for n in ("controller_manager", "scheduler", "kwok"))
                 if p is not None]
        return [*before, *self.kube_apiservers, *after]

    def start(self) -> ControlPlane:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.pki = make_pki(self.directory / "pki")
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        self.etcd = Process("etcd", [
            str(self.binaries.etcd), "--name", "default", "--data-dir", str(self.directory / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
            # The tests compact on purpose (expired watches); nothing else should.
            "--auto-compaction-retention", "0", "--quota-backend-bytes", str(2 * 1024**3),
            "--unsafe-no-fsync",  # a throwaway test store: durability is not what is tested
        ], self.directory / "etcd.log")
        self.etcd.start()
        poll(lambda: _http_ok(f"{self.etcd_url}/health"), timeout=READY_TIMEOUT, what="etcd /health",
             alive=self.etcd.check_alive)

        for index in self.lagging:
            proxy = LoadBalancer(free_port(), name=f"etcd-lag-{index}",
                                 backends=[Backend("etcd", client_port)]).start()
            self._lags[index] = WebhookLag(index, self.lagging_resources, proxy)
        # All at once, as a control plane's API servers come up after a restart; each bootstrap step they
        # share (RBAC defaults, system namespaces) tolerates another one having done it.
        self.apiserver_ports = [free_port() for _ in range(self.apiservers)]
        self.kube_apiservers = [Process(f"kube-apiserver{self._suffix(i)}", self.apiserver_argv(i),
                                        self.directory / f"kube-apiserver{self._suffix(i)}.log")
                                for i in range(self.apiservers)]
        for process in self.kube_apiservers:
            process.start()
        self.wait_apiserver_ready()
        if self.apiservers > 1:
            self.balancer = LoadBalancer(free_port(), name="apiserver-balancer", backends=[
                Backend(p.name, port) for p, port in zip(self.kube_apiservers, self.apiserver_ports, strict=True)
            ]).start()
        admin = {"client-certificate": str(self.pki.admin_cert), "client-key": str(self.pki.admin_key)}
        self.admin_kubeconfig = write_kubeconfig(
            self.directory / "admin.kubeconfig", server=self.url, ca_cert=self.pki.ca_cert, name="realcluster-admin",
            user=admin)
        if self.apiservers > 1:
            for index, url in enumerate(self.urls):
                write_kubeconfig(self.kubeconfig_for(index), server=url, ca_cert=self.pki.ca_cert,
                                 name=f"realcluster-admin-apiserver-{index}", user=admin)

        # The control plane's own clients, each on an API server of its own (as kubeadm points each
        # control-plane node's components at that node's API server): the controller manager on 0, the
        # scheduler on 1, kwok (the kubelet) on 2, wrapping around with fewer.
        kcm_kubeconfig = self._component_kubeconfig(0)
        kcm_port = free_port()
        self.controller_manager = Process("kube-controller-manager", [
            str(self.binaries.kube_controller_manager), "--kubeconfig", kcm_kubeconfig,
            "--authentication-kubeconfig", kcm_kubeconfig,
            "--authorization-kubeconfig", kcm_kubeconfig,
            "--bind-address", "127.0.0.1", "--secure-port", str(kcm_port),
            "--controllers", ",".join(CONTROLLERS + (WORKLOAD_CONTROLLERS if self.workloads else ())),
            "--leader-elect=false",
            "--service-account-private-key-file", str(self.pki.sa_key), "--root-ca-file", str(self.pki.ca_cert),
            "--use-service-account-credentials=false",
            # Resync and GC discovery as a production cluster does; nothing sped up that the gate relies on.
        ], self.directory / "kube-controller-manager.log")
        self.controller_manager.start()
        poll(lambda: _http_ok(f"https://127.0.0.1:{kcm_port}/healthz", insecure=True), timeout=READY_TIMEOUT,
             what="kube-controller-manager /healthz", alive=self.controller_manager.check_alive)
        # Ready for tests once the ServiceAccount controller has made `default` in `default`: the
        # controllers have started and synced their informers.
        poll(lambda: self.kubectl("get", "serviceaccount", "default", "-n", "default").returncode == 0,
             timeout=READY_TIMEOUT, what="the default ServiceAccount (controllers running)", interval=0.3,
             alive=self.check_alive)
        if self.workloads:
            self._start_workloads()
        return self

    def _start_workloads(self) -> None:
        """kube-scheduler, the fake Node and kwok; returns once the Node is Ready and untainted, so a
        pod created now is scheduled and run."""
        scheduler_port = free_port()
        scheduler_kubeconfig = self._component_kubeconfig(1)
        self.scheduler = Process("kube-scheduler", [
            str(self.binaries.kube_scheduler), "--kubeconfig", scheduler_kubeconfig,
            "--authentication-kubeconfig", scheduler_kubeconfig,
            "--authorization-kubeconfig", scheduler_kubeconfig,
            "--bind-address", "127.0.0.1", "--secure-port", str(scheduler_port), "--leader-elect=false",
        ], self.directory / "kube-scheduler.log")
        self.scheduler.start()
        # The Node as a kubelet registers it: capacity in its status; the API server's
        # TaintNodesByCondition admission adds node.kubernetes.io/not-ready:NoSchedule, and the
        # node-lifecycle controller removes it once kwok has reported the Node Ready.
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": KWOK_NODE, "annotations": {KWOK_ANNOTATION: "fake"},
                             "labels": {"kubernetes.io/hostname": KWOK_NODE, "kubernetes.io/os": "linux",
                                        "kubernetes.io/arch": "amd64", "type": "kwok"}},
                "status": {"capacity": KWOK_NODE_RESOURCES, "allocatable": KWOK_NODE_RESOURCES}}
        created = self.kubectl("create", "-f", "-", input=json.dumps(node))
        if created.returncode != 0:
            raise ControlPlaneError(f"could not create the Node {KWOK_NODE}: {created.stderr.strip()}")
        kwok_port = free_port()
        self.kwok = Process("kwok", [
            str(self.binaries.kwok), "--kubeconfig", self._component_kubeconfig(2),
            "--config", str(self.binaries.kwok_stages),
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector", f"{KWOK_ANNOTATION}=fake",
            "--node-ip", "127.0.0.1", "--cidr", KWOK_POD_CIDR, "--server-address", f"127.0.0.1:{kwok_port}",
        ], self.directory / "kwok.log")
        self.kwok.start()
        poll(lambda: _http_ok(f"https://127.0.0.1:{scheduler_port}/healthz", insecure=True), timeout=READY_TIMEOUT,
             what="kube-scheduler /healthz", alive=self.scheduler.check_alive)
        poll(self.node_ready, timeout=READY_TIMEOUT, what=f"the Node {KWOK_NODE} Ready and untainted (kwok, "
             "node-lifecycle controller)", interval=0.3, alive=self.check_alive)

    def node_ready(self) -> bool:
        """Whether the fake Node is Ready with no taint left: the scheduler will place pods on it."""
        got = self.kubectl("get", "node", KWOK_NODE, "-o", "json")
        if got.returncode != 0:
            return False
        node = json.loads(got.stdout)
        ready = [c for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
        return bool(ready) and ready[0]["status"] == "True" and not node.get("spec", {}).get("taints")

    @property
    def audit_logs(self) -> list[Path]:
        """Each API server's audit log, by index: one JSON line per request the gate's ServiceAccount makes."""
        return [self.directory / f"audit{self._suffix(i)}.log" for i in range(self.apiservers)]

    @property
    def audit_log(self) -> Path:
        """The audit log: the API server's; with more than one, every API server's events merged into one file
        now (rewritten at each access; `gate_requests` also reads `audit_logs` directly)."""
        if self.apiservers == 1:
            return self.audit_logs[0]
        merged = self.directory / "audit-merged.log"
        with merged.open("w") as out:
            for log in self.audit_logs:
                if log.exists():
                    # Whole lines only: an API server may be writing its last one right now.
                    out.writelines(line for line in log.read_text().splitlines(keepends=True) if line.endswith("\n"))
        return merged

    def _component_kubeconfig(self, index: int) -> str:
        """A control-plane component's kubeconfig: the admin's pinned to API server `index` mod N."""
        return str(self.kubeconfig_for(index % self.apiservers))

    def apiserver_argv(self, index: int = 0) -> list[str]:
        pki = self.pki
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        # kubeadm's HA layout: every API server over the one etcd, with the same serving pair (its SANs
        # hold 127.0.0.1, any port), client CA and ServiceAccount keys, so a token one issues the others accept.
        argv = [
            str(self.binaries.kube_apiserver), "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.apiserver_ports[index]),
            "--tls-cert-file", str(pki.apiserver_cert), "--tls-private-key-file", str(pki.apiserver_key),
            "--client-ca-file", str(pki.ca_cert), "--authorization-mode", "RBAC",
            "--service-account-issuer", ISSUER, "--service-account-key-file", str(pki.sa_pub),
            "--service-account-signing-key-file", str(pki.sa_key),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--cert-dir", str(self.directory / f"apiserver-certs{self._suffix(index)}"),
            # The `kubernetes` Service's endpoints may not be a loopback address; nothing here needs them.
            "--endpoint-reconciler-type", "none",
            "--profiling=false", "--enable-priority-and-fairness=false",
            "--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_logs[index]),
            "--audit-log-format", "json",
        ]
        if index in self._lags:
            # group/resource#servers, one override per resource, comma separated (EtcdOptions.AddFlags and
            # ParseEtcdServersOverrides, https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/server/options/etcd.go#L130-L134
            # and #L630-L653). The storage factory gives these resources a storage of their own on those
            # servers (https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/kubeapiserver/default_storage_factory_builder.go#L150-L160),
            # so their watch cache watches etcd through the proxy, and the admission plugin's webhook
            # configuration informer - a loopback client of this API server, served from that watch cache
            # (https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/apiserver/pkg/admission/configuration/validating_webhook_manager.go#L56-L70)
            # - sees a change only once the proxy lets it through. Every other resource reads etcd directly.
            proxied = f"http://127.0.0.1:{self._lags[index].proxy.port}"
            argv += ["--etcd-servers-overrides",
                     ",".join(f"{ADMISSION_REGISTRATION}/{resource}#{proxied}" for resource in self.lagging_resources)]
        return argv

    def wait_apiserver_ready(self, index: int | None = None) -> None:
        """Wait for /readyz of API server `index`, or of every one. A lagging API server that is paused is not
        ready (its override's etcd check stalls), so wait for it only when resumed."""
        for i in range(self.apiservers) if index is None else (index,):
            process = self.kube_apiservers[i]
            poll(lambda i=i: _http_ok(f"{self.urls[i]}/readyz", ca=self.pki.ca_cert),  # type: ignore[misc]
                 timeout=READY_TIMEOUT, what=f"{process.name} /readyz", alive=process.check_alive, interval=0.2)

    def restart_apiserver(self, index: int | None = None) -> None:
        """Restart API server `index` (SIGTERM, start, /readyz), or every one in turn, each once the one
        before is ready (a rolling restart; with one API server, that one)."""
        for i in range(self.apiservers) if index is None else (index,):
            self._check_index(i, "restart_apiserver")
            self.kube_apiservers[i].stop()
            self.kube_apiservers[i].start()
            self.wait_apiserver_ready(i)

    def wait_etcd_ready(self) -> None:
        poll(lambda: _http_ok(f"{self.etcd_url}/health"), timeout=READY_TIMEOUT, what="etcd /health",
             alive=self.etcd.check_alive)

    def restart_etcd(self, *, down: float = 0.0) -> None:
        """Stop etcd (SIGTERM), leave it down for `down` seconds, start it again on the same ports and data
        directory, and wait for its /health. The API server stays up and reconnects by itself."""
        self.etcd.stop()
        time.sleep(down)
        self.etcd.start()
        self.wait_etcd_ready()

    def check_alive(self) -> None:
        for process in self.processes():
            process.check_alive()

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """The built kubectl, as the admin unless another kubeconfig is given."""
        env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
        env["KUBECONFIG"] = str(kubeconfig or self.admin_kubeconfig)
        env["HOME"] = str(self.directory)  # kubectl's discovery cache stays in the run's directory
        return subprocess.run([str(self.binaries.kubectl), *args], env=env, input=input, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def logs(self, lines: int = 60) -> str:
        return "\n".join(f"--- {p.name} ({p.log_path}) ---\n{p.tail(lines)}" for p in self.processes())

    def stop(self) -> None:
        for lag in self._lags.values():
            lag.resume()  # an API server waiting on a held etcd connection shuts down slowly
        for process in reversed(self.processes()):
            process.stop()
        for lag in self._lags.values():
            lag.proxy.stop()
        self._lags.clear()
        if self.balancer is not None:
            self.balancer.stop()
            self.balancer = None


def _http_ok(url: str, *, ca: Path | None = None, insecure: bool = False) -> bool:
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        if insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(url, timeout=5) as response:
            return bool(response.status == 200)
    except urllib.error.URLError:
        return False


@contextlib.contextmanager
def running(binaries: Binaries, directory: Path, *, workloads: bool = False, apiservers: int = 1,
            lagging: Sequence[int] = ()) -> Iterator[ControlPlane]:
    plane = ControlPlane(binaries, directory, workloads=workloads, apiservers=apiservers, lagging=lagging)
    try:
        yield plane.start()
    finally:
        plane.stop()


def gate_requests(audit_log: Path | Sequence[Path], *, since: float = 0.0) -> list[dict[str, str]]:
    """The gate's requests in the audit log, or in several (each API server's: an audit ID is unique
    across them), one per request: verb, resource, name, code, after `since` (a Unix time). A watch is
    counted once, when its response started."""
    seen: dict[str, dict[str, str]] = {}
    logs = [audit_log] if isinstance(audit_log, Path) else list(audit_log)
    lines = [line for log in logs if log.exists() for line in log.read_text().splitlines(keepends=True)]
    for line in lines:
        if not line.endswith("\n"):
            continue  # being written right now
        event = json.loads(line)
        stamp = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if stamp.timestamp() < since or event["auditID"] in seen:
            continue
        ref = event.get("objectRef") or {}
        seen[event["auditID"]] = {"verb": event["verb"], "resource": ref.get("resource", ""),
                                  "group": ref.get("apiGroup", ""), "name": ref.get("name", ""),
                                  "code": str((event.get("responseStatus") or {}).get("code", ""))}
    return list(seen.values())
