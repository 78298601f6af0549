"""Checkpoint store: versioned JSON records of runs, tasks and checkpoint generations.

Layout under the store root (a local directory or any fsspec URL)::

    jobs/<job_key>/runs/<run_id>/run.json
    jobs/<job_key>/runs/<run_id>/tasks/<task_id>.json           latest task record
    jobs/<job_key>/runs/<run_id>/tasks/<task_id>.gen-<N>.json   checkpoint generation N

Every write replaces a whole file atomically: on a local file system through a temporary file in
the same directory, ``fsync`` and ``os.replace`` (fsspec's local writes are not atomic and do not
fsync); elsewhere through fsspec's ``pipe_file``, which object stores commit whole. A crash at any
instant leaves the previous version readable. A record that cannot be read is moved aside to
``<name>.unreadable-<time>`` and reported; it is never overwritten.

The store never writes, moves or deletes anything outside its root. Every path it touches goes
through one check (``confined``): a name below the root with no empty, ``.`` or ``..``
component; on a local store also no symbolic link in any folder on the way (the root itself
may be a link: it is what the user named). Record files are opened with ``O_NOFOLLOW``, read
only when they are regular files of at most ``MAX_RECORD_BYTES``, and folders are made one
component at a time. Anything else is refused with a ``StoreError`` naming the path and why, or,
for a record, set aside like any unreadable record. Every operating-system error becomes a
``StoreError`` naming the path and the reason.

Leases (the right to run a run or a task) and the run's and job's locks depend on the store:

- local directory: ``flock``s, dropped by the kernel when their owner dies;
- ``s3://`` (s3fs): objects written with S3 conditional writes (``If-None-Match: *`` to create,
  ``If-Match: <ETag>`` to renew or take over an expired one), so that of two takers exactly one
  wins. A server that does not honour them (probed once per process and bucket) gets the
  best-effort files of other stores, with a warning (``logging``, once);
- ``memory://`` (one process): threading locks, exact within the process;
- any other fsspec store: a ``*.lease.json`` with an expiry, read then written (best effort),
  and no run or job lock.

Everywhere but a local store, a held lease is renewed by a daemon thread of its process, so it
expires only when its process died (or stalled for its whole ttl). Directory listings are never
taken from a cache (another process may have written since). A URL's credentials are never
shown: ``location`` is the URL with its userinfo and query values replaced by ``***``.

Implements the storage side of the CHECKPOINT RFC idea (seed 000: "each save supersedes the
previous one"; a scheduler "could offer a history of checkpoints") and Trax's "a run that
completes deletes its checkpoints" (seed 001).
"""

from __future__ import annotations

import contextlib
import email.utils
import errno
import json
import logging
import os
import posixpath
import re
import shutil
import stat
import tempfile
import threading
import time
import urllib.parse
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import platformdirs
import psutil
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from pydantic import ValidationError

from ._errors import StoreError
from ._host import file_flow_from_env, file_roots_from_env, host_id
from ._records import (
    SCHEMA_VERSION,
    CheckpointData,
    GenerationFile,
    ProcessInfo,
    RunRecord,
    SessionRecord,
    StopRequest,
    TaskIdentity,
    TaskRecord,
    TaskStatus,
)
from ._template import canonical_json, sha256_hex

__all__ = (
    "CheckpointStore",
    "Lease",
    "RunSetAside",
    "default_store_location",
    "redact_location",
    "task_id_for",
)

DEFAULT_KEEP_GENERATIONS = 3
"""How many checkpoint generations of each task the store keeps."""


MAX_RECORD_BYTES = 64 * 1024 * 1024
"""The largest file the store reads as a record. A record holds at most a few checkpoint states
of ``DEFAULT_MAX_STATE_BYTES`` (128 KiB) and file lists; anything larger is not a record: it is
set aside unread, like any unreadable record."""


LOCK_STALE_SECONDS = 30.0
"""A run's or job's lock object on S3 that its holder has not refreshed for this long (its
holder refreshes it every 10 s) belonged to a process that died: it is taken over."""

_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_LOG = logging.getLogger(__name__)


class _NotARecordError(Exception):
    """A record path holds something the store does not read (a link, a FIFO, a folder, a file
    over ``MAX_RECORD_BYTES``): it is set aside like an unreadable record."""


class _SetAsideError(StoreError):
    """A record was unreadable and has been moved aside (kept): its place is free again."""


class RunSetAside(str):
    """A warning of ``list_runs``: a run's record (``run.json``) was unreadable and has been
    set aside (kept). The run is not resumed: only that record holds the template hash and the
    job parameter values a resume must match, so its task records and checkpoint generations
    (kept in the run's folder) cannot be verified (docs/decisions.md, "A damaged run
    record")."""


class TaskRebuilt(str):
    """A warning of ``read_tasks``/``read_task``: a task's record was unreadable (kept aside)
    and the record was rebuilt from its newest readable checkpoint generation, which the task
    resumes from (where a plain warning's task runs from the top)."""


def default_store_location() -> str:
    """``$OPENJD_CHECKPOINT_STORE``, else the per-user state directory
    (``~/.local/state/openjd-checkpoint`` on Linux)."""
    env = os.environ.get("OPENJD_CHECKPOINT_STORE")
    if env:
        return env
    return platformdirs.user_state_dir("openjd-checkpoint")


def describe_holder(store: CheckpointStore, info: ProcessInfo | None) -> str:
    """`` by process PID`` for a refusal message, saying so when that process, of this host,
    has ended: on a store other than a local folder its lease frees only once its ttl has run
    out (60 s after its last renewal)."""
    if info is None:
        return ""
    text = f" by process {info.pid}"
    if info.host == host_id() and not store.is_local and not psutil.pid_exists(info.pid):
        text += (
            ", which has ended: its lease on this store frees 60 s after its last renewal; "
            "try again then"
        )
    return text


_LOG_NAME = re.compile(r"[0-9a-f]{24}\.[0-9]{1,9}\.[0-9]{1,9}\.log\.gz")
"""A task output log's file name: a hash of the task, the run's attempt, a counter."""

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Run ids are one safe path component: made here as ``YYYYmmdd-HHMMSS-xxxxxx``; adapters may
pass their own (letters, digits, ``.``, ``_``, ``-``; not starting with ``.``)."""
_JOB_KEY = re.compile(r"[0-9a-f]{16}")


def is_run_id(text: str) -> bool:
    """True if ``text`` can be a run id (one safe path component, at most 128 characters)."""
    return bool(_RUN_ID.fullmatch(text))


def task_id_for(step: str, task_key: str) -> str:
    """The file name stem of a task's record: a hash of its step name and task key. A chunk's
    remainder piece (task key ``ORIGINAL#FRAMES``) gets its original's stem, a dash and a hash
    of its own, so that the records of one original task and its pieces are found by name
    (``CheckpointStore.read_task_family``) without reading the whole run."""
    base, sep, _piece = task_key.partition("#")
    stem = sha256_hex(canonical_json([step, base]))[:24]
    if not sep:
        return stem
    return stem + "-" + sha256_hex(canonical_json([step, task_key]))[:12]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class CheckpointStore:
    """Runs, task records and checkpoint generations kept under one root.

    Thread-safe: each call writes whole files, and task records of one task are written by one
    thread at a time (the task's runner).

    Args:
        location: a directory path or an fsspec URL (``file:///…``, ``memory://…``, ``s3://…``).
            Default: ``default_store_location()``.
        keep_generations: checkpoint generations kept per task (1 or more).
        create: make the store's folder if it is missing (False for read-only commands).
        read_only: only read (the CLI's reading commands): an unreadable record is reported
            and left in place, not set aside, and no task record is rebuilt.
        files: the file data flow, ``shared`` or ``managed`` (default:
            ``$OPENJD_CHECKPOINT_FILES``, else ``shared``; see ``core._files``).
        file_roots: absolute folders whose files a managed store may capture and restore,
            besides the session working directory (added to ``$OPENJD_CHECKPOINT_FILE_ROOTS``).

    Raises:
        StoreError: the location cannot be used.
    """

    def __init__(
        self,
        location: str | Path | None = None,
        *,
        keep_generations: int = DEFAULT_KEEP_GENERATIONS,
        create: bool = True,
        read_only: bool = False,
        files: str | None = None,
        file_roots: Iterable[str] = (),
    ) -> None:
        self.read_only = read_only

        self.file_flow = file_flow_from_env(files)
        self.file_roots = file_roots_from_env(file_roots)
        loc = str(location) if location is not None else default_store_location()
        if not loc.strip():
            raise StoreError("the checkpoint store location is empty")
        if keep_generations < 1:
            raise StoreError("keep_generations must be 1 or more")
        self.keep_generations = keep_generations
        self.url = loc
        """The location as given. It may hold credentials: show ``location`` instead."""
        self.location = redact_location(loc)
        """The location to show: ``url`` with any credentials in it replaced by ``***``."""
        options: dict[str, Any] = {}
        if fsspec.core.split_protocol(loc)[0] in _S3_PROTOCOLS:
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
        self._memory = isinstance(fs, MemoryFileSystem)
        self._s3: _S3Objects | None = None
        if _S3_PROTOCOLS.intersection(_protocols(fs)):
            fs.retries = 2  # s3fs's own, around botocore's (above); a class attribute of 5
            self._s3 = _S3Objects(fs)
            fs = _OSErrorsOnly(fs)
        self.fs = fs
        """The fsspec file system (on S3 wrapped so that botocore's own errors are OSErrors)."""
        if self.is_local and not read_only:
            self._refuse_roots_around_the_store()
        if self._s3 is not None:
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
                exists = self._s3.bucket_exists(bucket)
            except OSError as exc:
                raise StoreError(f"checkpoint store {self.location!r}: {exc}") from None
            if not exists:
                raise StoreError(
                    f"checkpoint store {self.location!r}: the bucket {bucket!r} does not exist; "
                    "create it first: the store makes only its prefix"
                )
        elif create:
            try:
                self.fs.makedirs(self.root, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"checkpoint store {self.location!r} cannot be created: {exc}"
                ) from None

    def _refuse_roots_around_the_store(self) -> None:
        """A file root that holds the (local) store, or lies inside it, would let a restore
        write over the store's own records with a checkpoint's copies of them.

        Raises:
            StoreError: naming the root and the store.
        """
        store = os.path.realpath(self.root)
        for root in self.file_roots:
            real = os.path.realpath(root)
            if os.path.commonpath([store, real]) in (store, real):
                raise StoreError(
                    f"file root {root!r} and the checkpoint store {self.location!r} overlap "
                    "(one holds the other): a restore could write over the store's records; "
                    "use folders beside each other"
                )

    # --- paths ---------------------------------------------------------------------------------
    def _run_dir(self, job_key: str, run_id: str) -> str:
        if not _JOB_KEY.fullmatch(job_key) or not _RUN_ID.fullmatch(run_id):
            raise StoreError(
                f"checkpoint store {self.location!r}: {job_key!r}/{run_id!r} is not a job key "
                "and run id this store makes; refusing to use it as a path"
            )
        return posixpath.join(self.root, "jobs", job_key, "runs", run_id)

    def _run_path(self, job_key: str, run_id: str) -> str:
        return posixpath.join(self._run_dir(job_key, run_id), "run.json")

    def _task_path(self, job_key: str, run_id: str, task_id: str) -> str:
        return posixpath.join(self._run_dir(job_key, run_id), "tasks", f"{task_id}.json")

    def _gen_path(self, job_key: str, run_id: str, task_id: str, gen: int) -> str:
        return posixpath.join(
            self._run_dir(job_key, run_id), "tasks", f"{task_id}.gen-{gen:06d}.json"
        )

    # --- low level: every path the store (and core._files) touches goes through these ---------
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
                raise StoreError(f"cannot use {self.where(current)}: {_reason(exc)}") from None
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
            self.fs.makedirs(directory, exist_ok=True)
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

    def _write(self, path: str, data: dict[str, Any]) -> None:
        payload = (json.dumps(data, indent=1, sort_keys=True) + "\n").encode("utf-8")
        self.confined(path)
        if len(payload) > MAX_RECORD_BYTES:
            raise StoreError(
                f"not writing {self.where(path)}: {len(payload):,} bytes, over the "
                f"{MAX_RECORD_BYTES:,} a record may have (it could never be read back); the "
                "previous version stays"
            )
        self._replace_file(path, payload, durable=True)

    def _replace_file(self, path: str, body: bytes, *, durable: bool) -> None:
        """Write ``body`` to ``path`` (checked by the caller) all at once: on a local store a
        temporary file renamed over it, fsynced with its folder when ``durable``; elsewhere one
        upload, which the object store makes atomic.

        Raises:
            StoreError: it cannot be written (the operating system's reason).
        """
        parent = posixpath.dirname(path)
        try:
            self.makedirs_confined(parent)
            if self.is_local:
                fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=parent)
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(body)
                        if durable:
                            fh.flush()
                            os.fsync(fh.fileno())
                    os.replace(tmp, path)  # replaces a link at ``path`` itself, never its target
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
            else:
                self.fs.pipe_file(path, body)
        except OSError as exc:
            raise StoreError(f"cannot write {self.where(path)}: {_reason(exc)}") from None

    def where(self, path: str) -> str:
        """``path`` named for a message, with the store's location (credentials hidden)."""
        return f"checkpoint store {self.location!r}, record {path}"

    def _read_bytes(self, path: str) -> bytes | None:
        """The bytes of the record file at ``path``, None if there is none.

        Raises:
            _NotARecordError: not a regular file, or larger than ``MAX_RECORD_BYTES`` (never read).
            StoreError: it cannot be read (the operating system's reason).
        """
        self.confined(path)
        try:
            if not self.is_local:
                info = self.fs.info(path)
                if info.get("type") != "file":
                    raise _NotARecordError(f"not a regular file but a {info.get('type')}")
                if int(info.get("size") or 0) > MAX_RECORD_BYTES:
                    raise _NotARecordError(_too_large(int(info["size"])))
                raw = self.fs.cat_file(path)
                if len(raw) > MAX_RECORD_BYTES:
                    raise _NotARecordError(_too_large(len(raw)))
                return bytes(raw)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
            try:
                fd = os.open(path, flags)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):
                    raise _NotARecordError(f"not a regular file ({_reason(exc)})") from None
                raise
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise _NotARecordError(f"not a regular file but a {_kind(st.st_mode)}")
                if st.st_size > MAX_RECORD_BYTES:
                    raise _NotARecordError(_too_large(st.st_size))
                chunks: list[bytes] = []
                size = 0
                while True:
                    chunk = os.read(fd, min(1 << 20, MAX_RECORD_BYTES + 1 - size))
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > MAX_RECORD_BYTES:
                        raise _NotARecordError(_too_large(size))
                return b"".join(chunks)
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"cannot read {self.where(path)}: {_reason(exc)}") from None

    def _read(self, path: str, model: type[Any]) -> Any:
        try:
            raw = self._read_bytes(path)
            if raw is None:
                return None
            obj = json.loads(raw.decode("utf-8"))
            if (
                isinstance(obj, dict)
                and obj.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION
            ):
                raise StoreError(
                    f"{self.where(path)} has schema version {obj.get('schema_version')!r}, "
                    f"this openjd-checkpoint reads version {SCHEMA_VERSION}"
                )
            rec = model.model_validate(obj)
            parts = path.split("/")
            folders: tuple[int, int] | None = None
            if model is RunRecord:
                folders = (-2, -4)
            elif model is TaskRecord:
                folders = (-3, -5)
            if folders is not None:
                for attr, index in zip(("run_id", "job_key"), folders, strict=True):
                    if getattr(rec, attr) != parts[index]:
                        raise ValueError(
                            f"{attr} {getattr(rec, attr)!r} does not match its folder "
                            f"{parts[index]!r}"
                        )
            return rec
        except (_NotARecordError, ValueError, RecursionError, ValidationError) as exc:
            # ValueError covers UnicodeDecodeError, JSONDecodeError and over-long integers
            if self.read_only:
                raise StoreError(
                    f"{self.where(path)} is unreadable ({_short(exc)}); left as it is (the "
                    "next run or resume sets it aside)"
                ) from None
            aside = self._move_aside(path)
            raise _SetAsideError(
                f"{self.where(path)} is unreadable ({_short(exc)}); kept as {aside}"
            ) from None

    def _move_aside(self, path: str) -> str:
        """Rename ``path`` (whatever it is: a link is moved, not followed) to a fresh
        ``<path>.unreadable-<time>`` beside it; ``path`` itself if that fails, or if the store
        is ``read_only``."""
        if self.read_only:
            return path
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
                    if self.fs.exists(aside):
                        continue
                    self.fs.mv(path, aside, recursive=True)
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
        if self.fs.exists(path) and not self.fs.isdir(path):
            self.fs.rm(path)

    def _remove_tree(self, path: str) -> None:
        """Delete the folder ``path`` and everything in it (a link inside is removed, never
        followed; ``path`` itself must not be a link). OSError is the caller's."""
        self.confined(path, whole=True)
        if self.is_local:
            if os.path.lexists(path):
                shutil.rmtree(path)
            return
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def _open_lock(self, path: str) -> int:
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

    # --- runs ----------------------------------------------------------------------------------
    def write_run(self, record: RunRecord) -> None:
        record.updated_at = time.time()
        self._write(self._run_path(record.job_key, record.run_id), record.model_dump(mode="json"))

    def read_run(self, job_key: str, run_id: str) -> RunRecord | None:
        """The run's record, None if there is none. Raises StoreError if it is unreadable."""
        rec: RunRecord | None = self._read(self._run_path(job_key, run_id), RunRecord)
        return rec

    def list_runs(self, job_key: str | None = None) -> tuple[list[RunRecord], list[str]]:
        """All readable run records (oldest first) and a warning for each unreadable one."""
        runs: list[RunRecord] = []
        warnings: list[str] = []
        keys = [job_key] if job_key else self._ls_names(posixpath.join(self.root, "jobs"))
        for key in keys:
            if not _JOB_KEY.fullmatch(key):
                continue
            try:
                run_ids = self._ls_names(posixpath.join(self.root, "jobs", key, "runs"))
            except StoreError as exc:
                warnings.append(str(exc))
                continue
            for run_id in run_ids:
                if not is_run_id(run_id):
                    continue
                try:
                    rec = self.read_run(key, run_id)
                except _SetAsideError as exc:
                    warnings.append(
                        RunSetAside(
                            f"{exc}; run {run_id} is not resumed: the template and job "
                            "parameter values it ran with were recorded there only, and "
                            "cannot be verified from its task records and checkpoint "
                            "generations (kept in "
                            f"{self._run_dir(key, run_id)}); a retry runs from the top"
                        )
                    )
                    continue
                except StoreError as exc:
                    warnings.append(str(exc))
                    continue
                if rec is not None:
                    runs.append(rec)
        runs.sort(key=lambda r: (r.created_at, r.run_id))
        return runs, warnings

    def find_run(self, run_id: str) -> RunRecord | None:
        """A run by its id alone (any job); None if there is none (or the id is malformed)."""
        if not is_run_id(run_id):
            return None
        for key in self._ls_names(posixpath.join(self.root, "jobs")):
            if not _JOB_KEY.fullmatch(key):
                continue
            rec = self.read_run(key, run_id)
            if rec is not None:
                return rec
        return None

    def delete_run(self, job_key: str, run_id: str) -> None:
        """Delete a run with its task records and checkpoints."""
        path = self._run_dir(job_key, run_id)
        try:
            self._remove_tree(path)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.where(path)}: {_reason(exc)}") from None

    def _ls_names(self, path: str) -> list[str]:
        """The names in the folder ``path`` (none if it is missing).

        Raises:
            StoreError: it is a link, not a folder, or cannot be listed."""
        self.confined(path, whole=True)
        try:
            if self.is_local:
                names = os.listdir(path)
            else:
                self.fs.invalidate_cache(path)  # another process may have written since
                names = [
                    posixpath.basename(str(e).rstrip("/")) for e in self.fs.ls(path, detail=False)
                ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StoreError(f"cannot list {self.where(path)}: {_reason(exc)}") from None
        return sorted(n for n in names if n not in ("", ".", "..") and "/" not in n)

    def delete_checkpoints(self, run: RunRecord) -> None:
        """Delete a run's task records and checkpoints, keeping its run record (the tombstone
        that tells a later resume the run already completed)."""
        path = posixpath.join(self._run_dir(run.job_key, run.run_id), "tasks")
        try:
            for name in self._ls_names(path):
                if ".unreadable-" not in name:  # kept for a person to look at
                    self.remove_file(posixpath.join(path, name))
        except OSError as exc:
            raise StoreError(f"cannot delete {self.where(path)}: {_reason(exc)}") from None

    # --- concurrent updates, stop requests and leases -------------------------------------------
    @contextlib.contextmanager
    def run_lock(self, job_key: str, run_id: str, *, timeout: float = 30.0) -> Iterator[None]:
        """Hold the run's record lock while reading and rewriting ``run.json`` or accepting a
        stop request, so that concurrent writers lose nothing.

        ``run.lock``: see ``_lock`` for what it is on each kind of store.

        Raises:
            StoreError: the lock was not had within ``timeout`` seconds.
        """
        with self._lock(posixpath.join(self._run_dir(job_key, run_id), "run.lock"), timeout):
            yield

    @contextlib.contextmanager
    def _lock(self, path: str, timeout: float) -> Iterator[None]:
        """Hold the lock ``path`` (waiting up to ``timeout`` seconds; not reentrant):

        - local store: a blocking ``flock`` on the file ``path``;
        - S3 with conditional writes: the object ``path``, created with ``If-None-Match`` (tried
          again until ``timeout``) and deleted on exit. Its holder refreshes it every 10 s; one
          not refreshed for ``LOCK_STALE_SECONDS`` (its holder died) is taken over with
          ``If-Match``;
        - ``memory://``: a threading lock of this process (a memory store lives in one process);
        - other stores: nothing (best effort, see docs/decisions.md).
        """
        if self.is_local:
            with self._flock(path, timeout):
                yield
        elif self._memory:
            lock = _memory_lock(path)
            if not lock.acquire(timeout=timeout):
                raise StoreError(f"{self.where(path)} stayed locked for {timeout:g} s")
            try:
                yield
            finally:
                lock.release()
        elif self._s3 is not None and self._conditional_writes_or_store_error(path):
            self.confined(path)
            end = time.monotonic() + timeout
            pause = 0.02
            while True:
                try:
                    lease = self._take_object(path, LOCK_STALE_SECONDS)
                except OSError as exc:
                    raise StoreError(f"cannot lock {self.where(path)}: {_reason(exc)}") from None
                if lease is not None:
                    break
                if time.monotonic() > end:
                    raise StoreError(f"{self.where(path)} stayed locked for {timeout:g} s")
                time.sleep(pause)
                pause = min(pause * 1.5, 0.25)
            try:
                yield
            finally:
                lease.release()
        else:
            yield

    @contextlib.contextmanager
    def _flock(self, path: str, timeout: float) -> Iterator[None]:
        import fcntl

        try:
            fd = self._open_lock(path)
        except OSError as exc:
            raise StoreError(f"cannot lock {self.where(path)}: {_reason(exc)}") from None
        try:
            end = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    if time.monotonic() > end:
                        raise StoreError(
                            f"{self.where(path)} stayed locked for {timeout:g} s"
                        ) from None
                    time.sleep(0.01)
            yield
        finally:
            os.close(fd)

    def update_run(self, job_key: str, run_id: str, **changes: Any) -> RunRecord:
        """Set some fields of a run record, keeping every other field as stored now: read,
        change and write under ``run_lock``. Returns the record as written.

        Raises:
            StoreError: the run has no record, or it cannot be read or written.
        """
        with self.run_lock(job_key, run_id):
            current = self.read_run(job_key, run_id)
            if current is None:
                raise StoreError(f"checkpoint store {self.location!r}: no run {run_id!r}")
            for name, value in changes.items():
                setattr(current, name, value)
            self.write_run(current)
            return current

    def add_stop_request(self, run: RunRecord, request: StopRequest) -> None:
        """Append a stop request (a new file; never replaces another request)."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        path = posixpath.join(self._run_dir(run.job_key, run.run_id), "requests", name)
        self._write(path, request.model_dump(mode="json"))

    def read_stop_requests(self, job_key: str, run_id: str) -> list[StopRequest]:
        """Every readable stop request of a run, in the order they were made."""
        directory = posixpath.join(self._run_dir(job_key, run_id), "requests")
        out: list[StopRequest] = []
        for name in self._ls_names(directory):
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            try:
                req = self._read(posixpath.join(directory, name), StopRequest)
            except StoreError:
                continue  # moved aside and kept; an unreadable request stops nothing
            if req is not None:
                out.append(req)
        return out

    def acquire_lease(self, run: RunRecord, *, ttl_seconds: float = 60.0) -> Lease | None:
        """Take the run's lease, or return None if another live owner holds it.

        On a local store the lease is an exclusive ``flock`` on ``lease.lock`` in the run's
        directory: the kernel releases it when its owner dies, however it dies. Elsewhere it is
        a ``lease.lease.json`` with a ttl that its owner's process renews on its own (``Lease``);
        an expired lease may be taken over: exactly one taker wins on S3 (conditional writes)
        and in one process on ``memory://``; on other stores it is best effort."""
        run_dir = self._run_dir(run.job_key, run.run_id)
        return self._acquire(posixpath.join(run_dir, "lease"), ttl_seconds)

    def acquire_task_lease(
        self,
        job_key: str,
        run_id: str,
        step: str,
        task_key: str,
        *,
        ttl_seconds: float = 60.0,
        wait_seconds: float = 0.0,
    ) -> Lease | None:
        """Take the lease of one task of a run (the right to run it now), or return None if a
        live holder has it. Same mechanism as ``acquire_lease``: a dead holder loses it at once
        on a local store, after ``ttl_seconds`` elsewhere."""
        tid = task_id_for(step, task_key)
        base = posixpath.join(self._run_dir(job_key, run_id), "tasks", tid)
        return self._acquire(base, ttl_seconds, wait_seconds)

    def task_lease_held(self, job_key: str, run_id: str, step: str, task_key: str) -> bool:
        """True if a live holder has the task's lease (probes without keeping it)."""
        lease = self.acquire_task_lease(job_key, run_id, step, task_key)
        if lease is None:
            return True
        lease.release()
        return False

    # --- sessions ------------------------------------------------------------------------------
    def _session_base(self, job_key: str, run_id: str, session_id: str) -> str:
        if not _RUN_ID.fullmatch(session_id):
            raise StoreError(f"checkpoint store {self.location!r}: bad session id {session_id!r}")
        return posixpath.join(self._run_dir(job_key, run_id), "sessions", session_id)

    def acquire_session_lease(
        self, job_key: str, run_id: str, session_id: str, *, ttl_seconds: float = 60.0
    ) -> Lease | None:
        """Take an open session's lease (held by the process that runs the session); waits up
        to 0.5 s for a probe to let go."""
        return self._acquire(
            self._session_base(job_key, run_id, session_id), ttl_seconds, wait_seconds=0.5
        )

    def write_session(self, record: SessionRecord) -> None:
        record.updated_at = time.time()
        base = self._session_base(record.job_key, record.run_id, record.session_id)
        self._write(base + ".json", record.model_dump(mode="json"))

    def delete_session(self, job_key: str, run_id: str, session_id: str) -> None:
        base = self._session_base(job_key, run_id, session_id)
        try:
            for suffix in (".json", ".lock", ".lease.json"):
                self.remove_file(base + suffix)
        except OSError as exc:
            raise StoreError(f"cannot delete {self.where(base)}: {_reason(exc)}") from None

    def list_sessions(self, job_key: str, run_id: str) -> list[SessionRecord]:
        """The open (or abandoned) sessions of a run; unreadable records are set aside."""
        directory = posixpath.join(self._run_dir(job_key, run_id), "sessions")
        out: list[SessionRecord] = []
        for name in self._ls_names(directory):
            if not name.endswith(".json") or name.endswith(".lease.json") or name[0] == ".":
                continue
            try:
                rec = self._read(posixpath.join(directory, name), SessionRecord)
            except StoreError:
                continue
            if rec is not None and rec.session_id == name[: -len(".json")]:
                out.append(rec)
        return out

    def session_lease_held(self, job_key: str, run_id: str, session_id: str) -> bool:
        """True if a live process holds the session's lease (probes without keeping it)."""
        lease = self._acquire_once(self._session_base(job_key, run_id, session_id), 60.0)
        if lease is None:
            return True
        lease.release()
        return False

    def _acquire(self, base: str, ttl_seconds: float, wait_seconds: float = 0.0) -> Lease | None:
        """``base.lock`` with an flock on a local store; ``base.lease.json`` elsewhere.

        ``wait_seconds``: keep trying that long, so that another process that merely probes
        the lease (``*_lease_held``, which takes and drops it) is not mistaken for a holder."""
        end = time.monotonic() + wait_seconds
        while True:
            lease = self._acquire_once(base, ttl_seconds)
            if lease is not None or time.monotonic() >= end:
                return lease
            time.sleep(0.02)

    def _acquire_once(self, base: str, ttl_seconds: float) -> Lease | None:
        try:
            if self.is_local:
                import fcntl

                fd = self._open_lock(base + ".lock")
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    os.close(fd)
                    return None
                return Lease(self, base + ".lock", fd=fd, ttl=ttl_seconds)
            if self._conditional_writes():
                return self._take_object(self.confined(base + ".lease.json"), ttl_seconds)
        except OSError as exc:
            raise StoreError(f"cannot take the lease {self.where(base)}: {_reason(exc)}") from None
        path = base + ".lease.json"
        # Read, then write: exact within one process on memory:// (one lock around both), a
        # race between processes on other stores (best effort).
        with _MEMORY_GUARD if self._memory else contextlib.nullcontext():
            try:
                raw = self._read_bytes(path)
                current = json.loads(raw) if raw is not None else {}
                if float(current.get("expires_at", 0)) > time.time():
                    return None
            except (_NotARecordError, ValueError, TypeError, AttributeError):
                pass
            lease = Lease(self, path, ttl=ttl_seconds)
            self._write(path, lease._content())
        _KEEPER.add(lease)
        return lease

    # --- S3: conditional writes -----------------------------------------------------------------
    def _conditional_writes(self) -> bool:
        """True on an S3 store whose server honours conditional writes.

        Probed once per process, endpoint and bucket with an object of its own below the root:
        created with ``If-None-Match: *`` twice (the second must fail), then rewritten with the
        ``If-Match`` of an ETag it does not have (must fail). A server that lets either through
        gets the best-effort leases of other stores and no run or job locks, and this process
        logs a warning (once). Raises OSError (the probe could not be written)."""
        if self._s3 is None:
            return False
        key = (self._s3.endpoint(), self.root.split("/")[0])
        known = _S3_SUPPORT.get(key)
        if known is not None:
            return known.writes
        probe = self.confined(posixpath.join(self.root, f".conditional-write-probe-{_token()}"))
        support = self._s3.probe(probe)
        _S3_SUPPORT[key] = support
        if not support.writes:
            _LOG.warning(
                "checkpoint store %s: the S3 server does not honour conditional writes "
                "(If-None-Match / If-Match); leases are best effort (read, then written) and "
                "run and job locks do nothing",
                self.location,
            )
        return support.writes

    def _conditional_writes_or_store_error(self, path: str) -> bool:
        try:
            return self._conditional_writes()
        except OSError as exc:
            raise StoreError(f"cannot lock {self.where(path)}: {_reason(exc)}") from None

    def _take_object(self, path: str, ttl: float) -> Lease | None:
        """Take the lease object ``path`` on S3: create it with ``If-None-Match: *``; if it is
        there and expired (its age by the server's clock is more than its ttl), rewrite it with
        ``If-Match`` of the ETag read. Returns None if a live holder has it or another taker
        won. OSError is the caller's."""
        assert self._s3 is not None
        lease = Lease(self, path, ttl=ttl)
        etag = self._s3.create(path, lease._content_bytes())
        if etag is None:
            current = self._s3.get(path)
            if current is None:  # released in between: one more try
                etag = self._s3.create(path, lease._content_bytes())
            else:
                data, held_etag, age = current
                if age <= _held_ttl(data):
                    return None
                etag = self._s3.replace(path, lease._content_bytes(), held_etag)
            if etag is None:
                return None
        lease._etag = etag
        _KEEPER.add(lease)
        return lease

    @contextlib.contextmanager
    def job_lock(self, job_key: str, *, timeout: float = 30.0) -> Iterator[None]:
        """Hold the job's lock while choosing or creating the run a new attempt works on, so
        that two processes starting the same job at once cannot both start it.

        ``jobs/<job_key>/job.lock``: see ``_lock`` for what it is on each kind of store.

        Raises:
            StoreError: the lock was not had within ``timeout`` seconds.
        """
        if not _JOB_KEY.fullmatch(job_key):
            raise StoreError(f"checkpoint store {self.location!r}: {job_key!r} is not a job key")
        with self._lock(posixpath.join(self.root, "jobs", job_key, "job.lock"), timeout):
            yield

    def lease_held(self, run: RunRecord) -> bool:
        """True if a live owner holds the run's lease (probes without keeping it)."""
        lease = self.acquire_lease(run)
        if lease is None:
            return True
        lease.release()
        return False

    # --- tasks ---------------------------------------------------------------------------------
    def write_task(self, record: TaskRecord) -> None:
        """Write a task's latest record (atomically replacing the previous one)."""
        record.updated_at = time.time()
        tid = task_id_for(record.step, record.task_key)
        self._write(
            self._task_path(record.job_key, record.run_id, tid), record.model_dump(mode="json")
        )

    def read_task(
        self,
        job_key: str,
        run_id: str,
        step: str,
        task_key: str,
        warnings: list[str] | None = None,
    ) -> TaskRecord | None:
        """One task's latest record, None if it has none.

        A record that is unreadable (or names another task) is moved aside and kept; when one
        of the task's checkpoint generation files is readable, the record is rebuilt from the
        newest (``TaskRebuilt`` appended to ``warnings``), so a damaged record never costs the
        task its stored checkpoint.

        Raises:
            StoreError: the record is unreadable and no generation rebuilds it (the record is
                moved aside and kept), or the store cannot be read.
        """
        tid = task_id_for(step, task_key)
        path = self._task_path(job_key, run_id, tid)
        try:
            rec = _read_own_task(self, path, tid)
        except _SetAsideError as exc:
            tdir = posixpath.join(self._run_dir(job_key, run_id), "tasks")
            rebuilt = self._rebuild_task(job_key, run_id, tid, self._ls_names(tdir), str(exc))
            if rebuilt is None:
                raise
            record, warning = rebuilt
            if warnings is not None:
                warnings.append(warning)
            return record
        return rec

    def _rebuild_task(
        self, job_key: str, run_id: str, tid: str, names: list[str], problem: str
    ) -> tuple[TaskRecord, TaskRebuilt] | None:
        """Rebuild the record of task ``tid`` (whose record file was set aside for
        ``problem``) from its newest readable generation file among ``names`` that says which
        task it belongs to, write it, and return it with its warning; None when there is none.
        The rebuilt record is ``interrupted`` with that checkpoint, the frames finished by that
        commit and the attempt that made it."""
        tdir = posixpath.join(self._run_dir(job_key, run_id), "tasks")
        gens: list[tuple[int, str]] = []
        prefix = f"{tid}.gen-"
        for name in names:
            number = name[len(prefix) : -len(".json")]
            if name.startswith(prefix) and name.endswith(".json") and number.isdigit():
                gens.append((int(number), name))
        for _number, name in sorted(gens, reverse=True):
            try:
                gen: GenerationFile | None = self._read(posixpath.join(tdir, name), GenerationFile)
            except StoreError:
                continue
            if gen is None or gen.task is None:
                continue
            ident = gen.task
            if task_id_for(ident.step, ident.task_key) != tid:
                continue
            record = TaskRecord(
                job_key=job_key,
                run_id=run_id,
                step=ident.step,
                task_key=ident.task_key,
                parameters=ident.parameters,
                status=TaskStatus.INTERRUPTED,
                attempt=gen.attempt,
                chunk_parameter=ident.chunk_parameter,
                completed_frames=ident.completed_frames,
                checkpoint=CheckpointData.model_validate(gen.model_dump(exclude={"task"})),
                step_hash=ident.step_hash,
                message=f"record rebuilt from checkpoint generation {gen.generation}",
            )
            self.write_task(record)
            return record, TaskRebuilt(
                f"{problem}; the task's record was rebuilt from its checkpoint generation "
                f"{gen.generation}, which it resumes from"
            )
        return None

    def delete_task(self, record: TaskRecord) -> None:
        """Delete a task's record and its checkpoint generations."""
        tid = task_id_for(record.step, record.task_key)
        tdir = posixpath.join(self._run_dir(record.job_key, record.run_id), "tasks")
        try:
            for name in self._ls_names(tdir):
                if name == f"{tid}.json" or name.startswith(f"{tid}.gen-"):
                    self.remove_file(posixpath.join(tdir, name))
        except OSError as exc:
            raise StoreError(f"cannot delete {self.where(tdir)}: {_reason(exc)}") from None

    def commit_checkpoint(self, record: TaskRecord, checkpoint: CheckpointData) -> None:
        """Store a new checkpoint generation, then the task record that points at it; drop
        generations older than the last ``keep_generations``."""
        tid = task_id_for(record.step, record.task_key)
        gen_path = self._gen_path(record.job_key, record.run_id, tid, checkpoint.generation)
        identity = TaskIdentity(
            step=record.step,
            task_key=record.task_key,
            parameters=record.parameters,
            chunk_parameter=record.chunk_parameter,
            completed_frames=record.completed_frames,
            step_hash=record.step_hash,
        )
        self._write(gen_path, {**checkpoint.model_dump(mode="json"), "task": identity.model_dump()})
        record.checkpoint = checkpoint
        self.write_task(record)
        old = checkpoint.generation - self.keep_generations
        if old >= 1:
            try:
                for gen in range(max(1, old - 2), old + 1):
                    self.remove_file(self._gen_path(record.job_key, record.run_id, tid, gen))
            except (OSError, StoreError):
                pass  # history clean-up is best effort; the record is already committed

    def read_tasks(self, job_key: str, run_id: str) -> tuple[list[TaskRecord], list[str]]:
        """Every readable task record of a run, and a warning for each unreadable one."""

        def is_record(name: str) -> bool:
            return (
                name.endswith(".json")
                and ".gen-" not in name
                and not name.endswith(".lease.json")
                and not name.startswith(".tmp-")
            )

        return self._read_task_files(job_key, run_id, is_record)

    def read_task_family(
        self, job_key: str, run_id: str, step: str, task_keys: Iterable[str]
    ) -> tuple[list[TaskRecord], list[str]]:
        """The readable records of the given original tasks of a step and of their chunk
        remainder pieces (``ORIGINAL#FRAMES``), and a warning for each unreadable one: what
        ``read_tasks`` gives for those tasks, found by file name, so that planning a few tasks
        of a step of thousands reads a few records, not thousands.

        Raises:
            StoreError: the run's folder cannot be listed.
        """
        stems = {task_id_for(step, key) for key in task_keys}

        def is_family(name: str) -> bool:
            stem, _dot, suffix = name.partition(".")
            return suffix == "json" and stem.partition("-")[0] in stems

        records, warnings = self._read_task_files(job_key, run_id, is_family)
        return [r for r in records if r.step == step], warnings

    def _read_task_files(
        self, job_key: str, run_id: str, wanted: Callable[[str], bool]
    ) -> tuple[list[TaskRecord], list[str]]:
        tasks: list[TaskRecord] = []
        warnings: list[str] = []
        tdir = posixpath.join(self._run_dir(job_key, run_id), "tasks")
        names = self._ls_names(tdir)
        for name in names:
            if not wanted(name):
                continue
            try:
                rec = _read_own_task(self, posixpath.join(tdir, name), name[: -len(".json")])
            except _SetAsideError as exc:
                rebuilt = self._rebuild_task(
                    job_key, run_id, name[: -len(".json")], names, str(exc)
                )
                if rebuilt is None:
                    warnings.append(str(exc))
                else:
                    tasks.append(rebuilt[0])
                    warnings.append(rebuilt[1])
                continue
            except StoreError as exc:
                warnings.append(str(exc))
                continue
            if rec is not None:
                tasks.append(rec)
        return tasks, warnings

    # --- task output logs (kept with the run; core.cli._logs writes and reads them) ---------------
    def write_log(self, job_key: str, run_id: str, name: str, body: bytes) -> None:
        """Write (or replace) the log file ``name`` in the run's ``logs`` folder. Not synced
        to disk: a log is rewritten about once a second while its task runs, and a crash may
        lose its last second, never a record.

        Raises:
            StoreError: ``name`` is not a plain file name, ``body`` is over
                ``MAX_RECORD_BYTES``, or the file cannot be written.
        """
        if not _LOG_NAME.fullmatch(name) or len(body) > MAX_RECORD_BYTES:
            raise StoreError(f"checkpoint store {self.location!r}: not writing log {name!r}")
        path = posixpath.join(self._run_dir(job_key, run_id), "logs", name)
        self.confined(path)
        self._replace_file(path, body, durable=False)

    def list_logs(self, job_key: str, run_id: str) -> list[str]:
        """The names of the run's log files (none if it has no ``logs`` folder).

        Raises:
            StoreError: the folder cannot be listed."""
        directory = posixpath.join(self._run_dir(job_key, run_id), "logs")
        return sorted(n for n in self._ls_names(directory) if _LOG_NAME.fullmatch(n))

    def read_log(self, job_key: str, run_id: str, name: str) -> bytes | None:
        """The bytes of the run's log file ``name``; None if it is not there, not a regular
        file, or over ``MAX_RECORD_BYTES``.

        Raises:
            StoreError: it cannot be read."""
        if not _LOG_NAME.fullmatch(name):
            return None
        path = posixpath.join(self._run_dir(job_key, run_id), "logs", name)
        try:
            return self._read_bytes(path)
        except _NotARecordError:
            return None

    # --- early outputs (managed file data flow) ----------------------------------------------
    def write_outputs(self, record: TaskRecord, outputs: dict[str, tuple[str, int]]) -> None:
        """Write the index of the files a task declared so far (``outputs/<task_id>.json`` in
        the run's folder): declared path -> SHA-256, size in bytes and the content's key in
        the store (``blobs/sha256/<h[:2]>/<h>``). Kept with the run, after its checkpoints."""
        tid = task_id_for(record.step, record.task_key)
        run_dir = self._run_dir(record.job_key, record.run_id)
        path = posixpath.join(run_dir, "outputs", f"{tid}.json")
        files = {
            name: {"sha256": digest, "size": size, "blob": f"blobs/sha256/{digest[:2]}/{digest}"}
            for name, (digest, size) in outputs.items()
        }
        self._write(
            path,
            {"step": record.step, "task_key": record.task_key, "files": files},
        )

    def read_outputs(
        self, job_key: str, run_id: str, warnings: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """The early-outputs indexes of a run. One that cannot be read (not a regular file,
        too large, not a JSON object) is left out and, with ``warnings``, named there."""
        directory = posixpath.join(self._run_dir(job_key, run_id), "outputs")
        out: list[dict[str, Any]] = []
        for name in self._ls_names(directory):
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            path = posixpath.join(directory, name)
            try:
                raw = self._read_bytes(path)
            except (_NotARecordError, StoreError) as exc:
                problem = str(exc) or type(exc).__name__
            else:
                if raw is None:
                    continue  # removed meanwhile
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = None
                if isinstance(data, dict):
                    out.append(data)
                    continue
                problem = "not a JSON object"
            if warnings is not None:
                warnings.append(f"{self.where(path)}: unreadable early-outputs index ({problem})")
        return out

    def list_generations(self, record: TaskRecord) -> list[CheckpointData]:
        """The stored checkpoint generations of a task, oldest first."""
        tid = task_id_for(record.step, record.task_key)
        tdir = posixpath.join(self._run_dir(record.job_key, record.run_id), "tasks")
        gens: list[CheckpointData] = []
        for name in self._ls_names(tdir):
            if name.startswith(f"{tid}.gen-") and name.endswith(".json"):
                try:
                    data = self._read(posixpath.join(tdir, name), GenerationFile)
                except StoreError:
                    continue
                if data is not None:
                    gens.append(CheckpointData.model_validate(data.model_dump(exclude={"task"})))
        gens.sort(key=lambda g: g.generation)
        return gens


def _read_own_task(store: CheckpointStore, path: str, tid: str) -> TaskRecord | None:
    """The task record at ``path``, which must be task ``tid``'s own: one that names another
    task (an edited ``step`` or ``task_key``, a file copied over another) is set aside like
    an unreadable one (``_SetAsideError``; on a read-only store a ``StoreError``), so that
    no task is planned twice or under a name it does not have."""
    rec: TaskRecord | None = store._read(path, TaskRecord)
    if rec is not None and task_id_for(rec.step, rec.task_key) != tid:
        if store.read_only:
            raise StoreError(f"{store.where(path)} names another task")
        aside = store._move_aside(path)
        raise _SetAsideError(f"{store.where(path)} names another task; kept as {aside}")
    return rec


class Lease:
    """A held lease (of a run, a task or a session, or a run's or job's lock on S3);
    ``release()`` when done.

    On a local store it is an exclusive ``flock``, which the kernel drops when its owner dies.
    Elsewhere it is a file with a ttl: on S3 with conditional writes, an object rewritten only
    with ``If-Match`` of the ETag this lease wrote last; on other stores, a JSON file read then
    written. There a daemon thread of this process (``_KEEPER``) renews every held lease every
    third of its ttl, so a lease expires only when its process died (or stalled for its whole
    ttl). ``lost`` says that a renewal found another holder in its place.
    """

    def __init__(
        self, store: CheckpointStore, path: str, *, ttl: float, fd: int | None = None
    ) -> None:
        self._store = store
        self._path = path
        self._fd = fd
        self._ttl = ttl
        self._etag: str | None = None
        """The ETag this lease last wrote (S3 with conditional writes)."""
        self._token = _token()
        self._renewals = 0
        self._mutex = threading.Lock()
        self._released = False
        self._due = time.monotonic() + ttl / 3
        self._renewed = time.monotonic()
        self.owner = this_process()
        self.lost = False
        """A renewal found that the lease had expired and another process had taken it."""

    @property
    def expired(self) -> bool:
        """True when this holder may no longer count on the lease: it was lost, or it has not
        been renewed for its whole ttl (the store could not be written), so another process
        may take it now. Never on a local store (an flock lasts while its process does)."""
        if self._fd is not None or self._released:
            return False
        return self.lost or time.monotonic() - self._renewed > self._ttl

    def _content(self) -> dict[str, Any]:
        return {
            "owner": self.owner.model_dump(mode="json"),
            "token": self._token,
            "ttl": self._ttl,
            "expires_at": time.time() + self._ttl,
            "renewals": self._renewals,
        }

    def _content_bytes(self) -> bytes:
        return (json.dumps(self._content(), sort_keys=True) + "\n").encode("utf-8")

    def renew(self) -> None:
        """Extend the lease by its ttl (a no-op on a local store; the holder's process does it
        on its own elsewhere, so calling it is never needed).

        Raises:
            StoreError: the lease was lost (it expired and another process took it: ``lost``
                is then True), or it could not be written.
        """
        if self._fd is not None:
            return
        store = self._store
        with self._mutex:
            if self._released:
                return
            if self.lost:
                raise StoreError(self._lost_message())
            self._renewals += 1
            try:
                if self._etag is not None:
                    assert store._s3 is not None
                    etag = store._s3.replace(self._path, self._content_bytes(), self._etag)
                    if etag is None:
                        self.lost = True
                    else:
                        self._etag = etag
                else:
                    raw = store._read_bytes(self._path)
                    if raw is not None and _lease_token(raw) not in (self._token, None):
                        self.lost = True
                    else:
                        store._write(self._path, self._content())
            except (OSError, _NotARecordError) as exc:
                raise StoreError(
                    f"cannot renew the lease {store.where(self._path)}: {exc}"
                ) from None
            if self.lost:
                raise StoreError(self._lost_message())
            self._due = time.monotonic() + self._ttl / 3
            self._renewed = time.monotonic()

    def _lost_message(self) -> str:
        return (
            f"the lease {self._store.where(self._path)} was lost: it expired (not renewed "
            f"within {self._ttl:g} s) and another process took it"
        )

    def _keep(self) -> None:
        """Renew, for the keeper thread: on an error try again in a second, until lost."""
        try:
            self.renew()
        except StoreError:
            if self.lost:
                _KEEPER.discard(self)
                return
            self._due = time.monotonic() + min(1.0, self._ttl / 10)

    def release(self) -> None:
        """Let the lease go (once; later calls do nothing). Elsewhere than on a local store,
        the lease's file is deleted only if it is still this lease's (best effort)."""
        with self._mutex:
            if self._released:
                return
            self._released = True
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
            return
        _KEEPER.discard(self)
        if self.lost:
            return
        store = self._store
        try:
            if self._etag is not None:
                assert store._s3 is not None
                store._s3.delete(self._path, self._etag)
            else:
                with _MEMORY_GUARD if store._memory else contextlib.nullcontext():
                    raw = store._read_bytes(self._path)
                    if raw is not None and _lease_token(raw) in (self._token, None):
                        store.remove_file(self._path)
        except (OSError, StoreError, _NotARecordError):
            pass


def this_process(pgid: int | None = None) -> ProcessInfo:
    import psutil

    pid = os.getpid()
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:  # pragma: no cover
        started = time.time()
    return ProcessInfo(
        pid=pid,
        pgid=pgid if pgid is not None else os.getpgid(pid),
        start_time=started,
        host=host_id(),
    )


def _short(exc: BaseException) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors()[:3]
        )
    text = str(exc).splitlines()
    return text[0] if text else type(exc).__name__


def _reason(exc: OSError) -> str:
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


def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _token() -> str:
    return uuid.uuid4().hex


def _lease_token(raw: bytes) -> str | None:
    """The token of a lease file's content, None if it has none (or is not JSON)."""
    try:
        token = json.loads(raw).get("token")
    except (ValueError, AttributeError):
        return None
    return token if isinstance(token, str) else None


def _held_ttl(raw: bytes) -> float:
    """A lease object's ttl in seconds (what its holder renews it within); 60 if it says none."""
    try:
        ttl = float(json.loads(raw).get("ttl", 60.0))
    except (ValueError, TypeError, AttributeError):
        return 60.0
    return ttl if 0 <= ttl < 86400 else 60.0


# --- memory:// (one process) ---------------------------------------------------------------------
_MEMORY_GUARD = threading.Lock()
"""Makes a lease's read-then-write on ``memory://`` one step: a memory store lives in one process,
so a threading lock is all it takes."""
_MEMORY_LOCKS: dict[str, threading.Lock] = {}


def _memory_lock(path: str) -> threading.Lock:
    """The process-wide threading lock standing for the lock file ``path`` on ``memory://``."""
    with _MEMORY_GUARD:
        return _MEMORY_LOCKS.setdefault(path, threading.Lock())


# --- renewing leases -----------------------------------------------------------------------------
class _Keeper:
    """One daemon thread per process that renews every held lease (but local ones) when due."""

    def __init__(self) -> None:
        self._leases: weakref.WeakSet[Lease] = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        """Started with the first lease; after a fork, again in the child."""

    def add(self, lease: Lease) -> None:
        with self._wake:
            self._leases.add(lease)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name="openjd-lease-keeper", daemon=True
                )
                self._thread.start()
            self._wake.notify()

    def discard(self, lease: Lease) -> None:
        with self._wake:
            self._leases.discard(lease)

    def _loop(self) -> None:
        while True:
            with self._wake:
                now = time.monotonic()
                due = [lease for lease in self._leases if lease._due <= now]
                if not due:
                    soonest = min((lease._due for lease in self._leases), default=now + 5.0)
                    self._wake.wait(min(max(soonest - now, 0.01), 5.0))
                    continue
            for lease in due:
                lease._keep()
            del due

    def reset(self) -> None:
        """In a forked child: the parent's leases are not this process's to renew."""
        self._leases = weakref.WeakSet()
        self._wake = threading.Condition()
        self._thread = None


_KEEPER = _Keeper()


def _after_fork_in_child() -> None:
    global _MEMORY_GUARD
    _KEEPER.reset()
    _MEMORY_GUARD = threading.Lock()
    _MEMORY_LOCKS.clear()
    _S3_SUPPORT.clear()


# --- S3 ------------------------------------------------------------------------------------------
class _S3Support:
    """What an S3 server honours (``CheckpointStore._conditional_writes``)."""

    def __init__(self, *, writes: bool, deletes: bool) -> None:
        self.writes = writes
        """``If-None-Match: *`` and ``If-Match`` on PutObject."""
        self.deletes = deletes
        """``If-Match`` on DeleteObject."""


_S3_SUPPORT: dict[tuple[str, str], _S3Support] = {}
"""(endpoint, bucket) -> what its server honours, probed once per process."""

_PRECONDITION_FAILED = frozenset({"PreconditionFailed", "412"})
_CONFLICT = frozenset({"ConditionalRequestConflict", "409"})
"""AWS: another conditional request on the key is under way; this one lost."""
_MISSING = frozenset({"NoSuchKey", "404"})
_NOT_SUPPORTED = frozenset({"NotImplemented", "501", "InvalidArgument", "InvalidRequest"})


def _s3_code(exc: BaseException) -> str | None:
    """The S3 error code behind ``exc`` (an s3fs OSError caused by a botocore ClientError)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            if code:
                return str(code)
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status:
                return str(status)
        seen = seen.__cause__ or seen.__context__
    return None


class _S3Objects:
    """Conditional writes of small objects through s3fs's client (its ``call_s3``). Every
    method raises OSError for what it does not handle, never botocore's own errors."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def endpoint(self) -> str:
        kwargs = getattr(self.fs, "client_kwargs", None) or {}
        return str(getattr(self.fs, "endpoint_url", None) or kwargs.get("endpoint_url") or "")

    def bucket_exists(self, bucket: str) -> bool:
        """False if the server says ``bucket`` does not exist (``HeadBucket``: 404). True
        otherwise, also when these credentials may not ask (403: a policy may grant objects
        under a prefix only; the store's own requests then tell).

        Raises:
            OSError: the server cannot be reached, or answers otherwise.
        """
        try:
            with _os_errors(self.fs):
                self.fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return False
        except PermissionError:
            return True
        except OSError as exc:
            code = _s3_code(exc)
            if code in _MISSING | {"NoSuchBucket"}:
                return False
            if code in ("403", "AccessDenied"):
                return True
            raise
        return True

    def _bucket_key(self, path: str) -> tuple[str, str]:
        bucket, key, _version = self.fs.split_path(path)
        return bucket, key

    def _put(self, path: str, body: bytes, **condition: str) -> str | None:
        """Put ``body`` at ``path`` under ``condition``: the new ETag, or None if the condition
        did not hold."""
        bucket, key = self._bucket_key(path)
        try:
            with _os_errors(self.fs):
                response = self.fs.call_s3(
                    "put_object", Bucket=bucket, Key=key, Body=body, **condition
                )
        except FileExistsError:  # s3fs: If-None-Match failed
            return None
        except FileNotFoundError:  # If-Match on a key that is gone
            return None
        except OSError as exc:
            if _s3_code(exc) in _PRECONDITION_FAILED | _CONFLICT | _MISSING:
                return None
            raise
        return str(response["ETag"])

    def create(self, path: str, body: bytes) -> str | None:
        """Write ``path`` if nothing is there (``If-None-Match: *``): its ETag, else None."""
        return self._put(path, body, IfNoneMatch="*")

    def replace(self, path: str, body: bytes, etag: str) -> str | None:
        """Rewrite ``path`` if its ETag is ``etag`` (``If-Match``): the new ETag, else None."""
        return self._put(path, body, IfMatch=etag)

    def get(self, path: str) -> tuple[bytes, str, float] | None:
        """The object's bytes, ETag and age in seconds by the server's clock (its ``Date`` less
        the object's ``LastModified``, each to the second), None if there is none. One request,
        so the bytes and the ETag belong together."""
        bucket, key = self._bucket_key(path)

        async def fetch() -> tuple[bytes, dict[str, Any]]:
            response = await self.fs._call_s3("get_object", Bucket=bucket, Key=key)
            try:
                data = await response["Body"].read()
            finally:
                response["Body"].close()
            return bytes(data), response

        try:
            with _os_errors(self.fs):
                data, response = fsspec.asyn.sync(self.fs.loop, fetch)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if _s3_code(exc) in _MISSING:
                return None
            raise
        modified = response["LastModified"].timestamp()
        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        try:
            now = email.utils.parsedate_to_datetime(date).timestamp() if date else time.time()
        except (TypeError, ValueError):
            now = time.time()
        return data, str(response["ETag"]), now - modified

    def delete(self, path: str, etag: str) -> None:
        """Delete ``path`` if its ETag is still ``etag`` (``If-Match``; where the server ignores
        that on deletes, a read of the ETag just before stands in for it)."""
        bucket, key = self._bucket_key(path)
        support = _S3_SUPPORT.get((self.endpoint(), bucket))
        if support is not None and not support.deletes:
            current = self.get(path)
            if current is None or current[1] != etag:
                return
            condition: dict[str, str] = {}
        else:
            condition = {"IfMatch": etag}
        try:
            with _os_errors(self.fs):
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, **condition)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if _s3_code(exc) not in _PRECONDITION_FAILED | _CONFLICT | _MISSING:
                raise

    def probe(self, path: str) -> _S3Support:
        """What the server honours, found with a probe object of its own at ``path`` (see
        ``CheckpointStore._conditional_writes``). OSError if it cannot be written at all."""
        bogus = '"00000000000000000000000000000000"'
        try:
            try:
                writes = (
                    self.create(path, b"1\n") is not None
                    and self.create(path, b"2\n") is None
                    and self.replace(path, b"3\n", bogus) is None
                )
            except OSError as exc:
                if _s3_code(exc) in _NOT_SUPPORTED:
                    return _S3Support(writes=False, deletes=False)
                raise
            bucket, key = self._bucket_key(path)
            try:
                with _os_errors(self.fs):
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=bogus)
                deletes = False  # deleted although the ETag did not match
            except OSError as exc:
                deletes = _s3_code(exc) in _PRECONDITION_FAILED
            return _S3Support(writes=writes, deletes=deletes)
        finally:
            with contextlib.suppress(Exception):
                self.fs.rm_file(path)


def _client_error(exc: BaseException) -> bool:
    """True for an error of S3's client libraries (botocore, aiobotocore, aiohttp) that is not
    an OSError (``EndpointConnectionError``, ``NoCredentialsError``...)."""
    return any(
        cls.__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")
        for cls in type(exc).__mro__
    )


def _scrub(text: str, fs: Any) -> str:
    """``text`` with the secrets the file system's client knows replaced by ``***``."""
    secrets = {
        os.environ.get("AWS_SECRET_ACCESS_KEY"),
        os.environ.get("AWS_SESSION_TOKEN"),
        getattr(fs, "secret", None),
        getattr(fs, "token", None),
    }
    for secret in secrets:
        if isinstance(secret, str) and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def _os_errors(fs: Any) -> Iterator[None]:
    """Raise the client library's own errors as OSErrors, and no secret in any message."""
    try:
        yield
    except OSError as exc:
        text = str(exc)
        clean = _scrub(text, fs)
        if clean == text:
            raise
        raise type(exc)(exc.errno or errno.EIO, clean) from None
    except Exception as exc:
        if not _client_error(exc):
            raise
        raise OSError(errno.EIO, _scrub(f"{type(exc).__name__}: {exc}", fs)) from None


class _OSErrorsOnly:
    """An fsspec file system (s3fs) whose public methods raise OSErrors (``_os_errors``), so
    that the store's ``except OSError`` makes ``StoreError``s of every failure."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._fs, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with _os_errors(self._fs):
                return attr(*args, **kwargs)

        return call


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
