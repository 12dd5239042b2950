"""Certificates for the webhook: a private CA, serving certificates and client certificates.

The API server calls the webhook over TLS and trusts exactly the `caBundle` written into the
ValidatingWebhookConfiguration, so the install needs a CA whose certificate goes there and a serving
certificate it signed for the Service's DNS names. This module makes both with `cryptography`, plus
client certificates (for the optional verification of the API server's client certificate, its tests
and the embedded mode).

Design decisions:
* ECDSA P-256 everywhere: small keys, fast handshakes, accepted by every API server release
  (Go's crypto/tls has verified P-256 ECDSA chains since 1.0).
* A two-level chain, CA → leaf, with a long-lived CA (10 years) and short-lived leaves (1 year by
  default): the caBundle — the part that lives in the cluster configuration — stays stable while
  the serving certificate is renewed by re-running `criticalsvc certs` on the same directory
  (which keeps `ca.key`); the server reloads the changed files without a restart.
* notBefore is 5 minutes in the past: a freshly written certificate must already be valid on an API
  server whose clock runs a little behind this machine's.
* A leaf never outlives its CA: its notAfter is clamped to the CA's.
* `KeyPair` is a NamedTuple so callers can write `key, cert = make_ca(...)` or `ca.cert`.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import InvalidInput

DEFAULT_SERVICE = "criticalsvc"
DEFAULT_NAMESPACE = "criticalsvc-system"
DEFAULT_SECRET_NAME = "criticalsvc-tls"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"

CA_DAYS = 3650          # 10 years: replacing the CA means rewriting the caBundle, so it should be rare
SERVING_DAYS = 365      # the default for `--days`; renewals keep the CA, so they are cheap
CLOCK_SKEW = datetime.timedelta(minutes=5)

# File names in the output directory; tls.crt / tls.key / ca.crt are the keys of a kubernetes.io/tls
# Secret, so the directory and the mounted Secret look alike.
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, SECRET = "ca.crt", "ca.key", "tls.crt", "tls.key", "secret.yaml"

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class KeyPair(NamedTuple):
    """A private key and the certificate for its public key."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _serial() -> int:
    return x509.random_serial_number()


def make_ca(common_name: str = "criticalsvc-ca", *, days: int = CA_DAYS,
            now: datetime.datetime | None = None) -> KeyPair:
    """A self-signed CA certificate (CA:true, pathlen 0, keyCertSign) and its key."""
    now = now or _now()
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + datetime.timedelta(days=days))
        # pathlen 0: this CA signs leaves only, never another CA.
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(key, cert)


def _leaf(ca: KeyPair, *, common_name: str, sans: Sequence[x509.GeneralName], usage: x509.ObjectIdentifier,
          days: int, now: datetime.datetime | None) -> KeyPair:
    now = now or _now()
    key = _new_key()
    not_after = min(now + datetime.timedelta(days=days), ca.cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # ECDSA keys sign (digitalSignature); keyEncipherment is an RSA key-transport usage.
        .add_extension(x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
            key_agreement=False, key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False,
        ), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return KeyPair(key, builder.sign(ca.key, hashes.SHA256()))


def make_serving_cert(ca: KeyPair, dns_names: Sequence[str], ip_addresses: Iterable[IPAddress | str] = (),
                      *, days: int = SERVING_DAYS, now: datetime.datetime | None = None) -> KeyPair:
    """A serverAuth certificate signed by `ca` for the given DNS names and IP addresses."""
    if not dns_names:
        raise InvalidInput("dns_names", "a serving certificate needs at least one DNS name")
    ips = [ipaddress.ip_address(ip) for ip in ip_addresses]
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ip) for ip in ips]
    # The CN only labels the certificate (clients match SANs; Go ignores the CN since 1.15); a CN
    # is limited to 64 characters, and a DNS label (the service name) never exceeds 63.
    return _leaf(ca, common_name=dns_names[0][:64], sans=sans, usage=ExtendedKeyUsageOID.SERVER_AUTH,
                 days=days, now=now)


def make_client_cert(ca: KeyPair, common_name: str, *, days: int = SERVING_DAYS,
                     now: datetime.datetime | None = None) -> KeyPair:
    """A clientAuth certificate signed by `ca`, identifying `common_name` (e.g. the API server)."""
    return _leaf(ca, common_name=common_name, sans=(), usage=ExtendedKeyUsageOID.CLIENT_AUTH, days=days, now=now)


def service_dns_names(service: str, namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> list[str]:
    """The names a Service is reached by; the API server uses `<service>.<namespace>.svc`."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{cluster_domain}"]


def split_sans(values: Iterable[str]) -> tuple[list[str], list[IPAddress]]:
    """Sort `--san` values into DNS names and IP addresses; raise InvalidInput for anything else."""
    dns: list[str] = []
    ips: list[IPAddress] = []
    for value in values:
        try:
            ips.append(ipaddress.ip_address(value))
            continue
        except ValueError:
            pass
        if len(value) > 253 or not _DNS_NAME.match(value):
            raise InvalidInput("--san", f"{value!r} is neither an IP address nor a lowercase DNS name")
        dns.append(value)
    return dns, ips


def check_dns_label(value: str, flag: str) -> None:
    if not _DNS1123_LABEL.match(value):
        raise InvalidInput(flag, f"{value!r} is not a DNS-1123 label (lowercase letters, digits, '-', ≤ 63)")


# --- PEM and files ---------------------------------------------------------------------------------

def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8, unencrypted: what ssl.load_cert_chain and the kubelet-mounted Secret expect.
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def ca_bundle(cert: x509.Certificate) -> str:
    """The `caBundle` value of a webhook clientConfig: base64 of the PEM certificate."""
    return base64.b64encode(cert_pem(cert)).decode("ascii")


def write_pem(path: Path | str, data: bytes, *, private: bool = False) -> None:
    """Write `data` to `path`; private files are created 0600 (never briefly world-readable)."""
    mode = 0o600 if private else 0o644
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # the file may have existed with looser permissions
        os.write(fd, data)
    finally:
        os.close(fd)


def load_key_pair(cert_path: Path, key_path: Path) -> KeyPair:
    """Read a PEM certificate and its PEM private key (raises InvalidInput naming the file)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise InvalidInput("", f"not a readable PEM certificate: {exc}", where=str(cert_path)) from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidInput("", f"not a readable unencrypted PEM private key: {exc}", where=str(key_path)) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise InvalidInput("", f"is not the EC private key of {cert_path}", where=str(key_path))
    return KeyPair(key, cert)


def tls_secret(*, name: str, namespace: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> dict[str, Any]:
    """A kubernetes.io/tls Secret holding the serving pair, plus ca.crt (as cert-manager writes it)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode("ascii")

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": "criticalsvc"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(cert_pem), "tls.key": b64(key_pem), "ca.crt": b64(ca_pem)},
    }


def write_certificates(out: Path, *, service: str = DEFAULT_SERVICE, namespace: str = DEFAULT_NAMESPACE,
                       extra_sans: Iterable[str] = (), days: int = SERVING_DAYS,
                       secret_name: str = DEFAULT_SECRET_NAME, new_ca: bool = False) -> KeyPair:
    """Create (or reuse) the CA in `out`, issue a serving certificate, write every file; return the CA.

    Files: ca.crt, ca.key (0600), tls.crt, tls.key (0600), secret.yaml (0600: it holds the key).
    An existing ca.crt + ca.key pair is reused unless `new_ca`, so the caBundle does not change.
    """
    check_dns_label(service, "--service")
    check_dns_label(namespace, "--namespace")
    if days < 1:
        raise InvalidInput("--days", f"must be at least 1, not {days}")
    dns, ips = split_sans(extra_sans)
    if out.exists() and not out.is_dir():
        raise InvalidInput("--out", "exists and is not a directory", where=str(out))
    out.mkdir(mode=0o700, parents=True, exist_ok=True)

    ca_cert_path, ca_key_path = out / CA_CERT, out / CA_KEY
    present = [p.exists() for p in (ca_cert_path, ca_key_path)]
    if not new_ca and all(present):
        ca = load_key_pair(ca_cert_path, ca_key_path)
        if ca.cert.not_valid_after_utc <= _now() + datetime.timedelta(days=days):
            raise InvalidInput("", f"the CA expires before a {days}-day certificate would; "
                                   "use --new-ca (and update the caBundle)", where=str(ca_cert_path))
    elif not new_ca and any(present):
        missing = ca_key_path if present[0] else ca_cert_path
        raise InvalidInput("", f"{missing.name} is missing, so the CA cannot be reused; "
                               "use --new-ca or an empty directory", where=str(out))
    else:
        ca = make_ca(days=max(CA_DAYS, days))
        write_pem(ca_key_path, key_pem(ca.key), private=True)
        write_pem(ca_cert_path, cert_pem(ca.cert))

    names = service_dns_names(service, namespace)
    names += [n for n in dns if n not in names]
    serving = make_serving_cert(ca, names, ips, days=days)
    write_pem(out / TLS_KEY, key_pem(serving.key), private=True)
    write_pem(out / TLS_CERT, cert_pem(serving.cert))
    secret = tls_secret(name=secret_name, namespace=namespace, ca_pem=cert_pem(ca.cert),
                        cert_pem=cert_pem(serving.cert), key_pem=key_pem(serving.key))
    write_pem(out / SECRET, yaml.safe_dump(secret, sort_keys=False).encode(), private=True)
    return ca
