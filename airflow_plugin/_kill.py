"""What Airflow's ``on_kill`` (and an ``execution_timeout``) does to a task instance's group: a
stop of the group's tasks through its ``core.GroupStop`` (the running task and every task still
to come), as the reason for the kill asks, within Airflow's 5 s kill budget."""

from __future__ import annotations

import threading
import time
from typing import Any

import core

from ._inputs import state_text

__all__ = ("DONE_MESSAGE", "KILL_BUDGET_SECONDS", "REASON_WAIT_SECONDS", "Kill")

KILL_BUDGET_SECONDS = 4.0
"""How long after ``on_kill`` the task's processes must be gone, in seconds: inside the 5 s
between the supervisor's SIGTERM and its SIGKILL (``supervisor.py``, ``escalation_delay``)."""

DONE_MESSAGE = "marked success in Airflow"
"""Why a task instance marked success is recorded done (``TaskExecution.stop``)."""
REASON_WAIT_SECONDS = 0.5
"""How long ``on_kill`` waits for Airflow to say why before it asks for a checkpoint."""


class Kill:
    """How a task instance's group was stopped by Airflow, and the stop itself.

    Args:
        stop: the handle passed to ``core.run_tasks`` for the group.
        log: the operator's logger.

    Attributes:
        at: when the stop was asked (``time.time()``), None while not stopped.
        deadline: by when the task's processes must be gone (``on_kill``; None: the action's
            notify period holds).
        reason: why, in words (``the task instance was marked failed; task failed, DAG run
            running``), None while unknown.
        marked_success: the task instance was marked success: the group is declared done.
    """

    def __init__(self, stop: core.GroupStop, log: Any) -> None:
        self.stop = stop
        self.log = log
        self.at: float | None = None
        self.deadline: float | None = None
        self.reason: str | None = None
        self.marked_success = False
        self._reason_thread: threading.Thread | None = None

    def timed_out(self, exc: BaseException) -> None:
        """``execution_timeout`` (raised in the operator's thread) or another interruption:
        checkpoint with the action's full notify period."""
        self.at = time.time()
        self.reason = f"{type(exc).__name__}: {exc}"
        timeout = type(exc).__name__ == "AirflowTaskTimeout"
        cause = core.InterruptionCause.TIMEOUT if timeout else core.InterruptionCause.STOP
        self.stop.stop(core.StopIntent.CHECKPOINT, cause=cause)

    def killed(self, context: Any, budget_seconds: float) -> None:
        """``on_kill``: ask Airflow why from a worker thread, for at most
        ``REASON_WAIT_SECONDS`` (the caller, Airflow's SIGTERM handler, must not wait), then
        stop as the reason asks (``_stop``); with no reason by then, checkpoint."""
        now = time.time()
        self.at = now
        self.deadline = now + budget_seconds
        self._reason_thread = threading.Thread(
            target=self._find_reason, args=(context,), name="openjd-kill-reason", daemon=True
        )
        self._reason_thread.start()
        fallback = threading.Timer(REASON_WAIT_SECONDS, self._stop)
        fallback.daemon = True
        fallback.start()

    def wait_reason(self) -> None:
        """Wait for the reason of ``on_kill`` (if it was called), up to its deadline."""
        if self._reason_thread is not None:
            self._reason_thread.join(max(0.0, (self.deadline or 0) - time.time()))

    def stopped_by(self) -> str | None:
        """What stopped the group, for ``core.classify_group`` (None: not stopped)."""
        if self.at is None:
            return None
        return f"on_kill ({self.reason or 'reason unknown'})"

    def cause(self) -> core.InterruptionCause:
        """What the stop that reached the group was (``core.GroupStop``'s first request: the
        cause its tasks' records keep), for ``core.classify_group``'s ``stop_cause``."""
        request = self.stop.request
        return request.cause if request is not None else core.InterruptionCause.STOP

    def _stop(self, cause: core.InterruptionCause = core.InterruptionCause.STOP) -> None:
        """Stop the group as the kill's reason asks (once known: see ``killed``): a task
        instance marked success is canceled and recorded done as it ends (``declared_done``),
        never left readable as stopped; any other reason, or none in time, checkpoints, with
        ``cause`` (``notice``: the worker is shutting down)."""
        if self.marked_success:
            self.stop.stop(
                core.StopIntent.CANCEL, deadline=self.deadline, declared_done=DONE_MESSAGE
            )
        else:
            self.stop.stop(core.StopIntent.CHECKPOINT, deadline=self.deadline, cause=cause)

    def _find_reason(self, context: Any) -> None:
        if context is None:
            return
        ti = context["ti"]
        try:
            states = ti.get_task_states(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
            )
            # Mapped instances are keyed "<task_id>_<map_index>" (execution API, /states).
            key = ti.task_id if ti.map_index is None or ti.map_index < 0 else None
            key = key or f"{ti.task_id}_{ti.map_index}"
            task_state = state_text(states.get(ti.run_id, {}).get(key))
            run_state = state_text(ti.get_dagrun_state(ti.dag_id, ti.run_id))
        except Exception as exc:
            self.reason = f"could not ask Airflow why: {exc}"
            self.log.warning("on_kill: %s", self.reason)
            self._stop()
            return
        reason = {
            "failed": "the task instance was marked failed",
            "success": "the task instance was marked success",
            "restarting": "the running task instance was cleared",
            "up_for_retry": "the task instance is up for retry",
        }.get(task_state, f"task instance {task_state}")
        if task_state == "failed" and run_state == "failed":
            reason = "the task instance or the DAG run was marked failed"
        cause = core.InterruptionCause.STOP
        if task_state == "running":
            # Every kill Airflow decides (marked failed or success, cleared, the run failed, a
            # heartbeat refused) changes the task instance's state first, and the supervisor
            # signals the task once it sees that change; a task instance still running was
            # signalled from outside: its worker is shutting down (the supervisor forwards
            # the SIGTERM it got). The host going away: resumed without using a retry.
            reason = "worker shutdown (the task instance is still running)"
            cause = core.InterruptionCause.NOTICE
        if task_state == "success":
            # Marked success: the work is declared done, so nothing needs keeping.
            self.marked_success = True
        self._stop(cause)
        self.reason = f"{reason}; task {task_state}, DAG run {run_state}"
        asked = "recorded as done" if self.marked_success else "checkpoint requested"
        self.log.warning("on_kill: %s; %s", self.reason, asked)
