"""Grouping a step's tasks for a scheduler that caps how many task instances or task runs one
step may have (Airflow's ``[core] max_map_length``, a Prefect flow's ``max_task_runs_per_step``):
contiguous, balanced groups of the step's original tasks, and the name a group is shown by.

Each group runs its tasks one after the other in one session (``core.run_tasks``); resume stays
per OpenJD task (``core.plan_group``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from openjd.model import IntRangeExpr

from core.job._planning._spec import TaskSpec

__all__ = ("MAX_LABEL_CHARS", "group_label", "group_result_key", "group_tasks")

#: Names are cut to this many characters (Airflow's ``rendered_map_index`` holds 250).
MAX_LABEL_CHARS = 250


def group_tasks(specs: Sequence[TaskSpec], max_groups: int) -> list[list[TaskSpec]]:
    """Split a step's tasks into at most ``max_groups`` contiguous groups, in order, whose sizes
    differ by at most one, larger ones first: as many groups as allowed, for the most
    parallelism (3,000 tasks in at most 1,024 groups: 952 groups of 3, then 72 of 2). No group
    is empty; no tasks, no groups.

    Raises:
        ValueError: ``max_groups`` is below 1.
    """
    if max_groups < 1:
        raise ValueError(f"the most groups per step must be 1 or more, not {max_groups}")
    n = len(specs)
    count = min(n, max_groups)
    groups: list[list[TaskSpec]] = []
    start = 0
    for i in range(count):
        size = n // count + (1 if i < n % count else 0)
        groups.append(list(specs[start : start + size]))
        start += size
    return groups


def group_label(specs: Sequence[TaskSpec]) -> str:
    """How a group is shown (a map index name, a task run name), at most ``MAX_LABEL_CHARS``:

    - one task: its label (``Render[Frame=1-4]``);
    - several tasks of one integer or chunk parameter: the union of their values and the count
      (``Render[Frame=1-3] (3 tasks)``);
    - otherwise the first and last tasks and the count
      (``Render[Cam=a, Frame=1] .. Render[Cam=b, Frame=9] (18 tasks)``).

    Raises:
        ValueError: ``specs`` is empty.
    """
    if not specs:
        raise ValueError("a group has at least one task")
    step = specs[0].step_name
    if len(specs) == 1:
        label = specs[0].label
    else:
        label = f"{specs[0].label} .. {specs[-1].label} ({len(specs)} tasks)"
        names = list(specs[0].parameters)
        if len(names) == 1:
            try:
                values: set[int] = set()
                for spec in specs:
                    values.update(IntRangeExpr.from_str(str(spec.parameters[names[0]].value)))
                span = IntRangeExpr.from_list(sorted(values))
                label = f"{step}[{names[0]}={span}] ({len(specs)} tasks)"
            except (ValueError, TypeError):
                pass
    if len(label) > MAX_LABEL_CHARS:
        label = label[: MAX_LABEL_CHARS - 3] + "..."
    return label


def group_result_key(
    job_key: str, run_id: str, step: str, specs: Sequence[TaskSpec], *, attempt: int | None = None
) -> str:
    """The key under which a framework may persist a group's result (Prefect's result storage,
    so a retry skips a group that succeeded): the core run id and the group's task identities.
    A new core run never matches it; a retry (or an operator resume) of the same core run does.
    Give ``attempt`` for a finally step's group: finally steps run again on every attempt
    (docs/decisions.md), so their results are never reused across attempts."""
    digest = hashlib.sha256("\n".join([step, *(s.task_key for s in specs)]).encode("utf-8"))
    suffix = f"/attempt-{attempt}" if attempt is not None else ""
    return f"openjd-checkpoint/{job_key}/{run_id}/{digest.hexdigest()[:24]}{suffix}"
