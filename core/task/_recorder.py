"""Record what one task reports into the store: its record, checkpoints, finished frames, the
checkpoint's file dataset, and (managed file data flow) the files captured while it runs and
restored when it resumes.

``TaskRecorder`` is the one unit that writes a task's record and checkpoints, under one lock, with
one commit path (``_commit``): a save is held as pending while a batch of output lines is read
(the latest of the batch wins), then ``flush`` commits it, at once in the shared file data flow, or
in the managed one once ``_capture.FileCapture`` has stored its files (the capture thread calls
``_commit``; saves that come faster than the store takes them are coalesced there, the last one
before an interruption always committed unless the stop deadline comes first). What a save may not
name is refused here, with a reason the task reports as a warning about the output line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from core._errors import LeaseLostError, StoreError
from core._host import FileDataFlow, host_id
from core._killpoints import kill_point
from core._messages import CheckpointFiles, CheckpointSave, FilesMode
from core._records import CheckpointData, ProcessInfo, TaskRecord
from core.files import CaptureStats, FileCapture
from core.process import ProcessIdentity
from core.store import CheckpointStore, Lease, run_file_flow
from core.task._action import StopState
from core.task._events import TaskEventKind
from core.task._history import note_committed, note_stored
from core.task._task_files import TaskFiles

__all__ = ("TaskRecorder", "TaskWrites")


class TaskWrites:
    """How one task execution's writes reach the store: each made under the task's lease
    (fencing, ``CheckpointStore.write_task``'s ``fence``), and none at all once the lease is
    lost, so that a process stalled past its lease never overwrites what the process that took
    the task over stored (docs/decisions.md, "Fencing"). Thread-safe.

    Args:
        store: where the writes go.
        fence: the task's lease (None: writes are not fenced).
        on_lost: called once, with why, when the lease is found lost.
    """

    def __init__(
        self,
        store: CheckpointStore,
        fence: Lease | None,
        on_lost: Callable[[str], None] | None,
    ) -> None:
        self.store = store
        self.fence = fence
        self._on_lost = on_lost
        self._mutex = threading.Lock()
        self.lost: str | None = None
        """Why the task's lease was lost; None while it holds. Once set, nothing is written."""

    def mark_lost(self, why: str) -> None:
        """The lease was lost (a fenced write was refused, or the lease's keeper found it
        taken): write nothing more from now on, and call ``on_lost`` once."""
        with self._mutex:
            if self.lost is not None:
                return
            self.lost = why
        if self._on_lost is not None:
            self._on_lost(why)

    def record(self, record: TaskRecord, *, durable: bool) -> None:
        """Write the task's record (``CheckpointStore.write_task``).

        Raises:
            LeaseLostError: the lease is lost (now, or earlier); nothing was written.
            StoreError: it cannot be written."""
        self._fenced(lambda: self.store.write_task(record, durable=durable, fence=self.fence))

    def checkpoint(self, record: TaskRecord, data: CheckpointData) -> None:
        """Commit a checkpoint generation (``CheckpointStore.commit_checkpoint``).

        Raises:
            LeaseLostError: the lease is lost; nothing was committed.
            StoreError: it cannot be written; the previous checkpoint stays."""
        self._fenced(lambda: self.store.commit_checkpoint(record, data, fence=self.fence))

    def outputs(self, record: TaskRecord, outputs: dict[str, tuple[str, int]]) -> None:
        """Write the task's early-outputs index (``OutputsIndex.write_outputs``).

        Raises:
            LeaseLostError: the lease is lost; nothing was written.
            StoreError: it cannot be written."""

        def write() -> None:
            if self.fence is not None:
                self.fence.confirm()
            self.store.outputs.write_outputs(record, outputs)

        self._fenced(write)

    def _fenced(self, write: Callable[[], None]) -> None:
        if self.lost is not None:
            raise LeaseLostError(self.lost)
        try:
            write()
        except LeaseLostError as exc:
            self.mark_lost(str(exc))
            raise


class TaskRecorder:
    """The store side of one task execution. Thread-safe: the reader thread records messages,
    the capture thread commits saves, the task's thread records its start and end.

    Args: ``record``, the task's record, changed in place (under ``lock``); ``store``, where
    it is written (None: nothing is stored; checkpoints stay in the record); ``attempt``, the
    run's attempt number, written into each checkpoint; ``warn`` reports a warning (a save not
    stored, a file not restored); ``emit`` a ``TaskEvent`` kind and value (``checkpoint_saved``,
    ``status``); ``fence`` and ``on_lost``: the task's lease, under which every write is
    made, and what is called once it is lost (``TaskWrites``);
    ``saves`` (``CheckpointJobTemplate.saves_of``): ``ignored`` for a task of a template that
    does not declare the CHECKPOINT extension: its saves and file declarations are refused
    (nothing of them could ever be used) and no file is captured; ``unused`` for a task of a
    step without ``onCheckpointResume`` in a CHECKPOINT template: its saves are stored (an
    author adding the action later finds them, docs/decisions.md), with one warning that a
    resume does not use them; ``stopped_at`` says when the task was first asked to stop
    (None: not yet), for its attempt span (``note_stored``)."""

    def __init__(
        self,
        record: TaskRecord,
        *,
        store: CheckpointStore | None,
        attempt: int,
        warn: Callable[[str], None],
        emit: Callable[..., None],
        fence: Lease | None = None,
        on_lost: Callable[[str], None] | None = None,
        saves: str = "resumed",
        stopped_at: Callable[[], float | None] = lambda: None,
    ) -> None:
        self.record = record
        self._stopped_at = stopped_at
        self.store = store
        self.attempt = attempt
        self._warn = warn
        self._emit = emit
        self._on_lost = on_lost
        self.writes = TaskWrites(store, fence, self._lost) if store is not None else None
        """How the record and checkpoints are written (None: nothing is stored)."""
        self.resumable = saves != "ignored"
        self._unresumable_told = False
        self._unused_told = saves != "unused"  # nothing to tell where a resume uses them
        self.lock = threading.RLock()
        """Guards ``record`` and everything below."""
        self._dirty = False
        self._pending_save: CheckpointSave | None = None
        self._save_read_at = 0.0  # when the pending save's line was read (time.monotonic())
        self._write_seconds = 0.0  # how long the last commit's durable write took
        self._saved = False  # a save was taken (pending, being stored, or committed)
        # The checkpoint's file dataset so far, as insertion-ordered sets. The record's
        # pending_files/pending_dirs are synced from them when a checkpoint is committed and
        # when the action ends, not on every message: a message costs O(its paths).
        self._files: dict[str, None] = dict.fromkeys(record.pending_files)
        self._dirs: dict[str, None] = dict.fromkeys(record.pending_dirs)
        self._dataset_changed = False
        self._save_dataset: tuple[list[str], list[str]] | None = None
        """The dataset as it was at the pending save, if a later message changed it since."""
        self._files_flow: TaskFiles | None = None
        """Managed file data flow: the task's files captured, restored and listed."""
        self._capture: FileCapture | None = None
        """Its capture (uploads declared files while the task action runs)."""
        self.file_stats = CaptureStats()
        """Managed file data flow: bytes and files uploaded, and files whose content the store
        already had, over this execution."""
        self.action_process = ActionProcessNames(self)
        """Names the task's action process in the record as it starts."""

    # --- the record -------------------------------------------------------------------------------
    def changed(self) -> None:
        """The record was changed in place: the next ``persist`` writes it."""
        self._dirty = True

    def persist(
        self, force: bool = False, *, durable: bool = True, warn: bool = True
    ) -> str | None:
        """Write the record if it changed since it was last written (or ``force``).
        ``durable=False`` is honoured only while the stored record holds no checkpoint
        (``TaskRecords.write_task``).

        Returns:
            None when the record is stored (or needed no write); else why it is not (a
            warning was given unless ``warn`` is False; for a lost lease ``on_lost`` was
            called)."""
        if self.writes is None:
            self._dirty = False
            return None
        with self.lock:
            if not (force or self._dirty or self.lost):
                return None
            try:
                self.writes.record(
                    self.record, durable=durable or self.record.checkpoint is not None
                )
                self._dirty = False
            except LeaseLostError as exc:
                return str(exc)
            except StoreError as exc:
                if warn:
                    self._warn(f"task record not stored: {exc}")
                return str(exc)
        return None

    @property
    def lost(self) -> str | None:
        """Why the task's lease was lost (nothing more is written); None while it holds."""
        return self.writes.lost if self.writes is not None else None

    def mark_lost(self, why: str) -> None:
        """The task's lease was found lost (``TaskWrites.mark_lost``). Thread-safe."""
        if self.writes is not None:
            self.writes.mark_lost(why)

    def _lost(self, why: str) -> None:
        capture = self._capture
        if capture is not None:
            capture.abandon()
        if self._on_lost is not None:
            self._on_lost(why)

    def process_ended(self, stop: StopState) -> None:
        """The task's action process ended: the files still being captured are stored (at most
        until the stop deadline) and the record no longer names a process."""
        if self._files_flow is not None:
            self._files_flow.drain(stop)
        with self.lock:
            self.record.process = None
            self._sync_dataset()
            # Written by the next persist: _finish's, as the task ends (one durable write
            # instead of two). A runner killed in between leaves the record naming a
            # process that has exited, which the next run's reaping finds gone.
            self._dirty = True

    # --- messages ---------------------------------------------------------------------------------
    def declare_files(self, event: CheckpointFiles, working_dir: str | None) -> str | None:
        """Add an ``openjd_checkpoint_files`` message to the dataset, or say why it is refused."""
        if not self.resumable:
            return self._unresumable("openjd_checkpoint_files")
        refused = _files_refusal(self._capture, event.files, event.dirs, working_dir)
        if refused is not None:
            return f"openjd_checkpoint_files names {refused}; the message was ignored"
        if self._capture is not None:
            self._capture.declare(event.files, event.dirs)
        with self.lock:
            if self._pending_save is not None and self._save_dataset is None:
                # A save waits for the end of this batch: it keeps the dataset it saw.
                self._save_dataset = (list(self._files), list(self._dirs))
            if event.mode == FilesMode.RESET:
                self._files.clear()
                self._dirs.clear()
            self._files.update(dict.fromkeys(event.files))
            self._dirs.update(dict.fromkeys(event.dirs))
            self._dataset_changed = True
        return None

    def save(self, event: CheckpointSave, working_dir: str | None, secrets: set[str]) -> str | None:
        """Make an ``openjd_checkpoint_save`` the pending save (committed by ``flush``; the
        latest of a batch wins), or say why it is refused."""
        if not self.resumable:
            return self._unresumable("openjd_checkpoint_save")
        if (
            event.state is None
            and event.file is None
            and not (self._files or self._dirs)
            and (self.record.checkpoint is not None or self._saved)
        ):
            return (
                "openjd_checkpoint_save carries no state, no file and no declared checkpoint "
                "files (openjd_checkpoint_files): it adds nothing to the checkpoint before it, "
                "which stays"
            )
        if event.file is not None and self._capture is not None:
            problem = self._capture.refusal(event.file)
            if problem is not None:
                return (
                    f"openjd_checkpoint_save names file {event.file!r}, which a managed store "
                    f"does not capture: {problem}; nothing was saved and the previous "
                    "checkpoint stays"
                )
        elif (
            event.file is not None
            and working_dir is not None
            and os.path.realpath(event.file).startswith(os.path.realpath(working_dir) + os.sep)
        ):
            return (
                f"openjd_checkpoint_save names file {event.file!r} in the session working "
                "directory, which is deleted when the task ends; nothing was saved and the "
                "previous checkpoint stays"
            )
        if event.file is not None and not os.path.exists(event.file):
            return (
                f"openjd_checkpoint_save names file {event.file!r}, which does not exist; "
                "nothing was saved and the previous checkpoint stays"
            )
        if any(s and s in (event.state or "") for s in secrets):
            return (
                "the checkpoint state holds a redacted value; nothing was saved and the "
                "previous checkpoint stays"
            )
        with self.lock:
            self._pending_save, self._save_dataset, self._saved = event, None, True
            self._save_read_at = time.monotonic()
            told, self._unused_told = self._unused_told, True
        if not told:
            self._warn(
                "openjd_checkpoint_save stored, but this step has no onCheckpointResume: a "
                "resume runs onRun from its start and does not use it (add onCheckpointResume "
                "to resume from it; said once per task)"
            )
        return None

    def _unresumable(self, kind: str) -> str | None:
        """Why a save or a file declaration of a step that is not resumable is refused: once
        per task (None after that: ignored without a word)."""
        if self._unresumable_told:
            return None
        self._unresumable_told = True
        return (
            f"{kind} ignored: not resumable: the job template does not declare the "
            "CHECKPOINT extension, so no checkpoint of its tasks could be used; nothing is "
            "stored for their saves (said once per task)"
        )

    def frame_complete(self, frame: int) -> None:
        with self.lock:
            if frame not in self.record.completed_frames:
                self.record.completed_frames.append(frame)
                self.record.completed_frames.sort()
                self._dirty = True

    def resume_status(self, status: str) -> None:
        with self.lock:
            self.record.resume_status = status
            if self.record.history and self.record.history[-1].ended_at is None:
                self.record.history[-1].resume_status = status
            self._dirty = True

    # --- the one commit path ----------------------------------------------------------------------
    def flush(self) -> None:
        """Commit the pending save, if any: now (shared file data flow), or once its files are in
        the store (managed: on the capture thread)."""
        save = self._pending_save
        if save is None:
            return
        with self.lock:
            self._pending_save = None
            read_at = self._save_read_at
            files, dirs = self._save_dataset or (list(self._files), list(self._dirs))
            self._save_dataset = None
            if self._capture is not None:

                def commit(manifest: str, file: str | None, file_bytes: int) -> None:
                    self._commit(save, file, files, dirs, manifest, read_at, file_bytes)

                self._capture.save(save.file, files, dirs, commit)
                return
        self._commit(save, save.file, files, dirs, None, read_at)

    def _commit(
        self,
        save: CheckpointSave,
        file: str | None,
        files: list[str],
        dirs: list[str],
        manifest: str | None,
        read_at: float,
        file_bytes: int | None = None,
    ) -> None:
        """Store the next checkpoint generation (the generation file, then the record).
        ``read_at``: when the save's line was read (``time.monotonic()``); the commit's
        duration (``CheckpointData.commit_seconds``) counts from there to the record's write,
        as the generation's own write cannot hold its own duration."""
        with self.lock:
            rec = self.record
            gen = (rec.checkpoint.generation if rec.checkpoint else 0) + 1
            data = CheckpointData(
                generation=gen,
                state=save.state,
                file=file,
                files=files,
                dirs=dirs,
                saved_at=time.time(),
                attempt=self.attempt,
                manifest=manifest,
                file_bytes=file_bytes,
                # to the write, plus the last commit's write: the record written with the
                # generation holds a figure near the truth if nothing writes it again
                commit_seconds=round(time.monotonic() - read_at + self._write_seconds, 6),
            )
            span_before = note_stored(rec, data, self._stopped_at())
            self._sync_dataset()
            if self.writes is not None:
                try:
                    self.writes.checkpoint(rec, data)
                except (LeaseLostError, StoreError) as exc:
                    if span_before is not None:  # not stored: the span says what it said
                        rec.history[-1] = span_before
                    if isinstance(exc, StoreError):
                        self._warn(f"checkpoint generation {gen} was not stored: {exc}")
                    return
            else:
                rec.checkpoint = data
            # to the durable write: the next record write (at the latest the end's) keeps it
            before, data.commit_seconds = data.commit_seconds, round(time.monotonic() - read_at, 6)
            note_committed(rec, span_before, before, data.commit_seconds)
            self._write_seconds = max(
                0.0, data.commit_seconds - (before or 0.0) + self._write_seconds
            )
            self._dirty = False
        self._emit(TaskEventKind.CHECKPOINT_SAVED, gen, checkpoint=data)

    def _sync_dataset(self) -> None:
        """Copy the file dataset into the record (under the lock), if it changed since."""
        if self._dataset_changed:
            self.record.pending_files = list(self._files)
            self.record.pending_dirs = list(self._dirs)
            self._dataset_changed = False
            self._dirty = True

    # --- managed files (core.task._task_files)
    # -------------------------------------------------------
    def start_capture(self, session_dir: str, job_key: str, run_id: str) -> None:
        """Capture declared files while the task action runs, if the run's file data flow is
        managed (and the step is resumable)."""
        store = self.store
        if (
            store is not None
            and self.resumable
            and run_file_flow(store, job_key, run_id) == FileDataFlow.MANAGED
        ):
            self._files_flow = TaskFiles(
                store, session_dir, warn=self._warn, emit=self._emit, on_outputs=self._outputs
            )
            self._capture = self._files_flow.capture

    @property
    def managed(self) -> bool:
        """True while files are captured (the managed file data flow)."""
        return self._capture is not None

    def resume_from(
        self, resume: CheckpointData | None, session_dir: str
    ) -> tuple[CheckpointData | None, str | None]:
        """The checkpoint the task action resumes from and its ``file``, its managed files
        restored into the session (``TaskFiles.restore``): (None, None) to run from the top,
        when there was none or none could be restored."""
        checkpoint_file = resume.file if resume is not None else None
        if resume is not None and resume.manifest:
            restored = None
            if self._files_flow is not None:
                restored = self._files_flow.restore(resume, self.record)
            else:
                self._warn(
                    f"checkpoint generation {resume.generation} keeps its files in a managed "
                    "store, and this run's files are not managed here; it runs from the top"
                )
            if restored is None:
                resume = None
            else:
                resume, result = restored
                checkpoint_file = result.file
                with self.lock:  # the dataset goes on from where the files are now
                    self._files = dict.fromkeys(result.files)
                    self._dirs = dict.fromkeys(result.dirs)
                    self._dataset_changed = True
        if resume is None and self._capture is not None:
            with self.lock:  # from the top: paths of an earlier session are gone
                self._files.clear()
                self._dirs.clear()
                self._dataset_changed = True
        return resume, checkpoint_file

    def close_capture(self) -> None:
        if self._files_flow is not None:
            self.file_stats = self._files_flow.close()
            self._files_flow = None
            self._capture = None

    def _outputs(self, outputs: dict[str, tuple[str, int]]) -> None:
        if self.writes is None:
            return
        try:
            self.writes.outputs(self.record, outputs)
        except LeaseLostError:
            pass
        except StoreError as exc:
            self._warn(f"early outputs not stored: {exc}")


def _files_refusal(
    capture: FileCapture | None,
    files: tuple[str, ...],
    dirs: tuple[str, ...],
    working_dir: str | None,
) -> str | None:
    """Why an ``openjd_checkpoint_files`` message is refused whole, or None: in managed
    mode a path the store may not capture; in shared mode a path inside the session working
    directory, which is deleted when the task ends."""
    if capture is not None:
        for path in [*files, *dirs]:
            problem = capture.refusal(path)
            if problem is not None:
                return f"{path!r}, which a managed store does not capture: {problem}"
        return None
    if working_dir is None:
        return None
    real_dir = os.path.realpath(working_dir)
    for path in [*files, *dirs]:
        real = os.path.realpath(path)
        if real == real_dir or real.startswith(real_dir + os.sep):
            return (
                f"{path!r} in the session working directory, which is deleted when the "
                "task ends (use a managed store, --files managed, to keep such files)"
            )
    return None


class ActionProcessNames:
    """Names a task's action process in its record (``TaskRecord.process``) as it starts, so
    that a runner that dies leaves it to be reaped (``core.process.kill_recorded_process``):
    once before it starts (by its marker, and by its pid where that is known already), then,
    once started, by its pid if the first write did not. Neither write is durable (unless it
    replaces a record holding a checkpoint): the pid and marker serve the reaping after the
    runner's death, which the page cache survives; a crash of the machine leaves no process to
    reap."""

    def __init__(self, recorder: TaskRecorder) -> None:
        self._recorder = recorder
        self._expected: tuple[ProcessIdentity, str] | None = None
        """The identity and marker ``starting`` recorded for the action about to start."""

    def starting(self, marker: str, expected: ProcessIdentity | None = None) -> None:
        """The task's action process marked ``marker`` is about to start: the record names it,
        with ``expected``'s pid when the process it will be is known already (a spare action
        process, ``core.process.marked_spare``; ``started`` then writes nothing if it is that
        one), else pid 0 (found by its marker alone)."""
        self._name(expected or ProcessIdentity(pid=0, pgid=0, start_time=0), marker)
        self._expected = None if expected is None else (expected, marker)

    def started(self, ident: ProcessIdentity, marker: str) -> None:
        """The task's action process started: the record names it (written now, unless
        ``starting`` wrote this very identity and marker already)."""
        kill_point("task.process-started")
        if self._expected != (ident, marker):
            self._name(ident, marker)
        self._expected = None
        kill_point("task.process-recorded")

    def _name(self, ident: ProcessIdentity, marker: str) -> None:
        recorder = self._recorder
        info = ProcessInfo(
            pid=ident.pid,
            pgid=ident.pgid,
            start_time=ident.start_time,
            host=host_id(),
            marker=marker,
        )
        with recorder.lock:
            recorder.record.process, recorder.record.host = info, info.host
        recorder.persist(force=True, durable=False)
