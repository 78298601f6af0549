"""Managed file data flow: checkpoint files carried by the store, restored on another host.

The CHECKPOINT RFC idea (seed 000, "Shared file systems vs managed file data flow") names two
models. In ``shared`` mode (the default) the store keeps only the paths a task names; the files
must outlive the task on a file system every host sees. In ``managed`` mode the store keeps the
files themselves:

- **Capture while the task runs.** Files and directories named by ``openjd_checkpoint_files``
  and the ``file`` of ``openjd_checkpoint_save`` are hashed and uploaded by a background thread
  (``FileCapture``) as soon as they are named, while the task keeps running (the seed's
  pipelined output). Content is addressed by its SHA-256, so a file that did not change is not
  uploaded again and generations share what they have in common.
- **Atomic commit.** A save commits only when every file of its dataset is in: the manifest (a
  JSON list of entries, itself stored by hash) is written, then the generation and the task
  record (``CheckpointStore.commit_checkpoint``), the record last. A declared file that vanished
  or changed since it was captured fails that save with a warning; the previous generation stays
  the resume point.
- **Restore on resume** (``restore_checkpoint``): before ``onCheckpointResume`` runs, the
  dataset is written into the new session's working directory (which may be on another host at
  another path) and into allowed roots; hashes are verified while writing.

Store layout (beside ``jobs/``)::

    blobs/sha256/<h[:2]>/<h>              file content, named by its SHA-256
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
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import queue
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ._errors import StoreError
from ._host import FILE_ROOTS_VARIABLE, host_id

__all__ = (
    "DEFAULT_GC_GRACE_SECONDS",
    "CaptureStats",
    "FileCapture",
    "GcReport",
    "Manifest",
    "ManifestEntry",
    "RestoreError",
    "RestoreResult",
    "collect_file_garbage",
    "locate",
    "restore_checkpoint",
)

CHUNK_BYTES = 4 * 1024 * 1024
"""Read and write size when hashing, uploading and restoring, in bytes: memory stays flat
whatever the file's size."""

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
"""The largest manifest read, in bytes."""

DEFAULT_GC_GRACE_SECONDS = 3600.0
"""Content younger than this (seconds) is never collected: a live run may still commit it."""

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
    sha256: str | None = None
    size: int = 0
    """Bytes."""
    executable: bool = False


class Manifest(_Model):
    """The files of one checkpoint generation (stored as ``manifests/<h[:2]>/<h>.json``)."""

    version: int = 1
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


def blob_key(digest: str) -> str:
    return f"blobs/sha256/{digest[:2]}/{digest}"


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
class _Blobs:
    """Content-addressed files in a ``CheckpointStore``, confined to its root."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.fs = store.fs
        self.local = store._local

    def path(self, key: str) -> str:
        return self.store._checked(posixpath.join(self.store.root, key))

    def exists(self, key: str) -> bool:
        path = self.path(key)
        try:
            if self.local:
                self.store._checked(path, whole=True)
                return stat.S_ISREG(os.lstat(path).st_mode)
            return bool(self.fs.exists(path))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(f"cannot check {self.store._where(path)}: {exc}") from None

    def touch(self, key: str) -> None:
        """Mark reused content as recently used, so that ``gc``'s grace period protects it
        until the save that reuses it commits (local stores; object stores cannot touch an
        object without copying it, so there the grace period must outlast a save)."""
        if self.local:
            try:
                os.utime(self.path(key))
            except OSError:
                pass

    def upload(self, source_fd: int, key: str, digest: str) -> int:
        """Stream the open file ``source_fd`` (from its start) to ``key``, verifying that its
        content still hashes to ``digest``. Returns the bytes written.

        Raises:
            RestoreError: the content changed while it was read (nothing is stored).
            StoreError: the store cannot be written.
        """
        tmp = self.path(f"blobs/tmp/{uuid.uuid4().hex}")
        final = self.path(key)
        try:
            self.store._makedirs(posixpath.dirname(tmp))
            if self.local:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    got, size = _copy_hashing(source_fd, out)
                    out.flush()
                    os.fsync(out.fileno())
            else:
                with self.fs.open(tmp, "wb") as out:
                    got, size = _copy_hashing(source_fd, out)
            if got != digest:
                self._discard(tmp)
                raise RestoreError("its content changed while it was being stored")
            if self.local:
                self.store._makedirs(posixpath.dirname(final))
                os.replace(tmp, final)
            else:
                self.fs.mv(tmp, final)
            return size
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.store._where(final)}: {exc}") from None

    def stage(self, source_fd: int) -> tuple[str, str, int]:
        """Local stores: copy the open file ``source_fd`` (from its start) to a temporary file
        in the store, hashing it in the same pass: one read of the file, where hashing it and
        then uploading it read it twice. Returns the temporary file's path, the content's
        sha256 (hex) and its size; the caller then ``commit_staged`` or ``discard`` it.

        Raises:
            StoreError: the store cannot be written.
        """
        tmp = self.path(f"blobs/tmp/{uuid.uuid4().hex}")
        try:
            self.store._makedirs(posixpath.dirname(tmp))
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                digest, size = _copy_hashing(source_fd, out)
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.store._where(tmp)}: {exc}") from None
        return tmp, digest, size

    def commit_staged(self, tmp: str, key: str) -> None:
        """Make the staged file ``tmp`` durable and the content of ``key``.

        Raises:
            StoreError: the store cannot be written (``tmp`` is removed).
        """
        final = self.path(key)
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self.store._makedirs(posixpath.dirname(final))
            os.replace(tmp, final)
        except OSError as exc:
            self._discard(tmp)
            raise StoreError(f"cannot store {self.store._where(final)}: {exc}") from None

    def discard(self, path: str) -> None:
        """Remove a staged file (no error if it is gone)."""
        self._discard(path)

    def _discard(self, path: str) -> None:
        try:
            if self.local:
                os.unlink(path)
            elif self.fs.exists(path):
                self.fs.rm(path)
        except OSError:
            pass

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self.path(key)
        try:
            self.store._makedirs(posixpath.dirname(path))
            if self.local:
                tmp = self.path(f"blobs/tmp/{uuid.uuid4().hex}")
                self.store._makedirs(posixpath.dirname(tmp))
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            else:
                self.fs.pipe_file(path, data)
        except OSError as exc:
            raise StoreError(f"cannot write {self.store._where(path)}: {exc}") from None

    def open_read(self, key: str) -> Any:
        """A binary file object of ``key``'s content (caller closes).

        Raises:
            FileNotFoundError: no such content.
            StoreError: it cannot be read.
        """
        path = self.path(key)
        try:
            if self.local:
                self.store._checked(path, whole=True)
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    os.close(fd)
                    raise StoreError(f"{self.store._where(path)} is not a regular file")
                return os.fdopen(fd, "rb")
            return self.fs.open(path, "rb")
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StoreError(f"cannot read {self.store._where(path)}: {exc}") from None

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


def _copy_hashing(source_fd: int, out: Any) -> tuple[str, int]:
    """Copy the open file ``source_fd`` (from its start) to the binary file object ``out``,
    hashing it in the same pass. Returns the content's sha256 (hex) and its size in bytes."""
    h = hashlib.sha256()
    size = 0
    for chunk in _chunks(source_fd):
        h.update(chunk)
        size += len(chunk)
        out.write(chunk)
    return h.hexdigest(), size


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


# --- capture -----------------------------------------------------------------------------------
@dataclass
class _Captured:
    sha256: str
    size: int
    executable: bool
    stat_key: tuple[int, int, int, int, int]


@dataclass
class CaptureStats:
    """What a ``FileCapture`` did (bytes and counts)."""

    uploaded_bytes: int = 0
    uploaded_files: int = 0
    reused_files: int = 0
    """Files whose content the store already had (not uploaded again)."""
    hashed_bytes: int = 0


class _CaptureFailedError(Exception):
    pass


@dataclass
class _Save:
    file: str | None
    files: list[str]
    dirs: list[str]
    commit: Callable[[str, str | None], None]
    """Called with (manifest hash, the save's file as resolved) once everything is in."""
    file_fd: int | None = None
    """The save's file, opened when the save line was read: its content as it was then (a
    file replaced by a rename afterwards is still read whole; one rewritten in place fails)."""
    done: threading.Event = field(default_factory=threading.Event)


def _pin(path: str) -> int | None:
    """An open descriptor of the regular file ``path`` (links resolved), or None."""
    try:
        fd = os.open(os.path.realpath(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _declared_key(path: str) -> tuple[int, int, int, int, int] | None:
    try:
        return _stat_key(os.stat(path))
    except OSError:
        return None


class FileCapture:
    """Uploads a task's declared files in the background and commits its saves in order.

    One worker thread per task execution: declarations and saves are processed in the order
    they were read, so a file named again is captured again (the newer content wins) and a save
    sees every upload named before it.

    Args:
        store: the ``CheckpointStore`` (managed mode).
        session_dir: the task's session working directory.
        roots: allowed roots besides the session directory.
        warn: called with a warning text (thread-safe).
        on_uploaded: called after each upload batch with the dataset uploaded so far
            (``{declared path: (sha256, size)}``), for early outputs.
    """

    def __init__(
        self,
        store: Any,
        session_dir: str,
        roots: list[str],
        warn: Callable[[str], None],
        on_uploaded: Callable[[dict[str, tuple[str, int]]], None] | None = None,
    ) -> None:
        self._blobs = _Blobs(store)
        self.session_dir = session_dir
        self.roots = list(roots)
        self._warn = warn
        self._on_uploaded = on_uploaded
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._captured: dict[str, _Captured] = {}
        """Real path -> what was captured of it."""
        self._declared: dict[str, tuple[int, int, int, int, int] | None] = {}
        """Real path -> its size and times when it was last declared (None: it did not exist)."""
        self._outputs: dict[str, tuple[str, int]] = {}
        self.stats = CaptureStats()
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._count_lock = threading.Lock()
        self._abandoned = False
        self._store_down: tuple[float, str] | None = None
        """(time.monotonic() until which, why): the store could not be written just now."""
        self._thread = threading.Thread(target=self._work, name="openjd-file-capture", daemon=True)
        self._thread.start()

    # --- called from the reader thread ----------------------------------------------------------
    def refusal(self, path: str) -> str | None:
        """Why ``path`` may not be captured (lexical and link check), or None."""
        if ".." in path.replace("\\", "/").split("/"):
            return "it has a '..' component"
        if locate(path, self.session_dir, self.roots) is None:
            where = "the session working directory"
            if self.roots:
                where += " or the allowed roots (" + ", ".join(self.roots) + ")"
            return f"it is not under {where} once links are resolved"
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return None  # not there yet: checked again when it is captured
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return f"it is {_kind(mode)}"
        return None

    def declare(self, files: Iterable[str], dirs: Iterable[str]) -> None:
        """Capture these (absolute) files and folders in the background, now. Each file is
        taken as it is now (its size and times are noted here, in the caller's thread): one
        that changes before it is captured fails the saves that include it until it is
        declared again."""
        keyed = [(path, _declared_key(path)) for path in files]
        self._put(("declare", (keyed, list(dirs))))

    def save(self, file: str | None, files: list[str], dirs: list[str], commit: Any) -> None:
        """Commit a save once every file of its dataset is in (in the background). The save's
        ``file`` is opened now, in the caller's thread, so that the content committed is the
        content it had when the save was printed."""
        fd = _pin(file) if file is not None else None
        self._put(("save", _Save(file, list(files), list(dirs), commit, file_fd=fd)))

    def adopt(self, path: str, entry: ManifestEntry, *, output: bool = False) -> None:
        """Record a restored file as captured (its content is in the store already). With
        ``output``, it is one of the task's outputs too (a file of the restored dataset: the
        earlier attempts declared it), so the outputs index of the resumed attempt still
        names it and ``gc`` keeps its content after the run has ended."""
        try:
            st = os.stat(path)
        except OSError:
            return
        self._put(
            (
                "adopt",
                (
                    path,
                    _Captured(entry.sha256 or "", entry.size, entry.executable, _stat_key(st)),
                    output,
                ),
            )
        )

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything queued is done; True if it was within ``timeout`` seconds."""
        return self._idle.wait(timeout)

    def abandon(self) -> None:
        """Drop whatever is still queued (a deadline passed): nothing more is committed."""
        self._abandoned = True

    def close(self) -> None:
        self._queue.put(("stop", None))

    def _put(self, item: tuple[str, Any]) -> None:
        with self._count_lock:
            self._pending += 1
            self._idle.clear()
        self._queue.put(item)

    # --- the worker ---------------------------------------------------------------------------
    def _store_down_why(self) -> str | None:
        """Why the store is taken as down (``STORE_DOWN_SECONDS`` after a failed write)."""
        down = self._store_down
        return down[1] if down is not None and time.monotonic() < down[0] else None

    def _report_outputs(self) -> None:
        if self._store_down_why() is not None:
            return  # the store cannot be written now: the outputs index waits for the next one
        if self._on_uploaded is not None:
            try:
                self._on_uploaded(dict(self._outputs))
            except Exception:  # early outputs are best effort
                pass

    def _work(self) -> None:
        while True:
            kind, payload = self._queue.get()
            if kind == "stop":
                return
            try:
                if self._abandoned:
                    continue
                if kind == "declare":
                    keyed, dirs = payload
                    for path, key in keyed:
                        self._declared[os.path.realpath(path)] = key
                        self._try_declared(path, key)
                    for path in dirs:
                        self._try(path, lambda p: self._capture_dir(p, strict=False))
                    self._report_outputs()
                elif kind == "adopt":
                    path, cap, output = payload
                    self._captured[os.path.realpath(path)] = cap
                    if output and cap.sha256:
                        self._outputs[path] = (cap.sha256, cap.size)
                        self._report_outputs()
                elif kind == "save":
                    self._commit(payload)
            except Exception as exc:  # never let the worker die: the task must go on
                self._warn(f"checkpoint files: {type(exc).__name__}: {exc}")
            finally:
                with self._count_lock:
                    self._pending -= 1
                    if self._pending == 0:
                        self._idle.set()

    def _try_declared(self, path: str, key: tuple[int, int, int, int, int] | None) -> None:
        try:
            self._capture_file(path, output=True, expect=key)
        except (_CaptureFailedError, StoreError, RestoreError) as exc:
            self._warn(f"checkpoint file {path!r} was not captured: {exc}")

    def _try(self, path: str, fn: Callable[[str], Any]) -> None:
        try:
            fn(path)
        except _CaptureFailedError as exc:
            self._warn(f"checkpoint file {path!r} was not captured: {exc}")
        except (StoreError, RestoreError) as exc:
            self._warn(f"checkpoint file {path!r} was not captured: {exc}")

    def _capture_file(
        self,
        path: str,
        *,
        output: bool = False,
        expect: tuple[int, int, int, int, int] | None = None,
        fd: int | None = None,
        verify: bool = False,
    ) -> _Captured:
        """Hash and upload one file (from ``fd`` if given, which stays open). ``expect``: the
        size and times it must still have. ``verify``: make sure its content is still in the
        store even when it was captured before (``gc`` may have removed it meanwhile).

        Once the store could not be written, the files queued after it are not tried for
        ``STORE_DOWN_SECONDS`` (each would wait out the store's timeouts again, and a task
        that declared many files would sit for minutes after its end): they fail at once,
        saying why.

        Raises:
            _CaptureFailedError: the file cannot be taken (it is named).
            StoreError: the store cannot be written.
        """
        why = self._store_down_why()
        if why is not None:
            raise StoreError(f"not tried: the store could not be written a moment ago ({why})")
        try:
            return self._capture_one(path, output=output, expect=expect, fd=fd, verify=verify)
        except StoreError as exc:
            self._store_down = (time.monotonic() + STORE_DOWN_SECONDS, str(exc))
            raise

    def _capture_one(
        self,
        path: str,
        *,
        output: bool,
        expect: tuple[int, int, int, int, int] | None,
        fd: int | None,
        verify: bool,
    ) -> _Captured:
        ref = locate(path, self.session_dir, self.roots)
        if ref is None:
            raise _CaptureFailedError(self.refusal(path) or "outside the roots")
        real = os.path.realpath(path)
        owned = fd is None
        if fd is None:
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                raise _CaptureFailedError("it does not exist") from None
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO):
                    raise _CaptureFailedError("it is not a regular file") from None
                raise _CaptureFailedError(exc.strerror or str(exc)) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _CaptureFailedError(f"it is {_kind(st.st_mode)}")
            key = _stat_key(st)
            if expect is not None and key != expect:
                raise _CaptureFailedError(
                    "it changed after it was declared (declare it again once it is written)"
                )
            known = self._captured.get(real)
            if (
                known is not None
                and known.stat_key == key
                and (not verify or self._blobs.exists(blob_key(known.sha256)))
            ):
                if output:
                    self._outputs[path] = (known.sha256, known.size)
                return known
            if self._blobs.local:
                digest = self._capture_local(fd, key)
            else:
                digest = self._capture_remote(fd, key)
            cap = _Captured(digest, st.st_size, bool(st.st_mode & 0o100), key)
            self._captured[real] = cap
            if output:
                self._outputs[path] = (digest, st.st_size)
            return cap
        finally:
            if owned:
                os.close(fd)

    def _capture_local(self, fd: int, key: tuple[int, int, int, int, int]) -> str:
        """Hash and copy the file into a local store in one pass; keep the copy only if the
        store does not have that content yet. Returns the digest."""
        tmp: str | None
        tmp, digest, size = self._blobs.stage(fd)
        try:
            self.stats.hashed_bytes += size
            if _stat_key(os.fstat(fd)) != key:
                raise _CaptureFailedError("it changed while it was being read")
            if self._blobs.exists(blob_key(digest)):
                self.stats.reused_files += 1
                self._blobs.touch(blob_key(digest))
            else:
                staged, tmp = tmp, None
                self._blobs.commit_staged(staged, blob_key(digest))
                self.stats.uploaded_bytes += size
                self.stats.uploaded_files += 1
        finally:
            if tmp is not None:
                self._blobs.discard(tmp)
        return digest

    def _capture_remote(self, fd: int, key: tuple[int, int, int, int, int]) -> str:
        """Hash the file, then upload it unless the store has that content. Returns the
        digest."""
        h = hashlib.sha256()
        for chunk in _chunks(fd):
            h.update(chunk)
            self.stats.hashed_bytes += len(chunk)
        digest = h.hexdigest()
        if _stat_key(os.fstat(fd)) != key:
            raise _CaptureFailedError("it changed while it was being read")
        if self._blobs.exists(blob_key(digest)):
            self.stats.reused_files += 1
            self._blobs.touch(blob_key(digest))
        else:
            try:
                size = self._blobs.upload(fd, blob_key(digest), digest)
            except RestoreError as exc:
                raise _CaptureFailedError(str(exc)) from None
            self.stats.uploaded_bytes += size
            self.stats.uploaded_files += 1
        return digest

    def _walk(self, path: str) -> tuple[list[str], list[str]]:
        """The regular files and folders below the folder ``path`` (real paths), refusing
        links that leave the roots and special files (with a warning each)."""
        files: list[str] = []
        folders: list[str] = []
        stack = [os.path.realpath(path)]
        while stack:
            current = stack.pop()
            folders.append(current)
            try:
                entries = sorted(os.scandir(current), key=lambda e: e.name)
            except OSError as exc:
                raise _CaptureFailedError(f"{current}: {exc.strerror or exc}") from None
            for entry in entries:
                full = os.path.join(current, entry.name)
                try:
                    st = os.lstat(full)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    if locate(full, self.session_dir, self.roots) is None:
                        self._warn(
                            f"checkpoint file {full!r} was not captured: it is a symbolic link "
                            "that leads outside the allowed roots"
                        )
                        continue
                    try:
                        st = os.stat(full)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        self._warn(
                            f"checkpoint folder {full!r} was not captured: links to folders "
                            "are not followed"
                        )
                        continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(full)
                elif stat.S_ISREG(st.st_mode):
                    files.append(full)
                else:
                    self._warn(
                        f"checkpoint file {full!r} was not captured: it is {_kind(st.st_mode)}"
                    )
        return files, folders

    def _capture_dir(self, path: str, *, strict: bool) -> tuple[list[str], list[str]]:
        if locate(path, self.session_dir, self.roots) is None:
            raise _CaptureFailedError(self.refusal(path) or "outside the roots")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise _CaptureFailedError("it does not exist") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _CaptureFailedError(f"it is {_kind(st.st_mode)}, not a folder")
        files, folders = self._walk(path)
        for file in files:
            if strict:
                self._capture_file(file, output=True)
            else:
                self._try(file, lambda p: self._capture_file(p, output=True))
        return files, folders

    def _superseded(self) -> bool:
        """True if a later save is already queued (it commits instead: the latest wins)."""
        with self._queue.mutex:
            return any(kind == "save" for kind, _payload in self._queue.queue)

    def _commit(self, save: _Save) -> None:
        try:
            self._commit_pinned(save)
        finally:
            if save.file_fd is not None:
                os.close(save.file_fd)
            save.done.set()

    def _commit_pinned(self, save: _Save) -> None:
        if self._superseded():
            return
        try:
            manifest = self._manifest(save)
        except _CaptureFailedError as exc:
            self._warn(f"checkpoint not stored, the previous generation stays: {exc}")
            return
        raw = (json.dumps(manifest.model_dump(mode="json"), sort_keys=True) + "\n").encode()
        if len(raw) > MAX_MANIFEST_BYTES:
            self._warn(
                f"checkpoint not stored, the previous generation stays: its manifest would be "
                f"{len(raw):,} bytes, over the {MAX_MANIFEST_BYTES:,} a manifest may have "
                "(declare fewer files: a folder's files are listed one by one)"
            )
            return
        digest = hashlib.sha256(raw).hexdigest()
        try:
            if not self._blobs.exists(manifest_key(digest)):
                self._blobs.put_bytes(manifest_key(digest), raw)
        except StoreError as exc:
            self._warn(f"checkpoint not stored, the previous generation stays: {exc}")
            return
        if not self._abandoned:  # a deadline or a cancel came meanwhile: commit nothing more
            save.commit(digest, save.file)

    def _entry_for(self, path: str, *, declared: bool, fd: int | None = None) -> ManifestEntry:
        """The manifest entry of a file: a declared file must still be as it was declared;
        its content must be in the store (captured again if ``gc`` removed it meanwhile)."""
        ref = locate(path, self.session_dir, self.roots)
        if ref is None:
            raise _CaptureFailedError(f"{path!r}: {self.refusal(path)}")
        real = os.path.realpath(path)
        expect = self._declared.get(real) if declared else None
        if fd is None:
            try:
                st = os.stat(real)
            except OSError:
                raise _CaptureFailedError(f"{path!r} vanished after it was declared") from None
            if declared and expect is not None and _stat_key(st) != expect:
                raise _CaptureFailedError(
                    f"{path!r} changed after it was declared (declare it again once it is written)"
                )
        try:
            cap = self._capture_file(path, expect=expect, fd=fd, verify=True)
        except (_CaptureFailedError, StoreError) as exc:
            raise _CaptureFailedError(f"{path!r}: {exc}") from None
        return ManifestEntry(
            root=ref.root,
            path=ref.path,
            sha256=cap.sha256,
            size=cap.size,
            executable=cap.executable,
        )

    def _manifest(self, save: _Save) -> Manifest:
        entries: dict[tuple[str, str], ManifestEntry] = {}
        files: list[PathRef] = []
        dirs: list[PathRef] = []
        for path in save.files:
            entry = self._entry_for(path, declared=True)
            entries[(entry.root, entry.path)] = entry
            files.append(PathRef(root=entry.root, path=entry.path))
        for path in save.dirs:
            ref = locate(path, self.session_dir, self.roots)
            if ref is None:
                raise _CaptureFailedError(f"{path!r}: {self.refusal(path)}")
            if not os.path.isdir(path):
                raise _CaptureFailedError(f"folder {path!r} vanished after it was declared")
            dirs.append(ref)
            # A declared folder is captured as it is now: new or rewritten files in it are
            # captured at this save (only a folder that vanished fails it).
            found, folders = self._walk(path)
            for folder in folders:
                fref = locate(folder, self.session_dir, self.roots)
                if fref is not None:
                    entries.setdefault(
                        (fref.root, fref.path),
                        ManifestEntry(root=fref.root, path=fref.path, kind="dir"),
                    )
            for file in found:
                entry = self._entry_for(file, declared=False)
                entries[(entry.root, entry.path)] = entry
        file_ref: PathRef | None = None
        if save.file is not None:
            if save.file_fd is None:
                raise _CaptureFailedError(f"checkpoint file {save.file!r} could not be opened")
            entry = self._entry_for(save.file, declared=False, fd=save.file_fd)
            entries[(entry.root, entry.path)] = entry
            file_ref = PathRef(root=entry.root, path=entry.path)
        return Manifest(
            entries=sorted(entries.values(), key=lambda e: (e.root, e.path, e.kind)),
            file=file_ref,
            files=files,
            dirs=dirs,
        )


# --- restore -----------------------------------------------------------------------------------
@dataclass
class RestoreResult:
    """Where a generation's files now are."""

    file: str | None
    files: list[str]
    dirs: list[str]
    entries: list[tuple[str, ManifestEntry]]
    """(restored path, entry) of every file."""
    restored_bytes: int = 0


def _target_root(token: str, session_dir: str, roots: list[str]) -> str:
    if token == SESSION_ROOT:
        return session_dir
    norm = os.path.normpath(token) if os.path.isabs(token) else None
    if norm is None or norm not in roots:
        raise RestoreError(
            f"the manifest names root {token!r}, which is not an allowed root on this host "
            "(--file-root or $" + FILE_ROOTS_VARIABLE + ")"
        )
    return norm


def _join(root: str, rel: str) -> str:
    return root if rel == "" else os.path.join(root, *rel.split("/"))


def _safe_dirs(root: str, rel_dir: str) -> str:
    """Make the folders of ``rel_dir`` below ``root`` one at a time, refusing links."""
    current = root
    os.makedirs(root, exist_ok=True)
    if rel_dir == "":
        return current
    for part in rel_dir.split("/"):
        current = os.path.join(current, part)
        try:
            os.mkdir(current, 0o755)
        except FileExistsError:
            pass
        mode = os.lstat(current).st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISDIR(mode):
            raise RestoreError(f"{current} is not a folder (a link or a file is there)")
    return current


def restore_checkpoint(
    store: Any, manifest_digest: str, session_dir: str, roots: list[str]
) -> RestoreResult:
    """Restore a generation's files into ``session_dir`` (and allowed roots).

    Every entry is checked before anything is written: a manifest with any entry that is not a
    clean relative path below a known root is refused whole. Each file is written to a temporary
    name beside its target while its hash is checked; once every file is in, each is renamed
    over its target (a link there is replaced, never followed), so a generation that cannot be
    restored leaves the files that were there as they were. Temporary files that a restore
    killed part-way on this host left are removed. Restoring twice gives the same tree.

    Raises:
        RestoreError: the manifest is missing, edited or unsafe, a file's content is missing or
            does not match its hash, or a file cannot be written.
    """
    blobs = _Blobs(store)
    manifest = blobs.read_manifest(manifest_digest)
    refs: list[PathRef | ManifestEntry] = [*manifest.entries, *manifest.files, *manifest.dirs]
    if manifest.file is not None:
        refs.append(manifest.file)
    targets: dict[str, str] = {}
    for ref in refs:
        if not _clean_relative(ref.path):
            raise RestoreError(
                f"manifest {manifest_digest[:12]} is refused whole: entry {ref.path!r} is not a "
                "clean relative path"
            )
        targets[ref.root] = _target_root(ref.root, session_dir, roots)
    if manifest.file is not None and not any(
        e.kind == "file" and (e.root, e.path) == (manifest.file.root, manifest.file.path)
        for e in manifest.entries
    ):
        raise RestoreError(
            f"manifest {manifest_digest[:12]} is refused whole: its checkpoint file "
            f"{manifest.file.path!r} is not one of its files"
        )
    for entry in manifest.entries:
        if entry.kind not in ("file", "dir"):
            raise RestoreError(
                f"manifest {manifest_digest[:12]}: unknown entry kind {entry.kind!r}"
            )
        if entry.kind == "file" and (not _valid_hash(entry.sha256) or entry.path == ""):
            raise RestoreError(
                f"manifest {manifest_digest[:12]} is refused whole: entry {entry.path!r} has no "
                "valid content hash"
            )
    result = RestoreResult(
        file=_join(targets[manifest.file.root], manifest.file.path) if manifest.file else None,
        files=[_join(targets[r.root], r.path) for r in manifest.files],
        dirs=[_join(targets[r.root], r.path) for r in manifest.dirs],
        entries=[],
    )
    # Two phases, so that a generation that cannot be restored changes nothing that was there
    # (a file of a --file-root included): every file is first written beside its target under
    # a temporary name while its hash is checked; only once all are in are they renamed over
    # their targets.
    staged: list[tuple[str, str, ManifestEntry]] = []
    swept: set[str] = set()
    try:
        for entry in manifest.entries:
            root = targets[entry.root]
            try:
                if entry.kind == "dir":
                    _safe_dirs(root, entry.path)
                    continue
                parent_rel, _, name = entry.path.rpartition("/")
                parent = _safe_dirs(root, parent_rel)
                target = os.path.join(parent, name)
                if os.path.isdir(target) and not os.path.islink(target):  # found before any
                    raise RestoreError(  # file is renamed in: nothing there changes
                        f"cannot restore {entry.path!r}: a folder is in its place"
                    )
                if parent not in swept:
                    _sweep_dead_restores(parent)
                    swept.add(parent)
                tmp, size = _stage_file(blobs, entry, parent)
                staged.append((tmp, target, entry))
                result.restored_bytes += size
            except OSError as exc:
                raise RestoreError(
                    f"cannot restore {entry.path!r}: {exc.strerror or exc}"
                ) from None
        for i, (tmp, target, entry) in enumerate(staged):
            try:
                os.replace(tmp, target)  # a link at the target is replaced, never followed
            except OSError as exc:
                staged = staged[i:]
                raise RestoreError(
                    f"cannot restore {entry.path!r}: {exc.strerror or exc}"
                ) from None
            result.entries.append((target, entry))
        staged = []
    finally:
        for tmp, _target, _entry in staged:  # a generation not restored leaves nothing behind
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return result


STORE_DOWN_SECONDS = 30.0
"""After the store could not be written, files queued for capture in the next 30 s are not
tried (``FileCapture._capture_file``)."""

_RESTORE_TMP = ".openjd-restore-"
"""Prefix of a file being restored, beside its target:
``.openjd-restore-<host>-<pid>-<random>``, ``<host>`` a hash of this host's id (a file root may
be shared by several hosts)."""


def _restore_prefix() -> str:
    return f"{_RESTORE_TMP}{hashlib.sha256(host_id().encode()).hexdigest()[:12]}-"


def _sweep_dead_restores(folder: str) -> None:
    """Remove what a restore of this host killed part-way (its process gone) left in
    ``folder``; those of other hosts are theirs."""
    prefix = _restore_prefix()
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid_text = name[len(prefix) :].split("-", 1)[0]
        if not pid_text.isdigit() or psutil.pid_exists(int(pid_text)):
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _stage_file(blobs: _Blobs, entry: ManifestEntry, parent: str) -> tuple[str, int]:
    """Write ``entry``'s content to a new temporary file in ``parent``, checking its hash.
    Returns the temporary file's path and its size in bytes.

    Raises:
        RestoreError: the content is missing or does not match its hash (nothing is left).
        OSError: the file cannot be written (nothing is left).
    """
    digest = entry.sha256 or ""
    tmp = os.path.join(parent, f"{_restore_prefix()}{os.getpid()}-{uuid.uuid4().hex}")
    h = hashlib.sha256()
    size = 0
    try:
        src = blobs.open_read(blob_key(digest))
    except FileNotFoundError:
        raise RestoreError(f"the content of {entry.path!r} is missing from the store") from None
    except StoreError as exc:
        raise RestoreError(str(exc)) from None
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with src, os.fdopen(fd, "wb") as out:
            while True:
                chunk = src.read(CHUNK_BYTES)
                if not chunk:
                    break
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        if h.hexdigest() != digest or size != entry.size:
            raise RestoreError(
                f"the stored content of {entry.path!r} does not match its hash "
                f"({digest[:12]}): the store was damaged or edited"
            )
        os.chmod(tmp, 0o755 if entry.executable else 0o644)
        done, tmp = tmp, ""
        return done, size
    finally:
        if tmp:
            try:
                os.unlink(tmp)
            except OSError:
                pass


# --- garbage collection ------------------------------------------------------------------------
@dataclass
class GcReport:
    """What ``collect_file_garbage`` removed (counts and bytes)."""

    blobs_removed: int = 0
    manifests_removed: int = 0
    uploads_removed: int = 0
    bytes_freed: int = 0
    kept_blobs: int = 0
    young: int = 0
    """Unreferenced files and manifests kept because they are younger than the grace period."""
    warnings: list[str] = field(default_factory=list)


def _mtime(info: dict[str, Any]) -> float:
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


def _list_files(store: Any, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, info with ``size`` and a modification time) of every file under ``prefix``."""
    base = posixpath.join(store.root, prefix)
    out: list[tuple[str, dict[str, Any]]] = []
    if store._local:
        if not os.path.isdir(base):
            return out
        store._checked(base, whole=True)
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
        found = store.fs.find(base, detail=True)
    except FileNotFoundError:
        return out
    for path, info in found.items():
        if info.get("type") == "file":
            out.append((path, info))
    return out


def referenced_manifests(store: Any, runs: list[Any]) -> tuple[set[str], list[str]]:
    """The manifest hashes of every stored generation and task record of ``runs``."""
    names: set[str] = set()
    warnings: list[str] = []
    for run in runs:
        tasks, task_warnings = store.read_tasks(run.job_key, run.run_id)
        warnings.extend(task_warnings)
        for rec in tasks:
            if rec.checkpoint is not None and rec.checkpoint.manifest:
                names.add(rec.checkpoint.manifest)
            for gen in store.list_generations(rec):
                if gen.manifest:
                    names.add(gen.manifest)
    return names, warnings


def _output_blobs(store: Any, runs: list[Any], warnings: list[str]) -> set[str]:
    """The content named by the early-outputs indexes of ``runs``; an index that cannot be
    read is named in ``warnings``."""
    out: set[str] = set()
    for run in runs:
        for index in store.read_outputs(run.job_key, run.run_id, warnings):
            for item in index.get("files", {}).values():
                digest = item.get("sha256") if isinstance(item, dict) else None
                if isinstance(digest, str):
                    out.add(digest)
    return out


def collect_file_garbage(
    store: Any, *, grace_seconds: float = DEFAULT_GC_GRACE_SECONDS, dry_run: bool = False
) -> GcReport:
    """Remove content and manifests no kept generation references, and abandoned uploads.

    Anything younger than ``grace_seconds`` stays: a live run may be about to commit it (a save
    uploads its files before it writes the generation that references them). A manifest that
    cannot be read keeps nothing alive and is reported.

    Raises:
        StoreError: the store cannot be listed or written.
    """
    report = GcReport()
    now = time.time()
    runs, run_warnings = store.list_runs()
    report.warnings.extend(run_warnings)
    kept_manifests, warnings = referenced_manifests(store, runs)
    report.warnings.extend(warnings)
    blobs = _Blobs(store)
    live_blobs: set[str] = set()
    for digest in sorted(kept_manifests):
        try:
            manifest = blobs.read_manifest(digest)
        except RestoreError as exc:
            report.warnings.append(str(exc))
            continue
        live_blobs.update(e.sha256 for e in manifest.entries if e.sha256)
    unreadable: list[str] = []
    live_blobs.update(_output_blobs(store, runs, unreadable))
    if unreadable:
        # What it named is unknown, and after a run has ended it is the only record of its
        # outputs: no content is removed until it is mended or deleted.
        report.warnings.extend(unreadable)
        report.warnings.append(
            "no stored file content was removed: an early-outputs index cannot be read "
            "(mend or delete it, then run gc again)"
        )

    def remove(path: str) -> None:
        if dry_run:
            return
        try:
            store._remove_file(store._checked(path))
        except OSError as exc:
            report.warnings.append(f"cannot remove {path}: {exc}")

    for path, info in _list_files(store, "manifests"):
        name = posixpath.basename(path)
        digest = name[: -len(".json")] if name.endswith(".json") else name
        if digest in kept_manifests:
            continue
        if now - _mtime(info) < grace_seconds:
            report.young += 1
            continue
        remove(path)
        report.manifests_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    for path, info in _list_files(store, "blobs/sha256"):
        digest = posixpath.basename(path)
        if digest in live_blobs or unreadable:
            report.kept_blobs += 1
            continue
        if now - _mtime(info) < grace_seconds:
            report.young += 1
            continue
        remove(path)
        report.blobs_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    for path, info in _list_files(store, "blobs/tmp"):
        if now - _mtime(info) < grace_seconds:
            continue
        remove(path)
        report.uploads_removed += 1
        report.bytes_freed += int(info.get("size") or 0)
    return report
