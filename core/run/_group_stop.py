"""A caller's handle to stop a group of tasks run by ``run_tasks`` (``GroupStop``): the running
task and every task of the call still to come, from any thread. An adapter whose framework
kills its unit (Airflow's ``on_kill``, an ``execution_timeout``) stops through it instead of
keeping each ``TaskExecution`` to stop the next one too.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from typing import Protocol

from core._records import InterruptionCause
from core.task import StopIntent, TaskExecution

__all__ = ("GroupStop", "StopRequest")


@dataclass(frozen=True)
class StopRequest:
    """The stop asked of a group so far (``GroupStop.stop``'s arguments, folded as
    ``TaskExecution.stop`` folds them: ``CANCEL`` wins over ``CHECKPOINT``, the earliest
    deadline wins, a forced stop stays forced, the first ``declared_done`` reason stays)."""

    intent: StopIntent
    force: bool = False
    deadline: float | None = None
    """Seconds since the epoch (``time.time()``) by which every process of a task is gone."""
    declared_done: str | None = None
    cause: InterruptionCause = InterruptionCause.STOP
    """What asked (the metrics' interruption cause): the first request's, unless it was a
    plain ``stop`` and a later one names another (``StopState.request``)."""

    def fold(self, other: StopRequest) -> StopRequest:
        deadlines = [d for d in (self.deadline, other.deadline) if d is not None]
        return replace(
            self,
            intent=StopIntent.CANCEL
            if StopIntent.CANCEL in (self.intent, other.intent)
            else self.intent,  # fmt: skip
            force=self.force or other.force,
            deadline=min(deadlines) if deadlines else None,
            declared_done=self.declared_done or other.declared_done,
            cause=other.cause if self.cause == InterruptionCause.STOP else self.cause,
        )

    def apply(self, execution: TaskExecution) -> None:
        """Stop ``execution`` as asked (``TaskExecution.stop``)."""
        execution.stop(
            self.intent,
            force=self.force,
            deadline=self.deadline,
            declared_done=self.declared_done,
            cause=self.cause,
        )

    def describe(self) -> str:
        """In words, for a task not started because of it: ``checkpoint``, ``cancel, declared
        done (marked success in Airflow)``."""
        text = self.intent.value.lower()
        if self.declared_done:
            text += f", declared done ({self.declared_done})"
        return text


class _Stoppable(Protocol):
    def group_stopped(self, request: StopRequest) -> None: ...


class GroupStop:
    """Stops the tasks of one ``run_tasks`` call: made by the caller, passed as
    ``run_tasks(..., stop=handle)``, stopped with ``handle.stop(...)`` at any time (before the
    call, while a task runs, between two tasks, after it returned: then it does nothing).

    A stop reaches the running task at once (``TaskExecution.stop`` with the folded request),
    and no task of the call starts after it (each one not started ends ``SKIPPED``, with
    ``not started: the group was stopped (...)``). Thread-safe; ``stop`` returns at once (the
    locks it takes are held only briefly). A signal handler may call it when ``run_tasks`` runs
    on another thread than the handler's (the main thread), as in Airflow's operator: a lock
    the interrupted thread held could not be taken again there.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._request: StopRequest | None = None
        self._targets: list[_Stoppable] = []

    @property
    def request(self) -> StopRequest | None:
        """The stop asked so far (None: none)."""
        return self._request

    def stop(
        self,
        intent: StopIntent,
        *,
        force: bool = False,
        deadline: float | None = None,
        declared_done: str | None = None,
        cause: InterruptionCause | str = InterruptionCause.STOP,
    ) -> None:
        """Stop the running task and every task of the call still to come.

        Args:
            intent: why they stop (``CHECKPOINT``: ``checkpointCancelation``; ``CANCEL``).
            force: kill at once, without notifying.
            deadline: seconds since the epoch (``time.time()``) by which every process of a
                task must be gone (``TaskExecution.stop``).
            declared_done: the scheduler's user declared the tasks done, for this reason: a
                running task's end record says it finished (``TaskExecution.stop``).
            cause: what asks (``notice``: the host is going away; ``stop``; ``timeout``), for
                the metrics and for whether the framework counts the try (``GroupVerdict``).

        Raises:
            ValueError: ``intent`` is not a ``StopIntent`` (or its value), ``cause`` not an
                ``InterruptionCause``, or ``deadline`` is not a finite number.
        """
        intent = StopIntent(intent)  # ValueError: not a stop intent
        if deadline is not None and not math.isfinite(deadline):
            raise ValueError(f"GroupStop.stop: deadline {deadline!r} is not a finite time")
        asked = StopRequest(intent, force, deadline, declared_done, InterruptionCause(cause))
        with self._lock:
            self._request = asked if self._request is None else self._request.fold(asked)
            targets = list(self._targets)
        for target in targets:
            target.group_stopped(asked)

    def bind(self, target: _Stoppable) -> None:
        """Make ``target`` (an executor's running tasks) obey this handle: the stop asked so
        far at once, each later one as it comes. Called by ``run_tasks``."""
        with self._lock:
            self._targets.append(target)
            asked = self._request
        if asked is not None:
            target.group_stopped(asked)
