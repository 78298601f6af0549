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
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ._action import StopIntent
from ._chunks import AdaptiveChunker
from ._errors import RunError, StoreError
from ._job import PreparedJob, TaskSpec
from ._notices import DEFAULT_POLL_SECONDS, Notice, NoticeSource, NoticeWatcher, checkpoint_timing
from ._records import RunCondition, RunStatus, TaskRecord
from ._resume import ResumeHow, ResumeRefusedError
from ._run import (
    EXIT_CODES,
    Attempt,
    RunWatcher,
    Termination,
    TerminationMode,
    _environment_failed,
    attempt_records,
    begin_attempt,
    claim_task,
    enter_finally,
    finish_attempt,
    lease_expired_note,
    mark_timed_out,
    record_notice,
    request_termination,
    task_stop_for,
)
from ._session import Session, clean_stale_sessions
from ._store import CheckpointStore, Lease
from ._task import (
    TaskEvent,
    TaskExecution,
    TaskOutcome,
    TaskResult,
)
from ._termination import fold_request, starts_no_tasks

__all__ = ("EXIT_CODES", "JobRunner", "RunResult", "TerminationMode")

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
        notices: interruption notice sources (``core._notices.parse_notice_sources``). A
            notice suspends the run (``Suspended`` with the notice's deadline), notes it in the
            run's record, says how long the checkpoints took against the deadline, and is
            acknowledged (Azure) once the tasks have stopped. A ``signal:`` source must have
            been installed (``SignalSource.install``) from the main thread when ``run`` is
            called from another thread.
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
        self._notice_poll = notice_poll_seconds or DEFAULT_POLL_SECONDS
        self._notice: Notice | None = None
        self._lock = threading.RLock()
        self._active: dict[TaskExecution, bool] = {}  # execution -> is a finally task
        self._term = Termination()
        self._pending: list[
            tuple[TerminationMode, bool, float | None]
        ] = []  # asked before the run began
        self._phase = "starting"  # starting, regular, finally, ended
        self._timed_out = False
        self._finally_timed_out = False
        self._attempt: Attempt | None = None
        self._sessions: list[Session] = []  # idle sessions, kept for the whole attempt
        self._all_sessions: list[Session] = []
        self.run_id: str | None = None

    # --- public, thread-safe ---------------------------------------------------------------------
    def note(self, text: str) -> None:
        if self._on_note is not None:
            self._on_note(text)

    @property
    def mode(self) -> TerminationMode | None:
        return self._term.mode

    def request_termination(
        self, mode: TerminationMode | str, *, force: bool = False, deadline: float | None = None
    ) -> None:
        """Ask the run to end early in ``mode`` (TEP-0058). Thread-safe; returns at once.

        The request goes through the store (``_run.request_termination``), as one from another
        process would, and applies to this runner's tasks at once. Before the run has begun it
        is kept and made as soon as the run exists. ``force`` kills tasks without notifying;
        ``deadline`` (seconds since the epoch) is when running tasks must be gone.

        Raises:
            RunError: the run has already ended, or is stopping in a mode this one may not
                replace.
        """
        mode = TerminationMode(mode)
        with self._lock:
            if self._phase == "ended":
                raise RunError(f"run {self.run_id} has already ended; it cannot be stopped")
            attempt = self._attempt
            if attempt is None:
                self._pending.append((mode, force, deadline))
                return
        term, note = request_termination(
            self.store, attempt.job_key, attempt.run_id, mode, force=force, deadline=deadline
        )
        if note is not None:
            self.note(f"run {attempt.run_id}: {note}")
        self._on_termination(term)

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
        except StoreError as exc:
            # The store cannot record the request: this runner still stops its own tasks.
            self.note(f"warning: {exc}; stopping this runner's tasks all the same")
            term, note = fold_request(
                self._term, mode, phase=self._phase, force=force, deadline=deadline
            )
            if note is not None:
                self.note(note)
            self._on_termination(term)

    # --- internals -------------------------------------------------------------------------------
    def _on_notice(self, notice: Notice) -> None:
        """An interruption notice: suspend the run with the notice's deadline."""
        self.note(f"interruption notice from {notice.describe()}: suspending the run")
        with self._lock:
            first = self._notice is None
            if first:
                self._notice = notice
            attempt = self._attempt
        if first and attempt is not None:
            try:
                record_notice(
                    self.store, attempt.job_key, attempt.run_id, notice, attempt=attempt.attempt
                )
            except StoreError as exc:
                self.note(f"warning: the notice is not recorded in the run: {exc}")
        self.stop(StopIntent.CHECKPOINT, deadline=notice.deadline)

    def _after_notice(self, attempt: Attempt, notices: NoticeWatcher) -> None:
        """Once the run's tasks have stopped after a notice: the time it took against the
        deadline, in the log and the run's record; the notice acknowledged (Azure)."""
        notice = self._notice
        if notice is None:
            return
        ended = time.time()
        self.note(checkpoint_timing(notice, ended))
        try:
            record_notice(
                self.store,
                attempt.job_key,
                attempt.run_id,
                notice,
                attempt=attempt.attempt,
                stopped_after=ended - notice.received_at,
            )
        except StoreError as exc:
            self.note(f"warning: the notice is not recorded in the run: {exc}")
        for line in notices.acknowledge():
            self.note(line)

    def _on_termination(self, term: Termination) -> None:
        """The run's termination changed (a request from this or another process)."""
        with self._lock:
            if term == self._term or self._phase == "ended":
                return
            changed_mode = term.mode != self._term.mode
            self._term = term
            active = list(self._active.items())
        if changed_mode and term.mode is not None:
            self.note(f"run {self.run_id}: {term.mode.value} requested; stopping")
        for ex, is_finally in active:
            self._apply_to_task(ex, is_finally)
        if term.force or term.deadline is not None:
            with self._lock:
                sessions = list(self._all_sessions)
            for session in sessions:  # reaches an onExit still running
                session.stop(force=term.force, deadline=term.deadline)

    def _on_lease_expired(self, lease: Lease) -> None:
        """The run's lease expired (the store could not be written for its ttl, or another
        process took it): this process may no longer drive the run; its tasks are canceled and
        none starts (``Cancelled``, applied here only: the store cannot take a request)."""
        self.note(f"warning: run {self.run_id}: {lease_expired_note(lease)}; canceling its tasks")
        self._on_termination(Termination(mode=TerminationMode.CANCELLED))

    def _apply_to_task(self, ex: TaskExecution, is_finally: bool) -> None:
        term = self._term
        intent = task_stop_for(
            term.mode, is_finally=is_finally, finally_timed_out=self._finally_timed_out
        )
        if intent is not None:
            ex.stop(intent, force=term.force, deadline=term.deadline)

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
        with self._lock:
            self._attempt = attempt
            self.run_id = attempt.run_id
            self._phase = "regular"
            pending, self._pending = self._pending, []
        watcher = RunWatcher(
            self.store,
            attempt.job_key,
            attempt.run_id,
            attempt.attempt,
            self._on_termination,
            leases=[lease],
            poll_seconds=self._poll,
            on_lease_expired=self._on_lease_expired,
        )
        notices = NoticeWatcher(
            self._notice_sources,
            self._on_notice,
            on_note=self.note,
            poll_seconds=self._notice_poll,
        )
        try:
            for mode, force, deadline in pending:
                try:
                    self.request_termination(mode, force=force, deadline=deadline)
                except RunError as exc:
                    self.note(str(exc))
            watcher.start()
            notices.start()
            result = self._run_attempt(attempt)
            notices.close()
            self._after_notice(attempt, notices)
            return result
        finally:
            notices.close()
            self._close_sessions()
            with self._lock:
                self._phase = "ended"
            watcher.close()
            for error in watcher.errors[:3]:
                self.note(f"warning: {error}")
            lease.release()

    def _stopping(self, is_finally: bool) -> bool:
        timed_out = self._finally_timed_out if is_finally else self._timed_out
        return timed_out or starts_no_tasks(self._term.mode, is_finally=is_finally)

    def _run_attempt(self, attempt: Attempt) -> RunResult:
        clean_stale_sessions(self._working_root)
        run = self.store.read_run(attempt.job_key, attempt.run_id)
        assert run is not None
        records: dict[tuple[str, str], TaskRecord] = {
            (t.step, t.task_key): t for t in attempt_records(self.store, self.job, run)
        }
        result = RunResult(
            attempt.run_id,
            RunStatus.RUNNING,
            RunCondition(status="Unknown", reason="Running"),
            0,
            resumed=attempt.resumed,
        )
        deadline = (
            time.monotonic() + self.timeout_seconds if self.timeout_seconds is not None else None
        )
        step_ok: dict[str, bool] = {}
        failed = False
        for step_name in self._order(self.job.template.regular_steps):
            blocked = [d for d in self.job.dependencies(step_name) if not step_ok.get(d)]
            if self._stopping(False) or failed or blocked:
                step_ok[step_name] = False
                result.skipped.extend(self._describe_plan(step_name, records))
                continue
            ok = self._run_step(step_name, records, result, deadline, False, None)
            step_ok[step_name] = ok
            failed = failed or (not ok and not self._stopping(False))
        if self._timed_out:
            mark_timed_out(
                self.store,
                attempt.job_key,
                attempt.run_id,
                f"the run's {self.timeout_seconds:g} s timeout expired",
            )

        # Finally steps: after every regular step ended, unless the mode says not to.
        decision = enter_finally(self.store, self.job, attempt.run_id)
        if decision.run_finally:
            with self._lock:
                self._phase = "finally"
            result.finally_ran = True
            self.note(f"running finally steps (Job.Status={decision.job_status})")
            fdeadline = time.monotonic() + self.finally_timeout_seconds
            fok: dict[str, bool] = {}
            for step_name in self._order(self.job.template.finally_steps):
                blocked = [d for d in self.job.dependencies(step_name) if not fok.get(d)]
                if self._stopping(True) or blocked:
                    fok[step_name] = False
                    result.skipped.extend(self._describe_plan(step_name, records))
                    continue
                fok[step_name] = self._run_step(
                    step_name, records, result, fdeadline, True, decision.job_status
                )
        else:
            for step_name in self.job.template.finally_steps:
                result.skipped.extend(self._describe_plan(step_name, records))

        self._close_sessions()
        with self._lock:
            self._phase = "ended"
        try:
            outcome = finish_attempt(
                self.store,
                self.job,
                attempt.run_id,
                finally_timeout=(
                    f"finally timeout of {self.finally_timeout_seconds:g} s expired"
                    if self._finally_timed_out
                    else None
                ),
                skipped=result.skipped,
            )
        except StoreError as exc:
            result.notes.append(f"warning: {exc}")
            result.status, result.exit_code = RunStatus.FAILED, EXIT_CODES["store"]
            return result
        result.status, result.condition, result.exit_code = (
            outcome.status,
            outcome.condition,
            outcome.exit_code,
        )
        return result

    def _close_sessions(self) -> None:
        """End every session of the attempt: environments exit (``onExit``) in reverse order,
        what they left running is killed. A forced stop skips the ``onExit`` actions."""
        with self._lock:
            sessions, self._sessions = list(self._all_sessions), []
        for session in sessions:  # still listed while closing: a forced stop reaches onExit
            self._close_session(session)
        with self._lock:
            self._all_sessions = [s for s in self._all_sessions if s not in sessions]

    def _close_session(self, session: Session) -> None:
        """Close one session; an environment exit that failed fails the attempt (core rule:
        ``record_environment_failure``)."""
        problem = session.close()
        attempt = self._attempt
        if problem and attempt is not None:
            _environment_failed(
                self.store, attempt.job_key, attempt.run_id, attempt.attempt, problem, self.note
            )
        elif problem:
            self.note(f"warning: {problem}")

    def _session(self, job_status: str | None) -> Session:
        """An idle session (a new one while fewer than ``max_parallel`` exist)."""
        with self._lock:
            while self._sessions:
                session = self._sessions.pop()
                if session.broken is None:
                    session.job_status = job_status  # finally steps read {{Job.Status}}
                    return session
                self._all_sessions.remove(session)
                self._close_session(session)
            session = Session(
                self.job,
                run_id=self.run_id,
                store=self.store,
                working_root=self._working_root,
                job_status=job_status,
            )
            self._all_sessions.append(session)
            return session

    def _order(self, names: tuple[str, ...]) -> list[str]:
        order = self.job.step_order()
        return [n for n in order if n in names]

    def _describe_plan(
        self, step_name: str, records: dict[tuple[str, str], TaskRecord]
    ) -> list[str]:
        step_records = [r for (s, _), r in records.items() if s == step_name]
        try:
            return [s.label for s in self.job.plan_step(step_name, step_records)]
        except Exception:  # pragma: no cover - a step whose space cannot be iterated
            return [step_name]

    def _start_task(
        self,
        spec: TaskSpec,
        records: dict[tuple[str, str], TaskRecord],
        attempt: Attempt,
        job_status: str | None,
        session: Session,
    ) -> tuple[TaskExecution, Lease] | TaskResult:
        try:
            lease, record, notes = claim_task(self.store, self.job, attempt.run_id, spec)
        except (ResumeRefusedError, StoreError) as exc:
            placeholder = TaskExecution(self.job, spec, run_id=attempt.run_id).record
            return TaskResult(TaskOutcome.FAILED, None, str(exc), placeholder)
        for line in notes:
            self.note(line)
        ex = TaskExecution(
            self.job,
            spec,
            run_id=attempt.run_id,
            store=self.store,
            record=record or records.get((spec.step_name, spec.task_key)),
            attempt=attempt.attempt,
            on_output=self._on_output,
            on_event=self._on_event,
            working_root=self._working_root,
            job_status=job_status,
            session=session,
        )
        return ex, lease

    def _run_step(
        self,
        step_name: str,
        records: dict[tuple[str, str], TaskRecord],
        result: RunResult,
        deadline: float | None,
        is_finally: bool,
        job_status: str | None,
    ) -> bool:
        attempt = self._attempt
        assert attempt is not None
        step_records = [r for (s, _), r in records.items() if s == step_name]
        adaptive = self.job.adaptive_plan(step_name, step_records)
        chunker: AdaptiveChunker | None = None
        if adaptive is not None:
            pending, chunker = adaptive
            self.note(
                f"{step_name}: chunks adapt to {chunker.target_runtime_seconds} s "
                f"(first chunks of {chunker.chunk_size} frames)"
            )
        else:
            pending = list(self.job.plan_step(step_name, step_records))
        ok = True
        started_at: dict[TaskExecution, float] = {}
        futures: dict[Future[TaskResult], tuple[TaskSpec, TaskExecution, Lease, Session]] = {}

        def refill() -> None:
            """Adaptive steps: take the next chunk, at the size measured so far."""
            if chunker is not None and not pending:
                params = chunker.next_chunk()
                if params is not None:
                    pending.append(self.job.spec_for(step_name, params))

        with ThreadPoolExecutor(
            max_workers=self.max_parallel, thread_name_prefix="openjd-task"
        ) as pool:
            while True:
                while len(futures) < self.max_parallel:
                    refill()  # an adaptive step sizes each chunk as it is taken
                    if not pending:
                        break
                    if self._stopping(is_finally) or (not ok and not is_finally):
                        result.skipped.extend(s.label for s in pending)
                        pending.clear()
                        if chunker is not None:
                            result.skipped.extend(self._describe_rest(chunker, step_name))
                        break
                    spec = pending.pop(0)
                    session = self._session(job_status)
                    started = self._start_task(spec, records, attempt, job_status, session)
                    if isinstance(started, TaskResult):
                        self.note(f"{spec.label}: {started.message}")
                        self._sessions.append(session)
                        ok = False
                        continue
                    ex, lease = started
                    with self._lock:
                        self._active[ex] = is_finally
                    self._apply_to_task(ex, is_finally)
                    started_at[ex] = time.monotonic()
                    futures[pool.submit(ex.run)] = (spec, ex, lease, session)
                if not futures:
                    break
                done, _ = wait(list(futures), timeout=0.1, return_when=FIRST_COMPLETED)
                if deadline is not None and time.monotonic() > deadline:
                    self._expire(is_finally)
                for fut in done:
                    spec, ex, lease, session = futures.pop(fut)
                    lease.release()
                    with self._lock:
                        self._sessions.append(session)
                    with self._lock:
                        self._active.pop(ex, None)
                    try:
                        res = fut.result()
                    except Exception as exc:  # pragma: no cover - run() catches task errors
                        res = TaskResult(TaskOutcome.FAILED, None, str(exc), ex.record)
                    records[(spec.step_name, spec.task_key)] = res.record
                    result.results.append((spec, res))
                    # Popped for every task: a finished TaskExecution must not stay alive (with
                    # its buffers and warnings) until the step ends.
                    began = started_at.pop(ex, time.monotonic())
                    if res.outcome != TaskOutcome.SUCCEEDED:
                        ok = False
                    elif chunker is not None and spec.resume is None:
                        seconds = time.monotonic() - began
                        size = chunker.report(len(spec.chunk_frames), seconds)
                        self.note(
                            f"{spec.label}: {len(spec.chunk_frames)} frame(s) in {seconds:.1f} s; "
                            f"next chunks of {size} frame(s)"
                        )
        return ok

    @staticmethod
    def _describe_rest(chunker: AdaptiveChunker, step_name: str) -> list[str]:
        """The frames an adaptive step did not hand out, as one label per chunk."""
        rest: list[str] = []
        while (params := chunker.next_chunk()) is not None:
            inner = ", ".join(f"{k}={v.value}" for k, v in params.items())
            rest.append(f"{step_name}[{inner}]")
        return rest

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
