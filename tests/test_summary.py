"""What every runner shows of a task and its checkpoints (``core.report.summarize_task``): the CLI's
``checkpoints`` commands, the Airflow page and the Prefect table all read it."""

from __future__ import annotations

from core import CheckpointData, TaskRecord, report
from core.job import new_task_record, plan_tasks
from core.job._planning import task_label

FRAME = {"Frame": {"type": "CHUNK[INT]", "value": "1-4"}}


def _record(**fields) -> TaskRecord:
    base = {"job_key": "j", "run_id": "r", "step": "Render", "task_key": "k", "parameters": {}}
    return TaskRecord(**{**base, **fields})


def test_a_task_with_a_checkpoint_shows_its_sizes_and_files_never_its_state() -> None:
    ckpt = CheckpointData(
        generation=3,
        state="é" * 10,
        file="/w/model.txt",
        files=["/w/a.txt", "/w/b.txt"],
        dirs=["/w/out"],
        saved_at=100.0,
        attempt=2,
        manifest="ab" * 32,
    )
    rec = _record(parameters=FRAME, status="interrupted", attempt=2, checkpoint=ckpt)
    task = report.summarize_task(rec)
    assert task.label == "Render[Frame=1-4]" == task_label(rec)
    assert (task.status, task.attempts, task.resumable) == ("interrupted", 2, True)
    c = task.checkpoint
    assert c is not None and c == report.summarize_checkpoint(ckpt)
    assert (c.generation, c.saved_at, c.attempt) == (3, 100.0, 2)
    assert c.state_bytes == 20  # UTF-8 bytes, not characters
    assert c.files == ("/w/a.txt", "/w/b.txt", "/w/model.txt") and c.dirs == ("/w/out",)
    assert c.named == 4 and c.files_mode == "managed"
    assert "é" not in repr(task)


def test_finished_frames_make_an_unfinished_task_resumable_but_not_a_succeeded_one() -> None:
    assert report.summarize_task(_record(status="failed", completed_frames=[1, 2])).resumable
    done = report.summarize_task(_record(status="succeeded", completed_frames=[1, 2]))
    assert not done.resumable and done.frames_done == (1, 2) and done.checkpoint is None
    bare = report.summarize_task(_record())
    assert bare.label == "Render" and not bare.resumable
    shared = report.summarize_checkpoint(CheckpointData(generation=1, saved_at=1.0, attempt=1))
    assert shared.files_mode == "shared" and shared.state_bytes == 0 and shared.named == 0


def test_describe_plan_says_what_each_original_task_does_in_this_try(tmp_path) -> None:
    from conftest import DATA

    from core import (
        CheckpointStore,
        begin_attempt,
        group_result_key,
        plan_group,
        prepare_job,
        report,
    )

    out = tmp_path / "out"
    out.mkdir()
    st = CheckpointStore(tmp_path / "store")
    job = prepare_job(DATA / "three_steps.yaml", {"Out": str(out), "FrameSeconds": 0.01})
    attempt = begin_attempt(st, job, external_key="plan-lines")
    originals = plan_tasks(job, "Render")
    assert report.describe_plan(originals, originals) == []  # a first try: nothing to say
    assert report.describe_plan(originals, originals[:1], again=True) == [
        "Render[Frame=3-4]: finished in an earlier try; not run again",
        "Render[Frame=5-6]: finished in an earlier try; not run again",
        "Render[Frame=1-2]: no checkpoint stored; running from the top",
    ]
    first = originals[0]
    ckpt = CheckpointData(generation=2, state="abc", files=["/w/a"], saved_at=1.0, attempt=1)
    rec = new_task_record(job, first, attempt.run_id, status="interrupted", checkpoint=ckpt)
    rec.completed_frames = [1]
    st.write_task(rec)
    [resumed] = plan_group(st, job, attempt.run_id, originals[:1])
    [line] = report.describe_plan(originals[:1], [resumed])
    assert line == (
        "Render[Frame=2]: resuming from checkpoint generation 2 (3 bytes of state, 1 file(s), "
        "saved by attempt 1); 1 frame(s) skipped"
    )
    # A group's result key: the run and the group's tasks; a finally group's, the attempt too.
    key = group_result_key(job.job_key, attempt.run_id, "Render", originals)
    assert key.startswith(f"openjd-checkpoint/{job.job_key}/{attempt.run_id}/")
    assert key != group_result_key(job.job_key, attempt.run_id, "Render", originals[:1])
    assert group_result_key(job.job_key, "other-run", "Render", originals) != key
    assert (
        group_result_key(job.job_key, attempt.run_id, "Render", originals, attempt=2)
        == key + "/attempt-2"
    )


def test_the_outcome_sentence_says_how_to_continue_in_the_runner_s_words() -> None:
    """``outcome_sentence`` counts what a run kept; the next step is the CLI's unless a runner
    gives its own (a Prefect flow run's retry), and is left out when nothing was kept."""
    from core import report

    ckpt = CheckpointData(generation=2, state="1", saved_at=100.0, attempt=1)
    kept = [_record(status="interrupted", checkpoint=ckpt), _record(status="succeeded")]
    assert report.outcome_sentence("interrupted", kept, 2) == (
        "suspended: 1 task done, 1 task checkpointed; run again to continue"
    )
    assert report.outcome_sentence("interrupted", kept, 2, next_step="resume with `X`") == (
        "suspended: 1 task done, 1 task checkpointed; resume with `X`"
    )
    nothing = [_record(status="interrupted")]
    assert report.outcome_sentence("interrupted", nothing, 1, next_step="resume with `X`") == (
        "suspended: no task finished"
    )


def test_a_chunk_continued_by_the_record_of_its_rest_says_so() -> None:
    """The rest of an interrupted chunk runs as a task record of its own (key ``<key>#...``);
    the chunk's record keeps its status. ``core.report.continuations`` names what continued each."""
    from core import report

    def frames(value: str) -> dict:
        return {"Frame": {"type": "CHUNK[INT]", "value": value}}

    chunk = _record(task_key="k1", parameters=frames("1-10"), status="interrupted", updated_at=1)
    rest = _record(
        task_key="k1#7-10", parameters=frames("7-10"), status="interrupted", updated_at=2
    )
    last = _record(task_key="k1#9-10", parameters=frames("9,10"), status="running", updated_at=3)
    other = _record(task_key="k2", parameters=frames("11-20"), status="interrupted", updated_at=1)
    done = _record(task_key="k3", parameters=frames("21-30"), status="succeeded", updated_at=1)
    done_rest = _record(task_key="k3#25-30", parameters=frames("25-30"), status="pending")
    # any order in; the later record of a chunk continues the earlier one
    got = report.continuations([last, other, chunk, done_rest, rest, done])
    assert got == {
        ("Render", "k1"): "continued as Render[Frame=7-10]",
        ("Render", "k1#7-10"): "continued as Render[Frame=9,10]",
    }
    assert report.continuations([]) == {} and report.continuations([other]) == {}
    # a rest in another step is not this chunk's
    twin = _record(step="Encode", task_key="k2#15-20", parameters=frames("15-20"), updated_at=5)
    assert report.continuations([other, twin]) == {}


def test_how_a_task_ended_is_said_in_plain_words_never_an_outcome_name() -> None:
    """``core.report.result_words``: what a Prefect ``Stopped`` state and an Airflow log line say
    of a
    task execution; a chunk that kept only finished frames is ``suspended; 4 finished frames
    kept`` (its outcome is ``interrupted_with_checkpoint``, an internal name)."""
    from core import TaskOutcome, TaskResult, report

    def said(outcome: TaskOutcome, message: str = "", **fields: object) -> str:
        return report.result_words(TaskResult(outcome, None, message, _record(**fields)))

    with_frames = said(TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, completed_frames=[1, 2, 3, 4])
    assert with_frames == "suspended; 4 finished frames kept"
    one = said(TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, completed_frames=[7])
    assert one == "suspended; 1 finished frame kept"
    ckpt = CheckpointData(generation=7, saved_at=1.0, attempt=1)
    assert said(TaskOutcome.INTERRUPTED_WITH_CHECKPOINT, checkpoint=ckpt) == (
        "suspended; checkpoint generation 7 kept"
    )
    assert said(TaskOutcome.INTERRUPTED) == (
        "suspended; nothing to resume from (it runs from its start again)"
    )
    assert said(TaskOutcome.CANCELED, "canceled") == "canceled"
    assert said(TaskOutcome.CANCELED, checkpoint=ckpt) == "canceled; checkpoint generation 7 kept"
    assert said(TaskOutcome.SKIPPED, "not started: the run is stopping (Suspended)") == (
        "not started: the run is stopping (Suspended)"
    )
    assert said(TaskOutcome.SUCCEEDED) == "succeeded" and said(TaskOutcome.FAILED) == "failed"


def test_a_task_without_a_checkpoint_shows_its_run_s_files_mode() -> None:
    """A task that saved nothing shows the run's mode (``files_mode`` given), not ``shared``;
    a checkpoint's own mode wins (it is resumed the way it was made)."""
    assert report.summarize_task(_record(), "managed").files_mode == "managed"
    assert report.summarize_task(_record()).files_mode is None  # the run's mode not given
    shared = CheckpointData(generation=1, saved_at=1.0, attempt=1)
    assert report.summarize_task(_record(checkpoint=shared), "managed").files_mode == "shared"


def test_a_checkpoint_mark_names_the_task_attempt_that_saved_it() -> None:
    """Two attempts of a task in the run's attempt 1 (a framework's retry, a second Dask try):
    the generation the second saved says ``task attempt #2, run attempt 1``, the first's
    ``#1``; one saved where no attempt of the history ran says only the run's attempt. What a
    succeeded run keeps (``KeptCollector``) reads the same."""
    from core import report
    from core._records import AttemptSpan
    from core.job import KeptCollector

    history = [
        AttemptSpan(attempt=1, run_attempt=1, started_at=100.0, ended_at=110.0, outcome="x"),
        AttemptSpan(attempt=2, run_attempt=1, started_at=111.0, ended_at=130.0, outcome="y"),
    ]
    gens = [
        CheckpointData(generation=1, saved_at=105.0, attempt=1),
        CheckpointData(generation=2, saved_at=120.0, attempt=1, files=["/w/a"]),
        CheckpointData(generation=3, saved_at=50.0, attempt=1),  # before any attempt
    ]
    rec = _record(attempt=2, run_attempt=1, history=history, checkpoint=gens[1])
    marks = report.task_timeline(rec, gens).checkpoints
    assert [m.task_attempt for m in marks] == [1, 2, None]
    texts = [report.checkpoint_mark_text(m) for m in marks]
    assert texts[1] == (
        "generation 2 at 1970-01-01 00:02:00Z (task attempt #2, run attempt 1, 0 B of state, "
        "1 file(s))"
    )
    assert "(task attempt #1, run attempt 1, " in texts[0]
    assert "(run attempt 1, " in texts[2] and "task attempt" not in texts[2]
    # a span of another run attempt does not claim a generation of this one
    other = _record(history=[history[0].model_copy(update={"run_attempt": 2})])
    assert report.task_timeline(other, gens[:1]).checkpoints[0].task_attempt is None
    collector = KeptCollector()
    collector.add(rec)
    [kept] = collector.result({(rec.step, rec.task_key): gens}, at=200.0).tasks
    assert [
        report.checkpoint_mark_text(m) for m in report.kept_timeline(kept).checkpoints
    ] == sorted(texts, key=lambda t: int(t.split()[1]))
