"""criticalsvc.hypercornpatch: applied at start-up, only to the hypercorn versions it was written for."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypercorn.asyncio.tcp_server import TCPServer

from criticalsvc import hypercornpatch
from criticalsvc.hypercornpatch import PATCHED_VERSIONS, release_connections_closed_while_idle, version_range_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def unpatched() -> Iterator[None]:
    """TCPServer._read_data as hypercorn ships it for the test, and as it was before afterwards."""
    before = TCPServer._read_data
    original = before
    while getattr(original, "_criticalsvc_releases_idle", False):
        original = original.__closure__[0].cell_contents  # type: ignore[attr-defined]  # the wrapped method
    TCPServer._read_data = original  # type: ignore[method-assign]
    try:
        yield
    finally:
        TCPServer._read_data = before  # type: ignore[method-assign]


def test_pyproject_allows_exactly_the_patched_versions() -> None:
    """pyproject.toml's hypercorn requirement carries the patch's version bound, so pip installs only those."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    hypercorn = next(d for d in dependencies if re.match(r"^hypercorn\b", d))
    assert hypercorn == f"hypercorn{version_range_text()}"


def test_installed_hypercorn_is_in_range_and_patched(unpatched: None) -> None:
    """The installed hypercorn gets the patch, once: a second call finds it in place."""
    installed = hypercornpatch.installed_hypercorn()
    assert installed is not None
    first = release_connections_closed_while_idle()
    assert first.applied, first.message
    assert getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    again = release_connections_closed_while_idle()
    assert again.applied and "already patched" in again.message


@pytest.mark.parametrize("version", ["0.17.3", "0.19.0", "1.0.0", "", "garbage"])
def test_a_version_outside_the_range_is_not_patched_and_says_why(unpatched: None, version: str) -> None:
    """Outside the bound nothing is replaced, and the message names the version, the range and the way out."""
    untouched = TCPServer._read_data
    result = release_connections_closed_while_idle(version)
    assert not result.applied
    assert TCPServer._read_data is untouched
    assert version_range_text() in result.message
    assert (version or "(version unknown)") in result.message
    assert "tests/test_soak.py" in result.message


@pytest.fixture
def head_unpatched() -> Iterator[None]:
    """H11Protocol as hypercorn ships it for the test, and as it was before afterwards."""
    from hypercorn.protocol.h11 import H11Protocol

    before = H11Protocol.__init__, H11Protocol.stream_send
    H11Protocol.__init__ = getattr(before[0], "__wrapped__", before[0])  # type: ignore[method-assign]
    H11Protocol.stream_send = getattr(before[1], "__wrapped__", before[1])  # type: ignore[method-assign]
    try:
        yield
    finally:
        H11Protocol.__init__, H11Protocol.stream_send = before  # type: ignore[method-assign]


@pytest.mark.parametrize("version", ["0.17.3", "0.19.0", ""])
def test_head_with_body_outside_the_range_is_not_patched_and_says_why(head_unpatched: None, version: str) -> None:
    """The head-with-body patch has the same bound: outside it H11Protocol is untouched, and the message says so."""
    from hypercorn.protocol.h11 import H11Protocol

    from criticalsvc.hypercornpatch import send_response_head_with_body

    untouched = H11Protocol.__init__, H11Protocol.stream_send
    result = send_response_head_with_body(version)
    assert not result.applied
    assert (H11Protocol.__init__, H11Protocol.stream_send) == untouched
    assert version_range_text() in result.message and "two TLS records" in result.message
    assert send_response_head_with_body().applied
    assert send_response_head_with_body().message.endswith("(already patched)")


def test_range_text_matches_the_bound(unpatched: None) -> None:
    """The specifier shown in messages and pyproject is PATCHED_VERSIONS, lowest included, highest excluded."""
    (lo_major, lo_minor), (hi_major, hi_minor) = PATCHED_VERSIONS
    assert version_range_text() == f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"
    assert release_connections_closed_while_idle(f"{hi_major}.{hi_minor}.0").applied is False


def test_a_service_applies_the_patch_when_it_starts(unpatched: None, tmp_path: Path) -> None:
    """Constructing the webhook Service (what `criticalsvc serve` does at start-up) puts the patch in place."""
    from criticalsvc import certs
    from criticalsvc.server import StaticStateSource, Webhook
    from criticalsvc.serving import Endpoint, Service, TLSFiles
    from criticalsvc.state import MemoryState

    ca = certs.make_ca()
    serving = certs.make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    certs.write_pem(cert, certs.cert_pem(serving.cert))
    certs.write_pem(key, certs.key_pem(serving.key), private=True)
    assert not getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    service = Service(Webhook(StaticStateSource(MemoryState())), listen=Endpoint("127.0.0.1", 0),
                      tls=TLSFiles(str(cert), str(key)))
    try:
        assert getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    finally:
        service.close()


# --- on a real `serve`: the patches hold on either event loop -----------------------------------------
STORY = ROOT / "api/examples/reference-story.yaml"
DELETE_PROVIDER = (ROOT / "api/examples/reviews/delete-provider.json").read_bytes()
DEADLINE = 20.0


def _tls_records(raw: bytes) -> list[int]:
    """The content types of the whole TLS records in `raw` (23: application data); RFC 8446 §5.1."""
    types, at = [], 0
    while at + 5 <= len(raw):
        length = int.from_bytes(raw[at + 3:at + 5], "big")
        if at + 5 + length > len(raw):
            break
        types.append(raw[at])
        at += 5 + length
    return types


class _RecordingTLSClient:
    """A TLS client over a memory BIO, so the records the server sent can be counted as they come."""

    def __init__(self, port: int, ca_file: Path) -> None:
        import socket
        import ssl

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        context = ssl.create_default_context(cafile=str(ca_file))
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")
        self.ssl = ssl
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                self.incoming.write(self.sock.recv(65536))
        self._flush()

    def _flush(self) -> None:
        if data := self.outgoing.read():
            self.sock.sendall(data)

    def exchange(self, request: bytes) -> tuple[bytes, list[int]]:
        """Send one HTTP/1.1 request; the whole response and the TLS record types that carried it."""
        self.tls.write(request)
        self._flush()
        raw, plain = b"", b""
        while True:
            head, sep, body = plain.partition(b"\r\n\r\n")
            if sep:
                length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
                if len(body) >= length:
                    return plain, _tls_records(raw)
            chunk = self.sock.recv(65536)
            assert chunk, f"the server closed the connection; got {plain!r}"
            raw += chunk
            self.incoming.write(chunk)
            try:
                while data := self.tls.read(65536):
                    plain += data
            except self.ssl.SSLWantReadError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.mark.e2e
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_serve_runs_on_the_chosen_loop_and_sends_each_answer_in_one_tls_record(tmp_path: Path, loop: str) -> None:
    """`serve` says in its `listening` line which event loop it runs on (uvloop by default); on either, an
    AdmissionReview's answer - head and body - arrives in one TLS record, not one for the head and one
    for the body (send_response_head_with_body), and the keep-alive connection carries the next review."""
    import json
    import signal
    import subprocess
    import sys
    import time

    subprocess.run([sys.executable, "-m", "criticalsvc", "certs", "--out", str(tmp_path), "--san", "127.0.0.1"],
                   check=True, capture_output=True)
    log, port_file = tmp_path / "serve.log", tmp_path / "ports.json"
    flags = [] if loop == "uvloop" else ["--event-loop", loop]  # uvloop is the default
    with open(log, "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "criticalsvc", "serve", "--state", str(STORY), "--listen", "127.0.0.1:0",
             "--ops-listen", "off", "--tls-cert", str(tmp_path / "tls.crt"), "--tls-key", str(tmp_path / "tls.key"),
             "--port-file", str(port_file), *flags], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + DEADLINE
        while not port_file.exists():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.02)
        lines = [json.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]
        listening = [e for e in lines if e.get("event") == "listening"]
        assert listening and listening[0]["event_loop"] == loop, lines
        assert not [e for e in lines if e.get("level") == "warning"], lines  # both patches applied
        client = _RecordingTLSClient(json.loads(port_file.read_text())["listen"], tmp_path / "ca.crt")
        try:
            request = (b"POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                       b"content-length: %d\r\n\r\n%s" % (len(DELETE_PROVIDER), DELETE_PROVIDER))
            client.exchange(request)  # the first answer may share its reads with TLS 1.3 session tickets
            for _ in range(3):
                response, records = client.exchange(request)
                assert response.startswith(b"HTTP/1.1 200 ")
                assert b'"allowed":false' in response and b'"code":403' in response
                assert records == [23], f"the answer came in {len(records)} TLS records: {records}"
        finally:
            client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0
