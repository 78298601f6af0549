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
from typing import Any

from ._action import STOP_KILL_MARGIN_SECONDS, StopIntent, StopState
from ._capture import CaptureStats, FileCapture
from ._errors import StoreError
from ._files import RestoreError
from ._host import FileDataFlow, host_id
from ._killpoints import kill_point
from ._messages import CheckpointFiles, CheckpointSave, FilesMode
from ._process import ProcessIdentity
from ._records import CheckpointData, ProcessInfo, TaskRecord
from ._restore import RestoreResult, restore_checkpoint
from ._store import CheckpointStore, run_file_flow

__all__ = ("TaskRecorder",)


class TaskRecorder:
    """The store side of one task execution. Thread-safe: the reader thread records messages,
    the capture thread commits saves, the task's thread records its start and end.

    Args: ``record``, the task's record, changed in place (under ``lock``); ``store``, where
    it is written (None: nothing is stored; checkpoints stay in the record); ``attempt``, the
    run's attempt number, written into each checkpoint; ``warn`` reports a warning (a save not
    stored, a file not restored); ``emit`` a ``TaskEvent`` kind and value (``checkpoint_saved``,
    ``status``)."""

    def __init__(
        self,
        record: TaskRecord,
        *,
        store: CheckpointStore | None,
        attempt: int,
        warn: Callable[[str], None],
        emit: Callable[[str, Any], None],
    ) -> None:
        self.record = record
        self.store = store
        self.attempt = attempt
        self._warn = warn
        self._emit = emit
        self.lock = threading.RLock()
        """Guards ``record`` and everything below."""
        self._dirty = False
        self._pending_save: CheckpointSave | None = None
        # The checkpoint's file dataset so far, as insertion-ordered sets. The record's
        # pending_files/pending_dirs are synced from them when a checkpoint is committed and
        # when the action ends, not on every message: a message costs O(its paths).
        self._files: dict[str, None] = dict.fromkeys(record.pending_files)
        self._dirs: dict[str, None] = dict.fromkeys(record.pending_dirs)
        self._dataset_changed = False
        self._save_dataset: tuple[list[str], list[str]] | None = None
        """The dataset as it was at the pending save, if a later message changed it since."""
        self._capture: FileCapture | None = None
        """Managed file data flow: uploads declared files while the task action runs."""
        self._outputs: dict[str, tuple[str, int]] | None = None
        self._outputs_written = 0.0
        self.file_stats = CaptureStats()
        """Managed file data flow: bytes and files uploaded, and files whose content the store
        already had, over this execution."""

    # --- the record -------------------------------------------------------------------------------
    def changed(self) -> None:
        """The record was changed in place: the next ``persist`` writes it."""
        self._dirty = True

    def persist(self, force: bool = False, *, durable: bool = True) -> None:
        """Write the record if it changed since it was last written (or ``force``).
        ``durable=False`` is honoured only while the stored record holds no checkpoint
        (``TaskRecords.write_task``)."""
        if self.store is None:
            self._dirty = False
            return
        with self.lock:
            if not (force or self._dirty):
                return
            try:
                self.store.write_task(
                    self.record, durable=durable or self.record.checkpoint is not None
                )
                self._dirty = False
            except StoreError as exc:
                self._warn(f"task record not stored: {exc}")

    def process_starting(self, marker: str | None) -> None:
        """A task's process with ``marker`` (None: not a task's) is about to start: the record names
        it (pid 0), so a runner that dies before ``process_started`` leaves it to be reaped."""
        if marker is not None:
            info = ProcessInfo(pid=0, pgid=0, start_time=0, host=host_id(), marker=marker)
            with self.lock:
                self.record.process, self.record.host = info, info.host
            self.persist(force=True, durable=False)

    def process_started(self, ident: ProcessIdentity, marker: str) -> None:
        """The task's action process started: its record names it (written now)."""
        kill_point("task.process-started")
        with self.lock:
            self.record.process = ProcessInfo(
                pid=ident.pid,
                pgid=ident.pgid,
                start_time=ident.start_time,
                host=host_id(),
                marker=marker,
            )
        # Not durable (unless it replaces a record holding a checkpoint): the pid and marker
        # serve the reaping after the runner's death, which the page cache survives; a crash of
        # the machine leaves no process to reap.
        self.persist(force=True, durable=False)
        kill_point("task.process-recorded")

    def process_ended(self, stop: StopState) -> None:
        """The task's action process ended: the files still being captured are stored (at most
        until the stop deadline) and the record no longer names a process."""
        self._drain_capture(stop)
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
        refused = self._files_refusal(event.files, event.dirs, working_dir)
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
            self._pending_save = event
            self._save_dataset = None
        return None

    def frame_complete(self, frame: int) -> None:
        with self.lock:
            if frame not in self.record.completed_frames:
                self.record.completed_frames.append(frame)
                self.record.completed_frames.sort()
                self._dirty = True

    def resume_status(self, status: str) -> None:
        with self.lock:
            self.record.resume_status = status
            self._dirty = True

    def _files_refusal(
        self, files: tuple[str, ...], dirs: tuple[str, ...], working_dir: str | None
    ) -> str | None:
        """Why an ``openjd_checkpoint_files`` message is refused whole, or None: in managed
        mode a path the store may not capture; in shared mode a path inside the session working
        directory, which is deleted when the task ends."""
        if self._capture is not None:
            for path in [*files, *dirs]:
                problem = self._capture.refusal(path)
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

    # --- the one commit path ----------------------------------------------------------------------
    def flush(self) -> None:
        """Commit the pending save, if any: now (shared file data flow), or once its files are in
        the store (managed: on the capture thread)."""
        save = self._pending_save
        if save is None:
            return
        with self.lock:
            self._pending_save = None
            files, dirs = self._save_dataset or (list(self._files), list(self._dirs))
            self._save_dataset = None
            if self._capture is not None:

                def commit(manifest: str, file: str | None, file_bytes: int) -> None:
                    self._commit(save, file, files, dirs, manifest, file_bytes)

                self._capture.save(save.file, files, dirs, commit)
                return
        self._commit(save, save.file, files, dirs, None)

    def _commit(
        self,
        save: CheckpointSave,
        file: str | None,
        files: list[str],
        dirs: list[str],
        manifest: str | None,
        file_bytes: int | None = None,
    ) -> None:
        """Store the next checkpoint generation (the generation file, then the record)."""
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
            )
            self._sync_dataset()
            if self.store is not None:
                try:
                    self.store.commit_checkpoint(rec, data)
                except StoreError as exc:
                    self._warn(f"checkpoint generation {gen} was not stored: {exc}")
                    return
            else:
                rec.checkpoint = data
            self._dirty = False
        self._emit("checkpoint_saved", gen)

    def _sync_dataset(self) -> None:
        """Copy the file dataset into the record (under the lock), if it changed since."""
        if self._dataset_changed:
            self.record.pending_files = list(self._files)
            self.record.pending_dirs = list(self._dirs)
            self._dataset_changed = False
            self._dirty = True

    # --- managed files ----------------------------------------------------------------------------
    def start_capture(self, session_dir: str, job_key: str, run_id: str) -> None:
        """Capture declared files while the task action runs, if the run's file data flow is
        managed."""
        store = self.store
        if store is not None and run_file_flow(store, job_key, run_id) == FileDataFlow.MANAGED:
            self._capture = FileCapture(
                store, session_dir, store.file_roots, self._warn, on_uploaded=self._uploaded
            )

    @property
    def managed(self) -> bool:
        """True while files are captured (the managed file data flow)."""
        return self._capture is not None

    def resume_from(
        self, resume: CheckpointData | None, session_dir: str
    ) -> tuple[CheckpointData | None, str | None]:
        """The checkpoint the task action resumes from and its ``file``, its managed files
        restored into the session (``restore``): (None, None) to run from the top, when there
        was none or none could be restored."""
        checkpoint_file = resume.file if resume is not None else None
        if resume is not None and resume.manifest:
            restored = self.restore(resume, session_dir)
            if restored is None:
                resume = None
            else:
                resume, result = restored
                checkpoint_file = result.file
        if resume is None and self._capture is not None:
            with self.lock:  # from the top: paths of an earlier session are gone
                self._files.clear()
                self._dirs.clear()
                self._dataset_changed = True
        return resume, checkpoint_file

    def close_capture(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self.file_stats = self._capture.stats
            self._capture = None

    def restore(
        self, resume: CheckpointData, session_dir: str
    ) -> tuple[CheckpointData, RestoreResult] | None:
        """Restore the files of ``resume`` (managed file data flow) into the session; on a
        failure, warn and try the older generations still stored. None: nothing restorable,
        the task runs ``onRun`` from the top."""
        assert self.store is not None
        candidates = [resume]
        try:
            older = self.store.list_generations(self.record)
        except StoreError:
            older = []
        candidates += sorted(
            (g for g in older if g.generation < resume.generation), key=lambda g: -g.generation
        )
        for data in candidates:
            if not data.manifest:
                return data, RestoreResult(
                    file=data.file, files=data.files, dirs=data.dirs, entries=[]
                )
            started = time.monotonic()
            try:
                result = restore_checkpoint(
                    self.store, data.manifest, session_dir, self.store.file_roots
                )
            except RestoreError as exc:
                self._warn(
                    f"checkpoint generation {data.generation} cannot be restored: {exc}; "
                    "trying the one before"
                )
                continue
            self._emit(
                "status",
                f"restored {len(result.entries)} checkpoint file(s), {result.restored_bytes:,} "
                f"bytes, of generation {data.generation} in {time.monotonic() - started:.1f} s",
            )
            with self.lock:
                # The dataset goes on from where the files are now.
                self._files = dict.fromkeys(result.files)
                self._dirs = dict.fromkeys(result.dirs)
                self._dataset_changed = True
            if self._capture is not None:
                declared = set(result.files)
                folders = [d.rstrip(os.sep) + os.sep for d in result.dirs]
                for target, entry in result.entries:
                    output = target in declared or target.startswith(tuple(folders))
                    self._capture.adopt(target, entry, output=output)
            return data, result
        self._warn(
            "no stored checkpoint generation of this task could be restored; it runs from the top"
        )
        return None

    def _uploaded(self, outputs: dict[str, tuple[str, int]]) -> None:
        """Early outputs: the files declared so far, in the store while the task runs (written
        at most once a second, and when the action ends)."""
        self._outputs = outputs
        now = time.monotonic()
        if now - self._outputs_written >= 1.0:
            self._outputs_written = now
            self._write_outputs()

    def _write_outputs(self) -> None:
        if self.store is None or not self._outputs:
            return
        try:
            self.store.write_outputs(self.record, self._outputs)
        except StoreError as exc:
            self._warn(f"early outputs not stored: {exc}")

    def _drain_capture(self, stop: StopState) -> None:
        """Wait for the files being captured and the saves being committed, at most until the
        stop deadline."""
        capture = self._capture
        if capture is None:
            return
        while not capture.drain(0.1):
            deadline = stop.deadline
            if (
                stop.intent == StopIntent.CANCEL
                or stop.force
                or (deadline is not None and time.time() >= deadline - STOP_KILL_MARGIN_SECONDS)
            ):
                capture.abandon()
                why = (
                    "the task was canceled"
                    if stop.intent == StopIntent.CANCEL
                    else "the task was stopped at once"
                    if stop.force
                    else "the stop deadline came"
                )
                self._warn(
                    f"{why} before every checkpoint file was stored: the saves still uploading "
                    "were not committed, the previous generation stays"
                )
                break
        self._write_outputs()
