"""`criticalsvc certs`: the CA and serving certificate verify, and a real TLS handshake trusts them.

Certificates are checked with `cryptography` (signature, extensions, SANs) and with Python's own
TLS stack: an asyncio server on 127.0.0.1 (port 0) presents the generated certificate and a client
that trusts only ca.crt must complete the handshake — and must fail with another CA or name.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import ssl
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from criticalsvc import certs, cli

SERVICE_NAMES = ["criticalsvc", "criticalsvc.criticalsvc-system", "criticalsvc.criticalsvc-system.svc",
                 "criticalsvc.criticalsvc-system.svc.cluster.local"]
API_SERVER_NAME = "criticalsvc.criticalsvc-system.svc"  # the name the API server dials


def run_certs(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["certs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def cert_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    """A `criticalsvc certs` directory for the default service, with 127.0.0.1 as an extra SAN, and its stdout."""
    out = tmp_path / "certs"
    code, stdout, _ = run_certs(capsys, "--out", str(out), "--san", "127.0.0.1", "--san", "gate.example.com")
    assert code == 0
    return out, stdout


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


# --- the certificates ------------------------------------------------------------------------------------

def test_the_serving_certificate_chains_to_the_ca(cert_dir: tuple[Path, str]) -> None:
    """tls.crt is signed by ca.crt's key (ECDSA P-256 signature verified) and names ca.crt as issuer."""
    out, _ = cert_dir
    ca, serving = load(out / "ca.crt"), load(out / "tls.crt")
    ca_key = ca.public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey) and isinstance(ca_key.curve, ec.SECP256R1)
    assert serving.signature_hash_algorithm is not None
    ca_key.verify(serving.signature, serving.tbs_certificate_bytes, ec.ECDSA(serving.signature_hash_algorithm))
    assert serving.issuer == ca.subject
    serving.verify_directly_issued_by(ca)


def test_a_certificate_from_another_ca_does_not_verify(cert_dir: tuple[Path, str]) -> None:
    """The signature check is real: a certificate from another CA with the same name fails it."""
    out, _ = cert_dir
    impostor = certs.make_ca(load(out / "ca.crt").subject.rfc4514_string().removeprefix("CN="))
    stranger = certs.make_serving_cert(impostor, SERVICE_NAMES).cert
    assert stranger.issuer == load(out / "ca.crt").subject
    with pytest.raises(InvalidSignature):
        stranger.verify_directly_issued_by(load(out / "ca.crt"))


def test_the_ca_is_a_ca_and_the_serving_certificate_is_not(cert_dir: tuple[Path, str]) -> None:
    """ca.crt has CA:true and keyCertSign; tls.crt has CA:false, serverAuth and digitalSignature only."""
    out, _ = cert_dir
    ca, serving = load(out / "ca.crt"), load(out / "tls.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    assert serving.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = serving.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert list(serving.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]


def test_the_serving_certificate_names_the_service(cert_dir: tuple[Path, str]) -> None:
    """The SANs are the four Service DNS names plus the --san DNS name and IP address."""
    out, _ = cert_dir
    san = load(out / "tls.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [*SERVICE_NAMES, "gate.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_other_service_and_namespace_give_their_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--service and --namespace set the DNS names the certificate is valid for."""
    code, _, _ = run_certs(capsys, "--out", str(tmp_path), "--service", "gate", "--namespace", "ops", "--days", "30")
    assert code == 0
    serving = load(tmp_path / "tls.crt")
    san = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gate", "gate.ops", "gate.ops.svc", "gate.ops.svc.cluster.local"]
    lifetime = serving.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=29) < lifetime <= datetime.timedelta(days=30)


def test_private_keys_are_written_0600(cert_dir: tuple[Path, str]) -> None:
    """tls.key, ca.key and secret.yaml (which holds the key) are readable by the owner only."""
    out, _ = cert_dir
    for name in ("tls.key", "ca.key", "secret.yaml"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((out / "tls.crt").stat().st_mode) == 0o644


def test_stdout_is_the_ca_bundle(cert_dir: tuple[Path, str]) -> None:
    """The command prints exactly one line: base64 of ca.crt, the webhook's caBundle."""
    out, stdout = cert_dir
    assert stdout == base64.b64encode((out / "ca.crt").read_bytes()).decode() + "\n"


def test_the_secret_manifest_holds_the_files(cert_dir: tuple[Path, str]) -> None:
    """secret.yaml is the kubernetes.io/tls Secret criticalsvc-tls in criticalsvc-system with tls.* and ca.crt."""
    out, _ = cert_dir
    secret = yaml.safe_load((out / "secret.yaml").read_text())
    assert (secret["kind"], secret["type"]) == ("Secret", "kubernetes.io/tls")
    assert secret["metadata"]["name"] == "criticalsvc-tls" and secret["metadata"]["namespace"] == "criticalsvc-system"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        assert base64.b64decode(secret["data"][key]) == (out / key).read_bytes(), key
    kubernetes_validate.validate(secret, "1.37", strict=True)


def test_running_again_renews_the_serving_certificate_under_the_same_ca(
        cert_dir: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A second run on the same directory keeps the CA (same caBundle) and issues a new serving certificate."""
    out, first = cert_dir
    old_serial = load(out / "tls.crt").serial_number
    code, second, _ = run_certs(capsys, "--out", str(out))
    assert code == 0 and second == first
    assert load(out / "tls.crt").serial_number != old_serial
    load(out / "tls.crt").verify_directly_issued_by(load(out / "ca.crt"))
    code, third, _ = run_certs(capsys, "--out", str(out), "--new-ca")
    assert code == 0 and third != first


@pytest.mark.parametrize(("argv", "message"), [
    (["--service", "Not_A_Name"], "--service: 'Not_A_Name' is not a DNS-1123 label"),
    (["--namespace", "a.b"], "--namespace: 'a.b' is not a DNS-1123 label"),
    (["--days", "0"], "--days: must be at least 1, not 0"),
    (["--san", "bad name"], "--san: 'bad name' is neither an IP address nor a lowercase DNS name"),
], ids=["service", "namespace", "days", "san"])
def test_certs_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], message: str) -> None:
    """Bad input exits 2 with one line on stderr naming the flag, prints no caBundle and writes no key."""
    code, out, err = run_certs(capsys, "--out", str(tmp_path / "certs"), *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "certs" / "tls.key").exists()


def test_a_half_present_ca_is_refused(cert_dir: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """With ca.crt but no ca.key the CA cannot be reused, and the command says so instead of replacing it."""
    out, _ = cert_dir
    (out / "ca.key").unlink()
    before = (out / "ca.crt").read_bytes()
    code, _, err = run_certs(capsys, "--out", str(out))
    assert code == 2 and "ca.key is missing" in err
    assert (out / "ca.crt").read_bytes() == before


# --- `criticalsvc manifests --ca-bundle-from` --------------------------------------------------------------

def run_manifests(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    code = cli.main(["manifests", *argv])
    out, err = capsys.readouterr()
    return code, [d for d in yaml.safe_load_all(out) if d is not None], err


def test_manifests_put_the_ca_bundle_in_every_webhook(cert_dir: tuple[Path, str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`manifests --ca-bundle-from DIR` sets every webhook's caBundle to what `certs` printed, and adds the Secret."""
    out, bundle = cert_dir
    code, objects, _ = run_manifests(capsys, "--ca-bundle-from", str(out))
    assert code == 0
    (config,) = [o for o in objects if o["kind"] == "ValidatingWebhookConfiguration"]
    hooks = config["webhooks"]
    assert len(hooks) == 5
    assert {h["clientConfig"]["caBundle"] for h in hooks} == {bundle.strip()}
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    assert secret == yaml.safe_load((out / "secret.yaml").read_text())
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Namespace") < kinds.index("Secret") < kinds.index("Deployment")


def test_manifests_without_secret(cert_dir: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """--no-secret keeps the private key out of the stream."""
    out, _ = cert_dir
    code, objects, _ = run_manifests(capsys, "--ca-bundle-from", str(out), "--no-secret")
    assert code == 0 and not [o for o in objects if o["kind"] == "Secret"]


def test_manifests_refuse_a_serving_certificate_from_another_ca(cert_dir: tuple[Path, str], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A tls.crt the caBundle would not verify is refused (it would fail every call closed)."""
    out, _ = cert_dir
    other = tmp_path / "other"
    assert run_certs(capsys, "--out", str(other))[0] == 0
    (out / "ca.crt").write_bytes((other / "ca.crt").read_bytes())
    code, objects, err = run_manifests(capsys, "--ca-bundle-from", str(out))
    assert code == 2 and objects == []
    assert err.count("\n") == 1 and "tls.crt was not issued by ca.crt" in err


def test_manifests_need_ca_crt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory without ca.crt is one line that says how to make it."""
    code, objects, err = run_manifests(capsys, "--ca-bundle-from", str(tmp_path))
    assert code == 2 and objects == []
    assert "no ca.crt (create it with `criticalsvc certs" in err


# --- a real TLS handshake -------------------------------------------------------------------------------------

@asynccontextmanager
async def tls_server(context: ssl.SSLContext) -> AsyncIterator[int]:
    """An asyncio TLS server on 127.0.0.1 (a free port) that answers b"ok\\n" to every connection."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok\n")
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.drain()
            writer.close()
            await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    async with server:
        yield server.sockets[0].getsockname()[1]


def server_context(out: Path, *, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(out / "tls.crt", out / "tls.key")
    if client_ca is not None:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: Path) -> ssl.SSLContext:
    # create_default_context: CERT_REQUIRED and check_hostname on, trusting only `ca`.
    return ssl.create_default_context(cafile=str(ca))


async def greet(port: int, context: ssl.SSLContext, server_hostname: str) -> bytes:
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=server_hostname), 10)
    try:
        return await asyncio.wait_for(reader.readline(), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


@pytest.mark.parametrize("hostname", [API_SERVER_NAME, "127.0.0.1"])
def test_a_client_trusting_only_ca_crt_completes_the_handshake(cert_dir: tuple[Path, str], hostname: str) -> None:
    """A client trusting only ca.crt, checking the name (DNS or IP SAN), handshakes and reads the reply."""
    out, _ = cert_dir

    async def scenario() -> bytes:
        async with tls_server(server_context(out)) as port:
            return await greet(port, client_context(out / "ca.crt"), hostname)

    assert asyncio.run(scenario()) == b"ok\n"


def test_the_handshake_fails_with_another_ca(cert_dir: tuple[Path, str], tmp_path: Path) -> None:
    """A client trusting a different CA rejects the server's certificate."""
    out, _ = cert_dir
    other = tmp_path / "other-ca.crt"
    certs.write_pem(other, certs.cert_pem(certs.make_ca("other").cert))

    async def scenario() -> None:
        async with tls_server(server_context(out)) as port:
            with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer certificate"):
                await greet(port, client_context(other), API_SERVER_NAME)

    asyncio.run(scenario())


def test_the_handshake_fails_for_a_name_not_in_the_certificate(cert_dir: tuple[Path, str]) -> None:
    """The right CA but a name the certificate does not carry fails hostname verification."""
    out, _ = cert_dir

    async def scenario() -> None:
        async with tls_server(server_context(out)) as port:
            with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
                await greet(port, client_context(out / "ca.crt"), "criticalsvc.other-namespace.svc")

    asyncio.run(scenario())


def test_client_certificates_from_the_ca_are_accepted_and_others_are_not(cert_dir: tuple[Path, str],
                                                                        tmp_path: Path) -> None:
    """A server requiring client certificates from the CA accepts make_client_cert's and refuses none/another CA's."""
    out, _ = cert_dir
    ca = certs.load_key_pair(out / "ca.crt", out / "ca.key")

    def client_with(pair: certs.KeyPair | None, name: str) -> ssl.SSLContext:
        context = client_context(out / "ca.crt")
        if pair is not None:
            certs.write_pem(tmp_path / f"{name}.crt", certs.cert_pem(pair.cert))
            certs.write_pem(tmp_path / f"{name}.key", certs.key_pem(pair.key), private=True)
            context.load_cert_chain(tmp_path / f"{name}.crt", tmp_path / f"{name}.key")
        return context

    apiserver = certs.make_client_cert(ca, "kube-apiserver")
    assert list(apiserver.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    stranger = certs.make_client_cert(certs.make_ca("other"), "kube-apiserver")

    async def scenario() -> list[bytes | str]:
        results: list[bytes | str] = []
        async with tls_server(server_context(out, client_ca=out / "ca.crt")) as port:
            for pair, name in ((apiserver, "good"), (None, "none"), (stranger, "stranger")):
                try:
                    results.append(await greet(port, client_with(pair, name), API_SERVER_NAME))
                except (ssl.SSLError, ConnectionError) as exc:
                    # TLS 1.3: the server's rejection of the client certificate arrives on first read.
                    results.append(type(exc).__name__)
        return results

    good, none, other = asyncio.run(scenario())
    assert good == b"ok\n"
    assert none != b"ok\n" and other != b"ok\n"
