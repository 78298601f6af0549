"""What a page shows of a run once it has ended, from core (the Airflow plugin's page reads
these): the run record of a succeeded run keeps a summary of its checkpoints when they are
deleted (``RunRecord.kept``, ``core.report.kept_timeline``), the termination modes a request could
still act in (``core.termination_choices``), and a task's status in the CLI's words."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from conftest import DATA, CliProcess, checkpoint_at_least, cli_cmd

import core
from core import CheckpointStore, TerminationMode
from core.job import KeptCollector
from core.job._summary import MAX_KEPT_TASKS

S, C, R, CR = (
    TerminationMode.SUSPENDED,
    TerminationMode.CANCELLED,
    TerminationMode.STOPPED_RUN_FINALLY,
    TerminationMode.CANCELLED_RUN_FINALLY,
)


def test_a_succeeded_run_keeps_a_summary_of_the_checkpoints_it_deleted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    args = ("run", str(DATA / "counter.yaml"), "--store", str(store), "-q")
    args += ("-p", "N=60", "-p", "StepSeconds=0.05")
    cli = CliProcess(*args)
    checkpoint_at_least(store, 4)
    cli.proc.send_signal(signal.SIGINT)
    assert cli.wait(60) == 75, cli.stderr  # suspended
    st = CheckpointStore(store)
    [run] = st.list_runs()[0]
    assert run.kept is None  # only a succeeded run: a suspended one keeps its records
    [before] = st.read_tasks(run.job_key, run.run_id)[0]
    stored_before = [g.generation for g in st.list_generations(before)]

    again = CliProcess(*args)
    assert again.wait(120) == 0, again.stderr
    run = st.read_run(run.job_key, run.run_id)
    assert run is not None and run.status == core.RunStatus.SUCCEEDED
    assert st.read_tasks(run.job_key, run.run_id)[0] == []  # deleted at the end
    kept = run.kept
    assert kept is not None and kept.at >= run.created_at
    assert (kept.task_count, kept.tasks_with_checkpoints, kept.left_out) == (1, 1, 0)
    assert (kept.interruptions, kept.resumes) == (1, 1)
    [task] = kept.tasks
    assert task.label == "Count" and task.attempts == 2 and task.resume_status == "RESUMED"
    assert [s.outcome for s in task.history] == ["interrupted", "succeeded"]
    assert task.history[1].resumed_from == before.checkpoint.generation
    gens = [c.generation for c in task.checkpoints]
    assert gens == sorted(gens) and len(gens) >= 2
    # the generations the store still kept at the end (its last few): the resumed attempt's
    assert gens[-1] > max(stored_before) and len(gens) == len(stored_before)
    assert kept.generations == gens[-1] and kept.state_bytes == task.checkpoints[-1].state_bytes
    assert all(c.state_bytes > 0 for c in task.checkpoints)

    timeline = core.report.kept_timeline(task)
    first, second = timeline.attempts
    assert first.outcome == "interrupted" and second.outcome == "succeeded"
    assert second.resumed_from == before.checkpoint.generation
    assert second.saved_seconds > 0.1
    assert abs(kept.saved_seconds - timeline.saved_seconds) < 1e-6
    assert [c.generation for c in timeline.checkpoints] == gens
    assert timeline.fraction(timeline.start) == 0.0 and timeline.fraction(timeline.end) == 1.0
    # checkpoints show says the same in words, with the timeline of each task
    shown = subprocess.run(
        cli_cmd("checkpoints", "show", run.run_id, "--store", str(store)),
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert f"until then it {core.report.kept_sentence(kept)}" in shown, shown
    assert "1 interruption, 1 resume, saving" in shown and "no task records kept" not in shown
    lines = shown.splitlines()
    i = lines.index("  Count:")
    assert lines[i + 1 : i + 3] == [f"    {t}" for t in core.report.timeline_text(timeline)], shown
    assert "resumed from" in lines[i + 2]
    # a record written before the field reads (no summary), and one with it round-trips
    assert core.RunRecord.model_validate(run.model_dump(exclude={"kept"})).kept is None
    assert core.RunRecord.model_validate_json(run.model_dump_json()).kept == kept


def test_the_summary_is_bounded_whatever_the_task_count() -> None:
    collector = KeptCollector()
    for n in range(MAX_KEPT_TASKS + 30):
        rec = core.TaskRecord(
            job_key="0" * 16, run_id="r", step="S", task_key=f"k{n}", parameters={}
        )
        if n % 2:
            rec.checkpoint = core.CheckpointData(generation=2, state="abc", saved_at=1.0, attempt=1)
        collector.add(rec)
    kept = collector.result({}, at=5.0)
    assert len(kept.tasks) == MAX_KEPT_TASKS
    assert kept.left_out == 30 and kept.task_count == MAX_KEPT_TASKS + 30
    # the tasks with a checkpoint come first
    assert all(t.checkpoints for t in kept.tasks[: kept.tasks_with_checkpoints])
    assert kept.generations == 2 * kept.tasks_with_checkpoints and kept.state_bytes == 3 * 40


def _run(store: CheckpointStore, **fields: object) -> core.RunRecord:
    run = core.RunRecord(job_key="0" * 16, run_id="r1", job_name="J", template_hash="h", **fields)
    store.write_run(run)
    return run


def test_termination_choices_are_the_modes_a_request_could_still_act_in(tmp_path: Path) -> None:
    st = CheckpointStore(tmp_path / "store")
    run = _run(st)  # no runner recorded (Airflow, Prefect): live until it ends
    assert core.termination_choices(st, run) == (S, R, CR, C)
    # a request refused by request_termination is never offered, and the mode in force neither
    core.request_termination(st, run.job_key, run.run_id, "StoppedRunFinally")
    assert core.termination_choices(st, run) == (CR, C)
    core.request_termination(st, run.job_key, run.run_id, "CancelledRunFinally")
    assert core.termination_choices(st, run) == (C,)
    core.request_termination(st, run.job_key, run.run_id, "Cancelled")
    assert core.termination_choices(st, run) == ()

    # while finally steps run, the *RunFinally modes change nothing
    run = _run(st, phase="finally", attempt=2)
    assert core.termination_choices(st, run) == (S, C)
    # an ended run: nothing
    for status in ("succeeded", "interrupted", "failed", "canceled", "stopped"):
        ended = _run(st, status=status, phase="ended")
        assert core.termination_choices(st, ended) == ()


def test_task_status_in_the_clis_words() -> None:
    assert core.report.task_status_words("interrupted") == "suspended"
    for status in ("pending", "running", "succeeded", "failed", "canceled"):
        assert core.report.task_status_words(status) == status
