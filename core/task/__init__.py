"""One task, and the session it runs in: ``TaskExecution`` (``_task``) runs its actions through
``ActionRunner``, reads its stdout protocol (``_protocol``) and keeps its record and checkpoints
(``_recorder``, managed files through ``_task_files``); ``Session`` (``_session``) holds a
session's working folder and environments; resume rules (``_resume``), stop modes
(``_termination``), one action's process under a stop request (``_action``), symbol tables
(``_symbols``), WRAP_ACTIONS hooks (``_wrap``), attempt spans (``_history``).
"""

from core.task._action import StopIntent
from core.task._events import TaskEvent, TaskEventKind
from core.task._resume import (
    RefusalCode,
    ResumeHow,
    ResumeRefusedError,
    check_chain,
    check_input,
    check_run,
    no_run_words,
    plan_resume,
    set_aside_words,
)
from core.task._session import Session, clean_stale_sessions
from core.task._task import TaskExecution, TaskOutcome, TaskResult
from core.task._termination import (
    RunWatcher,
    Termination,
    TerminationMode,
    fold_request,
    force_reaches,
    request_or_fold,
    request_termination,
    resolve_termination,
    run_is_live,
    runner_lost,
    starts_no_tasks,
    task_stop_for,
    termination_choices,
)

__all__ = (
    "check_chain",
    "check_input",
    "check_run",
    "clean_stale_sessions",
    "fold_request",
    "force_reaches",
    "no_run_words",
    "set_aside_words",
    "plan_resume",
    "RefusalCode",
    "request_or_fold",
    "request_termination",
    "resolve_termination",
    "ResumeHow",
    "ResumeRefusedError",
    "run_is_live",
    "runner_lost",
    "RunWatcher",
    "Session",
    "starts_no_tasks",
    "StopIntent",
    "task_stop_for",
    "TaskEvent",
    "TaskEventKind",
    "TaskExecution",
    "TaskOutcome",
    "TaskResult",
    "Termination",
    "termination_choices",
    "TerminationMode",
)
