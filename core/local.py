"""The face of core for the local runner (the ``openjd-checkpoint`` command, ``core.cli``):
what a process that drives a whole run itself needs beyond ``core``'s face for the adapters:
the executor's step loop and its run lease, the finally phase and time limits, deleting
runs and collecting managed files (``gc``), reading inputs, action containment.
"""

from core._errors import LeaseLostError, OpenJDCheckpointError
from core._records import RunCondition
from core._words import describe_exit, program_words
from core.fs import MAX_RECORD_BYTES
from core.job import (
    PlanHistory,
    decode_json,
    iter_plan,
    load_document,
    load_environment_template,
    load_path_mapping_rules,
    read_input_file,
    step_feed,
)
from core.process import action_containment, become_child_subreaper
from core.run import (
    DEFAULT_GC_GRACE_SECONDS,
    EXIT_CODES,
    METRICS,
    NOTICE_POLL_ENV,
    NOTICES_ENV,
    SUGGESTED_INTERVAL_VARIABLE,
    Escalation,
    StepRun,
    TaskExecutor,
    collect_file_garbage,
    delete_named_run,
    delete_run,
    enter_finally,
    finish_interrupted_deletes,
    holds_managed_files,
    iter_attempt_records,
    mark_timed_out,
    read_figures,
    run_figures,
    set_aside_runs,
)
from core.store import run_files_mode
from core.task import clean_stale_sessions, no_run_words, runner_lost

__all__ = (
    "action_containment",
    "become_child_subreaper",
    "clean_stale_sessions",
    "collect_file_garbage",
    "decode_json",
    "DEFAULT_GC_GRACE_SECONDS",
    "delete_named_run",
    "delete_run",
    "describe_exit",
    "enter_finally",
    "Escalation",
    "EXIT_CODES",
    "METRICS",
    "read_figures",
    "run_figures",
    "set_aside_runs",
    "SUGGESTED_INTERVAL_VARIABLE",
    "finish_interrupted_deletes",
    "holds_managed_files",
    "iter_attempt_records",
    "iter_plan",
    "LeaseLostError",
    "load_document",
    "load_environment_template",
    "load_path_mapping_rules",
    "mark_timed_out",
    "MAX_RECORD_BYTES",
    "no_run_words",
    "program_words",
    "NOTICE_POLL_ENV",
    "NOTICES_ENV",
    "OpenJDCheckpointError",
    "PlanHistory",
    "read_input_file",
    "run_files_mode",
    "RunCondition",
    "runner_lost",
    "step_feed",
    "StepRun",
    "TaskExecutor",
)
