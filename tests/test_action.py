"""The stop state one action runs under (``core.task._action.StopState``), on its own: how
requests from several threads fold into one (seed 000, "Semantics")."""

from __future__ import annotations

from core.task import StopIntent
from core.task._action import StopState


def test_cancel_after_checkpoint_cancels_and_checkpoint_after_cancel_changes_nothing() -> None:
    stop = StopState()
    assert stop.wanted(stoppable=True) == (None, False, None)
    stop.request(StopIntent.CHECKPOINT)
    assert stop.intent == StopIntent.CHECKPOINT
    stop.request(StopIntent.CANCEL)
    assert stop.intent == StopIntent.CANCEL
    stop.request(StopIntent.CHECKPOINT)
    assert stop.intent == StopIntent.CANCEL


def test_force_stays_and_the_earliest_deadline_wins() -> None:
    stop = StopState()
    stop.request(StopIntent.CHECKPOINT, deadline=200.0)
    stop.request(StopIntent.CHECKPOINT, deadline=100.0)
    stop.request(StopIntent.CHECKPOINT, deadline=300.0)
    assert stop.deadline == 100.0
    stop.request(StopIntent.CHECKPOINT, force=True)
    stop.request(StopIntent.CHECKPOINT)
    assert stop.force and stop.wanted(stoppable=True) == (StopIntent.CHECKPOINT, True, 100.0)


def test_an_on_exit_runs_through_a_stop_unless_it_is_forced() -> None:
    stop = StopState()
    stop.request(StopIntent.CANCEL, deadline=50.0)
    assert stop.wanted(stoppable=False) == (None, False, 50.0)  # its deadline still holds
    stop.request(StopIntent.CANCEL, force=True)
    assert stop.wanted(stoppable=False) == (StopIntent.CANCEL, True, 50.0)
