"""Flows from OpenJD job templates: ``flow_from_template`` and ``@openjd_flow``.

The flow body translates; the core decides (docs/core-api.md, "The calls a distributed
scheduler makes for one run"):

1. ``core.begin_attempt(store, job, external_key=<flow run id>)``: a flow retry keeps the flow
   run id, so it continues the same core run; ``resume=<run id>|latest`` is an operator resume.
2. Per regular step, in dependency order: the step's original tasks (``plan_tasks(job, step)``,
   no records: a stable list), grouped into at most ``max_task_runs_per_step`` Prefect task runs
   (``run_group``), with the dependencies' task runs as ``wait_for``.
3. Once every regular task run has resolved: ``core.enter_finally``; the finally steps' task
   runs if it says so.
4. ``core.finish_attempt``: its ``RunOutcome`` becomes the flow run's final state.

A cancel (``Cancelling`` state, seen by ``CancelWatcher``) or a SIGTERM to the flow run process
(the runner's cancel, a worker shutting down; acted on in the body's waits, ``Stopping``)
becomes ``core.request_termination`` (``_cancel.py``); so does ``end_flow_run``.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import Flow, get_client, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.exceptions import TerminationSignal
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, Completed, Failed, State
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner

import core
from core import (
    CheckpointStore,
    PreparedJob,
    ResumeHow,
    RunOutcome,
    RunPhase,
    RunStatus,
    StepWalk,
    TaskOutcome,
    TerminationMode,
    load_template,
    plan_tasks,
)

from ._artifacts import (
    RunView,
    flow_body_ended,
    flow_body_started,
    flush_progress,
    read_run_view,
)
from ._blocks import CheckpointStoreBlock
from ._cancel import (
    LABEL_FILES,
    LABEL_JOB_KEY,
    LABEL_RUN_ID,
    LABEL_STORE,
    STOP_DEADLINE_SECONDS,
    CancelWatcher,
    leave_cancelled_to_the_runner,
    mode_of_state,
    runner_cancelled,
)
from ._params import RESUME_PARAMETER, flow_signature
from ._report import (
    end_uncaught_quietly,
    flow_entrypoint,
    quiet_engine_exit,
    resume_hint,
    under_runner,
)
from ._stopping import Stopping, wait_all
from ._task_options import check_retries, requirements, task_run_options
from ._tasks import cache_key, remember_job, run_group

__all__ = (
    "DEFAULT_MAX_TASK_RUNS_PER_STEP",
    "DEFAULT_MAX_WORKERS",
    "flow_from_template",
    "openjd_flow",
)

DEFAULT_MAX_TASK_RUNS_PER_STEP = 100
"""A step's tasks are grouped into at most this many Prefect task runs."""

DEFAULT_MAX_WORKERS = 4
"""Task runs of a flow run that run at once on the default task runner (the
``ThreadPoolTaskRunner``'s ``max_workers``)."""


@dataclass(frozen=True)
class _Config:
    """Everything the flow body needs, picklable (``flow.serve()`` cloudpickles the flow)."""

    template_path: str
    store: str | None
    max_task_runs_per_step: int
    cancel_mode: TerminationMode
    files: str | None = None
    """``shared``, ``managed``, or None: ``$OPENJD_CHECKPOINT_FILES`` of the flow run process."""
    file_roots: tuple[str, ...] = ()
    host_requirements: dict[str, list[str]] = field(default_factory=dict)
    task_retries: int = 0
    task_retry_delay_seconds: float = 0.0
    interruption_retries: int = core.DEFAULT_INTERRUPTION_RETRIES
    result_storage: Any = None
    artifact_key: str = "openjd-run"
    interruption_notices: str | None = None
    """Notice sources for every task run (None: ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES`` of
    the task run's process)."""
    notice_poll_seconds: float | None = None
    source_file: str | None = None
    """The file that built the flow (for ``FILE.py:FLOW`` in a resume hint)."""


def _store_location(config: _Config) -> str:
    return (
        config.store or os.environ.get("OPENJD_CHECKPOINT_STORE") or core.default_store_location()
    )


def _open_store(config: _Config) -> CheckpointStore:
    """The flow run's store. Its file data flow and roots, as resolved here (arguments, else
    this process's environment), go to every task run as parameters: task runs elsewhere use
    the same, whatever their environment."""
    return CheckpointStore(
        _store_location(config), files=config.files, file_roots=config.file_roots
    )


def _file_settings(
    store: str | Path | CheckpointStore | CheckpointStoreBlock | None,
    files: str | None,
    file_roots: Sequence[str] | None,
) -> tuple[str | None, tuple[str, ...]]:
    """The file data flow and roots of a flow (``core.FileSettings``): the arguments, else the
    block's or the ``CheckpointStore``'s own, else None and none (the environment where the
    flow runs).

    Raises:
        ValueError: ``files`` is not ``shared`` or ``managed``, or a root is not absolute.
    """
    own: dict[str, Any] = {}
    if isinstance(store, CheckpointStoreBlock):
        own = {"files": store.files, "file_roots": store.file_roots}
    elif isinstance(store, CheckpointStore):
        own = {"files": store.file_flow.value, "file_roots": store.file_roots}
    settings = core.FileSettings.resolve(
        files, file_roots, configured=lambda key: (own.get(key), key)
    )
    return settings.mode, settings.roots


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "openjd"


def _identifier(text: str) -> str:
    ident = re.sub(r"\W+", "_", text).strip("_").lower() or "openjd_flow"
    return ident if not ident[0].isdigit() else f"flow_{ident}"


def _resolve_template(template_path: str | Path, caller_file: str | None) -> Path:
    """A relative path is taken from the calling module's folder when the file is there (a
    flow module next to its template, under any working directory), else from the cwd."""
    path = Path(template_path)
    if not path.is_absolute() and caller_file:
        beside = Path(caller_file).resolve().parent / path
        if beside.exists():
            return beside
    return path.resolve()


def _caller_file(depth: int) -> tuple[str | None, str | None]:
    frame = sys._getframe(depth)
    return frame.f_globals.get("__file__"), frame.f_globals.get("__name__")


# --- the flow body -----------------------------------------------------------------------------
def _submit_step(
    config: _Config,
    job: PreparedJob,
    run_id: str,
    store: CheckpointStore,
    step: str,
    wait_for: list[PrefectFuture[Any]],
    attempt: int,
    hint: str,
) -> list[PrefectFuture[Any]]:
    originals = plan_tasks(job, step)
    attempt_part = attempt if job.template.is_finally(step) else None  # see group_result_key
    futures = []
    options = task_run_options(
        job,
        step,
        host_requirements=config.host_requirements,
        task_retries=config.task_retries,
        task_retry_delay_seconds=config.task_retry_delay_seconds,
        interruption_retries=config.interruption_retries,
        result_storage=config.result_storage,
    )
    step_task = run_group.with_options(**options)
    for group in core.group_tasks(originals, config.max_task_runs_per_step):
        futures.append(
            step_task.submit(
                job.job_key,
                run_id,
                step,
                [s.to_dict() for s in group],
                _store_location(config),
                cache_key(job.job_key, run_id, step, group, attempt_part),
                core.group_label(group),
                files=store.file_flow.value,
                file_roots=list(store.file_roots),
                interruption_notices=config.interruption_notices,
                notice_poll_seconds=config.notice_poll_seconds,
                resume_how=hint,
                wait_for=wait_for,
            )
        )
    return futures


def _run_steps(
    config: _Config,
    job: PreparedJob,
    run_id: str,
    store: CheckpointStore,
    phase: RunPhase,
    stopping: Stopping,
    attempt: int,
    hint: str,
) -> list[PrefectFuture[Any]]:
    """Submit the task runs of the steps of ``phase`` (``core.StepWalk``), each step's after
    those of its dependencies (``wait_for``: Prefect runs none of a step whose dependency did
    not complete), then wait for them all."""
    by_step: dict[str, list[PrefectFuture[Any]]] = {}
    all_futures: list[PrefectFuture[Any]] = []
    for turn in StepWalk(job, phase):
        wait_for = [f for dep in turn.dependencies for f in by_step.get(dep, [])]
        futures = _submit_step(config, job, run_id, store, turn.step, wait_for, attempt, hint)
        by_step[turn.step] = futures
        all_futures.extend(futures)
    wait_all(all_futures, stopping)
    return all_futures


def _flow_run_running(flow_run_id: uuid.UUID) -> bool:
    try:
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
    except Exception:  # cannot tell: try task runs (Prefect aborts them if it must)
        return True
    return state is not None and state.type == StateType.RUNNING


def _run_inline(
    job: PreparedJob,
    run_id: str,
    store: CheckpointStore,
    phase: RunPhase,
    stopping: Stopping,
    logger: Any,
) -> None:
    """Run the steps of ``phase`` in the flow run process, without task runs (finally steps of
    a flow run that Prefect is cancelling): one session per step, in dependency order
    (``core.StepWalk``: a step whose dependency did not succeed does not start), on a worker
    thread while this thread keeps acting on signals (``stopping.tick``)."""

    def work() -> None:
        walk = StepWalk(job, phase)
        for turn in walk:
            if turn.blocked is not None:
                logger.info("%s: not started: %s", turn.step, turn.blocked)
                continue
            specs = core.plan_step(store, job, run_id, turn.step)
            if not specs:
                walk.ended(turn.step, True)
                continue
            results = core.run_tasks(
                store,
                job,
                run_id,
                specs,
                on_output=lambda ex, lines: [
                    logger.info("%s | %s", ex.spec.label, line) for line in lines
                ],
                on_note=logger.info,
            )
            for spec, res in zip(specs, results, strict=True):
                logger.info("%s: %s", spec.label, core.report.result_words(res))
            walk.ended(turn.step, all(r.outcome == TaskOutcome.SUCCEEDED for r in results))

    errors: list[BaseException] = []

    def guarded() -> None:
        try:
            work()
        except Exception as exc:  # reported below; finish_attempt still runs
            errors.append(exc)

    thread = threading.Thread(target=guarded, name="openjd-finally", daemon=True)
    thread.start()
    while thread.is_alive():
        stopping.tick()
        thread.join(0.5)
    for exc in errors:
        logger.warning("finally steps: %s", exc)


def _final_state(outcome: RunOutcome, run_id: str) -> State[Any]:
    message = f"run {run_id}: {outcome.condition.reason}"
    if outcome.condition.message:
        message += f" ({outcome.condition.message})"
    if outcome.status == RunStatus.SUCCEEDED:
        return Completed(message=message)
    if outcome.mode is not None:
        return Cancelled(message=message, name=outcome.mode.value)
    return Failed(message=message)


def _flow_body(
    config: _Config, user_fn: Callable[..., Any] | None, values: dict[str, Any]
) -> State[Any]:
    logger = get_run_logger()
    ctx = FlowRunContext.get()
    assert ctx is not None and ctx.flow_run is not None
    # Without a runner's SIGKILL 30 s after a stop, no deadline: notify periods hold
    runner_kills = under_runner(ctx.flow_run)
    # From the top, so that a signal before the core run exists or while it begins is noted
    # and acted on once its watcher is there (it was a KeyboardInterrupt traceback, the run
    # left recorded as running)
    with Stopping(None, config.cancel_mode, runner_kills=runner_kills) as stopping:
        resume = values.pop(RESUME_PARAMETER, None)
        template = load_template(config.template_path)
        if user_fn is not None:
            changed = user_fn(dict(values))
            if changed is not None:
                values = dict(changed)
        job = core.prepare_job(template, core.framework_parameter_values(template, values))
        store_location = _store_location(config)
        store = _open_store(config)
        flow_run_id: uuid.UUID = ctx.flow_run.id
        if resume:
            attempt = core.begin_attempt(
                store, job, how=ResumeHow.OPERATOR, run_id=resume, external_key=str(flow_run_id)
            )
        else:
            attempt = core.begin_attempt(store, job, external_key=str(flow_run_id))
        run_id = attempt.run_id
        logger.info(
            "core run %s (attempt %s) of job %r in store %s, on host %s",
            run_id,
            attempt.attempt,
            job.job.name,
            store.location,
            core.host_id(),
        )
        logger.info("checkpoint files: %s", store.file_flow.value)
        for line in attempt.notes:
            logger.info(line)
        for step in job.step_order():
            unmapped = [r for r in requirements(job, step) if r not in config.host_requirements]
            for req in unmapped:
                logger.warning(
                    "step %s: host requirement %s has no mapping; not applied", step, req
                )
        remember_job(job, run_id, store)
        try:
            with get_client(sync_client=True) as client:
                client.update_flow_run_labels(
                    flow_run_id,
                    {
                        LABEL_STORE: store_location,
                        LABEL_JOB_KEY: job.job_key,
                        LABEL_RUN_ID: run_id,
                        LABEL_FILES: store.file_flow.value,
                    },
                )
        except Exception as exc:  # end_flow_run will not find the run; the run itself goes on
            logger.warning("could not label the flow run with its core run: %s", exc)
        # How to resume this flow run, said here and by its task runs (which, on a Dask worker,
        # have no flow run context to tell a deployment or the flow's file from)
        hint = resume_hint(
            flow_run_id,
            deployment=ctx.flow_run.deployment_id is not None,
            entrypoint=flow_entrypoint(ctx.flow, config.source_file),
        )
        watcher = CancelWatcher(
            flow_run_id,
            store,
            job.job_key,
            run_id,
            config.cancel_mode,
            logger.info,
            deadline_seconds=STOP_DEADLINE_SECONDS if runner_kills else None,
        )
        stopping.watcher = watcher
        watcher.start()
        try:
            early = mode_of_state(ctx.flow_run.state, config.cancel_mode)
            if early is not None:
                watcher.prefect_cancel.set()
                watcher.request(early)
            stopping.tick()  # a signal while the run began: no task starts
            n = attempt.attempt
            _run_steps(config, job, run_id, store, RunPhase.REGULAR, stopping, n, hint)
            decision = core.start_finally(store, job, run_id)
            if decision.run_finally:
                logger.info("running finally steps (Job.Status=%s)", decision.job_status)
                if _flow_run_running(flow_run_id):
                    _run_steps(config, job, run_id, store, RunPhase.FINALLY, stopping, n, hint)
                else:  # Prefect starts no task run in a Cancelling flow run
                    logger.info("the flow run is being cancelled: finally steps run in the flow")
                    _run_inline(job, run_id, store, RunPhase.FINALLY, stopping, logger)
            stopping.tick()
            flush_progress()  # the task runs' last progress updates, sent by their threads
            try:  # before finish_attempt, which deletes a succeeded run's records
                view: RunView | None = read_run_view(store, job, run_id)
            except Exception as exc:  # the table is a view; the run's outcome stands
                view = None
                logger.warning("no task table: %s", exc)
            outcome = core.finish_attempt(store, job, run_id)
        finally:
            watcher.close()
    why = f" ({outcome.condition.message})" if outcome.condition.message else ""
    logger.info("run %s ended: %s%s", run_id, outcome.condition.reason, why)
    heading = (
        f"core run {run_id}, attempt {attempt.attempt}"
        f"{' (resumed)' if attempt.resumed else ''}: {outcome.condition.reason}"
    )
    _artifacts(config, view, heading, logger)
    final = _final_state(outcome, run_id)
    records = view.records if view is not None else ()
    ran = sum(1 for r in records if r.run_attempt == attempt.attempt)
    sentence = core.report.outcome_sentence(outcome.status.value, records, ran, next_step=hint)
    logger.info("%s", sentence)
    if stopping.signal_at is not None and outcome.mode is None:
        if runner_kills:
            raise TerminationSignal(signal=signal.SIGTERM)  # Prefect reports it (Crashed)
        # A flow called directly, signalled as its last task ended: nothing was left to stop,
        # the run's outcome stands (it was reported Crashed, exit status -15, the job done)
        logger.info("the signal came once every task had ended: nothing to stop")
    cancel = watcher.prefect_cancel.is_set() or runner_cancelled()
    if outcome.mode is not None and runner_kills and cancel:
        leave_cancelled_to_the_runner(logger, final.message or "")
    if outcome.mode is not None:
        quiet_engine_exit(ctx.flow_run.id, final.message or "")
    if outcome.mode is not None and not runner_kills and ctx.flow_run.parent_task_run_id is None:
        # A flow called directly raises CancelledRun for this state: uncaught, one line
        end_uncaught_quietly(final.message or "", f"flow run {ctx.flow_run.name!r} {sentence}")
    return final


def _artifacts(config: _Config, view: RunView | None, heading: str, logger: Any) -> None:
    """The flow run's table artifact (key ``config.artifact_key``) and timeline markdown
    artifact (that key and ``-timeline``), from the tasks read before the attempt finished."""
    if view is None:
        return
    try:
        create_table_artifact(table=view.rows(), key=config.artifact_key, description=heading)
        create_markdown_artifact(
            markdown=view.markdown(heading),
            key=f"{config.artifact_key}-timeline",
            description=f"{heading}: each task's attempts and checkpoints",
        )
    except Exception as exc:  # the table is a view; the run's outcome stands
        logger.warning("no artifact: %s", exc)


# --- building flows ----------------------------------------------------------------------------
def _task_runner(
    task_runner: TaskRunner[Any] | type[TaskRunner[Any]] | None, max_workers: int | None
) -> TaskRunner[Any] | type[TaskRunner[Any]]:
    """The flow's task runner: ``task_runner`` as given, else a ``ThreadPoolTaskRunner`` of
    ``max_workers`` threads (default ``DEFAULT_MAX_WORKERS``).

    Raises:
        ValueError: ``max_workers`` below 1, or given with ``task_runner`` (a given task
            runner sets its own concurrency: a Dask cluster's worker threads, for example).
        TypeError: ``max_workers`` is not an int, or ``task_runner`` is not a Prefect task
            runner (instance or class).
    """
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int)
    ):  # a float nan would make a pool that never starts a thread: the flow would hang
        raise TypeError(f"max_workers must be a whole number, not {max_workers!r}")
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be 1 or more, not {max_workers}")
    if task_runner is None:
        return ThreadPoolTaskRunner(max_workers=max_workers or DEFAULT_MAX_WORKERS)
    if max_workers is not None:
        raise ValueError(
            "max_workers= sets the threads of the default ThreadPoolTaskRunner; with "
            f"task_runner={_runner_name(task_runner)} the task runner decides how many "
            "task runs run at once (on Dask: the cluster's worker threads)"
        )
    is_runner = isinstance(task_runner, TaskRunner) or (
        isinstance(task_runner, type) and issubclass(task_runner, TaskRunner)
    )
    if not is_runner:
        raise TypeError(
            f"task_runner={task_runner!r} is not a Prefect task runner (an instance or a "
            "subclass of prefect.task_runners.TaskRunner, such as "
            "prefect_dask.DaskTaskRunner(address=...))"
        )
    return task_runner


def _runner_name(task_runner: object) -> str:
    """``Name(...)`` of a task runner given as an instance, ``Name`` of one given as a class."""
    if isinstance(task_runner, type):
        return task_runner.__name__
    return f"{type(task_runner).__name__}(...)"


def _build(
    template_path: str | Path,
    *,
    user_fn: Callable[..., Any] | None,
    caller_file: str | None,
    module: str | None,
    qualname: str | None,
    name: str | None,
    store: str | Path | CheckpointStore | CheckpointStoreBlock | None,
    files: str | None,
    file_roots: Sequence[str] | None,
    max_task_runs_per_step: int,
    max_workers: int | None,
    task_runner: TaskRunner[Any] | type[TaskRunner[Any]] | None,
    cancel_mode: TerminationMode | str,
    host_requirements: Mapping[str, Sequence[str]] | None,
    task_retries: int,
    task_retry_delay_seconds: float,
    interruption_retries: int,
    result_storage: Any,
    flow_options: dict[str, Any],
    interruption_notices: str | None = None,
    notice_poll_seconds: float | None = None,
) -> Flow[..., Any]:
    path = _resolve_template(template_path, caller_file)
    template = load_template(path)
    if max_task_runs_per_step < 1:
        raise ValueError(f"max_task_runs_per_step must be 1 or more, not {max_task_runs_per_step}")
    runner = _task_runner(task_runner, max_workers)
    check_retries(task_retries, interruption_retries)
    files, roots = _file_settings(store, files, file_roots)
    if isinstance(store, CheckpointStoreBlock):
        if interruption_notices is None:
            interruption_notices = store.interruption_notices
        if notice_poll_seconds is None:
            notice_poll_seconds = store.notice_poll_seconds
    # checked now: a bad setting fails here, not when the task runs start
    checked = core.NoticeSettings.given(interruption_notices, notice_poll_seconds)
    if notice_poll_seconds is not None:
        notice_poll_seconds = checked.poll_seconds
    if isinstance(store, CheckpointStoreBlock):
        location: Any = store.store_location()
    elif isinstance(store, CheckpointStore):
        location = store.url  # as given: its credentials, if any, included
    else:
        location = store
    flow_name = name or template.name
    config = _Config(
        template_path=str(path),
        store=str(location) if location is not None else None,
        files=files,
        file_roots=roots,
        max_task_runs_per_step=max_task_runs_per_step,
        cancel_mode=TerminationMode(cancel_mode),
        host_requirements={k: list(v) for k, v in (host_requirements or {}).items()},
        task_retries=task_retries,
        task_retry_delay_seconds=task_retry_delay_seconds,
        interruption_retries=interruption_retries,
        result_storage=result_storage,
        artifact_key=f"openjd-{_slug(flow_name)}"[:60].rstrip("-"),
        interruption_notices=interruption_notices,
        notice_poll_seconds=notice_poll_seconds,
        source_file=caller_file,
    )
    signature, annotations = flow_signature(template)

    def body(**values: Any) -> State[Any]:
        flow_body_started()  # task runs in this process leave their last progress to us
        try:
            return _flow_body(config, user_fn, values)
        finally:
            flow_body_ended()

    body.__signature__ = signature  # type: ignore[attr-defined]
    body.__annotations__ = {**annotations, "return": Any}
    body.__name__ = body.__qualname__ = qualname or _identifier(flow_name)
    if module:
        body.__module__ = module
    body.__doc__ = (user_fn.__doc__ if user_fn is not None else None) or (
        f"OpenJD job template {path.name} ({template.name})"
    )
    options = {"task_runner": runner, **flow_options}
    return Flow(fn=body, name=flow_name, **options)


def flow_from_template(
    template_path: str | Path,
    *,
    name: str | None = None,
    store: str | Path | CheckpointStore | CheckpointStoreBlock | None = None,
    files: str | None = None,
    file_roots: Sequence[str] | None = None,
    max_task_runs_per_step: int = DEFAULT_MAX_TASK_RUNS_PER_STEP,
    max_workers: int | None = None,
    task_runner: TaskRunner[Any] | type[TaskRunner[Any]] | None = None,
    cancel_mode: TerminationMode | str = TerminationMode.SUSPENDED,
    host_requirements: Mapping[str, Sequence[str]] | None = None,
    task_retries: int = 0,
    task_retry_delay_seconds: float = 0.0,
    interruption_retries: int = core.DEFAULT_INTERRUPTION_RETRIES,
    result_storage: Any = None,
    interruption_notices: str | None = None,
    notice_poll_seconds: float | None = None,
    **flow_options: Any,
) -> Flow[..., Any]:
    """A Prefect flow that runs an OpenJD job template with CHECKPOINT.

    The flow's parameters are the job parameters (types, defaults, descriptions, bounds) and
    ``resume`` (an earlier core run id, or ``latest``). Each step's tasks become at most
    ``max_task_runs_per_step`` task runs named after their tasks (``Render[Frame=1-4]``), each
    running its share one after the other in one OpenJD session; step dependencies are their
    ``wait_for``. A retry of the flow run (``retries=``) or of a task run (``task_retries``)
    continues the same core run: finished task runs are skipped (persisted results, state
    ``Cached``) and checkpointed tasks resume. The final state follows the core's outcome:
    Completed, Failed (a regular or finally step failed), or Cancelled named after the
    termination mode.

    Args:
        template_path: the job template; a relative path is taken from the calling module's
            folder if the file is there, else from the current directory. Validated now.
        name: the flow's name (default: the template's ``name``).
        store: the checkpoint store (a path, an fsspec URL, a ``CheckpointStore`` or a
            ``CheckpointStoreBlock``); default
            ``$OPENJD_CHECKPOINT_STORE`` at run time, else the per-user state directory.
            Every host that runs the flow must reach it.
        files: how the store treats checkpoint files: ``shared`` (paths only, on a file system
            every host sees) or ``managed`` (the store keeps the files tasks name and restores
            them into the session working directory of the task that resumes, on any host).
            Default: the block's (or the ``CheckpointStore``'s) ``files``, else
            ``$OPENJD_CHECKPOINT_FILES`` of the flow run process, else ``shared``.
        file_roots: absolute folders, besides the session working directory, whose files a
            managed store may capture and restore. Default: the block's (or the
            ``CheckpointStore``'s) ``file_roots``; ``$OPENJD_CHECKPOINT_FILE_ROOTS`` of the flow
            run process is added.
        max_task_runs_per_step: at most this many task runs per step (>= 1).
        max_workers: task runs of one flow run that run at once (>= 1; default
            ``DEFAULT_MAX_WORKERS``, 4), as threads of the flow run process (Prefect's
            ``ThreadPoolTaskRunner``). Only without ``task_runner``: given both, ValueError.
        task_runner: any Prefect task runner (an instance or a class) to run the task runs
            with instead, such as ``prefect_dask.DaskTaskRunner(address="tcp://host:8786")``
            (extra ``[dask]``), which spreads one flow run's task runs over the workers of a
            Dask cluster, on many machines; it then decides how many run at once (on Dask,
            the workers' threads). Checkpoints, leases, managed files, notices and stops
            work there as on threads (docs/prefect.md, "Several machines").
        cancel_mode: the termination mode a plain Prefect cancel means (a SIGTERM too):
            ``Suspended`` (default: checkpoint, resumable), ``Cancelled``,
            ``CancelledRunFinally`` or ``StoppedRunFinally``.
        host_requirements: a step's ``hostRequirements`` name (``attr.worker.os.family``,
            ``amount.worker.gpu``) -> Prefect tags put on its task runs (for tag concurrency
            limits); a requirement with no mapping is logged as a warning, never dropped
            silently.
        task_retries / task_retry_delay_seconds: Prefect task retries of a failed task run.
        interruption_retries: how many interruptions (a notice: the host going away) a task
            run resumes from by a retry that uses none of its ``task_retries`` (default
            ``core.DEFAULT_INTERRUPTION_RETRIES``, 10); its Prefect ``retries`` is the sum.
        result_storage: where task run results go (a block, a block slug, a ``pathlib.Path``);
            default Prefect's (``$PREFECT_HOME/storage``).
        interruption_notices: notice sources for every task run, as the CLI's
            ``--interruption-notices`` takes them (``aws,gcp,azure,file:PATH``; ``signal:``
            is refused when the task run starts, since task runs run in worker threads).
            Default: the block's ``interruption_notices``, else
            ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES`` of the task run's process. A notice
            checkpoints the task run's running task with the notice's deadline, and a retry
            that counts against ``interruption_retries`` resumes it.
        notice_poll_seconds: at most one request per source this often (default: the block's,
            else ``$OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS``, else 5 s).
        flow_options: passed to ``prefect.Flow`` (``retries``, ``retry_delay_seconds``,
            ``description``, ``flow_run_name``, hooks, ...).

    Raises:
        TemplateError: the template is invalid.
        ValueError: a bad option (``files`` not ``shared`` or ``managed``, a relative file
            root...), or a job parameter named ``resume``.
    """
    caller_file, module = _caller_file(2)
    return _build(
        template_path,
        user_fn=None,
        caller_file=caller_file,
        module=module,
        qualname=None,
        name=name,
        store=store,
        files=files,
        file_roots=file_roots,
        max_task_runs_per_step=max_task_runs_per_step,
        max_workers=max_workers,
        task_runner=task_runner,
        cancel_mode=cancel_mode,
        host_requirements=host_requirements,
        task_retries=task_retries,
        task_retry_delay_seconds=task_retry_delay_seconds,
        interruption_retries=interruption_retries,
        result_storage=result_storage,
        flow_options=flow_options,
        interruption_notices=interruption_notices,
        notice_poll_seconds=notice_poll_seconds,
    )


def openjd_flow(
    template_path: str | Path,
    *,
    name: str | None = None,
    store: str | Path | CheckpointStore | CheckpointStoreBlock | None = None,
    files: str | None = None,
    file_roots: Sequence[str] | None = None,
    max_task_runs_per_step: int = DEFAULT_MAX_TASK_RUNS_PER_STEP,
    max_workers: int | None = None,
    task_runner: TaskRunner[Any] | type[TaskRunner[Any]] | None = None,
    cancel_mode: TerminationMode | str = TerminationMode.SUSPENDED,
    host_requirements: Mapping[str, Sequence[str]] | None = None,
    task_retries: int = 0,
    task_retry_delay_seconds: float = 0.0,
    interruption_retries: int = core.DEFAULT_INTERRUPTION_RETRIES,
    result_storage: Any = None,
    interruption_notices: str | None = None,
    notice_poll_seconds: float | None = None,
    **flow_options: Any,
) -> Callable[[Callable[[dict[str, Any]], Mapping[str, Any] | None]], Flow[..., Any]]:
    """Decorator: turn ``fn(parameters) -> parameters | None`` into a flow of the template
    (the same flow as ``flow_from_template``, with the same options).

    ``fn`` runs in the flow run before any step, with a dict of the job parameter values (name
    -> value, as the flow's parameters were validated). It may check them (raise to fail the
    flow run before anything runs) or change them (return the values to use; None keeps them).
    The flow's parameters are the job parameters, not ``fn``'s; its name is the template's
    unless ``name`` is given; its module and qualified name are ``fn``'s (so ``serve()`` and
    deployments find it as ``module.py:fn``).

    Raises:
        TemplateError: the template is invalid.
        ValueError: a bad option, or a job parameter named ``resume``.
    """
    caller_file, _ = _caller_file(2)

    def decorate(fn: Callable[[dict[str, Any]], Mapping[str, Any] | None]) -> Flow[..., Any]:
        return _build(
            template_path,
            user_fn=fn,
            caller_file=inspect.getsourcefile(fn) or caller_file,
            module=fn.__module__,
            qualname=fn.__qualname__,
            name=name,
            store=store,
            files=files,
            file_roots=file_roots,
            max_task_runs_per_step=max_task_runs_per_step,
            max_workers=max_workers,
            task_runner=task_runner,
            cancel_mode=cancel_mode,
            host_requirements=host_requirements,
            task_retries=task_retries,
            task_retry_delay_seconds=task_retry_delay_seconds,
            interruption_retries=interruption_retries,
            result_storage=result_storage,
            flow_options=flow_options,
            interruption_notices=interruption_notices,
            notice_poll_seconds=notice_poll_seconds,
        )

    return decorate
