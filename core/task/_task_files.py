"""The managed file data flow of one task execution (seed 000, "managed file data flow"): the
files a task declares are captured into the store while its action runs, restored into the new
session when it resumes (falling back to older generations when one cannot be restored), and
listed in the store as early outputs while it runs.

``TaskFiles`` is made by ``core.task._recorder.TaskRecorder`` for a task of a run whose file data
flow
is managed; the recorder keeps the file dataset and the one commit path, and hands each save to
``TaskFiles.save``, which commits it once its files are in the store.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from core._errors import StoreError
from core._records import CheckpointData, TaskRecord
from core.files import CaptureStats, FileCapture, RestoreError, RestoreResult, restore_checkpoint
from core.store import CheckpointStore
from core.task._action import STOP_KILL_MARGIN_SECONDS, StopIntent, StopState
from core.task._events import TaskEventKind

__all__ = ("TaskFiles",)


class TaskFiles:
    """One task execution's checkpoint files in a managed store. Thread-safe as
    ``FileCapture`` is (the reader thread declares and saves, the capture thread uploads).

    Args:
        store: the managed store.
        session_dir: the session working directory the files are captured from and restored to.
        warn: reports a warning (a file not captured or restored).
        emit: reports a ``TaskEvent`` kind and value (``status``: what was restored).
        on_outputs: writes the early-outputs index (path -> (content hash, bytes)); called at
            most once a second while files upload, and when the action ends.
    """

    def __init__(
        self,
        store: CheckpointStore,
        session_dir: str,
        *,
        warn: Callable[[str], None],
        emit: Callable[[TaskEventKind, Any], None],
        on_outputs: Callable[[dict[str, tuple[str, int]]], None],
    ) -> None:
        self.store = store
        self.session_dir = session_dir
        self._warn = warn
        self._emit = emit
        self._on_outputs = on_outputs
        self.capture = FileCapture(
            store.fs, session_dir, store.file_roots, warn, on_uploaded=self._uploaded
        )
        self._outputs: dict[str, tuple[str, int]] | None = None
        self._outputs_written = 0.0

    def close(self) -> CaptureStats:
        """Stop capturing; the bytes and files uploaded, and those the store already had."""
        self.capture.close()
        return self.capture.stats

    def restore(
        self, resume: CheckpointData, record: TaskRecord
    ) -> tuple[CheckpointData, RestoreResult] | None:
        """Restore the files of ``resume`` into the session; on a failure, warn and try the
        older generations of ``record``'s task still stored. The restored files are adopted
        by the capture (not uploaded again). None: nothing restorable, the task runs
        ``onRun`` from the top."""
        candidates = [resume]
        try:
            older = self.store.list_generations(record)
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
                    self.store.fs, data.manifest, self.session_dir, self.store.file_roots
                )
            except RestoreError as exc:
                self._warn(
                    f"checkpoint generation {data.generation} cannot be restored: {exc}; "
                    "trying the one before"
                )
                continue
            self._emit(
                TaskEventKind.STATUS,
                f"restored {len(result.entries)} checkpoint file(s), {result.restored_bytes:,} "
                f"bytes, of generation {data.generation} in {time.monotonic() - started:.1f} s",
            )
            declared = set(result.files)
            folders = [d.rstrip(os.sep) + os.sep for d in result.dirs]
            for target, entry in result.entries:
                output = target in declared or target.startswith(tuple(folders))
                self.capture.adopt(target, entry, output=output)
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
            self._on_outputs(outputs)

    def drain(self, stop: StopState) -> None:
        """Wait for the files being captured and the saves being committed, at most until the
        stop deadline (a cancel or a forced stop waits for none: they are abandoned, said in a
        warning); then write the early outputs as they are."""
        capture = self.capture
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
        if self._outputs:
            self._on_outputs(self._outputs)
