"""The CLI's driver: one attempt of a run, as thin as the Airflow and Prefect adapters.

``JobRunner`` is the local scheduler behind ``openjd-checkpoint run`` and ``resume``. It does what
every runner does with core's operations, and decides nothing itself:

1. ``begin_attempt`` (which earlier run an attempt continues, and when it refuses: Trax, seed
   001), holding the run's lease: one process at a time drives a local run;
2. each regular step, in dependency order, through one ``TaskExecutor`` (the tasks of a step
   in parallel, at most ``max_parallel``; termination requests, interruption notices,
   environment failures and the run's time budget are the executor's);
3. ``enter_finally``, then the finally steps (FINALLY extension, TEP-0058) with a time budget of
   their own, reading the run's outcome as ``{{Job.Status}}``;
4. ``finish_attempt``: the run's status, condition and exit code.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core import (
    Attempt,
    CheckpointStore,
    NoticeSource,
    PreparedJob,
    ResumeHow,
    RunError,
    RunPhase,
    RunStatus,
    StepWalk,
    StopIntent,
    StoreError,
    TaskEvent,
    TaskExecution,
    TaskOutcome,
    TaskResult,
    TaskSpec,
    TerminationMode,
    begin_attempt,
    finish_attempt,
)
from core.local import (
    EXIT_CODES,
    LeaseLostError,
    PlanHistory,
    RunCondition,
    StepRun,
    TaskExecutor,
    clean_stale_sessions,
    enter_finally,
    iter_attempt_records,
    iter_plan,
    mark_timed_out,
    step_feed,
)

__all__ = ("DEFAULT_FINALLY_TIMEOUT_SECONDS", "JobRunner", "RunResult")

DEFAULT_FINALLY_TIMEOUT_SECONDS = 600.0
"""The finally steps' own time budget (Tekton's finalization timeout), in seconds."""


@dataclass
class RunResult:
    """How a run ended.

    Attributes:
        run_id: the run's id in the store.
        status: the run's final ``RunStatus``.
        condition: its final ``RunCondition`` (status, reason, message).
        exit_code: see ``EXIT_CODES``.
        results: the result of every task execution that did not succeed (failed, canceled,
            suspended), in the order they ended. Succeeded ones are counted in ``succeeded``,
            not kept, so that a run of any size ends in memory that does not grow with its
            task count.
        succeeded: how many task executions of this attempt succeeded.
        resumed: True if this attempt continued an earlier one.
        skipped: tasks and steps not started, as descriptions.
        finally_ran: True if the finally steps were started.
        notes: things a person should know (resume decisions, warnings).
        lease_lost: why this process lost the run's lease to another (it was stalled past
            the lease's ttl, or could not renew it): it stopped and wrote nothing more; the
            run goes on in the process that took it. None otherwise.
        store_failed: why the store could not be written (a full disk, say): a task's end,
            or the run's record; the run stopped there and exits with the store's code (3).
    """

    run_id: str
    status: RunStatus
    condition: RunCondition
    exit_code: int
    results: list[tuple[TaskSpec, TaskResult]] = field(default_factory=list)
    succeeded: int = 0
    resumed: bool = False
    skipped: list[str] = field(default_factory=list)
    finally_ran: bool = False
    notes: list[str] = field(default_factory=list)
    lease_lost: str | None = None
    store_failed: str | None = None

    @property
    def ran(self) -> int:
        """How many task executions this attempt ran (succeeded or not)."""
        return self.succeeded + len(self.results)


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
        notices: interruption notice sources (``NoticeSettings.sources``). A notice suspends
            the run (``Suspended`` with the notice's deadline). A ``signal:`` source must
            have been installed (``NoticeSettings.install_signals``) from the main thread when
            ``run`` is called from another thread.
        notice_poll_seconds: at most one request per notice source this often (default 5 s).
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
        notices: Sequence[NoticeSource] = (),
        notice_poll_seconds: float | None = None,
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
        self._notice_sources = list(notices)
        self._notice_poll = notice_poll_seconds
        self._lock = threading.Lock()
        self._pending: list[tuple[TerminationMode, bool, float | None]] = []  # before begin
        self._executor: TaskExecutor | None = None
        self._ended = False
        self.run_id: str | None = None

    # --- public, thread-safe ---------------------------------------------------------------------
    def note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    @property
    def mode(self) -> TerminationMode | None:
        executor = self._executor
        return executor.termination.mode if executor is not None else None

    def request_termination(
        self, mode: TerminationMode | str, *, force: bool = False, deadline: float | None = None
    ) -> None:
        """Ask the run to end early in ``mode`` (TEP-0058). Thread-safe; returns at once.

        The request goes through the store (``request_termination``), as one from another
        process would, and applies to this runner's tasks at once. Before the run has begun it
        is kept and made as soon as the run exists. ``force`` kills tasks without notifying;
        ``deadline`` (seconds since the epoch) is when running tasks must be gone.

        Raises:
            RunError: the run has already ended, or is stopping in a mode this one may not
                replace.
        """
        mode = TerminationMode(mode)
        with self._lock:
            if self._ended:
                raise RunError(f"run {self.run_id} has already ended; it cannot be stopped")
            executor = self._executor
            if executor is None:
                self._pending.append((mode, force, deadline))
                return
        executor.request(mode, force=force, deadline=deadline)

    def stop(
        self, intent: StopIntent, *, force: bool = False, deadline: float | None = None
    ) -> None:
        """Shorthand: ``CHECKPOINT`` is ``Suspended``, ``CANCEL`` is ``Cancelled``."""
        mode = (
            TerminationMode.SUSPENDED
            if intent == StopIntent.CHECKPOINT
            else TerminationMode.CANCELLED
        )
        try:
            self.request_termination(mode, force=force, deadline=deadline)
        except RunError as exc:
            self.note(str(exc))

    # --- running ---------------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Run (or resume) the job. Blocks until it ends or is stopped.

        Raises:
            ResumeRefusedError: an operator resume was refused (nothing ran), or another process
                is running this job now.
            StoreError: the store cannot be written.
        """
        attempt = begin_attempt(
            self.store,
            self.job,
            how=self.how,
            run_id=self._resume_run_id,
            from_step=self._from_step,
            generation=self._generation,
            hold_lease=True,
        )
        lease = attempt.lease
        assert lease is not None
        for line in attempt.notes:
            self.note(line)
        executor = TaskExecutor(
            self.store,
            self.job,
            attempt.run_id,
            attempt=attempt.attempt,
            max_parallel=self.max_parallel,
            run_lease=lease,
            on_output=self._on_output,
            on_event=self._on_event,
            on_note=self.note,
            working_root=self._working_root,
            poll_seconds=self._poll,
            notices=self._notice_sources,
            notice_poll_seconds=self._notice_poll,
        )
        try:
            with self._lock:
                self.run_id = attempt.run_id
                self._executor = executor
                pending, self._pending = self._pending, []
            for mode, force, deadline in pending:
                try:
                    executor.request(mode, force=force, deadline=deadline)
                except RunError as exc:
                    self.note(str(exc))
            with executor:
                try:
                    return self._run_attempt(attempt, executor)
                except LeaseLostError as exc:
                    # taken: another process runs the run now; else the store could not be
                    # written for the lease's whole ttl (a store failure)
                    return RunResult(
                        attempt.run_id,
                        RunStatus.RUNNING if exc.taken else RunStatus.FAILED,
                        RunCondition(status="Unknown", reason="Running"),
                        EXIT_CODES["refused" if exc.taken else "store"],
                        resumed=attempt.resumed,
                        lease_lost=str(exc) if exc.taken else None,
                        store_failed=None if exc.taken else str(exc),
                    )
        finally:
            with self._lock:
                self._ended = True
            lease.release()

    def _run_attempt(self, attempt: Attempt, executor: TaskExecutor) -> RunResult:
        clean_stale_sessions(self._working_root)
        run = attempt.record  # as begin_attempt wrote it, under the run's lock
        assert run is not None
        # Earlier attempts' records, read once and kept as planning needs them (a succeeded
        # task's key, not its record); this attempt's records stay in the store.
        records = PlanHistory(self.job, iter_attempt_records(self.store, self.job, run))
        result = RunResult(
            attempt.run_id,
            RunStatus.RUNNING,
            RunCondition(status="Unknown", reason="Running"),
            0,
            resumed=attempt.resumed,
        )
        self._steps(executor, RunPhase.REGULAR, records, result)
        try:
            if result.store_failed is not None and attempt.lease is not None:
                # a task not stored because its lease was taken: whether the run was taken too
                # (exit 4) or the store fails (exit 3) is the run lease's to say, renewed now
                attempt.lease.confirm_held()
            return self._end(attempt, executor, records, result)
        except LeaseLostError:
            raise
        except StoreError as exc:  # the run's record cannot be written: the run ends here
            if attempt.lease is not None:  # LeaseLostError: another process took the run
                attempt.lease.confirm_held()
            failed = f"the run's record was not stored: {exc}"
            result.store_failed = (
                failed if result.store_failed is None else f"{result.store_failed}; {failed}"
            )
            result.status, result.exit_code = RunStatus.FAILED, EXIT_CODES["store"]
            return result

    def _end(
        self, attempt: Attempt, executor: TaskExecutor, records: PlanHistory, result: RunResult
    ) -> RunResult:
        """The end of an attempt, once its regular steps ended: the finally steps, then the
        run's outcome (``finish_attempt``). StoreError and LeaseLostError are the caller's."""
        lease = attempt.lease
        if executor.timed_out(False):
            mark_timed_out(
                self.store,
                attempt.job_key,
                attempt.run_id,
                f"the run's {self.timeout_seconds:g} s timeout expired",
                fence=lease,
            )

        # Finally steps: after every regular step ended, unless the mode says not to.
        decision = enter_finally(self.store, self.job, attempt.run_id, fence=lease)
        if decision.run_finally:
            result.finally_ran = True
            executor.phase = RunPhase.FINALLY
            self.note(f"running finally steps (Job.Status={decision.job_status})")
            self._steps(executor, RunPhase.FINALLY, records, result, decision.job_status)
        else:
            for step_name in self.job.template.finally_steps:
                result.skipped.extend(self._describe_plan(step_name, records))

        executor.sessions.close()
        with self._lock:
            self._ended = True
        outcome = finish_attempt(
            self.store,
            self.job,
            attempt.run_id,
            finally_timeout=(
                f"finally timeout of {self.finally_timeout_seconds:g} s expired"
                if executor.timed_out(True)
                else None
            ),
            skipped=result.skipped,
            fence=lease,
        )
        result.status, result.condition, result.exit_code = (
            outcome.status,
            outcome.condition,
            outcome.exit_code,
        )
        if result.store_failed is not None:
            result.exit_code = EXIT_CODES["store"]
        return result

    def _steps(
        self,
        executor: TaskExecutor,
        phase: RunPhase,
        records: PlanHistory,
        result: RunResult,
        job_status: str | None = None,
    ) -> None:
        """Run the steps of ``phase`` in dependency order; a blocked step (``StepWalk``: the
        phase is stopping, a dependency did not succeed, a regular step failed) is skipped."""
        is_finally = phase == RunPhase.FINALLY
        budget: float | None
        if is_finally:
            budget, message = self.finally_timeout_seconds, "finally steps' {:g} s timeout expired"
        else:
            budget, message = self.timeout_seconds, "the run's {:g} s timeout expired"
        deadline = time.monotonic() + budget if budget is not None else None
        walk = StepWalk(self.job, phase, stopping=lambda: executor.running.stopping(is_finally))
        for turn in walk:
            if turn.blocked is not None:
                result.skipped.extend(self._describe_plan(turn.step, records))
                continue
            feed, note = step_feed(self.job, turn.step, records)
            if note is not None:
                self.note(note)
            step = executor.run(
                feed,
                job_status=job_status,
                deadline=deadline,
                deadline_message=message.format(budget or 0),
                stop_on_failure=not is_finally,
                errors="fail",
                known={(r.step, r.task_key): r for r in records.records(turn.step)},
                keep_succeeded=False,
            )
            self._collect(step, result)
            walk.ended(turn.step, step.ok)

    @staticmethod
    def _collect(step: StepRun, result: RunResult) -> None:
        result.results.extend(step.results)  # those that did not succeed
        result.succeeded += step.succeeded
        result.skipped.extend(step.skipped)
        for _spec, res in step.results:
            if res.outcome == TaskOutcome.NOT_STORED and result.store_failed is None:
                result.store_failed = res.message

    def _describe_plan(self, step_name: str, records: PlanHistory) -> list[str]:
        try:
            return [s.label for s in iter_plan(self.job, step_name, records)]
        except Exception:  # pragma: no cover - a step whose space cannot be iterated
            return [step_name]
