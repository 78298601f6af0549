"""What a task instance shows of its group beyond its log lines: the checkpoint summary in the
task state store (``checkpoint_summary``, written by ``StateStoreWriter`` from a thread of its
own), and the end of its try in the log (``GroupReport``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import core

from ._config import STATE_STORE_KEY

__all__ = ("GroupReport", "StateStoreWriter", "checkpoint_summary")


def checkpoint_summary(
    attempt: core.Attempt,
    records: Sequence[core.TaskRecord],
    labels: Sequence[str],
    files_mode: str | None = None,
) -> dict[str, Any]:
    """What the task state store keeps for one task instance: per OpenJD task, its status and
    latest checkpoint's generation, time, state size and files, and ``files_mode`` (``managed``
    when the store keeps the files: the checkpoint's, else the run's, ``files_mode`` given, as
    ``checkpoints show`` says); never the state itself (it may hold anything) nor environment
    values."""
    tasks = []
    for rec, label in zip(records, labels, strict=False):
        task = core.report.summarize_task(rec, files_mode)
        ckpt = task.checkpoint
        tasks.append(
            {
                "label": label,
                "status": task.status,
                "generation": ckpt.generation if ckpt else None,
                "saved_at": ckpt.saved_at if ckpt else None,
                "state_bytes": ckpt.state_bytes if ckpt else 0,
                "files": list(ckpt.files[:20]) if ckpt else [],
                "files_mode": task.files_mode,
                "frames_done": len(task.frames_done),
                "resume_status": task.resume_status,
            }
        )
    return {
        "run_id": attempt.run_id,
        "job_key": attempt.job_key,
        "attempt": attempt.attempt,
        "updated_at": time.time(),
        "tasks": tasks,
    }


class StateStoreWriter:
    """Writes the latest summary to the task state store from a thread of its own, so that the
    reader thread never waits on the API server and the main thread (where the SIGTERM handler
    runs) never holds the supervisor's comms lock."""

    def __init__(self, accessor: Any, log: Any) -> None:
        self._accessor = accessor
        self._log = log
        self._cond = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._busy = False
        self._closed = False
        self.errors: list[str] = []
        self.used = False
        """True once a summary was handed over (the thread starts then)."""
        self._thread = threading.Thread(target=self._loop, name="openjd-state-store", daemon=True)

    def put(self, value: dict[str, Any]) -> None:
        if self._accessor is None:
            return
        with self._cond:
            if self._closed:
                return
            self._pending = value
            if not self.used:
                self.used = True
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> None:
        if self._accessor is None:
            return
        deadline = time.monotonic() + timeout
        with self._cond:
            while (self._pending is not None or self._busy) and time.monotonic() < deadline:
                self._cond.wait(0.1)

    def close(self, timeout: float = 10.0) -> None:
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                value, self._pending, self._busy = self._pending, None, True
            try:
                self._accessor.set(STATE_STORE_KEY, value)
            except Exception as exc:  # 404 after a clear: the instance's id is gone
                if len(self.errors) < 5:
                    self.errors.append(str(exc))
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


class GroupReport:
    """The summary of one task instance's group (``checkpoint_summary``), kept up to date in the
    task state store as its tasks report, and the end of the try in the task log.

    Args:
        store / attempt: where the group's task records are.
        originals: the group's original tasks (``group_tasks``'s item).
        accessor: the task state store (``context["task_state_store"]``; None: none).
        log: the operator's logger.
        try_number: the task instance's try (a first try writes only once there is something
            to show).
    """

    def __init__(
        self,
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: Sequence[core.TaskSpec],
        accessor: Any,
        log: Any,
        try_number: int,
    ) -> None:
        self.store = store
        self.attempt = attempt
        self.originals = list(originals)
        self.labels = [s.label for s in originals]
        self.log = log
        self.try_number = try_number
        self.writer = StateStoreWriter(accessor, log)

    def write(self, *, final: bool = False) -> None:
        """Hand the group's checkpoint summary to the writer. The ``final`` one is left out
        when it has nothing to show (no checkpoint, finished frame or resume status) and
        nothing was written for this task instance before: in this try (``writer.used``) or
        an earlier one (entries outlive tries, so a later try always writes, replacing it)."""
        attempt = self.attempt
        records = []
        shown = []
        for spec, label in zip(self.originals, self.labels, strict=True):
            try:
                rec = self.store.read_task(
                    attempt.job_key, attempt.run_id, spec.step_name, spec.task_key
                )
            except core.StoreError:
                rec = None
            if rec is not None:
                records.append(rec)
                shown.append(label)
        files_mode = core.run_file_flow(self.store, attempt.job_key, attempt.run_id).value
        summary = checkpoint_summary(attempt, records, shown, files_mode)
        if final and not self.writer.used and self.try_number == 1:
            if not any(
                t["generation"] is not None or t["frames_done"] or t["resume_status"]
                for t in summary["tasks"]
            ):
                return
        self.writer.put(summary)

    def close(self) -> None:
        """No summary more (nothing was run)."""
        self.writer.close()

    def end(
        self,
        specs: Sequence[core.TaskSpec],
        results: Sequence[core.TaskResult],
        *,
        killed_at: float | None,
        kill_budget_seconds: float,
    ) -> None:
        """Log how each task ended (and, after ``on_kill``, how long after the stop was asked
        each checkpoint was stored), write the final summary and close the writer (quicker
        after ``on_kill``: SIGKILL comes 5 s after SIGTERM)."""
        label_of = {s.task_key: s.label for s in specs}
        for r in results:
            rec = r.record
            ck = rec.checkpoint
            stopped = r.outcome.stopped  # the core's words say what it kept
            self.log.info(
                "%s: %s%s%s",
                label_of.get(rec.task_key, f"{rec.step} {rec.task_key}"),
                core.report.result_words(r),
                f" (exit code {r.exit_code})" if r.exit_code is not None else "",
                f"; checkpoint generation {ck.generation}" if ck and not stopped else "",
            )
            if r.message and not stopped:
                self.log.info("  %s", r.message)
        if killed_at is not None:
            for r in results:
                ck = r.record.checkpoint
                if ck is not None and ck.saved_at >= killed_at:
                    self.log.info(
                        "checkpoint generation %d stored %.2f s after the stop was asked "
                        "(budget %.1f s)",
                        ck.generation,
                        ck.saved_at - killed_at,
                        kill_budget_seconds,
                    )
        self.write(final=True)
        writer = self.writer
        writer.close(timeout=2.0 if killed_at is not None else 10.0)
        if writer.errors:
            self.log.warning(
                "checkpoint summary not written to the task state store (%d time(s); expected "
                "when the task instance was cleared while it ran: its id is gone): %s",
                len(writer.errors),
                writer.errors[0],
            )
