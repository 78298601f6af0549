"""Planning: which tasks of a step run, how they are named, grouped and chunked.

One unit for everything an executor or a scheduler asks before a task runs, each a pure
function of the job and the records it is given (no store, no I/O):

- ``_spec``: ``TaskSpec``, a task to run, its identity (``task_key_of``), its parameters as a
  record holds them, and every task label (``labelled``, ``task_label``);
- ``_step``: the plan of one step from the records of earlier attempts (``iter_plan``, made
  as it is taken, from a ``PlanHistory`` of the records; ``plan_tasks``, a list), a
  range of its original tasks (``original_tasks``), and the resumed chunks of an adaptive step
  beside its chunker (``adaptive_plan``);
- ``_chunks``: ``AdaptiveChunker``, adaptive chunk sizes (TASK_CHUNKING
  ``targetRuntimeSeconds``);
- ``_groups``: groups of a large step's tasks and their labels (``group_tasks``,
  ``group_label``), and the key a framework persists a group's result under
  (``group_result_key``);
- ``_feed``: a step's tasks as the executor takes them, one at a time (``TaskFeed``, and
  ``AdaptiveFeed``, whose chunks are sized as they are taken; ``step_feed`` picks one).

Each is a function of the job (``PreparedJob``, ``core.job._job``: the template, the parameter
values, the openjd-model ``Job``), a step name and the records; ``PreparedJob`` itself does
no planning. The step graph (``dependencies``, ``step_order``, finally steps) is the
template's (``CheckpointJobTemplate``), read through the job.
"""

from core.job._planning._chunks import AdaptiveChunker, adaptive_chunk_size, group_key, is_adaptive
from core.job._planning._feed import AdaptiveFeed, TaskFeed, step_feed
from core.job._planning._groups import MAX_LABEL_CHARS, group_label, group_result_key, group_tasks
from core.job._planning._spec import (
    TaskSpec,
    labelled,
    new_task_record,
    params_from_record,
    params_to_record,
    task_key_of,
    task_label,
)
from core.job._planning._step import (
    PlanHistory,
    adaptive_plan,
    chunk_parameter,
    iter_plan,
    iter_tasks,
    original_tasks,
    plan_tasks,
    spec_for,
    task_count,
)

__all__ = (
    "MAX_LABEL_CHARS",
    "AdaptiveChunker",
    "AdaptiveFeed",
    "TaskFeed",
    "PlanHistory",
    "TaskSpec",
    "adaptive_chunk_size",
    "adaptive_plan",
    "chunk_parameter",
    "group_key",
    "group_label",
    "group_result_key",
    "group_tasks",
    "is_adaptive",
    "iter_plan",
    "iter_tasks",
    "labelled",
    "new_task_record",
    "original_tasks",
    "params_from_record",
    "params_to_record",
    "plan_tasks",
    "spec_for",
    "step_feed",
    "task_count",
    "task_key_of",
    "task_label",
)
