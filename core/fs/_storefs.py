"""The store's file system (``StoreFS``): one store's files, confined to its root, on its
backend (``core.fs._backend.ObjectBackend``: a local folder, ``memory://``, ``s3://``,
``gs://`` or any other fsspec URL, chosen by ``core.fs._registry``).

Every write replaces a whole file atomically (the backend's ``replace_file``): a crash at any
instant leaves the previous version readable.

The store never writes, moves or deletes anything outside its root. Every path it touches goes
through one check (``StoreFS.confined``): a name below the root with no empty, ``.`` or ``..``
component, and whatever its backend refuses besides (a local store: a symbolic link in any
folder on the way; the root itself may be a link: it is what the user named). Anything else is
refused with a ``StoreError`` naming the path and why (a record path that holds no record
raises ``NotARecordError``, which the record layer sets aside). Every operating-system error
becomes a ``StoreError`` naming the path and the reason. A URL's credentials are never shown:
``location`` is the URL with its userinfo and query values replaced by ``***``.

A write made with a fence (a lease holder's: ``WriteFence``) is refused once the lease is lost,
and is conditional where the store has conditional writes (``core.fs._objects.put_fenced``); a
write made while this thread holds a store lock that expires is refused once another process
took that lock (``lock_fence``).

The records (``core.store._record_io``), the leases and locks (``core.store._lease``) and the
content-addressed files (``core.files._blobs``) all stand on this class's public methods.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from core._errors import StoreError
from core.fs._backend import (
    MAX_RECORD_BYTES,
    ConditionalObjects,
    LeaseFiles,
    NotARecordError,
    ObjectBackend,
    WriteFence,
    os_reason,
    where,
)
from core.fs._objects import delete_own, put_fenced
from core.fs._registry import open_backend
from core.fs._replace import PairFirstError, replace_local_pair

__all__ = (
    "MAX_RECORD_BYTES",
    "NotARecordError",
    "StoreFS",
    "WriteFence",
    "file_mtime",
    "list_files",
    "lock_fence",
    "os_reason",
    "redact_location",
)

_LOCKS_HELD = threading.local()
"""``locks``: the store locks this thread holds whose holder can lose them (``lock_fence``)."""


@contextlib.contextmanager
def lock_fence(lock: WriteFence, what: str) -> Iterator[None]:
    """While this thread holds the store lock ``lock`` (``core.store._lease.hold_lock`` on a
    store with conditional writes, an object another process takes over once its holder has not
    refreshed it for ``LOCK_STALE_SECONDS``), every file it writes (``StoreFS.replace_file``)
    is refused once the lock is no longer its own (``lock.confirm()``: no I/O while it is
    fresh): a holder stalled past the staleness inside the lock must not write what it read
    under it, over what the process that took the lock wrote meanwhile. ``what`` names the
    lock in the message."""
    held: list[tuple[WriteFence, str]] = _LOCKS_HELD.__dict__.setdefault("locks", [])
    held.append((lock, what))
    try:
        yield
    finally:
        if (lock, what) in held:  # (a forked child starts with none)
            held.remove((lock, what))


def _forget_locks_in_child() -> None:
    """In a forked child: the locks are its parent's (their holder is the parent)."""
    global _LOCKS_HELD
    _LOCKS_HELD = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def _confirm_locks(where: str) -> None:
    """Raise StoreError if this thread holds a store lock (``lock_fence``) that another process
    took over."""
    for lock, what in getattr(_LOCKS_HELD, "locks", ()):
        try:
            lock.confirm()
        except StoreError as exc:
            raise StoreError(
                f"not writing {where}: this process held {what} past its staleness without "
                f"refreshing it (it stalled), and another process took it ({exc}); what this "
                "one read under it may be out of date"
            ) from None


class StoreFS:
    """The file system of one store, confined to its root: local, ``memory://``, ``s3://``,
    ``gs://`` or any other fsspec URL (its ``backend``, chosen by ``core.fs._registry``).

    Args:
        location: a directory path or an fsspec URL (credentials may be in it: it is shown only
            redacted).

    Raises:
        StoreError: the location cannot be used (an s3:// URL with credentials, no bucket, or a
            bucket that does not exist; a protocol fsspec does not know).
    """

    def __init__(self, location: str) -> None:
        self.url = location
        """The location as given. It may hold credentials: show ``location`` instead."""
        self.location = redact_location(location)
        """The location to show: ``url`` with any credentials in it replaced by ``***``."""
        self.backend: ObjectBackend = open_backend(location, self.location)
        """What this kind of store does in its own way (``core.fs._backend.ObjectBackend``)."""
        self.root = self.backend.root
        self.fsspec: Any = self.backend.fs
        """The fsspec file system, unconfined (on S3 and GCS wrapped so that their client's
        errors are OSErrors): every path given to it must have passed ``confined``."""
        self.is_local = self.backend.local
        """A folder of this machine (``ObjectBackend.local``): flocks, renames, fsyncs."""

    def make_root(self) -> None:
        """Make the store's folder if it is missing (not on S3 or GCS: a bucket is never made).

        Raises:
            StoreError: it cannot be created.
        """
        try:
            self.backend.make_root()
        except OSError as exc:
            raise StoreError(
                f"checkpoint store {self.location!r} cannot be created: {exc}"
            ) from None

    def confined(self, path: str, *, whole: bool = False) -> str:
        """``path`` if the store may touch it, else StoreError.

        Any store: ``path`` is a name strictly below the root with no empty, ``.`` or ``..``
        component. Local store: no folder between the root and ``path`` (and, with ``whole``,
        not ``path`` itself) is a symbolic link or anything but a folder, so nothing the store
        does through ``path`` reaches outside the root (``ObjectBackend.confine``)."""
        prefix = self.root if self.root.endswith("/") else self.root + "/"
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
        if not parts or any(part in ("", ".", "..") for part in parts):
            raise StoreError(
                f"checkpoint store {self.location!r}: refusing {path!r}: not a name inside the "
                "store"
            )
        self.backend.confine(path, whole=whole)
        return path

    def makedirs_confined(self, directory: str) -> None:
        """Make ``directory`` and its missing parents below the root (on a local store one
        component at a time, refusing links; OSError is the caller's to turn into a
        StoreError)."""
        self.backend.makedirs(directory)

    def leases(self) -> LeaseFiles:
        """How this store holds leases and locks (``core.fs._backend.LeaseFiles``); on S3 and
        GCS the server's conditional writes are probed first (``conditional``).

        Raises:
            OSError: the probe could not be made.
        """
        return self.backend.leases()

    def conditional(self) -> ConditionalObjects | None:
        """The store's conditional writes if it has them and its server honours them (probed
        once per process, server and bucket), else None.

        Raises:
            StoreError: the probe could not be made.
        """
        try:
            return self.backend.conditional()
        except OSError as exc:
            raise StoreError(
                f"checkpoint store {self.location!r}: cannot probe its conditional writes: "
                f"{os_reason(exc)}"
            ) from None

    def write_json(
        self,
        path: str,
        data: dict[str, Any],
        *,
        durable: bool = True,
        fence: WriteFence | None = None,
        new: bool = False,
        reuse: str | None = None,
        checked: bool = False,
    ) -> None:
        """Write the JSON document ``data`` to ``path`` (a record: at most ``MAX_RECORD_BYTES``)
        atomically (``replace_file``): durably unless ``durable`` is False, which a local store
        takes as leave the data and the rename in the page cache (they survive the death of
        any process, not of the machine; docs/decisions.md, "Which writes are durable").
        ``fence``, ``new`` and ``reuse``: see ``replace_file``. ``checked``: the caller has had
        ``confined`` check ``path`` just before (two files of one folder written together are
        checked once).

        Raises:
            StoreError: it is too large or cannot be written; the previous version stays.
            LeaseLostError: ``fence``'s holder no longer holds its lease; nothing was written.
        """
        if not checked:
            self.confined(path)
        payload = self._record_bytes(path, data)
        self.replace_file(path, payload, durable=durable, fence=fence, new=new, reuse=reuse)

    def _record_bytes(self, path: str, data: dict[str, Any]) -> bytes:
        """The bytes of the record ``data`` to be written to ``path``: one line of JSON (the C
        encoder; an indented document is encoded in Python, twice as slow).

        Raises:
            StoreError: it is over ``MAX_RECORD_BYTES``."""
        payload = (json.dumps(data, sort_keys=True) + "\n").encode("utf-8")
        if len(payload) > MAX_RECORD_BYTES:
            raise StoreError(
                f"not writing {self.where(path)}: {len(payload):,} bytes, over the "
                f"{MAX_RECORD_BYTES:,} a record may have (it could never be read back); the "
                "previous version stays"
            )
        return payload

    def write_json_pair(
        self,
        first: str,
        first_data: dict[str, Any] | Callable[[], dict[str, Any]],
        path: str,
        data: dict[str, Any],
        *,
        reuse: str | None = None,
        fence: WriteFence | None = None,
        first_placed: Callable[[], None] | None = None,
    ) -> None:
        """Local stores: write the JSON document ``first_data`` to ``first`` (a new name, not
        durable: a checkpoint's generation file; ``reuse`` as for ``replace_file``), then
        ``data`` to ``path`` durably, as two ``write_json`` calls would, but with the first
        written on another thread while the second is written and fsynced
        (``core.fs._replace.replace_local_pair``): ``first`` is in place before ``path`` is.
        Both paths are in one folder, checked by the caller (``confined``). ``fence``: confirmed
        once, before either is written (a local lease is a flock: its holder cannot lose it).
        ``first_placed``: called once ``first`` is in place (on that thread). ``first_data`` may
        be a function that makes the document, called on that thread too (encoded there: the
        record's fsync waits on neither).

        Raises:
            StoreError: either is too large or cannot be written (when it is ``path``,
                ``first`` is in place).
            LeaseLostError: ``fence`` was lost; nothing was written.
        """
        if not self.is_local or posixpath.dirname(first) != posixpath.dirname(path):
            raise StoreError(f"not writing {first!r} and {path!r} together")
        if reuse is not None and posixpath.dirname(reuse) != posixpath.dirname(path):
            raise StoreError(f"not reusing {reuse!r}: not beside {path!r}")
        body = self._record_bytes(path, data)
        _confirm_locks(self.where(path))
        if fence is not None:
            fence.confirm()

        def first_body() -> bytes:  # (on the thread that writes it, while the record is fsynced)
            doc = first_data if isinstance(first_data, dict) else first_data()
            return self._record_bytes(first, doc)

        for attempt in (1, 2):
            try:
                replace_local_pair(
                    first, first_body, path, body, reuse=reuse, first_placed=first_placed
                )
                return
            except PairFirstError as exc:
                if attempt == 2 or exc.errno != errno.ENOENT:
                    raise StoreError(
                        f"cannot write {self.where(first)}: {os_reason(exc)}"
                    ) from None
            except FileNotFoundError as exc:
                if attempt == 2:
                    raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None
            except OSError as exc:
                raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None
            try:  # the folder is missing (the record's first write): made, then once again
                self.backend.makedirs(posixpath.dirname(path))
            except OSError as exc:
                raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None

    def prepare_replace(self, folder: str) -> None:
        """Make ahead, off the path of a later write, what a ``replace_file`` in ``folder`` (a
        ``confined`` path) will need where making it costs (a local store: a spare file).
        Best effort: never raises."""
        self.backend.prepare_replace(folder)

    def replace_file(
        self,
        path: str,
        body: bytes,
        *,
        durable: bool,
        fence: WriteFence | None = None,
        new: bool = False,
        reuse: str | None = None,
    ) -> None:
        """Write ``body`` to ``path`` (checked by the caller) all at once
        (``ObjectBackend.replace_file``: on a local store a temporary file renamed over it,
        fsynced with its folder when ``durable``; elsewhere one upload, which the object store
        makes atomic). Refused while this thread holds a store lock that another process took
        (``lock_fence``).

        ``reuse``: a file in the same folder as ``path`` that the caller deletes anyway (the
        oldest checkpoint generation past those kept): a local store renames it to the
        temporary name and rewrites it, so that the write makes no new file; a file that is
        not a regular file of its own (a link, a hard link) is never written through.
        Elsewhere it is left for the caller to delete.

        ``fence``: the writer's lease (``WriteFence``), confirmed first (no I/O while it is
        fresh). On a store with conditional writes the write is also conditional on the version
        this holder last wrote or read at ``path`` (``fence.versions``; ``new``: the file is
        expected not to exist), so that a holder whose lease expired while it was stalled
        cannot overwrite what the new holder wrote (``core.fs._objects.put_fenced``). A local
        store's lease is an ``flock``, held as long as its process lives: there a holder cannot
        lose it, and the write is a plain one. docs/decisions.md, "Fencing".

        Raises:
            StoreError: it cannot be written (the operating system's reason).
            LeaseLostError: ``fence``'s holder no longer holds its lease; nothing was written.
        """
        _confirm_locks(self.where(path))
        try:
            if fence is not None:
                fence.confirm()
                objects = self.backend.conditional()
                if objects is not None:
                    put_fenced(objects, path, body, fence, new=new, where=self.where(path))
                    return
            if reuse is not None and posixpath.dirname(reuse) != posixpath.dirname(path):
                raise StoreError(f"not reusing {reuse!r}: not beside {path!r}")
            self.backend.replace_file(path, body, durable=durable, reuse=reuse)
        except OSError as exc:
            raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None

    def note_version(self, fence: WriteFence, path: str) -> None:
        """Note in ``fence`` the version of ``path`` that its holder's fenced writes are
        conditional on (a store with conditional writes: one read; elsewhere nothing).

        Raises:
            StoreError: the store cannot be read.
        """
        try:
            objects = self.backend.conditional()
            if objects is not None:
                fence.versions[path] = objects.version(path)
        except OSError as exc:
            raise StoreError(f"cannot read {self.where(path)}: {os_reason(exc)}") from None

    def delete_own(self, path: str, fence: WriteFence) -> None:
        """Delete ``path`` if it is still the version ``fence``'s holder wrote there (a store
        with conditional writes; elsewhere nothing): what a holder that then found its lease
        lost wrote before it knew. Best effort: never raises."""
        try:
            objects = self.backend.conditional()
        except OSError:
            return
        if objects is not None:
            delete_own(objects, path, fence)

    def where(self, path: str) -> str:
        """``path`` named for a message, with the store's location (credentials hidden)."""
        return where(self.location, path)

    def read_bytes(self, path: str, *, checked: bool = False) -> bytes | None:
        """The bytes of the record file at ``path``, None if there is none. ``checked``: the
        caller has had its folder checked just before (``list_names``, for the records it
        lists: a run's thousands of task records are not each checked again).

        Raises:
            NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES`` (never read).
            StoreError: it cannot be read (the operating system's reason).
        """
        if not checked:
            self.confined(path)
        try:
            return self.backend.read_record(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.where(path)}: {os_reason(exc)}") from None

    def move_aside(self, path: str) -> str:
        """Rename ``path`` (whatever it is: a link is moved, not followed) to a fresh
        ``<path>.unreadable-<time>`` beside it; ``path`` itself if that fails."""
        stamp = int(time.time())
        try:
            self.confined(path)
            for n in range(100):
                aside = f"{path}.unreadable-{stamp}" + (f"-{n}" if n else "")
                if self.backend.move_aside(path, aside):
                    return aside
        except (OSError, StoreError):
            pass
        return path

    def remove_file(self, path: str) -> None:
        """Delete the file (or link: never its target) at ``path`` if there is one; a folder
        there is left alone (the store makes none at a file's name). OSError is the caller's."""
        self.confined(path)
        self.backend.remove_file(path)

    def remove_files(self, folder: str, names: list[str]) -> None:
        """``remove_file`` of each of ``names`` (plain names, no ``/``) in ``folder``, whose way
        is checked once. OSError is the caller's (the files before it are gone)."""
        self.confined(folder, whole=True)
        for name in names:
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"not a file name: {name!r}")
            self.backend.remove_file(posixpath.join(folder, name))

    def remove_tree(self, path: str) -> None:
        """Delete the folder ``path`` and everything in it (a link inside is removed, never
        followed; ``path`` itself must not be a link). OSError is the caller's."""
        self.confined(path, whole=True)
        self.backend.remove_tree(path)

    def list_names(self, path: str) -> list[str]:
        """The names in the folder ``path`` (none if it is missing), as they are now.

        Raises:
            StoreError: it is a link, not a folder, or cannot be listed."""
        self.confined(path, whole=True)
        try:
            names = self.backend.list_names(path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.where(path)}: {os_reason(exc)}") from None
        return sorted(n for n in names if n not in ("", ".", "..") and "/" not in n)


def redact_location(location: str) -> str:
    """``location`` as it may be shown: in a URL, userinfo (``user:secret@``) becomes ``***@``
    and each query value ``***`` (``s3://***@bucket/prefix``); a path is shown as it is."""
    shown: list[str] = []
    for part in location.split("::"):  # fsspec chains URLs with "::"
        if "://" not in part:
            shown.append(part)
            continue
        try:
            url = urllib.parse.urlsplit(part)
        except ValueError:
            shown.append(part.split("://", 1)[0] + "://***")
            continue
        netloc = url.netloc
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        query = "&".join(
            f"{name}=***" if sep else name
            for name, sep, _value in (item.partition("=") for item in url.query.split("&") if item)
        )
        shown.append(urllib.parse.urlunsplit((url.scheme, netloc, url.path, query, url.fragment)))
    return "::".join(shown)


def file_mtime(info: dict[str, Any]) -> float:
    """The modification time (seconds since the epoch) in a file's ``list_files`` info; now if
    it says none (so that a file of unknown age is never taken for an old one)."""
    for key in ("mtime", "LastModified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return time.time()  # unknown: treat as new, never collect it


def list_files(fs: StoreFS, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, info with ``size`` and a modification time: ``file_mtime``) of every file under
    ``prefix`` (relative to the store's root; a link is never followed); none if it is
    missing (``ObjectBackend.list_files``).

    Raises:
        StoreError: ``prefix`` is not inside the store, or is (or passes) a link.
        OSError: it cannot be listed (not on a local store, where what cannot be read is left
            out).
    """
    return fs.backend.list_files(posixpath.join(fs.root, prefix))
