"""What is shown of tasks and runs, the same in every runner (``from core import report``):
a task's summary and timeline, its checkpoints, what an attempt does with a step's tasks, and
the plain words for outcomes and statuses. Reading only: nothing here runs or stores anything.

- ``summarize_task`` / ``TaskSummary``, ``summarize_checkpoint``, ``checkpoint_mark_text``:
  one task's state and its checkpoint, in words;
- ``task_timeline`` / ``TaskTimeline``, ``timeline_text``, ``AttemptBar``, ``utc_moment``,
  ``duration_words``: a task's attempts on a time line (seconds, UTC);
- ``kept_timeline``, ``kept_sentence``, ``kept_words``, ``KeptTask``: what a succeeded run
  kept of its checkpoints;
- ``describe_plan``, ``continuations``: what an attempt does with a step's original tasks, and
  which records continued which;
- ``outcome_sentence``, ``outcome_key``, ``OUTCOME_WORDS``, ``result_words``,
  ``run_status_words``, ``task_status_words``: outcomes and statuses in words;
- ``event_log_line``: what a framework's task log says of a task event.
"""

from core._figures import figures_words, seconds_words
from core._records import KeptTask
from core._words import (
    OUTCOME_WORDS,
    event_log_line,
    kept_words,
    outcome_key,
    outcome_sentence,
    result_words,
    run_status_words,
    task_status_words,
)
from core.job import (
    AttemptBar,
    TaskSummary,
    TaskTimeline,
    checkpoint_mark_text,
    continuations,
    describe_plan,
    duration_words,
    kept_sentence,
    kept_timeline,
    summarize_checkpoint,
    summarize_task,
    task_timeline,
    timeline_text,
    utc_moment,
)

__all__ = (
    "event_log_line",
    "figures_words",
    "seconds_words",
    "OUTCOME_WORDS",
    "AttemptBar",
    "KeptTask",
    "TaskSummary",
    "TaskTimeline",
    "checkpoint_mark_text",
    "continuations",
    "describe_plan",
    "duration_words",
    "kept_sentence",
    "kept_timeline",
    "kept_words",
    "outcome_key",
    "outcome_sentence",
    "result_words",
    "run_status_words",
    "summarize_checkpoint",
    "summarize_task",
    "task_status_words",
    "task_timeline",
    "timeline_text",
    "utc_moment",
)
