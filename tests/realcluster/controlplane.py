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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from criticalsvc import certs

from .build import Binaries

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/24"
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
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager in `directory`, and with `workloads`
    kube-scheduler + kwok and its Node; `start()`, then `stop()`."""

    binaries: Binaries
    directory: Path
    workloads: bool = False
    pki: PKI = attrs.field(init=False)
    etcd: Process = attrs.field(init=False)
    apiserver: Process = attrs.field(init=False)
    controller_manager: Process = attrs.field(init=False)
    scheduler: Process = attrs.field(init=False)
    kwok: Process = attrs.field(init=False)
    apiserver_port: int = attrs.field(init=False, default=0)
    etcd_url: str = attrs.field(init=False, default="")
    admin_kubeconfig: Path = attrs.field(init=False)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    def processes(self) -> list[Process]:
        names = ("etcd", "apiserver", "controller_manager", "scheduler", "kwok")
        return [p for p in (getattr(self, n, None) for n in names) if p is not None]

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

        self.apiserver_port = free_port()
        self.apiserver = Process("kube-apiserver", self.apiserver_argv(), self.directory / "kube-apiserver.log")
        self.apiserver.start()
        self.wait_apiserver_ready()
        self.admin_kubeconfig = write_kubeconfig(
            self.directory / "admin.kubeconfig", server=self.url, ca_cert=self.pki.ca_cert, name="realcluster-admin",
            user={"client-certificate": str(self.pki.admin_cert), "client-key": str(self.pki.admin_key)})

        kcm_port = free_port()
        self.controller_manager = Process("kube-controller-manager", [
            str(self.binaries.kube_controller_manager), "--kubeconfig", str(self.admin_kubeconfig),
            "--authentication-kubeconfig", str(self.admin_kubeconfig),
            "--authorization-kubeconfig", str(self.admin_kubeconfig),
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
        self.scheduler = Process("kube-scheduler", [
            str(self.binaries.kube_scheduler), "--kubeconfig", str(self.admin_kubeconfig),
            "--authentication-kubeconfig", str(self.admin_kubeconfig),
            "--authorization-kubeconfig", str(self.admin_kubeconfig),
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
            str(self.binaries.kwok), "--kubeconfig", str(self.admin_kubeconfig),
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
    def audit_log(self) -> Path:
        """The API server's audit log: one JSON line per request the gate's ServiceAccount makes."""
        return self.directory / "audit.log"

    def apiserver_argv(self) -> list[str]:
        pki = self.pki
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY)
        return [
            str(self.binaries.kube_apiserver), "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(self.apiserver_port),
            "--tls-cert-file", str(pki.apiserver_cert), "--tls-private-key-file", str(pki.apiserver_key),
            "--client-ca-file", str(pki.ca_cert), "--authorization-mode", "RBAC",
            "--service-account-issuer", ISSUER, "--service-account-key-file", str(pki.sa_pub),
            "--service-account-signing-key-file", str(pki.sa_key),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--cert-dir", str(self.directory / "apiserver-certs"),
            # The `kubernetes` Service's endpoints may not be a loopback address; nothing here needs them.
            "--endpoint-reconciler-type", "none",
            "--profiling=false", "--enable-priority-and-fairness=false",
            "--audit-policy-file", str(policy), "--audit-log-path", str(self.audit_log),
            "--audit-log-format", "json",
        ]

    def wait_apiserver_ready(self) -> None:
        poll(lambda: _http_ok(f"{self.url}/readyz", ca=self.pki.ca_cert), timeout=READY_TIMEOUT,
             what="kube-apiserver /readyz", alive=self.apiserver.check_alive, interval=0.2)

    def restart_apiserver(self) -> None:
        self.apiserver.stop()
        self.apiserver.start()
        self.wait_apiserver_ready()

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
        for process in reversed(self.processes()):
            process.stop()


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
def running(binaries: Binaries, directory: Path, *, workloads: bool = False) -> Iterator[ControlPlane]:
    plane = ControlPlane(binaries, directory, workloads=workloads)
    try:
        yield plane.start()
    finally:
        plane.stop()


def gate_requests(audit_log: Path, *, since: float = 0.0) -> list[dict[str, str]]:
    """The gate's requests in the audit log (one per request: verb, resource, name, code), after `since`
    (a Unix time). A watch is counted once, when its response started."""
    seen: dict[str, dict[str, str]] = {}
    if not audit_log.exists():
        return []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        stamp = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if stamp.timestamp() < since or event["auditID"] in seen:
            continue
        ref = event.get("objectRef") or {}
        seen[event["auditID"]] = {"verb": event["verb"], "resource": ref.get("resource", ""),
                                  "group": ref.get("apiGroup", ""), "name": ref.get("name", ""),
                                  "code": str((event.get("responseStatus") or {}).get("code", ""))}
    return list(seen.values())
