"""A Ctrl-C while core's face imports its modules (openjd-model, pydantic, fsspec: about a
second) is held until they are imported, then delivered.

Delivered inside a compiled extension's import (pydantic-core's, through pyo3), a
``KeyboardInterrupt`` is not an exception but a panic with a traceback. Held, it is raised once
the imports are done: as ``KeyboardInterrupt`` in any program, and as a quiet exit 130 when
the program is the ``openjd-checkpoint`` command (``python -m core.cli``), whose own handler
(``core/cli/__init__.py``) takes over from there for the rest of its start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator


def _the_program_is_the_cli() -> bool:
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" in argv and argv.index("-m") + 1 < len(argv):
        return argv[argv.index("-m") + 1] == "core.cli"
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "openjd-checkpoint"


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT while the block runs (only in the main thread, and only where Python's
    default handler is in place: a program's own handler is left alone), then deliver it.

    Raises:
        KeyboardInterrupt: a SIGINT came during the block (``SystemExit(130)`` in the CLI).
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    came: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if came:
        if _the_program_is_the_cli():
            raise SystemExit(130)
        raise KeyboardInterrupt
