"""The Prefect options of a group's task run (``run_group``): its name, its tags, and its
retries, with interruptions kept apart from errors.

A task run stopped because its host is going away (an interruption notice: a spot reclaim, a
maintenance event) did nothing wrong: what its tasks reported is stored and a retry resumes from
it. Such a stop must not use up the retries meant for errors (``task_retries``), and a task
interrupted more often than it has error retries must still finish. Prefect 3.9 has one retry
count per task run (``task_engine.py``, ``handle_retry``: a retry happens while
``retries < task.retries`` and ``retry_condition_fn(task, task_run, state)`` allows it), so:

- the task's ``retries`` is ``task_retries + interruption_retries``, Prefect's cap on both;
- the body raises ``TaskInterrupted`` for an end ``core.classify_group`` calls an interruption
  (``GroupVerdict.interruption``), with how many interruptions the group's task records show in
  this run attempt (``core.interruptions_so_far``), and ``RuntimeError`` (or anything else) for
  an error;
- ``RetryRule``, the ``retry_condition_fn``, counts each kind against its own budget and says in
  the task run's log which budget a retry uses (``interruption 2 of 10 ...``), so the UI shows
  a retry that resumes after an interruption as what it is.

A Prefect retry runs in the same engine (the same process and, on Dask, the same worker), so the
rule's counts live as long as Prefect's own count of the task run's retries.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prefect.logging import get_run_logger

from core import (
    DEFAULT_INTERRUPTION_RETRIES,
    PreparedJob,
    interruption_resumes,
)

__all__ = (
    "DEFAULT_INTERRUPTION_RETRIES",
    "RetryRule",
    "TaskInterrupted",
    "check_retries",
    "requirements",
    "task_run_options",
)


class TaskInterrupted(RuntimeError):  # noqa: N818 (an interruption is not an error)
    """A group's tasks were stopped by their host going away (an interruption notice), not by
    an error: a retry resumes from what they stored, within the interruption budget.

    Attributes:
        interruptions: interruptions of the group's tasks in this run attempt, this one
            included, as their task records show them (``core.interruptions_so_far``; 0 when
            no task had started).
    """

    def __init__(self, message: str, interruptions: int = 0) -> None:
        super().__init__(message)
        self.interruptions = interruptions

    def __reduce__(self) -> tuple[Any, ...]:  # picklable with its count (Dask, result storage)
        return (type(self), (str(self), self.interruptions))


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    try:
        return get_run_logger()
    except Exception:  # outside a task run (a direct call): the package's logger
        return logging.getLogger("prefect_integration")


@dataclass
class RetryRule:
    """A group task run's ``retry_condition_fn``: an interruption (``TaskInterrupted``) is
    retried while the interruptions so far are at most ``interruption_retries``, anything else
    while fewer than ``error_retries`` error retries were used. Each decision is logged in the
    task run's log. One rule per submitted task run (its counts are that task run's).

    Attributes:
        error_retries: the flow's ``task_retries``.
        interruption_retries: the flow's ``interruption_retries``.
        errors: error retries used so far.
        interruptions: interruptions so far (the most of this rule's own count and the task
            records' count).
    """

    error_retries: int
    interruption_retries: int
    errors: int = 0
    interruptions: int = 0

    def __call__(self, task: Any, task_run: Any, state: Any) -> bool:
        exc = getattr(state, "data", None)
        log = _logger()
        name = getattr(task_run, "name", None) or "task run"
        if isinstance(exc, TaskInterrupted):
            self.interruptions, resumes = interruption_resumes(
                exc.interruptions, self.interruptions, self.interruption_retries
            )
            if resumes:
                log.info(
                    "%s: interruption %d of the %d it resumes from (interruption_retries): "
                    "not an error; the retry resumes from what was stored, and the task run "
                    "keeps its %d error retr%s (task_retries)",
                    name,
                    self.interruptions,
                    self.interruption_retries,
                    self.error_retries - self.errors,
                    "y" if self.error_retries - self.errors == 1 else "ies",
                )
                return True
            log.warning(
                "%s: interruption %d, more than interruption_retries=%d: the task run fails "
                "(what its tasks stored is kept: a retry of the flow run resumes from it)",
                name,
                self.interruptions,
                self.interruption_retries,
            )
            return False
        if self.errors < self.error_retries:
            self.errors += 1
            log.info(
                "%s: error retry %d of %d (task_retries)", name, self.errors, self.error_retries
            )
            return True
        log.error(
            "%s failed: %s; no error retry left (task_retries=%d)",
            name,
            exc if exc is not None else getattr(state, "message", state),
            self.error_retries,
        )
        return False


def check_retries(task_retries: int, interruption_retries: int) -> None:
    """Raises ValueError unless both are ints of 0 or more (checked when the flow is made)."""
    for name, value in (
        ("task_retries", task_retries),
        ("interruption_retries", interruption_retries),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an int of 0 or more, not {value!r}")


def requirements(job: PreparedJob, step: str) -> list[str]:
    """The names of a step's host requirements (``amount.*``, ``attr.*``)."""
    reqs = getattr(job.step(step), "hostRequirements", None)
    if reqs is None:
        return []
    names = [a.name for a in (getattr(reqs, "amounts", None) or [])]
    names += [a.name for a in (getattr(reqs, "attributes", None) or [])]
    return names


def task_run_options(
    job: PreparedJob,
    step: str,
    *,
    host_requirements: Mapping[str, Sequence[str]],
    task_retries: int,
    task_retry_delay_seconds: float,
    interruption_retries: int,
    result_storage: Any = None,
) -> dict[str, Any]:
    """``run_group.with_options(**options)`` for the task runs of one step: each is named by
    its ``label`` parameter (``core.group_label`` of its group), tagged with what its step's
    host requirements map to, and retried by ``RetryRule`` (errors and interruptions counted
    apart; ``task_retry_delay_seconds`` before either).

    One set a step, not one a group: ``with_options`` makes a new ``Task``, whose ``__init__``
    reads the function's source (``inspect.getsource``, 3.6 ms here), and the flow body's
    submissions hold the interpreter's lock while the step's first task runs run."""
    options: dict[str, Any] = {
        "task_run_name": "{label}",
        "retries": task_retries + interruption_retries,
        "retry_delay_seconds": task_retry_delay_seconds,
        "retry_condition_fn": RetryRule(task_retries, interruption_retries),
    }
    tags = sorted({t for r in requirements(job, step) for t in host_requirements.get(r, [])})
    if tags:
        options["tags"] = tags
    if result_storage is not None:
        options["result_storage"] = result_storage
    return options
