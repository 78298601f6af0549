"""What a framework does with a group of tasks run by ``run_tasks``: the one classification of
its results into how the framework unit (an Airflow task instance's try, a Prefect task run)
ends. The adapters map the kinds onto their framework (Airflow's exceptions, Prefect's states);
none decides them again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from core._errors import RunError
from core._figures import span_interruption
from core._records import InterruptionCause, TaskRecord
from core._words import result_words
from core.job import TaskSpec
from core.run._notices import Notice
from core.task import ResumeRefusedError, TaskOutcome, TaskResult

__all__ = (
    "DEFAULT_INTERRUPTION_RETRIES",
    "GroupEnd",
    "GroupVerdict",
    "classify_group",
    "interruption_resumes",
    "interruptions_so_far",
)

DEFAULT_INTERRUPTION_RETRIES = 10
"""How many interruptions (notices, lost workers) a framework unit resumes from without using
a retry meant for errors, unless its settings say otherwise (Airflow's operators, Prefect's
tasks: ``interruption_retries``)."""

_HOST_GONE = (InterruptionCause.NOTICE, InterruptionCause.WORKER_LOST)


class GroupEnd(str, Enum):
    """How a group's framework unit ends (``classify_group``), in the order it is decided."""

    DECLARED_DONE = "declared_done"
    """The scheduler's user declared the group done (Airflow's "mark success"): the framework
    unit succeeds; the adapter records its tasks done (``declare_done``)."""
    REFUSED = "refused"
    """``run_tasks`` raised ``RunError`` (the run is gone or has ended): fail, no retry (a retry
    would read the same run)."""
    INTERRUPTED = "interrupted"
    """A stop of this process's tasks (the framework's kill or timeout, an interruption notice)
    ended the group; what its tasks reported is stored: fail, and the retry resumes."""
    FAILED = "failed"
    """A task failed or its end could not be stored, or ``run_tasks`` raised anything else
    (``ResumeRefusedError``: another process still runs a task): fail, and retry."""
    STOPPED = "stopped"
    """The run's termination request stopped tasks (or left some not started after others
    ran): fail, no retry (a Prefect ``Cancelled`` state); the run's resume continues them."""
    SKIPPED = "skipped"
    """No task started: the run was already stopping (Airflow's skipped; a Prefect
    ``Cancelled`` state)."""
    SUCCEEDED = "succeeded"
    """Every task succeeded (or none was left to run)."""

    @property
    def retry(self) -> bool:
        """True for an end the framework's retry takes up (``INTERRUPTED``, ``FAILED``)."""
        return self in (GroupEnd.INTERRUPTED, GroupEnd.FAILED)


@dataclass(frozen=True)
class GroupVerdict:
    """How a group ends (``classify_group``).

    Attributes:
        kind: see ``GroupEnd``.
        message: why, for a person (the framework's failure or skip message; ``""`` for
            ``SUCCEEDED``).
        tasks: ``label: words`` of each task that decided it (for ``FAILED``: each failed
            task's message and exit code; for ``STOPPED`` and ``SKIPPED``: each task that did
            not succeed, in ``core.report.result_words``); empty for the other kinds.
        cause: for ``INTERRUPTED``, what stopped the tasks (``notice``, ``stop``,
            ``timeout``); None for the other kinds.
    """

    kind: GroupEnd
    message: str
    tasks: tuple[str, ...] = ()
    cause: InterruptionCause | None = None

    @property
    def interruption(self) -> bool:
        """True for an end the host's going away caused (``INTERRUPTED`` by an interruption
        notice or a lost worker), not an error: the framework resumes it without using a retry
        meant for errors, within its interruption budget (``interruptions_so_far``)."""
        return self.kind == GroupEnd.INTERRUPTED and self.cause in _HOST_GONE


_FAILING = (TaskOutcome.FAILED, TaskOutcome.NOT_STORED)


def classify_group(
    specs: Sequence[TaskSpec],
    results: Sequence[TaskResult],
    *,
    error: BaseException | None = None,
    stopped_by: str | None = None,
    notice: Notice | None = None,
    declared_done: str | None = None,
    next_try: str = "a retry",
    stop_cause: InterruptionCause | str = InterruptionCause.STOP,
) -> GroupVerdict:
    """Classify how a group of tasks run by ``run_tasks`` ends, once for every framework.

    Decided in ``GroupEnd``'s order: ``declared_done`` given; ``error`` (``RunError``: refused,
    anything else: failed); ``stopped_by`` given; ``notice`` given; a task ``FAILED`` or
    ``NOT_STORED``; a task stopped, or not started after others ran (``STOPPED``); none started
    (``SKIPPED``); else ``SUCCEEDED``.

    Args:
        specs: the tasks given to ``run_tasks``, in order (their labels name them).
        results: what ``run_tasks`` returned (one per spec; empty when it raised).
        error: what ``run_tasks`` raised, if it did.
        stopped_by: what stopped this process's tasks, in words (``on_kill (the task instance
            was marked failed)``), when the framework stopped them.
        notice: the interruption notice that stopped them (``run_tasks``'s ``on_notice``).
        declared_done: why the group was declared done, when it was.
        next_try: the framework's next try of the unit, in its words (``the next try of this
            task instance``): the ``INTERRUPTED`` message says it resumes from what was stored.
        stop_cause: what ``stopped_by`` was (``notice``: the framework saw the host going
            away, as Airflow's worker shutdown): the verdict's ``cause``.

    Returns:
        A ``GroupVerdict``.

    Raises:
        ValueError: ``results`` is not one per spec while ``error`` is None.
    """
    if declared_done is not None:
        return GroupVerdict(GroupEnd.DECLARED_DONE, declared_done)
    if isinstance(error, ResumeRefusedError):  # another process still runs it: retry later
        return GroupVerdict(GroupEnd.FAILED, str(error))
    if isinstance(error, RunError):
        return GroupVerdict(GroupEnd.REFUSED, str(error))
    if error is not None:
        return GroupVerdict(GroupEnd.FAILED, f"{type(error).__name__}: {error}")
    if len(results) != len(specs):
        raise ValueError(
            f"classify_group: {len(results)} result(s) for {len(specs)} task(s); run_tasks "
            "returns one per task (give error= when it raised)"
        )
    kept = f"what the tasks reported is stored: {next_try} resumes from it"
    if results and all(res.outcome == TaskOutcome.SKIPPED for res in results):
        kept = f"no task had started: {next_try} runs them"
    if stopped_by is not None:
        return GroupVerdict(
            GroupEnd.INTERRUPTED,
            f"stopped by {stopped_by}; {kept}",
            cause=InterruptionCause(stop_cause),
        )
    if notice is not None:
        return GroupVerdict(
            GroupEnd.INTERRUPTED,
            f"stopped by an interruption notice ({notice.describe()}); {kept}",
            cause=InterruptionCause.NOTICE,
        )
    labelled = list(zip((s.label for s in specs), results, strict=True))
    failed = tuple(
        f"{label}: {res.message or 'failed'}"
        + (f" (exit code {res.exit_code})" if res.exit_code is not None else "")
        for label, res in labelled
        if res.outcome in _FAILING
    )
    if failed:
        return GroupVerdict(GroupEnd.FAILED, "; ".join(failed), failed)
    not_done = tuple(
        f"{label}: {result_words(res)}"
        for label, res in labelled
        if res.outcome != TaskOutcome.SUCCEEDED
    )
    if not not_done:
        return GroupVerdict(GroupEnd.SUCCEEDED, "")
    if all(res.outcome == TaskOutcome.SKIPPED for res in results):
        return GroupVerdict(GroupEnd.SKIPPED, results[0].message, not_done)
    return GroupVerdict(
        GroupEnd.STOPPED,
        "stopped by the run's termination request: " + "; ".join(not_done),
        not_done,
    )


def interruptions_so_far(records: Sequence[TaskRecord], run_attempt: int) -> int:
    """How many times the host's going away (a notice, a lost worker) stopped these tasks in
    the run's attempt ``run_attempt``: their attempt spans so interrupted, by the rule the
    metrics count by (``core._figures.span_interruption``), from the records' ``history``
    (a task's latest ``MAX_SPANS`` spans). An adapter compares it with its interruption budget
    (``DEFAULT_INTERRUPTION_RETRIES``) before it resumes a ``GroupVerdict.interruption``
    without using an error retry."""
    count = 0
    for rec in records:
        for index, span in enumerate(rec.history):
            if span.run_attempt == run_attempt and span_interruption(rec, index) in _HOST_GONE:
                count += 1
    return count


def interruption_resumes(recorded: int, earlier: int, budget: int) -> tuple[int, bool]:
    """Which interruption of the run's attempt this one is, and whether the framework resumes
    it without using a retry meant for errors (Airflow reschedules, Prefect's ``RetryRule``).

    Args:
        recorded: ``interruptions_so_far`` of the group's records (this one included).
        earlier: the framework's own count of the earlier ones (Airflow's reschedules of the
            try, the task run's interruptions so far): a notice that stopped the group before
            any task started leaves no span to count, and must not resume it forever.
        budget: the unit's ``interruption_retries``.

    Returns:
        (the most of ``recorded`` and ``earlier + 1``, whether that is at most ``budget``).
    """
    number = max(recorded, earlier + 1)
    return number, number <= budget
