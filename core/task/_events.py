"""What a running task reports to its runner's callbacks (``on_event``): ``TaskEvent``, of a
``TaskEventKind``. Below every module of ``core.task`` that reports one."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from core._records import CheckpointData, TaskRecord

__all__ = ("TaskEvent", "TaskEventKind")


class TaskEventKind(str, Enum):
    """The kinds of ``TaskEvent``; each member equals its value (``"checkpoint_saved"``)."""

    STARTED = "started"
    """The attempt began; value: the checkpoint generation it resumes from (None: the top)."""
    PROGRESS = "progress"
    """``openjd_progress``; value: the percentage (float)."""
    STATUS = "status"
    """``openjd_status``, or what the runner says of the task (a restore); value: the text."""
    FAIL = "fail"
    """``openjd_fail``; value: the message."""
    CHECKPOINT_SAVED = "checkpoint_saved"
    """A checkpoint generation was stored; value: its number (int)."""
    FRAME_COMPLETE = "frame_complete"
    """A frame of a chunk finished; value: the frame (int)."""
    RESUME_STATUS = "resume_status"
    """How the task said it resumed; value: ``RESUMED``, ``RESTARTED`` or ``UNKNOWN``."""
    WARNING = "warning"
    """Something a person should know (a refused message, a file not restored); value: text."""
    ACTION_STARTED = "action_started"
    """An action's process started; value: the path of the command."""
    ACTION_ENDED = "action_ended"
    """An action's process ended; value: its exit code."""
    ENDED = "ended"
    """The attempt's outcome is decided and its end stored (or found not storable: the result
    says so); value: the ``TaskResult``. The session's next task may already be running."""


@dataclass(frozen=True)
class TaskEvent:
    """Something a running task reported, for progress displays and adapters.

    Attributes:
        kind: a ``TaskEventKind`` (its member docstrings say what ``value`` holds).
        value: the percentage (float), the message (str), the generation (int) or frame (int);
            for ``STARTED`` the checkpoint generation it resumes from (None: from the top), for
            ``ENDED`` the ``TaskResult``.
        time: seconds since the epoch.
        checkpoint: for ``CHECKPOINT_SAVED``, the generation stored (its ``commit_seconds``
            measured to its durable write).
        record: for ``STARTED``, the task's record as the attempt starts (not a copy: read it
            in the callback, never change or keep it).
    """

    kind: TaskEventKind
    value: Any
    time: float = field(default_factory=time.time)
    checkpoint: CheckpointData | None = None
    record: TaskRecord | None = None
