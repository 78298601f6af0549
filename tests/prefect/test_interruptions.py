"""Interruptions that do not use retries, and the events automations act on, against the
session's real Prefect server (issue 39).

- A task run whose host gives interruption notices (a notice file, ``file:`` source) resumes
  by retries counted against ``interruption_retries``, not ``task_retries``: with
  ``task_retries=0`` it survives three notices; past ``interruption_retries`` it fails; a task
  that fails still fails after its ``task_retries``, whatever the interruption budget.
- The ``openjd.checkpoint.stored`` and ``openjd.task.interrupted`` events, read back from the
  server's events API, carry the figures the task's records say, related to the flow run and
  the task run.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import prefect_helpers as ph

from core import CheckpointStore, TaskRecord
from prefect_integration import flow_from_template

REPO = Path(__file__).resolve().parents[2]
COUNTER = REPO / "tests" / "data" / "counter.yaml"


def _count_record(store: CheckpointStore) -> TaskRecord | None:
    runs, _ = store.list_runs()
    for run in runs:
        tasks, _ = store.read_tasks(run.job_key, run.run_id)
        for rec in tasks:
            if rec.step == "Count":
                return rec
    return None


def _wait_record(
    store: CheckpointStore, ok: Callable[[TaskRecord], bool], timeout: float = 60
) -> TaskRecord:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rec = _count_record(store)
        if rec is not None and ok(rec):
            return rec
        time.sleep(0.05)
    raise AssertionError(f"the Count task record never got there: {_count_record(store)!r}")


def _stored_in_attempt(k: int) -> Callable[[TaskRecord], bool]:
    """The task's k-th attempt runs and has stored a checkpoint."""

    def ok(rec: TaskRecord) -> bool:
        if len(rec.history) != k:
            return False
        span = rec.history[-1]
        return span.ended_at is None and span.saved_at is not None

    return ok


def _notify(notice: Path, times: int, store: CheckpointStore, errors: list[BaseException]) -> None:
    """Write the notice file once into each of the task's first ``times`` attempts, once that
    attempt has stored a checkpoint (so each notice interrupts a running attempt)."""
    try:
        for k in range(1, times + 1):
            _wait_record(store, _stored_in_attempt(k))
            notice.write_text(f"{time.time() + 60}\n")
    except BaseException as exc:  # seen by the test
        errors.append(exc)


def _messages(flow_run_id: Any, contains: str) -> list[str]:
    return [log.message for log in ph.wait_for_logs(flow_run_id, contains)]


def test_three_notices_use_no_task_retry_and_the_task_run_finishes(tmp_path: Path) -> None:
    """``task_retries=0`` (the default) and three notices, each while the task runs with a
    checkpoint: the task run retries three times, each counted as an interruption, resumes
    each time from its checkpoint, and completes with the right sum."""
    notice = tmp_path / "notice"
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(
        COUNTER,
        store=store.location,
        interruption_notices=f"file:{notice}",
        notice_poll_seconds=0.2,
    )
    errors: list[BaseException] = []
    notifier = threading.Thread(target=_notify, args=(notice, 3, store, errors))
    notifier.start()
    try:
        state = flow(N=40, StepSeconds=0.1, SaveEvery=2, return_state=True)
    finally:
        notifier.join()
    assert not errors, errors
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [count] = ph.task_runs(flow_run_id)
    assert count.run_count == 4, count
    messages = _messages(flow_run_id, "COUNTER-DONE")
    assert any("COUNTER-DONE n=40 sum=820" in m for m in messages), messages
    starts = [int(m.split("from=")[1]) for m in messages if "COUNTER-START" in m]
    assert len(starts) == 4 and starts[0] == 0 and all(s > 0 for s in starts[1:]), starts
    for k in (1, 2, 3):
        said = [m for m in messages if f"interruption {k} of the 10 it resumes from" in m]
        assert said and "keeps its 0 error retries" in said[0], messages
    (run,), _ = store.list_runs()
    assert run.kept is not None
    [kept] = run.kept.tasks
    assert [span.cause for span in kept.history] == ["notice", "notice", "notice", None]


def test_more_interruptions_than_interruption_retries_fail_the_task_run(tmp_path: Path) -> None:
    """``interruption_retries=1``, two notices: the first is resumed, the second fails the task
    run (its checkpoint kept), and the log says why."""
    notice = tmp_path / "notice"
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(
        COUNTER,
        store=store.location,
        task_retries=2,
        interruption_retries=1,
        interruption_notices=f"file:{notice}",
        notice_poll_seconds=0.2,
    )
    errors: list[BaseException] = []
    notifier = threading.Thread(target=_notify, args=(notice, 2, store, errors))
    notifier.start()
    try:
        state = flow(N=40, StepSeconds=0.1, SaveEvery=2, return_state=True)
    finally:
        notifier.join()
    assert not errors, errors
    assert state.is_failed(), state
    flow_run_id = state.state_details.flow_run_id
    [count] = ph.task_runs(flow_run_id)
    assert count.run_count == 2, count  # the error retries (2) were not used for the notice
    assert count.state is not None and count.state.is_failed(), count.state
    messages = _messages(flow_run_id, "more than interruption_retries=1")
    assert any("interruption 1 of the 1 it resumes from" in m for m in messages), messages
    rec = _count_record(store)
    assert rec is not None and rec.checkpoint is not None  # kept for a later resume


FAILING = """\
specificationVersion: 'jobtemplate-2023-09'
name: Failing test job
steps:
- name: Fail
  script:
    actions:
      onRun: {command: python3, args: [-c, "print('FAILING-TRY'); raise SystemExit(3)"]}
"""


def test_an_error_still_fails_after_task_retries_with_an_interruption_budget(
    tmp_path: Path,
) -> None:
    """A task that exits 3: with ``task_retries=1`` and the default interruption budget (10),
    the task run runs twice and fails; the budget for interruptions is not spent on errors."""
    template = tmp_path / "failing.yaml"
    template.write_text(FAILING)
    flow = flow_from_template(template, store=tmp_path / "store", task_retries=1)
    state = flow(return_state=True)
    assert state.is_failed(), state
    flow_run_id = state.state_details.flow_run_id
    [fail] = ph.task_runs(flow_run_id)
    assert fail.run_count == 2, fail
    messages = _messages(flow_run_id, "no error retry left (task_retries=1)")
    assert any("error retry 1 of 1 (task_retries)" in m for m in messages), messages
    assert len([m for m in messages if "FAILING-TRY" in m]) == 2, messages


# --- events ---------------------------------------------------------------------------------------
def _events(run_id: str) -> list[dict[str, Any]]:
    body = {
        "filter": {
            "event": {"prefix": ["openjd."]},
            "resource": {"id_prefix": [f"openjd.run.{run_id}."]},
        },
        "limit": 50,
    }
    response = httpx.post(f"{ph.api_url()}/events/filter", json=body, timeout=10)
    response.raise_for_status()
    return list(response.json()["events"])


def _wait_events(run_id: str, done: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    end = time.monotonic() + 60  # the server stores events in batches, a few seconds apart
    events = _events(run_id)
    while not done(events) and time.monotonic() < end:
        time.sleep(0.5)
        events = _events(run_id)
    return events


def test_events_carry_the_figures_of_the_task_records(tmp_path: Path) -> None:
    """One notice at a known time: the server's events API returns one
    ``openjd.task.interrupted`` whose cause, work lost and stop-to-stored are those of the
    interrupted attempt in the task's record, and one ``openjd.checkpoint.stored`` per stored
    generation (1 to the last, none twice) whose bytes and commit duration are the stored
    checkpoint's; the stop reached the task within a notice poll period of the notice, and
    its checkpoint was stored within one more. Every event names the task in its core run and
    relates the flow run and the task run."""
    poll = 1.0
    notice = tmp_path / "notice"
    store = CheckpointStore(tmp_path / "store")
    flow = flow_from_template(
        COUNTER,
        store=store.location,
        interruption_notices=f"file:{notice}",
        notice_poll_seconds=poll,
    )
    seen: dict[str, Any] = {}

    def notify_and_read() -> None:
        try:
            _wait_record(store, lambda r: r.checkpoint is not None and r.checkpoint.generation >= 2)
            seen["notice_at"] = time.time()
            notice.write_text(f"{time.time() + 60}\n")
            seen["interrupted"] = _wait_record(store, lambda r: r.history[0].ended_at is not None)
        except BaseException as exc:
            seen["error"] = exc

    reader = threading.Thread(target=notify_and_read)
    reader.start()
    try:
        state = flow(N=30, StepSeconds=0.1, SaveEvery=3, return_state=True)
    finally:
        reader.join()
    assert "error" not in seen, seen["error"]
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    [count] = ph.task_runs(flow_run_id)
    (run,), _ = store.list_runs()
    assert run.kept is not None
    [kept] = run.kept.tasks
    last = max(cp.generation for cp in kept.checkpoints)

    def complete(events: list[dict[str, Any]]) -> bool:
        names = [e["event"] for e in events]
        gens = {e["payload"]["generation"] for e in events if e["event"].endswith(".stored")}
        return "openjd.task.interrupted" in names and gens >= set(range(1, last + 1))

    events = _wait_events(run.run_id, complete)
    assert complete(events), [(e["event"], e["payload"]) for e in events]
    for event in events:
        resource = event["resource"]
        assert resource["prefect.resource.id"] == f"openjd.run.{run.run_id}.task.Count", event
        assert resource["openjd.step"] == "Count" and resource["openjd.job.name"] == run.job_name
        related = {r["prefect.resource.id"]: r["prefect.resource.role"] for r in event["related"]}
        assert related[f"prefect.flow-run.{flow_run_id}"] == "flow-run", related
        assert related[f"prefect.task-run.{count.id}"] == "task-run", related
        assert related[f"openjd.run.{run.run_id}"] == "openjd-run", related

    # the interruption: the figures of the interrupted attempt in the task's record
    rec: TaskRecord = seen["interrupted"]
    span = rec.history[0]
    assert rec.checkpoint is not None and span.stopped_at is not None
    assert span.stored_after_stop_at is not None and span.ended_at is not None
    [interrupted] = [e for e in events if e["event"] == "openjd.task.interrupted"]
    payload = interrupted["payload"]
    assert payload["cause"] == span.cause == "notice", (payload, span)
    covered = max(span.started_at, span.saved_at or span.started_at)
    assert abs(payload["work_lost_seconds"] - (span.ended_at - covered)) < 1e-6, (payload, span)
    stop_to_stored = span.stored_after_stop_at - span.stopped_at
    assert abs(payload["stop_to_stored_seconds"] - stop_to_stored) < 1e-6, (payload, span)
    assert payload["generation"] == rec.checkpoint.generation and payload["attempt"] == 1
    assert seen["notice_at"] <= span.stopped_at <= seen["notice_at"] + poll + 1.0, (seen, span)
    assert 0 <= stop_to_stored <= poll, span

    # each stored checkpoint once; the one the stop stored is the record's checkpoint
    stored = [e["payload"] for e in events if e["event"] == "openjd.checkpoint.stored"]
    assert sorted(p["generation"] for p in stored) == list(range(1, last + 1)), stored
    [at_stop] = [p for p in stored if p["generation"] == rec.checkpoint.generation]
    assert at_stop["bytes"] == len((rec.checkpoint.state or "").encode()), (at_stop, rec)
    assert at_stop["commit_seconds"] == rec.checkpoint.commit_seconds, (at_stop, rec)
    assert at_stop["attempt"] == 1
    by_generation = {p["generation"]: p for p in stored}
    for cp in kept.checkpoints:  # the generations the run kept until its end
        assert by_generation[cp.generation]["bytes"] == cp.state_bytes, (cp, stored)
        assert by_generation[cp.generation]["attempt"] == cp_attempt(kept, cp.saved_at)
    assert all(p["commit_seconds"] is not None and p["commit_seconds"] >= 0 for p in stored)
    assert uuid.UUID(str(count.id))


def cp_attempt(kept: Any, saved_at: float) -> int:
    """The task attempt whose span covers ``saved_at``."""
    for span in kept.history:
        if span.started_at <= saved_at and (span.ended_at is None or saved_at <= span.ended_at):
            return int(span.attempt)
    raise AssertionError(f"no attempt of {kept!r} covers {saved_at}")
