"""The layering contracts (.importlinter) hold: the decision core does no I/O, the simulator does not
reach into the service. A broken contract is a design regression, so it fails the test run."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def test_import_contracts_are_kept() -> None:
    """lint-imports reports every contract in .importlinter as kept."""
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed")
    out = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout
