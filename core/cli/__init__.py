"""The ``openjd-checkpoint`` command line: an adapter of the core like ``airflow_plugin`` and
``prefect_integration``, importing only the core's face (``core/__init__``).

``main`` is the entry point (also ``python -m core.cli``); the commands are in ``_main`` (run,
resume, stop, gc), ``_read`` (check, runs, checkpoints, logs), ``_completion``; the live
display in ``_progress``, the run's logs in the store in ``_logs``.

This file is kept tiny on purpose: Ctrl-C's handler is installed before anything heavy is
compiled or imported, so a Ctrl-C during start-up ends the program quietly (exit 130, nothing
started). While the CLI's modules are imported, the handler only notes the signal, and
``main`` ends the program once they are: an exception raised inside a compiled extension's
import (pydantic-core's, through pyo3) is not a quiet exit but a panic with a traceback.
"""

import signal
import sys

_SIGNALS: list[int] = []
"""Signals received while the CLI's modules were imported."""
_importing = True


def _early(signum: int, _frame: object) -> None:
    _SIGNALS.append(signum)
    if _importing:
        return  # acted on by main once the imports are done
    from core.cli import _early as early

    if hasattr(early, "EARLY_SIGNALS"):  # not when the signal came while it was imported
        early.EARLY_SIGNALS.append(signum)  # kept even if library code swallows the exit
    sys.exit(130)


# First of all: a Ctrl-C from here on ends the start-up quietly. (Before this line the
# interpreter itself and the package's lazy ``__init__`` are starting: no Python program can
# handle a signal there.)
signal.signal(signal.SIGINT, _early)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the command line). Returns the exit code."""
    global _importing
    from core.cli._main import main as cli_main

    _importing = False
    if _SIGNALS:  # a Ctrl-C while the modules were imported: nothing has started
        return 130
    return cli_main(argv)
