"""Serving a StandIn over HTTP(S) with hypercorn: `serve` on the caller's event loop, `ServerThread` on a
thread of its own for synchronous callers (tests, kubectl, benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable

from .standin import StandIn


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # connections queue from here on, before hypercorn accepts
    return sock


async def serve(standin: StandIn, *, host: str = "127.0.0.1", port: int = 0, certfile: str | None = None,
                keyfile: str | None = None, shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the stand-in with hypercorn until `shutdown_trigger` returns (default: SIGINT/SIGTERM).

    `port=0` picks a free port; `on_ready(url)` gets the URL (http, or https with cert and key) once
    the socket listens. Open watches are ended first, so shutdown does not wait for them.
    """
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    sock = _listening_socket(host, port)
    bound = sock.getsockname()[1]
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.certfile, config.keyfile = certfile, keyfile
    config.accesslog = None
    config.graceful_timeout = 2.0
    config.keep_alive_timeout = 120.0  # longer than client-go's idle connection timeout (90 s)
    stop = asyncio.Event()

    async def trigger() -> None:
        if shutdown_trigger is None:
            await stop.wait()
        else:
            await shutdown_trigger()
        standin.close_watches()

    if shutdown_trigger is None:
        import signal

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    shown = f"[{host}]" if ":" in host else host
    if on_ready is not None:
        on_ready(f"{'https' if certfile else 'http'}://{shown}:{bound}")
    await hypercorn_serve(standin.app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]


class ServerThread:
    """The stand-in served on its own thread and event loop, for synchronous callers (tests, kubectl).

        with ServerThread(StandIn(store)) as url:
            subprocess.run(["kubectl", "--server", url, "get", "ns"])
    """

    def __init__(self, standin: StandIn, *, host: str = "127.0.0.1", port: int = 0,
                 certfile: str | None = None, keyfile: str | None = None) -> None:
        self.standin = standin
        self._kwargs = {"host": host, "port": port, "certfile": certfile, "keyfile": keyfile}
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.url = ""

    def start(self, timeout: float = 10.0) -> str:
        self._thread = threading.Thread(target=self._main, name="standin-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the API-server stand-in did not start: {self._error}")
        self._wait_until_serving(timeout)
        return self.url

    def _wait_until_serving(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:  # readiness is polled: hypercorn runs the lifespan before it accepts
            try:
                if httpx.get(f"{self.url}/readyz", verify=False, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self._error is not None:
                raise RuntimeError(f"the API-server stand-in at {self.url} did not become ready: {self._error}")
            time.sleep(0.02)

    def _main(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()

            def ready(url: str) -> None:
                self.url = url
                self._ready.set()

            await serve(self.standin, shutdown_trigger=self._stop.wait, on_ready=ready,
                        **self._kwargs)  # type: ignore[arg-type]

        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to start(); the thread ends either way
            self._error = exc
            self._ready.set()

    def stop(self, timeout: float = 10.0) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
