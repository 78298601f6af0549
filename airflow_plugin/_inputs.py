"""What every operator of a DAG made by ``dag_from_template`` reads (the attempt from the setup
task's XCom, the checkpoint store, the run's job) and the groups a step's mapped task expands
over. Failures that a retry would meet again raise ``AirflowFailException``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

import core
from core import original_tasks

from ._config import BEGIN_TASK_ID, open_store

__all__ = (
    "group_originals",
    "group_tasks",
    "open_op_store",
    "read_attempt",
    "run_job",
    "say_still_running",
    "state_text",
)


def read_attempt(context: Any, begin_task_id: str = BEGIN_TASK_ID) -> core.Attempt:
    data = context["ti"].xcom_pull(task_ids=begin_task_id)
    if not isinstance(data, dict):
        raise AirflowFailException(
            f"no attempt from {begin_task_id!r} in XCom (got {type(data).__name__}); "
            "clear the whole DAG run to begin again"
        )
    return core.Attempt.from_dict(data)


def open_op_store(op: Any) -> core.CheckpointStore:
    """The operator's checkpoint store (its ``store``, ``files`` and ``file_roots``, else the
    worker's ``[openjd_checkpoint]`` settings; ``_config.open_store``). A bad setting fails the
    task without a retry: a retry would read the same setting."""
    try:
        return open_store(op.store, op.files, op.file_roots)
    except ValueError as exc:
        raise AirflowFailException(f"the checkpoint store settings: {exc}") from None


def run_job(store: core.CheckpointStore, attempt: core.Attempt) -> core.PreparedJob:
    try:
        return core.prepare_run_job(store, attempt.job_key, attempt.run_id)
    except (core.RunError, core.TemplateError) as exc:
        raise AirflowFailException(str(exc)) from None


def state_text(state: Any) -> str:
    return str(getattr(state, "value", state))


def say_still_running(log: Any, held: Sequence[str]) -> None:
    if held:
        log.warning(
            "still running after %.0f s, going on without them: %s",
            core.RELEASE_WAIT_SECONDS,
            ", ".join(held),
        )


def group_tasks(specs: Sequence[core.TaskSpec], limit: int) -> list[dict[str, Any]]:
    """Split a step's original tasks into at most ``limit`` groups of consecutive tasks
    (``core.group_tasks``), one per mapped task instance.

    Returns one small JSON-serializable item per group: ``{"step", "label", "start",
    "stop"}``, where ``start``/``stop`` index the step's original task list
    (``PreparedJob.original_tasks``) and ``label`` (the map index name) is
    ``core.group_label``: ``Render[Frame=1-4]``, or for several tasks
    ``Render[Frame=1-3] (3 tasks)``. Every mapped task instance pulls the whole list, so it
    carries indexes, not task descriptions: 1,024 items stay a few tens of kilobytes.

    Raises:
        ValueError: ``limit`` is below 1.
    """
    items: list[dict[str, Any]] = []
    start = 0
    for group in core.group_tasks(specs, limit):
        items.append(
            {
                "step": group[0].step_name,
                "label": core.group_label(group),
                "start": start,
                "stop": start + len(group),
            }
        )
        start += len(group)
    return items


def group_originals(job: core.PreparedJob, step: str, group: dict[str, Any]) -> list[core.TaskSpec]:
    """The original tasks of one mapped instance's group (``group_tasks``'s item)."""
    return original_tasks(job, step, int(group["start"]), int(group["stop"]))
