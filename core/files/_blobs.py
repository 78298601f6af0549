"""Managed file data flow: checkpoint files carried by the store, restored on another host.
This module holds the content-addressed layer (blobs, manifests, path rules) that capture
(``core.files._capture``), restore (``core.files._restore``) and collection (``core.run._gc``)
stand on.

The CHECKPOINT RFC idea (seed 000, "Shared file systems vs managed file data flow") names two
models. In ``shared`` mode (the default) the store keeps only the paths a task names; the files
must outlive the task on a file system every host sees. In ``managed`` mode the store keeps the
files themselves:

- **Capture while the task runs.** Files and directories named by ``openjd_checkpoint_files``
  and the ``file`` of ``openjd_checkpoint_save`` are hashed and uploaded by a background
  thread (``core.files._capture.FileCapture``) as soon as they are named, while the task keeps
  running (the seed's pipelined output). Content is addressed by its hash (BLAKE3; SHA-256 in
  stores of earlier versions, still read: ``core._hashing``), so a file that did not change is
  not uploaded again and generations share what they have in common.
- **Atomic commit.** A save commits only when every file of its dataset is in: the manifest (a
  JSON list of entries, itself stored by hash) is written, then the generation and the task
  record (``CheckpointStore.commit_checkpoint``), the record last. A declared file that vanished
  or changed since it was captured fails that save with a warning; the previous generation stays
  the resume point.
- **Restore on resume** (``core.files._restore.restore_checkpoint``): before
  ``onCheckpointResume`` runs, the dataset is written into the new session's working
  directory (which may be on another host at another path) and into allowed roots; hashes are
  verified while writing.

Store layout (beside ``jobs/``)::

    blobs/blake3/<h[:2]>/<h>              file content, named by its BLAKE3
    blobs/sha256/<h[:2]>/<h>              file content stored by earlier versions (SHA-256)
    blobs/tmp/<uuid>                      an upload in flight (gc removes old ones)
    manifests/<h[:2]>/<h>.json            a generation's manifest, named by its SHA-256
    jobs/<job>/runs/<run>/outputs/<task_id>.json   files a task declared so far (early outputs)

Path safety: only paths under the task's session working directory or under roots allowed in
configuration (``--file-root``, ``$OPENJD_CHECKPOINT_FILE_ROOTS``) are captured; ``..``, paths
outside the roots, symbolic links that resolve outside them, devices, FIFOs and sockets are
refused with a warning. Restoring never writes outside the restore root, whatever a manifest
says: a manifest with any entry that is not a clean relative path below a known root is refused
whole; no folder on the way may be a symbolic link.

fsspec (the store's file system layer) lacks an atomic "create if absent" upload that streams;
uploads therefore go to ``blobs/tmp/<uuid>`` and are moved to their content name when complete
(on a local store with ``os.replace``, on object stores with the server's copy).

Durability: a blob is fsynced before it is renamed to its content name, so a name in the store
always has its whole content; a save's new blobs and its manifest are fsynced together
(``Blobs.settle``) and the manifest renamed last, the folders of the new names fsynced (at
once) after the renames, and the task record that references the manifest is committed after
that.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from core._errors import StoreError
from core._hashing import NEW_ALGORITHM, Digest, new_hasher
from core._threads import prestart, run_beside
from core.files._copy import copy_and_hash

if TYPE_CHECKING:
    from core.fs import StoreFS

__all__ = (
    "CHUNK_BYTES",
    "SESSION_ROOT",
    "Blobs",
    "Manifest",
    "ManifestEntry",
    "PathRef",
    "RestoreError",
    "locate",
    "manifest_key",
)

CHUNK_BYTES = 4 * 1024 * 1024
"""Read and write size when hashing, uploading and restoring, in bytes: memory stays flat
whatever the file's size."""

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
"""The largest manifest read, in bytes."""

SESSION_ROOT = "session"
"""The root token of paths under the session working directory."""

_HEX64 = frozenset("0123456789abcdef")


class RestoreError(Exception):
    """A generation's files cannot be restored (the message says which and why)."""


# --- manifests ---------------------------------------------------------------------------------
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathRef(_Model):
    """A path as ``root`` (``session`` or an allowed root's absolute path) plus a relative
    POSIX path below it (``""`` for the root itself)."""

    root: str
    path: str


class ManifestEntry(_Model):
    """One file or folder of a checkpoint's dataset."""

    root: str
    path: str
    kind: str = "file"
    """``file`` or ``dir`` (a folder, restored even when empty)."""
    blake3: str | None = None
    """A file's content hash (hex) when its blob is ``blobs/blake3/...`` (entries written now)."""
    sha256: str | None = None
    """A file's content hash (hex) when its blob is ``blobs/sha256/...`` (entries written by
    earlier versions, and files restored from them and unchanged since)."""
    size: int = 0
    """Bytes."""
    executable: bool = False

    @property
    def digest(self) -> Digest | None:
        """A file's content name (None for a folder, or an entry naming no or two hashes)."""
        return Digest.from_fields({"blake3": self.blake3, "sha256": self.sha256})

    @classmethod
    def for_file(
        cls, root: str, path: str, digest: Digest, size: int, executable: bool
    ) -> ManifestEntry:
        """The entry of a file whose content is named ``digest``."""
        return cls(
            root=root, path=path, size=size, executable=executable, **{digest.algo: digest.hex}
        )


class Manifest(_Model):
    """The files of one checkpoint generation (stored as ``manifests/<h[:2]>/<h>.json``)."""

    version: int = 2
    """1: every entry names its content by ``sha256``; 2 (written now): by ``blake3`` or
    ``sha256``."""
    entries: list[ManifestEntry] = Field(default_factory=list)
    file: PathRef | None = None
    """Where the save's ``file`` is, for ``{{Task.Checkpoint.File}}``."""
    files: list[PathRef] = Field(default_factory=list)
    dirs: list[PathRef] = Field(default_factory=list)


def _clean_relative(path: str) -> bool:
    if path == "":
        return True
    if path.startswith("/") or "\\" in path or "\x00" in path:
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _valid_hash(text: str | None) -> bool:
    return text is not None and len(text) == 64 and set(text) <= _HEX64


def manifest_key(digest: str) -> str:
    return f"manifests/{digest[:2]}/{digest}.json"


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def locate(path: str, session_dir: str | None, roots: Iterable[str]) -> PathRef | None:
    """Where ``path`` (absolute) lies: under the session working directory or an allowed root,
    lexically (no ``..`` component) and once symbolic links are resolved. None if neither."""
    if not os.path.isabs(path) or ".." in path.replace("\\", "/").split("/"):
        return None
    norm = os.path.normpath(path)
    real = os.path.realpath(norm)
    candidates: list[tuple[str, str]] = []
    if session_dir:
        candidates.append((SESSION_ROOT, session_dir))
    candidates.extend((root, root) for root in roots)
    for token, root in candidates:
        root_norm = os.path.normpath(root)
        root_real = os.path.realpath(root_norm)
        if (_under(norm, root_norm) or _under(norm, root_real)) and _under(real, root_real):
            rel = os.path.relpath(real, root_real)
            return PathRef(root=token, path="" if rel == "." else rel.replace(os.sep, "/"))
    return None


# --- blobs in the store ------------------------------------------------------------------------
class Blobs:
    """Content-addressed files on a store's file system (``CheckpointStore.fs``), confined to
    its root."""

    def __init__(self, fs: StoreFS) -> None:
        self.fs = fs
        self.fsspec = fs.fsspec
        self.local = fs.is_local
        if self.local:
            prestart(SETTLE_THREADS)  # (before a save needs them)

    def path(self, key: str) -> str:
        return self.fs.confined(posixpath.join(self.fs.root, key))

    def exists(self, key: str) -> bool:
        path = self.path(key)
        try:
            if self.local:
                self.fs.confined(path, whole=True)
                return stat.S_ISREG(os.lstat(path).st_mode)
            return bool(self.fsspec.exists(path))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot check {self.fs.where(path)}: {exc}") from None

    def touch(self, key: str) -> None:
        """Mark reused content as recently used, so that ``gc``'s grace period protects it
        until the save that reuses it commits (local stores; object stores cannot touch an
        object without copying it, so there the grace period must outlast a save)."""
        if self.local:
            try:
                os.utime(self.path(key))
            except OSError:
                pass

    def upload(self, source_fd: int, digest: Digest) -> int:
        """Object stores: stream the open file ``source_fd`` (from its start) to ``digest``'s
        blob, verifying that its content still hashes to ``digest``. Returns the bytes written.
        (A local store stages content instead: ``stage_bytes``, ``stage_copy``, then
        ``settle``.)

        Raises:
            RestoreError: the content changed while it was read (nothing is stored).
            StoreError: the store cannot be written.
        """
        tmp = self._tmp_name()
        final = self.path(digest.key)
        try:
            self.fs.makedirs_confined(posixpath.dirname(tmp))
            with self.fsspec.open(tmp, "wb") as out:
                got, size = _copy_hashing(source_fd, out, digest.algo)
            if got != digest.hex:
                self._discard(tmp)
                raise RestoreError("its content changed while it was being stored")
            self.fsspec.mv(tmp, final)
            return size
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.fs.where(final)}: {exc}") from None

    def _tmp_name(self) -> str:
        """A fresh path for an upload or a copy in progress (``blobs/tmp/<uuid>``)."""
        return self.path(f"blobs/tmp/{uuid.uuid4().hex}")

    def _create_tmp(self, tmp: str, access: int) -> int:
        """Local stores: make ``tmp``'s folder and create ``tmp`` (never an existing file nor a
        link), opened with ``access`` (``os.O_WRONLY`` or ``os.O_RDWR``). OSError is the
        caller's."""
        self.fs.makedirs_confined(posixpath.dirname(tmp))
        return os.open(tmp, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)

    def stage_bytes(self, data: bytes) -> str:
        """Local stores: ``data`` in a new temporary file in the store (not synced); the caller
        then ``settle`` or ``discard`` it.

        Raises:
            StoreError: the store cannot be written (nothing is left).
        """
        tmp = self._tmp_name()
        try:
            fd = self._create_tmp(tmp, os.O_WRONLY)
            with os.fdopen(fd, "wb") as out:
                out.write(data)
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.fs.where(tmp)}: {exc}") from None
        return tmp

    def settle(self, staged: list[tuple[str, str]]) -> None:
        """Local stores: make every staged file durable, then give each its name: ``staged``
        is (temporary path, key) pairs, renamed in that order once all are fsynced, so a name
        (a manifest, put last) never appears before what it refers to is on disk. The fsyncs
        run at once (on up to ``SETTLE_THREADS`` threads besides the caller's; none for one
        file): the disk takes them in one flush where one after the other waits a flush each.

        Raises:
            StoreError: a file cannot be synced or renamed (the ones not yet renamed are
                removed).
        """
        if not staged:
            return
        left = list(staged)
        try:
            _sync_all([tmp for tmp, _key in staged])
            folders: dict[str, None] = {}
            for tmp, key in staged:
                final = self.path(key)
                folder = posixpath.dirname(final)
                while not os.path.isdir(folder):  # made now: its entry is its parent's
                    folders[folder] = None
                    folder = posixpath.dirname(folder)
                folders[folder] = None
                self.fs.makedirs_confined(posixpath.dirname(final))
                os.replace(tmp, final)
                left.pop(0)
            # The renames (and folders made) are durable before the save is acknowledged: the
            # task record's fsync commits only its own folder's entries on file systems other
            # than ext4, whose one journal commits them all.
            _sync_all(list(folders))
        except OSError as exc:
            for tmp, _key in left:
                self._discard(tmp)
            raise StoreError(
                f"cannot store {self.fs.where(self.path((left or staged)[0][1]))}: {exc}"
            ) from None

    def stage_copy(self, source_fd: int) -> tuple[str, Digest, int]:
        """Local stores: copy the open file ``source_fd`` (whole) to a temporary file in the
        store, hashing the copy (BLAKE3) block by block while it is made
        (``core.files._copy.copy_and_hash``): a large file is read once and the hash costs no time
        of its own. Returns the temporary file's path, the copy's content name and its size;
        the caller then ``settle`` or ``discard`` it (nothing is synced yet).

        Raises:
            StoreError: the store cannot be written (nothing is left).
        """
        tmp = self._tmp_name()
        try:
            fd = self._create_tmp(tmp, os.O_RDWR)
            try:
                _how, size, got = copy_and_hash(source_fd, fd, NEW_ALGORITHM)
            finally:
                os.close(fd)
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.fs.where(tmp)}: {exc}") from None
        return tmp, Digest(NEW_ALGORITHM, got), size

    def discard(self, path: str) -> None:
        """Remove a staged file (no error if it is gone)."""
        self._discard(path)

    def _discard(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            elif self.fsspec.exists(path):
                self.fsspec.rm(path)
        except OSError:
            pass

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self.path(key)
        try:
            self.fs.makedirs_confined(posixpath.dirname(path))
            if self.local:
                tmp = self._tmp_name()
                fd = self._create_tmp(tmp, os.O_WRONLY)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            else:
                self.fsspec.pipe_file(path, data)
        except OSError as exc:
            raise StoreError(f"cannot write {self.fs.where(path)}: {exc}") from None

    def open_read(self, key: str) -> Any:
        """A binary file object of ``key``'s content (caller closes).

        Raises:
            FileNotFoundError: no such content.
            StoreError: it cannot be read.
        """
        path = self.path(key)
        try:
            if self.local:
                self.fs.confined(path, whole=True)
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise StoreError(f"{self.fs.where(path)} is not a regular file")
                return os.fdopen(fd, "rb")
            return self.fsspec.open(path, "rb")
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {self.fs.where(path)}: {exc}") from None

    def read_manifest(self, digest: str) -> Manifest:
        """The manifest named ``digest``, verified.

        Raises:
            RestoreError: missing, too large, not matching its hash, or not a valid manifest
                (a manifest with any unsafe entry is refused whole).
        """
        if not _valid_hash(digest):
            raise RestoreError(f"manifest name {digest!r} is not a SHA-256")
        try:
            with self.open_read(manifest_key(digest)) as fh:
                raw = fh.read(MAX_MANIFEST_BYTES + 1)
        except FileNotFoundError:
            raise RestoreError(f"manifest {digest[:12]} is missing from the store") from None
        except StoreError as exc:
            raise RestoreError(str(exc)) from None
        if len(raw) > MAX_MANIFEST_BYTES:
            raise RestoreError(f"manifest {digest[:12]} is over {MAX_MANIFEST_BYTES} bytes")
        if hashlib.sha256(raw).hexdigest() != digest:
            raise RestoreError(f"manifest {digest[:12]} does not match its hash (edited?)")
        try:
            manifest = Manifest.model_validate(json.loads(raw.decode("utf-8")))
        except (ValueError, ValidationError) as exc:
            raise RestoreError(f"manifest {digest[:12]} is not a manifest: {exc}") from None
        return manifest


def _chunks(fd: int) -> Iterable[bytes]:
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        chunk = os.read(fd, CHUNK_BYTES)
        if not chunk:
            return
        yield chunk


def _copy_hashing(source_fd: int, out: Any, algo: str = NEW_ALGORITHM) -> tuple[str, int]:
    """Copy the open file ``source_fd`` (from its start) to the binary file object ``out``,
    hashing it by ``algo`` in the same pass. Returns the content's hash (hex) and its size in
    bytes."""
    h = new_hasher(algo, os.fstat(source_fd).st_size)
    size = 0
    for chunk in _chunks(source_fd):
        h.update(chunk)
        size += len(chunk)
        out.write(chunk)
    return h.hexdigest(), size


SETTLE_THREADS = 8
"""At most this many threads, besides the caller's, fsync the files of one ``Blobs.settle``
(workers of the process's pool, ``core._threads``: started when a local store's ``Blobs`` is
made, so that a save does not pay for starting threads, a tenth of a millisecond or more each
on a loaded machine, where a save of a small file settles its files twice: the files, then
their folders). A worker idle for ``IDLE_SECONDS`` ends: a save that long after the last pays
for starting them again (the pool this replaced kept its threads for the process's life)."""


def _sync_all(paths: list[str]) -> None:
    """fsync every file of ``paths`` at once: the first on this thread, the others on the
    process's pool (``core._threads.run_beside``; none for one file). Raises the first OSError."""

    def sync(path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    if len(paths) == 1:
        sync(paths[0])
        return
    waits = [run_beside(functools.partial(sync, path), "openjd-fsync") for path in paths[1:]]
    first: OSError | None = None
    try:
        sync(paths[0])
    except OSError as exc:
        first = exc
    for wait in waits:
        error = wait()
        if first is None and isinstance(error, OSError):
            first = error
        elif error is not None and not isinstance(error, OSError):
            raise error
    if first is not None:
        raise first


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """What says a file's content is the same: its inode, size, modification time and mode.
    Not its change time: unlinking or renaming over the file (the save-then-rename pattern,
    ``os.replace``) changes the ctime of the inode a capture is reading, not its content."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a regular file"
