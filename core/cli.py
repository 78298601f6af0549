"""Entry point of ``openjd-checkpoint`` (and ``python -m core.cli``); the CLI is ``_cli``.

Kept tiny on purpose: Ctrl-C's handler is installed before anything heavy is compiled or
imported, so a Ctrl-C during start-up ends the program quietly (exit 130, nothing started).
"""

import signal
import sys

from ._early import EARLY_SIGNALS


def _early(signum: int, _frame: object) -> None:
    EARLY_SIGNALS.append(signum)  # kept even if the exit below is swallowed by library code
    sys.exit(130)


signal.signal(signal.SIGINT, _early)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: the command line). Returns the exit code."""
    from ._cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
