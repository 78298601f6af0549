"""Resume safety: which earlier run a new attempt continues, and when it must refuse.

Implements Trax's Checkpoint page (seed 001, "Resuming" and "What can resume where") on OpenJD
jobs: a run resumes from an earlier run of the same job (same template name) and the same input
(job parameter values) that failed, was suspended or was cancelled, and that no other resume has
completed. Three ways, with Trax's meaning:

- ``RETRY`` (the default of ``run``, and what adapters do on a retry): after the latest
  checkpoint, else from the top; a refusal runs from the top and says why.
- ``REQUEUE`` (``run --fresh``): always from the top.
- ``OPERATOR`` (``resume RUN_ID [--from STEP] [--generation N]``): exactly where asked; a
  refusal is an error with its code and nothing runs.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from enum import Enum

from core._errors import RunError, StoreError
from core._host import host_id
from core._records import RunRecord, RunStatus, TaskRecord, TaskStatus
from core._words import command_words
from core.job import PreparedJob, plan_tasks
from core.process import ProcessIdentity
from core.store import (
    CheckpointStore,
    RunBeingDeleted,
    RunSetAside,
    being_deleted_words,
    describe_holder,
    is_job_key,
    is_run_id,
    task_warning_outcome,
)

__all__ = (
    "RefusalCode",
    "ResumeHow",
    "ResumePlan",
    "ResumeRefusedError",
    "check_chain",
    "check_input",
    "no_run_words",
    "set_aside_words",
    "plan_resume",
)


class ResumeHow(str, Enum):
    RETRY = "retry"
    """Resume after the latest checkpoint when allowed, else run from the top."""
    REQUEUE = "requeue"
    """Run from the top."""
    OPERATOR = "operator"
    """Resume exactly where asked, or refuse."""


class RefusalCode(str, Enum):
    UNKNOWN_RUN = "unknown-run"
    """No run with that id."""
    NOT_FAILED = "not-failed"
    """The run succeeded and was never resumed: there is nothing to carry on."""
    ALREADY_RESUMED = "already-resumed"
    """Another process is resuming it now, or a resume of it already completed."""
    DIFFERENT_INPUT = "different-input"
    """The job parameter values differ from the run's."""
    NO_CHECKPOINT = "no-checkpoint"
    """The run stored nothing to resume from (at the point asked for)."""
    CHAIN_CHANGED = "chain-changed"
    """The template (or a step's script) changed since the run's checkpoints."""
    STATE_CHANGED = "state-changed"
    """The stored records' schema version is not the one this version reads."""


class ResumeRefusedError(RunError):
    """A resume was refused. ``code`` is a ``RefusalCode``; the message names what differs."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        self.code = code
        super().__init__(f"resume refused ({code.value}): {message}")


@dataclass
class ResumePlan:
    """What a new attempt continues.

    Attributes:
        run: the run to continue, or None to start a new run from the top.
        records: the task records it resumes from (after ``from_step``/``generation``).
        notes: why a retry runs from the top, and what was found, for a person.
        refusal: the refusal a retry fell back from, if any.
        superseded: see below.
    """

    run: RunRecord | None
    records: list[TaskRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refusal: ResumeRefusedError | None = None
    superseded: list[RunRecord] = field(default_factory=list)
    """Earlier runs the new run replaces: retries stop picking them (their checkpoints stay
    until ``gc``, and an operator resume can still take them)."""


def no_run_words(store: CheckpointStore, run_id: str, job_key: str | None = None) -> str:
    """Why the store has no run ``run_id`` (of the job ``job_key``; else of any job), for a
    refusal: it is being deleted (or its delete was interrupted), or there is none.

    Raises:
        StoreError: the store cannot be read.
    """
    keys = [job_key] if job_key else store.fs.list_names(store.layout.jobs_dir)
    for key in keys:
        if is_job_key(key) and store.removal.being_deleted(key, run_id):
            return f"{being_deleted_words(run_id)}; it can no longer be resumed"
    for key in keys:  # a run whose record was set aside: there, but no longer readable
        if not is_job_key(key) or not is_run_id(run_id):
            continue
        try:
            kept = store.removal.kept_records(key, run_id)
        except StoreError:  # its folder is a link, or cannot be listed: no run to name
            continue
        if kept:
            return set_aside_words(store, key, run_id, kept[-1])
    where = " of this job" if job_key else ""
    return f"no run {run_id!r}{where} in {store.location}"


def set_aside_words(store: CheckpointStore, job_key: str, run_id: str, kept: str) -> str:
    """What is said of a run whose ``run.json`` was set aside as unreadable, kept as ``kept``
    (``RunRemoval.kept_records``): it is not listed, read or resumed, and the command that
    deletes it (``checkpoints delete``, docs/decisions.md "Deleting a run")."""
    path = posixpath.join(store.layout.run_dir(job_key, run_id), kept)
    command = command_words("checkpoints", "delete", run_id, "--store", store.location)
    return (
        f"run {run_id}: its run record was unreadable and is kept as {path}; the run is not "
        f"listed, read or resumed; '{command}' deletes it with its checkpoints"
    )


def _owner_alive(run: RunRecord) -> bool:
    if run.runner is None or run.runner.host != host_id():
        return False
    ident = ProcessIdentity(run.runner.pid, run.runner.pgid, run.runner.start_time)
    return ident.is_alive()


def check_input(job: PreparedJob, run: RunRecord) -> None:
    """Refuse ``different-input`` when ``job``'s environment templates, path mapping rules or
    job parameter values are not ``run``'s (docs/decisions.md, "Resuming")."""
    rules = [r.to_dict() for r in job.path_mapping_rules]
    if run.environments != job.environment_paths or run.path_mapping_rules != rules:
        raise ResumeRefusedError(
            RefusalCode.DIFFERENT_INPUT,
            f"the environment templates or path mapping rules differ from run {run.run_id}'s "
            f"(it ran with environments {run.environments or 'none'} and "
            f"{len(run.path_mapping_rules)} path mapping rule(s))",
        )
    if run.parameters != job.parameters:
        diff = sorted(
            k
            for k in set(run.parameters) | set(job.parameters)
            if run.parameters.get(k) != job.parameters.get(k)
        )
        raise ResumeRefusedError(
            RefusalCode.DIFFERENT_INPUT,
            f"job parameter(s) {', '.join(diff)} differ from run {run.run_id}'s",
        )


def check_chain(job: PreparedJob, run: RunRecord) -> None:
    """Refuse ``chain-changed`` when ``job``'s template is not the one ``run`` began with; the
    message names the steps whose hash changed."""
    if run.template_hash != job.template.template_hash:
        changed = sorted(
            name
            for name in set(run.step_hashes) | set(job.template.step_hashes)
            if run.step_hashes.get(name) != job.template.step_hashes.get(name)
        )
        what = f"step(s) {', '.join(changed)} changed" if changed else "the template changed"
        raise ResumeRefusedError(
            RefusalCode.CHAIN_CHANGED, f"{what} since run {run.run_id}'s checkpoints"
        )


def check_run(
    store: CheckpointStore,
    job: PreparedJob,
    run: RunRecord,
    *,
    from_step: str | None = None,
    generation: int | None = None,
    notes: list[str] | None = None,
) -> list[TaskRecord]:
    """Check that ``job`` may resume ``run``; return the task records to resume from when
    ``from_step`` or ``generation`` chooses them (else none: the attempt plans with the
    store's, and the check keeps none of them, so a run of any size is checked in memory that
    does not grow with its task count).

    Raises:
        ResumeRefusedError: with the code of the first rule that fails.
    """
    if run.status == RunStatus.SUCCEEDED:
        if run.attempt > 1:
            raise ResumeRefusedError(
                RefusalCode.ALREADY_RESUMED,
                f"run {run.run_id} was already resumed and completed (attempt {run.attempt})",
            )
        raise ResumeRefusedError(
            RefusalCode.NOT_FAILED, f"run {run.run_id} succeeded; there is nothing to resume"
        )
    check_input(job, run)
    if store.lease_held(run) or (run.status == RunStatus.RUNNING and _owner_alive(run)):
        owner = describe_holder(store, run.runner)
        raise ResumeRefusedError(
            RefusalCode.ALREADY_RESUMED, f"run {run.run_id} is being run now{owner}"
        )
    check_chain(job, run)
    choose = from_step is not None or generation is not None
    records: list[TaskRecord] = []  # kept only when they are chosen from
    warnings: list[str] = []
    useful = False
    try:
        for r in store.iter_tasks(run.job_key, run.run_id, warnings):
            if choose:
                records.append(r)
            useful = useful or (
                not job.template.is_finally(r.step)  # finally steps run again on every attempt
                and bool(r.checkpoint or r.completed_frames or r.status.value == "succeeded")
            )
    except StoreError as exc:
        raise ResumeRefusedError(RefusalCode.STATE_CHANGED, str(exc)) from None
    versioned = [w for w in warnings if "schema version" in w]
    if versioned:
        raise ResumeRefusedError(RefusalCode.STATE_CHANGED, versioned[0])
    for w in warnings:
        # an unreadable record was moved aside (kept); its task resumes from its newest
        # readable checkpoint generation (TaskRebuilt), or else runs from the top
        if notes is not None:
            rest = task_warning_outcome(w)
            notes.append(f"warning: {w}{rest}")
    if not useful:
        raise ResumeRefusedError(
            RefusalCode.NO_CHECKPOINT, f"run {run.run_id} stored no checkpoint and no finished task"
        )
    order = job.template.regular_steps + job.template.finally_steps
    if from_step is not None:
        if from_step not in order:
            raise ResumeRefusedError(
                RefusalCode.NO_CHECKPOINT, f"the job has no step {from_step!r}"
            )
        start = order.index(from_step)
        before = set(order[:start])
        for name in order[:start]:
            if job.template.is_finally(name):
                continue
            planned = plan_tasks(job, name, [r for r in records if r.step == name])
            if planned:
                raise ResumeRefusedError(
                    RefusalCode.NO_CHECKPOINT,
                    f"step {name!r}, before {from_step!r}, did not finish in run {run.run_id}",
                )
        again = set(order[start:])
        kept: list[TaskRecord] = []
        for r in records:
            if r.step in before:
                kept.append(r)
            elif r.step in again and r.checkpoint is not None:
                # runs again: from its checkpoint where it has one, finished or not
                kept.append(r.model_copy(update={"status": TaskStatus.INTERRUPTED}))
        records = kept
    if generation is not None:
        chosen: list[TaskRecord] = []
        found = False
        for r in records:
            if r.checkpoint is None:
                chosen.append(r)
                continue
            gens = {g.generation: g for g in store.list_generations(r)}
            if generation in gens:
                found = True
                chosen.append(r.model_copy(update={"checkpoint": gens[generation]}))
            else:
                chosen.append(r)
        if not found:
            raise ResumeRefusedError(
                RefusalCode.NO_CHECKPOINT,
                f"no task of run {run.run_id} has checkpoint generation {generation}",
            )
        records = chosen
    return records


def plan_resume(
    store: CheckpointStore,
    job: PreparedJob,
    how: ResumeHow,
    *,
    run_id: str | None = None,
    from_step: str | None = None,
    generation: int | None = None,
    scheduled: bool = False,
    listed: tuple[list[RunRecord], list[str]] | None = None,
) -> ResumePlan:
    """Decide what a new attempt of ``job`` continues.

    Without ``scheduled`` (the CLI), runs that a scheduler made (with an external run key) are
    neither retried nor superseded: they are the scheduler's to continue; an operator resume
    can still name one.

    ``listed``: the job's runs and warnings as ``CheckpointStore.list_runs`` gave them under
    the job's lock (``begin_attempt``, which said the ``RunSetAside`` ones); else read here.

    Raises:
        ResumeRefusedError: for ``OPERATOR`` on any refusal; for ``RETRY`` only when another process
            is running the same run now (running it from the top too would run the job twice).
    """
    if how == ResumeHow.OPERATOR:
        if run_id is None:
            raise RunError("an operator resume needs a run id")
        run = store.find_run(run_id, among=listed[0] if listed else ())
        if run is None or run.job_key != job.job_key:
            raise ResumeRefusedError(
                RefusalCode.UNKNOWN_RUN, no_run_words(store, run_id, job.job_key)
            )
        op_notes: list[str] = []
        records = check_run(
            store, job, run, from_step=from_step, generation=generation, notes=op_notes
        )
        return ResumePlan(run, records, [*op_notes, f"resuming run {run.run_id} as asked"])
    if listed is None:
        runs, warnings = store.list_runs(job.job_key)
    else:
        runs = listed[0]
        warnings = [w for w in listed[1] if not isinstance(w, RunSetAside)]
    if how == ResumeHow.REQUEUE:
        earlier = [
            r
            for r in runs
            if r.status != RunStatus.SUCCEEDED
            and not r.superseded_by
            and r.parameters == job.parameters
            and (scheduled or r.external_key is None)
        ]
        return ResumePlan(None, notes=["requeue: running from the top"], superseded=earlier)

    notes = [
        f"{w}: a retry does not continue it" if isinstance(w, RunBeingDeleted) else f"warning: {w}"
        for w in warnings
    ]
    candidates = [
        r
        for r in reversed(runs)
        if r.status != RunStatus.SUCCEEDED
        and not r.superseded_by
        and (scheduled or r.external_key is None)
    ]
    same_input = [r for r in candidates if r.parameters == job.parameters]
    if not candidates:
        return ResumePlan(None, notes=notes)
    run = same_input[0] if same_input else candidates[0]
    try:
        records = check_run(store, job, run, notes=notes)
    except ResumeRefusedError as refusal:
        if refusal.code == RefusalCode.ALREADY_RESUMED:
            raise
        notes.append(f"not resuming run {run.run_id}: {refusal}; running from the top")
        superseded = [run] if refusal.code != RefusalCode.DIFFERENT_INPUT else []
        return ResumePlan(None, notes=notes, refusal=refusal, superseded=superseded)
    notes.append(f"resuming run {run.run_id} (attempt {run.attempt + 1})")
    return ResumePlan(run, records, notes)
