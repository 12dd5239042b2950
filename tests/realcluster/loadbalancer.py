"""A loopback TCP load balancer: N backends behind one address, each connection to the next one.

It stands in for three things a real cluster has:

- **The gate's Service.** In a cluster the API server calls `criticalsvc.criticalsvc-system.svc:443`,
  and kube-proxy spreads connections over the EndpointSlice's ready endpoints: a replica whose
  readiness probe (`/readyz`) fails is taken out, a new one is added once ready. Here the webhook URL
  points at this balancer, which forwards each TCP connection (TLS passes through untouched, so the
  API server still verifies the gate's certificate) to the next backend, round robin, among those
  whose `/readyz` answered 200 at the last health check (every `interval` seconds, as a readiness
  probe's period). With no ready backend the connection is closed at once, as a Service without
  endpoints rejects it.
- **The API servers' load balancer** of an HA control plane (tests/realcluster/controlplane.py): the
  backends are the kube-apiservers, with no health check (a backend without `ops_port` is always in
  the rotation), as a plain TCP balancer in front of kubeadm's API servers passes each new connection
  on. A client keeps its connection, so each kubectl run, each new client, lands on the next one.
- **A link that can stall**: `pause()` holds the bytes, both ways, on open connections and new ones
  (accepted, then left hanging) until `resume()`, dropping none - what a client sees of a peer that
  stopped answering without closing anything (one backend: a pausable proxy, as the API server's
  lagging view of etcd in controlplane.py is).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Sequence

import attrs


@attrs.define
class Backend:
    name: str
    port: int  # where its connections go (the gate's webhook port, an API server's, etcd's)
    ops_port: int | None = None  # its /readyz (plain HTTP) is checked here; None: always in the rotation
    ready: bool = False

    @property
    def in_rotation(self) -> bool:
        return self.ops_port is None or self.ready


class LoadBalancer:
    def __init__(self, port: int, *, interval: float = 0.25, name: str = "gate-service",
                 backends: Sequence[Backend] = ()) -> None:
        self.port = port
        self.interval = interval
        self.backends: list[Backend] = list(backends)
        self.connections = 0
        self.rejected = 0  # connections closed for want of a ready backend
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name=name)
        self._rotation = itertools.count()
        self._server: asyncio.Server | None = None
        self._health: asyncio.Task[None] | None = None
        self._flowing: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # the connections open, closed by `stop`

    @property
    def url(self) -> str:
        """Its address as an HTTPS URL (TLS passes through: the backends' certificates name 127.0.0.1)."""
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> LoadBalancer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def set_backends(self, backends: Sequence[Backend]) -> None:
        self._call(lambda: setattr(self, "backends", list(backends)))

    def ready_backends(self) -> list[str]:
        return [b.name for b in self.backends if b.in_rotation]

    def pause(self) -> None:
        """Hold every byte, both ways, on open and new connections, until `resume()`."""
        asyncio.run_coroutine_threadsafe(self._set_flowing(False), self._loop).result(10)

    def resume(self) -> None:
        """Let the held bytes, and the connections accepted meanwhile, go on."""
        asyncio.run_coroutine_threadsafe(self._set_flowing(True), self._loop).result(10)

    @property
    def paused(self) -> bool:
        return self._flowing is not None and not self._flowing.is_set()

    def stop(self) -> None:
        """Stop accepting, then close every connection it holds. Each socket is closed here, before the loop
        is: `writer.close()` only schedules the close on the loop, and a socket the loop never got to close
        warns (ResourceWarning) in whichever later test the garbage collector happens to run in."""
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:  # the health check and the connections still piped
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in list(self._writers):
                writer.transport.abort()
            await asyncio.sleep(0)  # abort() closes the socket at the loop's next step
        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _call(self, fn: Callable[[], object]) -> None:
        self._loop.call_soon_threadsafe(fn)

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self._health = asyncio.create_task(self._check_health())

    async def _check_health(self) -> None:
        while True:
            for backend in list(self.backends):
                if backend.ops_port is not None:
                    backend.ready = await _ready(backend.ops_port)
            await asyncio.sleep(self.interval)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self._writers.add(writer)
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # paused: accepted, then left hanging
            ready = [b for b in self.backends if b.in_rotation]
            if not ready:
                self.rejected += 1
                return
            backend = ready[next(self._rotation) % len(ready)]
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", backend.port)
            except OSError:
                self.rejected += 1
                return
            self._writers.add(upstream_writer)
            self.connections += 1
            await asyncio.gather(pipe(reader, upstream_writer, flowing=self._flowing),
                                 pipe(upstream_reader, writer, flowing=self._flowing))
        finally:
            for each in (writer, upstream_writer):
                if each is not None:
                    each.close()
                    self._writers.discard(each)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
               flowing: asyncio.Event | None = None) -> None:
    """Copy bytes from `reader` to `writer` until EOF, then close `writer`; while `flowing` is clear, hold
    them (a paused link: `LoadBalancer.pause`)."""
    try:
        while data := await reader.read(65536):
            if flowing is not None:
                await flowing.wait()
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _ready(port: int) -> bool:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1)
    except (OSError, TimeoutError):
        return False
    try:
        writer.write(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        status = await asyncio.wait_for(reader.readline(), 1)
        return status.split(b" ")[1:2] == [b"200"]
    except (OSError, TimeoutError, IndexError):
        return False
    finally:
        writer.close()
