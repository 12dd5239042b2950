"""An HA control plane in the harness (issue 34): three kube-apiservers over one etcd, one of them lagging
on webhook configurations, and the hazard that makes, seen as a user sees it.

With API server 1's view of ValidatingWebhookConfigurations paused (`plane.webhook_lag(1)`), a
configuration created through API server 0 that refuses a dry-run CREATE of one ConfigMap (its webhook
calls a closed loopback port with failurePolicy Fail, so a request routed to it fails "failed calling
webhook") is in force through API servers 0 and 2 and NOT through 1, which admits the request - for as
long as the pause lasts, not for the milliseconds an informer normally takes; through the balancer, the
same request is refused or admitted depending on which API server the connection lands on. A write of
anything else through API server 1 still goes through (only webhook configurations lag). Resumed, API
server 1 catches up and refuses too. No gate is installed: this is Kubernetes' own behaviour, which the
gate's design has to live with (design/routing.md).

The balancer and the pausable link (tests/realcluster/loadbalancer.py) are tested on their own first,
against a loopback echo server; so are the control plane's refusals of impossible layouts.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from tests.realcluster import admission_metrics
from tests.realcluster.admission_metrics import AdmissionCalls, Sample
from tests.realcluster.build import Binaries
from tests.realcluster.client import Client
from tests.realcluster.cluster import built_binaries
from tests.realcluster.controlplane import ControlPlane, free_port, gate_requests, running
from tests.realcluster.loadbalancer import Backend, LoadBalancer
from tests.realcluster.teardown import wait_for

NAMESPACE = "lag"
GUARDED = "guarded"  # the one ConfigMap name the webhook configuration routes
CONFIGURATION = "deny-guarded"
LAGGING = 1
HELD_FOR = 3.0  # seconds API server 1 must keep admitting once 0 and 2 refuse: far beyond an informer's lag
FAILED_CALL = "failed calling webhook"
WEBHOOK = "deny-guarded.lag.test"


# --- the balancer and the pausable link, on loopback ------------------------------------------------------

class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = cast(_EchoServer, self.server)
        self.request.sendall(server.name)  # who answered, then echo
        while data := self.request.recv(65536):
            server.received.append(data)
            self.request.sendall(data)


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.name = name
        self.received: list[bytes] = []  # what reached this backend
        threading.Thread(target=self.serve_forever, daemon=True).start()


@pytest.fixture
def echoes() -> Iterator[list[_EchoServer]]:
    servers = [_EchoServer(f"echo-{i}|".encode()) for i in range(3)]
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def _receive(sock: socket.socket, size: int, *, timeout: float = 5) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_the_balancer_sends_each_new_connection_to_the_next_backend(echoes: list[_EchoServer]) -> None:
    """Round robin per connection over backends without a health check: six connections, each backend twice,
    in turn; a connection stays with its backend."""
    balancer = LoadBalancer(free_port(), name="test-balancer", backends=[
        Backend(f"echo-{i}", e.server_address[1]) for i, e in enumerate(echoes)]).start()
    try:
        answered = []
        for _ in range(6):
            with _connect(balancer.port) as sock:
                answered.append(_receive(sock, 7))
                sock.sendall(b"again")
                assert _receive(sock, 5) == b"again"
        assert answered[:3] == answered[3:] and sorted(answered[:3]) == [b"echo-0|", b"echo-1|", b"echo-2|"], answered
    finally:
        balancer.stop()


def test_a_paused_link_holds_the_bytes_and_delivers_them_on_resume(echoes: list[_EchoServer]) -> None:
    """Paused, nothing moves on an open connection, and a new one is accepted but hangs; resumed, both carry
    on with every byte sent meanwhile, in order."""
    link = LoadBalancer(free_port(), name="test-link", backends=[Backend("echo", echoes[0].server_address[1])]).start()
    try:
        with _connect(link.port) as sock:
            assert _receive(sock, 7) == b"echo-0|"
            link.pause()
            assert link.paused
            sock.sendall(b"held-1")
            with pytest.raises(TimeoutError):
                _receive(sock, 1, timeout=0.5)
            late = _connect(link.port)  # accepted (the kernel's backlog), then left hanging
            late.sendall(b"held-2")
            with pytest.raises(TimeoutError):
                _receive(late, 1, timeout=0.5)
            assert echoes[0].received == [], "bytes went through the paused link"
            link.resume()
            assert _receive(sock, 6) == b"held-1"
            assert _receive(late, 13) == b"echo-0|held-2"
            assert b"".join(echoes[0].received) in (b"held-1held-2", b"held-2held-1")
            late.close()
    finally:
        link.stop()


def test_impossible_layouts_are_refused_with_what_is_wrong(tmp_path: Path) -> None:
    """A lagging index that is no API server, zero API servers, a resource that is no webhook configuration,
    and `webhook_lag` of an API server that does not lag: a ValueError naming it, before anything starts."""
    binaries = cast(Binaries, None)  # nothing is started: the layout is checked first
    with pytest.raises(ValueError, match=r"no API server 3 among 3"):
        ControlPlane(binaries, tmp_path, apiservers=3, lagging=(3,))
    with pytest.raises(ValueError, match=r"apiservers=0\): at least one"):
        ControlPlane(binaries, tmp_path, apiservers=0)
    with pytest.raises(ValueError, match=r"'pods' is not one of validatingwebhookconfigurations"):
        ControlPlane(binaries, tmp_path, apiservers=2, lagging=(1,), lagging_resources=("pods",))
    plane = ControlPlane(binaries, tmp_path, apiservers=2, lagging=(1,))
    with pytest.raises(ValueError, match=r"webhook_lag\(0\): API server 0 is not lagging"):
        plane.webhook_lag(0)
    with pytest.raises(ValueError, match=r"kubeconfig_for\(2\): no API server 2 among 2"):
        plane.kubeconfig_for(2)


def _audit_event(audit_id: str, verb: str, name: str) -> str:
    return json.dumps({"auditID": audit_id, "verb": verb, "requestReceivedTimestamp": "2026-12-07T03:00:00.000000Z",
                       "objectRef": {"resource": "leases", "apiGroup": "coordination.k8s.io", "name": name},
                       "responseStatus": {"code": 200}}) + "\n"


def test_the_audit_logs_of_several_api_servers_are_read_as_one(tmp_path: Path) -> None:
    """With two API servers, each writing its own audit log, `gate_requests` and the merged `audit_log` see
    the requests of both, a request once (its audit ID), and never a line still being written."""
    plane = ControlPlane(cast(Binaries, None), tmp_path, apiservers=2)
    first, second = plane.audit_logs
    assert (first.name, second.name) == ("audit-0.log", "audit-1.log")
    first.write_text(_audit_event("a", "get", "x") + _audit_event("b", "update", "x"))
    second.write_text(_audit_event("c", "watch", "y") + _audit_event("c", "watch", "y") + '{"auditID": "d", "ver')
    expected = [("get", "x"), ("update", "x"), ("watch", "y")]
    assert sorted((r["verb"], r["name"]) for r in gate_requests(plane.audit_logs)) == expected
    assert sorted((r["verb"], r["name"]) for r in gate_requests(plane.audit_log)) == expected
    alone = ControlPlane(cast(Binaries, None), tmp_path / "one")
    assert alone.audit_log == alone.audit_logs[0] == tmp_path / "one" / "audit.log"  # one API server: as before


# --- three API servers, API server 1 lagging -----------------------------------------------------------

@pytest.fixture(scope="module")
def apiservers_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Three API servers, API server 1 lagging on webhook configurations; no workloads, no gate (the cheapest
    plane that shows the hazard). Under this name conftest's failure hook attaches its logs."""
    started = time.monotonic()
    with running(built_binaries(), tmp_path_factory.mktemp("apiservers"), apiservers=3, lagging=(LAGGING,)) as plane:
        print(f"\nthree API servers up in {time.monotonic() - started:.1f} s")
        created = plane.kubectl("create", "namespace", NAMESPACE)
        assert created.returncode == 0, created.stderr
        yield plane


def _configuration(port: int) -> str:
    """A ValidatingWebhookConfiguration routing one request - a CREATE of ConfigMap `guarded` in `lag` - to a
    webhook on a closed loopback port: failurePolicy Fail makes that request fail while it is routed."""
    return json.dumps({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIGURATION},
        "webhooks": [{
            "name": WEBHOOK, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 2,
            "clientConfig": {"url": f"https://127.0.0.1:{port}/deny"},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["configmaps"]}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            "matchConditions": [{"name": "guarded", "expression": f"object.metadata.name == '{GUARDED}'"}],
        }],
    })


def _dry_run_create(plane: ControlPlane, via: int | None) -> tuple[bool, str]:
    """`kubectl create configmap guarded --dry-run=server` through API server `via` (None: the balancer):
    whether it was admitted, and what kubectl said."""
    kubeconfig = None if via is None else plane.kubeconfig_for(via)
    done = plane.kubectl("create", "configmap", GUARDED, "-n", NAMESPACE, "--dry-run=server", "-o", "name",
                         kubeconfig=kubeconfig)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def _refused(plane: ControlPlane, via: int | None, refusals: list[int | None]) -> bool:
    """Whether the dry-run CREATE through `via` was refused (then recorded in `refusals`): by the webhook's
    failed call, never for another reason."""
    admitted, said = _dry_run_create(plane, via)
    assert admitted or FAILED_CALL in said, said
    if not admitted:
        refusals.append(via)
    return not admitted


def _failed_calls(source: ControlPlane | Client) -> Counter[Sample]:
    return admission_metrics.scrape(source, webhooks=WEBHOOK)


@pytest.mark.realcluster
def test_a_lagging_api_server_admits_what_the_others_refuse_until_it_catches_up(apiservers_plane: ControlPlane) -> None:
    """API server 1 paused on webhook configurations: a configuration created through 0 is in force through
    0 and 2 and not through 1, which goes on admitting the routed request for as long as it lags (and the
    balancer's clients meet both answers), while it stores other writes at once; resumed, API server 1
    refuses it too. Each API server's /metrics counts the failed webhook calls it made, and the plane's
    scrape sums them."""
    plane = apiservers_plane
    assert len(set(plane.urls)) == 3 and plane.url not in plane.urls
    for via in range(3):  # nothing routes it yet, anywhere
        admitted, said = _dry_run_create(plane, via)
        assert admitted, said
    lagging = Client(plane.kubeconfig_for(LAGGING))
    before, before_lagging = _failed_calls(plane), _failed_calls(lagging)
    refusals: list[int | None] = []
    timings: dict[str, float] = {}
    try:
        with plane.webhook_lag(LAGGING):
            stored = time.monotonic()
            created = plane.kubectl("create", "-f", "-", input=_configuration(free_port()),
                                    kubeconfig=plane.kubeconfig_for(0))
            assert created.returncode == 0, created.stderr
            for via in (0, 2):
                wait_for(lambda via=via: _refused(plane, via, refusals), timeout=30,
                         interval=0.1, what=f"API server {via} to route the CREATE to the webhook")
                timings[f"in force on {via}"] = time.monotonic() - stored
            # Not a race with propagation: API server 1 keeps admitting it for seconds after 0 and 2 refuse.
            admitted_by_lagging = 0
            while time.monotonic() - stored < timings["in force on 2"] + HELD_FOR:
                admitted, said = _dry_run_create(plane, LAGGING)
                assert admitted, f"API server {LAGGING} refused while its view was paused: {said}"
                admitted_by_lagging += 1
            assert _failed_calls(lagging) == before_lagging, "API server 1 called the webhook while paused"
            # What a client of the balancer sees: each new connection (a kubectl run) lands on the next API server.
            through_balancer = [not _refused(plane, None, refusals) for _ in range(3)]
            assert True in through_balancer and False in through_balancer, through_balancer
            # Only webhook configurations lag: a ConfigMap written through API server 1 is stored at once.
            written = plane.kubectl("create", "configmap", "unrelated", "-n", NAMESPACE, "--from-literal=k=v",
                                    kubeconfig=plane.kubeconfig_for(LAGGING), timeout=10)
            assert written.returncode == 0, written.stderr
            read = plane.kubectl("get", "configmap", "unrelated", "-n", NAMESPACE, "-o", "jsonpath={.data.k}",
                                 kubeconfig=plane.kubeconfig_for(0))
            assert read.stdout == "v", read
            paused_for = time.monotonic() - stored
        resumed = time.monotonic()
        wait_for(lambda: _refused(plane, LAGGING, refusals), timeout=30, interval=0.1,
                 what=f"API server {LAGGING} to catch up and route the CREATE after the resume")
        timings[f"in force on {LAGGING} after resume"] = time.monotonic() - resumed
        failed = AdmissionCalls.between(before, _failed_calls(plane))
        failed_on_lagging = AdmissionCalls.between(before_lagging, _failed_calls(lagging))
    finally:
        lagging.close()
        plane.webhook_lag(LAGGING).resume()
        plane.kubectl("delete", "validatingwebhookconfiguration", CONFIGURATION, "--ignore-not-found",
                      kubeconfig=plane.kubeconfig_for(0))
    print(f"\npaused {paused_for:.1f} s: API server {LAGGING} admitted {admitted_by_lagging} of {admitted_by_lagging} "
          f"routed dry-run CREATEs after 0 and 2 refused; through the balancer, admitted {through_balancer}; "
          + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items())
          + f"; failed webhook calls the API servers counted: {failed.failed} (API server {LAGGING}: "
          f"{failed_on_lagging.failed})")
    # Every refusal was one failed call, counted by the API server that made it; the scrape sums the three.
    assert failed.calls == failed.failed == len(refusals), (failed, refusals)
    # API server 1 made one: after the resume (while paused it routed nothing, and the balancer's refusals
    # came from 0 and 2).
    assert failed_on_lagging.calls == failed_on_lagging.failed == 1, failed_on_lagging
