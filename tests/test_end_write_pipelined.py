"""The durable end write of a task is off the session's critical path: the session's next task
starts while the end of the one before is being stored, and a task is reported ended
(``TaskEventKind.ENDED``, its result) only once its end is stored. A task that did not
succeed holds its session until its end is stored (the next may not start at all).

The store's fsyncs of task records are slowed (a sleep before the real fsync, as a disk
shared with other work makes them) so that the overlap is certain, not a race."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from core import CheckpointStore, TaskEventKind, TaskOutcome, begin_attempt, prepare_job, run_tasks
from core.job import plan_tasks
from core.job._template import parse_template

TEMPLATE = """\
specificationVersion: 'jobtemplate-2023-09'
name: Pipelined
steps:
- name: S
  parameterSpace:
    taskParameterDefinitions:
    - {name: F, type: INT, range: "1-3"}
  script:
    actions:
      onRun: {command: bash, args: ["-c", "%s"]}
"""
SLOW_FSYNC = 0.4
"""Seconds added to each fsync of a task record (its file or its folder)."""


@pytest.fixture
def slow_record_fsyncs(monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.fsync

    def fsync(fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if "/tasks" in path:
            time.sleep(SLOW_FSYNC)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _run(tmp_path: Path, command: str) -> tuple[list[tuple[str, str, float]], list, Path]:
    """Run the three tasks in one session; each task's STARTED and ENDED events, in order,
    with the time; the record file's status read as its ENDED event is given."""
    store = CheckpointStore(str(tmp_path / "store"))
    job = prepare_job(parse_template(yaml.safe_load(TEMPLATE % command)), {})
    run_id = begin_attempt(store, job).run_id
    events: list[tuple[str, str, float]] = []
    on_disk: dict[str, str] = {}
    lock = threading.Lock()
    tasks_dir = tmp_path / "store" / "jobs" / job.job_key / "runs" / run_id / "tasks"

    def on_event(execution, event) -> None:  # type: ignore[no-untyped-def]
        label = execution.spec.label
        if event.kind not in (TaskEventKind.STARTED, TaskEventKind.ENDED):
            return
        with lock:
            events.append((label, event.kind.value, time.monotonic()))
        if event.kind == TaskEventKind.ENDED:  # what a crash now would leave
            for path in tasks_dir.glob("*.json"):
                rec = json.loads(path.read_text())
                if rec.get("task_key") == execution.spec.task_key:
                    on_disk[label] = rec["status"]

    results = run_tasks(store, job, run_id, plan_tasks(job, "S"), on_event=on_event)
    return events, [results, on_disk], tasks_dir


def _at(events: list[tuple[str, str, float]], label: str, kind: str) -> float:
    return next(t for lab, k, t in events if lab == label and k == kind)


def test_the_next_task_starts_while_the_end_of_the_one_before_is_stored(
    tmp_path: Path, slow_record_fsyncs: None
) -> None:
    # the second runs 0.2 s, so that the two ends in flight are stored well apart (started
    # 6 ms apart, a loaded machine's scheduling could make them end together: CI saw 0.1 ms)
    events, (results, on_disk), _ = _run(tmp_path, "test {{Task.Param.F}} != 2 || sleep 0.2")
    assert [r.outcome for r in results] == [TaskOutcome.SUCCEEDED] * 3
    first, second, third = "S[F=1]", "S[F=2]", "S[F=3]"
    # the second started before the first was reported ended (its end was being stored) ...
    assert _at(events, second, "started") < _at(events, first, "ended"), events
    # the third starts once one of the two ends in flight is stored (two task threads per
    # session: backpressure), whichever ends first: still before the other was reported
    before = max(_at(events, first, "ended"), _at(events, second, "ended"))
    assert _at(events, third, "started") < before, events
    # ... and each was reported ended only with its end stored
    assert on_disk == {first: "succeeded", second: "succeeded", third: "succeeded"}
    # the end writes did not wait for each other's fsyncs in turn: the three tasks took less
    # than three whole end writes after one another would (each at least 2 slow fsyncs)
    took = _at(events, third, "ended") - _at(events, first, "started")
    assert took < 3 * 2 * SLOW_FSYNC + 2 * SLOW_FSYNC, events


def test_a_task_that_failed_holds_its_session_until_its_end_is_stored(
    tmp_path: Path, slow_record_fsyncs: None
) -> None:
    events, (results, on_disk), _ = _run(tmp_path, "test {{Task.Param.F}} != 1")
    assert [r.outcome for r in results] == [
        TaskOutcome.FAILED,
        TaskOutcome.SUCCEEDED,
        TaskOutcome.SUCCEEDED,
    ]
    # the failed task's end was stored and reported before the next task started
    assert _at(events, "S[F=1]", "ended") <= _at(events, "S[F=2]", "started"), events
    assert on_disk["S[F=1]"] == "failed"
