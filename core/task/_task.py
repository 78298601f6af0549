"""Run one task (or chunk) in its own session: the thread-safe core API every adapter stands on.

``TaskExecution.run()`` blocks in the caller's (worker) thread; ``TaskExecution.stop(intent)`` may
be called from any other thread (a signal handler's helper, Airflow's ``on_kill``, a Prefect
cancellation watcher). The local CLI uses exactly this API.

Behaviour follows openjd-sessions 0.14 (the reference): a session working directory, the
external, job and step environments entered in order (variables, embedded files, ``onEnter``)
and exited in reverse (``onExit``), ``openjd_env``/``openjd_unset_env``/``openjd_redacted_env``
from ``onEnter``, embedded files, action timeouts and ``cancel_info.json``. What CHECKPOINT adds
(seed 000): ``onCheckpointResume`` with ``Task.Checkpoint.State``/``File``, the two stop intents
(``cancelation`` abandons, ``checkpointCancelation`` preserves), and every save and finished
frame persisted to the store as it arrives (the file dataset with each save).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from openjd.model import ParameterValueType, SymbolTable

from core._killpoints import kill_point
from core._messages import DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_STATE_BYTES, MessageContext
from core._records import InterruptionCause, TaskRecord, TaskStatus
from core._words import describe_exit, suspended_words
from core.files import CaptureStats
from core.job import (
    DEFAULT_NOTIFY_PERIOD_SECONDS,
    ActionCheckpointSpec,
    CancelMethod,
    PreparedJob,
    TaskSpec,
    _relabel,
    new_task_record,
    resolve_args,
    resolve_cancelation,
    resolve_int_field,
)
from core.process import (
    MARKER_VARIABLE,
    ActionProcess,
    OutputLine,
    marked_spare,
    new_marker,
    release_marker,
)
from core.store import CheckpointStore, Lease
from core.task._action import StopIntent, StopState, supervise
from core.task._events import TaskEvent, TaskEventKind
from core.task._history import close_span, open_span
from core.task._protocol import TaskOutput
from core.task._recorder import TaskRecorder
from core.task._session import Session
from core.task._wrap import inject_wrapped

__all__ = (
    "DEFAULT_MAX_OUTPUT_WARNINGS",
    "TaskEvent",
    "TaskEventKind",
    "TaskExecution",
    "TaskOutcome",
    "TaskResult",
)

DEFAULT_MAX_OUTPUT_WARNINGS = 100
"""How many warnings about a task's output lines (malformed or refused messages, oversized
lines) are kept and reported one by one; the rest are only counted, and one warning at the end
of the action says how many more there were. Memory stays flat whatever a task prints."""


class TaskOutcome(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED_WITH_CHECKPOINT = "interrupted_with_checkpoint"
    """Stopped with the CHECKPOINT intent; the store holds a checkpoint or finished frames."""
    INTERRUPTED = "interrupted"
    """Stopped with the CHECKPOINT intent, with nothing to resume from."""
    CANCELED = "canceled"
    SKIPPED = "skipped"
    """Not started: the run was already stopping (``run_task``)."""
    NOT_STORED = "not_stored"
    """Its end could not be stored (the store failed, or this process lost the task's lease
    to another): never counted as finished; the next attempt runs it again (or the process
    that took the lease runs it now)."""

    @property
    def stopped(self) -> bool:
        """True for an outcome a stop ended (``CANCELED``, ``INTERRUPTED``,
        ``INTERRUPTED_WITH_CHECKPOINT``): ``core.report.result_words`` says what it kept."""
        return self in _STOPPED_OUTCOMES


_STOPPED_OUTCOMES = frozenset(
    {TaskOutcome.CANCELED, TaskOutcome.INTERRUPTED, TaskOutcome.INTERRUPTED_WITH_CHECKPOINT}
)


@dataclass(frozen=True)
class TaskResult:
    """How one task execution ended.

    Attributes:
        outcome: see ``TaskOutcome``.
        exit_code: the task action's exit code (None if it never ran).
        message: why it failed or stopped, for a person.
        record: the task's store record as it was left.
    """

    outcome: TaskOutcome
    exit_code: int | None
    message: str
    record: TaskRecord


class TaskExecution:
    """One attempt at one task. Thread-safe: ``stop()`` and the read-only properties may be used
    from any thread while ``run()`` blocks in another.

    It composes one action at a time (``_action.supervise`` over an ``ActionProcess``), the
    stdout protocol (``_messages.read_line``) and the ``TaskRecorder`` that stores what the
    protocol's events mean, and decides the task's outcome.

    Args:
        job: the prepared job.
        spec: which task, with which parameters, resumed from which checkpoint.
        run_id: the run this attempt belongs to.
        store: where records and checkpoints go (None: nothing is stored).
        record: the task's existing record (None: a new one is made).
        attempt: the attempt number (1-based) written into checkpoints.
        on_output: called with (this execution, list of decoded output lines), on the reader
            thread; keep it fast.
        on_event: called with (this execution, TaskEvent).
        working_root: parent directory of the session working directory (default: system temp).
        os_env: the environment the actions start from (default: ``os.environ``).
        max_line_bytes / max_state_bytes: protocol caps in bytes.
        max_output_warnings: how many warnings about output lines are kept in ``warnings`` and
            reported as events; the rest are counted, and one more warning at the end of each
            action says ``... and K more``.
        job_status: the run's outcome so far (``Succeeded``, ``Failed``, ``Cancelled``,
            ``Stopped``), the value of ``{{Job.Status}}`` in finally steps.
        session: the ``Session`` to run in, whose environments stay entered for the tasks
            after this one (None: a session of its own, entered and exited around this task).
        lease: the task's lease (``claim_task``), under which every write of its record is
            made (fencing): once it is lost the task is canceled and writes nothing more
            (``TaskOutcome.NOT_STORED``). None: writes are not fenced.
        task_env: variables added to the task action's environment (``interval_env``).
        on_ending: called with (this execution, its outcome) on its thread once the outcome is
            decided and its session free, just before its end is stored (the executor then
            starts the next task: ``core.run._in_flight``); it is reported ended once stored.
    """

    def __init__(
        self,
        job: PreparedJob,
        spec: TaskSpec,
        *,
        run_id: str,
        store: CheckpointStore | None = None,
        record: TaskRecord | None = None,
        attempt: int = 1,
        on_output: Callable[[TaskExecution, list[str]], None] | None = None,
        on_event: Callable[[TaskExecution, TaskEvent], None] | None = None,
        working_root: str | None = None,
        os_env: dict[str, str] | None = None,
        max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
        max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
        max_output_warnings: int = DEFAULT_MAX_OUTPUT_WARNINGS,
        job_status: str | None = None,
        session: Session | None = None,
        lease: Lease | None = None,
        task_env: dict[str, str] | None = None,
        on_ending: Callable[[TaskExecution, TaskOutcome], None] | None = None,
    ) -> None:
        self.job = job
        self._on_ending = on_ending or (lambda _execution, _outcome: None)
        self.job_status = job_status
        self._session = session
        self.spec = spec
        self.run_id = run_id
        self.store = store
        self.attempt = attempt
        self._on_output = on_output
        self._on_event = on_event
        self._working_root = working_root
        self._os_env = dict(os.environ if os_env is None else os_env)
        self._task_env = task_env or {}
        self._stop = StopState()
        self._recorder = TaskRecorder(
            record or new_task_record(job, spec, run_id),
            store=store,
            attempt=attempt,
            warn=self._warn,
            emit=self._emit,
            fence=lease,
            on_lost=self._lease_lost,
            saves=job.template.saves_of(spec.step_name),
            stopped_at=lambda: self._stop.requested_at,
        )
        self._output = TaskOutput(
            self._recorder,
            max_line_bytes=max_line_bytes,
            max_state_bytes=max_state_bytes,
            max_warnings=max_output_warnings,
            warn=self._warn,
            emit=self._emit,
            on_output=None if on_output is None else (lambda texts: on_output(self, texts)),
            working_dir=lambda: self._session.working_dir if self._session is not None else None,
        )
        self._marker = new_marker()
        """Its processes' marker (``new_marker``), released when it ends."""
        self._actions = ActionRunner(
            job,
            self._output,
            self._recorder,
            self._stop,
            marker=self._marker,
            max_line_bytes=max_line_bytes,
            warn=self._warn,
            emit=self._emit,
        )
        self._ran_resume = False
        """True once ``onCheckpointResume`` (not ``onRun``) was started."""
        self.warnings: list[str] = []
        """Warnings so far; those about output lines are capped (``max_output_warnings``)."""

    # --- thread-safe public surface -------------------------------------------------------------
    @property
    def progress(self) -> float | None:
        """Last ``openjd_progress`` (0..100), or None."""
        return self._output.progress

    @property
    def status_message(self) -> str | None:
        """Last ``openjd_status`` text, or None."""
        return self._output.status

    @property
    def redacted_values(self) -> frozenset[str]:
        """Values declared secret so far (``openjd_redacted_env``, REDACTED_ENV_VARS), in this
        task or earlier in its session: an adapter masks them in its framework's logs."""
        return frozenset(self._output.secrets)

    @property
    def stop_state(self) -> StopState:
        return self._stop

    @property
    def record(self) -> TaskRecord:
        """A copy of the task's record. While an action runs, its ``pending_files`` and
        ``pending_dirs`` are those of the last save; they are brought up to date when it ends."""
        with self._recorder.lock:
            return self._recorder.record.model_copy(deep=True)

    @property
    def file_stats(self) -> CaptureStats:
        """Managed file data flow: bytes and files uploaded, and files whose content the store
        already had, over this execution."""
        return self._recorder.file_stats

    def stop(
        self,
        intent: StopIntent,
        *,
        force: bool = False,
        deadline: float | None = None,
        declared_done: str | None = None,
        cause: InterruptionCause = InterruptionCause.STOP,
    ) -> None:
        """Ask the task to stop. Thread-safe, idempotent, returns at once.

        ``CANCEL`` after ``CHECKPOINT`` turns the stop into a cancelation (the forceful exit);
        ``CHECKPOINT`` after ``CANCEL`` changes nothing. ``force=True`` kills the process tree
        now, without notifying, and skips the environments' ``onExit``.

        Args:
            intent: why the task stops (seed 000, "Semantics").
            force: kill at once, without notifying.
            deadline: seconds since the epoch (``time.time()``) by which every process of the
                task must be gone. A ``notifyPeriodInSeconds`` that would outlast it is
                shortened (with a warning naming both times) so that the tree is killed
                ``STOP_KILL_MARGIN_SECONDS`` before the deadline; an environment's ``onExit``
                that is still running then is killed too. The earliest deadline given wins.
            declared_done: the scheduler's user declared the task done (Airflow's "mark
                success"), for this reason: its end record says it finished (all its frames
                count), written under the task's lease, so no reader ever sees it unfinished
                between its end and a later ``record_task_done``.
            cause: what asks (an interruption notice, a stop, a timeout), recorded in the
                attempt's span for the metrics (``core.run.METRICS``); the first one stays.
        """
        self._stop.request(
            intent, force=force, deadline=deadline, declared_done=declared_done, cause=cause
        )

    # --- running ----------------------------------------------------------------------------------
    def run(self) -> TaskResult:
        """Run the task to its end in this thread. Never raises for task failures; raises
        ``StoreError`` only if the store cannot be written when the task starts."""
        rec = self._recorder.record
        rec.status = TaskStatus.RUNNING
        rec.attempt = max(rec.attempt, 0) + 1
        rec.run_attempt = self.attempt
        rec.message = None
        if self.spec.resume is not None:
            rec.resume_status = None
        open_span(rec, self.spec.resume)
        # Written with the task's process (one durable write instead of two), or before an
        # environment action, whichever comes first; _finish writes it in any case.
        self._recorder.changed()
        self._emit(TaskEventKind.STARTED, getattr(self.spec.resume, "generation", None), record=rec)
        session = self._session
        private = session is None
        if session is None:
            session = Session(
                self.job,
                run_id=self.run_id if self.store is not None else None,
                store=self.store,
                working_root=self._working_root,
                os_env=self._os_env,
                job_status=self.job_status,
            )
            self._session = session
        session.redacted.update(self._output.secrets)
        self._output.secrets = session.redacted  # the session's onEnter secrets hold here
        exit_code: int | None = None
        message = ""
        failed = False
        try:
            problem = session.prepare(self)
            if problem is not None:
                failed, message = True, problem
            elif self._stop.intent is None:
                code, message = self._run_task_action(session)
                failed = code != 0
                exit_code = self._actions.action_exit  # the process's own: None if it never ran
        except Exception as exc:  # a bug or an OS error: fail the task, keep the store intact
            failed, message = True, f"{type(exc).__name__}: {exc}"
        finally:
            release_marker(self._marker)  # a spare its action did not take (it never started)
            session.task_done(self)
            if private:
                problem = session.close(self)
                if problem and not failed and self._stop.intent is None:
                    failed, message = True, problem
        return self._finish(exit_code, failed, message)

    def run_environment_action(
        self,
        env_model: Any,
        path: str,
        which: str,
        symtab: SymbolTable,
        env: dict[str, str],
        *,
        marker: str,
    ) -> tuple[int, str]:
        """Run an environment's ``onEnter`` or ``onExit`` for this task's session (exit code 0
        if it has none). Its processes carry the environment's ``marker``; what ``onEnter``
        leaves running lives on (the session kills it after ``onExit``). ``onExit`` runs even
        when the task is being stopped; only an abandon (``force``) or a deadline stops it."""
        action = getattr(getattr(env_model.script, "actions", None), which, None)
        if action is None:
            return 0, ""
        self._recorder.persist()  # the task's start, if not yet written: environments may take long
        session = self._session
        assert session is not None and session.working_dir is not None
        return self._actions.run(
            action,
            f"{path}.script.actions.{which}",
            symtab,
            env,
            session.working_dir,
            MessageContext(in_task_action=False, redaction_enabled=_REDACTION),
            env_action=True,
            stoppable=which not in ("onExit", "onWrapEnvExit"),
            marker=marker,
        )

    @property
    def lost_lease(self) -> str | None:
        """Why this execution lost its task's lease (it stopped and stored nothing more); None
        while it holds it."""
        return self._recorder.lost

    def lease_lost(self, why: str) -> None:
        """The task's lease, or the run's lease this process drives the run under, was found
        lost (the executor's lease watcher): as if a fenced write had been refused
        (``_lease_lost``). Thread-safe, once."""
        self._recorder.mark_lost(why)

    def _lease_lost(self, _why: str) -> None:
        """The task's lease was lost (a fenced write was refused): stop the task, since another
        process may run it now; it stores nothing more, and ends ``NOT_STORED`` (the executor
        says so, once for all its tasks)."""
        self.stop(StopIntent.CANCEL)

    def _finish(self, exit_code: int | None, failed: bool, message: str) -> TaskResult:
        """Decide the task's outcome and store its record as the task ends. A task whose end
        cannot be stored is never reported succeeded (``TaskOutcome.NOT_STORED``)."""
        with self._recorder.lock:
            rec = self._recorder.record
            rec.process = None
            fail = (self._output.fail_message or message) if failed else message
            outcome, message = _outcome(
                rec, self.spec, self._stop.intent, failed, fail, self._stop.declared_done
            )
            close_span(rec, self._stop.cause, self._stop.requested_at)
            unknown = self._ran_resume and rec.resume_status is None and exit_code is not None
            if unknown:
                rec.resume_status = rec.history[-1].resume_status = "UNKNOWN"
                self._warn(
                    "onCheckpointResume never reported openjd_checkpoint_resume_status; "
                    "recorded as UNKNOWN, not as resumed"
                )
            # Action paths are keyed by the combined step index; a person reads finally[j].
            message = _relabel(message, len(self.job.template.regular_steps))
            rec.message = message
            self._on_ending(self, outcome)  # reported ENDED only once persisted, below
            not_stored = self._recorder.persist(force=True, warn=False)  # the outcome says it
            if self._recorder.lost is not None:
                outcome = TaskOutcome.NOT_STORED
                message = (
                    "stopped: its lease expired here (another process may run it now); "
                    "nothing more of it was stored here"
                )
            elif not_stored is not None:
                if outcome == TaskOutcome.SUCCEEDED:
                    outcome = TaskOutcome.NOT_STORED
                    message = (
                        f"ran to its end, but its end could not be stored ({not_stored}); it "
                        "is not counted as finished: the next attempt runs it again"
                    )
                else:
                    message = f"{message} (its end was not stored: {not_stored})"
            kill_point("task.ended-recorded")
            result = TaskResult(outcome, exit_code, message, rec.model_copy(deep=True))
        if unknown:  # reported as RESUMED and DISCARDED are, once recorded (outside the lock)
            self._emit(TaskEventKind.RESUME_STATUS, "UNKNOWN")
        self._emit(TaskEventKind.ENDED, result)
        return result

    def _run_task_action(self, session: Session) -> tuple[int, str]:
        step = self.job.step(self.spec.step_name)
        idx = self.job.template.step_index(self.spec.step_name)
        self._actions.action_exit = None
        symtab = SymbolTable(source=session.base_symtab(self.spec.step_name))
        for name, value in self.spec.parameters.items():
            session.add_parameter(symtab, "Task.", name, value)
        try:
            session.embedded_files(
                step.script.embeddedFiles, symtab, "Task", let=getattr(step.script, "let", None)
            )
        except ValueError as exc:  # a let binding or a file's data (EXPR) cannot be evaluated
            return 1, f"steps[{idx}].script: {exc}"
        session_dir = session.open()
        env = dict(session.env, **self._task_env)
        recorder = self._recorder
        recorder.start_capture(session_dir, self.job.job_key, self.run_id)
        resume, checkpoint_file = recorder.resume_from(self.spec.resume, session_dir)
        self._ran_resume = resume is not None
        if resume is not None:
            action = self.job.template.resume_actions[self.spec.step_name]
            path = f"steps[{idx}].script.actions.onCheckpointResume"
            symtab["Task.Checkpoint.State"] = resume.state or ""
            symtab["Task.Checkpoint.File"] = checkpoint_file or ""
            if self.job.uses_expr:  # a path, as Session.WorkingDirectory is (.parent, .name)
                symtab.expr_types["Task.Checkpoint.File"] = ParameterValueType.PATH.value
            self._emit(
                TaskEventKind.STATUS, f"resuming from checkpoint generation {resume.generation}"
            )
        else:
            action = step.script.actions.onRun
            path = f"steps[{idx}].script.actions.onRun"
        ctx = MessageContext(
            chunk_parameter=self.spec.chunk_parameter,
            chunk_frames=self.spec.chunk_frames,
            in_resume_action=resume is not None,
            in_task_action=True,
            redaction_enabled=_REDACTION,
        )
        wrapped_path: str | None = None
        wrapper = session.wrapper("onRun")
        if wrapper is not None:  # WRAP_ACTIONS: the hook runs in place of the task's action
            try:
                hook_symtab = session.wrap_symtab(wrapper)
                inject_wrapped(
                    hook_symtab,
                    action,
                    symtab,
                    environment=session.environment_list(),
                    task_run=True,
                )
                hook_symtab["WrappedStep.Name"] = self.spec.step_name
            except ValueError as exc:
                return 1, f"{wrapper.path}.script.actions.onWrapTaskRun: {exc}"
            wrapped_path, path = path, f"{wrapper.path}.script.actions.onWrapTaskRun"
            action, symtab = wrapper.model.script.actions.onWrapTaskRun, hook_symtab
        try:
            return self._actions.run(
                action, path, symtab, env, session_dir, ctx, wrapped_path=wrapped_path
            )
        finally:
            recorder.close_capture()

    # --- one action -------------------------------------------------------------------------------
    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        self._emit(TaskEventKind.WARNING, text)

    def _emit(self, kind: TaskEventKind, value: Any, **more: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(self, TaskEvent(kind, value, **more))
            except Exception:  # a display must never break a task
                pass


class ActionRunner:
    """Runs one action of a task execution at a time, its task action or its session's
    environment actions: the command resolved, its process started with the task's marker
    (``ActionProcess``), supervised under the task's stop state (``supervise``: intents,
    timeouts, notify-then-terminate, deadlines), its output lines handed to the task's
    protocol (``TaskOutput``) and its start and end recorded (``TaskRecorder``).

    Args:
        job: the prepared job.
        output: the task's output protocol.
        recorder: the task's recorder.
        stop: the task's stop state.
        marker: the task's process marker.
        max_line_bytes: the protocol's line cap in bytes.
        warn / emit: the task's warnings and events.
    """

    def __init__(
        self,
        job: PreparedJob,
        output: TaskOutput,
        recorder: TaskRecorder,
        stop: StopState,
        *,
        marker: str,
        max_line_bytes: int,
        warn: Callable[[str], None],
        emit: Callable[[TaskEventKind, Any], None],
    ) -> None:
        self.job = job
        self._output = output
        self._recorder = recorder
        self.stop = stop
        self._marker = marker
        self._max_line_bytes = max_line_bytes
        self._warn = warn
        self._emit = emit
        self.action_exit: int | None = None
        """The last task action's process's own exit code (None: it never started)."""

    def run(
        self,
        action: Any,
        path: str,
        symtab: SymbolTable,
        env: dict[str, str],
        session_dir: str,
        ctx: MessageContext,
        *,
        env_action: bool = False,
        stoppable: bool = True,
        marker: str | None = None,
        wrapped_path: str | None = None,
    ) -> tuple[int, str]:
        """Run one action to its end: (its exit code, why it failed or ""). ``env_action``: an
        environment's (its processes are the session's to record; an ``onEnter``'s variable
        changes go into ``env``); ``stoppable``: False for ``onExit``, which only a forced
        stop or a deadline ends; ``marker``: the environment's marker (default: the task's).
        ``wrapped_path``: the task action a WRAP_ACTIONS hook runs in place of; a checkpoint
        request then uses that action's ``checkpointCancelation`` (sent to the hook's process
        group, so the wrapped process gets the notify signal too), while a cancel or a
        time-out uses the hook's own ``cancelation``."""
        try:
            argv, timeout, spec = _resolve_action(self.job, action, path, symtab, wrapped_path)
        except ValueError as exc:  # FormatStringError, ExpressionError, a bad resolved value
            return 1, f"{path}: {exc}"
        env_changes: dict[str, str | None] = {}
        output = self._output
        output.fail_message = None

        def on_lines(lines: list[OutputLine]) -> None:
            output.handle(lines, ctx, env_changes if env_action else None)

        marker = marker or self._marker
        if not env_action:  # named in the record before it starts: by its pid too as a spare
            self._recorder.action_process.starting(marker, marked_spare(marker))
        proc = ActionProcess(
            argv,
            cwd=session_dir,
            env=dict(env, **{MARKER_VARIABLE: marker}),
            on_lines=on_lines,
            max_line_bytes=self._max_line_bytes,
            marker=marker,
        )
        try:
            ident = proc.start()
        except OSError as exc:
            return 1, f"{path}: cannot start {argv[0]!r}: {exc}"
        if not env_action:  # environments' processes are the session's to record
            self._recorder.action_process.started(ident, marker)
        self._emit(TaskEventKind.ACTION_STARTED, path)
        timed_out = supervise(
            proc,
            path=path,
            spec=spec,
            symtab=symtab,
            extensions=_extensions(self.job),
            stop=self.stop,
            stoppable=stoppable,
            timeout=timeout,
            session_dir=session_dir,
            warn=self._warn,
        )
        # What an environment's onEnter leaves running (a daemon) lives until its onExit.
        code = proc.finish(kill_leftovers=not (env_action and stoppable))
        self._recorder.flush()
        if not env_action:
            self.action_exit = code
            self._recorder.process_ended(self.stop)
        output.tell_dropped()
        self._emit(TaskEventKind.ACTION_ENDED, code)
        if env_action and code == 0:
            for name, value in env_changes.items():
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
        if timed_out:
            return (code if code != 0 else 1), f"{path}: timed out after {timeout:g} s"
        if env_action and code and not output.fail_message:  # no task exit code is shown for it
            return code, f"{path} failed: {describe_exit(code)}"
        return code, (output.fail_message or (f"{path} failed" if code else ""))


def _outcome(
    rec: TaskRecord,
    spec: TaskSpec,
    intent: StopIntent | None,
    failed: bool,
    message: str,
    declared_done: str | None = None,
) -> tuple[TaskOutcome, str]:
    """The task's outcome and its message (``message``: why it failed, when ``failed``), with
    the record's status set to match; ``declared_done`` (why the task was declared done while
    it ran): the record says succeeded, whatever the action did."""
    outcome, message = _outcome_of_action(rec, spec, intent, failed, message)
    if declared_done is not None:
        rec.status = TaskStatus.SUCCEEDED
        if spec.chunk_parameter:
            rec.completed_frames = sorted(set(rec.completed_frames) | spec.chunk_frames)
        message = f"{message}; recorded as done ({declared_done})"
    return outcome, message


def _outcome_of_action(
    rec: TaskRecord, spec: TaskSpec, intent: StopIntent | None, failed: bool, message: str
) -> tuple[TaskOutcome, str]:
    if intent == StopIntent.CHECKPOINT:
        has = rec.checkpoint is not None or bool(rec.completed_frames)
        rec.status = TaskStatus.INTERRUPTED
        # what it kept, in the words every runner shows (the action's own exit, a failure to
        # it, is what the stop asked for)
        outcome = TaskOutcome.INTERRUPTED_WITH_CHECKPOINT if has else TaskOutcome.INTERRUPTED
        return outcome, suspended_words(rec)
    if intent == StopIntent.CANCEL:
        rec.status = TaskStatus.CANCELED
        return TaskOutcome.CANCELED, "canceled"
    if failed:
        rec.status = TaskStatus.FAILED
        return TaskOutcome.FAILED, message or "failed"
    rec.status = TaskStatus.SUCCEEDED
    if spec.chunk_parameter:
        rec.completed_frames = sorted(set(rec.completed_frames) | spec.chunk_frames)
    return TaskOutcome.SUCCEEDED, message


_REDACTION = True
"""``openjd_redacted_env`` is honoured whether or not the template declares REDACTED_ENV_VARS,
as openjd-sessions 0.14 does: a secret is never shown because of a missing declaration
(docs/decisions.md, "Extensions")."""


def _extensions(job: PreparedJob) -> list[str]:
    from core.job import MODEL_EXTENSIONS

    return sorted(e for e in job.template.extensions if e in MODEL_EXTENSIONS)


def _resolve_action(
    job: PreparedJob, action: Any, path: str, symtab: SymbolTable, wrapped_path: str | None
) -> tuple[list[str], int | None, ActionCheckpointSpec]:
    """An action's command line, timeout and CHECKPOINT parts, resolved against ``symtab``.

    Raises:
        ValueError: a format string, an expression or a resolved value is not valid (an
            argument with a NUL byte among them).
    """
    argv = [action.command.resolve(symtab=symtab)] + resolve_args(action.args, symtab)
    for index, text in enumerate(argv):
        if "\0" in text:  # no execve can pass one: say which, not Popen's "embedded null byte"
            where = "command" if index == 0 else f"args[{index - 1}]"
            raise ValueError(
                f"{where} resolves to text with a NUL byte (U+0000), which no program can be "
                "given as an argument (a value it uses holds one: a task's checkpoint state, a "
                "parameter)"
            )
    timeout = resolve_int_field(
        getattr(action, "timeout", None), symtab, ge=1, description="timeout"
    )
    spec = _effective_spec(job, action, path, symtab)
    if wrapped_path is not None:
        spec = dataclasses.replace(
            spec,
            checkpoint_cancelation=job.template.action_spec(wrapped_path).checkpoint_cancelation,
        )
    return argv, timeout, spec


def _effective_spec(
    job: PreparedJob, action: Any, path: str, symtab: SymbolTable
) -> ActionCheckpointSpec:
    """The action's CHECKPOINT parts with a ``cancelation`` given by format strings
    (FEATURE_BUNDLE_1: a ``mode`` or ``notifyPeriodInSeconds``, as WRAP_ACTIONS forwards
    them) resolved now, against the scope the command resolved in: a value that cannot be
    resolved fails the action before it starts, as in openjd-sessions.

    Raises:
        ValueError: the cancelation does not resolve to a valid one.
    """
    spec = job.template.action_spec(path)
    cancel = getattr(action, "cancelation", None)
    if cancel is None or (
        path in job.template.actions
        and isinstance(getattr(cancel, "mode", None), Enum)
        and not hasattr(getattr(cancel, "notifyPeriodInSeconds", None), "resolve_value")
    ):
        return spec  # literal values of the job template: validated with it
    # Format strings, or an external environment template's action (not in the job
    # template's table): taken from the action's own model.
    mode, period = resolve_cancelation(cancel, symtab)
    if mode != "NOTIFY_THEN_TERMINATE":
        method = CancelMethod()
    else:
        default = (
            DEFAULT_NOTIFY_PERIOD_SECONDS
            if path.endswith((".onRun", ".onCheckpointResume", ".onWrapTaskRun"))
            else 30
        )
        method = dataclasses.replace(
            spec.cancelation,
            mode=mode,
            notify_period_seconds=float(period if period is not None else default),
            notify_period_text=None,
        )
    return dataclasses.replace(spec, cancelation=method)
