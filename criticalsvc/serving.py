"""Serving the webhook: hypercorn on two listeners, TLS that follows its files, graceful shutdown.

    webhook listener (TLS)   Webhook.webhook_app(); HTTP/1.1 only; client certificates verified
                             against --client-ca when given
    ops listener (plain)     Webhook.ops_app(): /healthz, /readyz, /metrics

Design decisions:
- Sockets are bound (and put into listening state) by `Service.__init__`, before hypercorn runs, and
  handed to hypercorn through `Config.create_sockets`. So port 0 works - the real ports are known at
  once (`Service.webhook_address`, `ops_address`) and can be reported before serving starts; early
  connections wait in the kernel's backlog.
- Certificate rotation without restart: `ReloadingConfig` keeps the SSLContext hypercorn asks it to
  create and, when the certificate or key file contents change, loads the new pair into that same
  context; new handshakes present the new certificate, open connections keep theirs. The pair is
  first loaded into a throwaway context: a half-written rotation (new certificate, old key) would
  otherwise leave the live context without a usable key. A failed reload keeps the old certificate
  and is logged once per distinct file contents. Contents are polled (every 2 s by default) rather
  than mtimes, because Kubernetes updates Secret volumes by swapping a symlink. A changed client CA
  is added to the trust store; a CA that was removed stays trusted until the process restarts
  (an SSLContext cannot forget a CA).
- The API server talks HTTP/1.1 to webhooks, so ALPN offers only http/1.1. Its client (Go net/http)
  keeps idle connections for 90 s (IdleConnTimeout); our keep-alive is longer, so the client closes
  first and never sends a review into a connection we are closing.
- The event loop is uvloop's when it is installed (a dependency; `serve --event-loop asyncio` opts out):
  the serving path is mostly TLS and the event loop's own transport machinery, which uvloop runs in
  C (libuv, and its own SSL protocol) where asyncio runs them in Python. Measured with
  `python -m benchmarks latency` in design/operations.md ("The tail"). hypercorn serves on any
  asyncio loop; the one we patch (hypercornpatch) is loop-independent.
- Shutdown (the trigger, e.g. SIGTERM): stop accepting, finish in-flight requests for up to 10 s
  (the API server's default webhook timeout - after that nobody waits for the answer), close idle
  keep-alive connections, return. An idle TLS connection closes once the client answers our
  close_notify; Go's transport reads idle connections and does so at once, a client that never
  reads holds shutdown until the 10 s are up.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import hypercorn.asyncio
from hypercorn.config import Config, Sockets

from .errors import InvalidInput
from .hypercornpatch import release_connections_closed_while_idle, send_response_head_with_body
from .logs import get_logger
from .metrics import Metrics, probe_event_loop_lag, time_garbage_collections
from .server import Webhook

# Longer than the API server's idle-connection timeout (Go net/http: 90 s), see the module docstring.
KEEP_ALIVE_TIMEOUT = 120.0
# The API server's default timeoutSeconds for a webhook call (design/kubernetes-semantics.md §7).
GRACEFUL_TIMEOUT = 10.0
# Go's TLS client gives up a handshake after 10 s (TLSHandshakeTimeout); a slower one is an attack.
SSL_HANDSHAKE_TIMEOUT = 10.0
CERT_CHECK_INTERVAL = 2.0
# Connections queued before accept; the API server opens few (keep-alive), a probe burst is small.
BACKLOG = 128


# `serve --event-loop`: auto is uvloop when it can be imported, else asyncio's own.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
LoopName = Literal["uvloop", "asyncio"]


def event_loop_factory(choice: str = "auto") -> tuple[LoopName, Callable[[], asyncio.AbstractEventLoop]]:
    """The event loop to serve on, as (name, factory for asyncio.Runner); InvalidInput if it cannot be had."""
    if choice not in EVENT_LOOPS:
        raise InvalidInput("--event-loop", f"expected one of {', '.join(EVENT_LOOPS)}, got {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise InvalidInput("--event-loop", "uvloop is not installed (pip install uvloop)") from None
        else:
            return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def running_loop_name() -> str:
    """What the running event loop is (uvloop or asyncio), named from the loop itself: for the log."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".", 1)[0] == "uvloop" else "asyncio"


@attrs.frozen
class Endpoint:
    """A HOST:PORT to listen on; host "" means every interface (IPv6 and IPv4), port 0 any free port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str, *, flag: str) -> Endpoint:
    """`HOST:PORT`, `[IPv6]:PORT` or `:PORT` (every interface) -> Endpoint; InvalidInput naming `flag`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise InvalidInput(flag, f"expected HOST:PORT (e.g. :8443 or 127.0.0.1:8443), got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise InvalidInput(flag, f"write an IPv6 address in brackets ([::1]:8443), got {text!r}")
    return Endpoint(host, int(port_text))


@attrs.frozen
class TLSFiles:
    """The serving certificate chain and key (PEM files) and, optionally, the CA for client certificates."""

    cert: str
    key: str
    client_ca: str | None = None


def check_tls_files(tls: TLSFiles) -> None:
    """Fail early, in one line, when the files cannot serve TLS (rather than deep inside hypercorn)."""
    for flag, path in (("--tls-cert", tls.cert), ("--tls-key", tls.key), ("--client-ca", tls.client_ca)):
        if path is not None and not os.path.isfile(path):
            raise InvalidInput(flag, f"no such file: {path}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise InvalidInput("--tls-cert/--tls-key", f"cannot load the certificate and key: {exc}") from None
    if tls.client_ca is not None:
        try:
            context.load_verify_locations(tls.client_ca)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidInput("--client-ca", f"cannot load the CA certificates: {exc}") from None


def bind_socket(endpoint: Endpoint, *, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on `endpoint` (port 0 -> a free port; read it with getsockname()).

    Host "" binds every interface like Go's ":8443": one dual-stack IPv6 socket (a pod may have only
    an IPv6 address), or IPv4 only where the kernel has IPv6 disabled.
    """
    if not endpoint.host:
        try:
            return _listen(socket.AF_INET6, ("::", endpoint.port), backlog, dual_stack=True)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
        return _listen(socket.AF_INET, ("0.0.0.0", endpoint.port), backlog)
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
    return _listen(family, (endpoint.host, endpoint.port), backlog)


def _listen(family: int, address: tuple[str, int], backlog: int, *, dual_stack: bool = False) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if dual_stack:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class _PreboundConfig(Config):
    """A hypercorn Config that serves sockets bound beforehand instead of binding `config.bind`."""

    def __init__(self, sockets: Sockets) -> None:
        super().__init__()
        self._prebound = sockets
        self.accesslog = None  # the webhook writes one line per decision; an access log would double it
        self.errorlog = logging.getLogger("hypercorn.error")  # forwarded to JSON by criticalsvc.logs
        self.keep_alive_timeout = KEEP_ALIVE_TIMEOUT
        self.graceful_timeout = GRACEFUL_TIMEOUT
        self.backlog = BACKLOG

    def create_sockets(self) -> Sockets:
        return self._prebound


class ReloadingConfig(_PreboundConfig):
    """The TLS listener's Config: keeps the SSLContext it creates and reloads it when the files change."""

    def __init__(self, sock: socket.socket, tls: TLSFiles, *, metrics: Metrics) -> None:
        super().__init__(Sockets(secure_sockets=[sock], insecure_sockets=[], quic_sockets=[]))
        self.tls = tls
        self.certfile = tls.cert
        self.keyfile = tls.key
        self.alpn_protocols = ["http/1.1"]
        self.ssl_handshake_timeout = SSL_HANDSHAKE_TIMEOUT
        if tls.client_ca is not None:
            self.ca_certs = tls.client_ca
            self.verify_mode = ssl.CERT_REQUIRED
        self._metrics = metrics
        # not `_log`: hypercorn's Config keeps its own logger under that name
        self._reload_log = get_logger("criticalsvc.serving")
        self._context: ssl.SSLContext | None = None
        self._loaded: dict[str, bytes] = {}
        self._failed: dict[str, bytes] | None = None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        # Read before hypercorn loads: a rotation in between then shows up as a change at the next check.
        files = self._read_files()
        context = super().create_ssl_context()
        self._context, self._loaded = context, files
        return context

    def _read_files(self) -> dict[str, bytes]:
        paths = {"cert": self.tls.cert, "key": self.tls.key}
        if self.tls.client_ca is not None:
            paths["client_ca"] = self.tls.client_ca
        out = {}
        for role, path in paths.items():
            with open(path, "rb") as f:
                out[role] = f.read()
        return out

    def reload_now(self) -> bool:
        """Load the certificate files into the serving context if they changed; True when it did."""
        if self._context is None:
            return False  # not serving yet: hypercorn will read the current files when it starts
        try:
            files = self._read_files()
        except OSError as exc:
            return self._reload_failed(None, f"cannot read {exc.filename}: {exc.strerror}")
        if files == self._loaded or files == self._failed:
            return False
        try:
            with tempfile.TemporaryDirectory(prefix="criticalsvc-tls-") as tmp:
                cert, key = os.path.join(tmp, "tls.crt"), os.path.join(tmp, "tls.key")
                _write_private(cert, files["cert"])
                _write_private(key, files["key"])
                probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                probe.load_cert_chain(cert, key, self.keyfile_password)
                if "client_ca" in files and files["client_ca"] != self._loaded.get("client_ca"):
                    probe.load_verify_locations(cadata=files["client_ca"].decode("ascii"))
                    self._context.load_verify_locations(cadata=files["client_ca"].decode("ascii"))
                self._context.load_cert_chain(cert, key, self.keyfile_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            return self._reload_failed(files, str(exc))
        self._loaded, self._failed = files, None
        self._metrics.certificate_reloads.labels("ok").inc()
        self._reload_log.info("certificate reloaded", cert=self.tls.cert,
                              sha256=hashlib.sha256(files["cert"]).hexdigest()[:16])
        return True

    def _reload_failed(self, files: dict[str, bytes] | None, error: str) -> bool:
        if files is None or files != self._failed:
            self._metrics.certificate_reloads.labels("failed").inc()
            self._reload_log.error("certificate reload failed; still serving the previous certificate",
                                   cert=self.tls.cert, error=error)
        self._failed = files
        return False

    async def watch_certificates(self, interval: float = CERT_CHECK_INTERVAL) -> None:
        """Check the files every `interval` seconds, forever (cancel to stop)."""
        while True:
            await asyncio.sleep(interval)
            self.reload_now()


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


class Service:
    """The webhook's listeners, bound at construction; `run()` serves them until the shutdown trigger."""

    def __init__(
        self,
        webhook: Webhook,
        *,
        listen: Endpoint,
        tls: TLSFiles,
        ops_listen: Endpoint | None = None,
        cert_check_interval: float = CERT_CHECK_INTERVAL,
    ) -> None:
        self.webhook = webhook
        self.cert_check_interval = cert_check_interval
        self._service_log = get_logger("criticalsvc.serving")
        for patched in (release_connections_closed_while_idle(), send_response_head_with_body()):
            if not patched.applied:
                self._service_log.warning(patched.message)
        webhook_sock = _bind(listen, "--listen")
        try:
            ops_sock = _bind(ops_listen, "--ops-listen") if ops_listen is not None else None
        except BaseException:
            webhook_sock.close()
            raise
        self.webhook_address: tuple[str, int] = webhook_sock.getsockname()[:2]
        self.ops_address: tuple[str, int] | None = ops_sock.getsockname()[:2] if ops_sock is not None else None
        self.tls_config = ReloadingConfig(webhook_sock, tls, metrics=webhook.metrics)
        self._servers: list[tuple[Any, Config]] = [(webhook.webhook_app(), self.tls_config)]
        if ops_sock is not None:
            ops_config = _PreboundConfig(Sockets(secure_sockets=[], insecure_sockets=[ops_sock], quic_sockets=[]))
            self._servers.append((webhook.ops_app(), ops_config))
        self._sockets = [s for s in (webhook_sock, ops_sock) if s is not None]

    def reload_certificates(self) -> bool:
        """Reload the serving certificate now if its files changed (also done every cert_check_interval)."""
        return self.tls_config.reload_now()

    async def run(self, shutdown_trigger: Callable[[], Awaitable[Any]]) -> None:
        """Serve until `shutdown_trigger()` returns, then finish in-flight requests and return."""
        watchers = [asyncio.create_task(self.tls_config.watch_certificates(self.cert_check_interval)),
                    asyncio.create_task(probe_event_loop_lag(self.webhook.metrics))]
        untime_gc = time_garbage_collections(self.webhook.metrics)
        try:
            async with asyncio.TaskGroup() as group:
                for app, config in self._servers:
                    group.create_task(hypercorn.asyncio.serve(app, config, shutdown_trigger=shutdown_trigger))
        finally:
            for watcher in watchers:
                watcher.cancel()
            for watcher in watchers:
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            untime_gc()
            self.close()
        self._service_log.info("stopped")

    def close(self) -> None:
        """Close the listening sockets (run() does this when it returns; for a Service never run)."""
        for sock in self._sockets:
            sock.close()


def _bind(endpoint: Endpoint, flag: str) -> socket.socket:
    try:
        return bind_socket(endpoint)
    except OSError as exc:
        raise InvalidInput(flag, f"cannot listen on {endpoint}: {exc.strerror or exc}") from None


__all__ = [
    "CERT_CHECK_INTERVAL",
    "EVENT_LOOPS",
    "GRACEFUL_TIMEOUT",
    "KEEP_ALIVE_TIMEOUT",
    "Endpoint",
    "ReloadingConfig",
    "Service",
    "TLSFiles",
    "bind_socket",
    "check_tls_files",
    "event_loop_factory",
    "parse_endpoint",
    "running_loop_name",
]
