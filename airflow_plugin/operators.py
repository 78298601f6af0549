"""The operators of a DAG made by ``dag_from_template``: translation only.

Every decision (which core run an attempt continues, what a task resumes from, when finally
steps run and with which ``{{Job.Status}}``, what a termination request means, the run's
outcome) is made by the core's run-level operations (``docs/core-api.md``); these operators
call them and map their answers onto Airflow task states:

- ``OpenJDBeginOperator`` (the DAG's setup task): ``core.begin_attempt`` with the external key
  ``<dag_id>/<run_id>``, or an operator resume when the ``resume`` param names a run.
- ``OpenJDPlanOperator`` (one per step): the step's *original* task list
  (``PreparedJob.plan_step`` with no records, stable across retries and clears), grouped into at
  most ``[core] max_map_length`` items for the step's mapped task to expand over.
- ``OpenJDTaskOperator`` (one mapped task per step): ``core.plan_group`` then
  ``core.run_tasks`` in one OpenJD session; ``on_kill`` asks the running task to checkpoint
  within Airflow's 5 s kill budget.
- ``OpenJDFinishOperator`` (the last teardown): ``core.finish_attempt``; fails the DAG run when
  the core's outcome is not success.

XCom carries references only: the attempt (job key, run id) and each group's label and range
of indexes into the step's original task list, never task descriptions, templates or
checkpoint states.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowSkipException,
)

import core
from core import original_tasks, plan_tasks

from ._config import BEGIN_TASK_ID, RESUME_PARAM, STATE_STORE_KEY, notice_settings, open_store

KILL_BUDGET_SECONDS = 4.0
"""How long after ``on_kill`` the task's processes must be gone, in seconds: inside the 5 s
between the supervisor's SIGTERM and its SIGKILL (``supervisor.py``, ``escalation_delay``)."""

_STOPPED = frozenset(
    {
        core.TaskOutcome.CANCELED,
        core.TaskOutcome.INTERRUPTED,
        core.TaskOutcome.INTERRUPTED_WITH_CHECKPOINT,
    }
)
"""Outcomes of a task that a stop of the run ended (``core.report.result_words`` says what it
kept)."""


def _attempt(context: Any, begin_task_id: str = BEGIN_TASK_ID) -> core.Attempt:
    data = context["ti"].xcom_pull(task_ids=begin_task_id)
    if not isinstance(data, dict):
        raise AirflowFailException(
            f"no attempt from {begin_task_id!r} in XCom (got {type(data).__name__}); "
            "clear the whole DAG run to begin again"
        )
    return core.Attempt.from_dict(data)


def _store(op: Any) -> core.CheckpointStore:
    """The operator's checkpoint store (its ``store``, ``files`` and ``file_roots``, else the
    worker's ``[openjd_checkpoint]`` settings; ``_config.open_store``). A bad setting fails the
    task without a retry: a retry would read the same setting."""
    try:
        return open_store(op.store, op.files, op.file_roots)
    except ValueError as exc:
        raise AirflowFailException(f"the checkpoint store settings: {exc}") from None


def _job(store: core.CheckpointStore, attempt: core.Attempt) -> core.PreparedJob:
    try:
        return core.prepare_run_job(store, attempt.job_key, attempt.run_id)
    except (core.RunError, core.TemplateError) as exc:
        raise AirflowFailException(str(exc)) from None


def _state_text(state: Any) -> str:
    return str(getattr(state, "value", state))


def _say_still_running(log: Any, held: Sequence[str]) -> None:
    if held:
        log.warning(
            "still running after %.0f s, going on without them: %s",
            core.RELEASE_WAIT_SECONDS,
            ", ".join(held),
        )


def group_tasks(specs: Sequence[core.TaskSpec], limit: int) -> list[dict[str, Any]]:
    """Split a step's original tasks into at most ``limit`` groups of consecutive tasks
    (``core.group_tasks``), one per mapped task instance.

    Returns one small JSON-serializable item per group: ``{"step", "label", "start",
    "stop"}``, where ``start``/``stop`` index the step's original task list
    (``PreparedJob.original_tasks``) and ``label`` (the map index name) is
    ``core.group_label``: ``Render[Frame=1-4]``, or for several tasks
    ``Render[Frame=1-3] (3 tasks)``. Every mapped task instance pulls the whole list, so it
    carries indexes, not task descriptions: 1,024 items stay a few tens of kilobytes.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    items: list[dict[str, Any]] = []
    start = 0
    for group in core.group_tasks(specs, limit):
        items.append(
            {
                "step": group[0].step_name,
                "label": core.group_label(group),
                "start": start,
                "stop": start + len(group),
            }
        )
        start += len(group)
    return items


def _group_originals(
    job: core.PreparedJob, step: str, group: dict[str, Any]
) -> list[core.TaskSpec]:
    """The original tasks of one mapped instance's group (``group_tasks``'s item)."""
    return original_tasks(job, step, int(group["start"]), int(group["stop"]))


# ------------------------------------------------------------------------------------ begin
class OpenJDBeginOperator(BaseOperator):
    """The DAG's setup task: check the job parameters and begin the core attempt.

    A new DAG run begins a new core run; the framework's retry or clear of this DAG run
    continues the same core run (external key ``<dag_id>/<run_id>``). With the ``resume`` param
    set to a run id (or ``latest``), it resumes that run instead, or fails with the core's
    refusal code and reason in its log.

    Args:
        template_path: the job template file (absolute).
        parameter_names: the job parameters, read from the DAG run's params.
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).

    Returns (XCom): ``core.Attempt.to_dict()`` plus ``store`` (the store's location) and
    ``files`` (its file data flow).
    """

    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        template_path: str,
        parameter_names: Sequence[str],
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.template_path = template_path
        self.parameter_names = list(parameter_names)
        self.store = store
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> dict[str, Any]:
        params = context["params"]
        store = _store(self)
        location = store.location  # to show: any credentials in the URL are masked
        try:
            template = core.load_template(self.template_path)
            values = core.framework_parameter_values(
                template, {n: params.get(n) for n in self.parameter_names}
            )
            job = core.prepare_job(template, values)
        except core.TemplateError as exc:
            raise AirflowFailException(f"the job cannot be made: {exc}") from None
        ti = context["ti"]
        key = f"{ti.dag_id}/{ti.run_id}"
        resume = params.get(RESUME_PARAM)
        try:
            if resume:
                self.log.info("operator resume of run %s (the %r param)", resume, RESUME_PARAM)
                attempt = core.begin_attempt(
                    store,
                    job,
                    how=core.ResumeHow.OPERATOR,
                    run_id=str(resume),
                    external_key=key,
                )
            else:
                attempt = core.begin_attempt(store, job, external_key=key)
        except core.ResumeRefusedError as exc:
            self.log.error("%s (refusal code %s)", exc, exc.code.value)
            advice = ""
            if not resume and exc.code in (
                core.RefusalCode.CHAIN_CHANGED,
                core.RefusalCode.DIFFERENT_INPUT,
            ):
                # This DAG run's mapped task instances map the tasks it was planned with.
                advice = (
                    "; this DAG run keeps the template and job parameters it began with: to run "
                    "the changed job, trigger a new DAG run (once the DAG file has been parsed "
                    "again)"
                )
                self.log.error("%s", advice[2:])
            raise AirflowFailException(f"{exc.code.value}: {exc}{advice}") from None
        for note in attempt.notes:
            self.log.info("%s", note)
        self.log.info(
            "core run %s, attempt %d, job key %s, store %s%s%s",
            attempt.run_id,
            attempt.attempt,
            attempt.job_key,
            location,
            ", checkpoint files: managed" if store.file_flow.value == "managed" else "",
            " (resumed)" if attempt.resumed else "",
        )
        # The store travels with the attempt so that the plugin's endpoints find the run.
        return {**attempt.to_dict(), "store": store.url, "files": store.file_flow.value}


# ------------------------------------------------------------------------------------ plan
class OpenJDPlanOperator(BaseOperator):
    """The list a step's mapped task expands over: the step's original tasks, grouped.

    The list depends only on the template and the job parameters (not on what is stored), so a
    ``map_index`` names the same OpenJD task(s) on every try and after every clear.

    Args:
        step: the OpenJD step name.
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
        max_map_length: the most groups (None: ``[core] max_map_length``).

    Returns (XCom): ``group_tasks(...)``.
    """

    ui_color = "#eeeeee"

    def __init__(
        self,
        *,
        step: str,
        store: str | None = None,
        max_map_length: int | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.step = step
        self.store = store
        self.max_map_length = max_map_length
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from airflow.sdk import conf

        attempt = _attempt(context)
        store = _store(self)
        job = _job(store, attempt)
        originals = plan_tasks(job, self.step)
        limit = self.max_map_length or conf.getint("core", "max_map_length", fallback=1024)
        groups = group_tasks(originals, limit)
        self.log.info(
            "step %s: %d task(s) in %d mapped instance(s) (at most %d)",
            self.step,
            len(originals),
            len(groups),
            limit,
        )
        return groups


_DONE_MESSAGE = "marked success in Airflow"
"""Why a task instance marked success is recorded done (``TaskExecution.stop``)."""
_REASON_WAIT_SECONDS = 0.5
"""How long ``on_kill`` waits for Airflow to say why before it asks for a checkpoint."""


# ------------------------------------------------------------------------------------ finish
class OpenJDFinishOperator(BaseOperator):
    """The last teardown: end the core attempt (``core.finish_attempt``) and fail the DAG run
    when the core's outcome is not success. A run's checkpoints are deleted by the core only
    when the whole run, finally steps included, succeeded.

    Args:
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
    """

    ui_color = "#d9ead3"

    def __init__(
        self,
        *,
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.files = files
        self.file_roots = file_roots

    def execute(self, context: Any) -> dict[str, Any]:
        attempt = _attempt(context)
        store = _store(self)
        job = _job(store, attempt)
        outcome = core.finish_attempt(
            store, job, attempt.run_id, wait_seconds=core.RELEASE_WAIT_SECONDS
        )
        _say_still_running(self.log, outcome.still_running)
        cond = outcome.condition
        self.log.info(
            "core run %s ended %s (%s%s)",
            attempt.run_id,
            outcome.status.value,
            cond.reason,
            f": {cond.message}" if cond.message else "",
        )
        if outcome.skipped:
            self.log.info(
                "not finished (clearing the DAG run's failed tasks, or a new DAG run with "
                "resume=latest, resumes them): %s",
                ", ".join(outcome.skipped),
            )
        if outcome.status != core.RunStatus.SUCCEEDED:
            raise AirflowFailException(
                f"core run {attempt.run_id} ended {outcome.status.value} "
                f"({cond.reason}: {cond.message})"
            )
        return {
            "run_id": attempt.run_id,
            "status": outcome.status.value,
            "reason": cond.reason,
            "exit_code": outcome.exit_code,
        }


# ------------------------------------------------------------------------------------ tasks
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


class _StateStoreWriter:
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


class OpenJDTaskOperator(BaseOperator):
    """Runs one group of an OpenJD step's tasks through the core, in one OpenJD session.

    Each try asks the core what to run now (``core.plan_group``: finished tasks drop out,
    checkpointed ones resume, interrupted chunks keep their unfinished frames) and runs it
    (``core.run_tasks``: per-task leases, termination requests obeyed, every checkpoint and
    finished frame stored as it arrives). Task output goes to the task log, with
    ``openjd_redacted_env`` values masked. The latest checkpoint summary is written to the
    task state store under ``openjd_checkpoint`` (by a first try only once there is something
    to show: a checkpoint, a finished frame or a resume status).

    Airflow states: all tasks succeeded (or nothing left to run) -> success; a task failed ->
    the operator raises and Airflow retries; stopped by ``on_kill`` -> raises (Airflow
    decides the state; the checkpoint is kept for the next try); stopped or not started
    because of a termination request -> failed without retry (``Cancelled`` and friends) or
    skipped (nothing started).

    ``on_kill`` (task marked failed or success, run marked failed, a running task cleared,
    worker shutdown: SIGTERM, with SIGKILL 5 s later) asks the running task to checkpoint
    with a deadline ``KILL_BUDGET_SECONDS`` away, and finds out from a worker thread why it
    was called (the task instance's and the DAG run's states). ``execution_timeout`` gets the
    action's full notify period.

    Args:
        step: the OpenJD step name.
        group: one item of ``OpenJDPlanOperator``'s list (the mapped argument).
        store: the checkpoint store location (None: see ``_config.store_location``).
        files: the store's file data flow, ``shared`` or ``managed`` (None: the worker's
            ``[openjd_checkpoint] files``, else ``$OPENJD_CHECKPOINT_FILES``, else ``shared``).
        file_roots: absolute folders a managed store may capture files from and restore them
            to, besides the session working directory (None: ``[openjd_checkpoint]
            file_roots``).
        begin_task_id: the setup task whose XCom holds the attempt.
        kill_budget_seconds: the ``on_kill`` deadline, in seconds from the call.
        interruption_notices: notice sources, as the CLI's ``--interruption-notices`` takes
            them (``aws,gcp,azure,file:PATH,signal:NAME``; None: the worker's
            ``[openjd_checkpoint] interruption_notices``, else
            ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES``). A notice checkpoints the running
            task with the notice's deadline and the operator raises: Airflow's retry resumes.
        notice_poll_seconds: at most one request per notice source this often (None: the
            worker's ``[openjd_checkpoint] notice_poll_seconds``, else 5 s).
    """

    ui_color = "#cfe2f3"
    template_fields: Sequence[str] = ()

    def __init__(
        self,
        *,
        step: str,
        group: dict[str, Any],
        store: str | None = None,
        files: str | None = None,
        file_roots: Sequence[str] | None = None,
        begin_task_id: str = BEGIN_TASK_ID,
        kill_budget_seconds: float = KILL_BUDGET_SECONDS,
        interruption_notices: str | None = None,
        notice_poll_seconds: float | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("do_xcom_push", False)
        super().__init__(**kwargs)
        self.interruption_notices = interruption_notices
        self.notice_poll_seconds = notice_poll_seconds
        self._notice: core.Notice | None = None
        self.step = step
        self.group = group
        self.store = store
        self.files = files
        self.file_roots = file_roots
        self.begin_task_id = begin_task_id
        self.kill_budget_seconds = kill_budget_seconds
        self._execution: core.TaskExecution | None = None
        self._killed_at: float | None = None
        self._stop_deadline: float | None = None
        self._reason_thread: threading.Thread | None = None
        self._marked_success = False
        self._kill_reason: str | None = None
        self._finished = threading.Event()
        self._context: Any = None
        self._masked: set[str] = set()

    # -- running
    def execute(self, context: Any) -> None:
        self._context = context
        attempt = _attempt(context, self.begin_task_id)
        store = _store(self)
        job = _job(store, attempt)
        run_id = attempt.run_id
        originals = _group_originals(job, self.step, self.group)
        if job.template.is_finally(self.step):
            # Airflow starts teardowns as soon as a task is marked failed, while the killed
            # task may still be checkpointing: the core starts the finally phase once none runs.
            decision = core.start_finally(store, job, run_id)
            _say_still_running(self.log, decision.still_running)
            self.log.info("finally step %s: %s", self.step, decision.describe())
        # A later try of this task instance in this DAG run: Airflow runs it again only after
        # a try that did not succeed, or when it was cleared; a cleared one whose tasks
        # finished (in an earlier attempt) runs them again from their start. A first try (a
        # new DAG run, an operator resume included) leaves finished tasks out.
        rerun_notes: list[str] = []
        try:
            specs = core.plan_group(
                store, job, run_id, originals, rerun=self._try_number() > 1, notes=rerun_notes
            )
        except core.ResumeRefusedError as exc:
            raise AirflowException(str(exc)) from None  # another process still runs it
        for note in rerun_notes:
            self.log.info("%s (the task instance was cleared)", note)
        self._log_plan(store, attempt, originals, specs)
        writer = _StateStoreWriter(context.get("task_state_store"), self.log)
        labels = [s.label for s in originals]
        if specs != originals:  # what an earlier try left, shown from the start
            self._write_summary(store, attempt, originals, labels, writer)
        if not specs:
            self.log.info("nothing left to run: every task of this group finished earlier")
            writer.close()
            return
        box: dict[str, Any] = {"specs": specs}
        try:
            sources, poll = notice_settings(self.interruption_notices, self.notice_poll_seconds)
            for source in sources:  # a signal handler is installed from this (main) thread
                install = getattr(source, "install", None)
                if install is not None:
                    install()
        except ValueError as exc:
            writer.close()
            raise AirflowFailException(f"the interruption notice settings: {exc}") from None

        def on_notice(notice: core.Notice) -> None:
            self._notice = notice

        def on_output(ex: core.TaskExecution, lines: list[str]) -> None:
            self._mask(ex)
            for line in lines:
                self.log.info("%s", line)

        def on_event(ex: core.TaskExecution, event: core.TaskEvent) -> None:
            if event.kind == "warning":
                self.log.warning("%s: %s", ex.spec.label, event.value)
            elif event.kind == "checkpoint_saved":
                self.log.info("%s: checkpoint generation %s stored", ex.spec.label, event.value)
            if event.kind in ("checkpoint_saved", "frame_complete", "resume_status"):
                self._write_summary(store, attempt, originals, labels, writer)

        def on_start(ex: core.TaskExecution) -> None:
            self._execution = ex
            if self._marked_success:  # declared done between two tasks of the group
                ex.stop(core.StopIntent.CANCEL, declared_done=_DONE_MESSAGE)
            elif self._killed_at is not None:  # stopped between two tasks of the group
                ex.stop(core.StopIntent.CHECKPOINT, deadline=self._stop_deadline)

        def work() -> None:
            try:
                box["results"] = core.run_tasks(
                    store,
                    job,
                    run_id,
                    specs,
                    on_output=on_output,
                    on_event=on_event,
                    on_note=lambda note: self.log.info("%s", note),
                    on_start=on_start,
                    notices=sources,
                    notice_poll_seconds=poll,
                    on_notice=on_notice,
                )
            except BaseException as exc:
                box["error"] = exc
            finally:
                self._finished.set()

        worker = threading.Thread(target=work, name=f"openjd-{self.task_id}", daemon=True)
        worker.start()
        try:
            while not self._finished.wait(0.2):
                pass
        except BaseException as exc:
            # execution_timeout (AirflowTaskTimeout, raised in this thread) or another
            # interruption: checkpoint with the action's full notify period, then go on.
            self.log.warning("interrupted (%s): asking the running task to checkpoint", exc)
            self._killed_at = time.time()
            self._kill_reason = f"{type(exc).__name__}: {exc}"
            ex = self._execution
            if ex is not None:
                ex.stop(core.StopIntent.CHECKPOINT)
            worker.join()
            self._report(box, store, attempt, originals, labels, writer)
            raise
        worker.join()
        if self._reason_thread is not None:  # why on_kill was called, within the budget
            self._reason_thread.join(max(0.0, (self._stop_deadline or 0) - time.time()))
        self._report(box, store, attempt, originals, labels, writer)
        if self._marked_success:
            self._record_done(store, job, run_id, originals)
            return
        self._raise_for(box)

    def _record_done(
        self,
        store: core.CheckpointStore,
        job: core.PreparedJob,
        run_id: str,
        originals: list[core.TaskSpec],
    ) -> None:
        for line in core.declare_done(store, job, run_id, originals, _DONE_MESSAGE):
            (self.log.warning if line.startswith("warning: ") else self.log.info)("%s", line)

    def _raise_for(self, box: dict[str, Any]) -> None:
        error = box.get("error")
        if isinstance(error, core.ResumeRefusedError):
            raise AirflowException(str(error))  # another process still runs it: retry later
        if isinstance(error, core.RunError):
            raise AirflowFailException(str(error))
        if error is not None:
            raise AirflowException(f"{type(error).__name__}: {error}")
        results: list[core.TaskResult] = box.get("results", [])
        outcomes = {r.outcome for r in results}
        if self._notice is not None and self._killed_at is None:
            raise AirflowException(
                f"stopped by an interruption notice ({self._notice.describe()}); what the "
                "tasks reported is stored: the next try of this task instance resumes from it"
            )
        if self._killed_at is not None:
            raise AirflowException(
                f"stopped by on_kill ({self._kill_reason or 'reason unknown'}); "
                "what the tasks reported is stored: the next try of this task instance (a "
                "retry, or clearing it) resumes from it"
            )
        failing = {core.TaskOutcome.FAILED, core.TaskOutcome.NOT_STORED}  # the try is retried
        if outcomes & failing:
            failed = [r for r in results if r.outcome in failing]
            raise AirflowException("; ".join(r.message for r in failed))
        if outcomes & _STOPPED:
            raise AirflowFailException(
                "stopped by the run's termination request: "
                + "; ".join(core.report.result_words(r) for r in results if r.outcome in _STOPPED)
            )
        if results and outcomes == {core.TaskOutcome.SKIPPED}:
            raise AirflowSkipException(results[0].message)

    # -- logging and the state store
    def _mask(self, ex: core.TaskExecution) -> None:
        # The core already replaces openjd_redacted_env values in the output it hands over;
        # masking them in Airflow too covers anything else Airflow logs.
        values = ex.redacted_values
        new = [v for v in values if v and v not in self._masked]
        if new:
            from airflow.sdk.log import mask_secret

            for value in new:
                mask_secret(value)
                self._masked.add(value)

    def _log_plan(
        self,
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        specs: list[core.TaskSpec],
    ) -> None:
        self.log.info(
            "core run %s (attempt %d) of job %s on host %s (store %s, checkpoint files: %s)",
            attempt.run_id,
            attempt.attempt,
            attempt.job_key,
            core.host_id(),
            store.location,
            store.file_flow.value,
        )
        again = attempt.attempt > 1 or self._try_number() > 1
        for line in core.report.describe_plan(originals, specs, again=again):
            self.log.info("%s", line)

    def _try_number(self) -> int:
        ti = self._context["ti"] if self._context else None
        return int(getattr(ti, "try_number", 1) or 1)

    def _write_summary(
        self,
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        labels: list[str],
        writer: _StateStoreWriter,
        *,
        final: bool = False,
    ) -> None:
        """Hand the group's checkpoint summary to ``writer``. The ``final`` one is left out
        when it has nothing to show (no checkpoint, finished frame or resume status) and
        nothing was written for this task instance before: in this try (``writer.used``) or
        an earlier one (entries outlive tries, so a later try always writes, replacing it)."""
        records = []
        shown = []
        for spec, label in zip(originals, labels, strict=True):
            try:
                rec = store.read_task(
                    attempt.job_key, attempt.run_id, spec.step_name, spec.task_key
                )
            except core.StoreError:
                rec = None
            if rec is not None:
                records.append(rec)
                shown.append(label)
        files_mode = core.run_file_flow(store, attempt.job_key, attempt.run_id).value
        summary = checkpoint_summary(attempt, records, shown, files_mode)
        if final and not writer.used and self._try_number() == 1:
            if not any(
                t["generation"] is not None or t["frames_done"] or t["resume_status"]
                for t in summary["tasks"]
            ):
                return
        writer.put(summary)

    def _report(
        self,
        box: dict[str, Any],
        store: core.CheckpointStore,
        attempt: core.Attempt,
        originals: list[core.TaskSpec],
        labels: list[str],
        writer: _StateStoreWriter,
    ) -> None:
        label_of = {s.task_key: s.label for s in box.get("specs", [])}
        for r in box.get("results", []):
            rec = r.record
            ck = rec.checkpoint
            stopped = r.outcome in _STOPPED  # the core's words say what it kept
            self.log.info(
                "%s: %s%s%s",
                label_of.get(rec.task_key, f"{rec.step} {rec.task_key}"),
                core.report.result_words(r),
                f" (exit code {r.exit_code})" if r.exit_code is not None else "",
                f"; checkpoint generation {ck.generation}" if ck and not stopped else "",
            )
            if r.message and not stopped:
                self.log.info("  %s", r.message)
        if self._killed_at is not None:
            for r in box.get("results", []):
                ck = r.record.checkpoint
                if ck is not None and ck.saved_at >= self._killed_at:
                    self.log.info(
                        "checkpoint generation %d stored %.2f s after the stop was asked "
                        "(budget %.1f s)",
                        ck.generation,
                        ck.saved_at - self._killed_at,
                        self.kill_budget_seconds,
                    )
        self._write_summary(store, attempt, originals, labels, writer, final=True)
        writer.close(timeout=2.0 if self._killed_at is not None else 10.0)
        if writer.errors:
            self.log.warning(
                "checkpoint summary not written to the task state store (%d time(s); expected "
                "when the task instance was cleared while it ran: its id is gone): %s",
                len(writer.errors),
                writer.errors[0],
            )

    # -- being killed
    def on_kill(self) -> None:
        """Ask the running task to checkpoint, to be gone within ``kill_budget_seconds``.

        Called by Airflow's SIGTERM handler (in the main thread, which must not wait) and after
        an ``execution_timeout`` (then ``execute`` already stopped the task with the full
        notify period). Why it was called is looked up from a worker thread first, for at most
        ``_REASON_WAIT_SECONDS``: a task instance marked success is canceled and recorded done
        as it ends (``declared_done``), never left readable as stopped; any other reason, or
        none in time, checkpoints.
        """
        if self._finished.is_set():
            return
        now = time.time()
        self._killed_at = now
        deadline = now + self.kill_budget_seconds
        self._stop_deadline = deadline
        self._reason_thread = threading.Thread(
            target=self._find_kill_reason, name="openjd-kill-reason", daemon=True
        )
        self._reason_thread.start()
        fallback = threading.Timer(_REASON_WAIT_SECONDS, self._stop_running)
        fallback.daemon = True
        fallback.start()

    def _stop_running(self) -> None:
        """Stop the running task as the kill's reason asks (once known: see ``on_kill``)."""
        ex = self._execution
        if ex is None:
            return
        if self._marked_success:
            ex.stop(
                core.StopIntent.CANCEL,
                deadline=self._stop_deadline,
                declared_done=_DONE_MESSAGE,
            )
        else:
            ex.stop(core.StopIntent.CHECKPOINT, deadline=self._stop_deadline)

    def _find_kill_reason(self) -> None:
        ctx = self._context
        if ctx is None:
            return
        ti = ctx["ti"]
        try:
            states = ti.get_task_states(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
            )
            # Mapped instances are keyed "<task_id>_<map_index>" (execution API, /states).
            key = ti.task_id if ti.map_index is None or ti.map_index < 0 else None
            key = key or f"{ti.task_id}_{ti.map_index}"
            task_state = _state_text(states.get(ti.run_id, {}).get(key))
            run_state = _state_text(ti.get_dagrun_state(ti.dag_id, ti.run_id))
        except Exception as exc:
            self._kill_reason = f"could not ask Airflow why: {exc}"
            self.log.warning("on_kill: %s", self._kill_reason)
            self._stop_running()
            return
        reason = {
            "failed": "the task instance was marked failed",
            "success": "the task instance was marked success",
            "restarting": "the running task instance was cleared",
            "up_for_retry": "the task instance is up for retry",
        }.get(task_state, f"task instance {task_state}")
        if task_state == "failed" and run_state == "failed":
            reason = "the task instance or the DAG run was marked failed"
        if task_state == "running":
            reason = "worker shutdown or timeout (the task instance is still running)"
        if task_state == "success":
            # Marked success: the work is declared done, so nothing needs keeping.
            self._marked_success = True
        self._stop_running()
        self._kill_reason = f"{reason}; task {task_state}, DAG run {run_state}"
        asked = "recorded as done" if self._marked_success else "checkpoint requested"
        self.log.warning("on_kill: %s; %s", self._kill_reason, asked)
