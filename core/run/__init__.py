"""A run's tasks, driven from any process: the one executor (``_executor``: claims, the session
pool, termination requests, interruption notices, expired leases, phase budgets), a run's
attempts (``_attempt``), its phases and outcome (``_phases``), how signals stop it
(``_escalation``), the step loop every runner walks (``_steps``), how a group of tasks ends for
its framework (``_verdict``) and the caller's handle to stop it (``_group_stop``), deleting
runs and collecting managed files (``_delete``, ``_gc``), and the interruption notice sources
(``_notices``) and settings (``_notice_settings``). Above ``task``; the top floor of core.
"""

from core._figures import (
    METRICS,
    SUGGESTED_INTERVAL_VARIABLE,
    Figure,
    Metric,
    MetricKind,
    RunFigures,
    read_figures,
    run_figures,
    suggested_interval,
)
from core.run._attempt import (
    Attempt,
    begin_attempt,
    iter_attempt_records,
    plan_group,
    plan_step,
    prepare_run_job,
)
from core.run._delete import (
    delete_named_run,
    delete_run,
    finish_interrupted_deletes,
    set_aside_runs,
)
from core.run._escalation import Escalation, StopEscalation
from core.run._executor import StepRun, TaskExecutor, run_tasks
from core.run._gc import DEFAULT_GC_GRACE_SECONDS, collect_file_garbage, holds_managed_files
from core.run._group_stop import GroupStop, StopRequest
from core.run._metrics import MetricSink, OpenTelemetrySink, default_sinks
from core.run._notice_settings import NoticeSettings
from core.run._notices import (
    NOTICE_POLL_ENV,
    NOTICES_ENV,
    Notice,
    NoticeSource,
    SignalSource,
    parse_notice_sources,
    parse_poll_seconds,
)
from core.run._phases import (
    EXIT_CODES,
    RELEASE_WAIT_SECONDS,
    RunOutcome,
    declare_done,
    enter_finally,
    finish_attempt,
    mark_timed_out,
    start_finally,
)
from core.run._steps import StepTurn, StepWalk
from core.run._verdict import (
    DEFAULT_INTERRUPTION_RETRIES,
    GroupEnd,
    GroupVerdict,
    classify_group,
    interruption_resumes,
    interruptions_so_far,
)

__all__ = (
    "METRICS",
    "SUGGESTED_INTERVAL_VARIABLE",
    "Figure",
    "Metric",
    "MetricKind",
    "MetricSink",
    "OpenTelemetrySink",
    "RunFigures",
    "default_sinks",
    "read_figures",
    "run_figures",
    "suggested_interval",
    "DEFAULT_INTERRUPTION_RETRIES",
    "interruption_resumes",
    "interruptions_so_far",
    "Attempt",
    "begin_attempt",
    "classify_group",
    "collect_file_garbage",
    "holds_managed_files",
    "declare_done",
    "DEFAULT_GC_GRACE_SECONDS",
    "delete_named_run",
    "delete_run",
    "enter_finally",
    "Escalation",
    "EXIT_CODES",
    "finish_attempt",
    "finish_interrupted_deletes",
    "set_aside_runs",
    "GroupEnd",
    "GroupStop",
    "GroupVerdict",
    "iter_attempt_records",
    "mark_timed_out",
    "Notice",
    "NOTICE_POLL_ENV",
    "NOTICES_ENV",
    "NoticeSettings",
    "NoticeSource",
    "parse_notice_sources",
    "parse_poll_seconds",
    "plan_group",
    "plan_step",
    "prepare_run_job",
    "RELEASE_WAIT_SECONDS",
    "run_tasks",
    "RunOutcome",
    "SignalSource",
    "start_finally",
    "StepRun",
    "StepTurn",
    "StepWalk",
    "StopEscalation",
    "StopRequest",
    "TaskExecutor",
)
