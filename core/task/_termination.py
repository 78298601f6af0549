"""Termination modes of a run, and termination requests from any process.

TEP-0058 (seed 002) on OpenJD runs, plus our ``Suspended``: a run is asked to end early in a
*mode*; requests are append-only files in the store (``CheckpointStore.add_stop_request``),
folded in the order they were made with TEP-0058's precedence (a stop may only become more
forceful), so that two processes asking at once lose nothing. ``RunWatcher`` brings them to
every process that runs a task of the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from core._errors import RunError, StoreError
from core._records import RunCondition, RunPhase, RunRecord, RunStatus, StopRequest
from core._threads import DaemonJob, start_daemon
from core._words import run_status_words
from core.store import CheckpointStore, Lease, this_process
from core.task._action import StopIntent

__all__ = (
    "RunWatcher",
    "Termination",
    "TerminationMode",
    "fold_request",
    "force_reaches",
    "request_or_fold",
    "request_termination",
    "resolve_termination",
    "run_is_live",
    "starts_no_tasks",
    "task_stop_for",
    "termination_choices",
)


class TerminationMode(str, Enum):
    """How a run is asked to end early (TEP-0058, plus ``Suspended``)."""

    CANCELLED = "Cancelled"
    """Stop running tasks with ``cancelation``, skip the rest, run no finally steps (and stop
    running ones)."""
    CANCELLED_RUN_FINALLY = "CancelledRunFinally"
    """Stop running tasks with ``cancelation``, skip the rest, then run the finally steps."""
    STOPPED_RUN_FINALLY = "StoppedRunFinally"
    """Let running tasks finish, skip the rest, then run the finally steps."""
    SUSPENDED = "Suspended"
    """Stop running tasks with ``checkpointCancelation``, skip the rest, run no finally steps:
    the run stays resumable."""


_UPGRADES = {
    TerminationMode.CANCELLED: {
        TerminationMode.STOPPED_RUN_FINALLY,
        TerminationMode.CANCELLED_RUN_FINALLY,
        TerminationMode.SUSPENDED,
    },
    TerminationMode.CANCELLED_RUN_FINALLY: {TerminationMode.STOPPED_RUN_FINALLY},
}
"""Which modes a later request may replace: a stop may only become more forceful."""


# --- termination ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Termination:
    """The termination a run's requests add up to.

    Attributes:
        mode: the mode in force, or None.
        force: kill running tasks, and an environment's ``onExit`` still running, at once,
            without notifying them (``force_reaches``: not the finally steps a mode runs).
        deadline: seconds since the epoch by which running tasks must be gone, or None.
    """

    mode: TerminationMode | None = None
    force: bool = False
    deadline: float | None = None

    def describe(self) -> str:
        """How a runner's log says it: ``Cancelled requested; stopping``, or ``Cancelled
        requested; forced: killing what still runs``."""
        how = "forced: killing what still runs" if self.force else "stopping"
        return f"{self.mode.value if self.mode else 'no mode'} requested; {how}"


def fold_request(
    current: Termination,
    mode: TerminationMode | str,
    *,
    phase: RunPhase,
    force: bool = False,
    deadline: float | None = None,
) -> tuple[Termination, str | None]:
    """Apply one request to the termination in force (TEP-0058 precedence).

    Returns the new termination and, when the request changes no mode, why: while finally
    steps run, ``CancelledRunFinally`` and ``StoppedRunFinally`` change nothing (TEP case 4);
    a mode may only be replaced by a more forceful one (``Cancelled`` overrides every mode,
    ``CancelledRunFinally`` overrides ``StoppedRunFinally``).

    Raises:
        ValueError: ``mode`` is not a termination mode.
    """
    mode = TerminationMode(mode)
    if phase == RunPhase.FINALLY and mode in (
        TerminationMode.CANCELLED_RUN_FINALLY,
        TerminationMode.STOPPED_RUN_FINALLY,
    ):
        return current, f"{mode.value} while finally steps run: no change"
    if current.mode is not None and mode != current.mode:
        if current.mode not in _UPGRADES.get(mode, set()):
            return current, f"already stopping ({current.mode.value})"
    new_deadline = current.deadline
    if deadline is not None:
        new_deadline = deadline if new_deadline is None else min(new_deadline, deadline)
    return Termination(mode, current.force or force, new_deadline), None


def resolve_termination(requests: Iterable[StopRequest], attempt: int) -> Termination:
    """Fold a run's stop requests of ``attempt`` in the order they were made."""
    term = Termination()
    for req in requests:
        if req.attempt != attempt:
            continue
        try:
            term, _ = fold_request(
                term, req.mode, phase=req.phase, force=req.force, deadline=req.deadline
            )
        except ValueError:
            continue  # a request naming no mode stops nothing
    return term


def task_stop_for(
    mode: TerminationMode | None, *, is_finally: bool, finally_timed_out: bool = False
) -> StopIntent | None:
    """How a running task stops under ``mode`` (docs/decisions.md, "Termination modes").

    Regular tasks: ``Suspended`` checkpoints, ``Cancelled`` and ``CancelledRunFinally`` cancel,
    ``StoppedRunFinally`` lets them finish. Finally tasks: only ``Cancelled`` (or their own
    timeout) cancels them, and ``Suspended`` checkpoints them.
    """
    if is_finally:
        if mode == TerminationMode.CANCELLED or finally_timed_out:
            return StopIntent.CANCEL
        if mode == TerminationMode.SUSPENDED:
            return StopIntent.CHECKPOINT
        return None
    if mode == TerminationMode.SUSPENDED:
        return StopIntent.CHECKPOINT
    if mode in (TerminationMode.CANCELLED, TerminationMode.CANCELLED_RUN_FINALLY):
        return StopIntent.CANCEL
    return None


def force_reaches(term: Termination, phase: RunPhase) -> bool:
    """True if ``term``'s force reaches what runs in ``phase`` (``regular`` or ``finally``):
    always in the regular phase; in the finally phase only when its mode stops finally tasks
    (``Cancelled``, ``Suspended``). A forced ``CancelledRunFinally`` or ``StoppedRunFinally``
    kills what the regular phase still runs, and the finally steps then run as the mode says."""
    if not term.force:
        return False
    return phase != RunPhase.FINALLY or task_stop_for(term.mode, is_finally=True) is not None


def starts_no_tasks(mode: TerminationMode | None, *, is_finally: bool) -> bool:
    """True if, under ``mode``, a task not started yet must not start (TEP-0058: "any
    unscheduled non-final task is skipped"): every mode stops regular tasks from starting;
    finally tasks still start unless the mode is ``Cancelled`` or ``Suspended``."""
    if is_finally:
        return mode in (TerminationMode.CANCELLED, TerminationMode.SUSPENDED)
    return mode is not None


def run_is_live(store: CheckpointStore, run: RunRecord) -> bool:
    """True while a run accepts termination requests: it has not ended, and, for a run driven
    by one process (the CLI, which records itself as ``runner``), that process still holds the
    run's lease. A run with no driving process (Airflow, Prefect) is live until it ends."""
    if run.status != RunStatus.RUNNING or run.phase == RunPhase.ENDED:
        return False
    return not runner_lost(store, run)


def runner_lost(store: CheckpointStore, run: RunRecord) -> bool:
    """True for a running run whose driving process (the CLI's, recorded as ``runner``) no
    longer holds its lease: it died, and the run reads as interrupted. A run a scheduler drives
    (Airflow, Prefect: no ``runner``, no run lease; its tasks run in the scheduler's workers)
    has no such process to lose: it runs until it ends."""
    return run.status == RunStatus.RUNNING and run.runner is not None and not store.lease_held(run)


def termination_choices(store: CheckpointStore, run: RunRecord) -> tuple[TerminationMode, ...]:
    """The modes a request could end ``run`` in now, and change something: none once it has
    ended (or its runner died); while it stops, only the more forceful modes
    (``request_termination`` refuses the others); while its finally steps run, neither
    ``CancelledRunFinally`` nor ``StoppedRunFinally`` (they change nothing then). In the order
    of ``TerminationMode``'s least forceful first: Suspended, StoppedRunFinally,
    CancelledRunFinally, Cancelled.

    Raises:
        StoreError: the run's stop requests cannot be read.
    """
    if not run_is_live(store, run):
        return ()
    current = resolve_termination(store.read_stop_requests(run.job_key, run.run_id), run.attempt)
    order = (
        TerminationMode.SUSPENDED,
        TerminationMode.STOPPED_RUN_FINALLY,
        TerminationMode.CANCELLED_RUN_FINALLY,
        TerminationMode.CANCELLED,
    )
    return tuple(
        mode
        for mode in order
        if mode != current.mode and fold_request(current, mode, phase=run.phase)[1] is None
    )


def request_termination(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    mode: TerminationMode | str,
    *,
    force: bool = False,
    deadline: float | None = None,
    escalate: bool = True,
) -> tuple[Termination, str | None]:
    """Ask a run to end early, from any process. Returns the termination now in force and a
    note when the request changed no mode (TEP-0058 case 4).

    The request is accepted under the run's record lock, so it is either seen by the attempt's
    ``enter_finally``/``finish_attempt`` or refused here: a request accepted is never dropped.
    Running tasks in any process learn of it within about a second (``RunWatcher``).

    A request of the mode already in force (asked again) is forced, as a second Ctrl-C is: what
    still runs is killed at once, an environment's ``onExit`` included, which a first request
    lets run. A mode that replaces the one in force (``Cancelled`` after
    ``StoppedRunFinally``) is a new request, applied as its mode says (its running tasks get
    their ``cancelation``), unless ``force`` (docs/decisions.md, "Termination modes").

    Args:
        mode: a ``TerminationMode`` or its value.
        force: kill running tasks (and an ``onExit`` still running) at once, without notifying
            them.
        deadline: seconds since the epoch by which running tasks must be gone.
        escalate: False for a runner's own requests (its signals, an interruption notice),
            which escalate by their own rules (``StopEscalation``): a second one is not forced.

    Raises:
        RunError: no such run, it has ended, or it is already stopping in a mode this one may
            not replace.
        ValueError: ``mode`` is not a termination mode.
        StoreError: the store cannot be read or written.
    """
    mode = TerminationMode(mode)
    with store.run_lock(job_key, run_id):
        run = store.read_run(job_key, run_id)
        if run is None:
            raise RunError(f"no run {run_id!r} in {store.location}")
        if not run_is_live(store, run):
            if run.status == RunStatus.RUNNING and run.phase != RunPhase.ENDED:
                raise RunError(
                    f"run {run_id} has no live runner (its process died); it cannot be "
                    f"stopped, only resumed ('resume {run_id}') or deleted "
                    f"('checkpoints delete {run_id}')"
                )
            raise RunError(
                f"run {run_id} has ended ({run_status_words(run.status.value)}, reason "
                f"{run.condition.reason}); "
                "it cannot be stopped"
            )
        current = resolve_termination(store.read_stop_requests(job_key, run_id), run.attempt)
        force = force or (escalate and current.mode == mode)  # asked again: forced
        new, note = fold_request(current, mode, phase=run.phase, force=force, deadline=deadline)
        if note is not None and note.startswith("already stopping"):
            raise RunError(f"run {run_id} is {note}; {mode.value} may not replace it")
        store.add_stop_request(
            run,
            StopRequest(
                mode=mode.value,
                requested_by=this_process(),
                attempt=run.attempt,
                phase=run.phase,
                force=force,
                deadline=deadline,
            ),
        )
        if note is None and run.condition.reason != "Stopping":
            run.condition = RunCondition(
                status="Unknown",
                reason="Stopping",
                message=f"{new.mode.value} requested" if new.mode else "",
            )
            run.termination = new.mode.value if new.mode else None
            store.write_run(run)
        attempt = run.attempt
    for watcher in _watchers_here(store, job_key, run_id):  # this process's: at once
        watcher.take(new, attempt)
    return new, note


def request_or_fold(
    store: CheckpointStore,
    job_key: str,
    run_id: str,
    current: Termination,
    mode: TerminationMode,
    *,
    phase: RunPhase,
    force: bool = False,
    deadline: float | None = None,
) -> tuple[Termination, str | None, str | None]:
    """``request_termination`` of a runner's own request (not escalated: its signals and
    notices escalate by their own rules); when the store cannot take the request,
    ``fold_request`` of it into ``current`` here only, so that this process's tasks still stop.
    Returns the termination now in force, the note about the mode, and a warning when the store
    failed.

    Raises:
        RunError: as ``request_termination``.
    """
    try:
        term, note = request_termination(
            store, job_key, run_id, mode, force=force, deadline=deadline, escalate=False
        )
        return term, note, None
    except StoreError as exc:
        term, note = fold_request(current, mode, phase=phase, force=force, deadline=deadline)
        return term, note, f"warning: {exc}; stopping this runner's tasks all the same"


_HERE: dict[tuple[str, str, str], set[RunWatcher]] = {}
"""The started watchers of this process, by their run: (store location, job key, run id)."""
_HERE_LOCK = threading.Lock()


def _watchers_here(store: CheckpointStore, job_key: str, run_id: str) -> list[RunWatcher]:
    with _HERE_LOCK:
        return list(_HERE.get((store.location, job_key, run_id), ()))


class RunWatcher:
    """Polls a run's stop requests from a background thread and reports each change of the
    termination in force; renews leases on stores without locks. A request made in this
    process reaches it at once (``take``), not at its next read.

    Args:
        store / job_key / run_id / attempt: the run attempt to watch.
        on_change: called with the new ``Termination`` (on the watcher thread).
        leases: leases to renew every ``renew_seconds`` (no-op on local stores).
        poll_seconds: how often the store is read.
        on_lease_expired: called once (on the watcher thread) for each of ``leases`` that
            expires (``Lease.expired``: lost to another process, or not renewed for its
            ttl because the store could not be written). Its holder must stop the work the
            lease covers: another process may be doing it now.
    """

    def __init__(
        self,
        store: CheckpointStore,
        job_key: str,
        run_id: str,
        attempt: int,
        on_change: Callable[[Termination], None],
        *,
        leases: Iterable[Lease] = (),
        poll_seconds: float = 0.5,
        renew_seconds: float = 10.0,
        on_lease_expired: Callable[[Lease], None] | None = None,
    ) -> None:
        self._store = store
        self._on_lease_expired = on_lease_expired
        self._expired: set[int] = set()
        self._expired_lock = threading.Lock()
        self._key = (job_key, run_id)
        self._here = (store.location, job_key, run_id)
        self._seen = threading.Lock()
        self._attempt = attempt
        self._on_change = on_change
        self.leases = list(leases)
        self._poll = poll_seconds
        self._renew = renew_seconds
        self._stop = threading.Event()
        self._closed = False
        """Set by ``close`` (under ``_seen``): no more reads, renewals or calls."""
        self._thread: DaemonJob | None = None
        self.current = Termination()
        self.errors: list[str] = []

    def start(self) -> RunWatcher:
        """Watch from a background thread; requests made in this process come at once
        (``take``) until ``close``."""
        with _HERE_LOCK:
            _HERE.setdefault(self._here, set()).add(self)
        self._thread = start_daemon(self._loop, "openjd-run-watch")  # a reused thread
        return self

    def check(self) -> Termination:
        """Read the requests now; call ``on_change`` if the termination changed (never once
        ``close`` has returned)."""
        with self._seen:  # a read and what it changes, whole: a request taken meanwhile waits
            if self._closed:
                return self.current
            try:
                requests = self._store.read_stop_requests(*self._key)
            except StoreError as exc:
                self.errors.append(str(exc))
                return self.current
            term = resolve_termination(requests, self._attempt)
            if term != self.current:
                self.current = term
                self._on_change(term)
            return term

    def take(self, term: Termination, attempt: int) -> None:
        """A request accepted in this process (``request_termination``) made ``term`` the
        run's termination in ``attempt``: act on it now, as the next read would (nothing for
        another attempt's, or a termination already seen)."""
        if attempt != self._attempt:
            return
        with self._seen:
            if self._closed or term == self.current:
                return
            self.current = term
            self._on_change(term)

    def close(self) -> None:
        with _HERE_LOCK:
            mine = _HERE.get(self._here)
            if mine is not None:
                mine.discard(self)
                if not mine:
                    del _HERE[self._here]
        # A read under way reports what it read before this returns (waited for up to 5 s, as
        # the thread was); the thread itself is not waited for (a switch or more per task run
        # on a busy interpreter): it ends at its next wake, and calls nothing once closed.
        held = self._seen.acquire(timeout=5)
        self._closed = True
        if held:
            self._seen.release()
        self._stop.set()

    def _loop(self) -> None:
        waited = 0.0
        while not self._stop.wait(self._poll):
            self.check()
            waited += self._poll
            if self._closed:
                return
            if waited >= self._renew:
                waited = 0.0
                for lease in self.leases:
                    try:
                        lease.renew()
                    except StoreError as exc:
                        self.errors.append(f"lease not renewed: {exc}")
            for lease in list(self.leases):
                if lease.expired and id(lease) not in self._expired:
                    try:
                        lease.confirm()  # renewed now: this process was only stalled
                        continue
                    except StoreError:
                        pass
                    self.lease_expired(lease)

    def still_held(self, lease: Lease) -> bool:
        """True if ``lease`` may still be counted on (``Lease.confirm``: no I/O while it is
        fresh; renewed first once its ttl ran out, which tells whether another process took
        it). Otherwise False, after ``lease_expired``: a holder asks before it starts work
        under the lease, so that a process woken after a stall past its lease starts nothing
        before this watcher's next look."""
        try:
            lease.confirm()
        except StoreError:
            self.lease_expired(lease)
            return False
        return True

    def lease_expired(self, lease: Lease) -> None:
        """``lease`` was found lost (here, or by its holder before a write): call
        ``on_lease_expired`` for it, once whoever finds it first."""
        with self._expired_lock:
            if id(lease) in self._expired or self._closed:
                return
            self._expired.add(id(lease))
        if self._on_lease_expired is not None:
            self._on_lease_expired(lease)
