"""What an executor runs now and what stops it (``RunningTasks``): the run's termination in
force, an interruption notice, the phases' time budgets, the caller's ``GroupStop``. Used by
``core.run._executor`` only."""

from __future__ import annotations

import threading

from core._records import InterruptionCause, RunPhase
from core.run._group_stop import StopRequest
from core.run._notices import (
    Notice,
)
from core.run._pool import SessionPool
from core.store import Lease
from core.task import (
    StopIntent,
    TaskExecution,
    Termination,
    TerminationMode,
    fold_request,
    force_reaches,
    starts_no_tasks,
    task_stop_for,
)

__all__ = ("RunningTasks",)


class RunningTasks:
    """The tasks an executor runs now and what stops them: the run's termination in force,
    an interruption notice, the phases' time budgets. ``apply`` stops the running tasks as a
    termination says (``task_stop_for``), ``why_not_start`` says why no task of a phase may
    start now. Thread-safe.

    Args:
        sessions: the executor's sessions (a forced stop or a deadline reaches an ``onExit``
            still running there).
        drives_run: the executor drives the whole run (it holds the run's lease: the CLI's):
            a notice then suspends the run through the store, not only this process's tasks.
    """

    def __init__(self, sessions: SessionPool, *, drives_run: bool) -> None:
        self._sessions = sessions
        self._drives_run = drives_run
        self.lock = threading.RLock()
        self.term = Termination()
        """The termination in force for this process's tasks."""
        self.notice: Notice | None = None
        """The interruption notice acted on (the one with the earliest deadline), if any."""
        self.timed_out = {False: False, True: False}
        """Phase (is finally) -> its time budget expired."""
        self.closed = False
        self.group_stop: StopRequest | None = None
        """The caller's stop (``GroupStop``), folded, if any."""
        self._active: dict[TaskExecution, bool] = {}  # running execution -> is a finally task
        self._by_lease: dict[int, TaskExecution] = {}  # id of a task's lease -> its execution

    def add(self, execution: TaskExecution, lease: Lease, is_finally: bool) -> None:
        with self.lock:
            self._active[execution] = is_finally
            self._by_lease[id(lease)] = execution
            asked = self.group_stop
        if asked is not None:  # stopped while it was being claimed
            asked.apply(execution)

    def group_stopped(self, request: StopRequest) -> None:
        """The caller stopped the group (``GroupStop.stop``): stop the running tasks as it
        asks; none starts from now on."""
        with self.lock:
            if self.closed:
                return
            old = self.group_stop
            self.group_stop = request if old is None else old.fold(request)
            active = list(self._active)
        for execution in active:
            request.apply(execution)

    def remove(self, execution: TaskExecution, lease: Lease) -> None:
        with self.lock:
            self._active.pop(execution, None)
            self._by_lease.pop(id(lease), None)

    def executions(self) -> list[TaskExecution]:
        with self.lock:
            return list(self._active)

    def holding(self, lease: Lease) -> TaskExecution | None:
        """The running execution whose task's lease ``lease`` is."""
        with self.lock:
            return self._by_lease.get(id(lease))

    def apply(self, term: Termination, phase: RunPhase = RunPhase.REGULAR) -> Termination | None:
        """Make ``term`` the termination in force, and stop the running tasks as it says (a
        notice of this process suspends them too, with its deadline); forward a forced stop
        (where it reaches in ``phase``: ``force_reaches``) or a deadline to the sessions.
        Returns the termination it replaced, None once closed."""
        with self.lock:
            if self.closed:
                return None
            previous, self.term = self.term, term
            notice = self.notice
            active = list(self._active.items())
        if notice is not None and not self._drives_run:
            # this process's tasks are suspended by the notice: the earliest deadline holds
            term = fold_request(
                term, TerminationMode.SUSPENDED, phase=RunPhase.REGULAR, deadline=notice.deadline
            )[0]
        for execution, is_finally in active:
            intent = task_stop_for(
                term.mode, is_finally=is_finally, finally_timed_out=self.timed_out[True]
            )
            if intent is not None:
                execution.stop(
                    intent,
                    force=term.force,
                    deadline=term.deadline,
                    cause=InterruptionCause.STOP if notice is None else InterruptionCause.NOTICE,
                )
        for session in self._sessions.all():  # reaches an onExit still running
            session.stop(force=force_reaches(term, phase), deadline=term.deadline)
        return previous

    def expire(self, is_finally: bool) -> bool:
        """The phase's time budget expired: cancel its running tasks. False if it had
        expired already."""
        with self.lock:
            if self.timed_out[is_finally]:
                return False
            self.timed_out[is_finally] = True
            active = [ex for ex, fin in self._active.items() if fin == is_finally]
        for execution in active:
            execution.stop(StopIntent.CANCEL, cause=InterruptionCause.TIMEOUT)
        return True

    def stopping(self, is_finally: bool) -> bool:
        """True if no task of the phase (finally or regular) may start now: its time budget
        expired, or the termination in force starts none (``starts_no_tasks``)."""
        return self.timed_out[is_finally] or starts_no_tasks(self.term.mode, is_finally=is_finally)

    def noticed(self, notice: Notice) -> bool:
        """Act on ``notice`` from now on (the earliest deadline wins); True for the first."""
        with self.lock:
            first = self.notice is None
            if first or _sooner(notice, self.notice):
                self.notice = notice
        return first

    def why_not_start(self, is_finally: bool) -> str | None:
        """Why a task of the phase may not start now (None: it may)."""
        if self.group_stop is not None:
            return f"not started: the group was stopped ({self.group_stop.describe()})"
        if self.timed_out[is_finally]:
            return "not started: the time budget expired"
        notice = self.notice
        if notice is not None and not self._drives_run:
            return (
                f"not started: an interruption notice ({notice.source}) stopped this "
                "process's tasks"
            )
        mode = self.term.mode
        if starts_no_tasks(mode, is_finally=is_finally):
            return f"not started: the run is stopping ({mode.value if mode else ''})"
        return None


def _sooner(notice: Notice, than: Notice | None) -> bool:
    """True if ``notice``'s deadline comes before ``than``'s (no deadline: never)."""
    inf = float("inf")
    return (notice.deadline or inf) < ((than.deadline if than else None) or inf)
