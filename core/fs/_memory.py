"""A ``memory://`` store (``MemoryBackend``): fsspec's in-memory file system, which lives in one
process. Its leases are files read then written under one threading lock of the process, so of
two takers exactly one wins; its run and job locks are threading locks; a holder is always
alive (it is this process), so no holder is ever shown.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from core._errors import StoreError
from core.fs._backend import where
from core.fs._fsspec import FileLeases, FsspecBackend

__all__ = ("MemoryBackend",)

_GUARD = threading.Lock()
"""Makes a lease's read-then-write on ``memory://`` one step."""
_LOCKS: dict[str, threading.Lock] = {}
"""Lock path -> the process-wide threading lock standing for it."""


class MemoryBackend(FsspecBackend):
    """A ``memory://`` store (see the module docstring)."""

    name: ClassVar[str] = "memory"

    def __init__(self, fs: Any, root: str, location: str) -> None:
        super().__init__(fs, root, location)
        self._leases = _MemoryLeases(self, alive=True)


class _MemoryLeases(FileLeases):
    def guard(self) -> contextlib.AbstractContextManager[Any]:
        return _GUARD

    def lock(self, path: str, timeout: float) -> contextlib.AbstractContextManager[None] | None:
        return _hold(self.backend.location, path, timeout)


@contextlib.contextmanager
def _hold(location: str, path: str, timeout: float) -> Iterator[None]:
    with _GUARD:
        lock = _LOCKS.setdefault(path, threading.Lock())
    if not lock.acquire(timeout=timeout):
        raise StoreError(f"{where(location, path)} stayed locked for {timeout:g} s")
    try:
        yield
    finally:
        lock.release()


def _after_fork_in_child() -> None:
    global _GUARD
    _GUARD = threading.Lock()
    _LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
