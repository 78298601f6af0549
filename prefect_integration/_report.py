"""What a stopped flow run tells a person, and where (translation only): how to resume it, a
line per suspended task, Prefect's own ``Finished in state`` line of our stopped task runs at
INFO instead of ERROR, and the one line a directly called flow ends with when it was stopped,
instead of a ``CancelledRun`` traceback."""

from __future__ import annotations

import logging
import os
import sys
import threading
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any

import core

__all__ = (
    "end_uncaught_quietly",
    "flow_entrypoint",
    "kept_line",
    "quiet_engine_exit",
    "quiet_finished_line",
    "resume_hint",
    "under_runner",
)


def under_runner(flow_run: Any) -> bool:
    """True when this process runs a flow run for a Prefect runner or worker, which SIGKILLs it
    30 s after the SIGTERM of a cancel: a flow run of a deployment (``flow.serve()``, a work
    pool), or a flow run in a process such a runner started (a worker sets
    ``$PREFECT__FLOW_RUN_ID``, ``flow.serve()`` ``$PREFECT__DEPLOYMENT_NAME``; a subflow
    there). False for a flow called directly (a script, ``prefect flow-run retry
    --entrypoint``), which nothing kills."""
    return (
        getattr(flow_run, "deployment_id", None) is not None
        or bool(os.environ.get("PREFECT__FLOW_RUN_ID"))
        or bool(os.environ.get("PREFECT__DEPLOYMENT_NAME"))
    )


def flow_entrypoint(flow: Any, source_file: str | None) -> str | None:
    """``FILE.py:NAME`` of a flow object defined at the top of its module (what ``prefect
    flow-run retry --entrypoint`` and deployments take), FILE relative to the current folder
    when it is under it; None when the module holds no name for it."""
    fn = getattr(flow, "fn", None)
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None) or source_file
    if module is None or not path:
        return None
    names = [name for name, value in vars(module).items() if value is flow]
    if not names:
        return None
    rel = os.path.relpath(path)
    return f"{path if rel.startswith('..') else rel}:{names[0]}"


def resume_hint(
    flow_run_id: uuid.UUID | str | None,
    *,
    deployment: bool | None = False,
    entrypoint: str | None = None,
) -> str:
    """How to resume a stopped flow run, for a person: a retry of the same flow run (``prefect
    flow-run retry ID``; one not from a deployment needs the flow's code, ``--entrypoint
    FILE.py:NAME``, and runs where the command is run) or a new flow run with
    ``resume=latest``. The retry is named only as a command that works as written: from a
    deployment, or with the flow's real entrypoint; else the new flow run alone, saying why.

    Args:
        deployment: whether the flow run is from a deployment (None: not known here).
        entrypoint: ``FILE.py:NAME`` of the flow (``flow_entrypoint``), if known.
    """
    new_run = "a new flow run with resume=latest"
    if flow_run_id is None:
        return f"resume with {new_run}"
    retry = f"prefect flow-run retry {flow_run_id}"
    if deployment:
        return f"resume with `{retry}` or {new_run}"
    if deployment is None:
        return f"resume with {new_run} (or, if the flow run is from a deployment, `{retry}`)"
    if entrypoint:
        return f"resume with `{retry} --entrypoint {entrypoint}` or {new_run}"
    return (
        f"resume with {new_run} (`{retry}` would need the flow's file and name, and this "
        "flow is not a name at the top of a module)"
    )


def kept_line(label: str, result: core.TaskResult, hint: str) -> str | None:
    """The INFO line of a task that was stopped with something kept to resume from, in the
    core's words (``core.report.result_words``) and the files the checkpoint names: ``Train:
    suspended; checkpoint generation 7 kept (2 file(s), kept by the store); resume with ...``.
    None for a task that succeeded or failed."""
    if result.outcome in (
        core.TaskOutcome.SUCCEEDED,
        core.TaskOutcome.FAILED,
        core.TaskOutcome.NOT_STORED,
    ):
        return None
    if result.outcome == core.TaskOutcome.SKIPPED:
        return f"{label}: not started, the run is stopping; {hint}"
    words = core.report.result_words(result)
    ckpt = core.report.summarize_task(result.record).checkpoint
    if ckpt is not None:
        where = ", kept by the store" if ckpt.files_mode == "managed" else ""
        words += f" ({ckpt.named} file(s){where})"
    elif (
        core.report.kept_words(result.record) is None
        and result.outcome == core.TaskOutcome.CANCELED
    ):
        words += "; nothing kept, it runs from the top when resumed"
    return f"{label}: {words}; {hint}"


# --- Prefect's "Finished in state" line of our stopped task runs --------------------------------
_QUIET: set[str] = set()
_QUIET_LOCK = threading.Lock()
_FILTER: _StoppedAtInfo | None = None


class _StoppedAtInfo(logging.Filter):
    """On Prefect's task run logger: the ``Finished in state`` record of a task run named in
    ``_QUIET`` (our task runs that a stop of the run ended, resumable) is logged at INFO;
    every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        task_run_id = getattr(record, "task_run_id", None)
        if (
            task_run_id is not None
            and record.levelno == logging.ERROR
            and str(record.msg).startswith("Finished in state")
        ):
            with _QUIET_LOCK:
                quiet = str(task_run_id) in _QUIET
                _QUIET.discard(str(task_run_id))
            if quiet:
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def quiet_finished_line(task_run_id: uuid.UUID | str) -> None:
    """Have Prefect log this task run's ``Finished in state`` line at INFO: it is one of ours,
    stopped by a stop of its run (``Cancelled``, named ``Stopped``), which Prefect 3.9 logs at
    ERROR like any state that is not Completed. Only that task run's line changes."""
    global _FILTER
    with _QUIET_LOCK:
        _QUIET.add(str(task_run_id))
        if _FILTER is None:
            _FILTER = _StoppedAtInfo()
            logging.getLogger("prefect.task_runs").addFilter(_FILTER)


# --- Prefect's "Engine execution exited" traceback of our stopped flow runs, under a worker ------
_ENGINE_EXIT = "Engine execution exited with unexpected exception"
_QUIET_FLOWS: dict[str, str] = {}
_FLOW_FILTER: _EngineExitAtInfo | None = None


class _EngineExitAtInfo(logging.Filter):
    """On Prefect's flow run logger: the ``Engine execution exited with unexpected exception``
    record (ERROR, with a traceback) that Prefect's engine under a worker logs for a flow run
    that ends by raising, when the flow run is one of ours named in ``_QUIET_FLOWS`` and the
    exception is the ``CancelledRun`` of the state we ended it in (a stop that was asked): it
    becomes one INFO line without the traceback. Every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        flow_run_id = getattr(record, "flow_run_id", None)
        if flow_run_id is None or record.levelno != logging.ERROR or record.msg != _ENGINE_EXIT:
            return True
        from prefect.exceptions import CancelledRun

        exc = record.exc_info[1] if record.exc_info else None
        with _QUIET_LOCK:
            message = _QUIET_FLOWS.pop(str(flow_run_id), None)
        if message is not None and isinstance(exc, CancelledRun) and str(exc) == message:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "Engine execution ended as asked: %s", (message,)
            record.exc_info, record.exc_text = None, None
        return True


def quiet_engine_exit(flow_run_id: uuid.UUID | str, message: str) -> None:
    """Have Prefect's engine log the end of this flow run, stopped as asked in a state whose
    message is ``message`` (``Suspended`` and the other termination modes raise
    ``CancelledRun``), as one INFO line instead of an ERROR traceback. Only that flow run's
    record of that exception changes."""
    global _FLOW_FILTER
    with _QUIET_LOCK:
        _QUIET_FLOWS[str(flow_run_id)] = message
        if _FLOW_FILTER is None:
            _FLOW_FILTER = _EngineExitAtInfo()
            logging.getLogger("prefect.flow_runs").addFilter(_FLOW_FILTER)


# --- the end of a directly called flow -----------------------------------------------------------
def end_uncaught_quietly(
    message: str, line: str, write: Callable[[str], Any] | None = None
) -> None:
    """If a ``prefect.exceptions.CancelledRun`` whose message is ``message`` (the flow run's
    final state's) reaches the top of this process uncaught, print ``line`` to stderr instead
    of its traceback (Python still exits with status 1). Any other exception, and this one when
    caught, is left alone: the hook before this one handles it."""
    from prefect.exceptions import CancelledRun

    previous = sys.excepthook
    out = write or sys.stderr.write

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if isinstance(exc, CancelledRun) and str(exc) == message:
            out(line + "\n")
            return
        previous(kind, exc, tb)

    sys.excepthook = hook
