"""Run-level operations that any scheduler can call, from any process and any host.

A *run* is one job (template + job parameter values) carried through one or more *attempts*
until it ends. Airflow and Prefect own a run themselves and execute its tasks in separate
processes, often on separate hosts, with no process of ours alive between tasks. So everything
that makes a run is here, as operations on plain, JSON-serializable inputs that share nothing
but the store:

1. ``begin_attempt``: decide what this attempt continues (a retry, a requeue, an operator
   resume, or the framework's own retry of the run named by an *external run key*), or refuse
   with a Trax code (seed 001); kill what dead holders left running.
2. ``plan_step``: the tasks of a step still to run, as ``TaskSpec`` (``to_dict``/``from_dict``).
3. ``run_task``: run one task under a per-task lease (never two copies at once), stopping it
   as the run's termination requests say.
4. ``request_termination``: ask for a termination mode from any process (TEP-0058, seed 002,
   plus ``Suspended``); requests are append-only and folded by precedence.
5. ``enter_finally``: end the regular phase and decide whether, and with which
   ``{{Job.Status}}``, the finally steps run.
6. ``finish_attempt``: the run's status, condition and reason, computed from the records; a
   run's checkpoints are deleted only after the whole run, finally steps included, succeeded.

``JobRunner`` (the local CLI's scheduler) is one user of these operations; the Airflow and
Prefect adapters are others. Which process may call what: see docs/core-api.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._action import StopIntent
from ._errors import RunError, StoreError
from ._host import FileDataFlow
from ._job import PreparedJob, TaskSpec, load_path_mapping_rules, prepare_job
from ._notices import (
    DEFAULT_POLL_SECONDS,
    Notice,
    NoticeSource,
    NoticeWatcher,
    checkpoint_timing,
)
from ._process import kill_marked, kill_recorded_process
from ._records import RunCondition, RunRecord, RunStatus, StopRequest, TaskRecord, TaskStatus
from ._resume import (
    RefusalCode,
    ResumeHow,
    ResumeRefusedError,
    check_chain,
    check_input,
    check_run,
    plan_resume,
)
from ._session import Session
from ._store import (
    CheckpointStore,
    Lease,
    RunSetAside,
    describe_holder,
    host_id,
    new_run_id,
    this_process,
)
from ._task import (
    TaskEvent,
    TaskExecution,
    TaskOutcome,
    TaskResult,
)
from ._termination import (
    RunWatcher,
    Termination,
    TerminationMode,
    fold_request,
    request_termination,
    resolve_termination,
    run_is_live,
    starts_no_tasks,
    task_stop_for,
)

__all__ = (
    "EXIT_CODES",
    "Attempt",
    "FinallyDecision",
    "RunOutcome",
    "RunWatcher",
    "Termination",
    "TerminationMode",
    "attempt_records",
    "begin_attempt",
    "claim_task",
    "delete_run",
    "enter_finally",
    "finish_attempt",
    "mark_timed_out",
    "plan_step",
    "prepare_run_job",
    "plan_group",
    "record_task_done",
    "reap_orphans",
    "record_environment_failure",
    "record_notice",
    "reap_run",
    "request_termination",
    "resolve_termination",
    "run_is_live",
    "run_task",
    "run_tasks",
    "task_stop_for",
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


# --- attempts ---------------------------------------------------------------------------------
@dataclass
class Attempt:
    """One attempt of a run, as ``begin_attempt`` made it. JSON-serializable through
    ``to_dict``/``from_dict`` (an Airflow XCom value, a Prefect task parameter).

    Attributes:
        job_key: the job's identity in the store (16 hex digits).
        run_id: the run's id.
        attempt: 1 for a new run, counting up on every attempt that continues it.
        resumed: True if this attempt continues stored work (checkpoints or finished tasks).
        notes: lines for the log: what was resumed, or why not.
        external_key: the scheduler's own run identity, if one was given.
        lease: the run's lease, when ``begin_attempt(hold_lease=True)`` took it (not
            serialized; release it when the attempt ends).
    """

    job_key: str
    run_id: str
    attempt: int
    resumed: bool = False
    notes: list[str] = field(default_factory=list)
    external_key: str | None = None
    lease: Lease | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_key": self.job_key,
            "run_id": self.run_id,
            "attempt": self.attempt,
            "resumed": self.resumed,
            "notes": list(self.notes),
            "external_key": self.external_key,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            job_key=str(data["job_key"]),
            run_id=str(data["run_id"]),
            attempt=int(data["attempt"]),
            resumed=bool(data.get("resumed", False)),
            notes=[str(n) for n in data.get("notes", [])],
            external_key=data.get("external_key"),
        )


def reap_run(store: CheckpointStore, run: RunRecord) -> list[str]:
    """Kill, on this host, what dead holders left running of one run: the processes of its
    tasks whose lease is free, and of its sessions whose lease is free (an environment's
    daemons). A task or session whose lease is free has no live runner, so whatever its record
    says is still running is an orphan; a process that merely reused a recorded pid is never
    touched (``kill_recorded_process``). Returns a note per kill, for the log."""
    notes: list[str] = []
    me = host_id()
    for session in store.list_sessions(run.job_key, run.run_id):
        if session.host != me or store.session_lease_held(
            run.job_key, run.run_id, session.session_id
        ):
            continue
        killed = kill_marked(session.markers)
        store.delete_session(run.job_key, run.run_id, session.session_id)
        if killed:
            notes.append(
                f"stopped {killed} environment process(es) left running by a dead session "
                f"of run {run.run_id}"
            )
    try:
        records, _ = store.read_tasks(run.job_key, run.run_id)
    except StoreError:
        return notes
    for rec in records:
        if rec.process is None or rec.process.host != me:
            continue
        if store.task_lease_held(run.job_key, run.run_id, rec.step, rec.task_key):
            continue
        if kill_recorded_process(rec.process):
            notes.append(
                f"stopped process {rec.process.pid} of {rec.step} left running by a dead "
                f"runner of run {run.run_id}"
            )
    return notes


def delete_run(store: CheckpointStore, run: RunRecord) -> list[str]:
    """Delete a run with its task records and checkpoints (``checkpoints delete``, ``gc``),
    after killing on this host what dead holders of it left running (``reap_run``), so that
    nothing of it runs on unsupervised. Returns the notes of ``reap_run``.

    Raises:
        RunError: a live process drives the run or runs one of its tasks or sessions now.
        StoreError: the store cannot be read or written.
    """
    busy = store.lease_held(run)
    if not busy:
        records, _ = store.read_tasks(run.job_key, run.run_id)
        busy = any(
            store.task_lease_held(run.job_key, run.run_id, r.step, r.task_key)
            for r in records
            if r.process is not None
        ) or any(
            store.session_lease_held(run.job_key, run.run_id, s.session_id)
            for s in store.list_sessions(run.job_key, run.run_id)
        )
    if busy:
        raise RunError(f"run {run.run_id} is running now; stop it first")
    notes = reap_run(store, run)
    store.delete_run(run.job_key, run.run_id)
    return notes


def reap_orphans(store: CheckpointStore, job_key: str) -> list[str]:
    """``reap_run`` for every unfinished run of the job. Returns the notes, with a warning
    for each run record found unreadable and set aside (``RunSetAside``: this first look at
    the job's runs is the one that sets it aside, so the attempt says why it does not resume
    that run)."""
    runs, warnings = store.list_runs(job_key)
    notes = [f"warning: {w}" for w in warnings if isinstance(w, RunSetAside)]
    for run in runs:
        if run.status == RunStatus.RUNNING:
            notes.extend(reap_run(store, run))
    return notes


def _live_driver(store: CheckpointStore, job_key: str) -> RunRecord | None:
    runs, _ = store.list_runs(job_key)
    for run in runs:
        if run.external_key is None and run.status == RunStatus.RUNNING and run_is_live(store, run):
            return run
    return None


def _unfinished_termination(store: CheckpointStore, run: RunRecord) -> Termination:
    """The termination asked for in a run's last attempt, if that attempt never finished (its
    driver died): a scheduler's next attempt of the same run keeps it, since a request accepted
    is never dropped."""
    if run.phase == "ended":
        return Termination()
    return resolve_termination(store.read_stop_requests(run.job_key, run.run_id), run.attempt)


def _refuse_if_scheduled_elsewhere(
    store: CheckpointStore, job: PreparedJob, run_id: str, external_key: str | None
) -> None:
    """An operator resume may not take over a live run that a scheduler (another external
    key) is running: its tasks may be running now, with no run lease to show it. The refusal
    names the scheduler run that began the latest attempt (which may have taken the run over
    from the one that made it)."""
    run = store.find_run(run_id)
    if run is None:
        return
    holder = run.attempt_key
    if holder is None and run.runner is None:  # a record made before attempt_key
        holder = run.external_key
    if (
        holder is not None
        and holder != external_key
        and run.status == RunStatus.RUNNING
        and run.phase != "ended"
    ):
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"run {run_id} belongs to {holder!r} and has not ended; stop it there "
            "(or with 'openjd-checkpoint stop') first",
        )


def _latest_run_id(store: CheckpointStore, job: PreparedJob) -> str:
    runs, _ = store.list_runs(job.job_key)
    for run in reversed(runs):
        if run.status != RunStatus.SUCCEEDED and not run.superseded_by:
            return run.run_id
    raise ResumeRefusedError(
        RefusalCode.UNKNOWN_RUN, f"no unfinished run of this job in {store.location}"
    )


def begin_attempt(
    store: CheckpointStore,
    job: PreparedJob,
    *,
    how: ResumeHow = ResumeHow.RETRY,
    run_id: str | None = None,
    from_step: str | None = None,
    generation: int | None = None,
    external_key: str | None = None,
    hold_lease: bool = False,
) -> Attempt:
    """Begin an attempt of ``job``: continue an earlier run or start a new one.

    Which run it continues (Trax, seed 001; docs/decisions.md "Resuming"):

    - with ``external_key`` and ``RETRY``: the run made for that key, whatever its checkpoints
      and whether it is running, failed or succeeded (the framework's own retry, or a clear,
      of part of the same run; ``plan_group(..., rerun=True)`` says what a cleared unit runs);
      a template or input changed since that run began is refused (``chain-changed``,
      ``different-input``): the framework planned the run with the old ones;
    - ``RETRY`` without a key: the newest unfinished run of the job, when allowed;
    - ``REQUEUE``: a new run from the top;
    - ``OPERATOR``: ``run_id`` exactly (or ``"latest"``), from ``from_step`` and ``generation``,
      or a refusal.

    Before anything else, what dead holders left running on this host is killed
    (``reap_orphans``). Without an external key only one run of a job may be live at a time:
    another process starting the same job is refused (``already-resumed``).

    Args:
        hold_lease: take the run's lease for this process (the local CLI, whose one process
            drives the run); adapters whose tasks run elsewhere leave it False.

    Returns:
        The ``Attempt``; ``attempt.lease`` holds the run's lease when ``hold_lease``.

    Raises:
        ResumeRefusedError: an operator resume was refused, another process runs the job, or
            the template or input of the key's run changed.
        StoreError: the store cannot be read or written.
    """
    notes: list[str] = []
    superseded: list[RunRecord] = []
    carried = Termination()
    with store.job_lock(job.job_key):
        notes.extend(reap_orphans(store, job.job_key))
        run: RunRecord | None = None
        resumed = False
        completed: int | None = None
        if external_key is not None and how == ResumeHow.RETRY:
            runs, _ = store.list_runs(job.job_key)
            mine = [r for r in runs if r.external_key == external_key and not r.superseded_by]
            existing = mine[-1] if mine else None
            if existing is not None:
                # The scheduler runs part of its run again (a retry, or a clear of task
                # instances, of a running, failed or succeeded run): that run goes on, with the
                # template and inputs it began with, which its scheduler planned with.
                check_input(job, existing)
                check_chain(job, existing)
            if existing is not None and existing.status == RunStatus.SUCCEEDED:
                run = existing
                completed = existing.attempt
                notes.append(
                    f"continuing run {existing.run_id} of {external_key}, which succeeded in "
                    f"attempt {existing.attempt}: the tasks run again now run from their start, "
                    "the others keep their outcome"
                )
            elif existing is not None:
                carried = _unfinished_termination(store, existing)
                notes.extend(reap_run(store, existing))
                try:
                    check_run(store, job, existing, notes=notes)
                    resumed = True
                    run = existing
                    notes.append(f"resuming run {existing.run_id} (attempt {run.attempt + 1})")
                except ResumeRefusedError as refusal:
                    if refusal.code in (RefusalCode.NO_CHECKPOINT, RefusalCode.ALREADY_RESUMED):
                        run = existing  # the same run goes on; nothing stored to resume from
                        notes.append(f"continuing run {existing.run_id}: nothing to resume")
                    else:
                        notes.append(
                            f"not resuming run {existing.run_id}: {refusal}; running from the top"
                        )
                        superseded.append(existing)
        else:
            if external_key is None:
                live = _live_driver(store, job.job_key)
                if live is not None:
                    who = describe_holder(store, live.runner)
                    raise ResumeRefusedError(
                        RefusalCode.ALREADY_RESUMED,
                        f"job {job.job.name!r} is being run now{who} (run {live.run_id}); "
                        f"stop it first ('openjd-checkpoint stop {live.run_id} --mode "
                        "Suspended') or wait for it to end",
                    )
            if how == ResumeHow.OPERATOR and run_id == "latest":
                run_id = _latest_run_id(store, job)
            if how == ResumeHow.OPERATOR and run_id is not None:
                _refuse_if_scheduled_elsewhere(store, job, run_id, external_key)
            plan = plan_resume(
                store,
                job,
                how,
                run_id=run_id,
                from_step=from_step,
                generation=generation,
                scheduled=external_key is not None,
            )
            notes.extend(plan.notes)
            superseded.extend(plan.superseded)
            run = plan.run
            resumed = run is not None
            if run is not None and how == ResumeHow.OPERATOR and (from_step or generation):
                _persist_resume_point(store, run, plan.records)
        if run is None:
            run = RunRecord(
                job_key=job.job_key,
                run_id=new_run_id(),
                job_name=job.job.name,
                template_path=str(job.template.source) if job.template.source else None,
                template_hash=job.template.template_hash,
                step_hashes=dict(job.template.step_hashes),
                parameters=job.parameters,
                finally_steps=list(job.template.finally_steps),
                environments=list(job.environment_paths),
                path_mapping_rules=[r.to_dict() for r in job.path_mapping_rules],
                external_key=external_key,
                attempt=0,
                files_mode=store.file_flow.value,
            )
        elif run.files_mode and run.files_mode != store.file_flow.value:
            notes.append(
                f"run {run.run_id} keeps its checkpoint files {run.files_mode}, as it started "
                f"(the {store.file_flow.value} setting applies to new runs)"
            )
            store.file_flow = FileDataFlow(run.files_mode)
        lease: Lease | None = None
        if hold_lease:
            lease = store.acquire_lease(run)
            if lease is None:
                raise ResumeRefusedError(
                    RefusalCode.ALREADY_RESUMED,
                    f"run {run.run_id} is being run by another process",
                )
        try:
            with store.run_lock(run.job_key, run.run_id):
                current = store.read_run(run.job_key, run.run_id) if run.attempt else None
                rec = current or run
                rec.attempt += 1
                rec.status = RunStatus.RUNNING
                rec.phase = "regular"
                rec.runner = this_process() if hold_lease else None
                rec.attempt_key = external_key
                if completed is not None:
                    rec.completed_attempt = completed
                rec.message = None
                rec.skipped_tasks = []
                rec.termination = None
                rec.timed_out = None
                rec.job_status = None
                rec.condition = RunCondition(status="Unknown", reason="Running")
                if carried.mode is not None and rec.run_id == run.run_id and current is not None:
                    store.add_stop_request(
                        rec,
                        StopRequest(
                            mode=carried.mode.value,
                            requested_by=this_process(),
                            attempt=rec.attempt,
                            force=carried.force,
                            deadline=carried.deadline,
                        ),
                    )
                    rec.condition = RunCondition(
                        status="Unknown",
                        reason="Stopping",
                        message=f"{carried.mode.value} requested in attempt {rec.attempt - 1}",
                    )
                    rec.termination = carried.mode.value
                    notes.append(
                        f"{carried.mode.value} was asked for in attempt {rec.attempt - 1}, which "
                        "never finished; it still holds"
                    )
                store.write_run(rec)
        except BaseException:
            if lease is not None:
                lease.release()
            raise
    for old in superseded:
        if old.run_id != rec.run_id:
            try:
                store.update_run(old.job_key, old.run_id, superseded_by=rec.run_id)
            except StoreError as exc:
                notes.append(f"warning: {exc}")
    return Attempt(
        job_key=rec.job_key,
        run_id=rec.run_id,
        attempt=rec.attempt,
        resumed=resumed,
        notes=notes,
        external_key=external_key,
        lease=lease,
    )


def _persist_resume_point(
    store: CheckpointStore, run: RunRecord, records: list[TaskRecord]
) -> None:
    """Store what an operator resume with ``--from``/``--generation`` resumes from, so that
    every process planning this attempt sees it: records it keeps are written as planned, and
    the records of steps it runs again from the top are deleted."""
    stored, _ = store.read_tasks(run.job_key, run.run_id)
    kept = {(r.step, r.task_key) for r in records}
    for rec in stored:
        if (rec.step, rec.task_key) not in kept:
            store.delete_task(rec)
    for rec in records:
        store.write_task(rec)


# --- planning and running tasks -----------------------------------------------------------------
def attempt_records(store: CheckpointStore, job: PreparedJob, run: RunRecord) -> list[TaskRecord]:
    """The run's task records as this attempt plans with them: finally tasks that succeeded in
    an earlier attempt are left out, because finally steps run again on every attempt."""
    records, _ = store.read_tasks(run.job_key, run.run_id)
    return _for_attempt(job, run, records)


def _for_attempt(
    job: PreparedJob,
    run: RunRecord,
    records: list[TaskRecord],
    originals: Sequence[TaskSpec] | None = None,
) -> list[TaskRecord]:
    """``records`` as this attempt plans with them. For a run continued after it succeeded
    (``RunRecord.completed_attempt``), a regular task among ``originals`` (default: every
    regular step's) that has no record succeeded in that attempt: its record is made here."""
    kept = [
        r
        for r in records
        if not (
            job.template.is_finally(r.step)
            and r.status == TaskStatus.SUCCEEDED
            and r.run_attempt < run.attempt
        )
    ]
    if run.completed_attempt is None:
        return kept
    if originals is None:
        originals = [t for step in job.template.regular_steps for t in job.plan_step(step)]
    have = {(r.step, r.task_key) for r in records}
    for spec in originals:
        if job.template.is_finally(spec.step_name) or (spec.step_name, spec.task_key) in have:
            continue
        done = job.new_task_record(
            spec,
            run.run_id,
            status=TaskStatus.SUCCEEDED,
            run_attempt=run.completed_attempt,
            completed_frames=sorted(spec.chunk_frames),
        )
        kept.append(done)
    return kept


def prepare_run_job(store: CheckpointStore, job_key: str, run_id: str) -> PreparedJob:
    """Rebuild a run's job in another process from its record alone (template path, job
    parameter values, environment templates, path mapping rules).

    Raises:
        RunError: no such run, or its record names no template.
        ResumeRefusedError: ``chain-changed``: the template file changed since the run began.
        TemplateError: the template or its parameters are no longer valid.
    """
    run = store.read_run(job_key, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r} in {store.location}")
    if run.template_path is None:
        raise RunError(f"run {run_id} has no template path; prepare the job from its template")
    job = prepare_job(
        run.template_path,
        run.parameters,
        environments=run.environments,
        path_mapping_rules=load_path_mapping_rules(run.path_mapping_rules),
    )
    if job.template.template_hash != run.template_hash:
        raise ResumeRefusedError(
            RefusalCode.CHAIN_CHANGED,
            f"the template {run.template_path} changed since run {run_id} began",
        )
    return job


def _read_run(store: CheckpointStore, job: PreparedJob, run_id: str) -> RunRecord:
    run = store.read_run(job.job_key, run_id)
    if run is None:
        raise RunError(f"no run {run_id!r} of job {job.job.name!r} in {store.location}")
    return run


def plan_step(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    step_name: str,
    *,
    records: list[TaskRecord] | None = None,
) -> list[TaskSpec]:
    """The tasks of ``step_name`` this attempt of the run still has to run: finished tasks are
    left out, checkpointed tasks resume, interrupted chunks keep only their unfinished frames
    (``PreparedJob.plan_step``). Each ``TaskSpec`` has a readable ``label`` and travels as
    ``to_dict()``/``TaskSpec.from_dict()``.

    Raises:
        RunError: no such run. KeyError: no such step. StoreError: the store cannot be read.
    """
    if records is None:
        records = attempt_records(store, job, _read_run(store, job, run_id))
    return job.plan_step(step_name, [r for r in records if r.step == step_name])


def claim_task(
    store: CheckpointStore, job: PreparedJob, run_id: str, spec: TaskSpec
) -> tuple[Lease, TaskRecord | None, list[str]]:
    """Take the task's lease and make sure no earlier process of it is alive on this host.

    Returns the lease (release it when the task ends), the task's stored record (None if it has
    none) and notes for the log.

    Raises:
        ResumeRefusedError: ``already-resumed``: another live process holds the task.
        StoreError: the store cannot be read or written.
    """
    lease = store.acquire_task_lease(
        job.job_key, run_id, spec.step_name, spec.task_key, wait_seconds=0.5
    )  # a reap that probes the lease lets go at once; a holder does not
    if lease is None:
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run_id} is being run by another process",
        )
    notes: list[str] = []
    try:
        rebuilt: list[str] = []
        record = store.read_task(job.job_key, run_id, spec.step_name, spec.task_key, rebuilt)
        notes.extend(f"warning: {w}" for w in rebuilt)
    except StoreError as exc:
        notes.append(f"warning: {exc}; the task runs from the top")
        record = None
    except BaseException:
        lease.release()
        raise
    if record is not None and record.process is not None:
        if kill_recorded_process(record.process):
            notes.append(
                f"stopped process {record.process.pid} of {spec.label} left running by an "
                "earlier attempt"
            )
    return lease, record, notes


def run_task(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    **options: Any,
) -> TaskResult:
    """Run one task of a run, in this process, to its end (any process, any host): a group of
    one (``run_tasks``), in a session of its own.

    Raises:
        ResumeRefusedError: ``already-resumed`` (another process runs this task now).
        RunError: the run does not exist or has ended.
        StoreError: the store cannot be read or written when the task starts.
    """
    [result] = run_tasks(store, job, run_id, [spec], **options)
    return result


def record_notice(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    notice: Notice,
    *,
    attempt: int,
    stopped_after: float | None = None,
) -> None:
    """Note in the run's record (``RunRecord.notices``) that an interruption notice stopped
    an attempt; called again with ``stopped_after`` (seconds from the notice until its tasks
    had stopped) updates the same entry.

    Raises:
        StoreError: the store cannot be read or written.
    """
    entry = {**notice.to_record(), "attempt": attempt}
    if stopped_after is not None:
        entry["stopped_after"] = round(stopped_after, 3)
    with store.run_lock(job_key, run_id):
        run = store.read_run(job_key, run_id)
        if run is None:
            return
        for i, old in enumerate(run.notices):
            if (old.get("source"), old.get("received_at")) == (notice.source, notice.received_at):
                run.notices[i] = entry
                break
        else:
            run.notices.append(entry)
        store.write_run(run)


def record_environment_failure(
    store: CheckpointStore, job_key: str, run_id: str, message: str, *, attempt: int
) -> None:
    """Note in the run's record (``RunRecord.environment_failures``) that an environment's
    ``onExit`` (or the ``onWrapEnvExit`` that wraps it) failed when a session closed:
    ``finish_attempt`` then ends this attempt Failed, as ``openjd run`` ends a session whose
    environment exit failed (RFC 0008 "Failure semantics"; the conformance data's
    ``wrap-failed-exit-hook-own-onexit-still-runs``). The tasks keep their own outcomes: a
    retry does not run them again.

    Args:
        message: what failed, naming the action (``Session.close``'s return value).
        attempt: the run attempt whose session it was.

    Raises:
        StoreError: the store cannot be read or written.
    """
    with store.run_lock(job_key, run_id):
        run = store.read_run(job_key, run_id)
        if run is None:
            return
        run.environment_failures.append({"attempt": attempt, "message": message})
        store.write_run(run)


def run_tasks(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    specs: list[TaskSpec],
    *,
    on_output: Callable[[TaskExecution, list[str]], None] | None = None,
    on_event: Callable[[TaskExecution, TaskEvent], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    on_start: Callable[[TaskExecution], None] | None = None,
    working_root: str | None = None,
    poll_seconds: float = 0.5,
    notices: Sequence[NoticeSource] = (),
    notice_poll_seconds: float | None = None,
    on_notice: Callable[[Notice], None] | None = None,
) -> list[TaskResult]:
    """Run tasks of a run one after the other in one OpenJD session, in this process (an
    Airflow task instance or a Prefect task run that runs a group of a step's tasks).

    Each task's lease is held while it runs; a previous process of it left alive on this host
    is killed first. Termination requests of the run reach the running task within
    ``poll_seconds`` and stop it as ``task_stop_for`` says, with the request's ``force`` and
    ``deadline``; tasks not started by then are not started (``TaskOutcome.SKIPPED``). Finally
    tasks get the ``{{Job.Status}}`` that ``enter_finally`` stored. The session's environments
    are entered once, before the first task, and exited after the last.

    An interruption notice from one of ``notices`` (``core._notices``) stops the running
    task as ``Suspended`` does (``checkpointCancelation``), with the notice's deadline, and
    the tasks after it are not started: the host is going away, so this process's tasks
    stop (the run's other processes, on other hosts, go on) and the framework's retry
    resumes them. The run's record notes the notice (``record_notice``); the log says how
    long the checkpoints took against its deadline; an Azure event is acknowledged once the
    tasks have stopped.

    Args:
        specs: the tasks, all of one step (``plan_step``, or ``TaskSpec.from_dict``).
        on_start: called with each ``TaskExecution`` before it runs (for example to keep it for
            an ``on_kill`` that calls ``stop(..., deadline=...)``).
        notices: interruption notice sources (``parse_notice_sources``); none by default.
        notice_poll_seconds: at most one request per source this often (default 5 s).
        on_notice: called with each notice acted on (on a background thread), before the
            running task is stopped.

    Returns:
        One ``TaskResult`` per spec, in order.

    Raises:
        ResumeRefusedError: ``already-resumed``: another process runs one of these tasks now
            (tasks before it have run; none after it).
        RunError: the run does not exist or has ended.
        StoreError: the store cannot be read or written when a task starts.
    """
    run = _read_run(store, job, run_id)
    if run.phase == "ended" or run.status != RunStatus.RUNNING:
        labels = ", ".join(s.label for s in specs)
        raise RunError(f"run {run_id} has ended ({run.status.value}); {labels} not run")
    current: list[TaskExecution] = []
    state: dict[str, Any] = {"term": Termination(), "notice": None}
    lock = threading.Lock()

    def apply(term: Termination) -> None:
        with lock:
            state["term"] = term
            notice = state["notice"]
            executions = list(current)
        if notice is not None:  # this process is suspended by a notice: the earliest deadline
            term = fold_request(
                term, TerminationMode.SUSPENDED, phase="regular", deadline=notice.deadline
            )[0]
        session.stop(force=term.force, deadline=term.deadline)  # an onExit at close, too
        for execution in executions:
            intent = task_stop_for(
                term.mode, is_finally=job.template.is_finally(execution.spec.step_name)
            )
            if intent is not None:
                execution.stop(intent, force=term.force, deadline=term.deadline)

    def notified(notice: Notice) -> None:
        if on_note is not None:
            on_note(f"interruption notice from {notice.describe()}: checkpointing and stopping")
        with lock:
            first = state["notice"] is None
            if first or (notice.deadline or float("inf")) < (
                state["notice"].deadline or float("inf")
            ):
                state["notice"] = notice
        if first:
            try:
                record_notice(store, job.job_key, run_id, notice, attempt=run.attempt)
            except StoreError as exc:
                if on_note is not None:
                    on_note(f"warning: the notice is not recorded in the run: {exc}")
        if on_notice is not None:
            on_notice(notice)
        apply(state["term"])

    def lease_expired(lease: Lease) -> None:
        with lock:
            executions = list(current)
        if on_note is not None:
            on_note(f"warning: {lease_expired_note(lease)}; stopping the task")
        for execution in executions:  # cancel: this process may no longer store its work
            execution.stop(StopIntent.CANCEL)

    session = Session(job, run_id=run_id, store=store, working_root=working_root)
    watcher = RunWatcher(
        store,
        job.job_key,
        run_id,
        run.attempt,
        apply,
        poll_seconds=poll_seconds,
        on_lease_expired=lease_expired,
    )
    watcher.check()
    watcher.start()
    notice_watcher = NoticeWatcher(
        notices,
        notified,
        on_note=on_note,
        poll_seconds=notice_poll_seconds or DEFAULT_POLL_SECONDS,
    )
    results: list[TaskResult] = []
    try:
        notice_watcher.start()
        for spec in specs:
            is_finally = job.template.is_finally(spec.step_name)
            session.job_status = run.job_status if is_finally else None
            if state["notice"] is not None:
                results.append(
                    TaskResult(
                        TaskOutcome.SKIPPED,
                        None,
                        "not started: an interruption notice "
                        f"({state['notice'].source}) stopped this process's tasks",
                        TaskExecution(job, spec, run_id=run_id).record,
                    )
                )
                continue
            if starts_no_tasks(state["term"].mode, is_finally=is_finally):
                mode = state["term"].mode
                results.append(
                    TaskResult(
                        TaskOutcome.SKIPPED,
                        None,
                        f"not started: the run is stopping ({mode.value if mode else ''})",
                        TaskExecution(job, spec, run_id=run_id).record,
                    )
                )
                continue
            lease, record, notes = claim_task(store, job, run_id, spec)
            watcher.leases.append(lease)
            try:
                for n in notes:
                    if on_note is not None:
                        on_note(n)
                execution = TaskExecution(
                    job,
                    spec,
                    run_id=run_id,
                    store=store,
                    record=record,
                    attempt=run.attempt,
                    on_output=on_output,
                    on_event=on_event,
                    working_root=working_root,
                    job_status=session.job_status,
                    session=session,
                )
                current[:] = [execution]
                apply(state["term"])
                if on_start is not None:
                    on_start(execution)
                results.append(execution.run())
            finally:
                current.clear()
                watcher.leases.remove(lease)
                lease.release()
    finally:
        problem = session.close()  # the watcher still runs: a deadline reaches onExit
        notice_watcher.close()
        watcher.close()
        if problem:
            _environment_failed(store, job.job_key, run_id, run.attempt, problem, on_note)
        notice = state["notice"]
        if notice is not None:
            _after_notice(store, job.job_key, run_id, run.attempt, notice, notice_watcher, on_note)
    return results


def lease_expired_note(lease: Lease) -> str:
    """Why a held lease no longer holds (``Lease.expired``), for a note."""
    if lease.lost:
        return "the lease was taken by another process (it expired here)"
    return (
        "the lease could not be renewed for its whole ttl (the store cannot be written), so "
        "another process may take over the work"
    )


def _environment_failed(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    attempt: int,
    problem: str,
    on_note: Callable[[str], None] | None,
) -> None:
    """A session's environment exit failed: record it (the attempt ends Failed) and say so."""
    note = problem  # finish_attempt ends the attempt Failed, unless it is suspended or stopped
    try:
        record_environment_failure(store, job_key, run_id, problem, attempt=attempt)
    except StoreError as exc:
        note = f"warning: {problem} (not recorded in the run: {exc})"
    if on_note is not None:
        on_note(note)


def _after_notice(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    attempt: int,
    notice: Notice,
    watcher: NoticeWatcher,
    on_note: Callable[[str], None] | None,
) -> None:
    """Once the tasks a notice stopped are gone: say how long it took against the deadline,
    note it in the run's record, acknowledge the notice (Azure)."""
    ended = time.time()
    notes = [checkpoint_timing(notice, ended)]
    try:
        record_notice(
            store,
            job_key,
            run_id,
            notice,
            attempt=attempt,
            stopped_after=ended - notice.received_at,
        )
    except StoreError as exc:
        notes.append(f"warning: the notice is not recorded in the run: {exc}")
    notes += watcher.acknowledge()
    if on_note is not None:
        for line in notes:
            on_note(line)


def plan_group(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    originals: list[TaskSpec],
    *,
    rerun: bool = False,
    notes: list[str] | None = None,
) -> list[TaskSpec]:
    """What to run now for some of a step's *original* tasks (``PreparedJob.plan_step`` with no
    records: the stable list an adapter maps over): each finished task drops out, a
    checkpointed task resumes, an interrupted chunk keeps only its unfinished frames (possibly
    as several pieces). So a ``map_index`` keeps naming the same OpenJD tasks on every try.

    ``rerun``: the scheduler runs this group again in the same run of its own (Airflow: a try
    after the first of a task instance, which Airflow runs only after a try that did not
    succeed, or when it was cleared); not for a first run of it, such as a new DAG run that
    resumes the run (an operator resume), where finished tasks stay finished. When
    every task of the group finished in an earlier attempt of the run (succeeded, or was
    declared done), they run again from their start: their records are reset (their stored
    checkpoint generations stay until the run's records go) and ``notes`` says so. A group with
    a task that did not finish resumes as without ``rerun``, its finished tasks left out.
    Finally steps run again on every attempt anyway (docs/decisions.md, "External run keys").

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
        ResumeRefusedError: ``already-resumed``: with ``rerun``, another live process holds one
            of the group's tasks.
    """
    if not originals:
        return []
    step = originals[0].step_name
    run = _read_run(store, job, run_id)
    records, _ = store.read_task_family(job.job_key, run_id, step, [s.task_key for s in originals])
    records = _for_attempt(job, run, records, originals)
    tasks = [s.parameters for s in originals]
    if rerun and not job.template.is_finally(step):
        by_key = {r.task_key: r for r in records}
        earlier = [by_key.get(s.task_key) for s in originals]
        if all(
            r is not None and r.status == TaskStatus.SUCCEEDED and r.run_attempt < run.attempt
            for r in earlier
        ):
            records = [_reset_record(store, job, run, s) for s in originals]
            if notes is not None:
                notes.extend(
                    f"{s.label}: finished in attempt {r.run_attempt}; runs again from its start"
                    for s, r in zip(originals, earlier, strict=True)
                    if r is not None
                )
    return job.plan_step(step, records, tasks=tasks)


def _reset_record(
    store: CheckpointStore, job: PreparedJob, run: RunRecord, spec: TaskSpec
) -> TaskRecord:
    """Write a fresh record for a finished task that runs again from its start (``plan_group``
    with ``rerun``), under its lease; the task's attempt count goes on."""
    lease = store.acquire_task_lease(
        job.job_key, run.run_id, spec.step_name, spec.task_key, wait_seconds=0.5
    )
    if lease is None:
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run.run_id} is being run by another process",
        )
    try:
        old = store.read_task(job.job_key, run.run_id, spec.step_name, spec.task_key)
        record = job.new_task_record(
            spec,
            run.run_id,
            attempt=old.attempt if old is not None else 0,
            run_attempt=run.attempt,
            message=f"run again from its start in attempt {run.attempt}",
        )
        store.write_task(record)
        return record
    finally:
        lease.release()


def record_task_done(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    spec: TaskSpec,
    message: str,
) -> TaskRecord:
    """Record a task as finished because the scheduler's user declared it done (Airflow's "mark
    success" on a task instance): it is neither run again nor resumed, all its frames count as
    finished, and its checkpoint no longer matters (``plan_step`` leaves it out). Call it once
    the process that ran the task has stopped it.

    Args:
        spec: the task as first planned (its original ``task_key``; a chunk's remainder pieces
            are covered by the original's frames).
        message: why, for the record.

    Returns:
        The record as written.

    Raises:
        ResumeRefusedError: ``already-resumed``: another live process runs the task now.
        StoreError: the store cannot be read or written.
    """
    lease = store.acquire_task_lease(job.job_key, run_id, spec.step_name, spec.task_key)
    if lease is None:
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"task {spec.label} of run {run_id} is being run by another process",
        )
    try:
        record = store.read_task(job.job_key, run_id, spec.step_name, spec.task_key)
        if record is None:
            record = TaskExecution(job, spec, run_id=run_id).record
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
        records, _ = store.read_tasks(job.job_key, run_id)
        held = [
            f"{r.step} {r.task_key}"
            for r in records
            if r.step in wanted
            and r.status == TaskStatus.RUNNING
            and store.task_lease_held(job.job_key, run_id, r.step, r.task_key)
        ]
        if not held or time.monotonic() >= deadline:
            return held
        time.sleep(poll_seconds)


# --- phases and outcome ---------------------------------------------------------------------------
def mark_timed_out(store: CheckpointStore, job_key: str, run_id: str, message: str) -> None:
    """Record that the run's own time budget expired (the run fails with reason Timeout)."""
    store.update_run(job_key, run_id, timed_out=message)


def _incomplete_roots(
    job: PreparedJob, names: Iterable[str], records: list[TaskRecord]
) -> tuple[list[str], list[str]]:
    """(steps that did not complete although their dependencies did, every step that did not
    complete) among ``names``."""
    incomplete: set[str] = set()
    for name in names:
        if job.plan_step(name, [r for r in records if r.step == name]):
            incomplete.add(name)
    roots = [
        n
        for n in names
        if n in incomplete and not any(d in incomplete for d in job.dependencies(n))
    ]
    return roots, [n for n in names if n in incomplete]


def _moot(mode: TerminationMode | None, records: list[TaskRecord], left: bool) -> bool:
    """True if a termination in force stopped nothing and kept nothing from starting: it was
    asked once every task it could reach had ended (``left``: some task is still to run) and
    no task of the attempt ended stopped. It then changes nothing that already happened: the
    outcome (and ``{{Job.Status}}``) is the tasks' own (docs/decisions.md, "Termination
    modes": a request after every task ended)."""
    stopped = (TaskStatus.CANCELED, TaskStatus.INTERRUPTED)
    return mode is not None and not left and not any(r.status in stopped for r in records)


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


def enter_finally(store: CheckpointStore, job: PreparedJob, run_id: str) -> FinallyDecision:
    """End the run's regular phase (call it once every regular task has really ended, killed
    tasks included) and decide whether the finally steps run (FINALLY, TEP-0058): they run
    unless the mode is ``Cancelled`` or ``Suspended``, with ``Job.Status`` computed from the
    records and the mode. The decision is stored, so finally tasks in any process read it.

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
    """
    with store.run_lock(job.job_key, run_id):
        run = _read_run(store, job, run_id)
        term = resolve_termination(store.read_stop_requests(job.job_key, run_id), run.attempt)
        records = attempt_records(store, job, run)
        _, incomplete = _incomplete_roots(job, job.template.regular_steps, records)
        regular = [r for r in records if not job.template.is_finally(r.step)]
        told = None if _moot(term.mode, regular, bool(incomplete)) else term.mode
        status = _job_status(told, bool(incomplete) or run.timed_out is not None)
        run_finally = bool(job.template.finally_steps) and term.mode not in (
            TerminationMode.CANCELLED,
            TerminationMode.SUSPENDED,
        )
        if run.phase == "regular":
            # a suspended run has no Job.Status yet: its finally steps run when it ends
            run.job_status = None if term.mode == TerminationMode.SUSPENDED else status
            if run_finally:
                run.phase = "finally"
            store.write_run(run)
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
    """

    status: RunStatus
    condition: RunCondition
    exit_code: int
    mode: TerminationMode | None = None
    skipped: list[str] = field(default_factory=list)
    failed_steps: list[str] = field(default_factory=list)
    finally_failed: list[str] = field(default_factory=list)


def finish_attempt(
    store: CheckpointStore,
    job: PreparedJob,
    run_id: str,
    *,
    finally_timeout: str | None = None,
    skipped: list[str] | None = None,
) -> RunOutcome:
    """End the attempt: compute the run's status, condition and reason from its records and
    termination requests, store them, and delete the run's checkpoints only when the whole run,
    finally steps included, succeeded (seed 001: "a run that completes deletes its
    checkpoints"). Requests made after this are refused.

    Args:
        finally_timeout: the message of an expired finally budget, if it expired.
        skipped: the tasks not started, as labels (default: every task still planned).

    Raises:
        RunError: no such run. StoreError: the store cannot be read or written.
    """
    with store.run_lock(job.job_key, run_id):
        run = _read_run(store, job, run_id)
        reap_run(store, run)  # nothing of the attempt is left running on this host
        term = resolve_termination(store.read_stop_requests(job.job_key, run_id), run.attempt)
        mode = term.mode
        records = attempt_records(store, job, run)
        failed_steps, incomplete = _incomplete_roots(job, job.template.regular_steps, records)
        finally_failed: list[str] = []
        if run.phase == "finally":
            failed_here = {
                r.step
                for r in records
                if job.template.is_finally(r.step)
                and r.status == TaskStatus.FAILED
                and r.run_attempt == run.attempt
            }
            if finally_timeout:
                failed_here.update(_incomplete_roots(job, job.template.finally_steps, records)[1])
            finally_failed = [s for s in job.template.finally_steps if s in failed_here]
        env_failed = [
            str(f.get("message"))
            for f in run.environment_failures
            if f.get("attempt") == run.attempt
        ]
        left = [
            spec.label
            for name in job.step_order()
            for spec in job.plan_step(name, [r for r in records if r.step == name])
        ]
        if skipped is None:
            skipped = left
        if _moot(mode, records, bool(left)) and run.job_status not in ("Cancelled", "Stopped"):
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
        run.phase = "ended"
        store.write_run(run)
        if status == RunStatus.SUCCEEDED:
            # After the record: a crash in between leaves files for gc, never a run that
            # looks unfinished with its checkpoints gone.
            store.delete_checkpoints(run)
    return RunOutcome(status, cond, code, mode, list(skipped), failed_steps, finally_failed)
