"""How the flow body waits for its task runs, and what a signal to the flow run process does
meanwhile: ``Stopping`` turns SIGTERM and Ctrl-C into the core run's stop requests
(``core.StopEscalation``), ``wait_all`` waits on any task runner's futures (a thread pool's,
Dask's, Ray's) between its ticks."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from prefect.futures import PrefectFuture

import core
from core import TerminationMode

from ._cancel import STOP_DEADLINE_SECONDS, CancelWatcher

__all__ = ("ESCALATE_AFTER_SECONDS", "Stopping", "wait_all")

ESCALATE_AFTER_SECONDS = STOP_DEADLINE_SECONDS + 1.0
"""After a SIGTERM, what still runs this long afterwards is killed (``Cancelled``, forced)
before the runner's SIGKILL at 30 s, so that no task process is left."""


class Stopping:
    """What the flow body knows of a stop. While the body runs, SIGTERM (the runner's cancel, a
    worker shutting down) and Ctrl-C (SIGINT, a flow run called in this process) are only
    noted, instead of Prefect's ``TerminationSignal`` raised wherever the main thread is
    (possibly inside a core operation); the waits below act on them as core's stop escalation
    says (``core.StopEscalation``): the core run is asked to stop in the mode the flow run's
    state names (else the flow's ``cancel_mode``, ``Suspended`` by default) by a deadline
    before the runner's SIGKILL; a second Ctrl-C kills the tasks at once (``Cancelled``), as
    the CLI's does; what still runs ``ESCALATE_AFTER_SECONDS`` after the first signal is
    killed. Without this, Python's KeyboardInterrupt left the task processes running to
    their end and the core run recorded as running.

    Entered before the core run begins (``watcher`` None until then, set once it is there): a
    signal meanwhile is noted and acted on from the first wait, so that the run it was begun
    ends stopped; a second Ctrl-C before then is Python's KeyboardInterrupt, as a beginning
    stuck on the store must still be interruptible.

    ``runner_kills`` False (a flow called directly, which no runner SIGKILLs): no deadline and
    no kill after ``ESCALATE_AFTER_SECONDS``; the actions' own notify periods hold, and a
    second Ctrl-C kills the tasks, as with the CLI."""

    def __init__(
        self,
        watcher: CancelWatcher | None,
        default: TerminationMode,
        *,
        runner_kills: bool = True,
    ) -> None:
        self.watcher = watcher
        self.escalation = core.StopEscalation(
            mode=default,
            deadline_seconds=STOP_DEADLINE_SECONDS if runner_kills else None,
            escalate_after=ESCALATE_AFTER_SECONDS if runner_kills else None,
        )
        self._previous: Any = None
        self._previous_int: Any = None
        self._installed = False

    @property
    def signal_at(self) -> float | None:
        return self.escalation.signalled_at

    def __enter__(self) -> Stopping:
        if threading.current_thread() is threading.main_thread():
            handler = self._on_signal  # one object: Prefect's bridge check compares identity
            self._previous = _bridge.install(handler)
            self._previous_int = signal.signal(signal.SIGINT, handler)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            _bridge.restore(self._previous)
            signal.signal(signal.SIGINT, self._previous_int)
            self._installed = False

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.watcher is None and signum == signal.SIGINT and self.signal_at is not None:
            raise KeyboardInterrupt  # a second Ctrl-C while the run begins: it may be stuck
        self.escalation.signalled(signum)

    def tick(self) -> None:
        """Make the requests the signals received meanwhile call for (called from the main
        thread's waits); signals received before there is a ``watcher`` (the core run begins)
        count from when they came, once there is one."""
        if self.watcher is None:
            return
        for step in self.escalation.due(self.watcher.current_mode):
            self.watcher.request(step.mode, force=step.force, deadline=step.deadline)


class _Bridge:
    """Our SIGTERM handler stands in for Prefect's SIGTERM bridge while the flow body runs.

    Under ``flow.serve()`` or a worker, Prefect 3.9's runner delivers a cancel to the flow run's
    process over its attempt control channel before its SIGTERM, and the process acknowledges
    it only while Prefect's own SIGTERM handler is installed
    (``prefect.utilities.engine.commit_control_intent_and_ack`` compares the installed handler
    with ``_prefect_sigterm_handler``). Unacknowledged, the runner takes the process for crashed
    and its cancel can come late, onto a retry (issue 40). ``Stopping`` installs its own
    handler (a SIGTERM only noted, never ``TerminationSignal`` raised inside a core operation),
    so it is registered as that bridge for as long as it is installed, under the bridge's lock.
    Prefect 3.9 offers no public way to do this; without those names (another Prefect) only the
    handler is installed."""

    def __init__(self) -> None:
        self._original: Any = None

    def install(self, handler: Any) -> Any:
        """Install ``handler`` for SIGTERM (as Prefect's bridge when Prefect's is installed);
        returns what was installed before."""
        engine = _prefect_engine()
        if engine is None:
            return signal.signal(signal.SIGTERM, handler)
        with engine._prefect_sigterm_bridge_lock:
            previous = signal.signal(signal.SIGTERM, handler)
            if previous is engine._prefect_sigterm_handler:
                self._original = previous
                engine._prefect_sigterm_handler = handler
            return previous

    def restore(self, previous: Any) -> None:
        engine = _prefect_engine()
        if engine is None:
            signal.signal(signal.SIGTERM, previous)
            return
        with engine._prefect_sigterm_bridge_lock:
            if self._original is not None:
                engine._prefect_sigterm_handler = self._original
                self._original = None
            signal.signal(signal.SIGTERM, previous)


def _prefect_engine() -> Any:
    """``prefect.utilities.engine`` when it has the SIGTERM bridge's names, else None."""
    try:
        from prefect.utilities import engine
    except ImportError:  # pragma: no cover - Prefect is a dependency of this package
        return None
    names = ("_prefect_sigterm_bridge_lock", "_prefect_sigterm_handler")
    return engine if all(hasattr(engine, name) for name in names) else None


_bridge = _Bridge()


def wait_all(futures: Sequence[PrefectFuture[Any]], stopping: Stopping) -> None:
    """Wait until every task run has resolved (their task processes stopped and joined), on
    any task runner: a thread pool's futures are ``concurrent.futures`` ones, Dask's
    ``distributed.Future`` and Ray's ``ObjectRef`` are not, so each is asked ``done()`` (or,
    wanting that, waited on with a timeout) between ticks."""
    pending = list(futures)
    while pending:
        stopping.tick()
        pending = [f for f in pending if not _resolved(f, 0.2)]
        if pending:
            time.sleep(0.2)
    stopping.tick()


def _resolved(future: PrefectFuture[Any], timeout: float) -> bool:
    """True once ``future``'s task run has resolved (finished in any state)."""
    wrapped = getattr(future, "wrapped_future", None)
    done = getattr(wrapped, "done", None)
    if callable(done):
        return bool(done())
    future.wait(timeout=timeout)  # no done(): waits up to ``timeout``
    return future.state.is_final()
