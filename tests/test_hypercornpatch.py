"""criticalsvc.hypercornpatch: applied at start-up, only to the hypercorn versions it was written for."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypercorn.asyncio.tcp_server import TCPServer

from criticalsvc import hypercornpatch
from criticalsvc.hypercornpatch import PATCHED_VERSIONS, release_connections_closed_while_idle, version_range_text

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def unpatched() -> Iterator[None]:
    """TCPServer._read_data as hypercorn ships it for the test, and as it was before afterwards."""
    before = TCPServer._read_data
    original = before
    while getattr(original, "_criticalsvc_releases_idle", False):
        original = original.__closure__[0].cell_contents  # type: ignore[attr-defined]  # the wrapped method
    TCPServer._read_data = original  # type: ignore[method-assign]
    try:
        yield
    finally:
        TCPServer._read_data = before  # type: ignore[method-assign]


def test_pyproject_allows_exactly_the_patched_versions() -> None:
    """pyproject.toml's hypercorn requirement carries the patch's version bound, so pip installs only those."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    hypercorn = next(d for d in dependencies if re.match(r"^hypercorn\b", d))
    assert hypercorn == f"hypercorn{version_range_text()}"


def test_installed_hypercorn_is_in_range_and_patched(unpatched: None) -> None:
    """The installed hypercorn gets the patch, once: a second call finds it in place."""
    installed = hypercornpatch.installed_hypercorn()
    assert installed is not None
    first = release_connections_closed_while_idle()
    assert first.applied, first.message
    assert getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    again = release_connections_closed_while_idle()
    assert again.applied and "already patched" in again.message


@pytest.mark.parametrize("version", ["0.17.3", "0.19.0", "1.0.0", "", "garbage"])
def test_a_version_outside_the_range_is_not_patched_and_says_why(unpatched: None, version: str) -> None:
    """Outside the bound nothing is replaced, and the message names the version, the range and the way out."""
    untouched = TCPServer._read_data
    result = release_connections_closed_while_idle(version)
    assert not result.applied
    assert TCPServer._read_data is untouched
    assert version_range_text() in result.message
    assert (version or "(version unknown)") in result.message
    assert "tests/test_soak.py" in result.message


def test_range_text_matches_the_bound(unpatched: None) -> None:
    """The specifier shown in messages and pyproject is PATCHED_VERSIONS, lowest included, highest excluded."""
    (lo_major, lo_minor), (hi_major, hi_minor) = PATCHED_VERSIONS
    assert version_range_text() == f">={lo_major}.{lo_minor},<{hi_major}.{hi_minor}"
    assert release_connections_closed_while_idle(f"{hi_major}.{hi_minor}.0").applied is False


def test_a_service_applies_the_patch_when_it_starts(unpatched: None, tmp_path: Path) -> None:
    """Constructing the webhook Service (what `criticalsvc serve` does at start-up) puts the patch in place."""
    from criticalsvc import certs
    from criticalsvc.server import StaticStateSource, Webhook
    from criticalsvc.serving import Endpoint, Service, TLSFiles
    from criticalsvc.state import MemoryState

    ca = certs.make_ca()
    serving = certs.make_serving_cert(ca, ["localhost"], ["127.0.0.1"])
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    certs.write_pem(cert, certs.cert_pem(serving.cert))
    certs.write_pem(key, certs.key_pem(serving.key), private=True)
    assert not getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    service = Service(Webhook(StaticStateSource(MemoryState())), listen=Endpoint("127.0.0.1", 0),
                      tls=TLSFiles(str(cert), str(key)))
    try:
        assert getattr(TCPServer._read_data, "_criticalsvc_releases_idle", False)
    finally:
        service.close()
