"""Planning a resumed step (``PreparedJob.plan_step``): what runs again, and how."""

from __future__ import annotations

from typing import Any

import pytest

from core import CheckpointData, TaskRecord, prepare_job
from core._records import TaskStatus
from core.job import iter_plan, plan_tasks
from core.job._planning import iter_tasks, original_tasks, params_to_record, task_count, task_key_of
from core.job._template import parse_template
from core.local import PlanHistory


def chunk_job(constraint: str = "CONTIGUOUS", resumable: bool = False, count: int = 10):
    actions: dict[str, Any] = {"onRun": {"command": "true"}}
    if resumable:
        actions["onCheckpointResume"] = {"command": "true", "args": ["{{Task.Checkpoint.State}}"]}
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["TASK_CHUNKING", "CHECKPOINT"],
        "name": "plan",
        "steps": [
            {
                "name": "R",
                "parameterSpace": {
                    "taskParameterDefinitions": [
                        {
                            "name": "Frame",
                            "type": "CHUNK[INT]",
                            "range": "1-20",
                            "chunks": {"defaultTaskCount": count, "rangeConstraint": constraint},
                        },
                        {"name": "Cam", "type": "STRING", "range": ["a", "b"]},
                    ]
                },
                "script": {"actions": actions},
            }
        ],
    }
    return prepare_job(parse_template(doc))


def rec(job, params, status=TaskStatus.INTERRUPTED, frames=(), checkpoint=None) -> TaskRecord:
    return TaskRecord(
        job_key=job.job_key,
        run_id="r",
        step="R",
        task_key=task_key_of(params),
        parameters=params_to_record(params),
        status=status,
        chunk_parameter="Frame",
        completed_frames=list(frames),
        checkpoint=checkpoint,
    )


def values(specs):
    return [
        (s.parameters["Frame"].value, s.parameters["Cam"].value, s.resume is not None)
        for s in specs
    ]


def test_fresh_plan_is_the_parameter_space() -> None:
    job = chunk_job()
    assert values(plan_tasks(job, "R")) == [
        ("1-10", "a", False),
        ("1-10", "b", False),
        ("11-20", "a", False),
        ("11-20", "b", False),
    ]


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        ("CONTIGUOUS", [("1,2", "a", False), ("5-10", "a", False)]),
        ("NONCONTIGUOUS", [("1,2,5-10", "a", False)]),
    ],
)
def test_interrupted_chunk_runs_only_frames_not_reported(constraint, expected) -> None:
    job = chunk_job(constraint)
    specs = plan_tasks(job, "R")
    first = specs[0].parameters
    done = rec(job, first, frames=[3, 4])
    finished = [rec(job, s.parameters, status=TaskStatus.SUCCEEDED) for s in specs[1:]]
    plan = plan_tasks(job, "R", [done, *finished])
    assert values(plan) == expected
    assert all(s.task_key.startswith(specs[0].task_key + "#") for s in plan)


def test_checkpointed_chunk_resumes_with_remaining_frames() -> None:
    job = chunk_job(resumable=True)
    specs = plan_tasks(job, "R")
    ck = CheckpointData(generation=2, state="st", saved_at=0, attempt=1)
    r = rec(job, specs[1].parameters, frames=[1, 2, 3], checkpoint=ck)
    plan = plan_tasks(job, "R", [r])
    assert values(plan)[0] == ("4-10", "b", True)
    assert plan[0].resume == ck and plan[0].task_key == specs[1].task_key
    assert plan[0].record_parameters["Frame"].value == "1-10"
    assert [v for v in values(plan)[1:]] == [
        ("1-10", "a", False),
        ("11-20", "a", False),
        ("11-20", "b", False),
    ]


def test_checkpoint_ignored_when_step_has_no_resume_action() -> None:
    job = chunk_job(resumable=False)
    specs = plan_tasks(job, "R")
    ck = CheckpointData(generation=1, state="st", saved_at=0, attempt=1)
    plan = plan_tasks(job, "R", [rec(job, specs[0].parameters, frames=[1], checkpoint=ck)])
    assert plan[0].resume is None and plan[0].parameters["Frame"].value == "2-10"


def test_fully_reported_chunk_is_not_run_again() -> None:
    job = chunk_job()
    specs = plan_tasks(job, "R")
    r = rec(job, specs[0].parameters, frames=range(1, 11))
    assert len(plan_tasks(job, "R", [r])) == 3


def test_pieces_of_a_second_interruption_combine() -> None:
    """Frames reported by a piece of a chunk count for the whole chunk next time."""
    job = chunk_job()
    specs = plan_tasks(job, "R")
    first = rec(job, specs[0].parameters, frames=[1, 2, 3])
    plan = plan_tasks(job, "R", [first])
    piece = plan[0]
    assert piece.parameters["Frame"].value == "4-10"
    second = TaskRecord(
        job_key=job.job_key, run_id="r", step="R", task_key=piece.task_key,
        parameters=params_to_record(piece.parameters), status=TaskStatus.INTERRUPTED,
        chunk_parameter="Frame", completed_frames=[4, 5],
    )  # fmt: skip
    again = plan_tasks(job, "R", [first, second])
    assert values(again)[0] == ("6-10", "a", False)


@pytest.mark.parametrize("constraint", ["CONTIGUOUS", "NONCONTIGUOUS"])
@pytest.mark.parametrize("resumable", [True, False])
def test_plan_group_reads_only_its_tasks_and_plans_as_the_whole_step(
    tmp_path, constraint: str, resumable: bool
) -> None:
    """``core.plan_group`` over any slice of the original tasks gives what planning the whole
    step gives for that slice, whatever mix of finished, interrupted, checkpointed and
    piece records the run holds; and it never reads another task's record (an unreadable one
    is neither reported nor set aside)."""
    import random

    from core import CheckpointStore, begin_attempt, plan_group
    from core import plan_step as run_plan_step
    from core.store._layout import task_id_for

    job = chunk_job(constraint, resumable, count=3)
    st = CheckpointStore(tmp_path / "store")
    run_id = begin_attempt(st, job, external_key="group").run_id
    originals = plan_tasks(job, "R")
    rng = random.Random(f"{constraint}{resumable}")
    for spec in originals:
        frames = sorted(spec.chunk_frames)
        kind = rng.choice(["none", "done", "part", "checkpoint", "piece"])
        if kind == "none":
            continue
        status = TaskStatus.SUCCEEDED if kind == "done" else TaskStatus.INTERRUPTED
        reported = frames[: rng.randrange(len(frames))] if kind != "done" else frames
        if kind == "piece":
            reported = frames[:1]  # an interrupted chunk whose remainder ran as a piece
        cp = (
            CheckpointData(generation=1, state="s", saved_at=0, attempt=1)
            if kind == "checkpoint"
            else None
        )
        first = rec(job, spec.parameters, status, reported, cp)
        first.run_id = run_id
        st.write_task(first)
        if kind == "piece":
            planned = plan_tasks(job, "R", [first])
            piece = next(s for s in planned if s.task_key.startswith(spec.task_key + "#"))
            stem = task_id_for("R", spec.task_key)
            assert task_id_for("R", piece.task_key).startswith(stem + "-")
            second = TaskRecord(
                job_key=job.job_key, run_id=run_id, step="R", task_key=piece.task_key,
                parameters=params_to_record(piece.parameters), status=TaskStatus.INTERRUPTED,
                chunk_parameter="Frame", completed_frames=sorted(piece.chunk_frames)[:1],
            )  # fmt: skip
            st.write_task(second)
    whole = run_plan_step(st, job, run_id, "R")
    for start in range(0, len(originals), 2):
        group = originals[start : start + 2]
        keys = {s.task_key for s in group}
        expected = [s for s in whole if s.task_key.split("#", 1)[0] in keys]
        assert plan_group(st, job, run_id, group) == expected
    # A record of another task that cannot be read does not concern this group.
    tasks_dir = tmp_path / "store" / "jobs" / job.job_key / "runs" / run_id / "tasks"
    bad = tasks_dir / f"{task_id_for('R', originals[-1].task_key)}.json"
    bad.write_text("{not json")
    plan_group(st, job, run_id, originals[:2])
    assert bad.read_text() == "{not json"


@pytest.mark.parametrize(
    ("template", "params"),
    [
        ("tests/data/adaptive.yaml", {}),
        ("tests/data/three_steps.yaml", {"Out": "/tmp"}),
        ("tests/airflow/data/large_step.yaml", {"Log": "/tmp/log", "Frames": 50}),
        ("examples/chunked-frames/chunked-frames.yaml", {}),
    ],
)
def test_original_tasks_are_slices_of_the_fresh_plan(template: str, params: dict) -> None:
    """``original_tasks(step, start, stop)`` and ``task_count`` agree with
    ``plan_step(step)`` with no records, for plain, chunked and adaptive steps."""
    from pathlib import Path

    from core import load_template

    root = Path(__file__).resolve().parents[1]
    tpl = load_template(root / template)
    job = prepare_job(tpl, params)
    for step in [*tpl.regular_steps, *tpl.finally_steps]:
        full = plan_tasks(job, step)
        n = task_count(job, step)
        assert n == len(full)
        for start, stop in [(0, None), (1, 3), (2, 2), (n - 1, n + 5), (n, None)]:
            assert original_tasks(job, step, start, stop) == full[start:stop]


def frame_job(frames: int, resumable: bool = True):
    actions: dict[str, Any] = {"onRun": {"command": "true"}}
    if resumable:
        actions["onCheckpointResume"] = {"command": "true"}
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["CHECKPOINT"],
        "name": "lazy",
        "steps": [
            {
                "name": "R",
                "parameterSpace": {
                    "taskParameterDefinitions": [
                        {"name": "Frame", "type": "INT", "range": f"1-{frames}"}
                    ]
                },
                "script": {"actions": actions},
            }
        ],
    }
    return prepare_job(parse_template(doc))


def frame_rec(job, frame: int, status: TaskStatus, checkpoint=None) -> TaskRecord:
    params = next(p for p in iter_tasks(job, "R") if p["Frame"].value == str(frame))
    return TaskRecord(
        job_key=job.job_key,
        run_id="r",
        step="R",
        task_key=task_key_of(params),
        parameters=params_to_record(params),
        status=status,
        checkpoint=checkpoint,
    )


def test_iter_plan_takes_tasks_one_at_a_time() -> None:
    """The plan is made as it is taken: the first task of a step comes before the parameter
    space is walked further (a space that breaks after its first set still gives it)."""
    job = frame_job(3)
    first = next(iter(iter_tasks(job, "R")))

    def space():
        yield first
        raise AssertionError("the plan walked past the task it was asked for")

    plan = iter_plan(job, "R", tasks=space())
    assert next(plan).label == "R[Frame=1]"
    with pytest.raises(AssertionError, match="walked past"):
        next(plan)


def test_iter_plan_raises_for_an_unknown_step_at_once() -> None:
    with pytest.raises(KeyError):
        iter_plan(frame_job(3), "Nope")


def test_plan_history_keeps_a_succeeded_task_as_its_key() -> None:
    """Succeeded records are kept as keys (not records); the others whole; the plan from the
    history is the plan from the records, and a later record of a task replaces the earlier."""
    job = frame_job(6)
    ckpt = CheckpointData(generation=1, state="s", saved_at=0.0, attempt=1)
    records = [
        frame_rec(job, 1, TaskStatus.SUCCEEDED),
        frame_rec(job, 2, TaskStatus.FAILED),
        frame_rec(job, 3, TaskStatus.INTERRUPTED, ckpt),
        frame_rec(job, 4, TaskStatus.FAILED),
        frame_rec(job, 4, TaskStatus.SUCCEEDED),  # the later record of task 4
    ]
    history = PlanHistory(job, iter(records))
    assert sorted(r.task_key for r in history.records("R")) == sorted(
        records[i].task_key for i in (1, 2)
    )
    from_history = [(s.label, s.resume is not None) for s in iter_plan(job, "R", history)]
    from_records = [(s.label, s.resume is not None) for s in plan_tasks(job, "R", records)]
    assert (
        from_history
        == from_records
        == [
            ("R[Frame=3]", True),
            ("R[Frame=2]", False),
            ("R[Frame=5]", False),
            ("R[Frame=6]", False),
        ]
    )


def test_task_key_of_is_canonical_json() -> None:
    """The task key keeps the text it had when it was canonical_json of the values (sorted
    names, no spaces, non-ASCII kept, escapes as json writes them)."""
    from openjd.model import ParameterValue, ParameterValueType

    from core._hashing import canonical_json

    for names in (["b", "a"], ["Frame"], [], ['é"\\\n', "\u2028x"]):
        params = {
            n: ParameterValue(type=ParameterValueType.STRING, value=f'v{i}é\t"')
            for i, n in enumerate(names)
        }
        assert task_key_of(params) == canonical_json({k: str(v.value) for k, v in params.items()})
