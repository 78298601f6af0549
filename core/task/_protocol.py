"""The stdout protocol applied to one task's output: each line read (``_messages.read_line``:
decoding, parsing, the context's rules, secrets masked), each well-formed message's effect on the
task (progress, status, failure message, environment changes) or on its record (handed to the
``TaskRecorder``), and the warnings about lines, capped.

``TaskOutput.handle`` runs on the reader thread of the action's process, one batch of whole lines
at a time; the pending checkpoint save of a batch (the latest of it) is committed at its end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core._messages import (
    CheckpointFiles,
    CheckpointSave,
    EnvSet,
    EnvUnset,
    Fail,
    MessageContext,
    MessageEvent,
    Progress,
    ResumeStatus,
    Status,
    TaskComplete,
    read_line,
)
from core.process import OutputLine
from core.task._events import TaskEventKind
from core.task._recorder import TaskRecorder

__all__ = ("TaskOutput",)


class TaskOutput:
    """What one task's output lines mean, over all its actions (a task's and its session's
    environments').

    Args:
        recorder: where the checkpoint messages and finished frames go.
        max_line_bytes / max_state_bytes: protocol caps in bytes.
        max_warnings: how many warnings about output lines are reported one by one; the rest
            are counted (``tell_dropped``).
        warn: reports a warning.
        emit: reports a ``TaskEvent`` kind and value.
        on_output: called with each batch of lines as they may be shown (secrets masked).
        working_dir: the session working directory now (None: not made yet).
    """

    def __init__(
        self,
        recorder: TaskRecorder,
        *,
        max_line_bytes: int,
        max_state_bytes: int,
        max_warnings: int,
        warn: Callable[[str], None],
        emit: Callable[[TaskEventKind, Any], None],
        on_output: Callable[[list[str]], None] | None,
        working_dir: Callable[[], str | None],
    ) -> None:
        self._recorder = recorder
        self._max_line = max_line_bytes
        self._max_state = max_state_bytes
        self._max_warnings = max_warnings
        self._warn = warn
        self._emit = emit
        self._on_output = on_output
        self._working_dir = working_dir
        self.secrets: set[str] = set()
        """Values declared secret so far (the session's set once the task runs in one)."""
        self.progress: float | None = None
        """Last ``openjd_progress`` (0..100), or None."""
        self.status: str | None = None
        """Last ``openjd_status`` text, or None."""
        self.fail_message: str | None = None
        """The running action's last ``openjd_fail`` text, or None."""
        self._line_warnings = 0
        """Warnings about output lines so far, kept or not."""
        self._told = 0
        """Of those over the cap, how many a summary warning has already counted."""

    def handle(
        self,
        lines: list[OutputLine],
        ctx: MessageContext,
        env_changes: dict[str, str | None] | None,
    ) -> None:
        """Apply one batch of an action's output lines. ``env_changes``: where an environment's
        ``onEnter`` collects its variable changes (None for any other action). The lines before
        a message are given to ``on_output`` before the message is applied, so that what it
        causes (a checkpoint stored, said by the CLI) is shown after them, as the task printed
        them.

        Raises:
            Exception: what ``on_output`` raised (the first of the batch), once every line of
                the batch has been applied: a failing consumer loses no message.
        """
        texts: list[str] = []
        failed: Exception | None = None
        secrets = self.secrets
        for line in lines:
            data = line.data
            if not (line.oversized or secrets or data.lstrip().startswith(b"openjd_")):
                try:  # ordinary output, most lines: what read_line gives it, without the call
                    texts.append(data.decode("utf-8"))
                    continue
                except UnicodeDecodeError:
                    pass
            reading = read_line(
                line.data,
                number=line.number,
                context=ctx,
                secrets=self.secrets,
                max_state_bytes=self._max_state,
                dropped_size=line.size if line.oversized else None,
                max_line_bytes=self._max_line,
            )
            if reading.warning is not None:
                self.warn_line(reading.warning)
            if reading.event is not None:
                if texts:  # shown before what the line does
                    failed = failed or self._show(texts)
                    texts = []
                self._apply(reading.event, line.number, env_changes)
            if reading.text is not None:
                texts.append(reading.text)
        self._recorder.flush()
        self._recorder.persist()
        if texts:
            failed = failed or self._show(texts)
        if failed is not None:  # every message of the batch was applied all the same
            raise failed

    def _show(self, texts: list[str]) -> Exception | None:
        """Give ``texts`` to ``on_output``; what it raised (a closed stdout), or None."""
        if self._on_output is None:
            return None
        try:
            self._on_output(texts)
        except Exception as exc:
            return exc
        return None

    def _apply(
        self, event: MessageEvent, number: int, env_changes: dict[str, str | None] | None
    ) -> None:
        """What a well-formed message means: to the task, or to its record (the recorder)."""
        refused: str | None = None
        if isinstance(event, Progress):
            self.progress = event.percent
            self._emit(TaskEventKind.PROGRESS, event.percent)
        elif isinstance(event, Status):
            self.status = event.message
            self._emit(TaskEventKind.STATUS, event.message)
        elif isinstance(event, Fail):
            self.fail_message = event.message
            self._emit(TaskEventKind.FAIL, event.message)
        elif isinstance(event, (EnvSet, EnvUnset)):
            if env_changes is None:
                refused = (
                    "environment variables can only be changed by an environment's onEnter; ignored"
                )
            else:
                env_changes[event.name] = event.value if isinstance(event, EnvSet) else None
        elif isinstance(event, CheckpointFiles):
            refused = self._recorder.declare_files(event, self._working_dir())
        elif isinstance(event, TaskComplete):
            self._recorder.frame_complete(event.frame)
            self._emit(TaskEventKind.FRAME_COMPLETE, event.frame)
        elif isinstance(event, CheckpointSave):
            refused = self._recorder.save(event, self._working_dir(), self.secrets)
        elif isinstance(event, ResumeStatus):
            self._recorder.resume_status(event.status.value)
            self._emit(TaskEventKind.RESUME_STATUS, event.status.value)
        if refused is not None:
            self.warn_line(f"output line {number}: {refused}")

    def warn_line(self, text: str) -> None:
        """A warning about one output line: kept and reported only up to the cap."""
        self._line_warnings += 1
        if self._line_warnings <= self._max_warnings:
            self._warn(text)

    def tell_dropped(self) -> None:
        """One warning counting the line warnings over the cap not yet counted (an action's end)."""
        over = self._line_warnings - self._max_warnings - self._told
        if over > 0:
            self._told += over
            self._warn(
                f"... and {over:,} more output line warning(s), not shown: only the first "
                f"{self._max_warnings:,} are kept"
            )
