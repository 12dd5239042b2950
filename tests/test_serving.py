"""The webhook on real sockets: `criticalsvc serve` over TLS, client certificates, certificate reload, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import logging
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import orjson
import pytest
import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from criticalsvc.admission import AdmissionRequest
from criticalsvc.api import CRDS, GroupResource, ObjectRef
from criticalsvc.decision import Decision
from criticalsvc.manifests import load_path
from criticalsvc.server import StaticStateSource, Webhook
from criticalsvc.serving import Endpoint, Service, TLSFiles
from criticalsvc.snapshot import build_state

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
STORY = ROOT / "api/examples/reference-story.yaml"
DELETE_PROVIDER = orjson.loads((ROOT / "api/examples/reviews/delete-provider.json").read_bytes())
LOCAL = Endpoint("127.0.0.1", 0)
DEADLINE = 10.0  # seconds any poll may take before the test fails


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- a small PKI, made fresh for the test run --------------------------------------------------------
@attrs.frozen
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return Issued(cert_path, key_path)


class CA:
    """A certificate authority that issues server and client certificates (EC P-256: fast to make)."""

    def __init__(self, directory: Path, cn: str) -> None:
        self.cn = cn
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.path = _write(directory / cn, self.cert, self.key).cert

    def issue(self, cn: str, *, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(self.cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                  else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False)
        )
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return _write(self.directory / f"{self.cn}-{cn}", builder.sign(self.key, hashes.SHA256()), key)


@attrs.frozen
class PKI:
    server_ca: CA
    server: Issued
    client_ca: CA
    client: Issued
    other_ca: CA          # a second, unrelated CA for rotation
    other_server: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    directory = tmp_path_factory.mktemp("pki")
    server_ca, client_ca, other_ca = CA(directory, "server-ca"), CA(directory, "client-ca"), CA(directory, "other-ca")
    return PKI(server_ca, server_ca.issue("webhook", server=True), client_ca,
               client_ca.issue("kube-apiserver", server=False), other_ca, other_ca.issue("webhook", server=True))


def install(issued: Issued, directory: Path) -> Issued:
    """Copy a certificate and key to the paths the server is told to read (so tests can replace them)."""
    target = Issued(directory / "tls.crt", directory / "tls.key")
    replace(target, issued)
    return target


def replace(target: Issued, new: Issued) -> None:
    """Swap in new certificate files the way a rotation tool does: write aside, rename over."""
    for src, dst in ((new.key, target.key), (new.cert, target.cert)):
        tmp = dst.with_suffix(".tmp")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)


def client_context(ca: CA, client: Issued | None = None, *, alpn: list[str] | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.path))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


async def handshake(port: int, context: ssl.SSLContext) -> ssl.SSLObject:
    """Open a fresh TLS connection (no session reuse) and return its SSL object after the handshake."""
    _, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname="localhost"), 5)
    ssl_object: ssl.SSLObject = writer.get_extra_info("ssl_object")
    writer.close()
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        await writer.wait_closed()
    return ssl_object


async def issuer_of_presented_cert(port: int, context: ssl.SSLContext) -> str:
    ssl_object = await handshake(port, context)
    der = ssl_object.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).issuer.rfc4514_string()


async def poll(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# --- the real process ------------------------------------------------------------------------------
@attrs.define
class Server:
    process: subprocess.Popen[bytes]
    port: int
    ops_port: int
    stderr: Path

    def log_lines(self) -> list[dict[str, Any]]:
        return [orjson.loads(line) for line in self.stderr.read_bytes().splitlines() if line.startswith(b"{")]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(DEADLINE)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def start_server(directory: Path, tls: Issued, *extra: str) -> Server:
    """Start `criticalsvc serve` on free ports; return once the ports are known (not yet ready)."""
    port_file, stderr = directory / "ports.json", directory / "serve.log"
    with open(stderr, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "criticalsvc", "serve", "--state", str(STORY), "--listen", "127.0.0.1:0",
             "--ops-listen", "127.0.0.1:0", "--tls-cert", str(tls.cert), "--tls-key", str(tls.key),
             "--port-file", str(port_file), *extra],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + DEADLINE
    while not port_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            process.wait()
            raise AssertionError(f"serve did not start: {stderr.read_text()}")
        time.sleep(0.02)
    ports = orjson.loads(port_file.read_bytes())
    return Server(process, ports["listen"], ports["ops_listen"], stderr)


async def wait_ready(server: Server) -> None:
    async def ready() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{server.ops_port}/readyz")).status_code == 200
        except httpx.TransportError:
            return False

    await poll(ready, "/readyz on the ops port")


@pytest.fixture(scope="module")
def mtls_server(pki: PKI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One `serve` process requiring client certificates, shared by the read-only tests."""
    directory = tmp_path_factory.mktemp("mtls")
    server = start_server(directory, install(pki.server, directory), "--client-ca", str(pki.client_ca.path))
    try:
        asyncio.run(wait_ready(server))
        yield server
    finally:
        server.stop()


async def test_readyz_answers_on_the_plain_ops_port(mtls_server: Server) -> None:
    """/readyz and /healthz answer over plain HTTP on the ops port, with no client certificate."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{mtls_server.ops_port}") as client:
        assert (await client.get("/readyz")).json() == {"ready": True}
        assert (await client.get("/healthz")).status_code == 200
        assert (await client.post("/validate", json=DELETE_PROVIDER)).status_code == 404


async def test_review_over_https_with_client_certificate(pki: PKI, mtls_server: Server) -> None:
    """A review POSTed over HTTPS/1.1 with the API server's client certificate gets the gate's 403 denial."""
    context = client_context(pki.server_ca, pki.client)
    async with httpx.AsyncClient(verify=context, base_url=f"https://localhost:{mtls_server.port}") as client:
        response = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                     headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.http_version == "HTTP/1.1"
    body = response.json()["response"]
    assert body["uid"] == DELETE_PROVIDER["request"]["uid"]
    assert body["allowed"] is False and body["status"]["code"] == 403


async def test_handshake_without_client_certificate_fails(pki: PKI, mtls_server: Server) -> None:
    """With --client-ca, a client that presents no certificate gets no answer."""
    context = client_context(pki.server_ca)
    async with httpx.AsyncClient(verify=context, base_url=f"https://localhost:{mtls_server.port}") as client:
        with pytest.raises(httpx.TransportError):
            await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                              headers={"content-type": "application/json"})


async def test_client_certificate_from_another_ca_is_refused(pki: PKI, mtls_server: Server) -> None:
    """A client certificate the --client-ca did not sign is refused like none at all."""
    stranger = pki.other_ca.issue("intruder", server=False)
    context = client_context(pki.server_ca, stranger)
    async with httpx.AsyncClient(verify=context, base_url=f"https://localhost:{mtls_server.port}") as client:
        with pytest.raises(httpx.TransportError):
            await client.get("/healthz")


async def test_alpn_selects_http11_even_when_h2_is_offered(pki: PKI, mtls_server: Server) -> None:
    """The webhook listener negotiates only http/1.1, which is what the API server speaks to webhooks."""
    ssl_object = await handshake(mtls_server.port, client_context(pki.server_ca, pki.client, alpn=["h2", "http/1.1"]))
    assert ssl_object.selected_alpn_protocol() == "http/1.1"


async def test_oversize_declared_body_gets_413_over_the_socket(pki: PKI, mtls_server: Server) -> None:
    """A request announcing a body over 3 MiB is answered 413 after its headers alone."""
    reader, writer = await asyncio.open_connection("127.0.0.1", mtls_server.port,
                                                   ssl=client_context(pki.server_ca, pki.client),
                                                   server_hostname="localhost")
    writer.write(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 4194304\r\n\r\n")
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 5)
    response = await asyncio.wait_for(reader.read(), 5)  # the server closes: nothing more can follow
    writer.close()
    assert status_line.startswith(b"HTTP/1.1 413")
    assert b"over the limit of 3145728 bytes" in response


async def test_metrics_on_the_ops_port_count_served_decisions(pki: PKI, mtls_server: Server) -> None:
    """Decisions served over TLS show up in /metrics on the ops port."""
    context = client_context(pki.server_ca, pki.client)
    async with httpx.AsyncClient(verify=context, base_url=f"https://localhost:{mtls_server.port}") as client:
        await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                          headers={"content-type": "application/json"})
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{mtls_server.ops_port}/metrics")).text
    assert ('criticalsvc_decisions_total{operation="DELETE",resource="deployments.apps",result="denied",'
            'rule="blocked"}') in text
    # The event-loop lag probe runs in the serving process (every 20 ms since it started serving).
    lag_count = next(line for line in text.splitlines() if line.startswith("criticalsvc_event_loop_lag_seconds_count"))
    assert float(lag_count.split()[-1]) > 0, lag_count


async def test_sighup_reloads_replaced_certificate_files(pki: PKI, tmp_path: Path) -> None:
    """After the cert files are replaced and SIGHUP arrives, new handshakes present the new certificate."""
    tls = install(pki.server, tmp_path)
    server = start_server(tmp_path, tls, "--cert-check-interval", "3600")  # only SIGHUP can reload here
    try:
        await wait_ready(server)
        old, new = client_context(pki.server_ca), client_context(pki.other_ca)
        assert await issuer_of_presented_cert(server.port, old) == "CN=server-ca"
        replace(tls, pki.other_server)
        assert await issuer_of_presented_cert(server.port, old) == "CN=server-ca"  # not reloaded yet
        server.process.send_signal(signal.SIGHUP)

        async def presents_new() -> bool:
            try:
                return await issuer_of_presented_cert(server.port, new) == "CN=other-ca"
            except ssl.SSLCertVerificationError:
                return False

        await poll(presents_new, "the new certificate")
        assert any(line["event"] == "certificate reloaded" for line in server.log_lines())
    finally:
        assert server.stop() == 0


async def test_sigterm_exits_zero_with_idle_keepalive_connection(pki: PKI, tmp_path: Path) -> None:
    """SIGTERM stops the server promptly with exit code 0, with an idle keep-alive connection open."""
    server = start_server(tmp_path, install(pki.server, tmp_path))
    try:
        await wait_ready(server)
        # Like the API server's Go client: one request, then the connection idles while the client keeps
        # reading it, so it notices the server's TLS close_notify and closes its end.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client_context(pki.server_ca),
                                                       server_hostname="localhost")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert (await reader.readuntil(b"ok\n")).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(reader.read(), DEADLINE) == b""  # the server closed the idle connection
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
        code = await asyncio.to_thread(server.process.wait, DEADLINE)
        assert code == 0
        assert time.monotonic() - started < 5  # neither the 120 s keep-alive nor the 10 s grace period
        assert [line["event"] for line in server.log_lines()][-1] == "stopped"
    finally:
        server.stop()


async def test_sigterm_with_a_shutdown_delay_keeps_answering_not_ready_then_exits(pki: PKI, tmp_path: Path) -> None:
    """--shutdown-delay: after SIGTERM /readyz is 503 at once, yet a review sent on a keep-alive
    connection the client already holds is answered (with `Connection: close`, so the client does not
    reuse it); the process exits 0 once the delay is over."""
    delay = 2.0
    server = start_server(tmp_path, install(pki.server, tmp_path), "--shutdown-delay", str(delay))
    try:
        await wait_ready(server)
        async with httpx.AsyncClient(verify=client_context(pki.server_ca),
                                     base_url=f"https://localhost:{server.port}") as client:
            first = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                      headers={"content-type": "application/json"})
            assert first.status_code == 200 and "connection" not in first.headers
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)

            async def not_ready() -> bool:
                async with httpx.AsyncClient() as ops:
                    return (await ops.get(f"http://127.0.0.1:{server.ops_port}/readyz")).status_code == 503

            await poll(not_ready, "/readyz to fail after SIGTERM")
            second = await client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                       headers={"content-type": "application/json"})
            assert time.monotonic() - started < delay, "the review came too late to show anything"
        assert second.status_code == 200 and second.headers["connection"] == "close"
        assert second.json()["response"]["allowed"] is False
        code = await asyncio.to_thread(server.process.wait, DEADLINE)
        assert code == 0 and time.monotonic() - started >= delay
    finally:
        server.stop()


# --- in-process: the Service object ----------------------------------------------------------------
def protected_allow_state() -> StaticStateSource:
    """The reference story with its criteria met: deleting the provider is an ALLOW that needs confirming."""
    state = build_state(load_path(str(STORY)))
    for obj in list(state.objects(GroupResource("my.crd.group", "coolresources"))):
        state.remove(obj.ref)
    state.remove(ObjectRef(CRDS, "", "coolresources.my.crd.group"))
    return StaticStateSource(state)


async def test_shutdown_finishes_the_in_flight_review(pki: PKI, tmp_path: Path) -> None:
    """A review in flight when shutdown begins still gets its answer; run() returns afterwards."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_confirm(request: AdmissionRequest, decision: Decision) -> Decision:
        entered.set()
        await release.wait()
        return decision

    webhook = Webhook(protected_allow_state(), confirm=slow_confirm, confirm_timeout=DEADLINE)
    service = Service(webhook, listen=LOCAL, tls=TLSFiles(str(pki.server.cert), str(pki.server.key)))
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop.wait))
    async with httpx.AsyncClient(verify=client_context(pki.server_ca),
                                 base_url=f"https://localhost:{service.webhook_address[1]}") as client:
        in_flight = asyncio.create_task(client.post("/validate", content=orjson.dumps(DELETE_PROVIDER),
                                                    headers={"content-type": "application/json"}))
        await asyncio.wait_for(entered.wait(), DEADLINE)
        stop.set()
        await asyncio.sleep(0.1)  # give the shutdown a head start: it must wait for the review anyway
        assert not running.done()
        release.set()
        response = await asyncio.wait_for(in_flight, DEADLINE)
    await asyncio.wait_for(running, DEADLINE)
    assert response.status_code == 200 and response.json()["response"]["allowed"] is True
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", service.webhook_address[1])


async def test_periodic_check_picks_up_rotated_certificate(pki: PKI, tmp_path: Path) -> None:
    """Without any signal, replaced certificate files are served within the check interval."""
    tls = install(pki.server, tmp_path)
    service = Service(Webhook(protected_allow_state()), listen=LOCAL, tls=TLSFiles(str(tls.cert), str(tls.key)),
                      cert_check_interval=0.05)
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop.wait))
    try:
        port = service.webhook_address[1]
        assert await issuer_of_presented_cert(port, client_context(pki.server_ca)) == "CN=server-ca"
        replace(tls, pki.other_server)

        async def presents_new() -> bool:
            try:
                return await issuer_of_presented_cert(port, client_context(pki.other_ca)) == "CN=other-ca"
            except ssl.SSLCertVerificationError:
                return False

        await poll(presents_new, "the rotated certificate")
    finally:
        stop.set()
        await asyncio.wait_for(running, DEADLINE)


async def test_mismatched_certificate_and_key_keep_the_old_pair(pki: PKI, tmp_path: Path) -> None:
    """A half-done rotation (new certificate, old key) is refused and the old certificate keeps serving."""
    tls = install(pki.server, tmp_path)
    webhook = Webhook(protected_allow_state())
    service = Service(webhook, listen=LOCAL, tls=TLSFiles(str(tls.cert), str(tls.key)), cert_check_interval=3600)
    stop = asyncio.Event()
    running = asyncio.create_task(service.run(stop.wait))
    try:
        port = service.webhook_address[1]
        await handshake(port, client_context(pki.server_ca))  # serving: the context exists
        tls.cert.write_bytes(pki.other_server.cert.read_bytes())  # the key is still the old one
        assert service.reload_certificates() is False
        assert await issuer_of_presented_cert(port, client_context(pki.server_ca)) == "CN=server-ca"
        metrics = webhook.metrics.exposition()[0].decode()
        assert 'criticalsvc_certificate_reloads_total{result="failed"} 1.0' in metrics
        tls.key.write_bytes(pki.other_server.key.read_bytes())  # the rotation completes
        assert service.reload_certificates() is True
        assert await issuer_of_presented_cert(port, client_context(pki.other_ca)) == "CN=other-ca"
    finally:
        stop.set()
        await asyncio.wait_for(running, DEADLINE)


# --- the command's input checks -------------------------------------------------------------------
BAD_FLAGS = [
    ({"--listen": "8443"}, "--listen: expected HOST:PORT"),
    ({"--ops-listen": "::1:8081"}, "--ops-listen: write an IPv6 address in brackets"),
    ({"--tls-cert": "/nonexistent/tls.crt"}, "--tls-cert: no such file: /nonexistent/tls.crt"),
    ({"--tls-key": str(STORY)}, "--tls-cert/--tls-key: cannot load the certificate and key"),
    ({"--tls-cert": "", "--tls-key": ""}, "--tls-cert/--tls-key: required"),
    ({"--state": "", "--kubeconfig": "/nonexistent/kubeconfig"}, "/nonexistent/kubeconfig: no such kubeconfig file"),
    ({"--shutdown-delay": "-1"}, "--shutdown-delay: must be between 0 and 300 seconds, got -1"),
]


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """`serve` configures process-wide logging once its flags check out; put the defaults back after."""
    handlers = list(logging.getLogger().handlers)
    level = logging.getLogger().level
    yield
    structlog.reset_defaults()
    logging.getLogger().handlers = handlers
    logging.getLogger().setLevel(level)


@pytest.mark.parametrize(("flags", "expected"), BAD_FLAGS, ids=[e for _, e in BAD_FLAGS])
@pytest.mark.usefixtures("restore_logging")
def test_serve_rejects_bad_flags_in_one_line(
    pki: PKI, capsys: pytest.CaptureFixture[str], flags: dict[str, str], expected: str
) -> None:
    """Bad addresses, unusable TLS files or no state stop `serve` with exit code 2 and one line naming the flag."""
    from criticalsvc.cli import main

    args = {"--state": str(STORY), "--listen": "127.0.0.1:0", "--ops-listen": "127.0.0.1:0",
            "--tls-cert": str(pki.server.cert), "--tls-key": str(pki.server.key), **flags}
    code = main(["serve", *(x for kv in args.items() for x in kv)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert expected in err and "\n" not in err


def test_serve_flag_defaults_mirror_the_server_constants() -> None:
    """The parser's defaults (kept import-light) are the server's own: 3 MiB body limit, cert check, levels."""
    from criticalsvc import live, logs, server, serving
    from criticalsvc.commands import serve

    assert serve.DEFAULT_MAX_BODY_BYTES == server.DEFAULT_MAX_BODY_BYTES == 3 * 1024 * 1024
    assert serve.CATCH_UP_ABOVE == live.CATCH_UP_ABOVE
    assert serve.CERT_CHECK_INTERVAL == serving.CERT_CHECK_INTERVAL
    assert serve.LOG_LEVELS == logs.LEVELS
    assert serve.EVENT_LOOPS == serving.EVENT_LOOPS


@pytest.mark.anyio
async def test_certs_command_output_serves_tls_that_verifies_against_its_ca(tmp_path: Path) -> None:
    """`criticalsvc certs` output, served by `criticalsvc serve`, passes a real handshake trusting only its ca.crt."""
    from criticalsvc.cli import main

    out = tmp_path / "certs"
    assert main(["certs", "--out", str(out), "--san", "127.0.0.1"]) == 0
    server = start_server(tmp_path, Issued(out / "tls.crt", out / "tls.key"))
    try:
        await wait_ready(server)
        review = orjson.loads((ROOT / "api/examples/reviews/delete-provider.json").read_bytes())
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(out / "ca.crt"))) as client:
            answer = (await client.post(f"https://127.0.0.1:{server.port}/validate", json=review)).json()
        assert answer["response"]["allowed"] is False
        other = tmp_path / "other"
        assert main(["certs", "--out", str(other), "--san", "127.0.0.1"]) == 0
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(other / "ca.crt"))) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(f"https://127.0.0.1:{server.port}/validate", json=review)
    finally:
        assert server.stop() == 0


def test_event_loop_uvloop_when_it_is_missing_is_one_line_naming_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--event-loop uvloop` without uvloop installed is a one-line error; auto falls back to asyncio's loop."""
    from criticalsvc.errors import InvalidInput
    from criticalsvc.serving import event_loop_factory

    assert event_loop_factory()[0] == "uvloop"  # installed with criticalsvc: the default
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    with pytest.raises(InvalidInput, match=r"^--event-loop: uvloop is not installed \(pip install uvloop\)$"):
        event_loop_factory("uvloop")
    assert event_loop_factory("auto") == ("asyncio", asyncio.new_event_loop)
    with pytest.raises(InvalidInput, match="--event-loop: expected one of auto, uvloop, asyncio, got 'tokio'"):
        event_loop_factory("tokio")
