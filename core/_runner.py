"""Run a whole job: regular steps, then finally steps; graceful termination; resume on re-run.

``JobRunner`` is the local scheduler behind ``openjd-checkpoint run`` and ``resume``, and the
reference for the adapters' run-level behaviour:

- steps run in dependency order, the tasks of a step in parallel (bounded);
- finally steps (``finally:``, FINALLY extension) run once every regular step has ended, with a
  time budget of their own, and read the run's outcome as ``{{Job.Status}}``;
- a run can be asked to end early in a termination mode (TEP-0058, seed 002): ``Cancelled``,
  ``CancelledRunFinally``, ``StoppedRunFinally``, or our ``Suspended`` (checkpointCancelation,
  the run stays resumable); while stopping, its condition is Unknown/Stopping;
- which earlier run an attempt continues, and when it refuses, is ``_resume.plan_resume``
  (Trax, seed 001); one process at a time holds a run's lease.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from enum import Enum

from ._errors import RunError, StoreError
from ._job import PreparedJob, TaskSpec
from ._resume import (
    RefusalCode,
    ResumeHow,
    ResumePlan,
    ResumeRefusedError,
    plan_resume,
)
from ._store import (
    CheckpointStore,
    Lease,
    RunCondition,
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
    clean_stale_sessions,
    kill_recorded_process,
)

__all__ = ("EXIT_CODES", "JobRunner", "RunResult", "TerminationMode")

EXIT_CODES = {
    "succeeded": 0,
    "failed": 1,
    "usage": 2,
    "store": 3,
    "refused": 4,
    "internal": 70,
    "interrupted": 75,
    "canceled": 130,
}
"""Exit codes of ``openjd-checkpoint run`` and ``resume`` (75 is EX_TEMPFAIL: try again)."""

DEFAULT_FINALLY_TIMEOUT_SECONDS = 600.0
"""The finally steps' own time budget (Tekton's finalization timeout), in seconds."""


class TerminationMode(str, Enum):
    """How a run is asked to end early (TEP-0058, plus ``Suspended``)."""

    CANCELLED = "Cancelled"
    """Stop running tasks with ``cancelation``, skip the rest, run no finally steps (and stop
    running ones)."""
    CANCELLED_RUN_FINALLY = "CancelledRunFinally"
    """Stop running tasks with ``cancelation``, skip the rest, then run the finally steps."""
    STOPPED_RUN_FINALLY = "StoppedRunFinally"
    """Let running tasks finish, skip the rest, then run the finally steps."""
    SUSPENDED = "Suspended"
    """Stop running tasks with ``checkpointCancelation``, skip the rest, run no finally steps:
    the run stays resumable."""


_UPGRADES = {
    TerminationMode.CANCELLED: {
        TerminationMode.STOPPED_RUN_FINALLY,
        TerminationMode.CANCELLED_RUN_FINALLY,
        TerminationMode.SUSPENDED,
    },
    TerminationMode.CANCELLED_RUN_FINALLY: {TerminationMode.STOPPED_RUN_FINALLY},
}
"""Which modes a later request may replace: a stop may only become more forceful."""


@dataclass
class RunResult:
    """How a run ended.

    Attributes:
        run_id: the run's id in the store.
        status: the run's final ``RunStatus``.
        condition: its final ``RunCondition`` (status, reason, message).
        exit_code: see ``EXIT_CODES``.
        results: every task execution's result, in the order they ended.
        resumed: True if this attempt continued an earlier one.
        skipped: tasks and steps not started, as descriptions.
        finally_ran: True if the finally steps were started.
        notes: things a person should know (resume decisions, warnings).
    """

    run_id: str
    status: RunStatus
    condition: RunCondition
    exit_code: int
    results: list[tuple[TaskSpec, TaskResult]] = field(default_factory=list)
    resumed: bool = False
    skipped: list[str] = field(default_factory=list)
    finally_ran: bool = False
    notes: list[str] = field(default_factory=list)


class JobRunner:
    """Runs one job to its end.

    Args:
        job: the prepared job.
        store: the checkpoint store.
        how: ``RETRY`` (default: resume the last interrupted or failed run when allowed),
            ``REQUEUE`` (from the top) or ``OPERATOR`` (resume ``run_id`` exactly, or refuse).
        fresh: shorthand for ``how=REQUEUE``.
        run_id / from_step / generation: for ``OPERATOR``.
        max_parallel: tasks of a step run at once (default: CPU count, at most 4).
        timeout_seconds: the regular steps' time budget (None: no limit). On expiry running
            tasks are canceled, the rest skipped, the finally steps run, the run fails (Timeout).
        finally_timeout_seconds: the finally steps' own budget.
        on_output / on_event: passed to every ``TaskExecution``.
        on_note: lines a person should see (resume decisions, warnings, mode changes).
        working_root: parent directory of session working directories.
        poll_seconds: how often the store is read for stop requests from other processes.
    """

    def __init__(
        self,
        job: PreparedJob,
        *,
        store: CheckpointStore,
        how: ResumeHow = ResumeHow.RETRY,
        fresh: bool = False,
        run_id: str | None = None,
        from_step: str | None = None,
        generation: int | None = None,
        max_parallel: int | None = None,
        timeout_seconds: float | None = None,
        finally_timeout_seconds: float = DEFAULT_FINALLY_TIMEOUT_SECONDS,
        on_output: Callable[[TaskExecution, list[str]], None] | None = None,
        on_event: Callable[[TaskExecution, TaskEvent], None] | None = None,
        on_note: Callable[[str], None] | None = None,
        working_root: str | None = None,
        poll_seconds: float = 0.5,
    ) -> None:
        self.job = job
        self.store = store
        self.how = ResumeHow.REQUEUE if fresh else how
        self._resume_run_id = run_id
        self._from_step = from_step
        self._generation = generation
        self.max_parallel = max(1, max_parallel or min(4, os.cpu_count() or 1))
        self.timeout_seconds = timeout_seconds
        self.finally_timeout_seconds = finally_timeout_seconds
        self._on_output = on_output
        self._on_event = on_event
        self._on_note = on_note
        self._working_root = working_root
        self._poll = poll_seconds
        self._lock = threading.RLock()
        self._active: dict[TaskExecution, bool] = {}  # execution -> is a finally task
        self._mode: TerminationMode | None = None
        self._force = False
        self._phase = "starting"  # starting, regular, finally, ended
        self._timed_out = False
        self._finally_timed_out = False
        self._run: RunRecord | None = None
        self._ended = threading.Event()
        self.run_id: str | None = None

    # --- public, thread-safe ---------------------------------------------------------------------
    def note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    @property
    def mode(self) -> TerminationMode | None:
        return self._mode

    def request_termination(self, mode: TerminationMode | str, *, force: bool = False) -> None:
        """Ask the run to end early in ``mode`` (TEP-0058). Thread-safe; returns at once.

        A later request may only make the stop more forceful (``Cancelled`` overrides every
        mode; ``CancelledRunFinally`` overrides ``StoppedRunFinally``). ``force`` kills tasks
        without notifying them.

        Raises:
            RunError: the run has already ended, or the mode would not change anything.
        """
        mode = TerminationMode(mode)
        with self._lock:
            if self._phase == "ended":
                raise RunError(f"run {self.run_id} has already ended; it cannot be stopped")
            if self._phase == "finally" and mode in (
                TerminationMode.CANCELLED_RUN_FINALLY,
                TerminationMode.STOPPED_RUN_FINALLY,
            ):
                # TEP-0058 case 4: the finally steps are already running; nothing changes.
                self.note(f"run {self.run_id}: {mode.value} while finally steps run: no change")
                return
            current = self._mode
            if current is not None and mode != current:
                if current not in _UPGRADES.get(mode, set()):
                    raise RunError(f"run {self.run_id} is already stopping ({current.value})")
            self._mode = mode
            self._force = self._force or force
            mode_now = self._mode
            active = list(self._active.items())
        assert mode_now is not None
        self.note(f"run {self.run_id}: {mode_now.value} requested; stopping")
        self._write_condition("Unknown", "Stopping", f"{mode_now.value} requested")
        for ex, is_finally in active:
            self._apply_to_task(ex, is_finally)

    def stop(self, intent: StopIntent, *, force: bool = False) -> None:
        """Shorthand: ``CHECKPOINT`` is ``Suspended``, ``CANCEL`` is ``Cancelled``."""
        mode = (
            TerminationMode.SUSPENDED
            if intent == StopIntent.CHECKPOINT
            else TerminationMode.CANCELLED
        )
        try:
            self.request_termination(mode, force=force)
        except RunError as exc:
            self.note(str(exc))

    # --- internals -------------------------------------------------------------------------------
    def _apply_to_task(self, ex: TaskExecution, is_finally: bool) -> None:
        mode = self._mode
        if mode is None:
            return
        if is_finally:
            if mode == TerminationMode.CANCELLED or self._finally_timed_out:
                ex.stop(StopIntent.CANCEL, force=self._force)
            elif mode == TerminationMode.SUSPENDED:
                ex.stop(StopIntent.CHECKPOINT, force=self._force)
            return
        if mode == TerminationMode.SUSPENDED:
            ex.stop(StopIntent.CHECKPOINT, force=self._force)
        elif mode in (TerminationMode.CANCELLED, TerminationMode.CANCELLED_RUN_FINALLY):
            ex.stop(StopIntent.CANCEL, force=self._force)
        # STOPPED_RUN_FINALLY: running tasks finish

    def _write_condition(self, status: str, reason: str, message: str = "") -> None:
        with self._lock:
            run = self._run
            if run is None:
                return
            run.condition = RunCondition(status=status, reason=reason, message=message)
            run.termination = self._mode.value if self._mode else None
            try:
                self.store.write_run(run)
            except StoreError as exc:
                self.note(f"warning: {exc}")

    def _watch(self, run: RunRecord, lease: Lease) -> None:
        """Poll the store for stop requests from other processes; renew the lease."""
        last_renew = time.monotonic()
        while not self._ended.wait(self._poll):
            req = self.store.read_stop_request(run)
            if req is not None:
                self.store.clear_stop_request(run)
                try:
                    self.request_termination(req.mode)
                except (RunError, ValueError) as exc:
                    self.note(f"stop request ignored: {exc}")
            if time.monotonic() - last_renew > 10:
                try:
                    lease.renew()
                except StoreError as exc:
                    self.note(f"warning: lease not renewed: {exc}")
                last_renew = time.monotonic()

    # --- running ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run (or resume) the job. Blocks until it ends or is stopped.

        Raises:
            ResumeRefusedError: an operator resume was refused (nothing ran), or another process
                is running this run now.
            StoreError: the store cannot be written.
        """
        with self.store.job_lock(self.job.job_key):
            plan: ResumePlan = plan_resume(
                self.store,
                self.job,
                self.how,
                run_id=self._resume_run_id,
                from_step=self._from_step,
                generation=self._generation,
            )
            for line in plan.notes:
                self.note(line)
            if plan.run is not None:
                run = plan.run
                run.attempt += 1
            else:
                run = RunRecord(
                    job_key=self.job.job_key,
                    run_id=new_run_id(),
                    job_name=self.job.job.name,
                    template_path=(
                        str(self.job.template.source) if self.job.template.source else None
                    ),
                    template_hash=self.job.template.template_hash,
                    step_hashes=dict(self.job.template.step_hashes),
                    parameters=self.job.parameters,
                    finally_steps=list(self.job.template.finally_steps),
                    environments=list(self.job.environment_paths),
                    path_mapping_rules=[r.to_dict() for r in self.job.path_mapping_rules],
                )
            lease = self.store.acquire_lease(run)
            if lease is None:
                raise ResumeRefusedError(
                    RefusalCode.ALREADY_RESUMED,
                    f"run {run.run_id} is being run by another process",
                )
            # Written under the job lock, so the next process to look sees it leased.
            run.status = RunStatus.RUNNING
            run.runner = this_process()
            self.store.write_run(run)
        for old in plan.superseded:
            if old.run_id != run.run_id:
                old.superseded_by = run.run_id
                try:
                    self.store.write_run(old)
                except StoreError as exc:
                    self.note(f"warning: {exc}")
        try:
            return self._run_leased(run, plan, lease)
        finally:
            self._ended.set()
            lease.release()

    def _run_leased(self, run: RunRecord, plan: ResumePlan, lease: Lease) -> RunResult:
        clean_stale_sessions(self._working_root)
        records: dict[tuple[str, str], TaskRecord] = {}
        for t in plan.records:
            if self.job.template.is_finally(t.step) and t.status.value == "succeeded":
                continue  # finally steps run again at the end of every attempt
            records[(t.step, t.task_key)] = t
            if t.process is not None and kill_recorded_process(t.process):
                self.note(
                    f"stopped process {t.process.pid} left running by an earlier attempt "
                    f"of {t.step}"
                )
        with self._lock:
            self._run = run
            self.run_id = run.run_id
            run.status = RunStatus.RUNNING
            run.runner = this_process()
            run.message = None
            run.skipped_tasks = []
            run.termination = None
            run.condition = RunCondition(status="Unknown", reason="Running")
            self.store.clear_stop_request(run)
            self.store.write_run(run)
            self._phase = "regular"
        watcher = threading.Thread(
            target=self._watch, args=(run, lease), name="openjd-run-watch", daemon=True
        )
        watcher.start()
        result = RunResult(
            run.run_id, RunStatus.RUNNING, run.condition, 0, resumed=plan.run is not None
        )

        deadline = (
            time.monotonic() + self.timeout_seconds if self.timeout_seconds is not None else None
        )
        failed_steps: list[str] = []
        step_ok: dict[str, bool] = {}
        for step_name in self._order(self.job.template.regular_steps):
            blocked = [d for d in self.job.dependencies(step_name) if not step_ok.get(d)]
            if self._mode is not None or self._timed_out or failed_steps or blocked:
                step_ok[step_name] = False
                result.skipped.extend(self._describe_plan(step_name, records))
                continue
            ok = self._run_step(step_name, records, run, result, deadline, False, None)
            step_ok[step_name] = ok
            if not ok and self._mode is None and not self._timed_out:
                failed_steps.append(step_name)

        # Finally steps: after every regular step ended, unless the mode says not to.
        mode = self._mode
        finally_failed: list[str] = []
        run_finally = bool(self.job.template.finally_steps) and mode not in (
            TerminationMode.CANCELLED,
            TerminationMode.SUSPENDED,
        )
        job_status = (
            "Cancelled"
            if mode in (TerminationMode.CANCELLED, TerminationMode.CANCELLED_RUN_FINALLY)
            else "Stopped"
            if mode == TerminationMode.STOPPED_RUN_FINALLY
            else "Failed"
            if failed_steps or self._timed_out
            else "Succeeded"
        )
        if run_finally:
            with self._lock:
                self._phase = "finally"
            result.finally_ran = True
            self.note(f"running finally steps (Job.Status={job_status})")
            fdeadline = time.monotonic() + self.finally_timeout_seconds
            fok: dict[str, bool] = {}
            for step_name in self._order(self.job.template.finally_steps):
                blocked = [d for d in self.job.dependencies(step_name) if not fok.get(d)]
                if (
                    self._mode in (TerminationMode.CANCELLED, TerminationMode.SUSPENDED)
                    or self._finally_timed_out
                    or blocked
                ):
                    fok[step_name] = False
                    result.skipped.extend(self._describe_plan(step_name, records))
                    if self._finally_timed_out:
                        finally_failed.append(step_name)
                    continue
                before = len(result.results)
                ok = self._run_step(step_name, records, run, result, fdeadline, True, job_status)
                fok[step_name] = ok
                outcomes = {res.outcome for _spec, res in result.results[before:]}
                if TaskOutcome.FAILED in outcomes or (self._finally_timed_out and not ok):
                    finally_failed.append(step_name)
        elif self.job.template.finally_steps:
            for step_name in self.job.template.finally_steps:
                result.skipped.extend(self._describe_plan(step_name, records))

        return self._finish(run, result, failed_steps, finally_failed)

    def _finish(
        self,
        run: RunRecord,
        result: RunResult,
        failed_steps: list[str],
        finally_failed: list[str],
    ) -> RunResult:
        with self._lock:
            self._phase = "ended"
            mode = self._mode
        if mode == TerminationMode.SUSPENDED:
            status, cond = (
                RunStatus.INTERRUPTED,
                RunCondition(status="False", reason="Suspended", message="suspended; resumable"),
            )
            code = EXIT_CODES["interrupted"]
        elif mode is not None:
            status = (
                RunStatus.STOPPED
                if mode == TerminationMode.STOPPED_RUN_FINALLY
                else RunStatus.CANCELED
            )
            cond = RunCondition(status="False", reason=mode.value, message=f"ended by {mode.value}")
            code = EXIT_CODES["canceled"]
        elif self._timed_out:
            status, cond = (
                RunStatus.FAILED,
                RunCondition(
                    status="False",
                    reason="Timeout",
                    message=f"the run's {self.timeout_seconds:g} s timeout expired",
                ),
            )
            code = EXIT_CODES["failed"]
        elif failed_steps or finally_failed:
            what = failed_steps + [f"finally {s}" for s in finally_failed]
            if self._finally_timed_out:
                what.append(f"finally timeout of {self.finally_timeout_seconds:g} s expired")
            status, cond = (
                RunStatus.FAILED,
                RunCondition(status="False", reason="Failed", message="failed: " + ", ".join(what)),
            )
            code = EXIT_CODES["failed"]
        else:
            status, cond = RunStatus.SUCCEEDED, RunCondition(status="True", reason="Succeeded")
            code = EXIT_CODES["succeeded"]
        if finally_failed and status != RunStatus.FAILED:
            cond.message += "; finally failed: " + ", ".join(finally_failed)
            if mode != TerminationMode.SUSPENDED:
                code = max(code, EXIT_CODES["failed"])
        result.status, result.condition, result.exit_code = status, cond, code
        run.status, run.condition = status, cond
        run.termination = mode.value if mode else None
        run.skipped_tasks = list(result.skipped)
        run.runner = None
        try:
            if status == RunStatus.SUCCEEDED:
                # A run that completes deletes its checkpoints (seed 001); the run record stays
                # as a tombstone so that a later resume of it is refused (already-resumed).
                self.store.delete_checkpoints(run)
            self.store.write_run(run)
        except StoreError as exc:
            result.notes.append(f"warning: {exc}")
        return result

    def _order(self, names: tuple[str, ...]) -> list[str]:
        order = self.job.step_order()
        return [n for n in order if n in names]

    def _describe_plan(
        self, step_name: str, records: dict[tuple[str, str], TaskRecord]
    ) -> list[str]:
        step_records = [r for (s, _), r in records.items() if s == step_name]
        try:
            return [s.describe() for s in self.job.plan_step(step_name, step_records)]
        except Exception:  # pragma: no cover - a step whose space cannot be iterated
            return [step_name]

    def _run_step(
        self,
        step_name: str,
        records: dict[tuple[str, str], TaskRecord],
        run: RunRecord,
        result: RunResult,
        deadline: float | None,
        is_finally: bool,
        job_status: str | None,
    ) -> bool:
        step_records = [r for (s, _), r in records.items() if s == step_name]
        pending = list(self.job.plan_step(step_name, step_records))
        ok = True
        futures: dict[Future[TaskResult], tuple[TaskSpec, TaskExecution]] = {}

        def stopping() -> bool:
            mode = self._mode
            if is_finally:
                return (
                    mode in (TerminationMode.CANCELLED, TerminationMode.SUSPENDED)
                    or self._finally_timed_out
                )
            return mode is not None or self._timed_out

        with ThreadPoolExecutor(
            max_workers=self.max_parallel, thread_name_prefix="openjd-task"
        ) as pool:
            while pending or futures:
                while pending and len(futures) < self.max_parallel:
                    if stopping() or (not ok and not is_finally):
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
                        job_status=job_status,
                    )
                    with self._lock:
                        self._active[ex] = is_finally
                    self._apply_to_task(ex, is_finally)
                    futures[pool.submit(ex.run)] = (spec, ex)
                if not futures:
                    break
                done, _ = wait(list(futures), timeout=0.1, return_when=FIRST_COMPLETED)
                if deadline is not None and time.monotonic() > deadline:
                    self._expire(is_finally)
                for fut in done:
                    spec, ex = futures.pop(fut)
                    with self._lock:
                        self._active.pop(ex, None)
                    try:
                        res = fut.result()
                    except Exception as exc:  # pragma: no cover - run() catches task errors
                        res = TaskResult(TaskOutcome.FAILED, None, str(exc), ex.record)
                    records[(spec.step_name, spec.task_key)] = res.record
                    result.results.append((spec, res))
                    if res.outcome != TaskOutcome.SUCCEEDED:
                        ok = False
        return ok

    def _expire(self, is_finally: bool) -> None:
        with self._lock:
            if is_finally:
                if self._finally_timed_out:
                    return
                self._finally_timed_out = True
                message = f"finally steps' {self.finally_timeout_seconds:g} s timeout expired"
            else:
                if self._timed_out:
                    return
                self._timed_out = True
                message = f"the run's {self.timeout_seconds:g} s timeout expired"
            active = [ex for ex, fin in self._active.items() if fin == is_finally]
        self.note(message + "; canceling running tasks")
        for ex in active:
            ex.stop(StopIntent.CANCEL)
