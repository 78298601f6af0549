"""Plain words for the CLI: how a process ended, what a run's outcome means for the user.

Kept apart from ``_cli`` so that the progress display, the reports and the reading commands
say things the same way.
"""

from __future__ import annotations

import signal

__all__ = ("describe_exit", "run_status_words")


def describe_exit(code: int | None) -> str:
    """How a task's process ended, for a person: ``"exited with code: 3"``, ``"killed by SIGKILL
    (exit code -9)"`` (a negative code is the signal that ended it), or ``""`` when it never
    ran. The code keeps the form other OpenJD CLIs print, which scripts and tests look for."""
    if code is None:
        return ""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} (exit code {code})"
    return f"exited with code: {code}"


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
