"""How a group of tasks run by ``run_tasks`` ends for its framework (``core.classify_group``,
once for Airflow and Prefect), and the caller's handle that stops the group
(``core.GroupStop``): before its first task, between two tasks, during a task, declared done."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from conftest import DATA

from core import (
    CheckpointStore,
    GroupEnd,
    GroupStop,
    Notice,
    ResumeRefusedError,
    RunError,
    StopIntent,
    TaskEventKind,
    TaskOutcome,
    TaskResult,
    begin_attempt,
    classify_group,
    plan_tasks,
    prepare_job,
    run_tasks,
)
from core.job import TaskFeed, new_task_record
from core.run import StopRequest, TaskExecutor
from core.task import RefusalCode

THREE = DATA / "three_steps.yaml"


# --- classify_group: every kind ------------------------------------------------------------
@pytest.fixture
def render(tmp_path: Path):
    """The job and the three ``Render`` tasks of ``three_steps.yaml``, and a result maker."""
    job = prepare_job(THREE, {"Out": str(tmp_path)})
    specs = plan_tasks(job, "Render")

    def result(spec, outcome: TaskOutcome, message: str = "", exit_code: int | None = None):
        rec = new_task_record(job, spec, "run-1", message=message or None)
        return TaskResult(outcome, exit_code, message, rec)

    return specs, result


def test_the_outcomes_a_stop_ended() -> None:
    assert {o for o in TaskOutcome if o.stopped} == {
        TaskOutcome.CANCELED,
        TaskOutcome.INTERRUPTED,
        TaskOutcome.INTERRUPTED_WITH_CHECKPOINT,
    }


def test_every_task_succeeded_or_none_left_is_success(render) -> None:
    specs, result = render
    verdict = classify_group(specs, [result(s, TaskOutcome.SUCCEEDED) for s in specs])
    assert (verdict.kind, verdict.message, verdict.tasks) == (GroupEnd.SUCCEEDED, "", ())
    assert classify_group([], []).kind == GroupEnd.SUCCEEDED
    assert not GroupEnd.SUCCEEDED.retry


def test_a_failed_or_not_stored_task_fails_and_is_retried_naming_each(render) -> None:
    specs, result = render
    results = [
        result(specs[0], TaskOutcome.SUCCEEDED),
        result(specs[1], TaskOutcome.FAILED, "exited with code: 2", 2),
        result(specs[2], TaskOutcome.NOT_STORED),
    ]
    verdict = classify_group(specs, results)
    assert verdict.kind == GroupEnd.FAILED and verdict.kind.retry
    assert verdict.tasks == (
        "Render[Frame=3-4]: exited with code: 2 (exit code 2)",
        "Render[Frame=5-6]: failed",
    )
    assert verdict.message == "; ".join(verdict.tasks)


def test_a_stop_of_the_run_fails_without_retry_and_says_what_each_task_kept(render) -> None:
    specs, result = render
    results = [
        result(specs[0], TaskOutcome.SUCCEEDED),
        result(specs[1], TaskOutcome.CANCELED),
        result(specs[2], TaskOutcome.SKIPPED, "not started: the run is stopping (Cancelled)"),
    ]
    verdict = classify_group(specs, results)
    assert verdict.kind == GroupEnd.STOPPED and not verdict.kind.retry
    assert verdict.tasks == (
        "Render[Frame=3-4]: canceled",
        "Render[Frame=5-6]: not started: the run is stopping (Cancelled)",
    )
    assert verdict.message == "stopped by the run's termination request: " + "; ".join(
        verdict.tasks
    )
    # Tasks left not started after others ran are stopped too: the unit must not succeed,
    # or Airflow's "clear the failed tasks" would never run them.
    partial = [results[0], results[2], results[2]]
    assert classify_group(specs, partial).kind == GroupEnd.STOPPED


def test_no_task_started_because_the_run_is_stopping_is_skipped(render) -> None:
    specs, result = render
    why = "not started: the run is stopping (Suspended)"
    verdict = classify_group(specs, [result(s, TaskOutcome.SKIPPED, why) for s in specs])
    assert verdict.kind == GroupEnd.SKIPPED and not verdict.kind.retry
    assert verdict.message == why
    assert verdict.tasks == tuple(f"{s.label}: {why}" for s in specs)


def test_a_stop_of_this_process_is_interrupted_and_its_retry_resumes(render) -> None:
    specs, result = render
    results = [result(s, TaskOutcome.INTERRUPTED_WITH_CHECKPOINT) for s in specs]
    notice = Notice("aws", "interruption", "spot reclaim", None)
    verdict = classify_group(specs, results, notice=notice, next_try="the next try")
    assert verdict.kind == GroupEnd.INTERRUPTED and verdict.kind.retry
    assert verdict.message == (
        f"stopped by an interruption notice ({notice.describe()}); what the tasks reported is "
        "stored: the next try resumes from it"
    )
    # The framework's own stop wins over a notice, and over failed tasks.
    results[0] = result(specs[0], TaskOutcome.FAILED, "boom")
    verdict = classify_group(specs, results, notice=notice, stopped_by="on_kill (timeout)")
    assert verdict.kind == GroupEnd.INTERRUPTED
    assert verdict.message == (
        "stopped by on_kill (timeout); what the tasks reported is stored: a retry resumes from it"
    )


def test_an_error_of_run_tasks_is_refused_for_a_run_error_else_retried(render) -> None:
    specs, _ = render
    ended = classify_group(specs, [], error=RunError("run r has ended (canceled)"))
    assert (ended.kind, ended.message) == (GroupEnd.REFUSED, "run r has ended (canceled)")
    assert not ended.kind.retry
    busy = ResumeRefusedError(RefusalCode.ALREADY_RESUMED, "another process runs it")
    verdict = classify_group(specs, [], error=busy)
    assert (verdict.kind, verdict.message) == (GroupEnd.FAILED, str(busy))
    verdict = classify_group(specs, [], error=OSError("disk full"))
    assert (verdict.kind, verdict.message) == (GroupEnd.FAILED, "OSError: disk full")


def test_declared_done_wins_over_everything(render) -> None:
    specs, result = render
    results = [result(s, TaskOutcome.CANCELED) for s in specs]
    verdict = classify_group(
        specs, results, error=OSError("x"), stopped_by="on_kill", declared_done="marked success"
    )
    assert (verdict.kind, verdict.message) == (GroupEnd.DECLARED_DONE, "marked success")
    assert not verdict.kind.retry


# --- GroupStop ------------------------------------------------------------------------------
def test_stop_requests_fold_as_a_task_executions_do() -> None:
    first = StopRequest(StopIntent.CHECKPOINT, deadline=200.0)
    folded = first.fold(StopRequest(StopIntent.CANCEL, deadline=100.0, declared_done="done"))
    assert folded == StopRequest(StopIntent.CANCEL, False, 100.0, "done")
    assert folded.fold(StopRequest(StopIntent.CHECKPOINT, force=True)) == StopRequest(
        StopIntent.CANCEL, True, 100.0, "done"
    )
    assert folded.describe() == "cancel, declared done (done)"


def _group(tmp_path: Path, frame_seconds: float):
    out = tmp_path / "out"
    out.mkdir()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": frame_seconds})
    attempt = begin_attempt(st, job, external_key="group-stop")
    return st, job, attempt.run_id, plan_tasks(job, "Render"), out


def test_a_stop_before_the_first_task_starts_none(tmp_path: Path) -> None:
    st, job, run_id, specs, out = _group(tmp_path, 0.01)
    handle = GroupStop()
    handle.stop(StopIntent.CHECKPOINT)
    started: list[str] = []
    results = run_tasks(
        st, job, run_id, specs, on_start=lambda ex: started.append(ex.spec.label), stop=handle
    )
    assert started == [] and list(out.iterdir()) == []
    assert [r.outcome for r in results] == [TaskOutcome.SKIPPED] * 3
    assert {r.message for r in results} == {"not started: the group was stopped (checkpoint)"}
    verdict = classify_group(specs, results, stopped_by="on_kill")
    assert verdict.kind == GroupEnd.INTERRUPTED


class _StopAtTake(TaskFeed):
    """The step's tasks; the stop comes as the executor takes the ``at``-th one (1-based): the
    task before it has ended (its session given back), none after it has started."""

    def __init__(self, specs, handle: GroupStop, at: int) -> None:
        super().__init__(specs)
        self._handle, self._at, self._taken = handle, at, 0

    def take(self):
        self._taken += 1
        if self._taken == self._at:
            self._handle.stop(StopIntent.CHECKPOINT)
        return super().take()


def test_a_stop_between_two_tasks_starts_no_more(tmp_path: Path) -> None:
    # The moment between two tasks is inside the executor: the first task's ENDED comes only
    # once its end is stored, and by then the next task may be running (its end write is off
    # the critical path, docs/decisions.md). The feed stops the group as the next is taken.
    st, job, run_id, specs, out = _group(tmp_path, 0.01)
    handle = GroupStop()
    run = st.read_run(job.job_key, run_id)
    with TaskExecutor(st, job, run_id, attempt=run.attempt, stop=handle) as executor:
        step = executor.run(_StopAtTake(specs, handle, at=2), job_status=run.job_status)
    assert [(s.label, r.outcome) for s, r in step.results] == [
        (specs[0].label, TaskOutcome.SUCCEEDED)
    ]
    assert [(s.label, why) for s, why in step.not_started] == [
        (spec.label, "not started: the group was stopped (checkpoint)") for spec in specs[1:]
    ]
    assert sorted(p.name for p in out.iterdir()) == ["frame-1", "frame-2"]
    handle.stop(StopIntent.CANCEL)  # after the call: nothing left to stop, no error


def test_a_stop_as_the_first_task_ends_interrupts_or_skips_the_next(tmp_path: Path) -> None:
    """Through ``run_tasks``: a stop on the first task's ENDED (its end stored) finds the next
    task not started (SKIPPED) or running (stopped and kept, INTERRUPTED...); the third is never
    started, and nothing of the first is undone."""
    st, job, run_id, specs, out = _group(tmp_path, 0.01)
    handle = GroupStop()

    def on_event(ex, event) -> None:
        if event.kind == TaskEventKind.ENDED and ex.spec == specs[0]:
            handle.stop(StopIntent.CHECKPOINT)

    results = run_tasks(st, job, run_id, specs, on_event=on_event, stop=handle)
    assert results[0].outcome == TaskOutcome.SUCCEEDED
    assert results[1].outcome in {
        TaskOutcome.SKIPPED,
        TaskOutcome.INTERRUPTED,
        TaskOutcome.INTERRUPTED_WITH_CHECKPOINT,
    }
    assert results[2].outcome == TaskOutcome.SKIPPED
    assert results[2].message == "not started: the group was stopped (checkpoint)"
    assert {"frame-1", "frame-2"} <= {p.name for p in out.iterdir()}
    assert "frame-5" not in {p.name for p in out.iterdir()}


def _stop_during_the_first_task(
    tmp_path: Path, **stop: object
) -> tuple[list[TaskResult], CheckpointStore, object, str, list]:
    st, job, run_id, specs, _ = _group(tmp_path, 2.0)
    handle = GroupStop()
    rendering = threading.Event()
    results: list[TaskResult] = []

    def on_output(ex, lines: list[str]) -> None:
        if any(line.startswith("RENDER-START") for line in lines):
            rendering.set()

    worker = threading.Thread(
        target=lambda: results.extend(
            run_tasks(st, job, run_id, specs, on_output=on_output, stop=handle)
        )
    )
    worker.start()
    assert rendering.wait(30), "the first task did not start"
    handle.stop(**stop)  # type: ignore[arg-type]
    worker.join(30)
    assert not worker.is_alive(), "the stop did not reach the running task"
    return results, st, job, run_id, specs


def test_a_stop_during_a_task_checkpoints_it_and_starts_no_more(tmp_path: Path) -> None:
    deadline = time.time() + 20
    results, st, job, run_id, specs = _stop_during_the_first_task(
        tmp_path, intent=StopIntent.CHECKPOINT, deadline=deadline
    )
    assert [r.outcome for r in results] == [
        TaskOutcome.INTERRUPTED_WITH_CHECKPOINT,
        TaskOutcome.SKIPPED,
        TaskOutcome.SKIPPED,
    ]
    assert results[0].record.checkpoint is not None
    assert results[1].message == "not started: the group was stopped (checkpoint)"


def test_a_group_declared_done_while_a_task_runs_ends_it_recorded_done(tmp_path: Path) -> None:
    results, st, job, run_id, specs = _stop_during_the_first_task(
        tmp_path, intent=StopIntent.CANCEL, declared_done="marked success in Airflow"
    )
    first = results[0]
    assert first.outcome == TaskOutcome.CANCELED
    assert first.message == "canceled; recorded as done (marked success in Airflow)"
    rec = st.read_task(job.job_key, run_id, specs[0].step_name, specs[0].task_key)
    assert rec is not None and rec.status.value == "succeeded"  # under its lease, at its end
    assert [r.outcome for r in results[1:]] == [TaskOutcome.SKIPPED] * 2
    assert results[1].message == (
        "not started: the group was stopped (cancel, declared done (marked success in Airflow))"
    )
    verdict = classify_group(specs, results, declared_done="marked success in Airflow")
    assert verdict.kind == GroupEnd.DECLARED_DONE


# --- findings of a hostile review --------------------------------------------------------------
def test_a_group_stopped_before_any_task_started_does_not_claim_anything_was_stored(
    render,
) -> None:
    specs, result = render
    why = "not started: the group was stopped (on_kill)"
    skipped = [result(s, TaskOutcome.SKIPPED, why) for s in specs]
    verdict = classify_group(specs, skipped, stopped_by="on_kill (timeout)")
    assert verdict.kind == GroupEnd.INTERRUPTED
    assert verdict.message == "stopped by on_kill (timeout); no task had started: a retry runs them"


def test_results_that_are_not_one_per_task_are_a_clear_error(render) -> None:
    specs, result = render
    with pytest.raises(ValueError, match=r"0 result\(s\) for 3 task\(s\)"):
        classify_group(specs, [])


def test_a_group_stop_refuses_what_is_not_a_stop(render) -> None:
    from core import GroupStop

    stop = GroupStop()
    with pytest.raises(ValueError):
        stop.stop("CANCEL")  # type: ignore[arg-type]  # the enum's value is "cancel"
    with pytest.raises(ValueError, match="not a finite time"):
        stop.stop(StopIntent.CANCEL, deadline=float("nan"))
    stop.stop("cancel")  # type: ignore[arg-type]  # the value itself is taken


def test_a_task_event_in_a_framework_log_says_the_same_words_everywhere() -> None:
    from core import TaskEventKind, report

    assert report.event_log_line("Render[Frame=1]", TaskEventKind.CHECKPOINT_SAVED, 7) == (
        False,
        "Render[Frame=1]: checkpoint generation 7 stored",
    )
    assert report.event_log_line("R", TaskEventKind.WARNING, "odd line") == (True, "R: odd line")
    assert report.event_log_line("R", TaskEventKind.PROGRESS, 50.0) is None


def test_interruptions_so_far_counts_notices_and_lost_workers_of_the_run_attempt() -> None:
    """Spans stopped by a notice, and spans left open and followed by another (a lost worker),
    of the run attempt asked; not stops, timeouts, successes, other attempts or a running one."""
    from core import InterruptionCause, TaskRecord, interruptions_so_far
    from core._records import AttemptSpan

    def span(run_attempt: int, cause: InterruptionCause | None, ended: bool = True) -> AttemptSpan:
        return AttemptSpan(attempt=1, run_attempt=run_attempt, started_at=1.0,
                           ended_at=2.0 if ended else None, cause=cause)  # fmt: skip

    rec = TaskRecord(job_key="0" * 16, run_id="r", step="S", task_key="{}", parameters={})
    rec.history = [
        span(1, InterruptionCause.NOTICE),
        span(1, None, ended=False),  # lost: another span follows
        span(1, InterruptionCause.STOP),
        span(1, InterruptionCause.TIMEOUT),
        span(2, InterruptionCause.NOTICE),
        span(1, None),
        span(1, None, ended=False),  # running: the last span
    ]
    assert interruptions_so_far([rec], 1) == 2
    assert interruptions_so_far([rec, rec], 1) == 4
    assert interruptions_so_far([rec], 2) == 1


def test_a_plain_stop_gives_way_to_the_cause_found_later_and_nothing_else_does() -> None:
    """Airflow's on_kill stops with a plain ``stop`` when Airflow has not said why in time, and
    again with ``notice`` once it says the worker is shutting down: the later cause is kept,
    in the handle's request and in the task's stop state; a named cause is never replaced."""
    from core import InterruptionCause, StopIntent
    from core.task._action import StopState

    first = StopRequest(StopIntent.CHECKPOINT)
    later = StopRequest(StopIntent.CHECKPOINT, cause=InterruptionCause.NOTICE)
    assert first.fold(later).cause == InterruptionCause.NOTICE
    assert later.fold(StopRequest(StopIntent.CANCEL)).cause == InterruptionCause.NOTICE
    timeout = StopRequest(StopIntent.CANCEL, cause=InterruptionCause.TIMEOUT)
    assert timeout.fold(later).cause == InterruptionCause.TIMEOUT

    state = StopState()
    state.request(StopIntent.CHECKPOINT)
    asked_at = state.requested_at
    state.request(StopIntent.CHECKPOINT, cause=InterruptionCause.NOTICE)
    assert state.cause == InterruptionCause.NOTICE and state.requested_at == asked_at
    state.request(StopIntent.CANCEL, cause=InterruptionCause.TIMEOUT)
    assert state.cause == InterruptionCause.NOTICE


def test_an_interruption_resumes_within_its_budget_counted_from_records_or_the_framework() -> None:
    from core import interruption_resumes

    assert interruption_resumes(3, 0, 10) == (3, True)  # the records count this one
    assert interruption_resumes(0, 4, 10) == (5, True)  # no span: the framework's count + 1
    assert interruption_resumes(10, 2, 10) == (10, True)
    assert interruption_resumes(11, 2, 10) == (11, False)
    assert interruption_resumes(0, 0, 0) == (1, False)
