"""The operators of a DAG made by ``dag_from_template``: translation only.

Every decision (which core run an attempt continues, what a task resumes from, when finally
steps run and with which ``{{Job.Status}}``, what a termination request means, the run's
outcome) is made by the core's run-level operations (``docs/core-api.md``); these operators
call them and map their answers onto Airflow task states:

- ``OpenJDBeginOperator`` (the DAG's setup task): ``core.begin_attempt`` with the external key
  ``<dag_id>/<run_id>``, or an operator resume when the ``resume`` param names a run.
- ``OpenJDPlanOperator`` (one per step): the step's *original* task list
  (``PreparedJob.plan_step`` with no records, stable across retries and clears), grouped into at
  most ``[core] max_map_length`` items for the step's mapped task to expand over.
- ``OpenJDTaskOperator`` (one mapped task per step): ``core.plan_group`` then
  ``core.run_tasks`` in one OpenJD session; ``on_kill`` asks the running task to checkpoint
  within Airflow's 5 s kill budget (``core.GroupStop``), and ``core.classify_group`` says how
  the try ends.
- ``OpenJDFinishOperator`` (the last teardown): ``core.finish_attempt``; fails the DAG run when
  the core's outcome is not success.

XCom carries references only: the attempt (job key, run id) and each group's label and range
of indexes into the step's original task list, never task descriptions, templates or
checkpoint states.

This module is the operators' public import path (DAG files import them from here); they live
in ``_run_operators`` (begin, plan, finish), ``_task_operator`` (the mapped task), with
``_kill`` (what ``on_kill`` does), ``_summary`` (the task state store's summary) and
``_inputs`` (what every operator reads).
"""

from __future__ import annotations

from ._inputs import group_tasks
from ._kill import KILL_BUDGET_SECONDS
from ._run_operators import OpenJDBeginOperator, OpenJDFinishOperator, OpenJDPlanOperator
from ._summary import checkpoint_summary
from ._task_operator import OpenJDTaskOperator

__all__ = (
    "KILL_BUDGET_SECONDS",
    "OpenJDBeginOperator",
    "OpenJDFinishOperator",
    "OpenJDPlanOperator",
    "OpenJDTaskOperator",
    "checkpoint_summary",
    "group_tasks",
)
