"""Managed file data flow, capture: the files a running task declares (``openjd_checkpoint_files``
and the ``file`` of ``openjd_checkpoint_save``) hashed and uploaded on a background thread while
the task runs, and each save committed once every file of its dataset is in (``FileCapture``).
The content-addressed layer they go into is ``core.files._blobs``; the overview is there.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import stat
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core._errors import StoreError
from core._hashing import Digest, hash_fd
from core.files._blobs import (
    MAX_MANIFEST_BYTES,
    Blobs,
    Manifest,
    ManifestEntry,
    PathRef,
    RestoreError,
    _kind,
    _stat_key,
    locate,
    manifest_key,
)

if TYPE_CHECKING:
    from core.fs import StoreFS


__all__ = ("STORE_DOWN_SECONDS", "CaptureStats", "FileCapture")

STORE_DOWN_SECONDS = 30.0
"""After the store could not be written, files queued for capture in the next 30 s are not
tried (``FileCapture._capture_file``)."""


# --- capture -----------------------------------------------------------------------------------
@dataclass
class _Captured:
    digest: Digest
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
    commit: Callable[[str, str | None, int], None]
    """Called with (manifest hash, the save's file as resolved, bytes of its files) once
    everything is in."""
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


SMALL_UPLOAD_BYTES = 4 * 1024 * 1024
"""Object stores: a file of at most this many bytes is read into memory once, hashed, and (if
the store lacks that content) uploaded from the same bytes to its content name directly, in one
request (a larger one streams to a temporary object, then is moved)."""


STAGE_BYTES = 8 * 1024 * 1024
"""Local stores: a file of at least this many bytes is copied into the store while the copy is
hashed (one pass; the copy is dropped, never synced, if the store has that content already); a
smaller one is read into memory (at most this many bytes held per capture), hashed, and written
from the same bytes only if the store lacks its content."""


class _Content:
    """Puts the content of one open file in the store, once; content the store has already is
    reused (and touched, for ``gc``'s grace), never synced or uploaded again. Counts what it did
    in ``stats``.

    - Local store, large file: cloned or copied in the kernel into a temporary file, hashed
      (BLAKE3) behind the copy as it is made (``Blobs.stage_copy``); kept if the store lacks
      that content, else dropped before it is ever synced. Hashing first and copying after
      would read the file twice, one after the other: about 1.4x the copy where the file
      system has no clones.
    - Local store, small file (under ``STAGE_BYTES``): read into memory once and hashed; if
      the store lacks that content, the same bytes are written to a temporary file
      (``Blobs.stage_bytes``): what is named is what was hashed, with one read and one hash
      (hashing a kernel copy again cost a second hash, about 0.6 ms for 1 MB here); no copy
      at all for content the store has, no thread.
    - Object store: hashed, then (if the store lacks it) uploaded, from memory in one request
      up to ``SMALL_UPLOAD_BYTES``, else streamed and hashed again on the way.

    On a local store a kept copy is *pending*: in ``blobs/tmp``, not yet synced nor named. It
    is named by ``settle``, which fsyncs every pending copy at once, with the manifest of the
    save that needs them (one flush of the disk for all, where one after the other costs a
    flush each), before anything names that content."""

    def __init__(self, blobs: Blobs, stats: CaptureStats) -> None:
        self.blobs = blobs
        self.stats = stats
        self.pending: dict[str, str] = {}
        """Key -> temporary file of content kept but not yet settled."""

    def has(self, digest: Digest) -> bool:
        """True if the store has ``digest``'s content, or it is pending here."""
        return digest.key in self.pending or self.blobs.exists(digest.key)

    def put(self, fd: int, key: tuple[int, int, int, int, int]) -> Digest:
        """Store the content of ``fd`` (from its start), which must keep the size and times
        ``key`` while it is read. Returns its content name (on a local store pending until
        ``settle``).

        Raises:
            _CaptureFailedError: it changed while it was read.
            StoreError: the store cannot be written.
        """
        if self.blobs.local and key[2] >= STAGE_BYTES:
            return self._staged(fd, key)
        data: bytes | None = None
        try:
            if key[2] <= (STAGE_BYTES if self.blobs.local else SMALL_UPLOAD_BYTES):
                data = _read_all(fd, key[2])
                digest = Digest.of_bytes(data)
                size = len(data)
            else:
                hexa, size = hash_fd(fd)
                digest = Digest("blake3", hexa)
        except OSError as exc:
            raise _CaptureFailedError(exc.strerror or str(exc)) from None
        self.stats.hashed_bytes += size
        if _stat_key(os.fstat(fd)) != key or size != key[2]:
            raise _CaptureFailedError("it changed while it was being read")
        if self.has(digest):
            self._reused(digest)
            return digest
        try:
            if self.blobs.local and data is not None:
                self.pending[digest.key] = self.blobs.stage_bytes(data)
            elif data is not None:
                self.blobs.put_bytes(digest.key, data)
            else:
                size = self.blobs.upload(fd, digest)
        except RestoreError as exc:
            raise _CaptureFailedError(str(exc)) from None
        self.stats.uploaded_bytes += size
        self.stats.uploaded_files += 1
        return digest

    def _staged(self, fd: int, key: tuple[int, int, int, int, int]) -> Digest:
        tmp: str | None
        tmp, digest, size = self.blobs.stage_copy(fd)
        try:
            self.stats.hashed_bytes += size
            if _stat_key(os.fstat(fd)) != key or size != key[2]:
                raise _CaptureFailedError("it changed while it was being read")
            if self.has(digest):
                self._reused(digest)
            else:
                self.pending[digest.key], tmp = tmp, None
                self.stats.uploaded_bytes += size
                self.stats.uploaded_files += 1
        finally:
            if tmp is not None:
                self.blobs.discard(tmp)
        return digest

    def _reused(self, digest: Digest) -> None:
        self.stats.reused_files += 1
        if digest.key not in self.pending:
            self.blobs.touch(digest.key)

    def settle(self, also: list[tuple[str, str]] | None = None) -> None:
        """Make every pending copy durable and named, with ``also`` ((temporary path, key)
        pairs staged by the caller, named last: a save's manifest) in the same fsyncs.

        Raises:
            StoreError: the store cannot be written (what was pending is dropped: a save that
                needs it captures it again).
        """
        staged = [(tmp, key) for key, tmp in self.pending.items()] + list(also or ())
        self.pending.clear()
        self.blobs.settle(staged)

    def store_manifest(self, raw: bytes) -> str:
        """Store a manifest's bytes under their SHA-256 (returned), fsynced with every pending
        copy (one flush of the disk) and named after them.

        Raises:
            StoreError: the store cannot be written.
        """
        digest = hashlib.sha256(raw).hexdigest()
        key = manifest_key(digest)
        staged: list[tuple[str, str]] = []
        if not self.blobs.exists(key):
            if self.blobs.local:
                staged.append((self.blobs.stage_bytes(raw), key))
            else:
                self.blobs.put_bytes(key, raw)
        self.settle(staged)
        return digest

    def discard_pending(self) -> None:
        for tmp in self.pending.values():
            self.blobs.discard(tmp)
        self.pending.clear()


def _read_all(fd: int, size: int) -> bytes:
    """The content of the open file ``fd``, expected to be ``size`` bytes, by positioned reads
    of at most ``size + 1`` bytes in all: one byte more than expected says that it grew while
    it was read, which the caller's size check refuses, so memory stays bounded by ``size``
    whatever a writer appends meanwhile."""
    parts: list[bytes] = []
    offset = 0
    want = size + 1
    while offset < want:
        chunk = os.pread(fd, want - offset, offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _refusal(path: str, session_dir: str, roots: list[str]) -> str | None:
    """Why ``path`` may not be captured from ``session_dir`` and ``roots``, or None."""
    if ".." in path.replace("\\", "/").split("/"):
        return "it has a '..' component"
    if locate(path, session_dir, roots) is None:
        where = "the session working directory"
        if roots:
            where += " or the allowed roots (" + ", ".join(roots) + ")"
        return (
            f"it is not under {where} once links are resolved (a folder outside the session "
            "is allowed with --file-root, or $OPENJD_CHECKPOINT_FILE_ROOTS)"
        )
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # not there yet: checked again when it is captured
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        return f"it is {_kind(mode)}"
    return None


def _walk(
    path: str, session_dir: str, roots: list[str], warn: Callable[[str], None]
) -> tuple[list[str], list[str]]:
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
                if locate(full, session_dir, roots) is None:
                    warn(
                        f"checkpoint file {full!r} was not captured: it is a symbolic link "
                        "that leads outside the allowed roots"
                    )
                    continue
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    warn(
                        f"checkpoint folder {full!r} was not captured: links to folders "
                        "are not followed"
                    )
                    continue
            if stat.S_ISDIR(st.st_mode):
                stack.append(full)
            elif stat.S_ISREG(st.st_mode):
                files.append(full)
            else:
                warn(f"checkpoint file {full!r} was not captured: it is {_kind(st.st_mode)}")
    return files, folders


class FileCapture:
    """Uploads a task's declared files in the background and commits its saves in order.

    One worker thread per task execution: declarations and saves are processed in the order
    they were read, so a file named again is captured again (the newer content wins) and a save
    sees every upload named before it.

    Args:
        fs: the store's file system (``CheckpointStore.fs``, managed mode).
        session_dir: the task's session working directory.
        roots: allowed roots besides the session directory.
        warn: called with a warning text (thread-safe).
        on_uploaded: called after each upload batch with the dataset uploaded so far
            (``{declared path: (content name as ``Digest`` text, size in bytes)}``), for
            early outputs.
    """

    def __init__(
        self,
        fs: StoreFS,
        session_dir: str,
        roots: list[str],
        warn: Callable[[str], None],
        on_uploaded: Callable[[dict[str, tuple[str, int]]], None] | None = None,
    ) -> None:
        self._blobs = Blobs(fs)
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
        self._content = _Content(self._blobs, self.stats)
        self._idle = threading.Event()
        self._idle.set()
        self._pending = 0
        self._count_lock = threading.Lock()
        self._abandoned = False
        self._outputs_unreported = False
        """Files were captured whose outputs report waits for the save queued behind them."""
        self._store_down: tuple[float, str] | None = None
        """(time.monotonic() until which, why): the store could not be written just now."""
        self._thread = threading.Thread(target=self._work, name="openjd-file-capture", daemon=True)
        self._thread.start()

    # --- called from the reader thread ----------------------------------------------------------
    def refusal(self, path: str) -> str | None:
        """Why ``path`` may not be captured (lexical and link check), or None."""
        return _refusal(path, self.session_dir, self.roots)

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
        digest = entry.digest
        try:
            st = os.stat(path)
        except OSError:
            return
        if digest is None:
            return
        self._put(
            (
                "adopt",
                (
                    path,
                    _Captured(digest, entry.size, entry.executable, _stat_key(st)),
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

    def _settle(self, *, drop: bool = False) -> bool:
        """Name the content kept so far (``_Content.settle``; with ``drop``, remove it); False,
        with a warning, if the store could not take it."""
        if drop or not self._content.pending:
            self._content.discard_pending()
            return True
        try:
            self._content.settle()
        except StoreError as exc:
            self._store_down = (time.monotonic() + STORE_DOWN_SECONDS, str(exc))
            self._warn(f"checkpoint files not stored: {exc}")
            return False
        except Exception as exc:  # never let the worker die (it runs in its finally too)
            self._warn(f"checkpoint files not stored: {type(exc).__name__}: {exc}")
            return False
        return True

    def _report_outputs(self) -> None:
        self._outputs_unreported = False
        if self._store_down_why() is not None or not self._settle():
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
                self._settle(drop=self._abandoned)
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
                    if self._superseded():  # a save is next: it names them, then reports
                        self._outputs_unreported = True
                    else:
                        self._report_outputs()
                elif kind == "adopt":
                    path, cap, output = payload
                    self._captured[os.path.realpath(path)] = cap
                    if output:
                        self._outputs[path] = (str(cap.digest), cap.size)
                        self._report_outputs()
                elif kind == "save":
                    self._commit(payload)
                    if self._outputs_unreported:
                        self._report_outputs()
            except Exception as exc:  # never let the worker die: the task must go on
                self._warn(f"checkpoint files: {type(exc).__name__}: {exc}")
            finally:
                if self._queue.empty():  # idle: what was kept is named before drain returns
                    self._settle(drop=self._abandoned)
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
                and (not verify or self._content.has(known.digest))
            ):
                if output:
                    self._outputs[path] = (str(known.digest), known.size)
                return known
            digest = self._content.put(fd, key)
            cap = _Captured(digest, st.st_size, bool(st.st_mode & 0o100), key)
            self._captured[real] = cap
            if output:
                self._outputs[path] = (str(digest), st.st_size)
            return cap
        finally:
            if owned:
                os.close(fd)

    def _capture_dir(self, path: str, *, strict: bool) -> tuple[list[str], list[str]]:
        if locate(path, self.session_dir, self.roots) is None:
            raise _CaptureFailedError(self.refusal(path) or "outside the roots")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise _CaptureFailedError("it does not exist") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _CaptureFailedError(f"it is {_kind(st.st_mode)}, not a folder")
        files, folders = _walk(path, self.session_dir, self.roots, self._warn)
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
        try:
            digest = self._content.store_manifest(raw)
        except StoreError as exc:
            self._warn(f"checkpoint not stored, the previous generation stays: {exc}")
            return
        if not self._abandoned:  # a deadline or a cancel came meanwhile: commit nothing more
            save.commit(digest, save.file, sum(e.size for e in manifest.entries))

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
        return ManifestEntry.for_file(ref.root, ref.path, cap.digest, cap.size, cap.executable)

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
            found, folders = _walk(path, self.session_dir, self.roots, self._warn)
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
