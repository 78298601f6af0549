"""A task's attempt history and timeline (``core.task._history``, ``core.report.task_timeline``): a
task
suspended twice and resumed has one span per attempt, each resume saves the work up to its
checkpoint, and the text timeline (the Prefect artifact's, a log's) shows it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from conftest import DATA, CliProcess, checkpoint_at_least

import core
from core import CheckpointStore
from core._records import AttemptSpan, TaskStatus
from core.task._history import MAX_SPANS


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

    timeline = core.report.task_timeline(rec, st.list_generations(rec))
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
    lines = core.report.timeline_text(timeline, width=30)
    assert len(lines) == 2
    assert lines[0].startswith("#1 █") and "from the top; interrupted" in lines[0]
    assert f"resumed from {second.resumed_from}, saved" in lines[1] and "▲" in lines[1]


def test_the_history_is_bounded_and_an_open_span_is_cut_off() -> None:
    rec = core.TaskRecord(job_key="0" * 16, run_id="r", step="S", task_key="{}", parameters={})
    from core.task._history import close_span, open_span

    for n in range(MAX_SPANS + 5):
        rec.attempt = n + 1
        open_span(rec, None)
        if n != MAX_SPANS + 3:  # this attempt's process "died": never closed
            rec.status = TaskStatus.FAILED
            close_span(rec)
    assert len(rec.history) == MAX_SPANS and rec.history[0].attempt == 6
    rec.updated_at = time.time() + 5
    timeline = core.report.task_timeline(rec)
    cut = timeline.attempts[-2]
    assert not cut.ended and cut.outcome is None
    assert cut.end == timeline.attempts[-1].start  # cut off where the next attempt starts
    assert "running or cut off" in core.report.timeline_text(timeline)[-2]


def test_a_record_with_times_that_are_not_times_draws_what_it_can_and_says_what_not(
    tmp_path: Path,
) -> None:
    """A task record edited or damaged by hand (NaN, infinite, far-past or far-future times, an
    end before its start, thousands of attempts and generations): the timeline leaves out what
    it cannot place, says so naming the field, and draws nothing outside its axis; reading it
    changes no stored file."""
    import json
    import math
    import re

    from core.job import KeptCollector
    from core.job._summary import MAX_TIMELINE_ATTEMPTS, MAX_TIMELINE_CHECKPOINTS
    from core.store._layout import task_id_for

    st = CheckpointStore(tmp_path / "store")
    jk, now = "0" * 16, time.time()
    st.write_run(core.RunRecord(job_key=jk, run_id="r1", job_name="J", template_hash="h"))
    rec = core.TaskRecord(job_key=jk, run_id="r1", step="S", task_key="{}", parameters={})
    rec.checkpoint = core.CheckpointData(generation=2, saved_at=now - 5, attempt=2, state="s")
    st.write_task(rec)
    tdir = tmp_path / "store" / "jobs" / jk / "runs" / "r1" / "tasks"
    path = tdir / f"{task_id_for('S', '{}')}.json"
    raw = json.loads(path.read_text())
    raw["updated_at"] = float("nan")
    raw["history"] = [
        {"attempt": 1, "started_at": float("nan"), "ended_at": now - 50},
        {"attempt": 2, "started_at": now - 40, "ended_at": float("inf")},
        {"attempt": 3, "started_at": -1e12, "ended_at": -1e11},
        {"attempt": 4, "started_at": now + 1e12},
        {"attempt": 5, "started_at": now - 30, "ended_at": now - 35, "outcome": "failed"},
        {"attempt": 6, "started_at": now - 20, "resumed_from": 2,
         "resumed_saved_at": float("nan")},
    ]  # fmt: skip
    path.write_text(json.dumps(raw))  # Python's json writes NaN and Infinity, and reads them
    gen = tdir / f"{task_id_for('S', '{}')}.gen-1.json"
    gen.write_text(json.dumps({"generation": 1, "saved_at": float("-inf"), "attempt": 1}))
    before = {p.name: p.read_bytes() for p in tdir.iterdir()}

    [back] = st.read_tasks(jk, "r1")[0]
    timeline = core.report.task_timeline(back, st.list_generations(back))
    assert [b.attempt for b in timeline.attempts] == [5, 6]
    problems = "\n".join(timeline.problems)
    for what in (
        "history[0] (attempt 1): started_at nan",
        "history[1] (attempt 2): ended_at inf",
        "history[2] (attempt 3): started_at -1000000000000.0 and ended_at -100000000000.0",
        "history[3] (attempt 4): started_at",
        "checkpoint generation 1: saved_at -inf",
    ):
        assert what in problems, problems
    assert len(timeline.problems) == 5
    assert [c.generation for c in timeline.checkpoints] == [2]
    assert all(math.isfinite(v) for v in (timeline.start, timeline.end, timeline.saved_seconds))
    for bar in timeline.attempts:  # an end before its start: a bar of no width, not negative
        assert 0.0 <= timeline.fraction(bar.start) <= timeline.fraction(bar.end) <= 1.0
    assert timeline.attempts[0].end == timeline.attempts[0].start
    assert timeline.attempts[1].saved_seconds >= 0  # resumed_saved_at NaN: the mark's time used
    lines = core.report.timeline_text(timeline, width=20)
    assert len(lines) == 2 and all(re.match(r"#\d [ ·█▲|?]{20}  \w", line) for line in lines)
    assert "nan" not in " ".join(lines).lower() and "None" not in " ".join(lines)
    assert core.report.utc_moment(float("nan")) is None and core.report.utc_moment(-1.0) is None
    assert core.report.utc_moment(now + 1e12) is None and core.report.utc_moment(0.0) is not None
    collector = KeptCollector()  # a succeeded run's summary: no NaN in it either
    collector.add(back)
    assert math.isfinite(collector.result({}, at=now).saved_seconds)
    assert {p.name: p.read_bytes() for p in tdir.iterdir()} == before  # nothing rewritten

    # thousands of attempts and generations: the latest drawn, the rest said
    many = core.TaskRecord(job_key=jk, run_id="r1", step="S", task_key="{}", parameters={})
    many.history = [
        AttemptSpan(attempt=n, started_at=now + n, ended_at=now + n + 0.5) for n in range(1, 1001)
    ]
    gens = [
        core.CheckpointData(generation=n, saved_at=now + n / 10, attempt=1) for n in range(1, 10001)
    ]
    timeline = core.report.task_timeline(many, gens)
    assert len(timeline.attempts) == MAX_TIMELINE_ATTEMPTS and timeline.attempts[-1].attempt == 1000
    assert len(timeline.checkpoints) == MAX_TIMELINE_CHECKPOINTS
    assert timeline.checkpoints[-1].generation == 10000
    assert "1000 attempts" in timeline.problems[0] and "10000 checkpoint" in timeline.problems[1]
