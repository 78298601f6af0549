"""Plain words for the CLI and the adapters: how a process ended, how a task ended, what a
run's outcome means for the user.

Kept apart from the CLI (``core.cli``) so that the progress display, the reports, the reading
commands and the Airflow and Prefect adapters say things the same way.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
from collections.abc import Iterable
from typing import Any

__all__ = (
    "command_words",
    "event_log_line",
    "OUTCOME_WORDS",
    "describe_exit",
    "kept_words",
    "outcome_key",
    "outcome_sentence",
    "program_words",
    "result_words",
    "run_status_words",
    "suspended_words",
    "task_status_words",
)


def program_words() -> list[str]:
    """How a person starts this program, as the first words of a command printed back to them:
    the path the ``openjd-checkpoint`` command was started as (``.venv/bin/openjd-checkpoint``
    when it is not on the PATH), ``python -m core.cli``, or, in any other process (an Airflow
    or Prefect worker), ``openjd-checkpoint``."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0.endswith(os.path.join("core", "cli", "__main__.py")):  # no script on the PATH
        return [sys.executable, "-m", "core.cli"]
    return [argv0 if os.path.basename(argv0) == "openjd-checkpoint" else "openjd-checkpoint"]


def command_words(*args: str) -> str:
    """A command of this program for a person to paste: ``program_words`` then ``args``,
    quoted for a POSIX shell (``shlex.join``)."""
    return shlex.join([*program_words(), *args])


def describe_exit(code: int | None) -> str:
    """How a task's process ended, for a person: ``"exited with code: 3"``, ``"killed by SIGKILL
    (exit code -9)"`` (a negative code is the signal that ended it), or ``""`` when it never
    ran. The code keeps the form other OpenJD CLIs print (``exited with code: N``, the line the
    conformance data reads for ``taskFailure.exitCode``), which scripts and tests look for.
    Every action's exit is worded here: a task action's in the CLI's report, an environment
    action's (``onEnter``, ``onWrapEnvEnter``, ``onExit``...) in its failure message."""
    if code is None:
        return ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exited with code: {code}"


OUTCOME_WORDS = {
    "succeeded": "succeeded",
    "failed": "failed",
    "interrupted_with_checkpoint": "suspended with a checkpoint",
    "interrupted_with_frames": "suspended with finished frames kept",
    "interrupted": "suspended",
    "canceled": "canceled",
    "not_stored": "not stored",
}
"""A task execution's outcome (``TaskOutcome`` value, or ``outcome_key``'s) in the words the
CLI uses."""


def outcome_key(result: Any) -> str:
    """A ``TaskResult``'s outcome as a key of ``OUTCOME_WORDS``: a task suspended with only
    the finished frames of its chunk kept (no checkpoint) is ``interrupted_with_frames``."""
    outcome = str(result.outcome.value)
    record = getattr(result, "record", None)
    if (
        outcome == "interrupted_with_checkpoint"
        and record is not None
        and record.checkpoint is None
        and record.completed_frames
    ):
        return "interrupted_with_frames"
    return outcome


def kept_words(record: Any) -> str | None:
    """What a stopped task kept to resume from, for a person: ``checkpoint generation 7 kept``,
    or ``4 finished frames kept`` (frames of its chunk reported finished with
    ``openjd_task_complete``, no checkpoint); None when it kept nothing. ``record``: the task's
    ``TaskRecord`` as the stop left it."""
    checkpoint = getattr(record, "checkpoint", None)
    if checkpoint is not None:
        return f"checkpoint generation {checkpoint.generation} kept"
    frames = len(getattr(record, "completed_frames", None) or ())
    return f"{_n(frames, 'finished frame')} kept" if frames else None


def suspended_words(record: Any) -> str:
    """A task stopped to be resumed, with what it kept (``kept_words``), for a person:
    ``suspended; checkpoint generation 7 kept``, ``suspended; 4 finished frames kept``, or
    ``suspended; nothing to resume from (it runs from its start again)``."""
    kept = kept_words(record) or "nothing to resume from (it runs from its start again)"
    return f"{OUTCOME_WORDS['interrupted']}; {kept}"


def result_words(result: Any) -> str:
    """How one task execution ended (a ``TaskResult``), for a person, the same on every runner
    (a Prefect task run's ``Stopped`` state message, an Airflow task's log line): ``succeeded``,
    ``failed``; ``canceled``, with what it kept if anything (``canceled; checkpoint generation
    3 kept``); for a task stopped to be resumed, ``suspended`` and what it kept
    (``suspended_words``, which its record's ``message`` says too: ``suspended; 4 finished
    frames kept``); for a task not started because the run is stopping, the reason the result
    gives (``not started: ...``). Never an outcome's internal name
    (``interrupted_with_checkpoint``)."""
    outcome = str(result.outcome.value)
    if outcome in ("interrupted_with_checkpoint", "interrupted"):
        return suspended_words(getattr(result, "record", None))
    if outcome == "canceled":
        kept = kept_words(getattr(result, "record", None))
        return OUTCOME_WORDS["canceled"] + (f"; {kept}" if kept else "")
    if outcome == "skipped":
        return str(getattr(result, "message", "") or "not started: the run is stopping")
    return OUTCOME_WORDS.get(outcome, outcome)


_RUN_STATUS = {
    "running": "running",
    "succeeded": "finished",
    "failed": "failed",
    "interrupted": "suspended",
    "canceled": "canceled",
    "stopped": "stopped",
}


def run_status_words(status: str, *, runner_alive: bool = True) -> str:
    """A run's stored status (``RunStatus`` value) in the words the CLI uses: ``finished``,
    ``failed``, ``suspended``, ``canceled``, ``stopped``, ``running``, or ``interrupted``
    for a run marked running whose runner has gone (resumable)."""
    if status == "running" and not runner_alive:
        return "interrupted"
    return _RUN_STATUS.get(status, status)


def task_status_words(status: str) -> str:
    """A task's stored status (``TaskStatus`` value) in the words the CLI uses: ``suspended``
    for ``interrupted``, the others as they are (``pending``, ``running``, ``succeeded``,
    ``failed``, ``canceled``)."""
    return "suspended" if status == "interrupted" else status


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def outcome_sentence(
    status: str, tasks: Iterable[Any], ran: int, *, next_step: str = "run again to continue"
) -> str:
    """What happened to a run and what the user can do next, counted over the whole run (every
    attempt), e.g. ``"suspended: 2 tasks checkpointed, 1 chunk kept 4 finished frames; run
    again to continue"``.

    Args:
        status: the run's ``RunStatus`` value.
        tasks: the run's ``TaskRecord``s in the store (a finished run has none left), read
            once (a stream from the store will do).
        ran: how many task executions this attempt ran (used when no records are left).
        next_step: how to continue, in the runner's words (the CLI's by default; a Prefect
            flow run's retry, for example); said only when something was kept to resume from.
    """
    words = run_status_words(status)
    if status == "succeeded":
        return f"{words}: every task succeeded ({_n(ran, 'task')} ran in this attempt)"
    done = failed = checkpointed = chunks = frames = 0
    for t in tasks:
        state = t.status.value
        done += state == "succeeded"
        failed += state == "failed"
        if state != "succeeded" and t.checkpoint:
            checkpointed += 1
        elif state != "succeeded" and t.completed_frames:
            chunks += 1
            frames += len(t.completed_frames)
    parts = []
    if done:
        parts.append(f"{_n(done, 'task')} done")
    if failed:
        parts.append(f"{_n(failed, 'task')} failed")
    if checkpointed:
        parts.append(f"{_n(checkpointed, 'task')} checkpointed")
    if chunks:
        parts.append(f"{_n(chunks, 'chunk')} kept {_n(frames, 'finished frame')}")
    summary = f"{words}: {', '.join(parts) or 'no task finished'}"
    if not (done or checkpointed or chunks):
        return summary  # the report goes on: nothing was stored to resume from
    nxt = next_step
    if status == "failed" and failed:
        nxt = "fix what failed, then " + nxt
    return f"{summary}; {nxt}"


def event_log_line(label: str, kind: str, value: object) -> tuple[bool, str] | None:
    """What a framework's task log says of a task event (``TaskEvent.kind``, its ``value``):
    ``(warning, text)``, ``warning`` True for a line at WARNING level; None for an event that
    such a log does not show. The same words in Airflow's and Prefect's logs."""
    if kind == "warning":
        return True, f"{label}: {value}"
    if kind == "checkpoint_saved":
        return False, f"{label}: checkpoint generation {value} stored"
    return None
