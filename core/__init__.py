"""openjd-checkpoint core: framework-neutral operations for OpenJD jobs with CHECKPOINT.

The one face of core for the adapters (``airflow_plugin``, ``prefect_integration``): they
import only what this list names (``make lint``: an import-linter contract). The command line
(``core.cli``) also imports ``core.local``, the face of the local runner. Imports neither
Airflow nor Prefect.

- Templates and jobs: ``load_template`` (CHECKPOINT RFC idea, seed 000), ``prepare_job``,
  ``prepare_run_job`` (in another process), ``PreparedJob``, ``TaskSpec``.
- Planning: ``plan_step`` / ``plan_group`` (from the store), ``plan_tasks`` /
  ``original_tasks`` (from given records), groups of a large step.
- A run's life, from any process: ``begin_attempt``, ``run_tasks`` (the one executor),
  ``request_termination``, ``start_finally``, ``finish_attempt``, ``declare_done``.
- ``CheckpointStore``: atomic, versioned records and checkpoint generations (fsspec); the
  settings every runner reads the same way: ``FileSettings`` (file data flow and roots),
  ``NoticeSettings`` (interruption notices).
- ``StepWalk``: the steps of a phase in dependency order, and which are blocked.
- What is shown of tasks and runs: summaries, timelines and their words.

Packages below this face, top to bottom (docs/core-api.md): ``run``, ``task``, ``job`` |
``store`` | ``files``, ``fs`` | ``process``, then the leaf modules.
"""

from core import _interrupts

with _interrupts.held():  # a Ctrl-C during these imports is delivered after them
    from core._errors import RunError, StoreError, TemplateError
    from core._host import FileDataFlow, FileSettings, host_id
    from core._records import (
        CheckpointData,
        KeptTask,
        RunPhase,
        RunRecord,
        RunStatus,
        TaskRecord,
    )
    from core._words import (
        OUTCOME_WORDS,
        kept_words,
        outcome_key,
        outcome_sentence,
        result_words,
        run_status_words,
        task_status_words,
    )
    from core.job import (
        JOB_STATUS_PARAMETER,
        AttemptBar,
        CheckpointJobTemplate,
        PreparedJob,
        TaskSpec,
        TaskSummary,
        TaskTimeline,
        checkpoint_mark_text,
        continuations,
        describe_plan,
        duration_words,
        framework_parameter_values,
        group_label,
        group_result_key,
        group_tasks,
        kept_sentence,
        kept_timeline,
        load_template,
        original_tasks,
        plain_value,
        plan_tasks,
        prepare_job,
        summarize_checkpoint,
        summarize_task,
        task_timeline,
        timeline_text,
        utc_moment,
    )
    from core.run import (
        RELEASE_WAIT_SECONDS,
        Attempt,
        Notice,
        NoticeSettings,
        NoticeSource,
        RunOutcome,
        StepWalk,
        StopEscalation,
        begin_attempt,
        declare_done,
        finish_attempt,
        plan_group,
        plan_step,
        prepare_run_job,
        run_tasks,
        start_finally,
    )
    from core.store import CheckpointStore, default_store_location, run_file_flow
    from core.task import (
        RefusalCode,
        ResumeHow,
        ResumeRefusedError,
        StopIntent,
        TaskEvent,
        TaskEventKind,
        TaskExecution,
        TaskOutcome,
        TaskResult,
        Termination,
        TerminationMode,
        request_termination,
        termination_choices,
    )

__all__ = (
    "Attempt",
    "AttemptBar",
    "begin_attempt",
    "checkpoint_mark_text",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "continuations",
    "declare_done",
    "default_store_location",
    "describe_plan",
    "duration_words",
    "FileDataFlow",
    "FileSettings",
    "finish_attempt",
    "framework_parameter_values",
    "group_label",
    "group_result_key",
    "group_tasks",
    "host_id",
    "JOB_STATUS_PARAMETER",
    "kept_sentence",
    "kept_timeline",
    "kept_words",
    "KeptTask",
    "load_template",
    "Notice",
    "NoticeSettings",
    "NoticeSource",
    "original_tasks",
    "outcome_key",
    "outcome_sentence",
    "OUTCOME_WORDS",
    "plain_value",
    "plan_group",
    "plan_step",
    "plan_tasks",
    "prepare_job",
    "prepare_run_job",
    "PreparedJob",
    "RefusalCode",
    "RELEASE_WAIT_SECONDS",
    "request_termination",
    "result_words",
    "ResumeHow",
    "ResumeRefusedError",
    "run_file_flow",
    "run_status_words",
    "run_tasks",
    "RunError",
    "RunOutcome",
    "RunPhase",
    "RunRecord",
    "RunStatus",
    "start_finally",
    "StepWalk",
    "StopEscalation",
    "StopIntent",
    "StoreError",
    "summarize_checkpoint",
    "summarize_task",
    "task_status_words",
    "task_timeline",
    "TaskEvent",
    "TaskEventKind",
    "TaskExecution",
    "TaskOutcome",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskSummary",
    "TaskTimeline",
    "TemplateError",
    "Termination",
    "termination_choices",
    "TerminationMode",
    "timeline_text",
    "utc_moment",
)
