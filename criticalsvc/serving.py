"""Serving the webhook: uvicorn (httptools) on two listeners, TLS that follows its files, graceful shutdown.

    webhook listener (TLS)   Webhook.webhook_app(); HTTP/1.1 only; client certificates verified
                             against --client-ca when given
    ops listener (plain)     Webhook.ops_app(): /healthz, /readyz, /metrics

Design decisions:
- The HTTP server is uvicorn with httptools (a C HTTP/1.1 parser) on an asyncio Protocol. It replaced
  hypercorn + h11 (asyncio streams, a task and an idle timer per request), which cost ~170 µs of CPU per
  answer more than this stack - more than TLS, our decoding and our decision together - and needed
  two patches of its private methods (an idle connection closed by its client was held until the
  keep-alive timeout; each answer went out as two TLS writes). Measured in design/operations.md ("The
  stack is the rest", and "The review path on uvicorn").
- Bounded input: a request's head over MAX_HEAD_BYTES is answered 431 and the connection closed
  (`_BoundedHead`: httptools buffers a head without limit); a body is buffered at most ~64 KiB ahead of
  the app (uvicorn's flow control), which refuses one over --max-body-bytes.
- Sockets are bound (and put into listening state) by `Service.__init__`, before the server runs, and
  handed to it (`_Listener.startup`). So port 0 works - the real ports are known at once
  (`Service.webhook_address`, `ops_address`) and can be reported before serving starts; early
  connections wait in the kernel's backlog.
- Certificate rotation without restart: `ReloadingTLS` keeps the SSLContext the listener serves with
  and, when the certificate or key file contents change, loads the new pair into that same
  context; new handshakes present the new certificate, open connections keep theirs. The pair is
  first loaded into a throwaway context: a half-written rotation (new certificate, old key) would
  otherwise leave the live context without a usable key. A failed reload keeps the old certificate
  and is logged once per distinct file contents. Contents are polled (every 2 s by default) rather
  than mtimes, because Kubernetes updates Secret volumes by swapping a symlink. A changed client CA
  is added to the trust store; a CA that was removed stays trusted until the process restarts
  (an SSLContext cannot forget a CA).
- The API server talks HTTP/1.1 to webhooks, so ALPN offers only http/1.1. Its client (Go net/http)
  keeps idle connections for 90 s (IdleConnTimeout); our keep-alive is longer, so the client closes
  first and never sends a review into a connection we are closing. A TLS handshake gets 10 s, as Go's
  client gives it (TLSHandshakeTimeout); uvicorn has no setting for it, `_Listener.startup` passes it.
- The event loop is uvloop's when it is installed (a dependency; `serve --event-loop asyncio` opts out):
  the serving path is mostly TLS and the event loop's own transport machinery, which uvloop runs in
  C (libuv, and its own SSL protocol) where asyncio runs them in Python. Measured with
  `python -m benchmarks latency` in design/operations.md ("The tail").
- Shutdown (the trigger, e.g. SIGTERM): stop accepting, finish in-flight requests for up to 10 s
  (the API server's default webhook timeout - after that nobody waits for the answer), close idle
  keep-alive connections, return. uvicorn's own drain (Server.shutdown); `serve` keeps its own signal
  handling, so uvicorn's (Server.serve, which captures SIGINT/SIGTERM) is not used.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .errors import InvalidInput
from .logs import get_logger
from .metrics import REJECT_TOO_LARGE, Metrics, probe_event_loop_lag, time_garbage_collections
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
    """Fail early, in one line, when the files cannot serve TLS (rather than deep inside the server)."""
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


def _server_context(tls: TLSFiles) -> ssl.SSLContext:
    """The webhook listener's SSLContext: TLS 1.2 or later, ECDHE + AES-GCM, ALPN http/1.1 only.

    The same choices hypercorn made for this listener before (its Config.create_ssl_context,
    https://github.com/pgjones/hypercorn/blob/0.18.0/src/hypercorn/config.py), and what the API server's
    Go client offers (crypto/tls prefers ECDHE + AES-GCM).
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers("ECDHE+AESGCM")
    context.options |= ssl.OP_NO_COMPRESSION
    context.set_alpn_protocols(["http/1.1"])
    context.load_cert_chain(tls.cert, tls.key)
    if tls.client_ca is not None:
        context.load_verify_locations(tls.client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class ReloadingTLS:
    """The TLS listener's SSLContext, created once and reloaded in place when the files change."""

    def __init__(self, tls: TLSFiles, *, metrics: Metrics) -> None:
        self.tls = tls
        self._metrics = metrics
        self._reload_log = get_logger("criticalsvc.serving")
        self._context: ssl.SSLContext | None = None
        self._loaded: dict[str, bytes] = {}
        self._failed: dict[str, bytes] | None = None

    def create_ssl_context(self) -> ssl.SSLContext:
        # Read before loading: a rotation in between then shows up as a change at the next check.
        files = self._read_files()
        context = _server_context(self.tls)
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
            return False  # not serving yet: the current files are read when serving starts
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
                probe.load_cert_chain(cert, key)
                if "client_ca" in files and files["client_ca"] != self._loaded.get("client_ca"):
                    probe.load_verify_locations(cadata=files["client_ca"].decode("ascii"))
                    self._context.load_verify_locations(cadata=files["client_ca"].decode("ascii"))
                self._context.load_cert_chain(cert, key)
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


# A request's head (request line and headers) may take this many bytes; the API server's are under 1 KiB.
# httptools has no bound of its own (h11, hypercorn's parser, refused a head over 16 KiB): without this,
# one endless header grew the gate's memory without limit - measured, 200 MiB sent in one header took
# its RSS from 73 to 354 MiB.
MAX_HEAD_BYTES = 64 * 1024


class _BoundedHead(HttpToolsProtocol):
    """uvicorn's httptools protocol, but a request whose head passes MAX_HEAD_BYTES is answered 431 and its
    connection closed, before more of it is buffered.

    The bytes are counted per received chunk from the one in which the request began, while its head is
    incomplete after that chunk is parsed - so everything counted is head, but for the end of a
    pipelined request before it in the same chunk (the API server does not pipeline).
    """

    rejected: Callable[[], None] = staticmethod(lambda: None)  # set per connection by _Listener
    _head_bytes: int | None = None  # bytes received since a request began, while its head is incomplete

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._head_bytes = None
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_bytes is None or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_bytes = None
            self.rejected()
            message = f"request head over {MAX_HEAD_BYTES} bytes (request line and headers)\n".encode()
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; "
                                 b"charset=utf-8\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                                 % (len(message), message))
            self.transport.close()


class _Listener(uvicorn.Server):
    """uvicorn on one socket bound beforehand, with TLS (and its handshake bound) when `context` is given.

    `startup` is uvicorn's own for a list of sockets
    (https://github.com/Kludex/uvicorn/blob/0.54.0/uvicorn/server.py, Server.startup) but for the one
    argument it does not pass: `ssl_handshake_timeout` (asyncio's default is 60 s). The lifespan is
    off (the app has no start-up or shut-down of its own), so there is no lifespan state to hand on.
    """

    def __init__(self, app: Any, sock: socket.socket, context: ssl.SSLContext | None, *,
                 rejected: Callable[[], None]) -> None:
        super().__init__(uvicorn.Config(
            app,
            http=_BoundedHead,
            ws="none",
            lifespan="off",
            interface="asgi3",
            log_config=None,  # logging is criticalsvc.logs's: uvicorn's records reach it through the root
            access_log=False,  # the webhook writes one line per decision; an access log would double it
            proxy_headers=False,
            server_header=False,
            timeout_keep_alive=int(KEEP_ALIVE_TIMEOUT),
            timeout_graceful_shutdown=int(GRACEFUL_TIMEOUT),
            backlog=BACKLOG,
        ))
        self._sock = sock
        self._context = context
        self._rejected = rejected
        self._stop = asyncio.Event()  # replaced by serve_until's

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        if not config.loaded:
            config.load()
        self.lifespan = config.lifespan_class(config)

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            protocol = _BoundedHead(config=config, server_state=self.server_state, app_state={}, _loop=_loop)
            protocol.rejected = self._rejected
            return protocol

        timeout = SSL_HANDSHAKE_TIMEOUT if self._context is not None else None
        self.servers = [await asyncio.get_running_loop().create_server(
            create_protocol, sock=self._sock, ssl=self._context, backlog=BACKLOG, ssl_handshake_timeout=timeout)]
        self.started = True

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain as uvicorn does (module docstring, "Shutdown")."""
        self._stop = stop
        await self.startup()
        try:
            await self.main_loop()
        finally:
            await self.shutdown()

    async def on_tick(self, counter: int) -> bool:
        # uvicorn's main loop asks this every 0.1 s whether to stop; `stop` is the Service's shutdown.
        return await super().on_tick(counter) or self._stop.is_set()


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
        webhook_sock = _bind(listen, "--listen")
        try:
            ops_sock = _bind(ops_listen, "--ops-listen") if ops_listen is not None else None
        except BaseException:
            webhook_sock.close()
            raise
        self.webhook_address: tuple[str, int] = webhook_sock.getsockname()[:2]
        self.ops_address: tuple[str, int] | None = ops_sock.getsockname()[:2] if ops_sock is not None else None
        self.tls_context = ReloadingTLS(tls, metrics=webhook.metrics)
        self._listeners: list[tuple[Any, socket.socket, bool]] = [(webhook.webhook_app(), webhook_sock, True)]
        if ops_sock is not None:
            self._listeners.append((webhook.ops_app(), ops_sock, False))
        self._sockets = [s for s in (webhook_sock, ops_sock) if s is not None]

    def reload_certificates(self) -> bool:
        """Reload the serving certificate now if its files changed (also done every cert_check_interval)."""
        return self.tls_context.reload_now()

    async def run(self, shutdown_trigger: Callable[[], Awaitable[Any]]) -> None:
        """Serve until `shutdown_trigger()` returns, then finish in-flight requests and return."""
        too_large = self.webhook.metrics.requests_rejected.labels(REJECT_TOO_LARGE).inc
        listeners = [_Listener(app, sock, self.tls_context.create_ssl_context() if secure else None,
                               rejected=too_large)
                     for app, sock, secure in self._listeners]
        stop = asyncio.Event()

        async def trigger() -> None:
            await shutdown_trigger()
            stop.set()

        watchers = [asyncio.create_task(self.tls_context.watch_certificates(self.cert_check_interval)),
                    asyncio.create_task(probe_event_loop_lag(self.webhook.metrics)),
                    asyncio.create_task(trigger())]
        untime_gc = time_garbage_collections(self.webhook.metrics)
        try:
            async with asyncio.TaskGroup() as group:
                for listener in listeners:
                    group.create_task(listener.serve_until(stop))
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
    "MAX_HEAD_BYTES",
    "Endpoint",
    "ReloadingTLS",
    "Service",
    "TLSFiles",
    "bind_socket",
    "check_tls_files",
    "event_loop_factory",
    "parse_endpoint",
    "running_loop_name",
]
