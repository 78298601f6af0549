"""Replacing a local file whole and atomically (``replace_local``), with as few new files as
the file system allows.

A write goes to a temporary file in the same folder (``.tmp-<random>``), fsynced when it must
be durable, then put in the place of the file it replaces. Making a file is the dearest part of
such a write on ext4 (measured here from 0.05 to 0.5 ms a file, against 0.01 ms for an
exchange: docs/decisions.md, "Which writes are durable"), so a folder's files are rewritten
without making new ones where Linux allows it:

- the new version is written into a *spare*, a temporary file of this process left by an earlier
  write to the same folder, and swapped with the file it replaces in one step
  (``renameat2(RENAME_EXCHANGE)``); the replaced version is now under the spare's name and is
  the spare of the next write. Each file has one name at a time (no hard link: a write never
  reaches another file's data), and a crash leaves either version in place, exactly as a rename
  does; what a crash leaves under a spare's name is a ``.tmp-`` file, as an interrupted write
  always could.
- where a file is written for the first time there is nothing to swap with: a spare (or a new
  file) is renamed into place. A spare can be made ahead (``prepare_spare``), off the path of
  that write: the runner does so for the next task's first record while the task before runs
  (``CheckpointStore.prepare_task_lease``).
- where the exchange is refused (a file system without it, an older kernel) the folder falls
  back to new files and ``os.replace`` (the behaviour before spares).

Spares are this process's own: forgotten in a forked child (so that two processes never write
into one), at most ``_MAX_SPARES`` per folder, deleted at exit. The exchange is called through
``ctypes``: Python's ``os`` has no ``renameat2``, and the one PyPI wrapper (``renameat2`` 0.4,
last released in 2022) is this same call.
"""

from __future__ import annotations

import atexit
import errno
import os
import posixpath
import stat
import threading
from collections.abc import Callable
from typing import Any

from core._killpoints import kill_point
from core._threads import run_beside

__all__ = ("PairFirstError", "prepare_spare", "replace_local", "replace_local_pair")

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_REWRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_MAX_SPARES = 4
"""Spares kept per folder: one per write in flight in it (tasks run side by side)."""
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _new_tmp(parent: str) -> tuple[int, str]:
    """A new temporary file ``.tmp-<random>`` in the folder ``parent`` (mode 0600, as
    ``tempfile.mkstemp`` makes it): its descriptor and path. OSError is the caller's
    (FileNotFoundError: the folder is missing)."""
    while True:
        tmp = posixpath.join(parent, ".tmp-" + os.urandom(6).hex())
        try:
            return os.open(tmp, _CREATE, 0o600), tmp
        except FileExistsError:
            continue


def _rewritable(tmp: str) -> tuple[int, str, int] | None:
    """The file ``tmp`` opened to be written over (its descriptor, path and size) when it is a
    regular file of its own (no link, no other name, which a write must never reach through);
    None otherwise, and then whatever is there is removed."""
    try:
        fd = os.open(tmp, _REWRITE)
    except FileNotFoundError:
        return None  # gone (its folder was deleted or moved)
    except OSError:
        _unlink_quietly(tmp)  # a link, a FIFO, ...
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        _unlink_quietly(tmp)
        return None
    return fd, tmp, st.st_size


def _reused_tmp(parent: str, reuse: str) -> tuple[int, str, int] | None:
    """The file ``reuse`` (in ``parent``, one that is to be deleted anyway) renamed to a new
    temporary name and opened to be rewritten (its descriptor, path and size), so that a write
    needs no new file (it is written over, then cut to its new size, never emptied first:
    freeing its block and taking one again costs as much); None when there is none to
    reuse: missing, or not a regular file of its own, which is then left as it was or
    removed."""
    tmp = posixpath.join(parent, ".tmp-" + os.urandom(6).hex())
    try:
        os.rename(reuse, tmp)  # (48 random bits: no other write's temporary name)
    except OSError:
        return None
    kill_point("record.reused")
    return _rewritable(tmp)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Spares:
    """This process's spare files, per folder (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_folder: dict[str, list[str]] = {}
        self._refused: set[str] = set()
        """Folders whose file system refused an exchange: new files there."""
        self._exchange: Any = None

    def swaps(self, parent: str) -> bool:
        """True while files in ``parent`` are replaced by exchanges."""
        return parent not in self._refused and self._call() is not None

    def _call(self) -> Any:
        if self._exchange is None:
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                call = libc.renameat2
                call.argtypes = [
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_int,
                    ctypes.c_char_p,
                    ctypes.c_uint,
                ]
                self._exchange = call
            except (ImportError, OSError, AttributeError):  # no glibc 2.28 (or not Linux)
                self._exchange = False
        return self._exchange or None

    def take(self, parent: str) -> tuple[int, str, int] | None:
        """A spare of ``parent`` opened to be written over, or None (then a new file)."""
        while True:
            with self._lock:
                names = self._by_folder.get(parent)
                if not names:
                    return None
                tmp = names.pop()
            made = _rewritable(tmp)
            if made is not None:
                return made

    def give(self, parent: str, tmp: str) -> None:
        """``tmp`` (a regular file of its own in ``parent``) kept as a spare, or deleted when
        the folder has enough."""
        with self._lock:
            names = self._by_folder.setdefault(parent, [])
            if len(names) < _MAX_SPARES:
                names.append(tmp)
                return
        _unlink_quietly(tmp)

    def wanted(self, parent: str) -> bool:
        """True when ``parent`` has no spare (and its files are replaced by exchanges)."""
        with self._lock:
            return not self._by_folder.get(parent) and self.swaps(parent)

    def exchange(self, tmp: str, path: str) -> bool:
        """Swap ``tmp`` and ``path``: True when swapped, False when there is nothing at
        ``path`` or the file system refuses (then the caller renames). OSError as rename's."""
        call = self._call()
        parent = posixpath.dirname(path)
        if call is None or parent in self._refused:
            return False
        if call(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE) == 0:
            return True
        import ctypes

        code = ctypes.get_errno()
        if code == errno.ENOENT and os.path.lexists(tmp):
            return False  # nothing at ``path`` yet: its first version
        if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV):
            with self._lock:
                self._refused.add(parent)
            return False
        raise OSError(code, os.strerror(code), path)

    def drop_all(self) -> None:
        """Delete every spare (at exit)."""
        with self._lock:
            names = [n for folder in self._by_folder.values() for n in folder]
            self._by_folder.clear()
        for name in names:
            _unlink_quietly(name)

    def forget(self) -> None:
        """Forget every spare without deleting it: the parent's, in a forked child."""
        self._lock = threading.Lock()
        self._by_folder = {}


_SPARES = _Spares()
atexit.register(_SPARES.drop_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SPARES.forget)


def prepare_spare(parent: str) -> None:
    """Make a spare for the folder ``parent`` ahead of a write there, when it has none: the
    write then renames it into place instead of making a file, the dearest part of a write on
    ext4 (a task's first record, written while the record of the task before is still being
    replaced: measured here 0.29 ms with a new file). Best effort: never raises (the write
    makes a file, or says why it cannot)."""
    if not _SPARES.wanted(parent):
        return
    try:
        fd, tmp = _new_tmp(parent)
    except OSError:
        return
    os.close(fd)
    _SPARES.give(parent, tmp)


def replace_local(
    path: str,
    body: bytes,
    *,
    durable: bool,
    reuse: str | None = None,
    fresh: bool = False,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Replace the local file ``path`` (its folders checked by the caller) with ``body`` all at
    once: a temporary file in the same folder (a spare of this process where there is one,
    else a new file) swapped with it or renamed over it (a link or another name at ``path`` is
    replaced, never followed or written through); when ``durable``, the file is fsynced before
    it is put in place and the folder after, so the new version survives a crash of the machine
    once this returns. ``reuse``: a file in the same folder that is to be deleted anyway, whose
    inode becomes the temporary file (``_reused_tmp``). ``fresh``: ``path`` is a name not expected
    to exist (a new checkpoint generation): renamed into place without trying an exchange
    first (a file there is still replaced). ``before_rename``: called once the new version is
    written (and fsynced when ``durable``), just before it is put in place; what it raises
    leaves ``path`` as it was (``replace_local_pair``).

    Raises:
        OSError: the caller's (FileNotFoundError: the folder is missing; IsADirectoryError:
            ``path`` is a folder, left as it was).
    """
    parent = posixpath.dirname(path)
    made = None if reuse is None else _reused_tmp(parent, reuse)
    swaps = not fresh and _SPARES.swaps(parent)
    if made is None and swaps:
        made = _SPARES.take(parent)
    fd, tmp, size = made or (*_new_tmp(parent), 0)
    try:
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view) :]
            if size > len(body):
                os.ftruncate(fd, len(body))
            kill_point("record.tmp-written")
            if durable:
                os.fsync(fd)
                kill_point("record.fsynced")
        finally:
            os.close(fd)
        if before_rename is not None:
            before_rename()
        swapped = swaps and _SPARES.exchange(tmp, path)
        if not swapped:
            os.replace(tmp, path)
        kill_point("record.renamed")
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if swapped:
        _keep_replaced(parent, tmp, path)
    if durable:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        kill_point("record.stored")


def _keep_replaced(parent: str, tmp: str, path: str) -> None:
    """After an exchange, what was at ``path`` is at ``tmp``: kept as a spare when it is a
    regular file of its own; a folder is swapped back (``os.replace`` refuses to replace one:
    IsADirectoryError); anything else (a link, a file with other names) is removed, as a rename
    over it would have removed it."""
    try:
        st = os.lstat(tmp)
    except FileNotFoundError:
        return
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
        _SPARES.give(parent, tmp)
    elif stat.S_ISDIR(st.st_mode):
        _SPARES.exchange(tmp, path)  # the folder back at ``path``; the new file at ``tmp``
        _unlink_quietly(tmp)
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    else:
        _unlink_quietly(tmp)


class PairFirstError(OSError):
    """``replace_local_pair``: the first file (``path``) could not be written; nothing of the
    second was put in place."""

    def __init__(self, path: str, exc: OSError) -> None:
        super().__init__(exc.errno, exc.strerror or str(exc), exc.filename)
        self.path = path


def replace_local_pair(
    first: str,
    first_body: bytes | Callable[[], bytes],
    path: str,
    body: bytes,
    *,
    reuse: str | None = None,
    first_placed: Callable[[], None] | None = None,
) -> None:
    """Put ``first`` in place (a new name, not fsynced: ``replace_local`` with ``fresh`` and
    ``reuse``), then replace ``path`` durably, the first written on another thread while the
    second is written and fsynced: one wait where one after the other waited for both (a
    checkpoint's generation file and its task record, issue 38). ``first`` is in place before
    ``path`` is (the order of two ``replace_local`` calls): ``path``'s new version is swapped
    in only once ``first``'s write has ended, and not at all if it failed. ``first_placed`` is
    called on that thread once ``first`` is in place (a kill point). ``first_body`` may be a
    function that makes the bytes, called on that thread too (what it raises is raised here).

    Raises:
        PairFirstError: ``first`` could not be written (``path`` is as it was).
        OSError: ``path`` could not be written (``first`` is in place).
    """

    def write_first() -> None:
        data = first_body if isinstance(first_body, bytes) else first_body()
        try:
            replace_local(first, data, durable=False, reuse=reuse, fresh=True)
        except OSError as exc:
            raise PairFirstError(first, exc) from None
        if first_placed is not None:
            first_placed()

    wait = run_beside(write_first, "openjd-checkpoint-beside")
    waited = False

    def joined() -> None:
        nonlocal waited
        waited = True
        failed = wait()
        if failed is not None:
            raise failed
        kill_point("record.joined")

    try:
        replace_local(path, body, durable=True, before_rename=joined)
    finally:
        if not waited:  # the second failed before its rename: the first ends all the same
            wait()
