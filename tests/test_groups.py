"""Grouping a step's tasks under a scheduler's cap (``core.group_tasks``, ``core.group_label``):
Airflow's ``max_map_length``, a Prefect flow's ``max_task_runs_per_step``."""

from __future__ import annotations

import pytest

from core import TaskSpec, group_label, group_tasks, plan_tasks, prepare_job
from core.job._template import parse_template


def specs_of(n: int) -> list[TaskSpec]:
    return [TaskSpec(step_name="S", task_key=str(i), parameters={}, record_parameters={})
            for i in range(n)]  # fmt: skip


@pytest.mark.parametrize("n", [0, 1, 5, 1024, 1025, 3000, 3100])
def test_groups_stay_within_the_cap_balanced_and_in_order(n: int) -> None:
    groups = group_tasks(specs_of(n), 1024)
    assert len(groups) == min(n, 1024)
    assert [s.task_key for g in groups for s in g] == [str(i) for i in range(n)]
    if groups:
        sizes = [len(g) for g in groups]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # larger groups first


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="1 or more, not 0"):
        group_tasks(specs_of(3), 0)


def job_of(parameters: list[dict]):
    doc = {
        "specificationVersion": "jobtemplate-2023-09",
        "extensions": ["TASK_CHUNKING"],
        "name": "groups",
        "steps": [
            {
                "name": "Render",
                "parameterSpace": {"taskParameterDefinitions": parameters},
                "script": {"actions": {"onRun": {"command": "true"}}},
            }
        ],
    }
    return prepare_job(parse_template(doc))


def test_labels_name_the_span_of_one_integer_parameter() -> None:
    tasks = plan_tasks(job_of([{"name": "Frame", "type": "INT", "range": "1-10"}]), "Render")
    assert group_label(tasks[:1]) == "Render[Frame=1]"
    assert group_label(tasks[:3]) == "Render[Frame=1-3] (3 tasks)"
    assert group_label([tasks[0], tasks[4]]) == "Render[Frame=1,5] (2 tasks)"


def test_labels_of_chunks_and_of_several_parameters() -> None:
    chunked = plan_tasks(
        job_of(
            [
                {
                    "name": "Frame",
                    "type": "CHUNK[INT]",
                    "range": "1-12",
                    "chunks": {"defaultTaskCount": 4, "rangeConstraint": "CONTIGUOUS"},
                }
            ]
        ),
        "Render",
    )
    assert group_label(chunked[:2]) == "Render[Frame=1-8] (2 tasks)"
    two = plan_tasks(
        job_of(
            [
                {"name": "Cam", "type": "STRING", "range": ["a", "b"]},
                {"name": "Frame", "type": "INT", "range": "1-3"},
            ]
        ),
        "Render",
    )
    label = group_label(two)
    assert label.startswith(two[0].label + " .. ") and label.endswith(f"{two[-1].label} (6 tasks)")


def test_labels_are_cut_to_what_airflow_stores() -> None:
    tasks = plan_tasks(
        job_of([{"name": "Name", "type": "STRING", "range": ["x" * 200, "y" * 200]}]), "Render"
    )
    label = group_label(tasks)
    assert len(label) == 250 and label.endswith("...")
    with pytest.raises(ValueError):
        group_label([])
