"""openjd-checkpoint core: framework-neutral operations for OpenJD jobs with CHECKPOINT.

The one face of core for the adapters (``airflow_plugin``, ``prefect_integration``): they
import only what this list names (``make lint``: an import-linter contract). The command line
(``core.cli``) also imports ``core.local``, the face of the local runner. Imports neither
Airflow nor Prefect.

- Templates and jobs: ``load_template`` (CHECKPOINT RFC idea, seed 000), ``prepare_job``,
  ``prepare_run_job`` (from a run's record: in another process, or an operator resume),
  ``PreparedJob``, ``TaskSpec``.
- Planning: ``plan_step`` / ``plan_group`` (from the store), ``plan_tasks`` /
  ``original_tasks`` (from given records), groups of a large step.
- A run's life, from any process: ``begin_attempt``, ``run_tasks`` (the one executor),
  ``request_termination``, ``start_finally``, ``finish_attempt``, ``declare_done``; a
  ``GroupStop`` handle stops the tasks of a ``run_tasks`` call; ``classify_group`` says how
  they end for the framework (``GroupVerdict``, a ``GroupEnd``).
- ``CheckpointStore``: atomic, versioned records and checkpoint generations (fsspec); the
  settings every runner reads the same way: ``FileSettings`` (file data flow and roots),
  ``NoticeSettings`` (interruption notices).
- ``StepWalk``: the steps of a phase in dependency order, and which are blocked.
- ``report``: what is shown of tasks and runs (summaries, timelines, words), one namespace.

Packages below this face, top to bottom (docs/core-api.md): ``run``, ``task``, ``job`` |
``store`` | ``files``, ``fs`` | ``process``, then the leaf modules.
"""

from core import _interrupts

with _interrupts.held():  # a Ctrl-C during these imports is delivered after them
    from core import report
    from core._errors import RunError, StoreError, TemplateError
    from core._host import FileDataFlow, FileSettings, host_id
    from core._records import (
        CheckpointData,
        InterruptionCause,
        RunPhase,
        RunRecord,
        RunStatus,
        TaskRecord,
    )
    from core.job import (
        JOB_STATUS_PARAMETER,
        CheckpointJobTemplate,
        PreparedJob,
        TaskSpec,
        framework_parameter_values,
        group_label,
        group_result_key,
        group_tasks,
        load_template,
        original_tasks,
        plain_value,
        plan_tasks,
        prepare_job,
    )
    from core.run import (
        DEFAULT_INTERRUPTION_RETRIES,
        RELEASE_WAIT_SECONDS,
        Attempt,
        Figure,
        GroupEnd,
        GroupStop,
        GroupVerdict,
        MetricKind,
        MetricSink,
        Notice,
        NoticeSettings,
        NoticeSource,
        RunOutcome,
        StepWalk,
        StopEscalation,
        begin_attempt,
        classify_group,
        declare_done,
        default_sinks,
        finish_attempt,
        interruption_resumes,
        interruptions_so_far,
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
    "report",
    "Attempt",
    "begin_attempt",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "classify_group",
    "declare_done",
    "default_sinks",
    "DEFAULT_INTERRUPTION_RETRIES",
    "default_store_location",
    "FileDataFlow",
    "Figure",
    "FileSettings",
    "finish_attempt",
    "framework_parameter_values",
    "group_label",
    "group_result_key",
    "group_tasks",
    "GroupEnd",
    "GroupStop",
    "GroupVerdict",
    "host_id",
    "InterruptionCause",
    "interruption_resumes",
    "interruptions_so_far",
    "JOB_STATUS_PARAMETER",
    "load_template",
    "MetricKind",
    "MetricSink",
    "Notice",
    "NoticeSettings",
    "NoticeSource",
    "original_tasks",
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
    "ResumeHow",
    "ResumeRefusedError",
    "run_file_flow",
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
    "TaskEvent",
    "TaskEventKind",
    "TaskExecution",
    "TaskOutcome",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TemplateError",
    "Termination",
    "termination_choices",
    "TerminationMode",
)
