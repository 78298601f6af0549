"""Running one action's process under a stop request: what a task's ``onRun`` or
``onCheckpointResume`` and an environment's ``onEnter`` or ``onExit`` share.

``supervise`` waits for a started ``ActionProcess`` to end while it applies, as they come:
the stop state (``StopState``: the stop requests folded into one intent, ``force`` and the
earliest deadline), the action's ``timeout`` and the notify period of a notify-then-terminate
cancelation, shortened when it would outlast the stop deadline. It never reads the process's
output: the caller's ``on_lines`` does that (the stdout protocol, ``core._messages``). A
``Session`` runs its environments' actions through an ``ActionHost`` (the task that uses the
session), so a session depends on this module, not on the task's.

Behaviour follows openjd-sessions 0.14 (the reference): ``cancelation`` modes ``TERMINATE``
and ``NOTIFY_THEN_TERMINATE``, ``cancel_info.json`` with ``NotifyEnd``, action timeouts; what
CHECKPOINT adds (seed 000, "Semantics"): the two stop intents, ``checkpointCancelation`` for
the preserving one.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from openjd.model import FormatStringError, SymbolTable

from core._records import InterruptionCause
from core.job import ActionCheckpointSpec, CancelMethod
from core.process import ActionProcess

__all__ = (
    "STOP_KILL_MARGIN_SECONDS",
    "ActionHost",
    "StopIntent",
    "StopState",
    "method_for",
    "resolve_method",
    "supervise",
    "write_cancel_info",
)

STOP_KILL_MARGIN_SECONDS = 0.5
"""How long before a stop deadline the task's processes are killed, in seconds: the time a
SIGKILL of the tree and the last store write take."""


class StopIntent(str, Enum):
    """Why a running task is asked to stop (seed 000, "Semantics")."""

    CANCEL = "cancel"
    """Abandon the work: the action's ``cancelation`` method."""
    CHECKPOINT = "checkpoint"
    """Preserve the work to resume later: ``checkpointCancelation`` (else ``cancelation``)."""


class StopState:
    """The stop requests a task got so far, folded into one: changed from any thread, read by
    the thread running the action.

    ``CANCEL`` after ``CHECKPOINT`` turns the stop into a cancelation; ``CHECKPOINT`` after
    ``CANCEL`` changes nothing; ``force`` once given stays; the earliest deadline wins."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.intent: StopIntent | None = None
        self.force = False
        self.deadline: float | None = None
        """Seconds since the epoch by which every process must be gone, or None."""
        self.declared_done: str | None = None
        """Why the scheduler's user declared the task done (Airflow's "mark success"), or None:
        the task's end record then says finished, written under its lease."""
        self.cause: InterruptionCause | None = None
        """What asked first (the metrics' interruption cause), or None while not stopped."""
        self.requested_at: float | None = None
        """When the first request came (seconds since the epoch), or None."""

    def request(
        self,
        intent: StopIntent,
        *,
        force: bool = False,
        deadline: float | None = None,
        declared_done: str | None = None,
        cause: InterruptionCause = InterruptionCause.STOP,
    ) -> None:
        """Fold one more request in (see the class); the first request's time stays, and its
        ``cause`` unless it was a plain ``stop`` (what a caller says before it knows better:
        Airflow's ``on_kill`` before Airflow says the worker is shutting down) and a later one
        names another. Returns at once."""
        with self._lock:
            if self.requested_at is None:
                self.requested_at = time.time()
            if self.cause in (None, InterruptionCause.STOP):  # a plain stop gives way
                self.cause = InterruptionCause(cause)
            if self.intent is None or intent == StopIntent.CANCEL:
                self.intent = intent
            if declared_done is not None:
                self.declared_done = declared_done
            self.force = self.force or force
            if deadline is not None:
                self.deadline = deadline if self.deadline is None else min(self.deadline, deadline)

    def wanted(self, stoppable: bool) -> tuple[StopIntent | None, bool, float | None]:
        """(intent, force, deadline) as they apply to an action: a ``stoppable`` one gets the
        request as it is; an ``onExit`` runs even when the task is stopped, unless the stop is
        forced (then it is canceled at once), and its deadline holds."""
        with self._lock:
            if stoppable:
                return self.intent, self.force, self.deadline
            if self.force:
                return StopIntent.CANCEL, True, self.deadline
            return None, False, self.deadline

    def deadline_due(self) -> bool:
        """True once the deadline is ``STOP_KILL_MARGIN_SECONDS`` away or past: what still runs
        is killed now."""
        deadline = self.deadline
        return deadline is not None and time.time() >= deadline - STOP_KILL_MARGIN_SECONDS

    def ends_on_exit(self) -> bool:
        """True once the stop ends an ``onExit`` too, which a plain stop lets run to its end:
        it is forced, or its deadline is due. An ``onExit`` that ends unsuccessfully then was
        killed by the stop, not failed by itself."""
        return self.force or self.deadline_due()


class _Spec(Protocol):
    @property
    def step_name(self) -> str: ...


class ActionHost(Protocol):
    """What a ``Session`` needs of the task that uses it: its stop request and a way to run an
    environment's action (with the task's output handling and store). ``TaskExecution``."""

    @property
    def spec(self) -> _Spec: ...

    @property
    def stop_state(self) -> StopState: ...

    def stop(
        self, intent: StopIntent, *, force: bool = False, deadline: float | None = None
    ) -> None: ...

    def run_environment_action(
        self,
        env_model: Any,
        path: str,
        which: str,
        symtab: SymbolTable,
        env: dict[str, str],
        *,
        marker: str,
    ) -> tuple[int, str]: ...


def resolve_method(
    method: CancelMethod, symtab: SymbolTable, extensions: list[str] | None = None
) -> CancelMethod:
    """The method with a format-string ``notifyPeriodInSeconds`` (FEATURE_BUNDLE_1, and EXPR
    expressions when the template declares EXPR) resolved, clamped to 1..600 seconds; the
    default period stands when it does not resolve to a number."""
    if method.notify_period_text is None:
        return method
    from openjd.model._format_strings import FormatString
    from openjd.model.v2023_09 import ModelParsingContext

    try:
        context = ModelParsingContext(supported_extensions=extensions or ["FEATURE_BUNDLE_1"])
        text = FormatString(method.notify_period_text, context=context).resolve(symtab=symtab)
        seconds = float(text)
    except (FormatStringError, ValueError, TypeError):
        return method  # the default period stands
    return dataclasses.replace(method, notify_period_seconds=min(max(seconds, 1.0), 600.0))


def method_for(spec: ActionCheckpointSpec, intent: StopIntent) -> CancelMethod:
    """The cancelation method a stop with ``intent`` uses: ``checkpointCancelation`` for
    ``CHECKPOINT`` when the action has one, else ``cancelation``."""
    if intent == StopIntent.CHECKPOINT and spec.checkpoint_cancelation is not None:
        return spec.checkpoint_cancelation
    return spec.cancelation


def write_cancel_info(session_dir: str, method: CancelMethod) -> None:
    """``cancel_info.json`` in the session working directory: ``{"NotifyEnd": <UTC time>}``,
    when the notify period ends (as openjd-sessions writes it). Best effort."""
    end = _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(seconds=method.notify_period_seconds)
    try:
        with open(os.path.join(session_dir, "cancel_info.json"), "w", encoding="utf-8") as fh:
            json.dump({"NotifyEnd": end.strftime("%Y-%m-%dT%H:%M:%SZ")}, fh)
    except OSError:
        pass


def supervise(
    proc: ActionProcess,
    *,
    path: str,
    spec: ActionCheckpointSpec,
    symtab: SymbolTable,
    extensions: list[str],
    stop: StopState,
    stoppable: bool,
    timeout: int | None,
    session_dir: str,
    warn: Callable[[str], None],
) -> bool:
    """Wait for the started ``proc`` to end, applying the stop request, the action's
    ``timeout`` (seconds) and notify periods as they come. Returns True when the action timed
    out. The caller then collects the process (``proc.finish``).

    Args:
        path: the action's place in the template, for warnings
            (``steps[0].script.actions.onRun``).
        spec: its cancelation methods (``CheckpointJobTemplate.action_spec``).
        stoppable: False for an ``onExit``, which a stop does not end unless forced.
        warn: called with each warning (a shortened notify period, a time-out).
    """
    started = time.monotonic()
    timed_out = False
    deadline: float | None = None  # monotonic: when the current notify period ends
    handled: tuple[StopIntent | None, bool, float | None] = (None, False, None)
    while True:
        if proc.wait_exit(0.05):
            # The main process is gone. While a notify period runs, the rest of its group
            # (a worker behind `bash -c`) may still be saving its checkpoint: wait for it.
            if deadline is None or not proc.group_alive():
                return timed_out
            time.sleep(0.05)
        now = time.monotonic()
        want = stop.wanted(stoppable)
        stop_deadline = want[2]
        if want != handled and want[0] is not None:
            handled = want
            method = resolve_method(method_for(spec, want[0]), symtab, extensions)
            period = method.notify_period_seconds
            if stop_deadline is not None and method.notifies:
                left = stop_deadline - time.time() - STOP_KILL_MARGIN_SECONDS
                if period > left:
                    warn(
                        f"{path}: notifyPeriodInSeconds {period:g} s would outlast the stop "
                        f"deadline, {max(0.0, left + STOP_KILL_MARGIN_SECONDS):.1f} s from "
                        f"now; notifying for {max(0.0, left):.1f} s, then killing"
                    )
                    period = max(0.0, left)
            if want[1] or not method.notifies or period <= 0:
                proc.kill_tree()
            else:
                write_cancel_info(
                    session_dir, dataclasses.replace(method, notify_period_seconds=period)
                )
                proc.notify(method.signal_to_notify)
                end = now + period
                deadline = end if deadline is None else min(deadline, end)
        elif stop.deadline_due():
            proc.kill_tree()  # an onExit, or a notify begun before the deadline came
        if timeout is not None and not timed_out and now - started > timeout and want[0] is None:
            timed_out = True
            method = resolve_method(spec.cancelation, symtab, extensions)
            warn(f"{path}: timed out after {timeout:g} s")
            if method.notifies:
                write_cancel_info(session_dir, method)
                proc.notify(method.signal_to_notify)
                deadline = now + method.notify_period_seconds
            else:
                proc.kill_tree()
        if deadline is not None and now >= deadline:
            proc.kill_tree()
            deadline = None
