"""The Prefect task that runs a group of one step's OpenJD tasks (translation only).

One Prefect task run stands for a fixed group of a step's *original* tasks
(``PreparedJob.plan_step`` with no records, sliced by ``core.group_tasks``). In its body the core
decides what runs now (``core.plan_group``: finished tasks drop out, checkpointed tasks resume,
interrupted chunks keep their unfinished frames) and runs it in one OpenJD session
(``core.run_tasks``), under per-task leases and the run's termination requests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from prefect import get_run_logger, task
from prefect.context import FlowRunContext, TaskRunContext
from prefect.states import Cancelled
from prefect.transactions import get_transaction

import core
from core import CheckpointStore, PreparedJob, TaskSpec

from ._artifacts import GroupProgress, flushed_here
from ._events import PrefectEvents
from ._report import flow_entrypoint, kept_line, quiet_finished_line, resume_hint
from ._task_options import TaskInterrupted

__all__ = ("job_for", "remember_job", "run_group", "store_for")

SIGNALS_REFUSED = (
    "Prefect task runs (they run in worker threads, where no signal handler can be "
    "installed); use file:PATH, or the CLI"
)
"""Why a task run takes no ``signal:`` notice source (``core.NoticeSettings``)."""

_NEXT_TRY = "a retry of this task run (or of the flow run)"
"""What resumes a group an interruption notice stopped, in Prefect's words
(``core.classify_group``)."""

_JOBS: dict[tuple[str, str], PreparedJob] = {}
_STORES: dict[tuple[str, str], CheckpointStore] = {}
_JOBS_LOCK = threading.Lock()


def remember_job(job: PreparedJob, run_id: str, store: CheckpointStore | None = None) -> None:
    """Keep the flow's prepared job (and its store) for task runs in this process (saves
    preparing the job and opening the store again in each task run)."""
    with _JOBS_LOCK:
        _JOBS[(job.job_key, run_id)] = job
        if store is not None:
            _STORES[(job.job_key, run_id)] = store


def store_for(
    job_key: str, run_id: str, location: str, files: str | None, file_roots: Sequence[str]
) -> CheckpointStore:
    """The run's store: the flow body's (``remember_job``) when it is this process's and was
    opened as the task run would open it (same location, file data flow and roots), else a
    new ``CheckpointStore``.

    Raises:
        StoreError: the location cannot be used.
    """
    with _JOBS_LOCK:
        store = _STORES.get((job_key, run_id))
    if (
        store is not None
        and store.url == location
        and store.file_flow.value == files
        and list(store.file_roots) == list(file_roots)
    ):
        return store
    return CheckpointStore(location, files=files, file_roots=file_roots)


def job_for(store: CheckpointStore, job_key: str, run_id: str) -> PreparedJob:
    """The run's job: the one the flow prepared in this process, else rebuilt from the run's
    record (``core.prepare_run_job``; a task run in another process).

    Raises:
        RunError, ResumeRefusedError, TemplateError: as ``core.prepare_run_job``.
    """
    with _JOBS_LOCK:
        job = _JOBS.get((job_key, run_id))
    if job is None:
        job = core.prepare_run_job(store, job_key, run_id)
        remember_job(job, run_id)
    return job


def cache_key(
    job_key: str, run_id: str, step: str, specs: Sequence[TaskSpec], attempt: int | None = None
) -> str:
    """The result key of a group: the core run id and the group's task identities (and the
    attempt, for finally steps, which run again on every attempt). A new core run never matches
    it; a retry (or an operator resume) of the same core run does."""
    return core.group_result_key(job_key, run_id, step, specs, attempt=attempt)


def _cache_key_fn(context: Any, parameters: dict[str, Any]) -> str:
    return str(parameters["result_key"])


@task(cache_key_fn=_cache_key_fn, persist_result=True)
def run_group(
    job_key: str,
    run_id: str,
    step: str,
    originals: list[dict[str, Any]],
    store_location: str,
    result_key: str,
    label: str | None = None,
    files: str | None = None,
    file_roots: list[str] | None = None,
    interruption_notices: str | None = None,
    notice_poll_seconds: float | None = None,
    resume_how: str | None = None,
) -> Any:
    """Run what is left of a group of a step's original tasks (``TaskSpec.to_dict()`` each).

    ``label`` names the group (``core.group_label``): the task run's name
    (``task_run_options``), and its progress artifact's title.

    ``files`` and ``file_roots`` are the store's file data flow and allowed roots as the flow
    run resolved them (None: this process's ``$OPENJD_CHECKPOINT_FILES``): they travel with the
    task run's parameters, so a task run in another process or on another worker uses the
    same. ``interruption_notices`` and ``notice_poll_seconds`` are the flow's notice settings
    (None: this process's ``$OPENJD_CHECKPOINT_INTERRUPTION_NOTICES`` and
    ``$OPENJD_CHECKPOINT_NOTICE_POLL_SECONDS``). ``resume_how`` is how to resume the flow run,
    in words (``resume_hint``, made by the flow body, which knows its deployment and its
    flow's file: a task run on a Dask worker does not); None: made here from what the task
    run knows.

    The task run has a progress artifact (``GroupProgress``: its tasks' ``openjd_progress``,
    sent at most every 5 s and at its end). A task stopped with a checkpoint or finished frames
    kept gets an INFO line saying what was kept and how to resume.

    Returns a summary (``{"step", "ran": [[label, outcome], ...]}``) when every task of the
    group succeeded (that result is persisted under ``result_key``, so a retry skips it); a
    ``Cancelled`` state, not persisted, when tasks were stopped or not started because the run
    is stopping.

    Raises:
        TaskInterrupted: an interruption notice stopped the group (the host is going away):
            a retry resumes from what the core stored, counted against the flow's
            ``interruption_retries``, not its ``task_retries`` (``RetryRule``).
        RuntimeError: a task failed (the message says which): the task run fails, and a
            Prefect task retry resumes from what the core stored.
        ValueError: a bad notice setting (naming it), or a ``signal:`` source (a task run
            runs in a worker thread, where no signal handler can be installed).
        RunError, ResumeRefusedError, StoreError: from the core operations.
    """
    logger = get_run_logger()
    notice_settings = core.NoticeSettings.from_env(
        interruption_notices, notice_poll_seconds, signals_refused=SIGNALS_REFUSED
    )
    store = store_for(job_key, run_id, store_location, files, file_roots or ())
    job = job_for(store, job_key, run_id)
    originals_specs = [TaskSpec.from_dict(d) for d in originals]
    specs = core.plan_group(store, job, run_id, originals_specs)
    if not specs:
        logger.info("%s: every task of this group has finished already", step)
        return {"step": step, "ran": []}
    for line in core.report.describe_plan(originals_specs, specs):
        logger.info("%s", line)

    def on_output(execution: core.TaskExecution, lines: list[str]) -> None:
        for line in lines:
            logger.info("%s | %s", execution.spec.label, line)

    progress = GroupProgress(
        label or _task_run_name(step),
        [s.task_key for s in specs],
        done_before=max(0, len(originals_specs) - len(specs)),
        warn=logger.warning,
    ).start()

    events = PrefectEvents(job.job.name, job.job_key, run_id, warn=logger.warning)

    def on_event(execution: core.TaskExecution, event: core.TaskEvent) -> None:
        events.on_event(execution, event)  # the figures the core just gave it, as events
        progress.on_event(execution, event)
        said = core.report.event_log_line(execution.spec.label, event.kind, event.value)
        if said is not None:
            (logger.warning if said[0] else logger.info)("%s", said[1])

    notices: list[core.Notice] = []
    try:
        results = core.run_tasks(
            store,
            job,
            run_id,
            specs,
            on_output=on_output,
            on_event=on_event,
            on_note=logger.info,
            notices=notice_settings.sources,
            notice_poll_seconds=notice_settings.poll_seconds,
            on_notice=notices.append,
            metrics=[*core.default_sinks(), events],
        )
    except BaseException:
        progress.close("stopped by an error")
        if not flushed_here():
            progress.wait()
        raise
    progress.close(_ending(results))
    if not flushed_here():  # a worker of another process (Dask): its client closes after us
        progress.wait()
    verdict = core.classify_group(
        specs, results, notice=notices[0] if notices else None, next_try=_NEXT_TRY
    )
    hint = resume_how or _resume_hint()
    if verdict.interruption:  # the task run's own retry resumes it (RetryRule), not a person
        hint = (
            f"this task run's retry resumes it (interruption_retries); once they are spent, {hint}"
        )
    for spec, res in zip(specs, results, strict=True):
        line = kept_line(spec.label, res, hint)
        if line is not None:
            logger.info("%s", line)
    ran = [[spec.label, res.outcome.value] for spec, res in zip(specs, results, strict=True)]
    if verdict.interruption:  # the host is going away: not an error (RetryRule)
        raise TaskInterrupted(
            f"interrupted, not failed: {verdict.message}", _interruptions(store, job, run_id, specs)
        )
    if verdict.kind.retry:  # a task failed (or a stop of this process): the retry resumes
        raise RuntimeError(verdict.message)
    if verdict.kind in (core.GroupEnd.STOPPED, core.GroupEnd.SKIPPED):
        txn = get_transaction()
        if txn is not None:
            txn.write_on_commit = False  # a stopped group must not be skipped by a retry
        ctx = TaskRunContext.get()
        if ctx is not None and ctx.task_run is not None:
            quiet_finished_line(ctx.task_run.id)  # a stop asked for is not an error
        return Cancelled(message="; ".join(verdict.tasks), name="Stopped")
    return {"step": step, "ran": ran}


def _interruptions(
    store: CheckpointStore, job: PreparedJob, run_id: str, specs: Sequence[TaskSpec]
) -> int:
    """How many times the host's going away stopped these tasks in the run's current attempt
    (``core.interruptions_so_far`` over their task records; 0 when they cannot be read)."""
    try:
        run = store.read_run(job.job_key, run_id)
        records, _ = store.read_tasks(job.job_key, run_id)
    except Exception:  # the count is advice for RetryRule, which also counts by itself
        return 0
    keys = {(s.step_name, s.task_key) for s in specs}
    mine = [r for r in records if (r.step, r.task_key) in keys]
    return core.interruptions_so_far(mine, run.attempt) if run is not None else 0


def _ending(results: Sequence[core.TaskResult]) -> str:
    """How a task run's tasks ended, for its progress artifact: ``1 succeeded, 2 suspended
    with a checkpoint``."""
    counts: dict[str, int] = {}
    for res in results:
        words = core.report.OUTCOME_WORDS.get(core.report.outcome_key(res), res.outcome.value)
        counts[words] = counts.get(words, 0) + 1
    return ", ".join(f"{n} {words}" for words, n in counts.items())


def _task_run_name(default: str) -> str:
    ctx = TaskRunContext.get()
    return ctx.task_run.name if ctx is not None and ctx.task_run is not None else default


def _resume_hint() -> str:
    """How to resume this task run's flow run (``resume_hint``): from the flow run's context
    where the task run has it (a thread of the flow run process), else (a Dask worker) the
    task run's flow run id alone."""
    flow_ctx = FlowRunContext.get()
    if flow_ctx is not None and flow_ctx.flow_run is not None:
        return resume_hint(
            flow_ctx.flow_run.id,
            deployment=flow_ctx.flow_run.deployment_id is not None,
            entrypoint=flow_entrypoint(flow_ctx.flow, None),
        )
    ctx = TaskRunContext.get()
    flow_run_id = ctx.task_run.flow_run_id if ctx is not None and ctx.task_run else None
    return resume_hint(flow_run_id, deployment=None)
