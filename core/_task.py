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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from openjd.model import ParameterValueType, SymbolTable

from ._action import (
    STOP_KILL_MARGIN_SECONDS,
    StopIntent,
    StopState,
    supervise,
)
from ._capture import CaptureStats, FileCapture
from ._errors import StoreError
from ._expr import resolve_args, resolve_cancelation, resolve_int_field
from ._files import RestoreError
from ._host import FileDataFlow, host_id
from ._job import PreparedJob, TaskSpec
from ._messages import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_STATE_BYTES,
    CheckpointFiles,
    CheckpointSave,
    EnvSet,
    EnvUnset,
    Fail,
    FilesMode,
    MessageContext,
    MessageEvent,
    MessageWarning,
    Progress,
    ResumeStatus,
    Status,
    TaskComplete,
    parse_line,
)
from ._process import (
    MARKER_VARIABLE,
    ActionProcess,
    OutputLine,
    new_marker,
)
from ._records import CheckpointData, ProcessInfo, TaskRecord, TaskStatus
from ._restore import RestoreResult, restore_checkpoint
from ._session import Session
from ._store import CheckpointStore
from ._template import (
    DEFAULT_NOTIFY_PERIOD_SECONDS,
    ActionCheckpointSpec,
    CancelMethod,
    _relabel,
)
from ._words import describe_exit
from ._wrap import inject_wrapped

__all__ = (
    "DEFAULT_MAX_OUTPUT_WARNINGS",
    "TaskEvent",
    "TaskExecution",
    "TaskOutcome",
    "TaskResult",
)

REDACTED = "********"

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


@dataclass(frozen=True)
class TaskEvent:
    """Something a running task reported, for progress displays and adapters.

    Attributes:
        kind: ``started`` (the attempt began), ``progress``, ``status``, ``fail``,
            ``checkpoint_saved``, ``frame_complete``, ``resume_status``, ``warning``,
            ``action_started``, ``action_ended``, ``ended`` (the attempt's outcome is decided).
        value: the percentage (float), the message (str), the generation (int) or frame (int);
            for ``started`` the checkpoint generation it resumes from (None: from the top), for
            ``ended`` the ``TaskResult``.
        time: seconds since the epoch.
    """

    kind: str
    value: Any
    time: float = field(default_factory=time.time)


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
    ) -> None:
        self.job = job
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
        self._max_line = max_line_bytes
        self._max_state = max_state_bytes
        self._max_output_warnings = max_output_warnings
        self._output_warnings = 0
        """Warnings about output lines so far, kept or not."""
        self._output_warnings_told = 0
        """Of those over the cap, how many a summary warning has already counted."""
        self._lock = threading.RLock()
        self._stop = StopState()
        self._progress: float | None = None
        self._status: str | None = None
        self._fail_message: str | None = None
        self._redacted: set[str] = set()
        self._record = record or job.new_task_record(spec, run_id)
        self._marker = new_marker()
        self._dirty = False
        self._pending_save: CheckpointSave | None = None
        # The checkpoint's file dataset so far, as insertion-ordered sets. The record's
        # pending_files/pending_dirs are synced from them when a checkpoint is committed and
        # when the action ends, not on every message: a message costs O(its paths).
        self._files: dict[str, None] = dict.fromkeys(self._record.pending_files)
        self._dirs: dict[str, None] = dict.fromkeys(self._record.pending_dirs)
        self._dataset_changed = False
        self._save_dataset: tuple[list[str], list[str]] | None = None
        """The dataset as it was at the pending save, if a later message changed it since."""
        self._capture: FileCapture | None = None
        """Managed file data flow: uploads declared files while the task action runs."""
        self._outputs_written = 0.0
        self._ran_resume = False
        """True once ``onCheckpointResume`` (not ``onRun``) was started."""
        self._action_exit: int | None = None
        """The task action's process's own exit code (None: it never started)."""
        self.file_stats = CaptureStats()
        """Managed file data flow: bytes and files uploaded, and files whose content the store
        already had, over this execution."""
        self._outputs: dict[str, tuple[str, int]] | None = None
        self.warnings: list[str] = []
        """Warnings so far; those about output lines are capped (``max_output_warnings``)."""

    # --- thread-safe public surface -------------------------------------------------------------
    @property
    def progress(self) -> float | None:
        """Last ``openjd_progress`` (0..100), or None."""
        return self._progress

    @property
    def status_message(self) -> str | None:
        """Last ``openjd_status`` text, or None."""
        return self._status

    @property
    def redacted_values(self) -> frozenset[str]:
        """Values declared secret so far (``openjd_redacted_env``, REDACTED_ENV_VARS), in this
        task or earlier in its session: an adapter masks them in its framework's logs."""
        return frozenset(self._redacted)

    @property
    def stop_intent(self) -> StopIntent | None:
        return self._stop.intent

    @property
    def record(self) -> TaskRecord:
        """A copy of the task's record. While an action runs, its ``pending_files`` and
        ``pending_dirs`` are those of the last save; they are brought up to date when it ends."""
        with self._lock:
            return self._record.model_copy(deep=True)

    def stop(
        self, intent: StopIntent, *, force: bool = False, deadline: float | None = None
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
        """
        self._stop.request(intent, force=force, deadline=deadline)

    # --- running ----------------------------------------------------------------------------------
    def run(self) -> TaskResult:
        """Run the task to its end in this thread. Never raises for task failures; raises
        ``StoreError`` only if the store cannot be written when the task starts."""
        rec = self._record
        rec.status = TaskStatus.RUNNING
        rec.attempt = max(rec.attempt, 0) + 1
        rec.run_attempt = self.attempt
        rec.message = None
        if self.spec.resume is not None:
            rec.resume_status = None
        # Written with the task's process (one durable write instead of two), or before an
        # environment action, whichever comes first; _finish writes it in any case.
        self._dirty = True
        self._emit("started", self.spec.resume.generation if self.spec.resume else None)
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
        session.redacted.update(self._redacted)
        self._redacted = session.redacted  # secrets of the session's onEnter hold for this task
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
                exit_code = self._action_exit  # the process's own: None if it never ran
        except Exception as exc:  # a bug or an OS error: fail the task, keep the store intact
            failed, message = True, f"{type(exc).__name__}: {exc}"
        finally:
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
        self._persist()  # the task's start, if not yet written: environments may take long
        session = self._session
        assert session is not None and session.working_dir is not None
        return self._run_action(
            action,
            f"{path}.script.actions.{which}",
            symtab,
            env,
            session.working_dir,
            MessageContext(in_task_action=False, redaction_enabled=self._redaction()),
            env_action=True,
            stoppable=which not in ("onExit", "onWrapEnvExit"),
            marker=marker,
        )

    def _finish(self, exit_code: int | None, failed: bool, message: str) -> TaskResult:
        with self._lock:
            rec = self._record
            rec.process = None
            intent = self._stop.intent
            if intent == StopIntent.CHECKPOINT:
                has = rec.checkpoint is not None or bool(rec.completed_frames)
                outcome = (
                    TaskOutcome.INTERRUPTED_WITH_CHECKPOINT if has else TaskOutcome.INTERRUPTED
                )
                rec.status = TaskStatus.INTERRUPTED
                if rec.checkpoint is not None:
                    message = f"interrupted; checkpoint generation {rec.checkpoint.generation} kept"
                elif rec.completed_frames:
                    message = f"interrupted; {len(rec.completed_frames)} finished frame(s) kept"
                else:  # the action's own exit (a failure, to it) is what the stop asked for
                    message = "interrupted; nothing to resume from (it runs from its start again)"
            elif intent == StopIntent.CANCEL:
                outcome, rec.status = TaskOutcome.CANCELED, TaskStatus.CANCELED
                message = "canceled"
            elif failed:
                outcome, rec.status = TaskOutcome.FAILED, TaskStatus.FAILED
                message = self._fail_message or message or "failed"
            else:
                outcome, rec.status = TaskOutcome.SUCCEEDED, TaskStatus.SUCCEEDED
                if self.spec.chunk_parameter:
                    rec.completed_frames = sorted(
                        set(rec.completed_frames) | self.spec.chunk_frames
                    )
            unknown = self._ran_resume and rec.resume_status is None and exit_code is not None
            if unknown:
                rec.resume_status = "UNKNOWN"
                self._warn(
                    "onCheckpointResume never reported openjd_checkpoint_resume_status; "
                    "recorded as UNKNOWN, not as resumed"
                )
            # Action paths are keyed by the combined step index; a person reads finally[j].
            message = _relabel(message, len(self.job.template.regular_steps))
            rec.message = message
            self._persist(force=True)
            result = TaskResult(outcome, exit_code, message, rec.model_copy(deep=True))
        if unknown:  # reported as RESUMED and DISCARDED are, once recorded (outside the lock)
            self._emit("resume_status", "UNKNOWN")
        self._emit("ended", result)
        return result

    def _extensions(self) -> list[str]:
        from ._template import MODEL_EXTENSIONS

        return sorted(e for e in self.job.template.extensions if e in MODEL_EXTENSIONS)

    def _effective_spec(self, action: Any, path: str, symtab: SymbolTable) -> ActionCheckpointSpec:
        """The action's CHECKPOINT parts with a ``cancelation`` given by format strings
        (FEATURE_BUNDLE_1: a ``mode`` or ``notifyPeriodInSeconds``, as WRAP_ACTIONS forwards
        them) resolved now, against the scope the command resolved in: a value that cannot be
        resolved fails the action before it starts, as in openjd-sessions.

        Raises:
            ValueError: the cancelation does not resolve to a valid one.
        """
        spec = self.job.template.action_spec(path)
        cancel = getattr(action, "cancelation", None)
        if cancel is None or (
            path in self.job.template.actions
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

    def _redaction(self) -> bool:
        """``openjd_redacted_env`` is honoured whether or not the template declares
        REDACTED_ENV_VARS, as openjd-sessions 0.14 does: a secret is never shown because of a
        missing declaration (docs/decisions.md, "Extensions")."""
        return True

    def _run_task_action(self, session: Session) -> tuple[int, str]:
        step = self.job.step(self.spec.step_name)
        idx = self.job.template.step_index(self.spec.step_name)
        self._action_exit = None
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
        env = dict(session.env)
        resume = self.spec.resume
        store = self.store
        if store is not None and self._file_flow(store) == FileDataFlow.MANAGED:
            self._capture = FileCapture(
                store, session_dir, store.file_roots, self._warn, on_uploaded=self._uploaded
            )
        checkpoint_file = resume.file if resume is not None else None
        if resume is not None and resume.manifest:
            restored = self._restore(resume, session_dir)
            if restored is None:
                resume = None
            else:
                resume, result = restored
                checkpoint_file = result.file
        if resume is None and self._capture is not None:
            with self._lock:  # from the top: paths of an earlier session are gone
                self._files.clear()
                self._dirs.clear()
                self._dataset_changed = True
        self._ran_resume = resume is not None
        if resume is not None:
            action = self.job.template.resume_actions[self.spec.step_name]
            path = f"steps[{idx}].script.actions.onCheckpointResume"
            symtab["Task.Checkpoint.State"] = resume.state or ""
            symtab["Task.Checkpoint.File"] = checkpoint_file or ""
            if self.job.uses_expr:  # a path, as Session.WorkingDirectory is (.parent, .name)
                symtab.expr_types["Task.Checkpoint.File"] = ParameterValueType.PATH.value
            self._emit("status", f"resuming from checkpoint generation {resume.generation}")
        else:
            action = step.script.actions.onRun
            path = f"steps[{idx}].script.actions.onRun"
        ctx = MessageContext(
            chunk_parameter=self.spec.chunk_parameter,
            chunk_frames=self.spec.chunk_frames,
            in_resume_action=resume is not None,
            in_task_action=True,
            redaction_enabled=self._redaction(),
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
            return self._run_action(
                action, path, symtab, env, session_dir, ctx, wrapped_path=wrapped_path
            )
        finally:
            if self._capture is not None:
                self._capture.close()
                self.file_stats = self._capture.stats
                self._capture = None

    def _file_flow(self, store: CheckpointStore) -> FileDataFlow:
        """The run's own file data flow (fixed when the run was created), else the store's."""
        try:
            run = store.read_run(self.job.job_key, self.run_id)
            if run is not None and run.files_mode:
                return FileDataFlow(run.files_mode)
        except (StoreError, ValueError):
            pass
        return store.file_flow

    def _restore(
        self, resume: CheckpointData, session_dir: str
    ) -> tuple[CheckpointData, RestoreResult] | None:
        """Restore the files of ``resume`` (managed file data flow) into the session; on a
        failure, warn and try the older generations still stored. None: nothing restorable,
        the task runs ``onRun`` from the top."""
        assert self.store is not None
        candidates = [resume]
        try:
            older = self.store.list_generations(self._record)
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
            with self._lock:
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
            self.store.write_outputs(self._record, self._outputs)
        except StoreError as exc:
            self._warn(f"early outputs not stored: {exc}")

    def _drain_capture(self) -> None:
        """Wait for the files being captured and the saves being committed, at most until the
        stop deadline."""
        capture = self._capture
        if capture is None:
            return
        while not capture.drain(0.1):
            deadline = self._stop.deadline
            if (
                self._stop.intent == StopIntent.CANCEL
                or self._stop.force
                or (deadline is not None and time.time() >= deadline - STOP_KILL_MARGIN_SECONDS)
            ):
                capture.abandon()
                why = (
                    "the task was canceled"
                    if self._stop.intent == StopIntent.CANCEL
                    else "the task was stopped at once"
                    if self._stop.force
                    else "the stop deadline came"
                )
                self._warn(
                    f"{why} before every checkpoint file was stored: the saves still uploading "
                    "were not committed, the previous generation stays"
                )
                break
        self._write_outputs()

    # --- one action -------------------------------------------------------------------------------
    def _run_action(
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
        """Run one action. ``wrapped_path``: the task action a WRAP_ACTIONS hook runs in place
        of; a checkpoint request then uses that action's ``checkpointCancelation`` (sent to the
        hook's process group, so the wrapped process gets the notify signal too), while a
        cancel or a time-out uses the hook's own ``cancelation``."""
        try:
            argv = [action.command.resolve(symtab=symtab)] + resolve_args(action.args, symtab)
            timeout = resolve_int_field(
                getattr(action, "timeout", None), symtab, ge=1, description="timeout"
            )
            spec = self._effective_spec(action, path, symtab)
            if wrapped_path is not None:
                spec = dataclasses.replace(
                    spec,
                    checkpoint_cancelation=self.job.template.action_spec(
                        wrapped_path
                    ).checkpoint_cancelation,
                )
        except ValueError as exc:  # FormatStringError, ExpressionError, a bad resolved value
            return 1, f"{path}: {exc}"
        env_changes: dict[str, str | None] = {}
        self._fail_message = None

        def on_lines(lines: list[OutputLine]) -> None:
            self._handle_lines(lines, ctx, env_changes if env_action else None)

        marker = marker or self._marker
        proc = ActionProcess(
            argv,
            cwd=session_dir,
            env=dict(env, **{MARKER_VARIABLE: marker}),
            on_lines=on_lines,
            max_line_bytes=self._max_line,
            marker=marker,
        )
        try:
            ident = proc.start()
        except OSError as exc:
            return 1, f"{path}: cannot start {argv[0]!r}: {exc}"
        if not env_action:  # environments' processes are the session's to record
            with self._lock:
                self._record.process = ProcessInfo(
                    pid=ident.pid,
                    pgid=ident.pgid,
                    start_time=ident.start_time,
                    host=host_id(),
                    marker=marker,
                )
            self._persist(force=True)
        self._emit("action_started", path)
        timed_out = supervise(
            proc,
            path=path,
            spec=spec,
            symtab=symtab,
            extensions=self._extensions(),
            stop=self._stop,
            stoppable=stoppable,
            timeout=timeout,
            session_dir=session_dir,
            warn=self._warn,
        )
        # What an environment's onEnter leaves running (a daemon) lives until its onExit.
        code = proc.finish(kill_leftovers=not (env_action and stoppable))
        self._flush_pending()
        if not env_action:
            self._action_exit = code
            self._drain_capture()
            with self._lock:
                self._record.process = None
                self._sync_dataset()
                # Written by the next persist: _finish's, as the task ends (one durable write
                # instead of two). A runner killed in between leaves the record naming a
                # process that has exited, which the next run's reaping finds gone.
                self._dirty = True
        self._tell_dropped_warnings()
        self._emit("action_ended", code)
        if env_action and code == 0:
            for name, value in env_changes.items():
                if value is None:
                    env.pop(name, None)
                else:
                    env[name] = value
        if timed_out:
            return (code if code != 0 else 1), f"{path}: timed out after {timeout:g} s"
        if env_action and code and not self._fail_message:  # no task exit code is shown for it
            return code, f"{path} failed: {describe_exit(code)}"
        return code, (self._fail_message or (f"{path} failed" if code else ""))

    # --- output and messages ----------------------------------------------------------------------
    def _handle_lines(
        self,
        lines: list[OutputLine],
        ctx: MessageContext,
        env_changes: dict[str, str | None] | None,
    ) -> None:
        texts: list[str] = []
        for line in lines:
            if line.oversized:
                self._warn_line(
                    f"output line {line.number}: {line.size} bytes is over the "
                    f"{self._max_line}-byte line cap; the line was dropped and not parsed"
                )
                continue
            data = line.data
            try:
                text = data.decode("utf-8")
                bad_utf8 = False
            except UnicodeDecodeError:
                text = data.decode("utf-8", errors="replace")
                bad_utf8 = True
            stripped = data.lstrip()
            if stripped.startswith(b"openjd_"):
                if bad_utf8:
                    if stripped.startswith(b"openjd_redacted_env"):
                        text = "openjd_redacted_env: " + REDACTED
                    self._warn_line(
                        f"output line {line.number}: not valid UTF-8; the message was ignored"
                    )
                else:
                    result = parse_line(text, max_state_bytes=self._max_state)
                    if isinstance(result, MessageWarning):
                        if result.kind == "openjd_redacted_env":
                            text = "openjd_redacted_env: " + REDACTED
                        self._warn_line(result.describe(line.number))
                    elif result is not None:
                        problem = ctx.check(result)
                        if isinstance(result, EnvSet) and result.redacted:
                            self._redacted.add(result.value)
                            text = f"openjd_redacted_env: {result.name}={REDACTED}"
                        if problem is not None:
                            self._warn_line(problem.describe(line.number))
                        else:
                            self._apply(result, line.number, env_changes)
            if self._redacted:
                for secret in self._redacted:
                    if secret:
                        text = text.replace(secret, REDACTED)
            texts.append(text)
        self._flush_pending()
        if self._dirty:
            self._persist()
        if texts and self._on_output is not None:
            self._on_output(self, texts)

    def _apply(
        self, event: MessageEvent, number: int, env_changes: dict[str, str | None] | None
    ) -> None:
        rec = self._record
        if isinstance(event, Progress):
            self._progress = event.percent
            self._emit("progress", event.percent)
        elif isinstance(event, Status):
            self._status = event.message
            self._emit("status", event.message)
        elif isinstance(event, Fail):
            self._fail_message = event.message
            self._emit("fail", event.message)
        elif isinstance(event, (EnvSet, EnvUnset)):
            if env_changes is None:
                self._warn_line(
                    f"output line {number}: environment variables can only be changed by an "
                    "environment's onEnter; ignored"
                )
            elif isinstance(event, EnvSet):
                env_changes[event.name] = event.value
            else:
                env_changes[event.name] = None
        elif isinstance(event, CheckpointFiles):
            refused = self._files_refusal(event.files, event.dirs)
            if refused is not None:
                self._warn_line(
                    f"output line {number}: openjd_checkpoint_files names {refused}; the "
                    "message was ignored"
                )
                return
            if self._capture is not None:
                self._capture.declare(event.files, event.dirs)
            with self._lock:
                if self._pending_save is not None and self._save_dataset is None:
                    # A save waits for the end of this batch: it keeps the dataset it saw.
                    self._save_dataset = (list(self._files), list(self._dirs))
                if event.mode == FilesMode.RESET:
                    self._files.clear()
                    self._dirs.clear()
                self._files.update(dict.fromkeys(event.files))
                self._dirs.update(dict.fromkeys(event.dirs))
                self._dataset_changed = True
        elif isinstance(event, TaskComplete):
            with self._lock:
                if event.frame not in rec.completed_frames:
                    rec.completed_frames.append(event.frame)
                    rec.completed_frames.sort()
                    self._dirty = True
            self._emit("frame_complete", event.frame)
        elif isinstance(event, CheckpointSave):
            if event.file is not None and self._capture is not None:
                problem = self._capture.refusal(event.file)
                if problem is not None:
                    self._warn_line(
                        f"output line {number}: openjd_checkpoint_save names file "
                        f"{event.file!r}, which a managed store does not capture: {problem}; "
                        "nothing was saved and the previous checkpoint stays"
                    )
                    return
            elif (
                event.file is not None
                and self._session is not None
                and self._session.working_dir is not None
                and os.path.realpath(event.file).startswith(
                    os.path.realpath(self._session.working_dir) + os.sep
                )
            ):
                self._warn_line(
                    f"output line {number}: openjd_checkpoint_save names file {event.file!r} in "
                    "the session working directory, which is deleted when the task ends; "
                    "nothing was saved and the previous checkpoint stays"
                )
                return
            if event.file is not None and not os.path.exists(event.file):
                self._warn_line(
                    f"output line {number}: openjd_checkpoint_save names file {event.file!r}, "
                    "which does not exist; nothing was saved and the previous checkpoint stays"
                )
                return
            if any(s and s in (event.state or "") for s in self._redacted):
                self._warn_line(
                    f"output line {number}: the checkpoint state holds a redacted value; "
                    "nothing was saved and the previous checkpoint stays"
                )
                return
            with self._lock:
                self._pending_save = event  # committed once per batch of lines: the latest wins
                self._save_dataset = None
        elif isinstance(event, ResumeStatus):
            with self._lock:
                rec.resume_status = event.status.value
                self._dirty = True
            self._emit("resume_status", event.status.value)

    def _files_refusal(self, files: tuple[str, ...], dirs: tuple[str, ...]) -> str | None:
        """Why an ``openjd_checkpoint_files`` message is refused whole, or None: in managed
        mode a path the store may not capture; in shared mode a path inside the session working
        directory, which is deleted when the task ends."""
        if self._capture is not None:
            for path in [*files, *dirs]:
                problem = self._capture.refusal(path)
                if problem is not None:
                    return f"{path!r}, which a managed store does not capture: {problem}"
            return None
        session_dir = self._session.working_dir if self._session is not None else None
        if session_dir is None:
            return None
        real_dir = os.path.realpath(session_dir)
        for path in [*files, *dirs]:
            real = os.path.realpath(path)
            if real == real_dir or real.startswith(real_dir + os.sep):
                return (
                    f"{path!r} in the session working directory, which is deleted when the "
                    "task ends (use a managed store, --files managed, to keep such files)"
                )
        return None

    def _flush_pending(self) -> None:
        save = self._pending_save
        if save is None:
            return
        with self._lock:
            self._pending_save = None
            files, dirs = self._save_dataset or (list(self._files), list(self._dirs))
            self._save_dataset = None
            if self._capture is not None:
                self._capture.save(save.file, files, dirs, self._committer(save, files, dirs))
                return
            rec = self._record
            gen = (rec.checkpoint.generation if rec.checkpoint else 0) + 1
            data = CheckpointData(
                generation=gen,
                state=save.state,
                file=save.file,
                files=files,
                dirs=dirs,
                saved_at=time.time(),
                attempt=self.attempt,
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

    def _committer(
        self, save: CheckpointSave, files: list[str], dirs: list[str]
    ) -> Callable[[str, str | None], None]:
        """The commit of a save once its files are in the store (run on the capture thread)."""

        def commit(manifest: str, file: str | None) -> None:
            with self._lock:
                rec = self._record
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
                )
                self._sync_dataset()
                assert self.store is not None
                try:
                    self.store.commit_checkpoint(rec, data)
                except StoreError as exc:
                    self._warn(f"checkpoint generation {gen} was not stored: {exc}")
                    return
                self._dirty = False
            self._emit("checkpoint_saved", gen)

        return commit

    def _persist(self, force: bool = False) -> None:
        if self.store is None:
            self._dirty = False
            return
        with self._lock:
            if not (force or self._dirty):
                return
            try:
                self.store.write_task(self._record)
                self._dirty = False
            except StoreError as exc:
                self._warn(f"task record not stored: {exc}")

    def _sync_dataset(self) -> None:
        """Copy the file dataset into the record (under the lock), if it changed since."""
        if self._dataset_changed:
            self._record.pending_files = list(self._files)
            self._record.pending_dirs = list(self._dirs)
            self._dataset_changed = False
            self._dirty = True

    def _warn_line(self, text: str) -> None:
        """A warning about one output line: kept and reported only up to the cap."""
        self._output_warnings += 1
        if self._output_warnings <= self._max_output_warnings:
            self._warn(text)

    def _tell_dropped_warnings(self) -> None:
        over = self._output_warnings - self._max_output_warnings - self._output_warnings_told
        if over > 0:
            self._output_warnings_told += over
            self._warn(
                f"... and {over:,} more output line warning(s), not shown: only the first "
                f"{self._max_output_warnings:,} are kept"
            )

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        self._emit("warning", text)

    def _emit(self, kind: str, value: Any) -> None:
        if self._on_event is not None:
            try:
                self._on_event(self, TaskEvent(kind, value))
            except Exception:  # a display must never break a task
                pass
