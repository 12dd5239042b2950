"""benchmarks/peers.py's build step: a peer that does not build is reported with the exact command and its error."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import peers

GO = shutil.which("go") or "/usr/local/go/bin/go"
pytestmark = pytest.mark.skipif(not Path(GO).exists(), reason="no Go toolchain")


def _module(root: Path, name: str, body: str) -> peers.Peer:
    module = root / name
    module.mkdir(parents=True)
    (module / "go.mod").write_text(f"module example.com/{name}\n\ngo 1.22\n")
    (module / "main.go").write_text(f"package main\n\nfunc main() {{ {body} }}\n")
    return peers.Peer(name, "v0.0.1", f"example.com/{name}")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(peers, "MODULES", tmp_path / "modules")
    monkeypatch.setenv("CRITICALSVC_PEERS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{Path(GO).parent}:{os.environ.get('PATH', '')}")
    return tmp_path


def test_a_peer_that_does_not_compile_is_reported_with_a_command_that_reproduces_the_error(env: Path) -> None:
    peer = _module(env / "modules", "broken", "undefinedThing()")
    failure = peers.ensure_built(peer)
    assert isinstance(failure, peers.BuildFailure)
    assert "undefined: undefinedThing" in failure.error
    assert not peer.binary.exists()
    again = subprocess.run(failure.command, shell=True, capture_output=True, text=True, check=False, cwd=env)
    assert again.returncode != 0 and "undefined: undefinedThing" in again.stderr


def test_a_peer_is_built_once_into_the_cache(env: Path) -> None:
    peer = _module(env / "modules", "fine", "println(\"ok\")")
    built = peers.ensure_built(peer)
    assert built == peer.binary and subprocess.run([str(built)], capture_output=True, text=True).stderr == "ok\n"
    stamp = built.stat().st_mtime_ns
    (peer.module / "main.go").write_text("package main\n\nfunc main() { undefinedThing() }\n")
    assert peers.ensure_built(peer) == built and built.stat().st_mtime_ns == stamp  # cached: not rebuilt
