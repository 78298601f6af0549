"""What a person is shown of a task and its checkpoints, the same on every runner: the CLI's
``checkpoints show`` and ``checkpoints list``, the Airflow plugin's page and task state store
summary, and the Prefect flow run's table artifact all read these.

A summary never holds a checkpoint's state itself (it may hold anything) nor environment
values: only its size in bytes. Pure functions of stored records (``core._store``), no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._planning import task_label
from ._records import CheckpointData, TaskRecord

if TYPE_CHECKING:
    from ._job import TaskSpec

__all__ = (
    "describe_plan",
    "CheckpointSummary",
    "TaskSummary",
    "summarize_checkpoint",
    "summarize_task",
)


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
    host: str | None = None
    """The host id of the process that last ran the task (None: it never started one)."""

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
        host=rec.host,
    )


def describe_plan(
    originals: Sequence[TaskSpec], specs: Sequence[TaskSpec], *, again: bool = False
) -> list[str]:
    """What an attempt does with a group of a step's original tasks, one line per task for the
    log (every runner says the same): finished in an earlier try and not run again, resumed
    from which checkpoint generation (state size, files, the attempt that saved it, frames
    skipped), frames finished earlier skipped, or (``again``: a later try or attempt) run from
    the top for want of a checkpoint.

    Args:
        originals: the group's tasks as first planned (``PreparedJob.plan_step`` with no
            records). specs: what runs now (``plan_group``).
    """
    lines: list[str] = []
    base_keys = {s.task_key.split("#", 1)[0] for s in specs}
    for orig in originals:
        if orig.task_key not in base_keys:
            lines.append(f"{orig.label}: finished in an earlier try; not run again")
    by_key = {o.task_key: o for o in originals}
    for spec in specs:
        first = by_key.get(spec.task_key.split("#")[0])
        skipped = len(first.chunk_frames - spec.chunk_frames) if first else 0
        if spec.resume is not None:
            ck = spec.resume
            files = len(ck.files) + (1 if ck.file else 0)
            lines.append(
                f"{spec.label}: resuming from checkpoint generation {ck.generation} "
                f"({len((ck.state or '').encode())} bytes of state, {files} file(s)"
                f"{' kept by the store' if ck.manifest else ''}, saved by attempt {ck.attempt})"
                + (f"; {skipped} frame(s) skipped" if skipped else "")
            )
        elif skipped:
            lines.append(f"{spec.label}: {skipped} frame(s) finished earlier are skipped")
        elif again:
            lines.append(f"{spec.label}: no checkpoint stored; running from the top")
    return lines
