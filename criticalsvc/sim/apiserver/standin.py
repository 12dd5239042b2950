"""StandIn: the simulator's Store behind the Kubernetes REST API, as an ASGI application (`app`).

Threads, and why. The store's admission call is synchronous, and the webhook it calls may be served
by this very process on this very event loop (`serve --embedded`), or may read this API server back
(the gate's live confirmation read). So:

* every write (and every controller callback) runs on ONE writer thread: writes are serialized, as
  with one etcd writer, and the event loop never blocks on a webhook;
* reads run on a small reader pool;
* one lock guards the store's data. The writer holds it for the whole write except while a webhook
  call is out (`Store.around_webhook_call`), so readers - including the webhook's own read-back - get
  in, and see the state before the write. No other writer can interleave, so the write resumes on
  the state it admitted.

While a StandIn runs, touch the store only through `write()` / `read()` / `submit()`, or from
controllers scheduled on `standin.engine` (a StandInEngine whose callbacks run on the writer thread).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ...api import NAMESPACES
from ..engine import Callback, Engine, RealTimeEngine
from ..store import StatusError, Store
from .context import Watches
from .dispatch import handle
from .registry import EXTRA_TYPES
from .responses import status_response

log = structlog.get_logger("criticalsvc.sim.apiserver")
T = TypeVar("T")

# What a fresh cluster has; `default` is where Events about cluster-scoped objects go.
BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
DEFAULT_USER = "kubernetes-admin"
DEFAULT_CRD_PATH = Path(__file__).resolve().parents[3] / "api" / "criticalservices.criticalsvc.io.yaml"
# The API server picks a watch timeout between 30 and 60 min (--min-request-timeout 1800 s).
DEFAULT_WATCH_TIMEOUT = 1800.0
# The watch cache sends a bookmark about once a minute.
DEFAULT_BOOKMARK_INTERVAL = 60.0


class _StoreGuard:
    """One data lock; the writer thread lends it to readers while a webhook call is out."""

    def __init__(self) -> None:
        self.data = threading.Lock()
        self._writer: int | None = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        with self.data:
            self._writer = threading.get_ident()
            try:
                yield
            finally:
                self._writer = None

    @contextlib.contextmanager
    def outside(self) -> Iterator[None]:
        """Store.around_webhook_call: release the data lock for the call, if this thread holds it."""
        if self._writer != threading.get_ident():
            yield
            return
        self._writer = None
        self.data.release()
        try:
            yield
        finally:
            self.data.acquire()
            self._writer = threading.get_ident()


class StandInEngine(RealTimeEngine):
    """Wall-clock time whose callbacks run on the stand-in's writer thread, holding the store.

    It exists before the stand-in starts (so a `Cluster(engine=...)` can be built on it); callbacks
    scheduled before then wait, and run when the stand-in starts, at their due time.
    """

    def __init__(self) -> None:
        super().__init__(None)
        self._run: Callable[[Callback], None] | None = None
        self._pending: list[tuple[float, Callback]] = []
        self._attach = threading.Lock()

    def attach(self, loop: asyncio.AbstractEventLoop, run: Callable[[Callback], None]) -> None:
        with self._attach:
            self._loop, self._run = loop, run
            pending, self._pending = self._pending, []
        for due, callback in pending:
            self.schedule(due - self.now(), callback)

    def schedule(self, delay: float, callback: Callback) -> None:
        with self._attach:
            run = self._run
            if run is None:
                self._pending.append((self.now() + delay, callback))
                return
        super().schedule(delay, lambda: run(callback))


class StandIn:
    """The Store behind the Kubernetes REST API; `app` is the ASGI application.

    Controllers run on `engine` (a StandInEngine: real time, callbacks on the writer thread). Either
    pass `start_controllers(store, engine)`, called once on the writer thread when the stand-in starts,
    or build them beforehand on an engine you pass in (`engine = StandInEngine(); cluster =
    Cluster(engine=engine); StandIn(cluster.store, engine=engine)`). `bootstrap_namespaces` are
    created at start if missing.
    """

    def __init__(self, store: Store, *, engine: StandInEngine | None = None,
                 start_controllers: Callable[[Store, Engine], object] | None = None,
                 bootstrap_namespaces: Iterable[str] = BUILTIN_NAMESPACES,
                 bookmark_interval: float = DEFAULT_BOOKMARK_INTERVAL,
                 watch_timeout: float = DEFAULT_WATCH_TIMEOUT, crd_path: Path | None = DEFAULT_CRD_PATH,
                 default_user: str = DEFAULT_USER, readers: int = 4) -> None:
        self.store = store
        self.start_controllers = start_controllers
        self.bootstrap_namespaces = tuple(bootstrap_namespaces)
        self.bookmark_interval = bookmark_interval
        self.watch_timeout = watch_timeout
        self.crd_path = crd_path
        self.default_user = default_user
        # What a real server's discovery can also say: served without the aggregated form (before 1.26,
        # or behind a proxy), or an aggregated API whose backend does not answer marked `Stale`.
        self.aggregated_discovery = True
        self.stale_groups: set[str] = set()
        for t in EXTRA_TYPES:
            if store.mapper.lookup(t.group_resource) is None:
                store.mapper.add(t)
        self._guard = _StoreGuard()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="standin-writer")
        self._readers = concurrent.futures.ThreadPoolExecutor(readers, thread_name_prefix="standin-reader")
        self.watches = Watches()
        self._started: asyncio.Future[None] | None = None
        self._engine = engine or StandInEngine()
        self._closed = False
        self.app = Starlette(routes=[Route("/{path:path}", self._endpoint,
                                           methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
                             lifespan=self._lifespan)

    # --- lifecycle ------------------------------------------------------------------------------------
    @property
    def engine(self) -> StandInEngine:
        """The controllers' engine: real time, callbacks on the writer thread (held until start)."""
        return self._engine

    async def start(self) -> None:
        """Bootstrap namespaces and start the controllers (idempotent; the first request calls it)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await self._started

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        self.watches.loop = loop
        self._engine.attach(loop, self._run_callback)
        self.store.around_webhook_call = self._guard.outside

        def boot() -> None:
            for name in self.bootstrap_namespaces:
                if not self.store.exists(NAMESPACES, "", name):
                    self.store.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
            if self.start_controllers is not None:
                self.start_controllers(self.store, self._engine)

        await self.write(boot)

    async def stop(self) -> None:
        """End every watch, stop running controller callbacks and release the threads."""
        self._closed = True
        self.close_watches()
        self._writer.shutdown(wait=False, cancel_futures=True)
        self._readers.shutdown(wait=False, cancel_futures=True)

    @property
    def open_watches(self) -> int:
        """How many watch streams are open (subscribed to the store)."""
        return len(self.watches)

    def close_watches(self) -> None:
        """End all open watch streams now (before a graceful server shutdown); callable from any thread."""
        self.watches.close_all()


    @contextlib.asynccontextmanager
    async def _lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # --- store access ---------------------------------------------------------------------------------
    def _locked_write(self, fn: Callable[[], T]) -> T:
        with self._guard.writing():
            return fn()

    def _locked_read(self, fn: Callable[[], T]) -> T:
        with self._guard.data:
            return fn()

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run `fn` on the writer thread holding the store. Call it from any thread but that one: a
        controller callback already runs there and holds the store, and waiting on it would deadlock."""
        return self._writer.submit(self._locked_write, fn)

    async def write(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))

    async def read(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._readers, self._locked_read, fn)

    def _run_callback(self, callback: Callback) -> None:
        if self._closed:
            return

        def run() -> None:
            try:
                callback()
            except Exception:  # a failing controller must not take the API server down
                log.exception("controller callback failed")

        with contextlib.suppress(RuntimeError):  # shutting down
            self.submit(run)
    # --- HTTP -----------------------------------------------------------------------------------------
    async def _endpoint(self, request: Request) -> Response:
        try:
            await self.start()
            return await handle(self, request)
        except StatusError as exc:
            return status_response(exc)
        except Exception as exc:
            log.exception("stand-in request failed", method=request.method, path=request.url.path)
            return status_response(StatusError(500, "InternalError", f"Internal error occurred: {exc}"))
