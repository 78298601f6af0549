"""core.StopEscalation: the one policy by which a runner's signals stop a run (the CLI's Ctrl-C,
a Prefect flow run's SIGTERM), on plain calls: no process, no signal sent."""

from __future__ import annotations

import signal
import time

from core import StopEscalation, TerminationMode


def test_nothing_is_due_without_a_signal() -> None:
    esc = StopEscalation(escalate_after=0.0)
    assert esc.due() == []
    assert esc.signalled_at is None


def test_first_signal_suspends_without_a_deadline_by_default() -> None:
    esc = StopEscalation()
    esc.signalled(signal.SIGTERM, at=100.0)
    [step] = esc.due()
    assert (step.mode, step.force, step.deadline, step.first) == (
        TerminationMode.SUSPENDED,
        False,
        None,
        True,
    )
    assert step.signal_name == "SIGTERM"
    assert esc.signalled_at == 100.0
    assert esc.due() == []  # each request once


def test_first_signal_takes_the_runners_mode_and_deadline() -> None:
    esc = StopEscalation(mode=TerminationMode.CANCELLED_RUN_FINALLY, deadline_seconds=24.0)
    esc.signalled(signal.SIGTERM, at=1000.0)
    [step] = esc.due(lambda: TerminationMode.STOPPED_RUN_FINALLY)
    assert step.mode == TerminationMode.STOPPED_RUN_FINALLY
    assert step.deadline == 1024.0


def test_mode_now_that_says_nothing_or_fails_falls_back_to_the_default() -> None:
    esc = StopEscalation(mode=TerminationMode.CANCELLED)
    esc.signalled(signal.SIGTERM)
    assert esc.due(lambda: None)[0].mode == TerminationMode.CANCELLED

    def unreachable() -> TerminationMode:
        raise ConnectionError("API down")

    esc2 = StopEscalation()
    esc2.signalled(signal.SIGTERM)
    assert esc2.due(unreachable)[0].mode == TerminationMode.SUSPENDED


def test_second_ctrl_c_kills_at_once() -> None:
    esc = StopEscalation()
    esc.signalled(signal.SIGINT)
    esc.signalled(signal.SIGINT)
    first, kill = esc.due()
    assert first.first and first.mode == TerminationMode.SUSPENDED
    assert (kill.mode, kill.force, kill.first) == (TerminationMode.CANCELLED, True, False)
    esc.signalled(signal.SIGINT)
    assert esc.due() == []  # killed once; nothing more to ask


def test_second_sigterm_does_not_kill_but_a_third_signal_does() -> None:
    esc = StopEscalation()
    esc.signalled(signal.SIGTERM)
    esc.signalled(signal.SIGTERM)
    assert [s.first for s in esc.due()] == [True]
    esc.signalled(signal.SIGHUP)
    [kill] = esc.due()
    assert (kill.mode, kill.force, kill.signal_name) == (TerminationMode.CANCELLED, True, "SIGHUP")


def test_what_still_runs_after_escalate_after_is_killed() -> None:
    esc = StopEscalation(deadline_seconds=24.0, escalate_after=25.0)
    now = time.time()
    esc.signalled(signal.SIGTERM, at=now)
    assert [s.first for s in esc.due()] == [True]
    assert esc.due() == []  # not yet
    esc2 = StopEscalation(deadline_seconds=24.0, escalate_after=25.0)
    esc2.signalled(signal.SIGTERM, at=now - 26.0)
    first, kill = esc2.due()
    assert first.deadline == now - 2.0
    assert (kill.mode, kill.force, kill.signum) == (TerminationMode.CANCELLED, True, None)
    assert kill.signal_name == "timeout"
    assert kill.deadline is not None and kill.deadline > now
