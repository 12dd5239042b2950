"""Test doubles for the cache and live-read tests: a scripted Transport, and faults for the stand-in.

* `ScriptedTransport` answers GETs and watch streams from queues the test fills, records every
  call, and blocks (like a quiet watch) once a stream's script is used up. No sockets: the
  reflector's list/watch/410/backoff logic is tested exactly.
* `Faults` is ASGI middleware around the API-server stand-in (criticalsvc.sim.apiserver): the test
  makes matching requests answer an error status, hang until released, or break off mid-stream,
  and reads back which requests were made.
* `running_standin` serves a Store over HTTP on a free port, with `Faults` in front.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
import orjson

from criticalsvc.api import GroupResource, ObjectRef, parse_critical_service
from criticalsvc.cache.guarded import READER_AGGREGATION_LABEL
from criticalsvc.cache.transport import APIError, APIStatusError, TransportError
from criticalsvc.errors import StateUnavailable
from criticalsvc.manifests import load_path
from criticalsvc.objects import KubeObject
from criticalsvc.sim.apiserver.server import ServerThread
from criticalsvc.sim.apiserver.standin import StandIn
from criticalsvc.sim.store import Store
from criticalsvc.state import MemoryState

STORY = "api/examples/reference-story.yaml"
_ORDER = {"Namespace": 0, "CustomResourceDefinition": 1}


def story_store(*, skip_kinds: tuple[str, ...] = (), history: int = 10_000) -> Store:
    """A Store holding the reference story (namespaces, then CRDs, then the rest)."""
    store = Store(clock=time.time, history=history)
    manifests = sorted(load_path(STORY), key=lambda m: _ORDER.get(m.kind, 2))
    for m in manifests:
        if m.kind not in skip_kinds:
            store.create(m.obj)
    return store


def story_objects(kind: str) -> list[dict[str, Any]]:
    return [dict(m.obj) for m in load_path(STORY) if m.kind == kind]


async def eventually(condition: Callable[[], object], *, timeout: float = 5.0, what: str = "") -> None:
    """Poll `condition` every 5 ms until it is truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what or condition}")
        await asyncio.sleep(0.005)


# --- a scripted transport ---------------------------------------------------------------------------
@attrs.define
class Call:
    kind: str  # "get" | "stream"
    path: str
    params: dict[str, str]
    accept: str


class ScriptedTransport:
    """`gets` / `streams` are queues; an item that is an exception is raised instead of answered."""

    def __init__(self) -> None:
        self.gets: deque[Any] = deque()
        self.streams: deque[list[Any] | APIError] = deque()
        self.calls: list[Call] = []
        self._idle = asyncio.Event()  # never set: a finished script idles like a quiet watch

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        self.calls.append(Call("get", path, dict(params), accept))
        if not self.gets:
            await self._idle.wait()
        item = self.gets.popleft()
        if isinstance(item, BaseException):
            raise item
        return item

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Any = (), *, timeout: float,
                     accept: str = "application/json") -> AsyncIterator[AsyncIterator[Any]]:
        self.calls.append(Call("stream", path, dict(params), accept))
        if not self.streams:
            await self._idle.wait()
        script = self.streams.popleft()
        if isinstance(script, BaseException):
            raise script

        async def events() -> AsyncIterator[Any]:
            for item in script:
                await asyncio.sleep(0)
                if isinstance(item, BaseException):
                    raise item
                yield item
            if not self.streams:
                await self._idle.wait()  # the stream stays open, quiet, until the next script exists

        yield events()

    def of(self, kind: str) -> list[Call]:
        return [c for c in self.calls if c.kind == kind]


# --- a cache that lags the API server, on purpose ---------------------------------------------------------
class HoldingTransport:
    """Any Transport, with `hold()`: the watch streams open at that moment deliver nothing more until
    `release()`, while every other request (a GET, a LIST, a watch opened later) is answered as usual.
    What a cache sees while its watch lags a few events behind the API server, made to last as long as a
    test needs: the window a fresh read exists for. `calls` records every request (kind, path, params)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str, dict[str, str]]] = []
        self._open: dict[int, str] = {}  # open streams and their paths
        self._held: set[int] = set()
        self._released = asyncio.Event()
        self._ids = iter(range(1, 1 << 62))

    def hold(self, path: str | None = None) -> None:
        """Hold the streams open now (only those of `path`, when given), besides those held already."""
        self._held |= {me for me, at in self._open.items() if path is None or at == path}

    def release(self, path: str | None = None) -> None:
        """Let the held streams go on (only those of `path`, when given)."""
        self._held = {me for me in self._held if path is not None and self._open.get(me) != path}
        # Wake every held stream; those still held wait again, on a new event.
        released, self._released = self._released, asyncio.Event()
        released.set()

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        self.calls.append(("get", path, dict(params)))
        return await self.inner.get(path, params, timeout=timeout, accept=accept)

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Any = (), *, timeout: float,
                     accept: str = "application/json") -> AsyncIterator[AsyncIterator[Any]]:
        self.calls.append(("stream", path, dict(params)))
        me = next(self._ids)
        self._open[me] = path
        try:
            async with self.inner.stream(path, params, timeout=timeout, accept=accept) as events:
                async def held() -> AsyncIterator[Any]:
                    async for event in events:
                        while me in self._held:
                            await self._released.wait()
                        yield event

                yield held()
        finally:
            self._open.pop(me, None)


# --- faults in front of the stand-in ------------------------------------------------------------------
@attrs.define
class Rule:
    method: str
    path: re.Pattern[str]
    watch: bool | None  # None: both watches and plain requests
    action: str  # "status" | "hang" | "abort"
    status: int = 500
    times: int | None = None  # None: until removed


class Faults:
    """ASGI middleware: requests matching a rule fail as the rule says; every request is recorded."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None

    def add(self, path: str, *, action: str = "status", status: int = 500, method: str = "GET",
            watch: bool | None = None, times: int | None = None) -> Rule:
        """Make requests whose path matches the regex `path` fail (thread-safe; from the test's thread)."""
        rule = Rule(method, re.compile(path), watch, action, status, times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
        self.release()

    def release(self) -> None:
        """Let every hanging request go on (it then fails with 503)."""
        if self._loop is not None and self._release is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._release.set)

    def seen(self, pattern: str, *, watch: bool | None = None) -> int:
        with self._lock:
            return sum(1 for _m, p, q in self.requests if re.search(pattern, p)
                       and (watch is None or (("watch=true" in q) == watch)))

    def _match(self, method: str, path: str, query: str) -> Rule | None:
        with self._lock:
            self.requests.append((method, path, query))
            for rule in self.rules:
                is_watch = "watch=true" in query or "watch=1" in query
                if rule.method == method and rule.path.search(path) and rule.watch in (None, is_watch):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self.rules.remove(rule)
                    return rule
        return None

    async def __call__(self, scope: Mapping[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self._match(scope["method"], scope["path"], scope.get("query_string", b"").decode())
        if rule is None:
            await self.app(scope, receive, send)
            return
        if rule.action == "hang":
            if self._release is None:
                self._loop, self._release = asyncio.get_running_loop(), asyncio.Event()
            await self._release.wait()
            await _status(send, 503, "ServiceUnavailable", "released")
        elif rule.action == "abort":
            # Headers and a partial chunk, then the connection breaks: a watch dropped mid-stream.
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"type":"ADD', "more_body": True})
            raise ConnectionAbortedError("fault injected: stream broken off")
        else:
            await _status(send, rule.status, "InternalError" if rule.status >= 500 else "Fault", "fault injected")


async def _status(send: Callable[[Any], Awaitable[None]], code: int, reason: str, message: str) -> None:
    body = orjson.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                         "message": message, "reason": reason, "code": code})
    await send({"type": "http.response.start", "status": code, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@attrs.define
class RunningStandIn:
    url: str
    store: Store
    standin: StandIn
    faults: Faults
    server: ServerThread

    def drop_watches(self) -> None:
        """End every open watch stream (the stand-in hands this to its own loop)."""
        self.standin.close_watches()

    async def write(self, fn: Callable[[], Any]) -> Any:
        """Change the store the way the API server would (on the stand-in's writer thread)."""
        return await self.standin.write(fn)


@contextlib.contextmanager
def running_standin(store: Store, *, bookmark_interval: float = 60.0) -> Iterator[RunningStandIn]:
    # crd_path=None: the stand-in re-reads the CriticalService CRD file for every discovery request
    # (~45 ms each); these tests never need its schema.
    standin = StandIn(store, bookmark_interval=bookmark_interval, crd_path=None)
    faults = Faults(standin.app)
    standin.app = faults  # type: ignore[assignment]
    server = ServerThread(standin)
    url = server.start()
    try:
        yield RunningStandIn(url, store, standin, faults, server)
    finally:
        faults.clear()
        server.stop()


# --- a transport straight onto a Store (no HTTP), for property tests -----------------------------------
class StoreTransport:
    """The Transport protocol served from a sim Store in-process: discovery, LISTs, and watches fed
    by the store's own events (backlog from `events_since`, 410 when it is too old). Single-threaded:
    change the store between runs of the event loop. `drop_watches()` ends every open stream."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.queues: list[asyncio.Queue[Any]] = []
        self.down = False  # an outage: every request fails as if the connection were refused
        store.subscribe(self._on_event)

    def _check(self, path: str) -> None:
        if self.down:
            raise TransportError(f"GET {path}: connection refused (outage)")

    def _on_event(self, event: Any) -> None:
        for q in list(self.queues):
            q.put_nowait(event)

    def drop_watches(self) -> None:
        for q in list(self.queues):
            q.put_nowait(None)

    def _types(self) -> list[Any]:
        return self.store.mapper.types()

    def _type(self, group: str, version: str, plural: str) -> Any:
        for t in self._types():
            if (t.group, t.version, t.plural) == (group, version, plural):
                return t
        raise APIStatusError(404, "NotFound", "the server could not find the requested resource")

    @staticmethod
    def _split(path: str) -> list[str]:
        return [p for p in path.split("/") if p]

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        await asyncio.sleep(0)
        self._check(path)
        parts = self._split(path)
        if parts == ["api"]:
            return {"versions": ["v1"]}
        if parts == ["apis"]:
            groups = sorted({t.group for t in self._types() if t.group})
            return {"groups": [{"name": g, "versions": [{"version": v} for v in
                                                         sorted({t.version for t in self._types() if t.group == g})]}
                               for g in groups]}
        group, version, rest = ("", parts[1], parts[2:]) if parts[0] == "api" else (parts[1], parts[2], parts[3:])
        if not rest:
            return {"resources": [{"name": t.plural, "singularName": t.singular, "kind": t.kind,
                                   "namespaced": t.namespaced, "shortNames": list(t.short_names),
                                   "verbs": ["list", "watch"]}
                                  for t in self._types() if (t.group, t.version) == (group, version)]}
        t = self._type(group, version, rest[0])
        return {"metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": self.store.list(t.group_resource)}

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Any = (), *, timeout: float,
                     accept: str = "application/json") -> AsyncIterator[AsyncIterator[Any]]:
        await asyncio.sleep(0)
        self._check(path)
        parts = self._split(path)
        group, version, plural = ("", parts[1], parts[2]) if parts[0] == "api" else (parts[1], parts[2], parts[3])
        t = self._type(group, version, plural)
        backlog = self.store.events_since(int(dict(params)["resourceVersion"]))
        queue: asyncio.Queue[Any] = asyncio.Queue()
        if backlog is None:
            queue.put_nowait({"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                          "message": "too old resource version"}})
            queue.put_nowait(None)
        else:
            for e in backlog:
                queue.put_nowait(e)
        self.queues.append(queue)

        async def events() -> AsyncIterator[Any]:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, dict):
                    yield item
                elif item.group_resource == t.group_resource:
                    yield {"type": item.type, "object": item.object}

        try:
            yield events()
        finally:
            self.queues.remove(queue)

    def idle(self) -> bool:
        return all(q.empty() for q in self.queues)


@contextlib.asynccontextmanager
async def started_cache(env: RunningStandIn) -> AsyncIterator[tuple[Any, Any]]:
    """(CacheState, its KubeTransport) over the stand-in, started with a fast backoff; stopped and closed after."""
    from kubernetes.aio import client

    from criticalsvc.cache import Backoff, CacheState, KubeTransport

    api = client.ApiClient(client.Configuration(host=env.url))
    transport = KubeTransport(api)
    cache = CacheState(transport, backoff=Backoff(initial=0.01, maximum=0.05))
    try:
        await cache.start()
        yield cache, transport
    finally:
        await cache.stop()
        await api.close()


def state_with(*services: Mapping[str, Any], objects: Iterable[KubeObject] = ()) -> MemoryState:
    """A memory state holding `objects` and the CriticalServices `services` (as JSON)."""
    state = MemoryState()
    for o in objects:
        state.upsert(o)
    for s in services:
        state.upsert_critical_service(parse_critical_service(s))
    return state


class Unreadable:
    """`state` as the live gate's guarded state answers while it may not list some types (403): every read
    of those types raises StateUnavailable with the gate's words (criticalsvc/cache/guarded.py)."""

    def __init__(self, state: Any, *types: GroupResource) -> None:
        self.state = state
        self.types = frozenset(types)

    def _require(self, gr: GroupResource) -> None:
        if gr in self.types:
            raise StateUnavailable(f"the gate may not list {gr} (403 Forbidden): grant it get/list/watch with a "
                                   f"ClusterRole labelled {READER_AGGREGATION_LABEL}=\"true\"")

    def resolve(self, gr: GroupResource) -> GroupResource | None:
        resolved: GroupResource | None = self.state.resolve(gr)
        return resolved

    def get(self, ref: ObjectRef) -> KubeObject | None:
        self._require(self.resolve(ref.group_resource) or ref.group_resource)
        obj: KubeObject | None = self.state.get(ref)
        return obj

    def with_finalizer(self, gr: GroupResource, finalizer: str, **kw: Any) -> Any:
        self._require(gr)
        return self.state.with_finalizer(gr, finalizer, **kw)

    def select(self, gr: GroupResource, **kw: Any) -> Any:
        self._require(gr)
        return self.state.select(gr, **kw)

    def critical_services(self) -> Any:
        return self.state.critical_services()

    def protecting(self, provider: ObjectRef, labels: Any = None) -> Any:
        return self.state.protecting(provider, labels)

    def hosted_in(self, namespace: str) -> Any:
        return self.state.hosted_in(namespace)


# --- a fake API server for the leader's writers (criticalsvc.cache.transport.Sender) --------------------
class FakeAPI:
    """A Sender over a dict of objects by path, recording every request; for the replayer and the webhook
    router. It answers as kube-apiserver does where those writers depend on it:

      GET    an object, or a collection (the objects whose path is one segment below; no selector)
      POST   to a collection: 409 AlreadyExists when the name is taken; a SelfSubjectAccessReview is
             answered `may_delete`
      PUT    409 Conflict when the body's resourceVersion is not the stored one (optimistic concurrency)
      PATCH  a merge of `data` (what the replayer patches)
      DELETE 409 Conflict when `preconditions.uid` is not the stored object's UID; without one, whatever
             has the name now is deleted
      404    for anything missing; stored objects get a resourceVersion (and a uid if they have none)

    `faults[(verb, path)]` is a list of errors raised in turn instead of answering; `after_get[path]` runs
    once right after that GET has answered (to make something happen between a read and a write)."""

    def __init__(self, objects: Mapping[str, Mapping[str, Any]] | None = None, *, may_delete: bool = True) -> None:
        self.objects: dict[str, dict[str, Any]] = {p: copy.deepcopy(dict(o)) for p, o in (objects or {}).items()}
        self.requests: list[tuple[str, str, Any]] = []
        self.faults: dict[tuple[str, str], list[APIError]] = {}
        self.after_get: dict[str, Callable[[], None]] = {}
        self.may_delete = may_delete
        self._version = 100

    def put(self, path: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store `obj` at `path` as the API server would (a new resourceVersion); returns the stored copy."""
        self._version += 1
        stored = copy.deepcopy(dict(obj))
        metadata = stored.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._version)
        metadata.setdefault("uid", f"uid-{self._version}")
        self.objects[path] = stored
        return copy.deepcopy(stored)

    def _fault(self, verb: str, path: str) -> None:
        queued = self.faults.get((verb, path))
        if queued:
            raise queued.pop(0)

    def _below(self, path: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for p, o in sorted(self.objects.items())
                if p.startswith(path + "/") and "/" not in p[len(path) + 1:]]

    async def get(self, path: str, params: Any = (), *, timeout: float, accept: str = "application/json") -> Any:
        self.requests.append(("GET", path, dict(params)))
        self._fault("GET", path)
        if _is_collection(path):
            return {"kind": "List", "items": self._below(path)}
        if path not in self.objects:
            raise APIStatusError(404, "NotFound", f"{path} not found")
        answer = copy.deepcopy(self.objects[path])
        then = self.after_get.pop(path, None)
        if then is not None:
            then()
        return answer

    async def send(self, verb: str, path: str, payload: Mapping[str, Any] | None = None, *, timeout: float,
                   params: Any = (), content_type: str = "application/json") -> Any:
        self.requests.append((verb, path, copy.deepcopy(payload)))
        self._fault(verb, path)
        if path.endswith("/selfsubjectaccessreviews"):
            return {**dict(payload or {}), "status": {"allowed": self.may_delete}}
        if verb == "POST":
            assert payload is not None
            at = f"{path}/{payload['metadata']['name']}"
            if at in self.objects:
                raise APIStatusError(409, "AlreadyExists", f"{at} already exists")
            return self.put(at, payload)
        if path not in self.objects:
            raise APIStatusError(404, "NotFound", f"{path} not found")
        stored = self.objects[path]
        if verb == "PUT":
            assert payload is not None
            if (payload.get("metadata") or {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                raise APIStatusError(409, "Conflict", f"Operation cannot be fulfilled on {path}: the object has "
                                     "been modified; please apply your changes to the latest version and try again")
            return self.put(path, {**payload, "metadata": {**payload["metadata"], "uid": stored["metadata"]["uid"]}})
        if verb == "PATCH":
            assert payload is not None
            stored.setdefault("data", {}).update(payload.get("data") or {})
            return copy.deepcopy(stored)
        assert verb == "DELETE", verb
        uid = (stored.get("metadata") or {}).get("uid")
        wanted = ((payload or {}).get("preconditions") or {}).get("uid")
        if wanted is not None and wanted != uid:
            raise APIStatusError(409, "Conflict", f"Operation cannot be fulfilled on {path}: Precondition failed: "
                                 f"UID in precondition: {wanted}, UID in object meta: {uid}")
        del self.objects[path]
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def sent(self, verb: str, path: str) -> list[Any]:
        """The payloads of the `verb` requests to `path`, in order."""
        return [payload for v, p, payload in self.requests if v == verb and p == path]


def _is_collection(path: str) -> bool:
    """/api/v1/RES, /apis/G/V/RES, and .../namespaces/NS/RES are collections; one segment more is an object."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]
    return len(rest) == 1
