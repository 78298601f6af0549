"""A task's attempt history and timeline (``core._history``, ``core.task_timeline``): a task
suspended twice and resumed has one span per attempt, each resume saves the work up to its
checkpoint, and the text timeline (the Prefect artifact's, a log's) shows it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from conftest import DATA, CliProcess, checkpoint_at_least

import core
from core import CheckpointStore
from core._history import MAX_SPANS


def test_a_task_suspended_twice_has_a_span_per_attempt_and_a_timeline(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("run", str(DATA / "counter.yaml"), "--store", str(store), "-q")
    args += ("-p", "N=200", "-p", "StepSeconds=0.05")
    for target in (3, 8):
        cli = CliProcess(*args)
        checkpoint_at_least(store, target)
        cli.proc.send_signal(signal.SIGINT)
        assert cli.wait(60) == 75, cli.stderr  # suspended
    st = CheckpointStore(store)
    [run] = st.list_runs()[0]
    [rec] = st.read_tasks(run.job_key, run.run_id)[0]
    first, second = rec.history
    assert (first.attempt, first.resumed_from, first.outcome) == (1, None, "interrupted")
    assert second.attempt == 2 and second.outcome == "interrupted"
    assert second.resumed_from is not None and second.resumed_from >= 3
    assert first.ended_at is not None and first.ended_at <= second.started_at
    assert first.host == second.host == core.host_id()

    timeline = core.task_timeline(rec, st.list_generations(rec))
    bar1, bar2 = timeline.attempts
    assert bar1.saved_seconds == 0 and bar1.ended
    # the work kept: the first attempt's run up to the checkpoint the second resumed from
    assert second.resumed_saved_at is not None
    assert abs(bar2.saved_seconds - (second.resumed_saved_at - bar1.start)) < 0.01
    assert bar2.saved_seconds > 0.1
    assert [c.generation for c in timeline.checkpoints] == sorted(
        c.generation for c in timeline.checkpoints
    )
    assert len(timeline.checkpoints) == 3  # the generations the store keeps
    assert timeline.fraction(timeline.start) == 0.0 and timeline.fraction(timeline.end) == 1.0
    lines = core.timeline_text(timeline, width=30)
    assert len(lines) == 2
    assert lines[0].startswith("#1 █") and "from the top; interrupted" in lines[0]
    assert f"resumed from {second.resumed_from}, saved" in lines[1] and "▲" in lines[1]


def test_the_history_is_bounded_and_an_open_span_is_cut_off() -> None:
    rec = core.TaskRecord(job_key="0" * 16, run_id="r", step="S", task_key="{}", parameters={})
    from core._history import close_span, open_span

    for n in range(MAX_SPANS + 5):
        rec.attempt = n + 1
        open_span(rec, None)
        if n != MAX_SPANS + 3:  # this attempt's process "died": never closed
            rec.status = core.TaskStatus.FAILED
            close_span(rec)
    assert len(rec.history) == MAX_SPANS and rec.history[0].attempt == 6
    rec.updated_at = time.time() + 5
    timeline = core.task_timeline(rec)
    cut = timeline.attempts[-2]
    assert not cut.ended and cut.outcome is None
    assert cut.end == timeline.attempts[-1].start  # cut off where the next attempt starts
    assert "running or cut off" in core.timeline_text(timeline)[-2]
