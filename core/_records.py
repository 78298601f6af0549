"""The records of the checkpoint store: runs, tasks, checkpoint generations, sessions, stop
requests (pydantic models, each file one JSON document). ``core.store._store`` reads and writes
them; this module holds only their schema.

A record with another ``schema_version`` is not resumed from; a field added later has a
default, so records written before it still read (``tests/data/store_v1``).
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = (
    "RUN_SCHEMA_VERSION",
    "RUN_SCHEMA_VERSIONS",
    "SCHEMA_VERSION",
    "AttemptSpan",
    "CheckpointData",
    "CheckpointsKept",
    "GenerationFile",
    "InterruptionCause",
    "KeptCheckpoint",
    "KeptTask",
    "ProcessInfo",
    "RunCondition",
    "RunPhase",
    "RunRecord",
    "RunStatus",
    "SessionRecord",
    "StopRequest",
    "TaskIdentity",
    "TaskRecord",
    "TaskStatus",
)

SCHEMA_VERSION = 1
"""Version of the record schema. A record with another version is not resumed from."""

RUN_SCHEMA_VERSION = 2
"""Version of a new run's record. Version 2 (issue 38): on a local store its tasks' leases
are slots of one lock file (``core.fs._local.FlockLeases.member``), not a lock file each;
a version 1 run keeps its lock files, and an openjd-checkpoint that reads only version 1
refuses a version 2 run instead of taking its tasks' leases another way."""

RUN_SCHEMA_VERSIONS = (SCHEMA_VERSION, RUN_SCHEMA_VERSION)
"""The run record versions this openjd-checkpoint reads."""


class RunStatus(str, Enum):
    RUNNING = "running"
    """A runner is working on it (or died without a word: see ``RunRecord.runner``)."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    """Suspended: stopped to be resumed later (checkpointCancelation)."""
    CANCELED = "canceled"
    """Ended by Cancelled or CancelledRunFinally."""
    STOPPED = "stopped"
    """Ended by StoppedRunFinally."""


class RunPhase(str, Enum):
    """Where a run's attempt is (``RunRecord.phase``, and ``StopRequest.phase``: where it was
    when a request was accepted). The stored values are the enum's values."""

    REGULAR = "regular"
    """Its regular steps run."""
    FINALLY = "finally"
    """Its finally steps run (FINALLY extension, TEP-0058)."""
    ENDED = "ended"
    """The attempt has ended (``finish_attempt``)."""


class InterruptionCause(str, Enum):
    """What stopped a task attempt before its end (``AttemptSpan.cause``)."""

    NOTICE = "notice"
    """An interruption notice (a spot reclaim, a maintenance event): ``core.run.Notice``."""
    STOP = "stop"
    """A stop request: the run's termination request, the framework's kill or cancel."""
    TIMEOUT = "timeout"
    """A time budget ran out (the step's or the run's, or the framework's timeout)."""
    WORKER_LOST = "worker_lost"
    """The process running it died without an end (a lost host or worker)."""


class TaskStatus(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    CANCELED = "canceled"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProcessInfo(_Model):
    """A process that works on a run or task, to find (and stop) it again later.

    ``pid`` 0 (and ``start_time`` 0): the task's action is about to start; only its ``marker``
    is known yet, which is enough to find its processes (``kill_recorded_process``)."""

    pid: int
    pgid: int
    start_time: float
    """Seconds since the epoch."""
    host: str
    marker: str | None = None
    """The value of ``OPENJD_CHECKPOINT_SESSION`` in the task's environment: every process of
    the task inherits it, so the task's processes are found even after they left its group."""


class CheckpointData(_Model):
    """One committed checkpoint (``openjd_checkpoint_save`` plus the file dataset so far)."""

    generation: int
    state: str | None = None
    file: str | None = None
    files: list[str] = Field(default_factory=list)
    dirs: list[str] = Field(default_factory=list)
    saved_at: float
    """Seconds since the epoch."""
    attempt: int
    manifest: str | None = None
    """Managed file data flow: the SHA-256 of the manifest of this generation's files in the
    store (``core.files._blobs``); None in shared mode, where ``file``/``files``/``dirs`` are paths
    on a
    shared file system."""
    file_bytes: int | None = None
    """Managed file data flow: bytes of this generation's files in the store (the manifest's
    file sizes, summed); None in shared mode, and in generations stored by earlier versions."""
    commit_seconds: float | None = None
    """How long the commit took, in seconds: from the ``openjd_checkpoint_save`` line read to
    the generation durably stored (files uploaded, record written); None in generations stored
    by earlier versions. The commit latency of ``core.run.METRICS``."""


class TaskIdentity(_Model):
    """Which task a checkpoint generation file belongs to, and what its record held when the
    generation was committed: enough to rebuild the task's record from its newest readable
    generation when the record itself is damaged (``CheckpointStore.read_task``)."""

    step: str
    task_key: str
    parameters: dict[str, dict[str, str]]
    chunk_parameter: str | None = None
    completed_frames: list[int] = Field(default_factory=list)
    step_hash: str = ""


class GenerationFile(CheckpointData):
    """A checkpoint generation file (``<task_id>.gen-<N>.json``): the checkpoint and, since
    this release, the identity of its task (None in files written before)."""

    task: TaskIdentity | None = None


class AttemptSpan(_Model):
    """One attempt of a task, for its timeline: when it ran, where, what it resumed from and
    how it ended (``core.task._history``)."""

    attempt: int
    """The task's attempt number (``TaskRecord.attempt`` when it started)."""
    run_attempt: int = 0
    started_at: float
    """Seconds since the epoch."""
    ended_at: float | None = None
    """Seconds since the epoch; None while it runs (or if its process died)."""
    host: str | None = None
    resumed_from: int | None = None
    """The checkpoint generation it resumed from; None: it ran from the top."""
    resumed_saved_at: float | None = None
    """When that checkpoint was saved (seconds since the epoch): the work before it was kept."""
    outcome: str | None = None
    """The task's status when it ended (``TaskStatus`` value); None while it runs."""
    cause: InterruptionCause | None = None
    """What asked it to stop (None: nothing did)."""
    stopped_at: float | None = None
    """When the first stop request reached it (seconds since the epoch); None: none did."""
    stored_after_stop_at: float | None = None
    """When the first checkpoint stored after that request was (seconds since the epoch)."""
    saved_at: float | None = None
    """When the last checkpoint of this attempt was stored (seconds since the epoch); None:
    none was."""
    commits: int = 0
    """Checkpoint generations this attempt stored."""
    commit_seconds: float = 0.0
    """Their commit durations, summed (seconds; ``CheckpointData.commit_seconds``)."""
    commit_seconds_max: float = 0.0
    """The longest of them (seconds)."""
    stored_bytes: int = 0
    """Their sizes, summed: state (UTF-8) plus managed files (bytes)."""
    resume_status: str | None = None
    """What its ``onCheckpointResume`` said: RESUMED or DISCARDED (None: it did not say, or it
    ran ``onRun``)."""


class KeptCheckpoint(_Model):
    """A checkpoint generation as ``CheckpointsKept`` remembers it: never its state, only its
    size."""

    generation: int
    saved_at: float
    """Seconds since the epoch."""
    attempt: int
    """The run's attempt that saved it."""
    state_bytes: int
    files: int
    """Paths it named: files, folders and the checkpoint file."""


class KeptTask(_Model):
    """One task of a succeeded run as ``CheckpointsKept`` remembers it: enough for its timeline
    (``core.kept_timeline``)."""

    step: str
    label: str
    attempts: int
    frames_done: int
    """How many frames of its chunk were reported finished."""
    resume_status: str | None = None
    host: str | None = None
    history: list[AttemptSpan] = Field(default_factory=list)
    checkpoints: list[KeptCheckpoint] = Field(default_factory=list)


class CheckpointsKept(_Model):
    """What a run that succeeded kept until its end, written into its run record just before
    its task records and checkpoints are deleted (``finish_attempt``), so that a page can still
    say what the checkpoints did. Totals count every task; ``tasks`` details at most
    ``core.job._summary.MAX_KEPT_TASKS`` of them (those with a checkpoint or more than one attempt
    first), ``left_out`` counts the others."""

    at: float
    """When the checkpoints were deleted (seconds since the epoch)."""
    task_count: int = 0
    tasks_with_checkpoints: int = 0
    generations: int = 0
    """Checkpoint generations stored over the run (the latest generation numbers, summed)."""
    state_bytes: int = 0
    """Bytes of state of each task's latest checkpoint, summed."""
    files: int = 0
    """Paths named by each task's latest checkpoint, summed."""
    interruptions: int = 0
    """Task attempts that ended interrupted (suspended or cut off) and were run again."""
    resumes: int = 0
    """Task attempts that resumed from a checkpoint."""
    saved_seconds: float = 0.0
    """Seconds of work the resumes did not do again, over every task."""
    figures: dict[str, Any] | None = None
    """The run's checkpoint metrics (``core._figures.RunFigures.as_json``); None in runs kept
    by earlier versions."""
    tasks: list[KeptTask] = Field(default_factory=list)
    left_out: int = 0


class TaskRecord(_Model):
    """What the store knows of one task of a run.

    ``parameters`` are the task's original parameter values (name -> {"type", "value"}); a chunk
    resumed with fewer frames keeps its original record. ``completed_frames`` are the frames of a
    CHUNK[INT] parameter reported by ``openjd_task_complete`` (all frames once the task succeeds).
    """

    schema_version: int = SCHEMA_VERSION
    job_key: str
    run_id: str
    step: str
    task_key: str
    parameters: dict[str, dict[str, str]]
    status: TaskStatus = TaskStatus.PENDING
    attempt: int = 0
    run_attempt: int = 0
    """The run's attempt that last ran this task (finally tasks count only in their attempt)."""
    chunk_parameter: str | None = None
    completed_frames: list[int] = Field(default_factory=list)
    checkpoint: CheckpointData | None = None
    pending_files: list[str] = Field(default_factory=list)
    pending_dirs: list[str] = Field(default_factory=list)
    resume_status: str | None = None
    """RESUMED, DISCARDED, or UNKNOWN when the resume action never said."""
    process: ProcessInfo | None = None
    host: str | None = None
    """The host id (``$OPENJD_CHECKPOINT_HOST_ID``) of the process that last ran the task, kept
    after it ended (``process`` is cleared then): which machine of a farm ran it."""
    history: list[AttemptSpan] = Field(default_factory=list)
    """Its latest attempts, oldest first (at most ``core.task._history.MAX_SPANS``)."""
    step_hash: str = ""
    message: str | None = None
    updated_at: float = Field(default_factory=time.time)


class SessionRecord(_Model):
    """An open session of a run: which host and process run it, and the markers of the
    environments it entered, so that the next attempt can kill what the session left if its
    process died (its lease is then free)."""

    schema_version: int = SCHEMA_VERSION
    job_key: str
    run_id: str
    session_id: str
    host: str
    pid: int
    markers: list[str] = Field(default_factory=list)
    updated_at: float = Field(default_factory=time.time)


class RunCondition(_Model):
    """The run's ``Succeeded`` condition, as Tekton reports a PipelineRun's (seed 002).

    ``status`` is ``"True"``, ``"False"`` or ``"Unknown"``; ``reason`` is ``Running``,
    ``Stopping``, ``Succeeded``, ``Failed``, ``Timeout``, or the termination mode that ended the
    run (``Cancelled``, ``CancelledRunFinally``, ``StoppedRunFinally``, ``Suspended``).
    """

    status: str = "Unknown"
    reason: str = "Running"
    message: str = ""


class StopRequest(_Model):
    """A request, through the store, to end a run in a termination mode.

    Requests are append-only files (``requests/<time>-<id>.json``), never replaced, so two
    processes asking at once both count; ``_run.resolve_termination`` folds them by precedence.
    """

    mode: str
    requested_at: float = Field(default_factory=time.time)
    requested_by: ProcessInfo | None = None
    attempt: int = 0
    """The run attempt it was accepted for; requests of earlier attempts are history."""
    phase: RunPhase = RunPhase.REGULAR
    """The run's phase when it was accepted (``regular`` or ``finally``)."""
    force: bool = False
    """Kill running tasks without notifying them."""
    deadline: float | None = None
    """Seconds since the epoch by which running tasks must be gone (notify periods shorten)."""


class RunRecord(_Model):
    """One run of a job (a template with job parameter values), across its attempts.
    ``schema_version``: ``RUN_SCHEMA_VERSION`` for a new run, kept as read for an older one."""

    schema_version: int = RUN_SCHEMA_VERSION
    job_key: str
    run_id: str
    job_name: str
    template_path: str | None = None
    template_hash: str
    step_hashes: dict[str, str] = Field(default_factory=dict)
    parameters: dict[str, str] = Field(default_factory=dict)
    status: RunStatus = RunStatus.RUNNING
    attempt: int = 1
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    runner: ProcessInfo | None = None
    message: str | None = None
    condition: RunCondition = Field(default_factory=RunCondition)
    termination: str | None = None
    """The termination mode asked for, if any."""
    skipped_tasks: list[str] = Field(default_factory=list)
    finally_steps: list[str] = Field(default_factory=list)
    environments: list[str] = Field(default_factory=list)
    """External environment template files the run was started with."""
    path_mapping_rules: list[dict[str, Any]] = Field(default_factory=list)
    external_key: str | None = None
    """A scheduler's own identity for this run (an Airflow ``dag_id/run_id``, a Prefect flow
    run id): the framework's retry or clear of that run finds this core run again."""
    attempt_key: str | None = None
    """The external key of the scheduler run that began the latest attempt (an operator resume
    from another DAG run or flow run takes the run over); None: a process without one (the
    CLI), or a record made before this field (then ``external_key``)."""
    completed_attempt: int | None = None
    """The attempt in which the run last succeeded, when a scheduler's re-run of part of it
    continued it afterwards: its task records were deleted with its checkpoints, so every
    regular task with no record counts as having succeeded in that attempt."""
    phase: RunPhase = RunPhase.REGULAR
    """``regular`` (regular steps), ``finally`` (finally steps) or ``ended``."""
    job_status: str | None = None
    """The ``{{Job.Status}}`` the finally steps of this attempt get, once decided."""
    timed_out: str | None = None
    """Set when the run's own time budget expired: the message."""
    files_mode: str | None = None
    """How the run keeps checkpoint files, ``shared`` or ``managed``, fixed when the run is
    created: every later attempt (a retry, a resume, a framework's retry on any host) keeps it,
    whatever its own configuration says. None (runs made before this field): the store's."""
    notices: list[dict[str, Any]] = Field(default_factory=list)
    """Interruption notices that stopped an attempt of the run (``core.run._notices``): each with
    ``source``, ``kind``, ``detail``, ``deadline`` and ``received_at`` (seconds since the
    epoch), ``attempt``, and, once the tasks have stopped, ``stopped_after`` (seconds)."""
    environment_failures: list[dict[str, Any]] = Field(default_factory=list)
    """Environments whose ``onExit`` (or wrapping ``onWrapEnvExit``) failed when a session
    closed (``record_environment_failure``): each with ``attempt`` and ``message``. An attempt
    with one ends Failed, as ``openjd run`` ends a session whose environment exit failed.
    One with ``stopped`` (true) was killed by a stop (forced, or at its deadline), not failed:
    the attempt ends in the stop's mode."""
    superseded_by: str | None = None
    """A later run of the same job that started from the top instead of resuming this one
    (a requeue, or a retry that was refused): retries no longer pick this run; an operator
    resume still can."""
    kept: CheckpointsKept | None = None
    """Set when the run succeeded: what its checkpoints were until they were deleted."""
    deleting: ProcessInfo | None = None
    """The process deleting the run (``checkpoints delete``, ``gc``), set just before it removes
    the run's files on a store whose folders cannot be renamed (S3; a local store renames the
    run's folder instead): from then on every reader takes the run as gone, and ``gc`` finishes
    a delete whose process no longer holds the run's lease. None (and in records made before
    this field): not being deleted."""
