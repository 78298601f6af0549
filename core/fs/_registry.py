"""Which backend serves which location: ``BACKENDS``, an fsspec protocol -> its
``ObjectBackend`` class. A protocol not listed is served by ``FsspecBackend`` (best-effort
leases, no locks). A new kind of store is one module with its backend class and one line here.
"""

from __future__ import annotations

from typing import Protocol

import fsspec

from core.fs._backend import ObjectBackend
from core.fs._fsspec import FsspecBackend
from core.fs._gcs import GCSBackend
from core.fs._local import LocalBackend
from core.fs._memory import MemoryBackend
from core.fs._s3 import S3Backend

__all__ = ("BACKENDS", "open_backend")


class BackendClass(Protocol):
    """How a backend is made: ``open(url, location)`` (``location``: ``url`` with its
    credentials hidden), raising StoreError when it cannot be used."""

    def open(self, url: str, location: str) -> ObjectBackend: ...


BACKENDS: dict[str, BackendClass] = {
    "file": LocalBackend,
    "local": LocalBackend,
    "memory": MemoryBackend,
    "s3": S3Backend,
    "s3a": S3Backend,
    "gs": GCSBackend,
    "gcs": GCSBackend,
}


def open_backend(url: str, location: str) -> ObjectBackend:
    """The backend of the store at ``url`` (a path: a local folder), by its protocol.

    Raises:
        StoreError: the location cannot be used.
    """
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    return BACKENDS.get(protocol, FsspecBackend).open(url, location)
