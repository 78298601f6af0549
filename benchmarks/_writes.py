"""The durable write the benchmarks measure against: one small file written atomically and
durably, as the store writes a record (``core.fs._replace``)."""

from __future__ import annotations

import os
from pathlib import Path


def durable_write(path: Path, payload: bytes) -> None:
    """Write ``payload`` to ``path`` atomically and durably: a temporary file beside it written
    and fsynced, renamed over ``path``, the folder fsynced."""
    tmp = path.with_name(".tmp-" + path.name)
    with open(tmp, "wb") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
