"""`criticalsvc serve`: run the admission webhook (HTTPS) and its ops endpoints (plain HTTP).

    criticalsvc serve --tls-cert tls.crt --tls-key tls.key [--client-ca ca.crt]
                      [--listen :8443] [--ops-listen :8081]
                      (--state SNAPSHOT.yaml | --kubeconfig PATH)

Until the watch caches exist the cluster state comes from a snapshot (`--state`, the same files
`review` reads), which is always ready. `open_state_source` is the one place where the live state
plugs in. Port 0 picks free ports; the real ones are logged (`event="listening"`) and, with
--port-file, written as JSON ({"listen": PORT, "ops_listen": PORT or null}) before serving starts.

Signals: SIGTERM/SIGINT shut down gracefully (in-flight reviews finish, exit 0); SIGHUP reloads the
serving certificate at once (it is also reloaded within --cert-check-interval of a change).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput

if TYPE_CHECKING:  # the server stack (starlette, hypercorn, prometheus) loads only when `serve` runs
    from ..metrics import Metrics
    from ..server import Confirm, StateSource
    from ..serving import Service

# Mirrors of server.DEFAULT_MAX_BODY_BYTES (3 MiB), serving.CERT_CHECK_INTERVAL and logs.LEVELS, so
# that building the CLI's parser does not import the server stack; tests/test_serving.py checks them.
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
CERT_CHECK_INTERVAL = 2.0
LOG_LEVELS = ("debug", "info", "warning", "error")


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the admission webhook server",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--listen", default=":8443", metavar="HOST:PORT",
                   help="the webhook's HTTPS address (default: %(default)s, all interfaces; port 0 picks a free port)")
    p.add_argument("--tls-cert", metavar="PATH", help="serving certificate chain (PEM); required")
    p.add_argument("--tls-key", metavar="PATH", help="private key of --tls-cert (PEM); required")
    p.add_argument("--client-ca", metavar="PATH",
                   help="require client certificates signed by these CAs (the API server's client certificate)")
    p.add_argument("--ops-listen", default=":8081", metavar="HOST:PORT",
                   help="plain-HTTP address for /healthz, /readyz, /metrics (default: %(default)s, all interfaces; "
                        "'off' disables)")
    p.add_argument("--state", metavar="SNAPSHOT.yaml",
                   help="decide on a cluster snapshot (kubectl get ... -o yaml) instead of a live cluster")
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="the live cluster's kubeconfig (default: in-cluster configuration)")
    p.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                   help="reject AdmissionReview bodies over N bytes with HTTP 413 (default: %(default)s, 3 MiB)")
    p.add_argument("--cert-check-interval", type=float, default=CERT_CHECK_INTERVAL, metavar="SECONDS",
                   help="how often to check the certificate files for a change (default: %(default)s)")
    p.add_argument("--port-file", metavar="PATH", help="write the bound ports here as JSON once listening")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {text!r}")
    return int(text)


def open_state_source(args: argparse.Namespace, metrics: Metrics) -> tuple[StateSource, Confirm | None]:
    """Where the webhook's cluster state comes from, and how it confirms an ALLOW with a live read.

    THE LIVE HOOK. Without --state, build the watch caches from `args.kubeconfig` (in-cluster
    configuration when None) - `criticalsvc.cache.CacheState` already has the StateSource shape
    (`ready`, `state`, `unsynced()`, `counts()`) - with `on_watch_restart=lambda resource:
    metrics.watch_restarts.labels(resource).inc()`, start them before serving (their tasks belong in
    `_serve`'s event loop, next to `service.run`), and return `(caches, reader.confirm)` for a
    `criticalsvc.live.LiveReader` (then also pass `needs_confirmation=reader.needs_confirmation` to
    Webhook in `run`).
    """
    from ..manifests import load_path
    from ..server import StaticStateSource
    from ..snapshot import build_state

    if args.state:
        return StaticStateSource(build_state(load_path(args.state))), None
    raise InvalidInput("--state", "serving from a live cluster (watch caches) is not built yet; "
                       "pass --state SNAPSHOT.yaml")


def run(args: argparse.Namespace) -> int:
    import asyncio

    import orjson

    from ..logs import configure_logging, get_logger
    from ..metrics import Metrics
    from ..server import Webhook
    from ..serving import Service, TLSFiles, check_tls_files, parse_endpoint

    listen = parse_endpoint(args.listen, flag="--listen")
    ops_listen = None if args.ops_listen in ("", "off") else parse_endpoint(args.ops_listen, flag="--ops-listen")
    if args.cert_check_interval <= 0:
        raise InvalidInput("--cert-check-interval", "must be a positive number of seconds")
    if not args.tls_cert or not args.tls_key:
        raise InvalidInput("--tls-cert/--tls-key", "required: the API server calls webhooks only over HTTPS")
    tls = TLSFiles(args.tls_cert, args.tls_key, args.client_ca)
    check_tls_files(tls)
    configure_logging(args.log_level)  # after the flag checks: their errors are one plain line on stderr
    log = get_logger("criticalsvc.serve")
    metrics = Metrics()
    source, confirm = open_state_source(args, metrics)
    if args.state and args.kubeconfig:
        log.warning("--kubeconfig is not used when serving a --state snapshot")
    webhook = Webhook(source, confirm=confirm, metrics=metrics, max_body_bytes=args.max_body_bytes)
    service = Service(webhook, listen=listen, tls=tls, ops_listen=ops_listen,
                      cert_check_interval=args.cert_check_interval)
    try:
        ports = {"listen": service.webhook_address[1],
                 "ops_listen": service.ops_address[1] if service.ops_address else None}
        if args.port_file:
            _write_atomically(args.port_file, orjson.dumps(ports))
        log.info("listening", webhook=f"https://{_address(service.webhook_address)}/validate",
                 ops=f"http://{_address(service.ops_address)}" if service.ops_address else None,
                 client_ca=bool(args.client_ca), state=args.state or "live", **ports)
        asyncio.run(_serve(service))
    finally:
        service.close()
    return 0


async def _serve(service: Service) -> None:
    import asyncio

    from ..logs import get_logger

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    log = get_logger("criticalsvc.serve")

    def _shutdown(signame: str) -> None:
        if not stop.is_set():
            log.info("shutting down", signal=signame)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _shutdown, sig.name)
    loop.add_signal_handler(signal.SIGHUP, service.reload_certificates)
    try:
        await service.run(stop.wait)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def _address(address: tuple[str, int] | None) -> str:
    assert address is not None
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _write_atomically(path: str, data: bytes) -> None:
    # A poller must never read a half-written file: write aside, then rename over.
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".ports-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
