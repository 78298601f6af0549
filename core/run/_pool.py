"""The sessions of an executor: a pool of OpenJD sessions kept for the next task, and what an
environment exit that failed does to the run (RFC 0008 "Failure semantics")."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from core._errors import StoreError
from core.job import PreparedJob
from core.store import CheckpointStore
from core.task import Session

__all__ = ("SessionPool", "record_environment_failure")


class SessionPool:
    """Sessions of one run attempt in this process: ``take`` one for a task, ``give`` it back
    when the task ended; a broken session (an environment that failed to enter) is closed
    instead of reused. ``close`` ends every session (environments exit, ``onExit``, in reverse
    order; what they left running is killed); an exit that failed is recorded in the run
    (``record_environment_failure``), so the attempt ends Failed. Thread-safe.

    Args:
        store / job / run_id / attempt: the run attempt.
        working_root: parent folder of the sessions' working folders.
        on_note: where a failed environment exit is said.
    """

    def __init__(
        self,
        store: CheckpointStore,
        job: PreparedJob,
        run_id: str,
        *,
        attempt: int,
        working_root: str | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.job = job
        self.run_id = run_id
        self.attempt = attempt
        self._working_root = working_root
        self._on_note = on_note
        self._lock = threading.Lock()
        self._idle: list[Session] = []
        self._sessions: list[Session] = []

    def all(self) -> list[Session]:
        """Every open session, idle or running (a closing one included)."""
        with self._lock:
            return list(self._sessions)

    def take(self, job_status: str | None) -> Session:
        """An idle session that is not broken, or a new one; finally tasks read
        ``job_status`` as ``{{Job.Status}}``."""
        while True:
            with self._lock:
                session = self._idle.pop() if self._idle else None
            if session is None:
                break
            if session.broken is None:
                session.job_status = job_status
                return session
            self._close(session)
        session = Session(
            self.job,
            run_id=self.run_id,
            store=self.store,
            working_root=self._working_root,
            job_status=job_status,
        )
        with self._lock:
            self._sessions.append(session)
        return session

    def give(self, session: Session) -> None:
        """A task in ``session`` ended: the session is idle."""
        with self._lock:
            self._idle.append(session)

    def close(self) -> None:
        """End every session now."""
        with self._lock:
            sessions, self._idle = list(self._sessions), []
        for session in sessions:
            self._close(session)

    def _close(self, session: Session) -> None:
        problem = session.close()  # still listed while closing: a forced stop reaches onExit
        with self._lock:
            if session in self._sessions:
                self._sessions.remove(session)
        # finish_attempt ends the attempt Failed for a problem, unless it is suspended or
        # stopped; an onExit the stop killed makes the stop count (the run ends in its mode)
        ended = [(text, True) for text in session.stopped_exits]
        for message, stopped in ended + ([(problem, False)] if problem else []):
            note = message
            try:
                record_environment_failure(
                    self.store,
                    self.job.job_key,
                    self.run_id,
                    message,
                    attempt=self.attempt,
                    stopped=stopped,
                )
            except StoreError as exc:
                note = f"warning: {message} (not recorded in the run: {exc})"
            if self._on_note is not None:
                self._on_note(note)


def record_environment_failure(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    message: str,
    *,
    attempt: int,
    stopped: bool = False,
) -> None:
    """Note in the run's record (``RunRecord.environment_failures``) that an environment's
    ``onExit`` (or the ``onWrapEnvExit`` that wraps it) failed when a session closed:
    ``finish_attempt`` then ends this attempt Failed, as ``openjd run`` ends a session whose
    environment exit failed (RFC 0008 "Failure semantics"; the conformance data's
    ``wrap-failed-exit-hook-own-onexit-still-runs``). The tasks keep their own outcomes: a
    retry does not run them again.

    With ``stopped``, the ``onExit`` did not fail by itself: a stop killed it (forced, or at
    its deadline; ``Session.stopped_exits``), and the attempt ends in the stop's mode instead
    (the stop counts, as one that stopped a task does).

    Args:
        message: what failed, naming the action (``Session.close``'s return value).
        attempt: the run attempt whose session it was.
        stopped: a stop killed the ``onExit`` (the entry gets ``"stopped": true``).

    Raises:
        StoreError: the store cannot be read or written.
    """
    with store.run_lock(job_key, run_id):
        run = store.read_run(job_key, run_id)
        if run is None:
            return
        entry: dict[str, Any] = {"attempt": attempt, "message": message}
        if stopped:
            entry["stopped"] = True
        run.environment_failures.append(entry)
        store.write_run(run)
