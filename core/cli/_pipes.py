"""Quiet ends for the CLI's reading commands: a closed pipe (``| head``) and a closed terminal.

Kept apart from ``_main`` so that the commands' own modules can share it.
"""

from __future__ import annotations

import os
import sys

__all__ = ("CLOSED_PIPE_EXIT", "closed_pipe_exit", "flush_stdout")

CLOSED_PIPE_EXIT = 141
"""The exit status after the reader of stdout went away: 128 + SIGPIPE, what a shell reports for
a program that SIGPIPE ended (``yes | head -1``)."""


def closed_pipe_exit() -> int:
    """Point stdout at ``/dev/null`` so that nothing more (not even the interpreter's last flush)
    reports the closed pipe, and return ``CLOSED_PIPE_EXIT``."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout: nothing left to flush
        pass
    return CLOSED_PIPE_EXIT


def flush_stdout() -> None:
    """Flush stdout now, so that a closed pipe raises ``BrokenPipeError`` here (where ``main``
    handles it) rather than in the interpreter's flush at exit.

    Raises:
        BrokenPipeError: the reader of stdout has gone.
    """
    if sys.stdout is not None:
        sys.stdout.flush()
