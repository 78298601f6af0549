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

__all__ = ("copy_fd",)

FICLONE = 0x40049409
"""Linux's ``FICLONE`` ioctl (``_IOW(0x94, 9, int)``): the destination shares the source's
extents, copy-on-write (btrfs, XFS with reflink, bcachefs, ...); ``fcntl.FICLONE`` from 3.12."""

STEP_BYTES = 64 * 1024 * 1024
"""Bytes asked of one ``copy_file_range``/``sendfile`` call (the kernel may do fewer)."""

_BUFFER_BYTES = 4 * 1024 * 1024

_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY}
    | {errno.EBADF, errno.EPERM, errno.ETXTBSY}
)
"""What a clone or an in-kernel copy fails with when this pair of files cannot take that way
(another file system, an old kernel, a file system without it): the next way is taken."""


def copy_fd(src_fd: int, dst_fd: int) -> tuple[str, int]:
    """Copy the whole content of the open file ``src_fd`` (from its start, whatever its
    position) into ``dst_fd``, a new empty file opened for writing. Returns how (``clone``,
    ``copy_file_range``, ``sendfile`` or ``read``) and the bytes copied. Nothing is synced.

    The file may change while it is copied: the caller checks the copy (the store hashes what
    it wrote, not what it read).

    Raises:
        OSError: the copy failed for another reason than the way not being supported (the
            file system is full, an I/O error...).
    """
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
        return "clone", os.fstat(dst_fd).st_size
    except OSError as exc:
        if exc.errno not in _UNSUPPORTED:
            raise
    copied = _kernel_copy(src_fd, dst_fd, "copy_file_range")
    if copied is not None:
        return "copy_file_range", copied
    copied = _kernel_copy(src_fd, dst_fd, "sendfile")
    if copied is not None:
        return "sendfile", copied
    return "read", _buffer_copy(src_fd, dst_fd)


def _kernel_copy(src_fd: int, dst_fd: int, how: str) -> int | None:
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


def _buffer_copy(src_fd: int, dst_fd: int) -> int:
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
