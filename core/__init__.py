"""openjd-checkpoint core: framework-neutral operations for OpenJD jobs with CHECKPOINT.

Imports neither Airflow nor Prefect. The adapters (``airflow_plugin``, ``prefect_integration``)
and the local CLI (``core.cli``) map these operations onto their frameworks:

- ``load_template`` / ``parse_template``: validate a template (CHECKPOINT RFC idea, seed 000).
- ``prepare_job``: job parameters and job creation (openjd-model).
- ``PreparedJob.plan_step``: the tasks still to run on a resume.
- ``TaskExecution``: run one task; ``stop(StopIntent.CHECKPOINT | CANCEL)`` from any thread.
- ``CheckpointStore``: atomic, versioned records and checkpoint generations (fsspec).
- run-level operations any scheduler calls from any process (``_run``): ``begin_attempt``,
  ``plan_step``, ``run_task``, ``request_termination``, ``enter_finally``, ``finish_attempt``.
- ``JobRunner``: the local scheduler that the CLI uses, on top of those operations.
"""

# Imports are lazy (PEP 562): the CLI starts, and installs its Ctrl-C handling, before the
# heavier modules (openjd-model, pydantic, fsspec) load.
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._chunks import AdaptiveChunker
    from ._errors import OpenJDCheckpointError, RunError, StoreError, TemplateError
    from ._groups import group_label, group_tasks
    from ._host import host_id
    from ._job import (
        PreparedJob,
        TaskSpec,
        framework_parameter_values,
        load_path_mapping_rules,
        plain_value,
        prepare_job,
    )
    from ._messages import (
        DEFAULT_MAX_LINE_BYTES,
        DEFAULT_MAX_STATE_BYTES,
        MessageContext,
        MessageWarning,
        parse_line,
    )
    from ._notices import (
        NOTICE_POLL_ENV,
        NOTICES_ENV,
        Notice,
        NoticeSource,
        SignalSource,
        parse_notice_sources,
        parse_poll_seconds,
    )
    from ._resume import RefusalCode, ResumeHow, ResumeRefusedError
    from ._run import (
        EXIT_CODES,
        Attempt,
        FinallyDecision,
        RunOutcome,
        Termination,
        TerminationMode,
        begin_attempt,
        claim_task,
        enter_finally,
        finish_attempt,
        plan_group,
        plan_step,
        prepare_run_job,
        record_environment_failure,
        record_task_done,
        request_termination,
        run_task,
        run_tasks,
        task_stop_for,
        wait_tasks_released,
    )
    from ._runner import JobRunner, RunResult
    from ._session import Session
    from ._store import (
        CheckpointData,
        CheckpointStore,
        RunCondition,
        RunRecord,
        RunStatus,
        TaskRecord,
        TaskStatus,
        default_store_location,
    )
    from ._summary import (
        CheckpointSummary,
        TaskSummary,
        summarize_checkpoint,
        summarize_task,
        task_label,
    )
    from ._task import StopIntent, TaskEvent, TaskExecution, TaskOutcome, TaskResult
    from ._template import (
        JOB_STATUS_PARAMETER,
        CancelMethod,
        CheckpointJobTemplate,
        load_template,
        parse_template,
    )

_EXPORTS = {
    "Notice": "._notices",
    "NoticeSource": "._notices",
    "parse_notice_sources": "._notices",
    "parse_poll_seconds": "._notices",
    "CancelMethod": "._template",
    "CheckpointData": "._store",
    "CheckpointSummary": "._summary",
    "TaskSummary": "._summary",
    "summarize_checkpoint": "._summary",
    "summarize_task": "._summary",
    "task_label": "._summary",
    "JOB_STATUS_PARAMETER": "._template",
    "NOTICE_POLL_ENV": "._notices",
    "NOTICES_ENV": "._notices",
    "SignalSource": "._notices",
    "CheckpointJobTemplate": "._template",
    "CheckpointStore": "._store",
    "DEFAULT_MAX_LINE_BYTES": "._messages",
    "DEFAULT_MAX_STATE_BYTES": "._messages",
    "EXIT_CODES": "._run",
    "Attempt": "._run",
    "FinallyDecision": "._run",
    "RunOutcome": "._run",
    "Termination": "._termination",
    "begin_attempt": "._run",
    "claim_task": "._run",
    "enter_finally": "._run",
    "finish_attempt": "._run",
    "plan_group": "._run",
    "record_environment_failure": "._run",
    "record_task_done": "._run",
    "wait_tasks_released": "._run",
    "plan_step": "._run",
    "run_tasks": "._run",
    "Session": "._session",
    "AdaptiveChunker": "._chunks",
    "prepare_run_job": "._run",
    "request_termination": "._termination",
    "run_task": "._run",
    "task_stop_for": "._termination",
    "host_id": "._host",
    "JobRunner": "._runner",
    "MessageContext": "._messages",
    "MessageWarning": "._messages",
    "OpenJDCheckpointError": "._errors",
    "PreparedJob": "._job",
    "RefusalCode": "._resume",
    "ResumeHow": "._resume",
    "ResumeRefusedError": "._resume",
    "RunCondition": "._store",
    "RunError": "._errors",
    "RunRecord": "._store",
    "RunResult": "._runner",
    "RunStatus": "._store",
    "StopIntent": "._task",
    "StoreError": "._errors",
    "TaskEvent": "._task",
    "TaskExecution": "._task",
    "TaskOutcome": "._task",
    "TaskRecord": "._store",
    "TaskResult": "._task",
    "TaskSpec": "._job",
    "TaskStatus": "._store",
    "TemplateError": "._errors",
    "TerminationMode": "._termination",
    "default_store_location": "._store",
    "load_path_mapping_rules": "._job",
    "load_template": "._template",
    "parse_line": "._messages",
    "parse_template": "._template",
    "prepare_job": "._job",
    "framework_parameter_values": "._job",
    "plain_value": "._job",
    "group_label": "._groups",
    "group_tasks": "._groups",
}

__all__ = (
    "AdaptiveChunker",
    "Attempt",
    "CancelMethod",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "CheckpointSummary",
    "DEFAULT_MAX_LINE_BYTES",
    "DEFAULT_MAX_STATE_BYTES",
    "EXIT_CODES",
    "JOB_STATUS_PARAMETER",
    "NOTICE_POLL_ENV",
    "NOTICES_ENV",
    "FinallyDecision",
    "JobRunner",
    "MessageContext",
    "MessageWarning",
    "Notice",
    "NoticeSource",
    "SignalSource",
    "OpenJDCheckpointError",
    "PreparedJob",
    "RefusalCode",
    "ResumeHow",
    "ResumeRefusedError",
    "RunCondition",
    "RunError",
    "RunRecord",
    "RunOutcome",
    "RunResult",
    "RunStatus",
    "Session",
    "StopIntent",
    "StoreError",
    "TaskEvent",
    "TaskExecution",
    "TaskOutcome",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskStatus",
    "TaskSummary",
    "TemplateError",
    "Termination",
    "TerminationMode",
    "begin_attempt",
    "claim_task",
    "default_store_location",
    "enter_finally",
    "finish_attempt",
    "group_label",
    "group_tasks",
    "host_id",
    "load_path_mapping_rules",
    "load_template",
    "parse_line",
    "parse_notice_sources",
    "parse_poll_seconds",
    "parse_template",
    "plan_group",
    "plan_step",
    "record_environment_failure",
    "record_task_done",
    "prepare_job",
    "framework_parameter_values",
    "plain_value",
    "prepare_run_job",
    "request_termination",
    "run_task",
    "run_tasks",
    "summarize_checkpoint",
    "summarize_task",
    "task_label",
    "task_stop_for",
    "wait_tasks_released",
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
