"""Writing a file that a poller may read at any moment (a kubeconfig, a port file): never half-written."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` (mode 0600, parent directories made): to a file beside it, then renamed
    over it, so a reader polling for it (`until [ -s PATH ]`) sees either nothing or all of it."""
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target
