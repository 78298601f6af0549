"""Any fsspec file system as a store (``FsspecBackend``): what every object store shares, and the
backend of a protocol with none of its own in ``core.fs._registry`` (``ftp://``, ``sftp://``,
``simplecache::...``).

Every write is one upload (``pipe_file``), which object stores commit whole; listings are never
taken from a cache (another process may have written since). Its leases (``FileLeases``) are
best effort: a ``*.lease.json`` with an expiry, read then written, so two processes that take
one at the same instant may both get it; it has no run or job lock (docs/decisions.md, "Which
stores lock"). ``memory://``, S3 and GCS build on it.
"""

from __future__ import annotations

import contextlib
import posixpath
from typing import Any, ClassVar

import fsspec

from core._errors import StoreError
from core.fs._backend import (
    MAX_RECORD_BYTES,
    LeaseClaim,
    LeaseFiles,
    NotARecordError,
    lease_alive,
    lease_token,
    no_lock,
    too_large,
)

__all__ = ("FileLeases", "FsspecBackend", "open_fs")


def open_fs(url: str, location: str, **options: Any) -> tuple[Any, str]:
    """The fsspec file system of ``url`` (made with ``options``) and its root (no trailing
    slash).

    Raises:
        StoreError: fsspec cannot use ``url`` (an unknown protocol, a missing package), said
            with ``location`` (credentials hidden).
    """
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except (ValueError, ImportError) as exc:
        reason = str(exc).replace(url, location)
        raise StoreError(f"checkpoint store {location!r} cannot be used: {reason}") from None
    return fs, root.rstrip("/") or "/"


class FsspecBackend:
    """A store on any fsspec file system (``ObjectBackend``; see the module docstring)."""

    name: ClassVar[str] = "fsspec"
    local = False

    def __init__(self, fs: Any, root: str, location: str) -> None:
        self.fs = fs
        self.root = root
        self.location = location
        self._leases: LeaseFiles = FileLeases(self)

    @classmethod
    def open(cls, url: str, location: str) -> FsspecBackend:
        """The store at ``url`` (``location``: the same, credentials hidden). StoreError if
        fsspec cannot use it."""
        fs, root = open_fs(url, location)
        return cls(fs, root, location)

    def make_root(self) -> None:
        self.fs.makedirs(self.root, exist_ok=True)

    def confine(self, path: str, *, whole: bool) -> None:
        return None  # no links to follow

    def makedirs(self, directory: str) -> None:
        self.fs.makedirs(directory, exist_ok=True)

    def replace_file(
        self, path: str, body: bytes, *, durable: bool, reuse: str | None = None
    ) -> None:
        self.makedirs(posixpath.dirname(path))  # (no file to reuse: ``reuse`` is left as it is)
        self.fs.pipe_file(path, body)

    def prepare_replace(self, folder: str) -> None:
        pass  # a write here makes no file of its own to save

    def read_record(self, path: str) -> bytes:
        info = self.fs.info(path)
        if info.get("type") != "file":
            raise NotARecordError(f"not a regular file but a {info.get('type')}")
        if int(info.get("size") or 0) > MAX_RECORD_BYTES:
            raise NotARecordError(too_large(int(info["size"])))
        raw = self.fs.cat_file(path)
        if len(raw) > MAX_RECORD_BYTES:
            raise NotARecordError(too_large(len(raw)))
        return bytes(raw)

    def move_aside(self, path: str, aside: str) -> bool:
        if self.fs.exists(aside):
            return False
        self.fs.mv(path, aside, recursive=True)
        return True

    def remove_file(self, path: str) -> None:
        if self.fs.exists(path) and not self.fs.isdir(path):
            self.fs.rm(path)

    def remove_tree(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def list_names(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)  # another process may have written since
        return [posixpath.basename(str(e).rstrip("/")) for e in self.fs.ls(path, detail=False)]

    def list_files(self, base: str) -> list[tuple[str, dict[str, Any]]]:
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return []
        return [(path, info) for path, info in found.items() if info.get("type") == "file"]

    def conditional(self) -> Any:
        return None

    def leases(self) -> LeaseFiles:
        return self._leases


class FileLeases:
    """Leases as ``*.lease.json`` files with an expiry, read then written (``LeaseFiles``): best
    effort between processes; exact within one process only where ``guard`` (a context held
    around each read-then-write) makes it one step. ``alive``: a holder is known to be alive
    (it is in this process), so no holder is ever shown."""

    suffix = ".lease.json"
    members_file: str | None = None
    expire = True

    def __init__(self, backend: FsspecBackend, *, alive: bool = False) -> None:
        self.backend = backend
        self.alive = alive

    def guard(self) -> contextlib.AbstractContextManager[Any]:
        """Held around each read-then-write of a lease file: nothing here (best effort)."""
        return contextlib.nullcontext()

    def _read(self, path: str) -> bytes | None:
        try:
            return self.backend.read_record(path)
        except FileNotFoundError:
            return None

    def member(self, base: str) -> str:
        return base + self.suffix  # an object of its own per lease

    def take(self, path: str, body: bytes, token: str) -> LeaseClaim | None:
        with self.guard():
            try:
                if lease_alive(self._read(path)):
                    return None
            except NotARecordError:
                pass  # not a lease: taken over
            self.backend.replace_file(path, body, durable=True)
        return LeaseClaim(path, token)

    def renew(self, claim: LeaseClaim, body: bytes) -> bool:
        with self.guard():
            raw = self._read(claim.path)
            if raw is not None and lease_token(raw) not in (claim.token, None):
                return False
            self.backend.replace_file(claim.path, body, durable=True)
        return True

    def release(self, claim: LeaseClaim) -> None:
        try:
            with self.guard():
                raw = self._read(claim.path)
                if raw is not None and lease_token(raw) in (claim.token, None):
                    self.backend.remove_file(claim.path)
        except (OSError, StoreError, NotARecordError):
            pass

    def prepare(self, path: str) -> None:
        return None  # a lease object is made by its take

    def held(self, path: str) -> bool:
        with self.guard():
            try:
                return lease_alive(self._read(path))
            except NotARecordError:
                return False

    def holder(self, path: str) -> bytes | None:
        return None if self.alive else self._read(path)

    def lock(self, path: str, timeout: float) -> contextlib.AbstractContextManager[None] | None:
        return no_lock()
