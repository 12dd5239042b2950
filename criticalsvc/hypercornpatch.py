"""Our one patch to hypercorn, applied at start-up (serving.Service) and only to the versions it was
written for.

The problem (hypercorn 0.18): a client that closes a keep-alive connection between requests is not
noticed. H11Protocol.handle(Closed()) does nothing without a stream, so TCPServer.run's task group
waits for the idle task: for keep_alive_timeout (120 s, which must stay above the API server's 90 s
idle close) the socket, its TLS object and buffers (~285 KiB) stay allocated. A client that connects
and disconnects often (a misbehaving one, or a probe) could hold gigabytes that way. Measured by the
soak benchmark's churn check (benchmarks/soak.py): 285 KiB kept per closed connection before, 3 KiB
after; tests/test_soak.py guards it. The fix: stop the idle task once the reading loop has ended (the
peer is gone), so the task group finishes at once; hypercorn's own _close does the same.

The patch replaces a private method (hypercorn/asyncio/tcp_server.py, TCPServer._read_data), so it is
applied only inside PATCHED_VERSIONS, the range pyproject.toml allows; outside it nothing is patched
and `release_connections_closed_while_idle` says why, and what to check before widening the range.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import attrs

# [lowest, first excluded): the versions whose TCPServer._read_data this patch was read against and
# measured on. pyproject.toml's hypercorn requirement carries the same bound (tests/test_hypercornpatch.py).
PATCHED_VERSIONS = ((0, 18), (0, 19))
_MARK = "_criticalsvc_releases_idle"


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


def release_connections_closed_while_idle(installed: str | None = None) -> PatchResult:
    """Free a connection as soon as its client closes it, not when the keep-alive timer runs out.

    `installed` is the hypercorn version (default: the installed distribution's); idempotent.
    """
    from hypercorn.asyncio.tcp_server import TCPServer

    installed = installed_hypercorn() if installed is None else installed
    read_data = getattr(TCPServer, "_read_data", None)
    if read_data is not None and getattr(read_data, _MARK, False):
        return PatchResult(True, "hypercorn: connections closed while idle are released at once (already patched)")
    release = _parse(installed or "")
    low, high = PATCHED_VERSIONS
    if not release or not (low <= release[:2] < high):
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
