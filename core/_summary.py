"""What a person is shown of a task and its checkpoints, the same on every runner: the CLI's
``checkpoints show`` and ``checkpoints list``, the Airflow plugin's page and task state store
summary, and the Prefect flow run's table artifact all read these.

A summary never holds a checkpoint's state itself (it may hold anything) nor environment
values: only its size in bytes. Pure functions of stored records (``core._store``), no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._records import CheckpointData, TaskRecord

__all__ = (
    "CheckpointSummary",
    "TaskSummary",
    "summarize_checkpoint",
    "summarize_task",
    "task_label",
)


def task_label(rec: TaskRecord) -> str:
    """A task's readable name, as the run printed it: ``Render[Frame=1-4]``, or the step name
    for a step's lone task."""
    if not rec.parameters:
        return rec.step
    inner = ", ".join(f"{k}={v.get('value', '')}" for k, v in rec.parameters.items())
    return f"{rec.step}[{inner}]"


@dataclass(frozen=True)
class CheckpointSummary:
    """One committed checkpoint generation, as shown."""

    generation: int
    saved_at: float
    """Seconds since the epoch."""
    attempt: int
    state_bytes: int
    """Size of the saved state in bytes (UTF-8); 0 when the save had none."""
    files: tuple[str, ...]
    """The named files: the file dataset's files, then the saved checkpoint file if any."""
    dirs: tuple[str, ...]
    files_mode: str
    """``managed`` when the store keeps the files, ``shared`` when only their paths."""

    @property
    def named(self) -> int:
        """How many paths the checkpoint names: files, folders and the checkpoint file."""
        return len(self.files) + len(self.dirs)


@dataclass(frozen=True)
class TaskSummary:
    """One task's record, as shown."""

    step: str
    label: str
    status: str
    """The stored status (``TaskStatus`` value: ``interrupted`` for a suspended task)."""
    attempts: int
    frames_done: tuple[int, ...]
    """Finished frames of the chunk (``openjd_task_complete``), as recorded."""
    resume_status: str | None
    message: str | None
    updated_at: float
    checkpoint: CheckpointSummary | None
    """The latest committed checkpoint, or None."""

    @property
    def resumable(self) -> bool:
        """It holds something a resume uses: a checkpoint, or finished frames of an unfinished
        chunk (what ``checkpoints list`` lists, and ``runs`` counts as resumable)."""
        return self.checkpoint is not None or (
            bool(self.frames_done) and self.status != "succeeded"
        )


def summarize_checkpoint(ck: CheckpointData) -> CheckpointSummary:
    """The summary of one checkpoint generation (a record's latest or a stored one)."""
    return CheckpointSummary(
        generation=ck.generation,
        saved_at=ck.saved_at,
        attempt=ck.attempt,
        state_bytes=len((ck.state or "").encode()),
        files=(*ck.files, *([ck.file] if ck.file else [])),
        dirs=tuple(ck.dirs),
        files_mode="managed" if ck.manifest else "shared",
    )


def summarize_task(rec: TaskRecord) -> TaskSummary:
    """The summary of one task record."""
    return TaskSummary(
        step=rec.step,
        label=task_label(rec),
        status=rec.status.value,
        attempts=rec.attempt,
        frames_done=tuple(rec.completed_frames),
        resume_status=rec.resume_status,
        message=rec.message,
        updated_at=rec.updated_at,
        checkpoint=summarize_checkpoint(rec.checkpoint) if rec.checkpoint is not None else None,
    )
