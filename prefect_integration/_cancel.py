"""Stopping a flow run: ``end_flow_run``, the cancellation watcher (translation only).

``end_flow_run`` asks the core directly (the flow run stays Running, so its finally steps can
still run as task runs). A Prefect cancel (UI, CLI, REST API) is a ``Cancelling`` state on the
flow run, and means the flow's ``cancel_mode`` (or the mode the state's name gives, such as a
``Cancelling`` state named ``Cancelled``). The flow run process hears of it two ways, and both
end in ``core.request_termination`` (the core decides what a mode does):

- ``CancelWatcher``: a thread polling the flow run's state every second (a flow called from a
  script is never signalled by Prefect);
- SIGTERM to the flow run process (under ``flow.serve()`` or a worker the runner sends it, and
  SIGKILLs 30 s later), acted on in the flow body's waits (``_flow._Stopping``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from prefect import get_client
from prefect.client.schemas.objects import StateType
from prefect.exceptions import TerminationSignal

import core
from core import CheckpointStore, RunError, StoreError, TerminationMode

__all__ = (
    "LABEL_FILES",
    "LABEL_JOB_KEY",
    "LABEL_RUN_ID",
    "LABEL_STORE",
    "RUNNER_CANCEL_WAIT_SECONDS",
    "RUNNER_GRACE_SECONDS",
    "STOP_DEADLINE_SECONDS",
    "CancelWatcher",
    "end_flow_run",
    "leave_cancelled_to_the_runner",
    "mode_of_state",
    "runner_cancelled",
)

RUNNER_GRACE_SECONDS = 30.0
"""Prefect's runner and process worker SIGKILL a flow run process this long after its SIGTERM
(hard-coded in Prefect 3.9, ``runner/_cancellation_manager.py``)."""

STOP_DEADLINE_SECONDS = 24.0
"""Every task process must be gone this long after a stop is asked (the core shortens notify
periods to fit, with a warning), leaving time to store records and finish inside the grace."""


def mode_of_state(state: Any, default: TerminationMode) -> TerminationMode | None:
    """The termination mode a flow run state asks for: None unless the state is
    ``Cancelling`` (or ``Cancelled`` while the flow still runs, which is ``Cancelled``); the
    mode named by the state's name, else ``default``."""
    if state is None:
        return None
    if state.type == StateType.CANCELLED:
        return TerminationMode.CANCELLED
    if state.type != StateType.CANCELLING:
        return None
    try:
        return TerminationMode(state.name)
    except ValueError:
        return default


LABEL_STORE = "openjd.store"
LABEL_JOB_KEY = "openjd.job_key"
LABEL_RUN_ID = "openjd.run_id"
"""Flow run labels naming the core run a flow run drives (set when its attempt begins)."""
LABEL_FILES = "openjd.files"
"""Flow run label: the store's file data flow for the run (``shared`` or ``managed``)."""


def end_flow_run(
    flow_run_id: uuid.UUID | str,
    mode: TerminationMode | str,
    *,
    store: str | CheckpointStore | None = None,
) -> tuple[core.Termination, str | None]:
    """Ask a running flow run of an OpenJD flow to end in one of the core's termination modes
    (``Cancelled``, ``CancelledRunFinally``, ``StoppedRunFinally``, ``Suspended``), from any
    process that reaches the Prefect API and the run's checkpoint store.

    The request goes to the core (``core.request_termination``), for the core run named by the
    flow run's labels (``openjd.store``, ``openjd.job_key``, ``openjd.run_id``); the core's
    precedence rules apply (a stop may only become more forceful). The flow run itself stays
    Running while its tasks stop and, where the mode says so, its finally steps run as task
    runs; it then ends in the state the core's outcome gives (Cancelled, named after the mode).
    A Prefect cancel would not do: Prefect refuses new task runs in a Cancelling flow run, and
    its runner kills the flow run process 30 s after one.

    Args:
        store: the store to use instead of the flow run's ``openjd.store`` label (the same
            store seen from this host, for example a different mount path).

    Returns:
        The termination now in force, and a note when the request changed nothing.

    Raises:
        ValueError: ``mode`` is not a termination mode.
        RunError: the flow run drives no core run (yet), the run has ended, or it is stopping
            in a mode this one may not replace.
        prefect.exceptions.ObjectNotFound: no such flow run.
        StoreError: the store cannot be used.
    """
    mode = TerminationMode(mode)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(uuid.UUID(str(flow_run_id)))
    labels = flow_run.labels or {}
    job_key, run_id = labels.get(LABEL_JOB_KEY), labels.get(LABEL_RUN_ID)
    if not job_key or not run_id:
        raise RunError(
            f"flow run {flow_run_id} drives no OpenJD run (yet): no {LABEL_RUN_ID} label"
        )
    if store is None:
        store = str(labels.get(LABEL_STORE) or "")
    if isinstance(store, CheckpointStore):
        checkpoints = store
    else:
        files = labels.get(LABEL_FILES)  # as the flow run had it, not this process's setting
        checkpoints = CheckpointStore(
            store, files=files if files in ("shared", "managed") else None
        )
    return core.request_termination(checkpoints, str(job_key), str(run_id), mode)


class CancelWatcher:
    """Polls a flow run's state from a thread; on a cancel, asks the core run to end in the
    mode the state names (else ``default_mode``) with a deadline ``deadline_seconds`` away.
    Keeps polling, so a later, more forceful mode still counts.

    Args:
        flow_run_id: the flow run to watch.
        store / job_key / run_id: the core run it drives.
        default_mode: the mode of a plain cancel.
        log: where notes go (a Prefect run logger's ``info``).
        poll_seconds: how often the API is read.
        deadline_seconds: a request's deadline, this many seconds after it is made
            (``STOP_DEADLINE_SECONDS``, before a runner's SIGKILL); None: none (a flow called
            directly, which nothing kills: the actions' own notify periods hold).
    """

    def __init__(
        self,
        flow_run_id: uuid.UUID,
        store: CheckpointStore,
        job_key: str,
        run_id: str,
        default_mode: TerminationMode,
        log: Callable[[str], None],
        poll_seconds: float = 1.0,
        deadline_seconds: float | None = STOP_DEADLINE_SECONDS,
    ) -> None:
        self._deadline_seconds = deadline_seconds
        self._flow_run_id = flow_run_id
        self._store = store
        self._key = (job_key, run_id)
        self._default = default_mode
        self._log = log
        self._poll = poll_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.requested: list[TerminationMode] = []
        self.prefect_cancel = threading.Event()
        """Set once the flow run's state was seen asking for a stop (a Prefect cancel)."""
        self._asked: set[tuple[TerminationMode, bool]] = set()
        self._thread = threading.Thread(
            target=self._loop, name="openjd-prefect-cancel-watch", daemon=True
        )

    def start(self) -> CancelWatcher:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def current_mode(self) -> TerminationMode | None:
        """Read the flow run's state now: the mode it asks for, or None."""
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(self._flow_run_id).state
        return mode_of_state(state, self._default)

    def request(
        self, mode: TerminationMode, *, force: bool = False, deadline: float | None = None
    ) -> None:
        """``core.request_termination`` once per mode (repeats are no-ops); refusals logged.
        Not escalated: a second mode is not forced by the core, as the flow run's signals
        escalate by ``core.StopEscalation``'s rules."""
        with self._lock:
            if (mode, force) in self._asked:
                return
            self._asked.add((mode, force))
            self.requested.append(mode)
        if deadline is None and self._deadline_seconds is not None:
            deadline = time.time() + self._deadline_seconds
        try:
            _, note = core.request_termination(
                self._store, *self._key, mode, force=force, deadline=deadline, escalate=False
            )
            self._log(
                f"run {self._key[1]}: {mode.value} requested"
                + (" (forced)" if force else "")
                + (f"; {note}" if note else "")
            )
        except (RunError, StoreError) as exc:
            self._log(f"run {self._key[1]}: {mode.value} not applied: {exc}")

    def _loop(self) -> None:
        # One API client for the watcher's life, not one a poll: a client's TLS context takes
        # ~20 ms of the interpreter lock to build, which stalls the flow run's task runs.
        client: contextlib.ExitStack | None = None
        api: Any = None
        try:
            while not self._stop.wait(self._poll):
                try:
                    if client is None:
                        client = contextlib.ExitStack()
                        api = client.enter_context(get_client(sync_client=True))
                    state = api.read_flow_run(self._flow_run_id).state
                    mode = mode_of_state(state, self._default)
                except Exception as exc:  # the API is unreachable for a moment: try again
                    self._log(f"warning: cannot read the flow run's state: {exc}")
                    if client is not None:  # with a new client
                        client.close()
                        client = None
                    continue
                if mode is not None:
                    self.prefect_cancel.set()
                    self.request(mode)
        finally:
            if client is not None:
                client.close()


def runner_cancelled() -> bool:
    """True when the Prefect runner that started this process (``flow.serve()``, a worker)
    delivered a cancel for it over its attempt control channel before its SIGTERM: that runner
    then owns the flow run's ``Cancelled`` state and sets it once this process is gone
    (Prefect 3.9, ``runner/_cancellation_manager.py``, ``FlowRunEngine.handle_cancellation``).

    Reads ``prefect._internal.control_listener.get_intent``, which Prefect's own engine reads
    for the same question: Prefect 3.9 has no public way to ask it. False if it cannot be
    read (another Prefect version): the flow then sets the state itself, as before."""
    try:
        from prefect._internal.control_listener import get_intent
    except ImportError:  # pragma: no cover - another Prefect version
        return False
    return bool(get_intent() == "cancel")


RUNNER_CANCEL_WAIT_SECONDS = 15.0
"""How long a flow run stopped by a Prefect cancel under a runner waits for the runner's own
cancel of this process (``_leave_cancelled_to_the_runner``); it usually comes within a second."""


def leave_cancelled_to_the_runner(logger: Any, message: str) -> None:
    """End a flow run stopped by a Prefect cancel under a runner (``flow.serve()``, a worker)
    the way Prefect's engine ends one: the runner that delivers the cancel owns the
    ``Cancelled`` state and sets it once this process is gone (Prefect 3.9,
    ``runner/_cancellation_manager.py``). Waits (at most ``RUNNER_CANCEL_WAIT_SECONDS``) until
    the runner has delivered it, then raises ``TerminationSignal`` (the runner's SIGTERM, if
    it comes first, raises it too), which Prefect's engine logs at INFO.

    Had this process set ``Cancelled`` itself (it did), the runner's cancel, which can reach
    it seconds after the ``Cancelling`` state (its events come late), would land on a retry
    made meanwhile: set ``Cancelled`` over it, or stop the retried run (issue 40). When the
    runner says nothing in time (its cancellation observer failed), returns: the flow sets
    the state itself, as before.

    Raises:
        TerminationSignal: the runner delivered its cancel.
    """
    if not runner_cancelled():
        logger.info("%s: waiting for Prefect's runner to take the cancel", message)
    deadline = time.monotonic() + RUNNER_CANCEL_WAIT_SECONDS
    while not runner_cancelled():
        if time.monotonic() > deadline:
            logger.warning(
                "Prefect's runner did not take the cancel within %.0f s: the flow run sets "
                "its state itself; a retry made before the runner's own Cancelled may not run",
                RUNNER_CANCEL_WAIT_SECONDS,
            )
            return
        time.sleep(0.05)
    logger.info("%s: Prefect's runner marks the flow run Cancelled", message)
    raise TerminationSignal(signal=signal.SIGTERM)
