"""A store in a local folder (``LocalBackend``): ``os`` calls, no link followed, flocks.

Every write replaces a whole file atomically through a temporary file in the same folder,
``fsync`` and ``os.replace`` (fsspec's local writes are neither atomic nor fsynced). No folder
between the root and a path the store touches may be a symbolic link (the root itself may be
one: it is what the user named); record files are opened with ``O_NOFOLLOW`` and read only
when they are regular files of at most ``MAX_RECORD_BYTES``; folders are made one component at
a time. Leases and locks are ``flock``s (``FlockLeases``), which the kernel drops when their
owner dies: a holder is alive as long as it holds one. The many leases of one folder (a run's
tasks) are slots of one lock file instead, each a one-byte open file description lock
(``F_OFD_SETLK``, Linux 3.15), which the kernel drops the same way: making a lock file per task
cost a new inode per task (issue 38: on this machine's ext4 about a tenth of a trivial task's
CPU, most of it in the inode allocator skipping recently deleted inodes).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import shutil
import stat
import struct
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from core._errors import StoreError
from core.fs._backend import (
    MAX_RECORD_BYTES,
    LeaseClaim,
    LeaseFiles,
    NotARecordError,
    os_reason,
    too_large,
    where,
)
from core.fs._fsspec import open_fs
from core.fs._replace import prepare_spare, replace_local

__all__ = ("SLOTS_FILE", "FlockLeases", "LocalBackend", "slot_of")


class LocalBackend:
    """A store in a local folder (``ObjectBackend``; see the module docstring)."""

    name: ClassVar[str] = "local"
    local = True

    def __init__(self, fs: Any, root: str, location: str) -> None:
        self.fs = fs
        self.root = root
        self.location = location
        self._leases = FlockLeases(self)

    @classmethod
    def open(cls, url: str, location: str) -> LocalBackend:
        fs, root = open_fs(url, location)
        return cls(fs, root, location)

    def make_root(self) -> None:
        self.fs.makedirs(self.root, exist_ok=True)

    def _where(self, path: str) -> str:
        return where(self.location, path)

    def link_refused(self, path: str) -> str:
        """What is said of a symbolic link at ``path``, below the root."""
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return (
            f"checkpoint store {self.location!r}: {path} is a symbolic link (to {target}); the "
            "store follows no links below its root, so that it never writes, moves or deletes "
            "anything outside it: replace the link with a folder (or remove it)"
        )

    def confine(self, path: str, *, whole: bool) -> None:
        parts = path[len(self.root) :].strip("/").split("/")
        last = len(parts) - 1
        if not whole:  # the folders on the way only
            parts.pop()
        current = self.root.rstrip("/")  # (string joins: this runs on every write)
        for index, part in enumerate(parts):
            current = f"{current}/{part}"
            try:
                mode = os.lstat(current).st_mode
            except FileNotFoundError:
                break
            except OSError as exc:
                raise StoreError(f"cannot use {self._where(current)}: {os_reason(exc)}") from None
            if stat.S_ISLNK(mode):
                raise StoreError(self.link_refused(current))
            if index != last and not stat.S_ISDIR(mode):
                raise StoreError(f"cannot use {self._where(current)}: it is not a folder")

    def makedirs(self, directory: str) -> None:
        self.confine(directory, whole=True)
        current = self.root
        for part in directory[len(self.root) :].strip("/").split("/"):
            current = posixpath.join(current, part)
            try:
                os.mkdir(current, 0o777)
            except FileExistsError:
                pass
            mode = os.lstat(current).st_mode
            if stat.S_ISLNK(mode):
                raise StoreError(self.link_refused(current))
            if not stat.S_ISDIR(mode):
                raise StoreError(f"cannot use {self._where(current)}: it is not a folder")

    def replace_file(
        self, path: str, body: bytes, *, durable: bool, reuse: str | None = None
    ) -> None:
        try:  # the folders exist for every write but the first in them
            replace_local(path, body, durable=durable, reuse=reuse)
        except FileNotFoundError:
            self.makedirs(posixpath.dirname(path))
            replace_local(path, body, durable=durable, reuse=reuse)

    def prepare_replace(self, folder: str) -> None:
        prepare_spare(folder)

    def read_record(self, path: str) -> bytes:
        return _read_local(path)

    def move_aside(self, path: str, aside: str) -> bool:
        if os.path.lexists(aside):
            return False
        os.rename(path, aside)
        return True

    def remove_file(self, path: str) -> None:
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                return
            os.unlink(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        if os.path.lexists(path):
            shutil.rmtree(path)

    def list_names(self, path: str) -> list[str]:
        return os.listdir(path)

    def list_files(self, base: str) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        if not os.path.isdir(base):
            return out
        self.confine(base, whole=True)
        for current, _folders, names in os.walk(base, followlinks=False):
            for name in names:
                path = os.path.join(current, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue  # gone meanwhile, or unreadable: left out
                out.append((path, {"size": st.st_size, "mtime": st.st_mtime}))
        return out

    def conditional(self) -> None:
        return None

    def leases(self) -> LeaseFiles:
        return self._leases

    def open_lock(self, path: str) -> int:
        """An open descriptor of the regular lock file ``path`` (made if missing, with its
        folders, none of which may be a link: ``makedirs``). OSError is the caller's; a link or
        a non-file there is a StoreError. The callers pass ``StoreFS.confined`` paths (their
        folders checked): the folders are made only when the open finds one missing."""
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                fd = os.open(path, flags, 0o600)
            except FileNotFoundError:
                self.makedirs(posixpath.dirname(path))
                fd = os.open(path, flags, 0o600)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StoreError(self.link_refused(path)) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            raise StoreError(
                f"cannot lock {self._where(path)}: it is a {_kind(mode)}, not a regular file"
            )
        return fd


SLOTS_FILE = "leases.lock"
"""The lock file of a folder's member leases (``FlockLeases.member``)."""

_SLOT = "#"
"""In a member lease's path, between its lock file and its slot (the byte it locks)."""


def _ofd_commands() -> tuple[int, int] | None:
    """``(F_OFD_GETLK, F_OFD_SETLK)`` where this system has open file description locks, else
    None (member leases are then lock files of their own, as before issue 38)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    get, set_ = getattr(fcntl, "F_OFD_GETLK", None), getattr(fcntl, "F_OFD_SETLK", None)
    return (get, set_) if get is not None and set_ is not None else None


_OFD = _ofd_commands()


def slot_of(name: str) -> int:
    """The byte of ``SLOTS_FILE`` that the member lease ``name`` locks: 63 bits of its
    BLAKE2b hash (two of a million names of one folder share one with a chance of about 1 in
    18 million, n^2 / 2^64; sharing would make one wait for the other, never both run). The
    file stays empty: a lock may lie past its end."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _split_slot(path: str) -> tuple[str, int | None]:
    """A lease path as (its lock file, its slot or None for a whole-file flock)."""
    file, sep, slot = path.rpartition(_SLOT)
    if not sep or not slot.isdigit():
        return path, None
    return file, int(slot)


def _ofd_lock(fd: int, cmd: int, slot: int, kind: int, length: int = 1) -> int:
    """``fcntl(fd, cmd)`` on the byte ``slot`` (``length`` bytes from it; 0: to the end of any
    file): the lock type it reports (``F_OFD_GETLK``) or set. OSError (EAGAIN: another holder
    has it) is the caller's."""
    flock = struct.pack("hhqqi4x", kind, os.SEEK_SET, slot, length, 0)
    return int(struct.unpack("hhqqi4x", _fcntl().fcntl(fd, cmd, flock))[0])


def _fcntl() -> Any:
    import fcntl

    return fcntl


class FlockLeases:
    """Leases and locks as exclusive ``flock``s on lock files (``LeaseFiles``): held as long as
    the holder's process lives (the kernel drops them when it dies), never renewed. A member
    lease (``member``: one of many in a folder, a run's tasks) is a slot of the folder's one
    ``SLOTS_FILE``, locked the same way (an open file description lock on one byte)."""

    suffix = ".lock"
    expire = False
    members_file: str | None = SLOTS_FILE if _OFD is not None else None

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self._made: set[str] = set()
        """Slots files this process made or opened (``prepare`` has nothing more to do)."""

    def member(self, base: str) -> str:
        """``base``'s lease as a slot of its folder's ``SLOTS_FILE``: ``FILE#SLOT`` (a lock file
        of its own, ``base`` + ``suffix``, without open file description locks)."""
        if _OFD is None:
            return base + self.suffix
        folder, name = posixpath.split(base)
        return f"{folder}/{SLOTS_FILE}{_SLOT}{slot_of(name)}"

    def take(self, path: str, body: bytes, token: str) -> LeaseClaim | None:
        file, slot = _split_slot(path)
        fd = self.backend.open_lock(file)
        try:
            if slot is None:
                _fcntl().flock(fd, _fcntl().LOCK_EX | _fcntl().LOCK_NB)
            else:
                assert _OFD is not None  # member() names no slot without them
                self._made.add(file)
                _ofd_lock(fd, _OFD[1], slot, _fcntl().F_WRLCK)
        except OSError as exc:
            os.close(fd)
            if slot is not None and exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise  # not "held": the caller says why it cannot be taken
            return None
        return LeaseClaim(path, token, handle=fd)

    def renew(self, claim: LeaseClaim, body: bytes) -> bool:
        return True  # held while this process lives

    def release(self, claim: LeaseClaim) -> None:
        if claim.handle is not None:
            os.close(claim.handle)  # closing the descriptor drops the flock
            claim.handle = None

    def prepare(self, path: str) -> None:
        """The lock file made (an empty regular file, as a released lease leaves it), so that
        the take only opens it (a slots file: once per process)."""
        file, slot = _split_slot(path)
        if slot is not None and file in self._made:
            return
        try:
            os.close(self.backend.open_lock(file))
            if slot is not None:
                self._made.add(file)
        except (OSError, StoreError):
            pass  # the take makes it, or says why it cannot

    def held(self, path: str) -> bool:
        """True if a live holder has the lease ``path``; a ``SLOTS_FILE`` named without a slot:
        if one has any of its slots (flocks and slots are apart: an flock probe sees none)."""
        file, slot = _split_slot(path)
        if slot is None and _OFD is not None and posixpath.basename(file) == SLOTS_FILE:
            slot, whole = 0, True
        else:
            whole = False
        try:
            fd = os.open(file, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):
                return False  # gone, or a link: no lease of ours
            raise StoreError(
                f"cannot probe {where(self.backend.location, path)}: {os_reason(exc)}"
            ) from None
        try:
            if slot is not None:  # what a write lock there would wait for
                assert _OFD is not None
                kind = _ofd_lock(fd, _OFD[0], slot, _fcntl().F_WRLCK, 0 if whole else 1)
                return kind != _fcntl().F_UNLCK
            _fcntl().flock(fd, _fcntl().LOCK_EX | _fcntl().LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def holder(self, path: str) -> bytes | None:
        return None  # an flock's holder is alive

    def lock(self, path: str, timeout: float) -> contextlib.AbstractContextManager[None] | None:
        return self._flock(path, timeout)

    @contextlib.contextmanager
    def _flock(self, path: str, timeout: float) -> Iterator[None]:
        import fcntl

        shown = where(self.backend.location, path)
        try:
            fd = self.backend.open_lock(path)
        except OSError as exc:
            raise StoreError(f"cannot lock {shown}: {os_reason(exc)}") from None
        try:
            end = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > end:
                        raise StoreError(f"{shown} stayed locked for {timeout:g} s") from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)


def _read_local(path: str) -> bytes:
    """The bytes of the local record file ``path``, opened without following a link: one
    version whole. A record's file is rewritten in place only once it is no longer at its path
    (a spare of ``core.fs._replace``), so a read whose file moved or changed while it was read
    (its inode, size, mtime or ctime differ after the read, or another file is now at
    ``path``) is read again (at most ``_READ_TRIES`` times; then the last bytes, which the
    record's parse judges).

    Raises:
        NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES`` (never read).
        OSError: it cannot be read (FileNotFoundError: there is none)."""
    for _ in range(_READ_TRIES - 1):
        body, whole = _read_once(path)
        if whole:
            return body
    return _read_once(path)[0]


_READ_TRIES = 20


def _read_once(path: str) -> tuple[bytes, bool]:
    """``_read_local``'s one try: the bytes, and whether the file was at ``path`` unchanged
    from before the read to after it."""
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
            raise NotARecordError(too_large(st.st_size))
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 20, MAX_RECORD_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_RECORD_BYTES:
                raise NotARecordError(too_large(size))
        after = os.fstat(fd)
    finally:
        os.close(fd)
    try:
        now = os.lstat(path)
    except OSError:
        now = None
    whole = (
        _version(st) == _version(after)
        and now is not None
        and (now.st_ino, now.st_dev) == (st.st_ino, st.st_dev)
    )
    return b"".join(chunks), whole


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
