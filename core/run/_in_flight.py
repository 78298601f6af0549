"""The tasks one feed of the executor has in flight (``TaskExecutor.run``), and the end write
off the session's critical path.

A task holds its session from its start until its outcome is decided, and its lease until its
end is stored. Once a task's outcome is decided as succeeded (``TaskExecution``'s ``on_ending``,
just before its end record's durable write), its session is given back and the feed's next task
starts in it while that write runs on the task's thread; the task is reported ended (its
``ENDED`` event, its result here) only once the write is done, so no task reported finished
runs again after a crash of the machine (the crash harness's kill point ``task.next-starting``
is in that window). A task that did not succeed holds its session until its end is stored: the
next may not start at all (``stop_on_failure``), or may have to be stopped
(``TaskOutcome.NOT_STORED``).
"""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from core._killpoints import kill_point
from core._records import TaskRecord
from core.job import TaskSpec
from core.run._pool import SessionPool
from core.store import Lease
from core.task import Session, TaskExecution, TaskOutcome, TaskResult

__all__ = ("Flight", "InFlight")


@dataclass(eq=False)
class Flight:
    """A task the executor started: what it holds until its end is stored."""

    spec: TaskSpec
    execution: TaskExecution
    lease: Lease
    session: Session
    began: float
    """``time.monotonic()`` at its start, in seconds."""
    future: Future[TaskResult] | None = None
    freed: bool = False
    """Its session was given back (its outcome is decided; its end may still be being stored)."""

    @property
    def record(self) -> TaskRecord:
        """The task's record as it is now (``TaskExecution.record``)."""
        return self.execution.record


class InFlight:
    """The tasks of one feed in flight: at most ``max_parallel`` holding a session, each run on
    a thread of a pool (``here``: the last task of the feed, one at a time, in the caller's
    thread, which needs no thread more: an Airflow task instance's, a Prefect task run's).

    Use it as a context manager (the pool's threads are joined at its end). ``pipelined``:
    the next task starts as soon as the one before has succeeded, while its end is stored
    (module docstring); False (an adaptive feed, whose next chunk is sized by how the one before
    ended): a task holds its session until its end is stored.
    """

    def __init__(
        self,
        sessions: SessionPool,
        max_parallel: int,
        *,
        here: bool,
        pipelined: bool,
        prepare_lease: Callable[[str, str], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._max = max(1, max_parallel)
        self._here = here and self._max == 1
        self._events: queue.SimpleQueue[tuple[bool, TaskExecution]] = queue.SimpleQueue()
        self._flights: dict[TaskExecution, Flight] = {}
        self._busy = 0
        """Tasks holding a session."""
        self.on_ending: Callable[[TaskExecution, TaskOutcome], None] | None = (
            self._ending if pipelined else None
        )
        """``TaskExecution``'s ``on_ending`` for the tasks of this feed (None: not pipelined)."""
        self._pool = ThreadPoolExecutor(
            self._max * (2 if pipelined else 1), thread_name_prefix="openjd-task"
        )
        self._prepare = prepare_lease if pipelined else None

    def __enter__(self) -> InFlight:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True)

    def __bool__(self) -> bool:
        return bool(self._flights)

    def room(self) -> bool:
        """True while fewer than ``max_parallel`` tasks hold a session."""
        return self._busy < self._max

    def start(self, flight: Flight, peek: Callable[[], TaskSpec | None]) -> None:
        """Run ``flight``'s execution (``peek()``: the feed's task after it, or None). The task
        after it is prepared for meanwhile, here, once ``flight`` is handed to its thread
        (``prepare_lease(step, task_key)``: its lease's file made, best effort,
        ``CheckpointStore.prepare_task_lease``). Not on a thread of its own: the runner is
        bound by the interpreter's lock, and a thread more to wake per task cost 8% of a
        trivial task's wall time (docs/decisions.md)."""
        self._flights[flight.execution] = flight
        self._busy += 1
        if any(f.freed for f in self._flights.values()):
            kill_point("task.next-starting")
        after = None if self.on_ending is None else peek()
        inline = self._here and (self.on_ending is None or after is None)
        flight.future = _start_run(self._pool, flight.execution, inline)
        execution = flight.execution
        flight.future.add_done_callback(lambda _f: self._events.put((True, execution)))
        if after is not None and self._prepare is not None:
            self._prepare(after.step_name, after.task_key)

    def wait(self, timeout: float) -> list[Flight]:
        """The tasks that ended (their result ready, their session given back), waiting up to
        ``timeout`` seconds for the first event; a task whose outcome was decided meanwhile
        gives its session back for the next task."""
        ended: list[Flight] = []
        for done, execution in _take_events(self._events, timeout):
            flight = self._flights.get(execution)
            if flight is None or (flight.freed and not done):
                continue
            if not flight.freed:  # its session is free for the next task
                flight.freed = True
                self._busy -= 1
                self._sessions.give(flight.session)
            if done:
                ended.append(self._flights.pop(execution))
        return ended

    def _ending(self, execution: TaskExecution, outcome: TaskOutcome) -> None:
        if outcome == TaskOutcome.SUCCEEDED:  # else it holds its session until it ended
            self._events.put((False, execution))


def _take_events(
    events: queue.SimpleQueue[tuple[bool, TaskExecution]], timeout: float
) -> list[tuple[bool, TaskExecution]]:
    """What happened to the tasks in flight, waiting up to ``timeout`` seconds for the first:
    ``(True, execution)`` it ended (its result is ready), ``(False, execution)`` it succeeded
    and its end is being stored (``on_ending``)."""
    try:
        ready = [events.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            ready.append(events.get_nowait())
        except queue.Empty:
            return ready


def on_worker_thread() -> bool:
    """True on a thread other than the main one (where no signal handler runs)."""
    return threading.current_thread() is not threading.main_thread()


def _start_run(
    pool: ThreadPoolExecutor, execution: TaskExecution, here: bool
) -> Future[TaskResult]:
    """Run ``execution`` on a pool thread (its future), or, ``here``, in this thread to its end."""
    if not here:
        context = contextvars.copy_context()  # Prefect's run context, for callbacks
        return pool.submit(context.run, execution.run)
    future: Future[TaskResult] = Future()
    try:
        future.set_result(execution.run())
    except Exception as exc:
        future.set_exception(exc)
    return future


def since(flight: Flight) -> float:
    """Seconds since ``flight`` started."""
    return time.monotonic() - flight.began
