"""openjd-checkpoint core: framework-neutral operations for OpenJD jobs with CHECKPOINT.

Imports neither Airflow nor Prefect. The adapters (``airflow_plugin``, ``prefect_integration``)
and the local CLI (``core.cli``) map these operations onto their frameworks:

- ``load_template`` / ``parse_template``: validate a template (CHECKPOINT RFC idea, seed 000).
- ``prepare_job``: job parameters and job creation (openjd-model).
- ``PreparedJob.plan_step``: the tasks still to run on a resume.
- ``TaskExecution``: run one task; ``stop(StopIntent.CHECKPOINT | CANCEL)`` from any thread.
- ``CheckpointStore``: atomic, versioned records and checkpoint generations (fsspec).
- run-level operations any scheduler calls from any process: ``begin_attempt``, ``plan_step``
  / ``plan_group``, ``request_termination``, ``enter_finally``, ``finish_attempt``.
- ``TaskExecutor`` / ``run_tasks``: the one executor of a run's tasks in sessions, under its
  termination requests and interruption notices, that every runner (the CLI included) uses.
"""

# Imports are lazy (PEP 562): the CLI starts, and installs its Ctrl-C handling, before the
# heavier modules (openjd-model, pydantic, fsspec) load.
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._action import StopIntent
    from ._attempt import (
        Attempt,
        attempt_records,
        begin_attempt,
        delete_run,
        iter_attempt_records,
        plan_group,
        plan_step,
        prepare_run_job,
    )
    from ._errors import OpenJDCheckpointError, RunError, StoreError, TemplateError
    from ._escalation import Escalation, StopEscalation
    from ._executor import StepRun, TaskExecutor, run_task, run_tasks
    from ._fs import MAX_RECORD_BYTES
    from ._gc import DEFAULT_GC_GRACE_SECONDS, collect_file_garbage
    from ._host import host_id
    from ._inputs import decode_json, load_document, read_input_file
    from ._job import (
        PreparedJob,
        framework_parameter_values,
        load_environment_template,
        load_path_mapping_rules,
        plain_value,
        prepare_job,
    )
    from ._lease import LEASE_SECONDS_ENV
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
    from ._phases import (
        EXIT_CODES,
        RELEASE_WAIT_SECONDS,
        FinallyDecision,
        RunOutcome,
        declare_done,
        enter_finally,
        finish_attempt,
        mark_timed_out,
        record_task_done,
        start_finally,
        wait_tasks_released,
    )
    from ._planning import (
        AdaptiveChunker,
        AdaptiveFeed,
        PlanHistory,
        TaskFeed,
        TaskSpec,
        group_label,
        group_result_key,
        group_tasks,
        step_feed,
        task_label,
    )
    from ._reaper import become_child_subreaper
    from ._records import (
        AttemptSpan,
        CheckpointData,
        RunCondition,
        RunRecord,
        RunStatus,
        TaskRecord,
        TaskStatus,
    )
    from ._resume import RefusalCode, ResumeHow, ResumeRefusedError
    from ._session import Session, clean_stale_sessions
    from ._store import CheckpointStore, default_store_location
    from ._summary import (
        AttemptBar,
        CheckpointMark,
        CheckpointSummary,
        TaskSummary,
        TaskTimeline,
        describe_plan,
        summarize_checkpoint,
        summarize_task,
        task_timeline,
        timeline_text,
    )
    from ._task import TaskEvent, TaskExecution, TaskOutcome, TaskResult
    from ._template import (
        JOB_STATUS_PARAMETER,
        CancelMethod,
        CheckpointJobTemplate,
        load_template,
        parse_template,
    )
    from ._termination import Termination, TerminationMode, request_termination
    from ._words import (
        OUTCOME_WORDS,
        describe_exit,
        outcome_key,
        outcome_sentence,
        run_status_words,
    )

_EXPORTS = {
    "AdaptiveChunker": "._planning",
    "AdaptiveFeed": "._planning",
    "Attempt": "._attempt",
    "CancelMethod": "._template",
    "CheckpointData": "._records",
    "CheckpointJobTemplate": "._template",
    "CheckpointStore": "._store",
    "CheckpointSummary": "._summary",
    "DEFAULT_GC_GRACE_SECONDS": "._gc",
    "DEFAULT_MAX_LINE_BYTES": "._messages",
    "DEFAULT_MAX_STATE_BYTES": "._messages",
    "EXIT_CODES": "._phases",
    "Escalation": "._escalation",
    "FinallyDecision": "._phases",
    "JOB_STATUS_PARAMETER": "._template",
    "MAX_RECORD_BYTES": "._fs",
    "MessageContext": "._messages",
    "MessageWarning": "._messages",
    "NOTICES_ENV": "._notices",
    "NOTICE_POLL_ENV": "._notices",
    "Notice": "._notices",
    "NoticeSource": "._notices",
    "OUTCOME_WORDS": "._words",
    "LEASE_SECONDS_ENV": "._lease",
    "OpenJDCheckpointError": "._errors",
    "PreparedJob": "._job",
    "RELEASE_WAIT_SECONDS": "._phases",
    "RefusalCode": "._resume",
    "ResumeHow": "._resume",
    "ResumeRefusedError": "._resume",
    "RunCondition": "._records",
    "RunError": "._errors",
    "RunOutcome": "._phases",
    "RunRecord": "._records",
    "RunStatus": "._records",
    "Session": "._session",
    "SignalSource": "._notices",
    "StepRun": "._executor",
    "StopEscalation": "._escalation",
    "StopIntent": "._action",
    "StoreError": "._errors",
    "TaskEvent": "._task",
    "TaskExecution": "._task",
    "TaskExecutor": "._executor",
    "TaskFeed": "._planning",
    "PlanHistory": "._planning",
    "iter_attempt_records": "._attempt",
    "TaskOutcome": "._task",
    "TaskRecord": "._records",
    "TaskResult": "._task",
    "TaskSpec": "._planning",
    "TaskStatus": "._records",
    "TaskSummary": "._summary",
    "TaskTimeline": "._summary",
    "AttemptBar": "._summary",
    "CheckpointMark": "._summary",
    "AttemptSpan": "._records",
    "TemplateError": "._errors",
    "Termination": "._termination",
    "TerminationMode": "._termination",
    "attempt_records": "._attempt",
    "begin_attempt": "._attempt",
    "clean_stale_sessions": "._session",
    "collect_file_garbage": "._gc",
    "declare_done": "._phases",
    "decode_json": "._inputs",
    "default_store_location": "._store",
    "delete_run": "._attempt",
    "become_child_subreaper": "._reaper",
    "describe_exit": "._words",
    "describe_plan": "._summary",
    "enter_finally": "._phases",
    "finish_attempt": "._phases",
    "framework_parameter_values": "._job",
    "group_label": "._planning",
    "group_result_key": "._planning",
    "group_tasks": "._planning",
    "host_id": "._host",
    "load_document": "._inputs",
    "load_environment_template": "._job",
    "load_path_mapping_rules": "._job",
    "load_template": "._template",
    "mark_timed_out": "._phases",
    "outcome_key": "._words",
    "outcome_sentence": "._words",
    "parse_line": "._messages",
    "parse_notice_sources": "._notices",
    "parse_poll_seconds": "._notices",
    "parse_template": "._template",
    "plain_value": "._job",
    "plan_group": "._attempt",
    "plan_step": "._attempt",
    "prepare_job": "._job",
    "prepare_run_job": "._attempt",
    "read_input_file": "._inputs",
    "record_task_done": "._phases",
    "request_termination": "._termination",
    "run_status_words": "._words",
    "run_task": "._executor",
    "run_tasks": "._executor",
    "start_finally": "._phases",
    "step_feed": "._planning",
    "summarize_checkpoint": "._summary",
    "summarize_task": "._summary",
    "task_timeline": "._summary",
    "timeline_text": "._summary",
    "task_label": "._planning",
    "wait_tasks_released": "._phases",
}

__all__ = (
    "AdaptiveChunker",
    "AdaptiveFeed",
    "Attempt",
    "CancelMethod",
    "CheckpointData",
    "CheckpointJobTemplate",
    "CheckpointStore",
    "CheckpointSummary",
    "DEFAULT_GC_GRACE_SECONDS",
    "DEFAULT_MAX_LINE_BYTES",
    "LEASE_SECONDS_ENV",
    "DEFAULT_MAX_STATE_BYTES",
    "EXIT_CODES",
    "Escalation",
    "FinallyDecision",
    "JOB_STATUS_PARAMETER",
    "MAX_RECORD_BYTES",
    "MessageContext",
    "MessageWarning",
    "NOTICES_ENV",
    "NOTICE_POLL_ENV",
    "Notice",
    "NoticeSource",
    "OUTCOME_WORDS",
    "OpenJDCheckpointError",
    "PreparedJob",
    "RELEASE_WAIT_SECONDS",
    "RefusalCode",
    "ResumeHow",
    "ResumeRefusedError",
    "RunCondition",
    "RunError",
    "RunOutcome",
    "RunRecord",
    "RunStatus",
    "Session",
    "SignalSource",
    "StepRun",
    "StopEscalation",
    "StopIntent",
    "StoreError",
    "TaskEvent",
    "TaskExecution",
    "TaskExecutor",
    "TaskFeed",
    "PlanHistory",
    "TaskOutcome",
    "TaskRecord",
    "TaskResult",
    "TaskSpec",
    "TaskStatus",
    "TaskSummary",
    "TaskTimeline",
    "AttemptBar",
    "CheckpointMark",
    "AttemptSpan",
    "TemplateError",
    "Termination",
    "TerminationMode",
    "attempt_records",
    "become_child_subreaper",
    "begin_attempt",
    "clean_stale_sessions",
    "collect_file_garbage",
    "declare_done",
    "decode_json",
    "default_store_location",
    "delete_run",
    "describe_exit",
    "describe_plan",
    "enter_finally",
    "finish_attempt",
    "framework_parameter_values",
    "group_label",
    "group_result_key",
    "group_tasks",
    "host_id",
    "iter_attempt_records",
    "load_document",
    "load_environment_template",
    "load_path_mapping_rules",
    "load_template",
    "mark_timed_out",
    "outcome_key",
    "outcome_sentence",
    "parse_line",
    "parse_notice_sources",
    "parse_poll_seconds",
    "parse_template",
    "plain_value",
    "plan_group",
    "plan_step",
    "prepare_job",
    "prepare_run_job",
    "read_input_file",
    "record_task_done",
    "request_termination",
    "run_status_words",
    "run_task",
    "run_tasks",
    "start_finally",
    "step_feed",
    "summarize_checkpoint",
    "summarize_task",
    "task_timeline",
    "timeline_text",
    "task_label",
    "wait_tasks_released",
)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
