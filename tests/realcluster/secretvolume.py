"""A Secret volume as kubelet writes it, for replicas that each mount the serving certificate.

In a cluster every gate pod mounts the `criticalsvc-tls` Secret; when the Secret changes, each node's
kubelet updates its pod's volume on its own schedule, and atomically: the visible files are symlinks
into `..data`, itself a symlink to a timestamped directory, and an update writes a new timestamped
directory and renames a new `..data` over the old one, so a reader never sees the new key with the old
certificate (AtomicWriter.Write,
https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/volume/util/atomic_writer.go#L95-L130).
`project` does the same steps in a directory here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

DATA = "..data"
NEW_DATA = "..data_tmp"


def project(target: Path, files: Mapping[str, bytes]) -> None:
    """Publish `files` (name -> contents) in `target` in one atomic step, as kubelet updates a Secret volume."""
    target.mkdir(parents=True, exist_ok=True)
    old = os.readlink(target / DATA) if (target / DATA).is_symlink() else None
    stamped = Path(tempfile.mkdtemp(prefix=time.strftime("..%Y_%m_%d_%H_%M_%S.", time.gmtime()), dir=target))
    for name, data in files.items():
        (stamped / name).write_bytes(data)
    os.symlink(stamped.name, target / NEW_DATA)
    os.replace(target / NEW_DATA, target / DATA)
    for name in files:
        if not (target / name).is_symlink():
            os.symlink(f"{DATA}/{name}", target / name)
    if old is not None:
        shutil.rmtree(target / old)
