"""How a runner's signals stop a run, the same for every runner (the CLI's Ctrl-C and SIGTERM, a
Prefect flow run's SIGTERM from its runner or worker), TEP-0058 modes plus ``Suspended``:

1. the first signal asks the run to stop in the runner's mode (``Suspended`` by default: its
   running tasks checkpoint, ``checkpointCancelation``), by a deadline when the runner has one
   (a kill that follows: Prefect's runner sends SIGKILL 30 s after SIGTERM);
2. a second Ctrl-C (SIGINT), or a third signal of any kind, cancels the run at once
   (``Cancelled``, forced: the tasks are killed);
3. when ``escalate_after`` seconds have passed since the first signal and the run still has not
   ended, what still runs is killed the same way, before the runner's own SIGKILL.

A signal handler only calls ``signalled`` (it must not wait on locks); the runner's own loop
calls ``due`` and makes the requests it returns.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.task import TerminationMode

__all__ = ("Escalation", "StopEscalation")


@dataclass(frozen=True)
class Escalation:
    """One request to make (``request_termination``).

    Attributes:
        mode: the termination mode to ask for.
        force: kill the tasks without notifying them.
        deadline: when running tasks must be gone (seconds since the epoch; None: their
            actions' own notify periods).
        signum: the signal that caused it (None: ``escalate_after`` expired).
        first: True for the first signal's request.
    """

    mode: TerminationMode
    force: bool
    deadline: float | None
    signum: int | None
    first: bool

    @property
    def signal_name(self) -> str:
        """``SIGINT``, ``SIGTERM``...; ``timeout`` for an expired ``escalate_after``."""
        return signal.Signals(self.signum).name if self.signum is not None else "timeout"


class StopEscalation:
    """The signals a runner received, and the requests they call for (module docstring).

    Args:
        mode: the first signal's mode (default ``Suspended``); ``due`` may be given the
            mode to use instead at that moment (a Prefect flow run's state names one).
        deadline_seconds: the first request's deadline, in seconds after the first signal
            (None: none, the actions' own notify periods hold).
        escalate_after: seconds after the first signal when what still runs is killed
            (None: never, only by another signal).
    """

    def __init__(
        self,
        *,
        mode: TerminationMode = TerminationMode.SUSPENDED,
        deadline_seconds: float | None = None,
        escalate_after: float | None = None,
    ) -> None:
        self.mode = mode
        self.deadline_seconds = deadline_seconds
        self.escalate_after = escalate_after
        self._lock = threading.Lock()
        self._signals: list[tuple[int, float]] = []
        self._handled = 0
        self.first_at: float | None = None
        self.killed = False

    def signalled(self, signum: int, at: float | None = None) -> None:
        """Note a signal (safe in a signal handler: no waiting)."""
        self._signals.append((signum, time.time() if at is None else at))

    @property
    def signalled_at(self) -> float | None:
        """When the first signal came (seconds since the epoch), None if none came."""
        return self._signals[0][1] if self._signals else None

    def due(self, mode_now: Callable[[], TerminationMode | None] | None = None) -> list[Escalation]:
        """The requests to make now, each once: for the signals noted since the last call, and
        for an expired ``escalate_after``. ``mode_now`` is asked for the first request's mode
        (None, or an error in it: ``mode``)."""
        out: list[Escalation] = []
        with self._lock:
            while self._handled < len(self._signals) and not self.killed:
                signum, at = self._signals[self._handled]
                self._handled += 1
                if self._handled == 1:
                    self.first_at = at
                    mode = self._mode_now(mode_now)
                    deadline = at + self.deadline_seconds if self.deadline_seconds else None
                    out.append(Escalation(mode, False, deadline, signum, True))
                elif signum == signal.SIGINT or self._handled > 2:
                    self.killed = True
                    out.append(Escalation(TerminationMode.CANCELLED, True, None, signum, False))
            if (
                not self.killed
                and self.first_at is not None
                and self.escalate_after is not None
                and time.time() > self.first_at + self.escalate_after
            ):
                self.killed = True
                out.append(
                    Escalation(TerminationMode.CANCELLED, True, time.time() + 1, None, False)
                )
        return out

    def _mode_now(self, mode_now: Callable[[], TerminationMode | None] | None) -> TerminationMode:
        if mode_now is None:
            return self.mode
        try:
            return mode_now() or self.mode
        except Exception:  # the runner cannot tell (its API is unreachable): the default
            return self.mode
