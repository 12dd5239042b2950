"""Our two patches to hypercorn, applied at start-up (serving.Service) and only to the versions they were
written for.

The problem (hypercorn 0.18): a client that closes a keep-alive connection between requests is not
noticed. H11Protocol.handle(Closed()) does nothing without a stream, so TCPServer.run's task group
waits for the idle task: for keep_alive_timeout (120 s, which must stay above the API server's 90 s
idle close) the socket, its TLS object and buffers (~285 KiB) stay allocated. A client that connects
and disconnects often (a misbehaving one, or a probe) could hold gigabytes that way. Measured by the
soak benchmark's churn check (benchmarks/soak.py): 285 KiB kept per closed connection before, 3 KiB
after; tests/test_soak.py guards it. The fix: stop the idle task once the reading loop has ended (the
peer is gone), so the task group finishes at once; hypercorn's own _close does the same.

The second (`send_response_head_with_body`): hypercorn 0.18's HTTP/1.1 protocol hands each h11 event
of a response to the connection as a write of its own - the head (status line and headers), then the
body, then the empty end of message (H11Protocol.stream_send, https://github.com/pgjones/hypercorn/
blob/0.18.0/src/hypercorn/protocol/h11.py#L121-L151) - each written and drained separately
(TCPServer.protocol_send, https://github.com/pgjones/hypercorn/blob/0.18.0/src/hypercorn/asyncio/
tcp_server.py#L79-L86): over TLS that is two records encrypted and sent for one small
AdmissionReview answer (tests/test_hypercornpatch.py counts them). The
patch holds the head back until the next bytes of the connection (the body, or the end of a response
without one) and writes both at once, and drops the empty end-of-message write. The order of the
bytes on the connection is unchanged; any other event (a close, an idle update) sends what is held
first. The price: a response whose body comes later (a streaming one) sends its head with its first
chunk; the gate's responses are all whole.

Both replace private methods (hypercorn/asyncio/tcp_server.py TCPServer._read_data; hypercorn/protocol/
h11.py H11Protocol.__init__ and stream_send), so they are applied only inside PATCHED_VERSIONS, the
range pyproject.toml allows; outside it nothing is patched and the result says why, and what to check
before widening the range.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import attrs

# [lowest, first excluded): the versions whose TCPServer._read_data this patch was read against and
# measured on. pyproject.toml's hypercorn requirement carries the same bound (tests/test_hypercornpatch.py).
PATCHED_VERSIONS = ((0, 18), (0, 19))
_MARK = "_criticalsvc_releases_idle"
_HEAD_MARK = "_criticalsvc_head_with_body"


@attrs.frozen
class PatchResult:
    """Whether the patch is in place after the call, and a one-line account of why (for the log)."""

    applied: bool
    message: str


def version_range_text() -> str:
    """PATCHED_VERSIONS as a requirement specifier (`>=0.18,<0.19`)."""
    (lo_major, lo_minor), (hi_major, hi_minor) = PATCHED_VERSIONS
    return f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"


def _parse(text: str) -> tuple[int, ...]:
    """The leading numeric release of a version string (`0.18.0rc1` -> (0, 18, 0))."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m[1].split(".")) if m else ()


def installed_hypercorn() -> str | None:
    try:
        return version("hypercorn")
    except PackageNotFoundError:
        return None


def _in_range(installed: str | None) -> bool:
    release = _parse(installed or "")
    low, high = PATCHED_VERSIONS
    return bool(release) and low <= release[:2] < high


def release_connections_closed_while_idle(installed: str | None = None) -> PatchResult:
    """Free a connection as soon as its client closes it, not when the keep-alive timer runs out.

    `installed` is the hypercorn version (default: the installed distribution's); idempotent.
    """
    from hypercorn.asyncio.tcp_server import TCPServer

    installed = installed_hypercorn() if installed is None else installed
    read_data = getattr(TCPServer, "_read_data", None)
    if read_data is not None and getattr(read_data, _MARK, False):
        return PatchResult(True, "hypercorn: connections closed while idle are released at once (already patched)")
    if not _in_range(installed):
        return PatchResult(False, (
            f"hypercorn {installed or '(version unknown)'} is outside {version_range_text()}, the versions "
            "criticalsvc.hypercornpatch was written for: not patched, so a connection its client closes "
            "while idle keeps ~285 KiB until the keep-alive timeout (120 s). Install a hypercorn in that "
            "range (pyproject.toml pins it), or check TCPServer._read_data in the new version, run "
            "tests/test_soak.py and widen PATCHED_VERSIONS"))
    if read_data is None:
        return PatchResult(False, f"hypercorn {installed}: TCPServer._read_data is missing, not patched")

    async def _read_data_then_stop_idle(self: Any) -> None:
        try:
            await read_data(self)
        finally:
            await self.idle_task.stop()

    setattr(_read_data_then_stop_idle, _MARK, True)
    TCPServer._read_data = _read_data_then_stop_idle  # type: ignore[method-assign]
    return PatchResult(True, f"hypercorn {installed}: connections closed while idle are released at once")


class _HeadHeldSend:
    """An H11Protocol's `send`, holding a response's head until the bytes after it go out with it."""

    __slots__ = ("_held", "_hold", "_raw", "_send")

    def __init__(self, send: Callable[[Any], Awaitable[None]]) -> None:
        from hypercorn.events import RawData

        self._send, self._raw = send, RawData  # (an import per call would cost more than it saves)
        self._held = b""
        self._hold = False

    def hold_next(self, hold: bool) -> None:
        self._hold = hold

    async def __call__(self, event: Any) -> None:
        raw_data = self._raw
        if isinstance(event, raw_data):
            if self._hold:  # the head: wait for the body
                self._hold = False
                self._held = event.data
                return
            if self._held:
                event = raw_data(data=self._held + event.data, address=event.address)
                self._held = b""
            elif not event.data:
                return  # the end of a Content-Length body: nothing to write, nothing to drain
        elif self._held:  # a close or an idle update: what is held goes first
            held, self._held = self._held, b""
            await self._send(raw_data(data=held))
        await self._send(event)


def send_response_head_with_body(installed: str | None = None) -> PatchResult:
    """Write an HTTP/1.1 response's head and body in one write (one TLS record, one send), not two.

    `installed` is the hypercorn version (default: the installed distribution's); idempotent.
    """
    from hypercorn.protocol.events import Response
    from hypercorn.protocol.h11 import H11Protocol

    installed = installed_hypercorn() if installed is None else installed
    stream_send = H11Protocol.stream_send
    if getattr(stream_send, _HEAD_MARK, False):
        return PatchResult(True, "hypercorn: a response's head is sent with its body (already patched)")
    if not _in_range(installed):
        return PatchResult(False, (
            f"hypercorn {installed or '(version unknown)'} is outside {version_range_text()}: a response's head "
            "and body are written separately (two TLS records per answer). Check H11Protocol.__init__ and "
            "stream_send in the new version, run tests/test_hypercornpatch.py and widen PATCHED_VERSIONS"))
    init = H11Protocol.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.send = _HeadHeldSend(self.send)

    async def _stream_send(self: Any, event: Any) -> None:
        send = self.send
        if isinstance(event, Response) and event.status_code >= 200 and isinstance(send, _HeadHeldSend):
            send.hold_next(True)
            try:
                await stream_send(self, event)
            finally:
                send.hold_next(False)  # nothing was sent (an h11 error): hold nothing else
        else:
            await stream_send(self, event)

    setattr(_stream_send, _HEAD_MARK, True)
    _stream_send.__wrapped__ = stream_send  # type: ignore[attr-defined]  # what a test restores
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    H11Protocol.__init__ = __init__  # type: ignore[method-assign]
    H11Protocol.stream_send = _stream_send  # type: ignore[method-assign]
    return PatchResult(True, f"hypercorn {installed}: a response's head is sent with its body")
