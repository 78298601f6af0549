"""Attempts of a run, and what an attempt plans: operations any scheduler calls, from any
process and any host.

A *run* is one job (template + job parameter values) carried through one or more *attempts*
until it ends. Airflow and Prefect own a run themselves and execute its tasks in separate
processes, often on separate hosts, with no process of ours alive between tasks. So everything
that makes a run is an operation on plain, JSON-serializable inputs that share nothing but the
store:

1. ``begin_attempt``: decide what this attempt continues (a retry, a requeue, an operator
   resume, or the framework's own retry of the run named by an *external run key*), or refuse
   with a Trax code (seed 001); kill what dead holders left running.
2. ``plan_step`` / ``plan_group``: the tasks of a step still to run, as ``TaskSpec``
   (``to_dict``/``from_dict``).
3. running them is the executor's (``core.run._executor``); ending the attempt is
   ``core.run._phases`` (``enter_finally``, ``finish_attempt``).

Which process may call what: see docs/core-api.md.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from core._errors import RunError, StoreError, TemplateError
from core._host import FileDataFlow, host_id
from core._records import (
    RunCondition,
    RunPhase,
    RunRecord,
    RunStatus,
    StopRequest,
    TaskRecord,
    TaskStatus,
)
from core._words import command_words
from core.job import (
    PreparedJob,
    TaskSpec,
    iter_plan,
    load_path_mapping_rules,
    new_task_record,
    plan_tasks,
    prepare_job,
)
from core.process import kill_marked, kill_recorded_process, recorded_name
from core.store import (
    CheckpointStore,
    Lease,
    RunSetAside,
    describe_holder,
    new_run_id,
    task_warning_outcome,
    this_process,
)
from core.task import (
    RefusalCode,
    ResumeHow,
    ResumeRefusedError,
    Termination,
    check_chain,
    check_input,
    check_run,
    no_run_words,
    plan_resume,
    resolve_termination,
    run_is_live,
)

__all__ = (
    "Attempt",
    "attempt_records",
    "iter_attempt_records",
    "begin_attempt",
    "plan_group",
    "plan_step",
    "prepare_run_job",
    "RunIds",
    "reap_orphans",
    "reap_run",
    "reap_sessions",
    "reap_task",
)


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
        record: the run's record as ``begin_attempt`` wrote it (not serialized; None in an
            ``Attempt`` made by ``from_dict``).
    """

    job_key: str
    run_id: str
    attempt: int
    resumed: bool = False
    notes: list[str] = field(default_factory=list)
    external_key: str | None = None
    lease: Lease | None = field(default=None, repr=False, compare=False)
    record: RunRecord | None = field(default=None, repr=False, compare=False)

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


class RunIds(NamedTuple):
    """A run named by its job key and id alone: what ``reap_run`` needs of a run, for one
    whose record cannot be read (``core.run._delete.delete_set_aside_run``)."""

    job_key: str
    run_id: str


def reap_run(store: CheckpointStore, run: RunRecord | RunIds) -> list[str]:
    """Kill, on this host, what dead holders left running of one run: the processes of its
    tasks whose lease is free, and of its sessions whose lease is free (an environment's
    daemons). A task or session whose lease is free has no live runner, so whatever its record
    says is still running is an orphan; a process that merely reused a recorded pid is never
    touched (``kill_recorded_process``). Returns a note per kill, for the log."""
    notes = reap_sessions(store, run)
    me = host_id()
    # This first read after a crash is the one that sets an unreadable record aside (and
    # rebuilds it from its newest generation): the resume check that follows finds the record
    # readable, so the warning is said here or never.
    warnings: list[str] = []
    try:  # one at a time: only those that name a process of this host are kept
        records = [
            rec
            for rec in store.iter_tasks(run.job_key, run.run_id, warnings)
            if rec.process is not None and rec.process.host == me
        ]
    except StoreError:
        return notes
    for w in warnings:
        if "schema version" not in w:  # left in place: the resume check refuses with it
            rest = task_warning_outcome(w)
            notes.append(f"warning: {w}{rest}")
    for rec in records:
        note = reap_task(store, run, rec)
        if note:
            notes.append(note)
    return notes


def reap_sessions(store: CheckpointStore, run: RunRecord | RunIds) -> list[str]:
    """The sessions' part of ``reap_run``: kill, on this host, what the dead sessions of one
    run left running (an environment's daemons), and delete their records. Returns a note
    per kill."""
    notes: list[str] = []
    me = host_id()
    for session in store.sessions.list(run.job_key, run.run_id):
        if session.host != me or store.sessions.lease_held(
            run.job_key, run.run_id, session.session_id
        ):
            continue
        killed = kill_marked(session.markers)
        store.sessions.delete(run.job_key, run.run_id, session.session_id)
        if killed:
            notes.append(
                f"stopped {killed} environment process(es) left running by a dead session "
                f"of run {run.run_id}"
            )
    return notes


def reap_task(store: CheckpointStore, run: RunRecord | RunIds, rec: TaskRecord) -> str | None:
    """The task's part of ``reap_run``: kill the process ``rec`` names if it runs on this host
    and the task's lease is free (its runner died). Returns the note of the kill, else None."""
    if rec.process is None or rec.process.host != host_id():
        return None
    if store.task_lease_held(run.job_key, run.run_id, rec.step, rec.task_key):
        return None
    if kill_recorded_process(rec.process):
        return (
            f"stopped {recorded_name(rec.process)} of {rec.step} left running by a dead "
            f"runner of run {run.run_id}"
        )
    return None


def reap_orphans(
    store: CheckpointStore,
    job_key: str,
    listed: tuple[list[RunRecord], list[str]] | None = None,
) -> list[str]:
    """``reap_run`` for every unfinished run of the job. Returns the notes, with a warning
    for each run record found unreadable and set aside (``RunSetAside``: this first look at
    the job's runs is the one that sets it aside, so the attempt says why it does not resume
    that run). ``listed``: the job's ``CheckpointStore.list_runs``, if the caller has it."""
    runs, warnings = store.list_runs(job_key) if listed is None else listed
    notes = [f"warning: {w}" for w in warnings if isinstance(w, RunSetAside)]
    for run in runs:
        if run.status == RunStatus.RUNNING:
            notes.extend(reap_run(store, run))
    return notes


def _live_driver(store: CheckpointStore, runs: list[RunRecord]) -> RunRecord | None:
    for run in runs:
        if run.external_key is None and run.status == RunStatus.RUNNING and run_is_live(store, run):
            return run
    return None


def _unfinished_termination(store: CheckpointStore, run: RunRecord) -> Termination:
    """The termination asked for in a run's last attempt, if that attempt never finished (its
    driver died): a scheduler's next attempt of the same run keeps it, since a request accepted
    is never dropped."""
    if run.phase == RunPhase.ENDED:
        return Termination()
    return resolve_termination(store.read_stop_requests(run.job_key, run.run_id), run.attempt)


def _refuse_if_scheduled_elsewhere(
    store: CheckpointStore, runs: list[RunRecord], run_id: str, external_key: str | None
) -> None:
    """An operator resume may not take over a live run that a scheduler (another external
    key) is running: its tasks may be running now, with no run lease to show it. The refusal
    names the scheduler run that began the latest attempt (which may have taken the run over
    from the one that made it). ``runs``: the job's, as listed under its lock."""
    run = store.find_run(run_id, among=runs)
    if run is None:
        return
    holder = run.attempt_key
    if holder is None and run.runner is None:  # a record made before attempt_key
        holder = run.external_key
    if (
        holder is not None
        and holder != external_key
        and run.status == RunStatus.RUNNING
        and run.phase != RunPhase.ENDED
    ):
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED,
            f"run {run_id} belongs to {holder!r} and has not ended; stop it there "
            "(or with 'openjd-checkpoint stop') first",
        )


def _latest_run_id(store: CheckpointStore, runs: list[RunRecord]) -> str:
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
        # The job's run records, read once under its lock: each decision below looks at these.
        listed = store.list_runs(job.job_key)
        runs = listed[0]
        notes.extend(reap_orphans(store, job.job_key, listed))
        run: RunRecord | None = None
        resumed = False
        completed: int | None = None
        if external_key is not None and how == ResumeHow.RETRY:
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
                live = _live_driver(store, runs)
                if live is not None:
                    who = describe_holder(store, live.runner)
                    stop = command_words(
                        "stop", live.run_id, "--mode", "Suspended", "--store", store.location
                    )
                    raise ResumeRefusedError(
                        RefusalCode.ALREADY_RESUMED,
                        f"job {job.job.name!r} is being run now{who} (run {live.run_id}); "
                        f"stop it first ('{stop}') or wait for it to end",
                    )
            if how == ResumeHow.OPERATOR and run_id == "latest":
                run_id = _latest_run_id(store, runs)
            if how == ResumeHow.OPERATOR and run_id is not None:
                _refuse_if_scheduled_elsewhere(store, runs, run_id, external_key)
            plan = plan_resume(
                store,
                job,
                how,
                run_id=run_id,
                from_step=from_step,
                generation=generation,
                scheduled=external_key is not None,
                listed=listed,
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
                rec.phase = RunPhase.REGULAR
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
        record=rec,
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
    return list(iter_attempt_records(store, job, run))


def iter_attempt_records(
    store: CheckpointStore, job: PreparedJob, run: RunRecord
) -> Iterator[TaskRecord]:
    """``attempt_records``, one record at a time as they are read from the store, so that a
    run of any size is read in memory that does not grow with its task count (a run continued
    after it succeeded keeps the keys of its records until the last is read).

    Raises:
        StoreError: the run's records cannot be listed.
    """
    have: set[tuple[str, str]] | None = set() if run.completed_attempt is not None else None
    for rec in store.iter_tasks(run.job_key, run.run_id):
        if have is not None:
            have.add((rec.step, rec.task_key))
        if not _left_out(job, run, rec):
            yield rec
    if have is None:
        return
    for step in job.template.regular_steps:
        for spec in iter_plan(job, step):
            if (spec.step_name, spec.task_key) not in have:
                yield _done_in_completed_attempt(job, run, spec)


def _left_out(job: PreparedJob, run: RunRecord, rec: TaskRecord) -> bool:
    """True for a finally task that succeeded in an earlier attempt (it runs again)."""
    return (
        job.template.is_finally(rec.step)
        and rec.status == TaskStatus.SUCCEEDED
        and rec.run_attempt < run.attempt
    )


def _done_in_completed_attempt(job: PreparedJob, run: RunRecord, spec: TaskSpec) -> TaskRecord:
    """The record of a regular task of a run continued after it succeeded that has none: it
    succeeded in that attempt (``RunRecord.completed_attempt``)."""
    return new_task_record(
        job,
        spec,
        run.run_id,
        status=TaskStatus.SUCCEEDED,
        run_attempt=run.completed_attempt,
        completed_frames=sorted(spec.chunk_frames),
    )


def _for_attempt(
    job: PreparedJob,
    run: RunRecord,
    records: list[TaskRecord],
    originals: Sequence[TaskSpec] | None = None,
) -> list[TaskRecord]:
    """``records`` as this attempt plans with them. For a run continued after it succeeded
    (``RunRecord.completed_attempt``), a regular task among ``originals`` (default: every
    regular step's) that has no record succeeded in that attempt: its record is made here."""
    kept = [r for r in records if not _left_out(job, run, r)]
    if run.completed_attempt is None:
        return kept
    if originals is None:
        originals = [t for step in job.template.regular_steps for t in plan_tasks(job, step)]
    have = {(r.step, r.task_key) for r in records}
    for spec in originals:
        if job.template.is_finally(spec.step_name) or (spec.step_name, spec.task_key) in have:
            continue
        kept.append(_done_in_completed_attempt(job, run, spec))
    return kept


def prepare_run_job(
    store: CheckpointStore,
    job_key: str | None,
    run_id: str,
    *,
    template: str | Path | None = None,
    parameters: Mapping[str, Any] | None = None,
    check_template: bool = True,
) -> PreparedJob:
    """Rebuild a run's job from its record alone (template path, job parameter values,
    environment templates, path mapping rules), reading the record once: in an adapter's
    worker process (``job_key`` known), or for an operator resume by run id (``job_key`` None:
    the run is looked for in every job, ``CheckpointStore.find_run``).

    Args:
        template: a template file to use instead of the recorded one (a run recorded without
            one needs it).
        parameters: job parameter values over the recorded ones (name -> value).
        check_template: refuse a template whose hash is not the run's (``chain-changed``).
            False when an attempt's resume check follows (``begin_attempt``: it names the
            changed steps, after the refusals that come first).

    Raises:
        ResumeRefusedError: ``unknown-run``: no such run (or it is being deleted);
            ``chain-changed``: the template changed since the run began (``check_template``).
        TemplateError: the run's record names no template and none is given, or the template
            or its parameters are no longer valid.
        StoreError: the store cannot be read.
    """
    run = store.find_run(run_id) if job_key is None else store.read_run(job_key, run_id)
    if run is None:
        raise ResumeRefusedError(RefusalCode.UNKNOWN_RUN, no_run_words(store, run_id, job_key))
    source = template or run.template_path
    if source is None:
        raise TemplateError([f"run {run_id} has no template path; pass its template"])
    job = prepare_job(
        source,
        {**run.parameters, **(parameters or {})},
        environments=[Path(e) for e in run.environments],
        path_mapping_rules=load_path_mapping_rules(run.path_mapping_rules),
    )
    if check_template and job.template.template_hash != run.template_hash:
        raise ResumeRefusedError(
            RefusalCode.CHAIN_CHANGED,
            f"the template {source} changed since run {run_id} began",
        )
    return job


def require_run(store: CheckpointStore, job: PreparedJob, run_id: str) -> RunRecord:
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
        records = attempt_records(store, job, require_run(store, job, run_id))
    return plan_tasks(job, step_name, [r for r in records if r.step == step_name])


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
    run = require_run(store, job, run_id)
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
    return plan_tasks(job, step, records, tasks=tasks)


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
        record = new_task_record(
            job,
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
