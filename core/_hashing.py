"""Content hashes of managed checkpoint files: which algorithms the store knows, how a content
name is written, and where its blob lives. The one place that knows them; ``core.files._blobs``,
``core.files._capture``, ``core.files._restore``, ``core.run._gc`` and the early-outputs index ask
here.

Two algorithms are known:

- ``blake3`` names every blob stored from now on (``blobs/blake3/<h[:2]>/<h>``). BLAKE3 runs at
  several GB/s on one core with SIMD and splits a large input over threads: hashing no longer
  costs more than the copy. The standard library has no BLAKE3 (``hashlib`` offers it only where
  the OpenSSL build does, which is nowhere yet), so it comes from the ``blake3`` package (the
  Rust reference implementation's bindings; it releases the GIL while hashing).
- ``sha256`` named every blob before (``blobs/sha256/<h[:2]>/<h>``): stores written by earlier
  versions keep those, manifests name them, restores verify them and ``gc`` keeps them while a
  kept generation references them. Manifests themselves stay named by the SHA-256 of their
  bytes (a task record names its manifest by that hash; they are small).

A content name travels as a ``Digest`` (algorithm and hex); as text it is ``<algo>:<hex>``
(``blake3:9f…``), and a bare 64-digit hex is a ``sha256`` one (the earlier form).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Protocol

import blake3 as _blake3

__all__ = (
    "ALGORITHMS",
    "MULTITHREAD_BYTES",
    "NEW_ALGORITHM",
    "READ_BYTES",
    "Digest",
    "Hasher",
    "hash_fd",
    "new_hasher",
)

ALGORITHMS = ("blake3", "sha256")
"""Every content-hash algorithm a store may hold blobs of (``blobs/<algo>/``)."""

NEW_ALGORITHM = "blake3"
"""The algorithm new blobs are named by."""

MULTITHREAD_BYTES = 8 * 1024 * 1024
"""A BLAKE3 hasher made for an input of at least this many bytes spreads each large ``update``
over threads (``blake3``'s ``max_threads``); below it one thread is faster."""

READ_BYTES = 4 * 1024 * 1024
"""Block size when hashing an open file, in bytes (one buffer, reused: memory stays flat)."""

_HEX = frozenset("0123456789abcdef")


class Hasher(Protocol):
    """What ``hashlib`` and ``blake3`` hashers have in common."""

    def update(self, data: Any, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hasher(algo: str, size_hint: int = 0) -> Hasher:
    """A fresh hasher of ``algo`` (one of ``ALGORITHMS``); ``size_hint``, the bytes about to be
    hashed, lets a large input use several threads.

    Raises:
        ValueError: ``algo`` is not a known algorithm.
    """
    if algo == "blake3":
        if size_hint >= MULTITHREAD_BYTES:
            return _blake3.blake3(max_threads=_blake3.blake3.AUTO)
        return _blake3.blake3()
    if algo == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown content hash {algo!r} (known: {', '.join(ALGORITHMS)})")


@dataclass(frozen=True)
class Digest:
    """A content name: ``algo`` (one of ``ALGORITHMS``) and ``hex`` (64 lowercase hex digits,
    both algorithms giving 32 bytes)."""

    algo: str
    hex: str

    @property
    def valid(self) -> bool:
        """True if the algorithm is known and the hex is 64 lowercase hex digits."""
        return self.algo in ALGORITHMS and len(self.hex) == 64 and set(self.hex) <= _HEX

    @property
    def key(self) -> str:
        """The blob's key, relative to the store's root: ``blobs/<algo>/<h[:2]>/<h>``."""
        return f"blobs/{self.algo}/{self.hex[:2]}/{self.hex}"

    def __str__(self) -> str:
        return f"{self.algo}:{self.hex}"

    @classmethod
    def parse(cls, text: str) -> Digest:
        """The ``Digest`` written as ``text`` (``<algo>:<hex>``, or a bare hex: ``sha256``).
        Not checked: see ``valid``."""
        algo, sep, hexa = text.partition(":")
        return cls(algo, hexa) if sep else cls("sha256", text)

    @classmethod
    def of_bytes(cls, data: bytes, algo: str = NEW_ALGORITHM) -> Digest:
        """The ``Digest`` of ``data`` by ``algo``."""
        h = new_hasher(algo, len(data))
        h.update(data)
        return cls(algo, h.hexdigest())

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Digest | None:
        """The content name in a record's fields (a manifest entry's or an early-outputs
        item's): the one of ``ALGORITHMS`` present as a string field (``{"blake3": "9f…"}``;
        records of earlier versions have ``sha256``). None if none is, or several are."""
        found = [
            cls(algo, fields[algo]) for algo in ALGORITHMS if isinstance(fields.get(algo), str)
        ]
        return found[0] if len(found) == 1 else None


def hash_fd(fd: int, algo: str = NEW_ALGORITHM) -> tuple[str, int]:
    """Hash the open file ``fd`` from its start to its end, by positioned reads into one reused
    buffer (the file position is not used). Returns the hex digest and the bytes hashed.

    Raises:
        OSError: the file cannot be read.
    """
    size_hint = os.fstat(fd).st_size
    h = new_hasher(algo, size_hint)
    buf = bytearray(min(READ_BYTES, max(size_hint, 1 << 16)))
    view = memoryview(buf)
    offset = 0
    while True:
        n = os.preadv(fd, [buf], offset)
        if n == 0:
            return h.hexdigest(), offset
        h.update(view[:n])
        offset += n


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no spaces: the form every hash in this package is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
