"""Checkpoint store: versioned JSON records of runs, tasks and checkpoint generations.

``CheckpointStore`` is the one object the rest of core uses for storage. It is made of layers,
each standing only on the ones below it:

- ``core.fs._storefs.StoreFS`` (``store.fs``): the fsspec file system confined to the store's root
  (local, ``s3://``, ``gs://``, ``memory://``, ...: one backend each, ``core.fs._registry``),
  atomic writes, conditional writes and their probe; the content-addressed files
  (``core.files._blobs``) stand on it too;
- ``core.store._layout``: the names of runs, tasks and their files (``store.layout``);
- ``core.store._record_io``: records read with their checks (an unreadable one is moved aside to
  ``<name>.unreadable-<time>`` and reported, never overwritten) and written atomically;
- ``core.store._lease``: leases (the right to run a run, a task or a session) and the run's and
job's
  locks, on each kind of store;
- ``core.store._task_records`` (task records and checkpoint generations) and
``core.store._logs_index``
  (task output logs, the early-outputs index), to which this class hands its methods on;
  ``core.store._run_removal`` (``store.removal``): a run marked as being deleted, then removed.

This class itself keeps runs, stop requests and sessions, and takes their leases and locks.

Implements the storage side of the CHECKPOINT RFC idea (seed 000: "each save supersedes the
previous one"; a scheduler "could offer a history of checkpoints") and Trax's "a run that
completes deletes its checkpoints" (seed 001).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import platformdirs
import psutil

from core._errors import StoreError
from core._host import FileDataFlow, file_flow_from_env, file_roots_from_env, host_id
from core._records import (
    RUN_SCHEMA_VERSION,
    CheckpointData,
    ProcessInfo,
    RunRecord,
    StopRequest,
    TaskRecord,
)
from core.fs import MAX_RECORD_BYTES, StoreFS, os_reason, redact_location
from core.store._layout import Layout, is_job_key, is_run_id, new_run_id, task_id_for
from core.store._lease import (
    LEASE_SECONDS_ENV,
    HeldLease,
    Lease,
    hold_lock,
    lease_seconds_setting,
    read_holder,
    take_lease,
    this_process,
)
from core.store._logs_index import OutputsIndex, RunLogs
from core.store._record_io import RecordFiles, RunSetAside, SetAsideError, TaskRebuilt
from core.store._run_removal import (
    RunBeingDeleted,
    RunRemoval,
    being_deleted_words,
    deleting_run_id,
)
from core.store._session_records import SessionRecords
from core.store._task_records import TaskRecords

__all__ = (
    "MAX_RECORD_BYTES",
    "CheckpointStore",
    "Lease",
    "RunSetAside",
    "TaskRebuilt",
    "default_store_location",
    "describe_holder",
    "host_id",
    "is_run_id",
    "new_run_id",
    "redact_location",
    "run_file_flow",
    "run_files_mode",
    "task_id_for",
    "this_process",
)

DEFAULT_KEEP_GENERATIONS = 3
"""How many checkpoint generations of each task the store keeps."""


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
    out (``store.lease_seconds`` after its last renewal, ``$OPENJD_CHECKPOINT_LEASE_SECONDS``)."""
    if info is None:
        return ""
    text = f" by process {info.pid}"
    if info.host == host_id() and not store.is_local and not psutil.pid_exists(info.pid):
        text += (
            f", which has ended: its lease on this store frees {store.lease_seconds:g} s after "
            f"its last renewal (${LEASE_SECONDS_ENV}); try again then"
        )
    return text


def _refuse_roots_around(root_dir: str, location: str, file_roots: Iterable[str]) -> None:
    """A file root that holds the (local) store, or lies inside it, would let a restore
    write over the store's own records with a checkpoint's copies of them.

    Raises:
        StoreError: naming the root and the store.
    """
    store = os.path.realpath(root_dir)
    for root in file_roots:
        real = os.path.realpath(root)
        if os.path.commonpath([store, real]) in (store, real):
            raise StoreError(
                f"file root {root!r} and the checkpoint store {location!r} overlap "
                "(one holds the other): a restore could write over the store's records; "
                "use folders beside each other"
            )


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
            ``$OPENJD_CHECKPOINT_FILES``, else ``shared``; see ``core.files._blobs``).
        file_roots: absolute folders whose files a managed store may capture and restore,
            besides the session working directory (added to ``$OPENJD_CHECKPOINT_FILE_ROOTS``).
        lease_seconds: the ttl of its leases, in seconds, on stores other than a local folder:
            a dead holder's lease frees that long after its last renewal (default:
            ``$OPENJD_CHECKPOINT_LEASE_SECONDS``, else 60; ``core.store._lease``).

    Raises:
        StoreError: the location cannot be used.
        SettingError: (a ``StoreError`` and a ``ValueError``) ``lease_seconds`` (or its
            variable) is not a number from 1 to 86400.
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
        lease_seconds: float | None = None,
    ) -> None:
        self.read_only = read_only
        self.lease_seconds = lease_seconds_setting(lease_seconds)

        self.file_flow = file_flow_from_env(files)
        self._run_flows: dict[tuple[str, str], FileDataFlow] = {}
        self._member_leases: dict[tuple[str, str], bool] = {}
        """Per run: are its task leases members (``_task_leases_are_members``)."""
        self.file_roots = file_roots_from_env(file_roots)
        loc = str(location) if location is not None else default_store_location()
        if not loc.strip():
            raise StoreError("the checkpoint store location is empty")
        if keep_generations < 1:
            raise StoreError("keep_generations must be 1 or more")
        self.keep_generations = keep_generations
        self.fs = StoreFS(loc)
        """The store's file system, confined to its root (``fs.backend``: its kind's
        ``ObjectBackend``; ``fs.fsspec``: the fsspec one)."""
        self.url = self.fs.url
        """The location as given. It may hold credentials: show ``location`` instead."""
        self.location = self.fs.location
        """The location to show: ``url`` with any credentials in it replaced by ``***``."""
        self.root = self.fs.root
        self.is_local = self.fs.is_local
        self.layout = Layout(self.root, self.location)
        self.records = RecordFiles(self.fs, read_only=read_only)
        self.tasks = TaskRecords(self.records, self.layout, keep_generations=keep_generations)
        self.logs = RunLogs(self.fs, self.layout)
        """The runs' task output logs (``core.store._logs_index.RunLogs``)."""
        self.outputs = OutputsIndex(self.fs, self.layout)
        """The early-outputs index of each task's declared files (``OutputsIndex``)."""
        self.sessions = SessionRecords(self.records, self.layout, lease_seconds=self.lease_seconds)
        """The records of the runs' open sessions and their leases (``SessionRecords``)."""
        self.removal = RunRemoval(self.fs, self.layout, self.records)
        """Runs being deleted: marked first, then removed (``RunRemoval``)."""
        if self.is_local and not read_only:
            _refuse_roots_around(self.root, self.location, self.file_roots)
        if create:
            self.fs.make_root()

    # --- runs ----------------------------------------------------------------------------------
    def write_run(self, record: RunRecord, *, fence: Lease | None = None) -> None:
        """Write a run's record (atomically replacing the previous one). ``fence``: the run's
        lease, when the writer drives the run (the CLI): confirmed first, so that a runner
        that lost its lease to another (``LeaseLostError``) writes nothing. A run's record is
        also written by other processes (stop requests, notices), under ``run_lock``."""
        if fence is not None:
            fence.confirm()
        record.updated_at = time.time()
        self.records.write(
            self.layout.run_path(record.job_key, record.run_id), record.model_dump(mode="json")
        )

    def read_run(self, job_key: str, run_id: str, *, deleting: bool = False) -> RunRecord | None:
        """The run's record, None if there is none or the run is being deleted (unless
        ``deleting``: ``RunRecord.deleting``). Raises StoreError if it is unreadable."""
        rec: RunRecord | None = self.records.read(self.layout.run_path(job_key, run_id), RunRecord)
        if rec is not None:  # its version says how its task leases are held (never changes)
            self._member_leases[(job_key, run_id)] = rec.schema_version >= RUN_SCHEMA_VERSION
        return None if rec is not None and rec.deleting and not deleting else rec

    def list_runs(self, job_key: str | None = None) -> tuple[list[RunRecord], list[str]]:
        """All readable run records (oldest first), and a warning for each unreadable one and
        each run being deleted (``RunBeingDeleted``: no longer listed)."""
        runs: list[RunRecord] = []
        warnings: list[str] = []
        keys = [job_key] if job_key else self.fs.list_names(self.layout.jobs_dir)
        for key in keys:
            if not is_job_key(key):
                continue
            try:
                run_ids = self.fs.list_names(self.layout.runs_dir(key))
            except StoreError as exc:
                warnings.append(str(exc))
                continue
            for run_id in run_ids:
                deleting = deleting_run_id(run_id)  # a local store's folder being deleted
                if deleting is not None:
                    warnings.append(RunBeingDeleted(being_deleted_words(deleting)))
                if not is_run_id(run_id):
                    continue
                try:
                    rec = self.read_run(key, run_id, deleting=True)
                except SetAsideError as exc:
                    warnings.append(RunSetAside.of(exc, run_id, self.layout.run_dir(key, run_id)))
                    continue
                except StoreError as exc:
                    warnings.append(str(exc))
                    continue
                if rec is not None and rec.deleting:
                    warnings.append(RunBeingDeleted(being_deleted_words(run_id)))
                elif rec is not None:
                    runs.append(rec)
        runs.sort(key=lambda r: (r.created_at, r.run_id))
        return runs, warnings

    def find_run(self, run_id: str, *, among: Sequence[RunRecord] = ()) -> RunRecord | None:
        """A run by its id alone (any job); None if there is none (or the id is malformed).
        ``among``: records the caller has read already (``list_runs``), looked at first: the
        store is read only for a run not among them.

        Raises:
            StoreError: the run's record cannot be read (``SetAsideError``: it was set aside),
                and no job has a readable record of that id.
        """
        for known in among:
            if known.run_id == run_id:
                return known
        if not is_run_id(run_id):
            return None
        unreadable: StoreError | None = None
        for key in self.fs.list_names(self.layout.jobs_dir):
            if not is_job_key(key):
                continue
            try:
                rec = self.read_run(key, run_id)
            except StoreError as exc:  # a damaged copy under another job hides no readable run
                unreadable = unreadable or exc
                continue
            if rec is not None:
                return rec
        if unreadable is not None:
            raise unreadable
        return None

    def delete_checkpoints(self, run: RunRecord) -> None:
        """Delete a run's task records and checkpoints, keeping its run record (the tombstone
        that tells a later resume the run already completed)."""
        path = self.layout.in_run(run.job_key, run.run_id, "tasks")
        try:
            names = self.fs.list_names(path)  # (unreadable records: kept for a person)
            self.fs.remove_files(path, [n for n in names if ".unreadable-" not in n])
        except OSError as exc:
            raise StoreError(f"cannot delete {self.fs.where(path)}: {os_reason(exc)}") from None

    # --- concurrent updates, stop requests and leases -------------------------------------------
    @contextlib.contextmanager
    def run_lock(self, job_key: str, run_id: str, *, timeout: float = 30.0) -> Iterator[None]:
        """Hold the run's record lock while reading and rewriting ``run.json`` or accepting a
        stop request, so that concurrent writers lose nothing.

        ``run.lock``: see ``core.store._lease.hold_lock`` for what it is on each kind of store. On a
        local store a run with no folder (not made yet, under the job's lock; or deleted) is not
        locked: its lock file would make a folder without a record.

        Raises:
            StoreError: the lock was not had within ``timeout`` seconds.
        """
        path = self.layout.run_lock(job_key, run_id)
        if self.is_local and not os.path.isdir(self.fs.confined(posixpath.dirname(path))):
            yield
            return
        with hold_lock(self.fs, path, timeout):
            yield

    def update_run(
        self, job_key: str, run_id: str, *, fence: Lease | None = None, **changes: Any
    ) -> RunRecord:
        """Set some fields of a run record, keeping every other field as stored now: read,
        change and write under ``run_lock`` (``fence``: see ``write_run``). Returns the
        record as written.

        Raises:
            StoreError: the run has no record, or it cannot be read or written.
            LeaseLostError: ``fence`` was lost; nothing was written.
        """
        with self.run_lock(job_key, run_id):
            current = self.read_run(job_key, run_id)
            if current is None:
                raise StoreError(f"checkpoint store {self.location!r}: no run {run_id!r}")
            for name, value in changes.items():
                setattr(current, name, value)
            self.write_run(current, fence=fence)
            return current

    def add_stop_request(self, run: RunRecord, request: StopRequest) -> None:
        """Append a stop request (a new file; never replaces another request)."""
        name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
        path = posixpath.join(self.layout.in_run(run.job_key, run.run_id, "requests"), name)
        self.records.write(path, request.model_dump(mode="json"))

    def read_stop_requests(self, job_key: str, run_id: str) -> list[StopRequest]:
        """Every readable stop request of a run, in the order they were made."""
        directory = self.layout.in_run(job_key, run_id, "requests")
        out: list[StopRequest] = []
        for name in self.fs.list_names(directory):
            if not name.endswith(".json") or name.startswith(".tmp-"):
                continue
            try:
                req = self.records.read(posixpath.join(directory, name), StopRequest)
            except StoreError:
                continue  # moved aside and kept; an unreadable request stops nothing
            if req is not None:
                out.append(req)
        return out

    def acquire_lease(self, run: RunRecord, *, ttl_seconds: float | None = None) -> Lease | None:
        """Take the run's lease, or return None if another live owner holds it.

        On a local store the lease is an exclusive ``flock`` on ``lease.lock`` in the run's
        directory: the kernel releases it when its owner dies, however it dies. Elsewhere it is
        a ``lease.lease.json`` with a ttl that its owner's process renews on its own (``Lease``);
        an expired lease may be taken over: exactly one taker wins on S3 (conditional writes)
        and in one process on ``memory://``; on other stores it is best effort. The ttl is
        ``lease_seconds`` unless ``ttl_seconds`` says otherwise."""
        return self.acquire_run_lease(run.job_key, run.run_id, ttl_seconds=ttl_seconds)

    def acquire_run_lease(
        self, job_key: str, run_id: str, *, ttl_seconds: float | None = None
    ) -> Lease | None:
        """``acquire_lease`` of a run named by its job key and id (a run whose record cannot
        be read: ``core.run._delete.delete_set_aside_run``)."""
        base = self.layout.run_lease(job_key, run_id)
        return take_lease(self.fs, base, self._ttl(ttl_seconds))

    def _ttl(self, ttl_seconds: float | None) -> float:
        return self.lease_seconds if ttl_seconds is None else ttl_seconds

    def acquire_task_lease(
        self,
        job_key: str,
        run_id: str,
        step: str,
        task_key: str,
        *,
        ttl_seconds: float | None = None,
        wait_seconds: float = 0.0,
    ) -> Lease | None:
        """Take the lease of one task of a run (the right to run it now), or return None if a
        live holder has it. Same mechanism as ``acquire_lease``: a dead holder loses it at once
        on a local store, after its ttl elsewhere."""
        base = self._task_lease_base(job_key, run_id, step, task_key)
        member = task_leases_are_members(self, job_key, run_id)
        return take_lease(self.fs, base, self._ttl(ttl_seconds), wait_seconds, member=member)

    def prepare_task_lease(self, job_key: str, run_id: str, step: str, task_key: str) -> None:
        """Make ahead what taking the task's lease and writing its first record will need
        (``LeaseFiles.prepare``: a local lock file; ``StoreFS.prepare_replace``: a local spare
        file beside it), off the path of the task that takes it. Best effort: never raises."""
        try:
            base = self._task_lease_base(job_key, run_id, step, task_key)
            leases = self.fs.leases()
            member = task_leases_are_members(self, job_key, run_id)
            path = self.fs.confined(leases.member(base) if member else base + leases.suffix)
            leases.prepare(path)
            self.fs.prepare_replace(posixpath.dirname(path))
        except (OSError, StoreError):
            pass  # the take does it, or says why it cannot

    def _task_lease_base(self, job_key: str, run_id: str, step: str, task_key: str) -> str:
        tid = task_id_for(step, task_key)
        return posixpath.join(self.layout.in_run(job_key, run_id, "tasks"), tid)

    def task_lease_holder(
        self, job_key: str, run_id: str, step: str, task_key: str
    ) -> HeldLease | None:
        """Who holds the task's lease and its ttl, on a store whose leases have one (None on a
        local folder or ``memory://``, or if no lease object is there): ``core.store._lease``."""
        return read_holder(self.fs, self._task_lease_base(job_key, run_id, step, task_key))

    def task_lease_held(self, job_key: str, run_id: str, step: str, task_key: str) -> bool:
        """True if a live holder has the task's lease (probes without keeping it)."""
        return _held(self.acquire_task_lease(job_key, run_id, step, task_key))

    @contextlib.contextmanager
    def job_lock(self, job_key: str, *, timeout: float = 30.0) -> Iterator[None]:
        """Hold the job's lock while choosing or creating the run a new attempt works on, so
        that two processes starting the same job at once cannot both start it.

        ``jobs/<job_key>/job.lock``: see ``core.store._lease.hold_lock`` for what it is on each kind
        of store.

        Raises:
            StoreError: the lock was not had within ``timeout`` seconds.
        """
        with hold_lock(self.fs, self.layout.job_lock(job_key), timeout):
            yield

    def lease_held(self, run: RunRecord) -> bool:
        """True if a live owner holds the run's lease (probes without keeping it)."""
        return _held(self.acquire_lease(run))

    # --- tasks (core.store._task_records)
    # --------------------------------------------------------------
    def write_task(
        self, record: TaskRecord, *, durable: bool = True, fence: Lease | None = None
    ) -> None:
        """Write a task's latest record (atomically replacing the previous one;
        ``TaskRecords.write_task`` says when it need not be ``durable``, and what ``fence``,
        the task's lease, does: raises ``LeaseLostError`` once it is lost)."""
        self.tasks.write_task(record, durable=durable, fence=fence)

    def fence_task(self, lease: Lease, job_key: str, run_id: str, step: str, task_key: str) -> None:
        """Note, in the task's just taken ``lease``, the version of the task's record that its
        holder's fenced writes are conditional on (a store with conditional writes: one read;
        elsewhere nothing). Call it before reading the record.

        Raises:
            StoreError: the store cannot be read."""
        path = self.layout.task_path(job_key, run_id, task_id_for(step, task_key))
        self.fs.note_version(lease, path)

    def read_task(
        self,
        job_key: str,
        run_id: str,
        step: str,
        task_key: str,
        warnings: list[str] | None = None,
    ) -> TaskRecord | None:
        """One task's latest record, None if it has none (``TaskRecords.read_task``: a damaged
        record is rebuilt from the task's newest readable checkpoint generation)."""
        return self.tasks.read_task(job_key, run_id, step, task_key, warnings)

    def delete_task(self, record: TaskRecord) -> None:
        """Delete a task's record and its checkpoint generations."""
        self.tasks.delete_task(record)

    def commit_checkpoint(
        self, record: TaskRecord, checkpoint: CheckpointData, *, fence: Lease | None = None
    ) -> None:
        """Store a new checkpoint generation, then the task record that points at it (one
        durable write: ``TaskRecords.commit_checkpoint``; ``fence``: the task's lease)."""
        self.tasks.commit_checkpoint(record, checkpoint, fence=fence)

    def read_tasks(self, job_key: str, run_id: str) -> tuple[list[TaskRecord], list[str]]:
        """Every readable task record of a run, and a warning for each unreadable one."""
        return self.tasks.read_tasks(job_key, run_id)

    def iter_tasks(
        self, job_key: str, run_id: str, warnings: list[str] | None = None
    ) -> Iterator[TaskRecord]:
        """``read_tasks``, one record at a time (``TaskRecords.iter_tasks``)."""
        return self.tasks.iter_tasks(job_key, run_id, warnings)

    def read_task_family(
        self, job_key: str, run_id: str, step: str, task_keys: Iterable[str]
    ) -> tuple[list[TaskRecord], list[str]]:
        """The records of the given original tasks of a step and of their chunk remainder
        pieces (``TaskRecords.read_task_family``)."""
        return self.tasks.read_task_family(job_key, run_id, step, task_keys)

    def list_generations(
        self, record: TaskRecord, latest: int | None = None
    ) -> list[CheckpointData]:
        """The stored checkpoint generations of a task, oldest first (``latest``: only that
        many of the newest are read)."""
        return self.tasks.list_generations(record, latest)

    def list_generations_of(
        self, records: Sequence[TaskRecord], latest: int | None = None
    ) -> list[list[CheckpointData]]:
        """``list_generations`` of each of ``records``, in order, each run's folder listed once
        (``TaskRecords.list_generations_of``)."""
        return self.tasks.list_generations_of(records, latest)


def run_files_mode(store: CheckpointStore, run: RunRecord) -> str:
    """How ``run`` keeps its checkpoint files, ``shared`` or ``managed``: as fixed when it was
    created (``RunRecord.files_mode``); for a run made before that field, the store's setting
    (``CheckpointStore.file_flow``). Every task of the run shows it, saved or not
    (``core.summarize_task``)."""
    return run.files_mode or store.file_flow.value


def _held(lease: Lease | None) -> bool:
    """True if a probe found the lease held (None); else lets the probe's lease go."""
    if lease is None:
        return True
    lease.release()
    return False


def task_leases_are_members(store: CheckpointStore, job_key: str, run_id: str) -> bool:
    """True when the run's task leases are members of its tasks folder (``LeaseFiles.member``:
    a run record of version 2, ``RUN_SCHEMA_VERSION``), False for a version 1 run's lease
    files of their own, or a run without a record. Read once per run and kept on the store (a
    run's version never changes).

    Raises:
        StoreError: the run's record cannot be read."""
    if (job_key, run_id) not in store._member_leases:
        store.read_run(job_key, run_id, deleting=True)  # which keeps what its version says
    return store._member_leases.get((job_key, run_id), False)


def run_file_flow(store: CheckpointStore, job_key: str, run_id: str) -> FileDataFlow:
    """The run's own file data flow (``run_files_mode``; read once per run and kept on the
    store), else, when its record cannot be read, the store's (``CheckpointStore.file_flow``)."""
    flow = store._run_flows.get((job_key, run_id))
    if flow is None:
        try:
            run = store.read_run(job_key, run_id)
            flow = FileDataFlow(run_files_mode(store, run)) if run else store.file_flow
        except (StoreError, ValueError):
            return store.file_flow
        if run is not None:  # a run's flow never changes once recorded
            store._run_flows[(job_key, run_id)] = flow
    return flow
