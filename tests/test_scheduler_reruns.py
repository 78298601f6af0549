"""A scheduler's re-run of part of a run it already ran (issue 22, items 1, 2 and 6), driven
through the core's run-level operations as the Airflow adapter drives them: ``begin_attempt``
with the DAG run's key, ``plan_group`` per mapped task instance, ``run_tasks``,
``enter_finally``, ``finish_attempt``.

- Clearing a task instance whose OpenJD tasks finished runs them again from their start; one
  that did not finish resumes; the other tasks keep their outcome; the finally steps run again
  with the new outcome. On a run that succeeded (its task records deleted) as on one that failed.
- A template changed since the run began is refused (``chain-changed``) before any task of the
  old plan runs.
- A refusal names the scheduler run that began the latest attempt, not the first one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DATA

from core import (
    CheckpointStore,
    ResumeHow,
    ResumeRefusedError,
    begin_attempt,
    finish_attempt,
    plan_group,
    prepare_job,
    run_tasks,
)
from core.job import plan_tasks
from core.local import enter_finally

THREE = DATA / "three_steps.yaml"


def _run_group(st: CheckpointStore, job, run_id: str, originals, *, rerun: bool = False) -> list:
    extra = {"rerun": True} if rerun else {}  # what the Airflow operator passes
    specs = plan_group(st, job, run_id, originals, **extra)
    return [r.outcome.value for r in run_tasks(st, job, run_id, specs)]


def _drive(st: CheckpointStore, job, run_id: str, groups: dict[str, list]) -> str:
    """Run the given groups (step -> list of original-task lists), then the finally phase and
    the end, as the DAG's task instances would; return the run's status."""
    for step in job.template.regular_steps:
        for group in groups.get(step, []):
            _run_group(st, job, run_id, group)
    decision = enter_finally(st, job, run_id)
    if decision.run_finally:
        for step in job.template.finally_steps:
            _run_group(st, job, run_id, plan_tasks(job, step))
    return finish_attempt(st, job, run_id).status.value


def _all_groups(job) -> dict[str, list]:
    return {s: [[t] for t in plan_tasks(job, s)] for s in job.template.regular_steps}


def test_clearing_a_finished_task_of_a_succeeded_run_runs_it_again_and_the_run_succeeds(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": 0.01})
    st = CheckpointStore(tmp_path / "store")
    first = begin_attempt(st, job, external_key="dag/run-1")
    assert _drive(st, job, first.run_id, _all_groups(job)) == "succeeded"
    assert st.read_tasks(first.job_key, first.run_id)[0] == []  # a success deletes them

    # The user clears the second Render task instance (frames 3-4) of the succeeded DAG run:
    # Airflow runs openjd_begin, that instance, the finally step and openjd_finish again.
    again = begin_attempt(st, job, external_key="dag/run-1")
    assert again.run_id == first.run_id, again.notes
    assert again.attempt == 2
    cleared = plan_tasks(job, "Render")[1:2]
    specs = plan_group(st, job, again.run_id, cleared, rerun=True)
    assert [s.label for s in specs] == ["Render[Frame=3-4]"]
    assert specs[0].resume is None and specs[0].chunk_frames == {3, 4}  # from its start
    # the others keep their outcome: nothing to run for them
    assert plan_group(st, job, again.run_id, plan_tasks(job, "Render")[:1]) == []
    assert plan_group(st, job, again.run_id, plan_tasks(job, "Assemble")) == []
    assert [r.outcome.value for r in run_tasks(st, job, again.run_id, specs)] == ["succeeded"]
    assert (out / "frame-3").read_text() == "xx" and (out / "frame-1").read_text() == "x"
    decision = enter_finally(st, job, again.run_id)
    assert decision.run_finally and decision.job_status == "Succeeded"
    _run_group(st, job, again.run_id, plan_tasks(job, "Cleanup"))
    assert (out / "cleanup-status").read_text().splitlines() == ["Succeeded", "Succeeded"]
    outcome = finish_attempt(st, job, again.run_id)
    assert outcome.status.value == "succeeded", outcome.condition
    assert outcome.skipped == []


def test_a_cleared_rerun_that_fails_fails_the_run_and_clearing_it_again_resumes(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 4})
    st = CheckpointStore(tmp_path / "store")
    first = begin_attempt(st, job, external_key="dag/run-2")
    assert _drive(st, job, first.run_id, _all_groups(job)) == "succeeded"

    (out / "fail-now").touch()
    again = begin_attempt(st, job, external_key="dag/run-2")
    cleared = plan_tasks(job, "Render")[1:2]
    assert _run_group(st, job, again.run_id, cleared, rerun=True) == ["failed"]
    assert _drive(st, job, again.run_id, {}) == "failed"  # ends as its tasks did
    assert (out / "cleanup-status").read_text().splitlines() == ["Succeeded", "Failed"]

    # Cleared again: frame 3 finished in the try that failed, so only frame 4 runs (it resumes).
    (out / "fail-now").unlink()
    third = begin_attempt(st, job, external_key="dag/run-2")
    assert third.run_id == first.run_id and third.attempt == 3
    specs = plan_group(st, job, third.run_id, cleared, rerun=True)
    assert [s.chunk_frames for s in specs] == [{4}]
    assert [r.outcome.value for r in run_tasks(st, job, third.run_id, specs)] == ["succeeded"]
    assert _drive(st, job, third.run_id, {}) == "succeeded"


def test_clearing_a_finished_task_of_a_failed_run_runs_it_again_from_its_start(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 5})
    st = CheckpointStore(tmp_path / "store")
    first = begin_attempt(st, job, external_key="dag/run-3")
    assert _drive(st, job, first.run_id, _all_groups(job)) == "failed"
    (out / "fail-now").unlink()

    again = begin_attempt(st, job, external_key="dag/run-3")
    assert again.run_id == first.run_id
    render = plan_tasks(job, "Render")
    # the finished first instance, cleared, runs again from its start ...
    assert [s.chunk_frames for s in plan_group(st, job, again.run_id, render[:1], rerun=True)] == [
        {1, 2}
    ]
    # ... and the failed one resumes (its finished frames are not run again)
    assert [s.chunk_frames for s in plan_group(st, job, again.run_id, render[2:], rerun=True)] == [
        {5, 6}
    ]


def test_a_template_changed_since_the_run_began_is_refused_before_any_task_runs(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    template = tmp_path / "three.yaml"
    template.write_text(THREE.read_text())
    job = prepare_job(template, {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 3})
    st = CheckpointStore(tmp_path / "store")
    first = begin_attempt(st, job, external_key="dag/run-4")
    assert _drive(st, job, first.run_id, _all_groups(job)) == "failed"

    template.write_text(THREE.read_text().replace('range: "1-6"', 'range: "2-7"'))
    edited = prepare_job(template, {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 3})
    with pytest.raises(ResumeRefusedError) as refused:
        begin_attempt(st, edited, external_key="dag/run-4")
    assert refused.value.code.value == "chain-changed"
    assert "Render" in str(refused.value)
    runs, _ = st.list_runs(job.job_key)
    assert [r.run_id for r in runs] == [first.run_id]  # no new run from the top
    assert runs[0].superseded_by is None
    # a new scheduler run (a new DAG run) runs the changed template
    fresh = begin_attempt(st, edited, external_key="dag/run-5")
    assert fresh.run_id != first.run_id and fresh.attempt == 1


def test_a_refusal_names_the_scheduler_run_that_resumed_the_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "fail-now").touch()
    job = prepare_job(THREE, {"Out": str(out), "FrameSeconds": 0.01, "FailFrame": 3})
    st = CheckpointStore(tmp_path / "store")
    first = begin_attempt(st, job, external_key="dag/first")
    assert _drive(st, job, first.run_id, _all_groups(job)) == "failed"

    # Two new DAG runs with resume=latest at once: the second resumes the job run ...
    second = begin_attempt(
        st, job, how=ResumeHow.OPERATOR, run_id="latest", external_key="dag/second"
    )
    assert second.run_id == first.run_id and second.attempt == 2
    # ... and the third is refused, naming the second as the one running it.
    with pytest.raises(ResumeRefusedError) as refused:
        begin_attempt(st, job, how=ResumeHow.OPERATOR, run_id="latest", external_key="dag/third")
    assert refused.value.code.value == "already-resumed"
    assert "'dag/second'" in str(refused.value), refused.value
    assert "dag/first" not in str(refused.value)
