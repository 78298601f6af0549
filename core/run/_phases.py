"""The phases of an attempt and its outcome: when the finally steps start, with which
``{{Job.Status}}``, and how the run ends (FINALLY extension, TEP-0058; seed 001 for deleting a
succeeded run's checkpoints).

- ``wait_tasks_released`` then ``enter_finally``: end the regular phase once no process still
  runs a regular task, and decide whether, and with which ``{{Job.Status}}``, the finally
  steps run (``start_finally`` does both);
- ``record_task_done``: a task the scheduler's user declared done (Airflow's "mark success");
- ``finish_attempt``: the run's status, condition, reason and exit code, computed from the
  records; a run's checkpoints are deleted only after the whole run, finally steps included,
  succeeded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from core._errors import RunError, StoreError
from core._records import (
    CheckpointData,
    RunCondition,
    RunPhase,
    RunRecord,
    RunStatus,
    TaskRecord,
    TaskStatus,
)
from core.job import KeptCollector, PlanHistory, PreparedJob, TaskSpec, iter_plan, new_task_record
from core.run._attempt import iter_attempt_records, reap_sessions, reap_task, require_run
from core.store import CheckpointStore, Lease
from core.task import RefusalCode, ResumeRefusedError, TerminationMode, resolve_termination

__all__ = (
    "RELEASE_WAIT_SECONDS",
    "declare_done",
    "start_finally",
    "EXIT_CODES",
    "FinallyDecision",
    "RunOutcome",
    "enter_finally",
    "finish_attempt",
    "mark_timed_out",
    "record_task_done",
    "wait_tasks_released",
)

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


def record_task_done(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    message: str,
) -> TaskRecord | None:
    """Record a task as finished because the scheduler's user declared it done (Airflow's "mark
    success" on a task instance): it is neither run again nor resumed, all its frames count as
    finished, and its checkpoint no longer matters (``plan_step`` leaves it out). Call it once
    the process that ran the task has stopped it.

    Args:
        spec: the task as first planned (its original ``task_key``; a chunk's remainder pieces
            are covered by the original's frames).
        message: why, for the record.

    Returns:
        The record as written; None when the run has already ended succeeded (its task
        records and checkpoints are deleted: a record written now would be left over under
        an ended run. A framework may start its last teardown as soon as a task instance is
        marked success, so that teardown can end the run before the task's process gets here).

    Raises:
        ResumeRefusedError: ``already-resumed``: another live process runs the task now.
        RunError: no such run.
        StoreError: the store cannot be read or written.
    """
    # Under the run's lock, as finish_attempt ends the run and deletes its records: the run is
    # read ended, or the record is written before the run ends.
    with store.run_lock(job.job_key, run_id):
        return _record_done(store, job, require_run(store, job, run_id), spec, message)


def _record_done(
    store: CheckpointStore, job: PreparedJob, run: RunRecord, spec: TaskSpec, message: str
) -> TaskRecord | None:
    """``record_task_done`` under the run's lock, ``run`` read under it."""
    if run.status == RunStatus.SUCCEEDED:
        return None
    run_id = run.run_id
    lease = store.acquire_task_lease(job.job_key, run_id, spec.step_name, spec.task_key)
    if lease is None:  # not waited for: the lock is held meanwhile
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run_id} is being run by another process",
        )
    try:
        record = store.read_task(job.job_key, run_id, spec.step_name, spec.task_key)
        if record is None:
            record = new_task_record(job, spec, run_id)
        record.status = TaskStatus.SUCCEEDED
        record.message = message
        record.process = None
        if spec.chunk_parameter is not None:
            record.completed_frames = sorted(set(record.completed_frames) | spec.chunk_frames)
        store.write_task(record)
        return record
    finally:
        lease.release()


def wait_tasks_released(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    steps: Iterable[str],
    *,
    timeout: float = 30.0,
    poll_seconds: float = 0.25,
) -> list[str]:
    """Wait until no process, on any host, still runs a task of ``steps`` in the run: every
    task whose record says ``running`` has a free lease. A scheduler calls it before
    ``enter_finally`` when its framework may start the finally phase before killed tasks have
    finished stopping (Airflow starts teardown tasks as soon as a task is marked failed, while
    the killed task still checkpoints within its 5 s budget).

    Returns:
        The labels (step and task key) of tasks still held when ``timeout`` seconds passed
        (empty when all were released).

    Raises:
        StoreError: the store cannot be read.
    """
    wanted = set(steps)
    deadline = time.monotonic() + timeout
    while True:
        held = [
            f"{r.step} {r.task_key}"
            for r in store.iter_tasks(job.job_key, run_id)
            if r.step in wanted
            and r.status == TaskStatus.RUNNING
            and store.task_lease_held(job.job_key, run_id, r.step, r.task_key)
        ]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(poll_seconds)


# --- phases and outcome ---------------------------------------------------------------------------
def mark_timed_out(
    store: CheckpointStore, job_key: str, run_id: str, message: str, *, fence: Lease | None = None
) -> None:
    """Record that the run's own time budget expired (the run fails with reason Timeout).
    ``fence``: the run's lease, held by the process driving the run (``write_run``).

    Raises:
        StoreError: the store cannot be written. LeaseLostError: ``fence`` was lost."""
    store.update_run(job_key, run_id, timed_out=message, fence=fence)


def _incomplete_roots(
    job: PreparedJob, names: Iterable[str], records: PlanHistory
) -> tuple[list[str], list[str]]:
    """(steps that did not complete although their dependencies did, every step that did not
    complete) among ``names``."""
    incomplete: set[str] = set()
    for name in names:
        if next(iter_plan(job, name, records), None) is not None:
            incomplete.add(name)
    roots = [
        n
        for n in names
        if n in incomplete and not any(d in incomplete for d in job.dependencies(n))
    ]
    return roots, [n for n in names if n in incomplete]


def _moot(mode: TerminationMode | None, stopped: bool, left: bool) -> bool:
    """True if a termination in force stopped nothing and kept nothing from starting: it was
    asked once every task it could reach had ended (``left``: some task is still to run) and
    no task of the attempt ended stopped (``stopped``: one's record is canceled or
    interrupted, ``_STOPPED``, or the stop killed an environment's ``onExit``,
    ``RunRecord.environment_failures``). It then changes nothing that already happened: the
    outcome (and ``{{Job.Status}}``) is the tasks' own (docs/decisions.md, "Termination
    modes": a request after every task ended)."""
    return mode is not None and not left and not stopped


_STOPPED = (TaskStatus.CANCELED, TaskStatus.INTERRUPTED)
"""The statuses of a task record that a termination stopped."""


def _job_status(mode: TerminationMode | None, failed: bool) -> str:
    if mode in (TerminationMode.CANCELLED, TerminationMode.CANCELLED_RUN_FINALLY):
        return "Cancelled"
    if mode == TerminationMode.STOPPED_RUN_FINALLY:
        return "Stopped"
    return "Failed" if failed else "Succeeded"


@dataclass(frozen=True)
class FinallyDecision:
    """What ``enter_finally`` decided.

    Attributes:
        run_finally: True if the finally steps run now.
        job_status: the ``{{Job.Status}}`` they get (``Succeeded``, ``Failed``, ``Cancelled``,
            ``Stopped``).
        mode: the termination mode in force, if any.
    """

    run_finally: bool
    job_status: str
    mode: TerminationMode | None
    still_running: tuple[str, ...] = ()

    def describe(self) -> str:
        """``Job.Status Succeeded``, or ``Job.Status Cancelled (not run: Cancelled)``."""
        why = ""
        if not self.run_finally:
            why = f" (not run: {self.mode.value})" if self.mode else " (not run)"
        return f"Job.Status {self.job_status}{why}"


RELEASE_WAIT_SECONDS = 30.0
"""How long ``start_finally`` waits for tasks of the regular steps still running elsewhere."""


def start_finally(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    *,
    wait_seconds: float = RELEASE_WAIT_SECONDS,
) -> FinallyDecision:
    """When the finally steps may start, for every runner: once no process, on any host, still
    runs a regular task of the run (``wait_tasks_released``, at most ``wait_seconds``; a
    framework may start its finally tasks while killed tasks still checkpoint: Airflow starts
    teardown tasks as soon as a task is marked failed), then ``enter_finally``.

    Returns:
        ``enter_finally``'s decision, with ``still_running``: the tasks still held when the
        wait ended (the finally phase begins without them; say so in the log).

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
    """
    held = wait_tasks_released(store, job, run_id, job.template.regular_steps, timeout=wait_seconds)
    decision = enter_finally(store, job, run_id)
    return FinallyDecision(decision.run_finally, decision.job_status, decision.mode, tuple(held))


def declare_done(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    specs: Sequence[TaskSpec],
    message: str,
) -> list[str]:
    """Tasks the scheduler's user declared done (Airflow's "mark success" on a task instance):
    the process that ran them has stopped them (``StopIntent.CANCEL``: nothing of them needs
    keeping), and each is recorded done (``record_task_done``), so no later attempt runs or
    resumes it. A task that cannot be recorded is said, not raised: the others still are.

    Returns:
        One line per task for the log.
    """
    lines: list[str] = []
    try:
        # The run's lock once for all of them: a stalled holder costs one wait, not one a task.
        with store.run_lock(job.job_key, run_id):
            run = require_run(store, job, run_id)
            for spec in specs:
                try:
                    if _record_done(store, job, run, spec, message) is None:
                        lines.append(
                            f"{spec.label}: not recorded: the run has already ended succeeded"
                        )
                    else:
                        lines.append(f"{spec.label}: recorded as done ({message}); not resumable")
                except (RunError, StoreError) as exc:
                    lines.append(f"warning: {spec.label}: not recorded as done: {exc}")
    except (RunError, StoreError) as exc:  # no run, or its lock not had
        lines += [f"warning: {s.label}: not recorded as done: {exc}" for s in specs[len(lines) :]]
    return lines


def enter_finally(
    store: CheckpointStore, job: PreparedJob, run_id: str, *, fence: Lease | None = None
) -> FinallyDecision:
    """End the run's regular phase (call it once every regular task has really ended, killed
    tasks included) and decide whether the finally steps run (FINALLY, TEP-0058): they run
    unless the mode is ``Cancelled`` or ``Suspended``, with ``Job.Status`` computed from the
    records and the mode. The decision is stored, so finally tasks in any process read it.
    ``fence``: the run's lease, held by the process driving the run (``write_run``).

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
        LeaseLostError: ``fence`` was lost (another process drives the run now); nothing
            was written.
    """
    with store.run_lock(job.job_key, run_id):
        run = require_run(store, job, run_id)
        term = resolve_termination(store.read_stop_requests(job.job_key, run_id), run.attempt)
        records = PlanHistory(job)  # read once, kept as planning needs them
        stopped = False
        for rec in iter_attempt_records(store, job, run):
            records.add(rec)
            stopped = stopped or (rec.status in _STOPPED and not job.template.is_finally(rec.step))
        _, incomplete = _incomplete_roots(job, job.template.regular_steps, records)
        told = None if _moot(term.mode, stopped, bool(incomplete)) else term.mode
        status = _job_status(told, bool(incomplete) or run.timed_out is not None)
        run_finally = bool(job.template.finally_steps) and term.mode not in (
            TerminationMode.CANCELLED,
            TerminationMode.SUSPENDED,
        )
        if run.phase == RunPhase.REGULAR:
            # a suspended run has no Job.Status yet: its finally steps run when it ends
            run.job_status = None if term.mode == TerminationMode.SUSPENDED else status
            if run_finally:
                run.phase = RunPhase.FINALLY
            store.write_run(run, fence=fence)
    return FinallyDecision(run_finally, status, term.mode)


@dataclass
class RunOutcome:
    """How an attempt ended (``finish_attempt``).

    Attributes:
        status: the run's ``RunStatus``.
        condition: its ``Succeeded`` condition (TEP-0058 reasons, plus ``Suspended``,
            ``Timeout``, ``Failed``).
        exit_code: see ``EXIT_CODES``.
        mode: the termination mode in force, if any.
        skipped: the tasks that were not run, as labels.
        failed_steps: regular steps that failed; finally_failed: finally steps that failed.
        still_running: tasks still held elsewhere when ``wait_seconds`` ran out.
    """

    status: RunStatus
    condition: RunCondition
    exit_code: int
    mode: TerminationMode | None = None
    skipped: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)
    finally_failed: list[str] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)


def _generations(
    store: CheckpointStore, records: Sequence[TaskRecord]
) -> dict[tuple[str, str], list[CheckpointData]]:
    """The stored generations of the records that hold a checkpoint (an unreadable listing
    leaves that task with its latest checkpoint only)."""
    holding = [rec for rec in records if rec.checkpoint is not None]
    try:
        every = store.list_generations_of(holding)
    except StoreError:
        return {}
    return {(rec.step, rec.task_key): gens for rec, gens in zip(holding, every, strict=True)}


def finish_attempt(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    *,
    finally_timeout: str | None = None,
    skipped: list[str] | None = None,
    wait_seconds: float = 0.0,
    fence: Lease | None = None,
) -> RunOutcome:
    """End the attempt: compute the run's status, condition and reason from its records and
    termination requests, store them, and delete the run's checkpoints only when the whole run,
    finally steps included, succeeded (seed 001: "a run that completes deletes its
    checkpoints"). Requests made after this are refused.

    Args:
        finally_timeout: the message of an expired finally budget, if it expired.
        skipped: the tasks not started, as labels (default: every task still planned that
            no process started in this attempt; a task stopped while it ran is not skipped).
        wait_seconds: first wait this long at most for tasks still running elsewhere
            (``wait_tasks_released``; a framework whose last task may start while killed
            tasks still checkpoint). Those still held then are in ``still_running``.
        fence: the run's lease, held by the process driving the run (``write_run``):
            confirmed before anything is reaped or written.

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
        LeaseLostError: ``fence`` was lost (another process drives the run now); nothing
            was reaped or written.
    """
    held: list[str] = []
    if wait_seconds > 0:
        steps = job.template.regular_steps + job.template.finally_steps
        held = wait_tasks_released(store, job, run_id, steps, timeout=wait_seconds)
    with store.run_lock(job.job_key, run_id):
        run = require_run(store, job, run_id)
        if fence is not None:
            fence.confirm()
        reap_sessions(store, run)  # nothing of the attempt is left running on this host:
        # its sessions' now, each task's as its record is read below (one pass over them)
        term = resolve_termination(store.read_stop_requests(job.job_key, run_id), run.attempt)
        mode = term.mode
        # The records, read once: kept as planning needs them, and what is counted of them.
        records = PlanHistory(job)
        stopped = False
        failed_here: set[str] = set()  # finally steps with a task failed in this attempt
        ran: set[tuple[str, str]] = set()  # tasks started in this attempt (original keys)
        kept = KeptCollector()  # what the run's checkpoints were, should it succeed
        for rec in iter_attempt_records(store, job, run):
            reap_task(store, run, rec)
            records.add(rec)
            kept.add(rec)
            stopped = stopped or rec.status in _STOPPED
            if rec.run_attempt != run.attempt:
                continue
            if job.template.is_finally(rec.step) and rec.status == TaskStatus.FAILED:
                failed_here.add(rec.step)
            if skipped is None and rec.status != TaskStatus.PENDING:
                ran.add((rec.step, rec.task_key.split("#", 1)[0]))
        failed_steps, incomplete = _incomplete_roots(job, job.template.regular_steps, records)
        finally_failed: list[str] = []
        if run.phase == RunPhase.FINALLY:
            if finally_timeout:
                failed_here.update(_incomplete_roots(job, job.template.finally_steps, records)[1])
            finally_failed = [s for s in job.template.finally_steps if s in failed_here]
        env_ended = [f for f in run.environment_failures if f.get("attempt") == run.attempt]
        env_failed = [str(f.get("message")) for f in env_ended if not f.get("stopped")]
        env_stopped = [str(f.get("message")) for f in env_ended if f.get("stopped")]
        stopped = stopped or bool(env_stopped)  # an onExit the stop killed: the stop counts
        left: list[str] = []  # still to run
        not_started: list[str] = []  # of those, not started in this attempt (not stopped)
        for name in job.step_order():
            for spec in iter_plan(job, name, records):
                left.append(spec.label)
                if (spec.step_name, spec.task_key.split("#", 1)[0]) not in ran:
                    not_started.append(spec.label)
        if skipped is None:
            skipped = not_started
        if _moot(mode, stopped, bool(left)) and run.job_status not in ("Cancelled", "Stopped"):
            mode = None  # asked after every task had ended: the run ends as its tasks did
        if mode == TerminationMode.SUSPENDED:
            status = RunStatus.INTERRUPTED
            cond = RunCondition(status="False", reason="Suspended", message="suspended; resumable")
            noticed = [n for n in run.notices if n.get("attempt") == run.attempt]
            if noticed:
                cond.message = (
                    f"suspended by an interruption notice ({noticed[0].get('source')}); resumable"
                )
            code = EXIT_CODES["interrupted"]
        elif mode is not None:
            status = (
                RunStatus.STOPPED
                if mode == TerminationMode.STOPPED_RUN_FINALLY
                else RunStatus.CANCELED
            )
            cond = RunCondition(status="False", reason=mode.value, message=f"ended by {mode.value}")
            cond.message += "".join(f"; {text}" for text in env_stopped)
            code = EXIT_CODES["canceled"]
        elif run.timed_out is not None:
            status = RunStatus.FAILED
            cond = RunCondition(status="False", reason="Timeout", message=run.timed_out)
            code = EXIT_CODES["failed"]
        elif incomplete or finally_failed or env_failed:
            what = failed_steps + [f"finally {s}" for s in finally_failed] + env_failed
            if finally_timeout:
                what.append(finally_timeout)
            status = RunStatus.FAILED
            cond = RunCondition(
                status="False", reason="Failed", message="failed: " + ", ".join(what)
            )
            code = EXIT_CODES["failed"]
        else:
            status = RunStatus.SUCCEEDED
            cond = RunCondition(status="True", reason="Succeeded")
            code = EXIT_CODES["succeeded"]
        if finally_failed and status != RunStatus.FAILED:
            cond.message += "; finally failed: " + ", ".join(finally_failed)
            if mode != TerminationMode.SUSPENDED:
                code = max(code, EXIT_CODES["failed"])
        run.status, run.condition = status, cond
        run.termination = mode.value if mode else None
        run.skipped_tasks = list(skipped)
        run.runner = None
        run.phase = RunPhase.ENDED
        if status == RunStatus.SUCCEEDED:
            run.kept = kept.result(_generations(store, kept.detailed()), at=time.time())
        store.write_run(run, fence=fence)
        if status == RunStatus.SUCCEEDED:
            # After the record: a crash in between leaves files for gc, never a run that
            # looks unfinished with its checkpoints gone.
            store.delete_checkpoints(run)
    return RunOutcome(status, cond, code, mode, list(skipped), failed_steps, finally_failed, held)
