"""The store's file system: an fsspec file system confined to the store's root.

Every write replaces a whole file atomically: on a local file system through a temporary file in
the same directory, ``fsync`` and ``os.replace`` (fsspec's local writes are not atomic and do not
fsync); elsewhere through fsspec's ``pipe_file``, which object stores commit whole. A crash at any
instant leaves the previous version readable.

The store never writes, moves or deletes anything outside its root. Every path it touches goes
through one check (``StoreFS.confined``): a name below the root with no empty, ``.`` or ``..``
component; on a local store also no symbolic link in any folder on the way (the root itself
may be a link: it is what the user named). Record files are opened with ``O_NOFOLLOW``, read
only when they are regular files of at most ``MAX_RECORD_BYTES``, and folders are made one
component at a time. Anything else is refused with a ``StoreError`` naming the path and why (a
record path that holds no record raises ``NotARecordError``, which the record layer sets
aside). Every operating-system error becomes a ``StoreError`` naming the path and the reason.

On ``s3://`` the file system is s3fs wrapped so that botocore's own errors are OSErrors
(``core.fs._s3``), with conditional writes probed once per process and bucket
(``conditional_writes``). Directory listings are never taken from a cache (another process may
have written since). A URL's credentials are never shown: ``location`` is the URL with its
userinfo and query values replaced by ``***``.

The records (``core.store._record_io``), the leases and locks (``core.store._lease``) and the
content-addressed files (``core.files._blobs``) all stand on this class's public methods.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import posixpath
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from core._errors import StoreError
from core._killpoints import kill_point
from core.fs import _s3
from core.fs._s3 import S3_PROTOCOLS, OSErrorsOnly, S3Objects, WriteFence, protocols

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

MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest file the store reads as a record. A record holds at most a few checkpoint states
of ``DEFAULT_MAX_STATE_BYTES`` (128 KiB) and file lists; anything larger is not a record: it is
set aside unread, like any unreadable record."""

_LOG = logging.getLogger("core.store._store")
"""The store's warnings keep the logger they have always had."""


_LOCKS_HELD = threading.local()
"""``locks``: the store locks this thread holds whose holder can lose them (``lock_fence``)."""


@contextlib.contextmanager
def lock_fence(lock: WriteFence, what: str) -> Iterator[None]:
    """While this thread holds the store lock ``lock`` (``core.store._lease.hold_lock`` on S3, an
    object another process takes over once its holder has not refreshed it for
    ``LOCK_STALE_SECONDS``), every file it writes (``StoreFS.replace_file``) is refused once the
    lock is no longer its own (``lock.confirm()``: no I/O while it is fresh): a holder stalled
    past the staleness inside the lock must not write what it read under it, over what the
    process that took the lock wrote meanwhile. ``what`` names the lock in the message."""
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


class NotARecordError(Exception):
    """A record path holds something the store does not read (a link, a FIFO, a folder, a file
    over ``MAX_RECORD_BYTES``): it is set aside like an unreadable record."""


class StoreFS:
    """The file system of one store, confined to its root: local, ``memory://``, ``s3://`` or
    any other fsspec URL.

    Args:
        location: a directory path or an fsspec URL (credentials may be in it: it is shown only
            redacted).

    Raises:
        StoreError: the location cannot be used (an s3:// URL with credentials, no bucket, or a
            bucket that does not exist).
    """

    def __init__(self, location: str) -> None:
        self.url = loc = location
        """The location as given. It may hold credentials: show ``location`` instead."""
        self.location = redact_location(loc)
        """The location to show: ``url`` with any credentials in it replaced by ``***``."""
        options: dict[str, Any] = {}
        if fsspec.core.split_protocol(loc)[0] in S3_PROTOCOLS:
            if "@" in urllib.parse.urlsplit(loc).netloc:
                raise StoreError(
                    f"checkpoint store {self.location!r}: an s3:// URL takes no credentials; "
                    "give them as usual for AWS (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "AWS_PROFILE, ~/.aws/credentials, an instance role)"
                )
            options["use_listings_cache"] = False  # other processes write here too
            # An S3 service that cannot be reached fails a call in seconds, not minutes:
            # s3fs's own retries (5, with back-off) around botocore's (legacy mode, 5 more)
            # made each call of a run take 10 s or more while the store was away, and a run
            # with uploads queued sat for minutes. Throttling and 5xx answers are still
            # retried (botocore's standard mode, 3 attempts).
            options["config_kwargs"] = {
                "connect_timeout": 5,
                "read_timeout": 60,
                "retries": {"max_attempts": 3, "mode": "standard"},
            }
        try:
            fs, root = fsspec.core.url_to_fs(loc, **options)
        except (ValueError, ImportError) as exc:
            reason = str(exc).replace(loc, self.location)
            raise StoreError(
                f"checkpoint store {self.location!r} cannot be used: {reason}"
            ) from None
        self.root = root.rstrip("/") or "/"
        self.is_local = isinstance(fs, LocalFileSystem)  # flocks, renames, no links on the way
        self.memory = isinstance(fs, MemoryFileSystem)
        """A ``memory://`` store: it lives in one process (its locks are threading locks)."""
        self.s3: S3Objects | None = None
        """Conditional writes of small objects, on an ``s3://`` store (else None)."""
        if S3_PROTOCOLS.intersection(protocols(fs)):
            fs.retries = 2  # s3fs's own, around botocore's (above); a class attribute of 5
            self.s3 = S3Objects(fs)
            fs = OSErrorsOnly(fs)
        self.backend = fs
        """The fsspec file system, unconfined (on S3 wrapped so that botocore's own errors are
        OSErrors): every path given to it must have passed ``confined``."""
        if self.s3 is not None:
            # s3fs's makedirs of a bucket path creates the bucket: a typo in its name would
            # make a new bucket (and reading commands would say the store is empty). The
            # bucket must exist; a prefix needs no making.
            bucket = self.root.strip("/").split("/", 1)[0]
            if not bucket:
                raise StoreError(
                    f"checkpoint store {self.location!r}: an s3:// store names its bucket "
                    "(s3://BUCKET or s3://BUCKET/PREFIX)"
                )
            try:
                exists = self.s3.bucket_exists(bucket)
            except OSError as exc:
                raise StoreError(f"checkpoint store {self.location!r}: {exc}") from None
            if not exists:
                raise StoreError(
                    f"checkpoint store {self.location!r}: the bucket {bucket!r} does not exist; "
                    "create it first: the store makes only its prefix"
                )

    def make_root(self) -> None:
        """Make the store's folder if it is missing (not on S3: a bucket is never made).

        Raises:
            StoreError: it cannot be created.
        """
        if self.s3 is not None:
            return
        try:
            self.backend.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"checkpoint store {self.location!r} cannot be created: {exc}"
            ) from None

    def confined(self, path: str, *, whole: bool = False) -> str:
        """``path`` if the store may touch it, else StoreError.

        Any store: ``path`` is a name strictly below the root with no empty, ``.`` or ``..``
        component. Local store: no folder between the root and ``path`` (and, with ``whole``,
        not ``path`` itself) is a symbolic link or anything but a folder, so nothing the store
        does through ``path`` reaches outside the root."""
        prefix = self.root if self.root.endswith("/") else self.root + "/"
        parts = path[len(prefix) :].split("/") if path.startswith(prefix) else []
        if not parts or any(part in ("", ".", "..") for part in parts):
            raise StoreError(
                f"checkpoint store {self.location!r}: refusing {path!r}: not a name inside the "
                "store"
            )
        if not self.is_local:
            return path
        current = self.root
        for index, part in enumerate(parts):
            current = posixpath.join(current, part)
            last = index == len(parts) - 1
            if last and not whole:
                break
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                break
            except OSError as exc:
                raise StoreError(f"cannot use {self.where(current)}: {os_reason(exc)}") from None
            if stat.S_ISLNK(mode):
                raise StoreError(self._link_refused(current))
            if not last and not stat.S_ISDIR(mode):
                raise StoreError(f"cannot use {self.where(current)}: it is not a folder")
        return path

    def _link_refused(self, path: str) -> str:
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return (
            f"checkpoint store {self.location!r}: {path} is a symbolic link (to {target}); the "
            "store follows no links below its root, so that it never writes, moves or deletes "
            "anything outside it: replace the link with a folder (or remove it)"
        )

    def makedirs_confined(self, directory: str) -> None:
        """Make ``directory`` and its missing parents below the root, one component at a time,
        refusing links (OSError is the caller's to turn into a StoreError)."""
        if not self.is_local:
            self.backend.makedirs(directory, exist_ok=True)
            return
        self.confined(directory, whole=True)
        current = self.root
        for part in directory[len(self.root) :].strip("/").split("/"):
            current = posixpath.join(current, part)
            try:
                os.mkdir(current, 0o777)
            except FileExistsError:
                pass
            mode = os.lstat(current).st_mode
            if stat.S_ISLNK(mode):
                raise StoreError(self._link_refused(current))
            if not stat.S_ISDIR(mode):
                raise StoreError(f"cannot use {self.where(current)}: it is not a folder")

    def write_json(
        self,
        path: str,
        data: dict[str, Any],
        *,
        durable: bool = True,
        fence: WriteFence | None = None,
        new: bool = False,
    ) -> None:
        """Write the JSON document ``data`` to ``path`` (a record: at most ``MAX_RECORD_BYTES``)
        atomically (``replace_file``): durably unless ``durable`` is False, which a local store
        takes as leave the data and the rename in the page cache (they survive the death of
        any process, not of the machine; docs/decisions.md, "Which writes are durable").
        ``fence`` and ``new``: see ``replace_file``.

        Raises:
            StoreError: it is too large or cannot be written; the previous version stays.
            LeaseLostError: ``fence``'s holder no longer holds its lease; nothing was written.
        """
        payload = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
        self.confined(path)
        if len(payload) > MAX_RECORD_BYTES:
            raise StoreError(
                f"not writing {self.where(path)}: {len(payload):,} bytes, over the "
                f"{MAX_RECORD_BYTES:,} a record may have (it could never be read back); the "
                "previous version stays"
            )
        self.replace_file(path, payload, durable=durable, fence=fence, new=new)

    def replace_file(
        self,
        path: str,
        body: bytes,
        *,
        durable: bool,
        fence: WriteFence | None = None,
        new: bool = False,
    ) -> None:
        """Write ``body`` to ``path`` (checked by the caller) all at once: on a local store a
        temporary file renamed over it, fsynced with its folder when ``durable``; elsewhere one
        upload, which the object store makes atomic.

        With a ``fence`` (a lease holder's write: fencing) the write is refused unless the
        holder still holds its lease (``fence.confirm()``: no I/O while the lease is fresh).
        On S3 with conditional writes it is also conditional: ``If-Match`` of the ETag this
        holder last wrote or read at ``path`` (``fence.versions``; ``new``: ``If-None-Match``,
        the file is expected not to exist), so that a holder whose lease expired while it
        was stalled cannot overwrite what the new holder wrote. When the condition fails the
        lease is confirmed with the store (``fence.confirm_held()``): another holder means
        ``LeaseLostError``; if the lease is still this holder's, the file was written by a
        process whose lease had expired, and this holder's version replaces it (logged). A
        local store's lease is an ``flock``, held as long as its process lives: there a
        holder cannot lose it, and the write is a plain one. docs/decisions.md, "Fencing".

        Raises:
            StoreError: it cannot be written (the operating system's reason).
            LeaseLostError: ``fence``'s holder no longer holds its lease; nothing was written.
        """
        _confirm_locks(self.where(path))
        if fence is not None:
            fence.confirm()
            if self.s3 is not None and self._conditional(path):
                try:
                    self.s3.put_fenced(path, body, fence, new=new, where=self.where(path))
                except OSError as exc:
                    raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None
                return
        parent = posixpath.dirname(path)
        try:
            if self.is_local:
                try:  # the folders exist for every write but the first in them
                    _replace_local(path, body, durable=durable)
                except FileNotFoundError:
                    self.makedirs_confined(parent)
                    _replace_local(path, body, durable=durable)
            else:
                self.makedirs_confined(parent)
                self.backend.pipe_file(path, body)
        except OSError as exc:
            raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None

    def _conditional(self, path: str) -> bool:
        try:
            return self.conditional_writes()
        except OSError as exc:
            raise StoreError(f"cannot write {self.where(path)}: {os_reason(exc)}") from None

    def where(self, path: str) -> str:
        """``path`` named for a message, with the store's location (credentials hidden)."""
        return f"checkpoint store {self.location!r}, record {path}"

    def read_bytes(self, path: str) -> bytes | None:
        """The bytes of the record file at ``path``, None if there is none.

        Raises:
            NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES`` (never read).
            StoreError: it cannot be read (the operating system's reason).
        """
        self.confined(path)
        try:
            if not self.is_local:
                info = self.backend.info(path)
                if info.get("type") != "file":
                    raise NotARecordError(f"not a regular file but a {info.get('type')}")
                if int(info.get("size") or 0) > MAX_RECORD_BYTES:
                    raise NotARecordError(_too_large(int(info["size"])))
                raw = self.backend.cat_file(path)
                if len(raw) > MAX_RECORD_BYTES:
                    raise NotARecordError(_too_large(len(raw)))
                return bytes(raw)
            return _read_local(path)
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
                if self.is_local:
                    if os.path.lexists(aside):
                        continue
                    os.rename(path, aside)
                else:
                    if self.backend.exists(aside):
                        continue
                    self.backend.mv(path, aside, recursive=True)
                return aside
        except (OSError, StoreError):
            pass
        return path

    def remove_file(self, path: str) -> None:
        """Delete the file (or link: never its target) at ``path`` if there is one; a folder
        there is left alone (the store makes none at a file's name). OSError is the caller's."""
        self.confined(path)
        if self.is_local:
            try:
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    return
                os.unlink(path)
            except FileNotFoundError:
                pass
            return
        if self.backend.exists(path) and not self.backend.isdir(path):
            self.backend.rm(path)

    def remove_tree(self, path: str) -> None:
        """Delete the folder ``path`` and everything in it (a link inside is removed, never
        followed; ``path`` itself must not be a link). OSError is the caller's."""
        self.confined(path, whole=True)
        if self.is_local:
            if os.path.lexists(path):
                shutil.rmtree(path)
            return
        if self.backend.exists(path):
            self.backend.rm(path, recursive=True)

    def open_lock(self, path: str) -> int:
        """An open descriptor of the regular lock file ``path`` (made if missing) on a local
        store. OSError is the caller's; a link or a non-file there is a StoreError."""
        self.confined(path)
        self.makedirs_confined(posixpath.dirname(path))
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
        try:
            fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(self._link_refused(path)) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise StoreError(
                f"cannot lock {self.where(path)}: it is a {_kind(mode)}, not a regular file"
            )
        return fd

    def list_names(self, path: str) -> list[str]:
        """The names in the folder ``path`` (none if it is missing).

        Raises:
            StoreError: it is a link, not a folder, or cannot be listed."""
        self.confined(path, whole=True)
        try:
            if self.is_local:
                names = os.listdir(path)
            else:
                self.backend.invalidate_cache(path)  # another process may have written since
                names = [
                    posixpath.basename(str(e).rstrip("/"))
                    for e in self.backend.ls(path, detail=False)
                ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.where(path)}: {os_reason(exc)}") from None
        return sorted(n for n in names if n not in ("", ".", "..") and "/" not in n)

    def conditional_writes(self) -> bool:
        """True on an S3 store whose server honours conditional writes.

        Probed once per process, endpoint and bucket with an object of its own below the root:
        created with ``If-None-Match: *`` twice (the second must fail), then rewritten with the
        ``If-Match`` of an ETag it does not have (must fail). A server that lets either through
        gets the best-effort leases of other stores and no run or job locks, and this process
        logs a warning (once). Raises OSError (the probe could not be written)."""
        if self.s3 is None:
            return False
        key = (self.s3.endpoint(), self.root.split("/")[0])
        known = _s3.S3_SUPPORT.get(key)
        if known is not None:
            return known.writes
        name = f".conditional-write-probe-{uuid.uuid4().hex}"
        probe = self.confined(posixpath.join(self.root, name))
        support = self.s3.probe(probe)
        _s3.S3_SUPPORT[key] = support
        if not support.writes:
            _LOG.warning(
                "checkpoint store %s: the S3 server does not honour conditional writes "
                "(If-None-Match / If-Match); leases are best effort (read, then written) and "
                "run and job locks do nothing",
                self.location,
            )
        return support.writes


def _replace_local(path: str, body: bytes, *, durable: bool) -> None:
    """Replace the local file ``path`` (its folders checked by the caller) with ``body`` all at
    once: a temporary file in the same folder, renamed over it (a link at ``path`` itself is
    replaced, never followed); when ``durable``, the file is fsynced before the rename and the
    folder after it, so the new version survives a crash of the machine once this returns.
    OSError is the caller's (FileNotFoundError: the folder is missing)."""
    parent = posixpath.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            kill_point("record.tmp-written")
            if durable:
                os.fsync(fh.fileno())
                kill_point("record.fsynced")
        os.replace(tmp, path)
        kill_point("record.renamed")
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        kill_point("record.stored")


def _read_local(path: str) -> bytes:
    """The bytes of the local record file ``path``, opened without following a link.

    Raises:
        NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES`` (never read).
        OSError: it cannot be read (FileNotFoundError: there is none)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):
            raise NotARecordError(f"not a regular file ({os_reason(exc)})") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARecordError(f"not a regular file but a {_kind(st.st_mode)}")
        if st.st_size > MAX_RECORD_BYTES:
            raise NotARecordError(_too_large(st.st_size))
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, MAX_RECORD_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_RECORD_BYTES:
                raise NotARecordError(_too_large(size))
        return b"".join(chunks)
    finally:
        os.close(fd)


def os_reason(exc: OSError) -> str:
    """The operating system's reason, without repeating the path the message names already."""
    if exc.strerror:
        return exc.strerror if exc.errno is None else f"{exc.strerror} (errno {exc.errno})"
    return str(exc) or type(exc).__name__


def _too_large(size: int) -> str:
    return f"{size} bytes, more than the {MAX_RECORD_BYTES} bytes a record may have; not read"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISLNK, "symbolic link"),
    ):
        if test(mode):
            return name
    return "special file"


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
    missing.

    Raises:
        StoreError: ``prefix`` is not inside the store, or is (or passes) a link.
        OSError: it cannot be listed (not on a local store, where what cannot be read is left
            out).
    """
    base = posixpath.join(fs.root, prefix)
    out: list[tuple[str, dict[str, Any]]] = []
    if fs.is_local:
        if not os.path.isdir(base):
            return out
        fs.confined(base, whole=True)
        for current, _folders, names in os.walk(base, followlinks=False):
            for name in names:
                path = os.path.join(current, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out.append((path, {"size": st.st_size, "mtime": st.st_mtime}))
        return out
    try:
        found = fs.backend.find(base, detail=True)
    except FileNotFoundError:
        return out
    for path, info in found.items():
        if info.get("type") == "file":
            out.append((path, info))
    return out
