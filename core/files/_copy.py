"""Copying a whole open file into a new one as fast as the file system allows: a copy-on-write
clone where it has one, else a copy inside the kernel, else through a buffer (``copy_fd``).

The standard library has each system call (``fcntl.ioctl``, ``os.copy_file_range``,
``os.sendfile``) but no copy that tries them in turn on open descriptors: ``shutil.copyfile``
takes paths (a capture holds a descriptor, pinned to the content it was given), never clones
(Python 3.11 has not even the ``FICLONE`` constant) and, before 3.14, never uses
``copy_file_range``. Every fallback is silent: a file system without clones (ext4, tmpfs) or
two file systems that cannot copy between each other in the kernel just take the next way.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
from collections.abc import Callable

from core._hashing import READ_BYTES, new_hasher

__all__ = ("copy_and_hash", "copy_fd")

FICLONE = 0x40049409
"""Linux's ``FICLONE`` ioctl (``_IOW(0x94, 9, int)``): the destination shares the source's
extents, copy-on-write (btrfs, XFS with reflink, bcachefs, ...); ``fcntl.FICLONE`` from 3.12."""

STEP_BYTES = 8 * 1024 * 1024
"""Bytes asked of one ``copy_file_range``/``sendfile`` call (the kernel may do fewer)."""

_BUFFER_BYTES = 4 * 1024 * 1024

_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY}
    | {errno.EBADF, errno.EPERM, errno.ETXTBSY}
)
"""What a clone or an in-kernel copy fails with when this pair of files cannot take that way
(another file system, an old kernel, a file system without it): the next way is taken."""


def copy_fd(
    src_fd: int, dst_fd: int, progress: Callable[[int], None] | None = None
) -> tuple[str, int]:
    """Copy the whole content of the open file ``src_fd`` (from its start, whatever its
    position) into ``dst_fd``, a new empty file opened for writing. Returns how (``clone``,
    ``copy_file_range``, ``sendfile`` or ``read``) and the bytes copied. Nothing is synced.
    ``progress`` is called with the bytes copied so far after each step.

    The file may change while it is copied: the caller checks the copy (the store hashes what
    it wrote, not what it read).

    Raises:
        OSError: the copy failed for another reason than the way not being supported (the
            file system is full, an I/O error...).
    """
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
        size = os.fstat(dst_fd).st_size
        if progress is not None:
            progress(size)
        return "clone", size
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    copied = _kernel_copy(src_fd, dst_fd, "copy_file_range", progress)
    if copied is not None:
        return "copy_file_range", copied
    copied = _kernel_copy(src_fd, dst_fd, "sendfile", progress)
    if copied is not None:
        return "sendfile", copied
    return "read", _buffer_copy(src_fd, dst_fd, progress)


def copy_and_hash(src_fd: int, dst_fd: int, algo: str) -> tuple[str, int, str]:
    """``copy_fd`` from ``src_fd`` into ``dst_fd`` (a new empty file opened for reading and
    writing), hashing by ``algo`` what was written, block by block behind the copy: the copy
    runs on a second thread (the kernel's copy and the hash each release the GIL), so the two
    overlap and the whole takes about the longer of them. What is hashed is the copy, not the
    source: the digest names exactly the bytes that were stored, whatever the source did
    meanwhile. Returns how it was copied, the bytes copied and the digest (hex).

    Raises:
        OSError: the copy or a read of it failed.
    """
    cond = threading.Condition()
    copied = 0
    result: list[tuple[str, int]] = []
    failed: list[BaseException] = []
    finished = False

    def progress(n: int) -> None:
        nonlocal copied
        with cond:
            copied = n
            cond.notify()

    def run() -> None:
        nonlocal finished
        try:
            result.append(copy_fd(src_fd, dst_fd, progress))
        except BaseException as exc:  # handed to the caller's thread below
            failed.append(exc)
        finally:
            with cond:
                finished = True
                cond.notify()

    copier = threading.Thread(target=run, name="openjd-blob-copy", daemon=True)
    copier.start()
    h = new_hasher(algo, os.fstat(src_fd).st_size)
    buf = bytearray(READ_BYTES)
    view = memoryview(buf)
    hashed = 0
    try:
        while True:
            with cond:
                while copied <= hashed and not finished:
                    cond.wait()
                limit, done = copied, finished
            while hashed < limit:
                n = os.preadv(dst_fd, [view[: min(len(buf), limit - hashed)]], hashed)
                if n == 0:
                    raise OSError(errno.EIO, "the copy is shorter than the bytes copied")
                h.update(view[:n])
                hashed += n
            if done and hashed >= copied:
                break
    finally:
        copier.join()
    if failed:
        raise failed[0]
    how, size = result[0]
    return how, size, h.hexdigest()


def _kernel_copy(
    src_fd: int, dst_fd: int, how: str, progress: Callable[[int], None] | None
) -> int | None:
    """Copy in the kernel with ``how``; None if that way is not supported for these files
    (then nothing was written)."""
    offset = 0
    os.lseek(dst_fd, 0, os.SEEK_SET)
    while True:
        try:
            if how == "copy_file_range":
                n = os.copy_file_range(src_fd, dst_fd, STEP_BYTES, offset, offset)
            else:
                n = os.sendfile(dst_fd, src_fd, offset, STEP_BYTES)
        except OSError as exc:
            if offset == 0 and exc.errno in _UNSUPPORTED:
                return None
            raise
        if n == 0:
            return offset
        offset += n
        if progress is not None:
            progress(offset)


def _buffer_copy(src_fd: int, dst_fd: int, progress: Callable[[int], None] | None) -> int:
    buf = bytearray(_BUFFER_BYTES)
    view = memoryview(buf)
    offset = 0
    while True:
        n = os.preadv(src_fd, [buf], offset)
        if n == 0:
            return offset
        done = 0
        while done < n:
            done += os.pwrite(dst_fd, view[done:n], offset + done)
        offset += n
        if progress is not None:
            progress(offset)
