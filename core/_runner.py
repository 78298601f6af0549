"""Run a whole job: steps in dependency order, tasks of a step in parallel, resume on re-run.

``JobRunner`` is the local scheduler behind ``openjd-checkpoint run``. It finds an earlier
interrupted or failed run of the same job (same template name, template content and job
parameter values) and continues it: finished tasks are skipped, checkpointed tasks resume, and
processes a killed runner left behind are stopped first, so a task never runs twice at once.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ._errors import RunError, StoreError
from ._job import PreparedJob, TaskSpec
from ._process import ProcessIdentity
from ._store import (
    CheckpointStore,
    RunRecord,
    RunStatus,
    TaskRecord,
    new_run_id,
    this_process,
)
from ._task import (
    StopIntent,
    TaskEvent,
    TaskExecution,
    TaskOutcome,
    TaskResult,
    kill_recorded_process,
)

__all__ = ("EXIT_CODES", "JobRunner", "RunResult")

EXIT_CODES = {
    "succeeded": 0,
    "failed": 1,
    "usage": 2,
    "store": 3,
    "internal": 70,
    "interrupted": 75,
    "canceled": 130,
}
"""Exit codes of ``openjd-checkpoint run`` (75 is EX_TEMPFAIL: try again later)."""


@dataclass
class RunResult:
    """How a run ended.

    Attributes:
        run_id: the run's id in the store.
        status: the run's final ``RunStatus``.
        exit_code: see ``EXIT_CODES``.
        results: every task execution's result, in the order they ended.
        resumed: True if this attempt continued an earlier one.
        skipped: tasks not started (after a failure or a stop), as descriptions.
        notes: things a person should know (why a resume was not possible, warnings).
    """

    run_id: str
    status: RunStatus
    exit_code: int
    results: list[tuple[TaskSpec, TaskResult]] = field(default_factory=list)
    resumed: bool = False
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class JobRunner:
    """Runs one job to its end, resuming an earlier run of it unless ``fresh``.

    Args:
        job: the prepared job.
        store: the checkpoint store.
        fresh: run from the top even if an earlier run could be resumed.
        max_parallel: tasks of a step run at once (default: CPU count, at most 4).
        on_output / on_event: passed to every ``TaskExecution``.
        on_note: called with lines a person should see (resume decisions, warnings).
        working_root: parent directory of session working directories.
    """

    def __init__(
        self,
        job: PreparedJob,
        *,
        store: CheckpointStore,
        fresh: bool = False,
        max_parallel: int | None = None,
        on_output: Callable[[TaskExecution, list[str]], None] | None = None,
        on_event: Callable[[TaskExecution, TaskEvent], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        working_root: str | None = None,
    ) -> None:
        self.job = job
        self.store = store
        self.fresh = fresh
        self.max_parallel = max(1, max_parallel or min(4, os.cpu_count() or 1))
        self._on_output = on_output
        self._on_event = on_event
        self._on_note = on_note
        self._working_root = working_root
        self._lock = threading.Lock()
        self._active: set[TaskExecution] = set()
        self._stop: tuple[StopIntent, bool] | None = None
        self.run_id: str | None = None

    def note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    def stop(self, intent: StopIntent, *, force: bool = False) -> None:
        """Stop the run: no new task starts; running ones stop with ``intent``. Thread-safe."""
        with self._lock:
            if self._stop is None or intent == StopIntent.CANCEL or force:
                self._stop = (intent, force or (self._stop[1] if self._stop else False))
            active = list(self._active)
        for ex in active:
            ex.stop(intent, force=force)

    # --- finding the run to continue --------------------------------------------------------------
    def _previous(self) -> RunRecord | None:
        runs, warnings = self.store.list_runs(self.job.job_key)
        for w in warnings:
            self.note(f"warning: {w}")
        for rec in reversed(runs):
            if rec.status == RunStatus.SUCCEEDED:
                continue
            if rec.status == RunStatus.RUNNING and rec.runner is not None:
                ident = ProcessIdentity(rec.runner.pid, rec.runner.pgid, rec.runner.start_time)
                if rec.runner.host == socket.gethostname() and ident.is_alive():
                    if rec.parameters == self.job.parameters:
                        raise RunError(
                            f"run {rec.run_id} of this job is in progress in process "
                            f"{rec.runner.pid}; stop it first or wait for it"
                        )
                    continue
            if rec.parameters != self.job.parameters:
                continue
            if rec.template_hash != self.job.template.template_hash:
                changed = [
                    s
                    for s, h in self.job.template.step_hashes.items()
                    if rec.step_hashes.get(s) != h
                ]
                self.note(
                    f"run {rec.run_id} is not resumed: the template changed since it ran"
                    + (f" (steps {', '.join(changed)})" if changed else "")
                    + "; running from the top"
                )
                return None
            return rec
        return None

    # --- running ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run (or resume) the job. Blocks until it ends or is stopped.

        Raises:
            RunError: the same run is in progress in another live process.
            StoreError: the store cannot be written.
        """
        prev = None if self.fresh else self._previous()
        records: dict[tuple[str, str], TaskRecord] = {}
        if prev is not None:
            run = prev
            run.attempt += 1
            tasks, warnings = self.store.read_tasks(run.job_key, run.run_id)
            for w in warnings:
                self.note(f"warning: {w}; that task runs from the top")
            for t in tasks:
                records[(t.step, t.task_key)] = t
                if t.process is not None and kill_recorded_process(t.process):
                    self.note(
                        f"stopped process {t.process.pid} left running by an earlier attempt "
                        f"of {t.step}"
                    )
            self.note(f"resuming run {run.run_id} (attempt {run.attempt})")
        else:
            run = RunRecord(
                job_key=self.job.job_key,
                run_id=new_run_id(),
                job_name=self.job.job.name,
                template_path=str(self.job.template.source) if self.job.template.source else None,
                template_hash=self.job.template.template_hash,
                step_hashes=dict(self.job.template.step_hashes),
                parameters=self.job.parameters,
            )
        self.run_id = run.run_id
        run.status = RunStatus.RUNNING
        run.runner = this_process()
        run.message = None
        self.store.write_run(run)
        result = RunResult(run.run_id, RunStatus.RUNNING, 0, resumed=prev is not None)

        failed = False
        step_ok: dict[str, bool] = {}
        for step_name in self.job.step_order():
            if self._stop is not None or failed:
                result.skipped.append(step_name)
                step_ok[step_name] = False
                continue
            blocked = [d for d in self.job.dependencies(step_name) if not step_ok.get(d)]
            if blocked:
                result.skipped.append(step_name)
                step_ok[step_name] = False
                continue
            step_records = [r for (s, _), r in records.items() if s == step_name]
            specs = self.job.plan_step(step_name, step_records)
            ok = self._run_step(specs, records, run, result)
            step_ok[step_name] = ok
            failed = failed or not ok and self._stop is None

        stop = self._stop
        if stop is not None and stop[0] == StopIntent.CANCEL:
            run.status, result.exit_code = RunStatus.CANCELED, EXIT_CODES["canceled"]
        elif stop is not None:
            run.status, result.exit_code = RunStatus.INTERRUPTED, EXIT_CODES["interrupted"]
        elif failed:
            run.status, result.exit_code = RunStatus.FAILED, EXIT_CODES["failed"]
        else:
            run.status, result.exit_code = RunStatus.SUCCEEDED, EXIT_CODES["succeeded"]
        result.status = run.status
        run.runner = None
        if run.status == RunStatus.SUCCEEDED:
            # A run that completes deletes its checkpoints (seed 001).
            try:
                self.store.delete_run(run.job_key, run.run_id)
            except StoreError as exc:
                result.notes.append(f"warning: {exc}")
        else:
            self.store.write_run(run)
        return result

    def _run_step(
        self,
        specs: list[TaskSpec],
        records: dict[tuple[str, str], TaskRecord],
        run: RunRecord,
        result: RunResult,
    ) -> bool:
        ok = True
        pending = list(specs)
        futures: dict[Future[TaskResult], tuple[TaskSpec, TaskExecution]] = {}
        with ThreadPoolExecutor(
            max_workers=self.max_parallel, thread_name_prefix="openjd-task"
        ) as pool:
            while pending or futures:
                while pending and len(futures) < self.max_parallel:
                    if self._stop is not None or not ok:
                        result.skipped.extend(s.describe() for s in pending)
                        pending.clear()
                        break
                    spec = pending.pop(0)
                    ex = TaskExecution(
                        self.job,
                        spec,
                        run_id=run.run_id,
                        store=self.store,
                        record=records.get((spec.step_name, spec.task_key)),
                        attempt=run.attempt,
                        on_output=self._on_output,
                        on_event=self._on_event,
                        working_root=self._working_root,
                    )
                    with self._lock:
                        self._active.add(ex)
                        stop = self._stop
                    if stop is not None:
                        ex.stop(stop[0], force=stop[1])
                    futures[pool.submit(ex.run)] = (spec, ex)
                if not futures:
                    break
                done, _ = wait(list(futures), timeout=0.2, return_when=FIRST_COMPLETED)
                for fut in done:
                    spec, ex = futures.pop(fut)
                    with self._lock:
                        self._active.discard(ex)
                    try:
                        res = fut.result()
                    except Exception as exc:  # pragma: no cover - run() catches task errors
                        res = TaskResult(TaskOutcome.FAILED, None, str(exc), ex.record)
                    records[(spec.step_name, spec.task_key)] = res.record
                    result.results.append((spec, res))
                    if res.outcome != TaskOutcome.SUCCEEDED:
                        ok = False
            run.updated_at = time.time()
        return ok
