"""Entry point of ``openjd-checkpoint`` (and ``python -m core.cli``); the CLI is ``_cli``.

Kept tiny on purpose: Ctrl-C's handler is installed before anything heavy is compiled or
imported, so a Ctrl-C during start-up ends the program quietly (exit 130, nothing started).
"""

import signal
import sys


def _early(signum: int, _frame: object) -> None:
    from . import _early as early  # a module of one list: nothing to wait for

    if hasattr(early, "EARLY_SIGNALS"):  # not when the signal came while it was imported
        early.EARLY_SIGNALS.append(signum)  # kept even if library code swallows the exit
    sys.exit(130)


# First of all: a Ctrl-C from here on ends the start-up quietly. (Before this line the
# interpreter itself and the package's lazy ``__init__`` are starting: no Python program can
# handle a signal there.)
signal.signal(signal.SIGINT, _early)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the command line). Returns the exit code."""
    from ._cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
