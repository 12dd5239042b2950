"""`criticalsvc serve` end to end on a raw TLS socket: the event loop it runs on, keep-alive, the records
an answer arrives in, the bound on a request's head (criticalsvc.serving)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from criticalsvc.serving import MAX_HEAD_BYTES

ROOT = Path(__file__).resolve().parents[1]


# --- on a real `serve`: either event loop, keep-alive ------------------------------------------------
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


@contextlib.contextmanager
def serving(tmp_path: Path, *flags: str) -> Iterator[tuple[int, list[dict[str, object]]]]:
    """`criticalsvc serve` on a snapshot with fresh certificates: (its webhook port, its start-up log lines);
    SIGTERM at the end, which must exit 0."""
    subprocess.run([sys.executable, "-m", "criticalsvc", "certs", "--out", str(tmp_path), "--san", "127.0.0.1"],
                   check=True, capture_output=True)
    log, port_file = tmp_path / "serve.log", tmp_path / "ports.json"
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
        yield json.loads(port_file.read_text())["listen"], lines
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(DEADLINE) == 0


def review_request(extra_headers: bytes = b"") -> bytes:
    return (b"POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n%s"
            b"content-length: %d\r\n\r\n%s" % (extra_headers, len(DELETE_PROVIDER), DELETE_PROVIDER))


@pytest.mark.e2e
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_serve_runs_on_the_chosen_loop_and_answers_reviews_on_one_keepalive_connection(
        tmp_path: Path, loop: str) -> None:
    """`serve` says in its `listening` line which event loop it runs on (uvloop by default); on either,
    reviews are answered one after another on one keep-alive TLS connection, each answer in
    application-data records only (no renegotiation, no alert), and SIGTERM exits 0."""
    flags = [] if loop == "uvloop" else ["--event-loop", loop]  # uvloop is the default
    with serving(tmp_path, *flags) as (port, lines):
        listening = [e for e in lines if e.get("event") == "listening"]
        assert listening and listening[0]["event_loop"] == loop, lines
        assert not [e for e in lines if e.get("level") == "warning"], lines
        client = _RecordingTLSClient(port, tmp_path / "ca.crt")
        try:
            client.exchange(review_request())  # the first answer may share its reads with TLS 1.3 session tickets
            for _ in range(3):
                response, records = client.exchange(review_request())
                assert response.startswith(b"HTTP/1.1 200 ")
                assert b'"allowed":false' in response and b'"code":403' in response
                assert records and set(records) == {23}, f"the answer came in TLS records {records}"
        finally:
            client.close()


@pytest.mark.e2e
def test_a_request_head_over_the_bound_is_refused_before_it_is_all_read(tmp_path: Path) -> None:
    """A client that sends an endless header gets 431 once the head passes MAX_HEAD_BYTES and its connection
    is closed - the gate does not buffer it all (httptools has no bound of its own: without this one the
    gate read 200 MiB of one header into memory). A head just under the bound is answered as usual, and
    the gate goes on answering others."""
    with serving(tmp_path) as (port, _):
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))

        def connect() -> ssl.SSLSocket:
            return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=DEADLINE),
                                       server_hostname="127.0.0.1")

        def answer(conn: ssl.SSLSocket) -> bytes:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
                if b"\r\n\r\n" in data and len(data.partition(b"\r\n\r\n")[2]) >= int(
                        re.search(rb"(?i)content-length: *(\d+)", data)[1]):  # type: ignore[index]
                    break
            return data

        with connect() as conn:  # just under the bound: an ordinary review
            conn.sendall(review_request(b"x-padding: %s\r\n" % (b"a" * (MAX_HEAD_BYTES - 2048))))
            assert answer(conn).startswith(b"HTTP/1.1 200 ")
        with connect() as conn:
            conn.sendall(b"POST /validate HTTP/1.1\r\nhost: 127.0.0.1\r\nx-endless: ")
            sent, refused = 0, b""
            conn.settimeout(0.05)
            while not refused and sent < 64 * MAX_HEAD_BYTES:  # 4 MiB: far past the bound
                try:
                    conn.sendall(b"a" * 16384)
                    sent += 16384
                    refused = conn.recv(65536)
                except TimeoutError:
                    continue
                except (ssl.SSLError, OSError):
                    break
            conn.settimeout(DEADLINE)
            if not refused:
                refused = answer(conn)
            assert refused.startswith(b"HTTP/1.1 431 "), (sent, refused[:200])
            assert b"request head over %d bytes" % MAX_HEAD_BYTES in refused
            assert sent <= 2 * MAX_HEAD_BYTES + 256 * 1024, sent  # refused near the bound, not after it all
        with connect() as conn:
            conn.sendall(review_request())
            assert answer(conn).startswith(b"HTTP/1.1 200 ")
