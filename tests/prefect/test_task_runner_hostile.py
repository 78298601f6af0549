"""Hostile arguments of ``flow_from_template``'s concurrency: ``max_workers`` that is not a
whole number (a nan made a pool that never starts a thread: the flow run hung), and the name
of a task runner given as a class in the refusal of ``max_workers`` with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_integration import flow_from_template

THREE_STEPS = Path(__file__).resolve().parents[1] / "data" / "three_steps.yaml"


@pytest.mark.parametrize("value", ["3", 2.5, float("nan"), True])
def test_max_workers_that_is_not_a_whole_number_is_refused(value, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="max_workers must be a whole number"):
        flow_from_template(THREE_STEPS, store=tmp_path / "store", max_workers=value)


def test_a_task_runner_class_with_max_workers_is_named_in_the_refusal(tmp_path: Path) -> None:
    from prefect_dask import DaskTaskRunner

    with pytest.raises(ValueError, match=r"task_runner=DaskTaskRunner the task runner") as info:
        flow_from_template(
            THREE_STEPS, store=tmp_path / "store", task_runner=DaskTaskRunner, max_workers=2
        )
    assert "ABCMeta" not in str(info.value)
