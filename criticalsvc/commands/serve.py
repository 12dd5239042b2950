"""`criticalsvc serve`: run the admission webhook (HTTPS) and its ops endpoints (plain HTTP).

    criticalsvc serve --tls-cert tls.crt --tls-key tls.key [--client-ca ca.crt]
                      [--listen :8443] [--ops-listen :8081]
                      (--state SNAPSHOT.yaml | --kubeconfig PATH)

Until the watch caches exist the cluster state comes from a snapshot (`--state`, the same files
`review` reads), which is always ready. `open_state_source` is the one place where the live state
plugs in. Port 0 picks free ports; the real ones are logged (`event="listening"`) and, with
--port-file, written as JSON ({"listen": PORT, "ops_listen": PORT or null}) before serving starts.

Signals: SIGTERM/SIGINT shut down gracefully (in-flight reviews finish, exit 0); SIGHUP reloads the
serving certificate at once (it is also reloaded within --cert-check-interval of a change). With
--shutdown-delay N, SIGTERM first turns /readyz to 503 and keeps answering reviews for N seconds, each
with `Connection: close`, so that a Service in front stops routing here before the gate stops listening
(server.Webhook.begin_termination says why; the shipped Deployment sets 5 s). SIGINT skips the delay.

Logs are JSON lines on stderr (in a cluster, the container runtime collects them), or in --log-file.
With --embedded (a terminal, often a background job) they go to a file by default, next to the
kubeconfig, and the terminal gets two lines only: `logs: PATH` at start and one when the kubeconfig
is written, which happens once the stand-in listens, the gate is registered on it and ready
(`--log-file -` keeps them on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from ..api import GroupResource
from ..atomicfile import write_atomically
from ..errors import InvalidInput
from ..replay import ARM_WINDOW, TIME_TO_LIVE

if TYPE_CHECKING:  # the server stack (starlette, uvicorn, prometheus) loads only when `serve` runs
    from ..serving import Service

# Mirrors of server.DEFAULT_MAX_BODY_BYTES (3 MiB), serving.CERT_CHECK_INTERVAL, logs.LEVELS and
# live.CATCH_UP_ABOVE, so that building the CLI's parser does not import the server stack;
# tests/test_serving.py checks them.
DEFAULT_MAX_BODY_BYTES = 3 * 1024 * 1024
CATCH_UP_ABOVE = 20_000
CERT_CHECK_INTERVAL = 2.0
LOG_LEVELS = ("debug", "info", "warning", "error")
EVENT_LOOPS = ("auto", "uvloop", "asyncio")
# With --embedded, how long to wait for the gate to be ready before writing the kubeconfig anyway.
READY_TIMEOUT = 60.0


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "serve", help="run the admission webhook server",
        description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--listen", default=None, metavar="HOST:PORT",
                   help="the webhook's HTTPS address (default: :8443, all interfaces; with --embedded 127.0.0.1:0; "
                        "port 0 picks a free port)")
    p.add_argument("--tls-cert", metavar="PATH", help="serving certificate chain (PEM); required")
    p.add_argument("--tls-key", metavar="PATH", help="private key of --tls-cert (PEM); required")
    p.add_argument("--client-ca", metavar="PATH",
                   help="require client certificates signed by these CAs (the API server's client certificate)")
    p.add_argument("--ops-listen", default=None, metavar="HOST:PORT",
                   help="plain-HTTP address for /healthz, /readyz, /metrics (default: :8081, all interfaces; with "
                        "--embedded 127.0.0.1:0; 'off' disables)")
    p.add_argument("--state", metavar="SNAPSHOT.yaml",
                   help="decide on a cluster snapshot (kubectl get ... -o yaml) instead of a live cluster")
    p.add_argument("--kubeconfig", metavar="PATH",
                   help="the live cluster's kubeconfig (default: in-cluster configuration)")
    p.add_argument("--max-body-bytes", type=_positive_int, default=DEFAULT_MAX_BODY_BYTES, metavar="N",
                   help="reject AdmissionReview bodies over N bytes with HTTP 413 (default: %(default)s, 3 MiB)")
    p.add_argument("--cert-check-interval", type=float, default=CERT_CHECK_INTERVAL, metavar="SECONDS",
                   help="how often to check the certificate files for a change (default: %(default)s)")
    p.add_argument("--shutdown-delay", type=float, default=0.0, metavar="SECONDS",
                   help="on SIGTERM, keep answering (not ready, Connection: close) this long before draining, "
                        "while the Service stops routing here (default: %(default)s; the Deployment sets 5)")
    p.add_argument("--port-file", metavar="PATH", help="write the bound ports here as JSON once listening")
    p.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default="auto",
                   help="the event loop to serve on: uvloop (C, faster TLS and transports), asyncio's own, or "
                        "auto: uvloop when installed (default: %(default)s; the `listening` log line names it)")
    p.add_argument("--log-file", metavar="PATH",
                   help="write the logs (JSON lines) to PATH, '-' for stderr (default: stderr; with --embedded "
                        "a file next to the kubeconfig, e.g. /tmp/criticalsvc.log for /tmp/criticalsvc.kubeconfig)")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="this replica's name in the status Lease (default: $POD_NAME or the host name)")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "criticalsvc-system",
                   help="namespace of the status-writer Lease (default: $POD_NAMESPACE or %(default)s)")
    p.add_argument("--no-status", action="store_true",
                   help="do not write CriticalService status, denial Events or deletion intents, and replay "
                        "nothing (read-only mode)")
    p.add_argument("--replay-arm-window", type=float, default=ARM_WINDOW, metavar="SECONDS",
                   help="how long a refused deletion waits for its teardown to start before it is not replayed "
                        "(spec.replayDeletion: WhenTearingDown; default %(default)g)")
    p.add_argument("--replay-ttl", type=float, default=TIME_TO_LIVE, metavar="SECONDS",
                   help="how long any deletion intent lives (default %(default)g)")
    p.add_argument("--manage-provider-webhooks", action=argparse.BooleanOptionalAction, default=True,
                   help="let the leader write the ValidatingWebhookConfiguration criticalsvc-providers that sends the "
                        "gate the DELETEs (and held UPDATEs) of every CriticalService's provider type the shipped "
                        "configuration does not route (default: on; off also with --no-status)")
    p.add_argument("--catch-up-above", type=_non_negative_int, default=CATCH_UP_ABOVE, metavar="OBJECTS",
                   help="a protected ALLOW whose fresh reads would bring this many objects (the cache's count: a "
                        "Finalizer criterion's type, a namespace, a selector, the CriticalServices) is confirmed on "
                        "the cache, caught up to one consistent read's version (by a watch when it lags), instead of "
                        "by fresh reads of every question (0: always; default %(default)d)")
    p.add_argument("--separate-storage", type=_group_resource, action="append", default=[],
                   metavar="GROUP/RESOURCE",
                   help="a type kube-apiserver stores in another etcd (its --etcd-servers-overrides, same format: "
                        "/pods, apps/deployments): the confirmation on the caught-up cache reads its own fresh version "
                        "(repeatable; see design/kubernetes-semantics.md §13)")
    p.add_argument("--check-coverage-every", type=float, default=0.0, metavar="SECONDS",
                   help="every this many seconds the leader reads which webhook configurations, CRD conversions and "
                        "APIServices each provider serves, and condition Covered says when a CriticalService's "
                        "criteria miss one (needs api/examples/rbac/coverage-reader.yaml; finalizers on the criteria's "
                        "types too with coverage-finalizers-reader.yaml; default 0: off)")
    p.add_argument("--webhook-configuration", default="criticalsvc", metavar="NAME",
                   help="the shipped ValidatingWebhookConfiguration: only read, to copy its clientConfig into and "
                        "own criticalsvc-providers (default: %(default)s)")
    embedded = p.add_argument_group("embedded cluster (no real cluster needed)")
    embedded.add_argument("--embedded", action="store_true",
                          help="start the simulated API server (stand-in) with its controllers, install the CRD, "
                               "register the webhook, generate certificates, and serve the gate on it")
    embedded.add_argument("--embedded-listen", default="127.0.0.1:0", metavar="HOST:PORT",
                          help="the stand-in API server's plain-HTTP address (default: %(default)s)")
    embedded.add_argument("--kubeconfig-out", default="criticalsvc-embedded.kubeconfig", metavar="PATH",
                          help="write a kubeconfig for the stand-in here once the gate is ready; a file left "
                               "from an earlier run is removed at start (default: %(default)s)")
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of bytes, got {text!r}")
    return int(text)


def _group_resource(text: str) -> GroupResource:
    group, slash, resource = text.rpartition("/")
    if (slash and not resource) or "/" in group or not resource.replace("-", "").replace(".", "").isalnum():
        raise argparse.ArgumentTypeError(f"expected GROUP/RESOURCE (as /pods or apps/deployments), got {text!r}")
    return GroupResource(group, resource)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of objects (0 or more), got {text!r}")
    return int(text)


def run(args: argparse.Namespace) -> int:
    import asyncio

    from ..logs import configure_logging
    from ..serving import event_loop_factory, parse_endpoint

    default_listen = "127.0.0.1:0" if args.embedded else ":8443"
    default_ops = "127.0.0.1:0" if args.embedded else ":8081"
    listen = parse_endpoint(args.listen or default_listen, flag="--listen")
    ops_text = args.ops_listen or default_ops
    ops_listen = None if ops_text in ("", "off") else parse_endpoint(ops_text, flag="--ops-listen")
    embedded_listen = parse_endpoint(args.embedded_listen, flag="--embedded-listen") if args.embedded else None
    _, loop_factory = event_loop_factory(args.event_loop)
    if args.cert_check_interval <= 0:
        raise InvalidInput("--cert-check-interval", "must be a positive number of seconds")
    if not 0 <= args.shutdown_delay <= 300:
        raise InvalidInput("--shutdown-delay", f"must be between 0 and 300 seconds, got {args.shutdown_delay:g}")
    if args.embedded and args.state:
        raise InvalidInput("--embedded", "serves the embedded cluster's live state; it cannot be combined with --state")
    if (not args.tls_cert or not args.tls_key) and not args.embedded:
        raise InvalidInput("--tls-cert/--tls-key", "required: the API server calls webhooks only over HTTPS")
    log_file = args.log_file
    if log_file is None:
        log_file = str(default_log_file(Path(args.kubeconfig_out))) if args.embedded else "-"
    if args.embedded:
        # A kubeconfig left by an earlier run would let `until [ -s PATH ]` pass at once, pointing at
        # a port nobody listens on any more: remove it; the new one appears when the gate is ready.
        with contextlib.suppress(OSError):  # none there (or not a file: writing it will say so)
            os.unlink(args.kubeconfig_out)
    with _logs_to(log_file) as terminal:
        configure_logging(args.log_level)  # after the flag checks: their errors are one plain line on stderr
        with tempfile.TemporaryDirectory(prefix="criticalsvc-") as workdir, \
                asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(_main(args, listen=listen, ops_listen=ops_listen, embedded_listen=embedded_listen,
                             workdir=workdir, terminal=terminal, log_file=log_file))
    return 0


def default_log_file(kubeconfig_out: Path) -> Path:
    """Where `serve --embedded` logs by default: beside the kubeconfig, named after it
    (/tmp/criticalsvc.kubeconfig -> /tmp/criticalsvc.log, /tmp/k -> /tmp/k.log)."""
    path = kubeconfig_out.with_suffix(".log") if kubeconfig_out.suffix else kubeconfig_out.with_name(
        kubeconfig_out.name + ".log")
    return path if path != kubeconfig_out else kubeconfig_out.with_name(kubeconfig_out.name + ".log")


@contextlib.contextmanager
def _logs_to(log_file: str) -> Iterator[TextIO]:
    """Send the process's stderr (the JSON logs, and whatever else a library prints there: uvicorn's
    own handler, asyncio's "SSL shutdown timed out", a thread's traceback) to `log_file` ('-': leave it).

    Yields a stream to the terminal (the original stderr) for the few lines a person must see; stderr
    is put back on the way out, so an error that ends the command is still printed to the terminal."""
    if log_file == "-":
        yield sys.stderr
        return
    try:
        target = Path(log_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
    except OSError as exc:
        raise InvalidInput("--log-file", f"cannot write {log_file}: {exc.strerror or exc}") from None
    print(f"logs: {log_file}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    saved = os.dup(2)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield terminal
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        with contextlib.suppress(Exception):
            terminal.close()


async def _main(args: argparse.Namespace, *, listen: Any, ops_listen: Any, embedded_listen: Any,
                workdir: str, terminal: TextIO | None = None, log_file: str = "-") -> None:
    """Compose the service: [embedded cluster] -> state source (+ live reads, status writer) -> server."""
    import asyncio

    import orjson

    from ..logs import get_logger
    from ..metrics import Metrics
    from ..server import StaticStateSource, Webhook, allowed_and_protected
    from ..serving import Service, TLSFiles, check_tls_files, running_loop_name

    log = get_logger("criticalsvc.serve")
    metrics = Metrics()
    async with contextlib.AsyncExitStack() as stack:
        cluster = None
        kubeconfig = args.kubeconfig
        ca_pem: bytes | None = None
        if args.embedded:
            from ..embedded import embedded_cluster, make_tls, write_kubeconfig

            if not args.tls_cert:
                material = make_tls(Path(workdir))
                args.tls_cert, args.tls_key, ca_pem = str(material.cert), str(material.key), material.ca_pem
            else:
                ca_pem = Path(args.client_ca or args.tls_cert).read_bytes()
            cluster = await stack.enter_async_context(embedded_cluster(
                host=embedded_listen.host, port=embedded_listen.port, kubeconfig_out=Path(args.kubeconfig_out),
                write_kubeconfig_now=False))  # written below, once the gate is registered and ready
            # The gate's own connection: the file for kubectl comes later, once the gate is ready.
            kubeconfig = str(write_kubeconfig(Path(workdir) / "gate.kubeconfig", cluster.url))
        tls = TLSFiles(args.tls_cert, args.tls_key, args.client_ca)
        check_tls_files(tls)

        tasks: list[asyncio.Task[Any]] = []
        on_decision = None
        manages_routes = False
        read_access = None
        if args.state:
            from ..manifests import load_path
            from ..snapshot import build_state

            if args.kubeconfig:
                log.warning("--kubeconfig is not used when serving a --state snapshot")
            source: Any = StaticStateSource(build_state(load_path(args.state)))
            confirm, needs_confirmation = None, allowed_and_protected
        else:
            from ..cache import CacheState, KubeTransport, connect
            from ..caughtup import CaughtUpReader
            from ..live import LiveReader
            from ..statuswriter import StatusWriter

            api = await connect(kubeconfig=kubeconfig)
            stack.push_async_callback(api.close)
            transport = KubeTransport(api)
            cache = CacheState(transport, on_watch_restart=lambda r: metrics.watch_restarts.labels(r).inc())
            reader = LiveReader(transport, mapper=cache.mapper, mirror=cache, catch_up_above=args.catch_up_above,
                                on_finalizer_read=lambda m, s: metrics.finalizer_reads.labels(m).observe(s),
                                caught_up=CaughtUpReader(transport, cache,
                                                         separate_storage=frozenset(args.separate_storage)),
                                on_caught_up=lambda c, s: metrics.caught_up_confirmations.labels(
                                    "watch" if c.watches else "already").observe(s),
                                predict_from=cache)
            source, confirm, needs_confirmation = cache, reader.confirm, reader.needs_confirmation
            from ..cache.access import ReadAccess

            read_access = ReadAccess(transport)
            await cache.start()
            stack.push_async_callback(cache.stop)
            tasks.append(asyncio.create_task(freeze_heap_when_synced(cache), name="freeze-when-synced"))
            tasks.append(asyncio.create_task(refreeze_after_slow_collections(), name="refreeze"))
            if not args.no_status:
                from ..replayer import LiveReplayer

                writer = StatusWriter(api_client=api, source=cache, identity=args.identity,
                                      namespace=args.lease_namespace)
                replayer = LiveReplayer(transport, cache, cache.mapper, namespace=args.lease_namespace,
                                        post_event=writer.post_event, on_change=writer.poke, metrics=metrics,
                                        arm_window=args.replay_arm_window, time_to_live=args.replay_ttl)
                writer.replayer = replayer
                writer.reader = reader
                if args.manage_provider_webhooks:
                    from ..webhookrouter import WebhookRouter

                    router = WebhookRouter(transport, cache, cache.mapper, shipped=args.webhook_configuration,
                                           namespace=args.lease_namespace, metrics=metrics,
                                           post_event=writer.post_event, on_change=writer.poke_soon)
                    writer.router, manages_routes = router, True
                    tasks.append(asyncio.create_task(router.run(lambda: writer.leading), name="webhook-router"))
                    from ..labeller import Labeller

                    labeller = Labeller(transport, cache, cache.mapper, metrics=metrics,
                                        post_event=writer.post_event, on_change=writer.poke_soon)
                    writer.labeller = labeller
                    tasks.append(asyncio.create_task(labeller.run(lambda: writer.leading), name="labeller"))
                if args.check_coverage_every > 0:
                    from ..discover.read import CoverageWatch, criteria_types

                    # Finalizers are judged on the types the criteria name, which the gate reads anyway.
                    writer.coverage = CoverageWatch(
                        transport, every=args.check_coverage_every, gate_namespace=args.lease_namespace,
                        finalizer_types=lambda: criteria_types(writer.source.state.critical_services())
                        if writer.source.ready else frozenset())
                    tasks.append(asyncio.create_task(writer.coverage.run(lambda: writer.leading), name="coverage"))
                tasks += [asyncio.create_task(writer.run_elected(), name="status-writer"),
                          asyncio.create_task(writer.run_events(), name="event-writer"),
                          asyncio.create_task(replayer.run(lambda: writer.leading), name="replayer"),
                          asyncio.create_task(replayer.run_recorder(), name="intent-recorder")]

                def on_decision(request: Any, decision: Any) -> None:
                    writer.record(request, decision)
                    replayer.record(request, decision)

        webhook = Webhook(source, confirm=confirm, needs_confirmation=needs_confirmation, metrics=metrics,
                          max_body_bytes=args.max_body_bytes, on_decision=on_decision, manages_routes=manages_routes,
                          read_access=read_access)
        service = Service(webhook, listen=listen, tls=tls, ops_listen=ops_listen,
                          cert_check_interval=args.cert_check_interval)
        stack.callback(service.close)
        ports = {"listen": service.webhook_address[1],
                 "ops_listen": service.ops_address[1] if service.ops_address else None}
        gate_url = f"https://{_address(_loopback(service.webhook_address))}"
        registered: asyncio.Future[Any] | None = None
        if cluster is not None:
            assert ca_pem is not None
            registered = asyncio.wrap_future(cluster.register_gate(gate_url, ca_pem))
            ports["embedded"] = int(cluster.url.rsplit(":", 1)[1])
        _freeze_startup_heap()
        if args.port_file:
            write_atomically(args.port_file, orjson.dumps(ports))
        log.info("listening", webhook=f"{gate_url}/validate",
                 ops=f"http://{_address(service.ops_address)}" if service.ops_address else None,
                 client_ca=bool(args.client_ca), state=args.state or ("embedded" if cluster else "live"),
                 event_loop=running_loop_name(), **ports)
        try:
            if cluster is not None:
                assert registered is not None
                await _write_kubeconfig_when_ready(cluster, webhook, registered, timeout=READY_TIMEOUT,
                                                   terminal=terminal or sys.stderr, log_file=log_file)
            # Embedded: the API server is the gate's client, so it stops first - its in-flight requests
            # (and so their reviews) finish while the gate still serves, and its webhook connections
            # close - and then the gate drains, with nothing left to wait for.
            await _serve(service, before_drain=cluster.stop if cluster is not None else None,
                         shutdown_delay=args.shutdown_delay)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _write_kubeconfig_when_ready(cluster: Any, webhook: Any, registered: Awaitable[Any], *, timeout: float,
                                      terminal: TextIO, log_file: str) -> None:
    """Write the embedded cluster's kubeconfig once kubectl can use it, and say so once on the terminal.

    Called after the stand-in listens and the gate's sockets are bound, right before serving starts: it
    waits until the gate's webhooks are registered on the stand-in and the gate's state is synced. So
    from the moment the file exists a DELETE goes through the gate (the webhook's socket already accepts;
    serving begins in the same moment), and the gate's /readyz never says 200 before the file exists. A
    script that waits for the file (`until [ -s PATH ]`) can use it at once."""
    import asyncio
    import time

    from ..logs import get_logger

    log = get_logger("criticalsvc.serve")
    deadline = time.monotonic() + timeout
    ready = False
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(registered), timeout)
        wait_ready = getattr(webhook.source, "wait_ready", None)
        if wait_ready is not None:
            ready = bool(await wait_ready(max(0.0, deadline - time.monotonic())))
        else:
            ready = bool(webhook.source.ready)
    cluster.write_kubeconfig()
    kubeconfig = cluster.kubeconfig
    if ready:
        log.info("embedded cluster ready", api_server=cluster.url, kubeconfig=str(kubeconfig),
                 try_this=f"kubectl --kubeconfig {kubeconfig} apply -f api/examples/reference-story.yaml")
        message = f"ready: export KUBECONFIG={kubeconfig}"
    else:
        log.warning("the gate is not ready; wrote the kubeconfig anyway", timeout=timeout,
                    api_server=cluster.url, kubeconfig=str(kubeconfig))
        where = "the logs" if log_file == "-" else log_file
        message = f"the gate is not ready after {timeout:g} s (see {where}); wrote {kubeconfig} anyway"
    with contextlib.suppress(Exception):  # the terminal may be gone (a closed pipe): the file is what matters
        print(f"criticalsvc serve --embedded: {message}", file=terminal, flush=True)


def _loopback(address: tuple[str, int]) -> tuple[str, int]:
    """Where a local client reaches a socket bound to a wildcard address."""
    host, port = address
    if host in ("0.0.0.0", ""):
        return "127.0.0.1", port
    if host == "::":
        return "::1", port
    return host, port


def _freeze_startup_heap() -> None:
    """Move everything allocated so far (modules, the kubernetes client, a loaded snapshot) out of the
    collector's reach: a full collection would otherwise walk it all again and again while serving,
    for objects that live as long as the process. Objects created later are collected as usual."""
    import gc

    gc.collect()
    gc.freeze()


async def freeze_heap_when_synced(source: Any) -> bool:
    """Once `source` (the watch caches) has synced, freeze the heap again: the cached objects live until
    their object changes, and a full collection would otherwise walk them all - 3 ms per 1,000 cached
    objects, 170-320 ms at 100,000 on this project's 2-core machine (python -m benchmarks gcpause), a
    stall of every review in flight. Objects cached later are collected as usual. True once frozen."""
    if not await source.wait_ready():
        return False
    _freeze_startup_heap()
    return True


async def refreeze_after_slow_collections(*, slow: float = 0.05, every: float = 60.0, check: float = 5.0) -> None:
    """Until cancelled: when a full collection took longer than `slow`, freeze the heap again (at most once per
    `every`). What is cached after the sync - 10,000 CriticalServices created one by one, their statuses, routes
    and memos - is walked by every full collection: at 10,000 the leader's took 154 ms on average, 731 of them in
    17 minutes (`criticalsvc_gc_pause_seconds`, `python -m benchmarks realcluster --services 10000`), each a stall
    of every review and of the router's next round (issue 34: CREATE -> Enforcing). Frozen, they are walked no
    more; acyclic garbage among them is still freed as it goes, and a collection before each freeze leaves no
    cycle in what is frozen."""
    import asyncio
    import gc
    import time

    longest, started = [0.0], [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            longest[0] = max(longest[0], time.perf_counter() - started[0])

    gc.callbacks.append(timed)
    last = time.monotonic()
    try:
        while True:
            await asyncio.sleep(check)
            if longest[0] > slow and time.monotonic() - last >= every:
                _freeze_startup_heap()
                last = time.monotonic()
            longest[0] = 0.0
    finally:
        gc.callbacks.remove(timed)


async def _serve(service: Service, *, before_drain: Callable[[], Awaitable[None]] | None = None,
                 shutdown_delay: float = 0.0) -> None:
    """Serve until SIGTERM/SIGINT; after SIGTERM keep answering for `shutdown_delay` seconds while
    reporting not ready; then await `before_drain()` (if any) and let the service drain."""
    import asyncio

    from ..logs import get_logger

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    log = get_logger("criticalsvc.serve")
    delay = [0.0]

    def _shutdown(signame: str) -> None:
        if not stop.is_set():
            delay[0] = shutdown_delay if signame == "SIGTERM" else 0.0
            service.webhook.begin_termination()
            log.info("shutting down", signal=signame, shutdown_delay=delay[0])
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _shutdown, sig.name)
    loop.add_signal_handler(signal.SIGHUP, service.reload_certificates)

    async def trigger() -> None:  # awaited by each listener: `before_drain` must be idempotent
        await stop.wait()
        if delay[0] > 0:
            await asyncio.sleep(delay[0])  # not ready, still answering: the Service routes elsewhere
        if before_drain is not None:
            await before_drain()

    try:
        await service.run(trigger)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def _address(address: tuple[str, int] | None) -> str:
    assert address is not None
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
