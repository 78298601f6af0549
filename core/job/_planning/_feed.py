"""Feeds of a step's tasks for the executor (``TaskExecutor.run``): a planned list, or an
adaptive step's chunks, sized as they are taken (TASK_CHUNKING ``targetRuntimeSeconds``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from core._records import TaskRecord
from core.job._planning._chunks import AdaptiveChunker
from core.job._planning._spec import TaskSpec
from core.job._planning._step import PlanHistory, adaptive_plan, iter_plan, spec_for

if TYPE_CHECKING:
    from core.job._job import PreparedJob

__all__ = ("AdaptiveFeed", "TaskFeed", "step_feed")


class TaskFeed:
    """A step's tasks, handed out one at a time in order.

    Args:
        specs: the tasks; an iterator (``iter_plan``) is taken from one task at a time, so
            a step is never held as a list of all its tasks.
    """

    sized_by_ends = False
    """True when a task taken depends on how the tasks before it ended (``ended``): the executor
    then starts the next task only once the one before it has ended whole, its end stored."""

    def __init__(self, specs: Iterable[TaskSpec] = ()) -> None:
        self._specs: Iterator[TaskSpec] = iter(specs)
        self._ahead: list[TaskSpec] = []
        """A task planned by ``peek`` and not taken yet."""

    def take(self) -> TaskSpec | None:
        """The next task to start (None: the feed is empty)."""
        if self._ahead:
            return self._ahead.pop()
        return next(self._specs, None)

    def peek(self) -> TaskSpec | None:
        """The task ``take`` will give next (planned now, kept for it), or None. Not for a feed
        ``sized_by_ends``, whose next task is sized when taken."""
        if not self._ahead:
            spec = next(self._specs, None)
            if spec is None:
                return None
            self._ahead.append(spec)
        return self._ahead[-1]

    def drain(self) -> list[TaskSpec]:
        """Every task planned but not taken; the feed is empty after."""
        rest = [*self._ahead, *self._specs]
        self._ahead = []
        self._specs = iter(())
        return rest

    def rest(self) -> list[str]:
        """Labels of tasks never planned as specs (an adaptive step's unsized chunks)."""
        return []

    def ended(self, spec: TaskSpec, seconds: float) -> str | None:
        """A task of the feed succeeded after ``seconds``; returns a note, if any."""
        return None


class AdaptiveFeed(TaskFeed):
    """An adaptive step: the checkpointed chunks that resume first, then fresh chunks whose
    size follows the measured seconds per frame (``AdaptiveChunker``)."""

    sized_by_ends = True

    def __init__(
        self,
        job: PreparedJob,
        step_name: str,
        resumed: Sequence[TaskSpec],
        chunker: AdaptiveChunker,
    ) -> None:
        super().__init__(resumed)
        self._job = job
        self._step = step_name
        self.chunker = chunker

    def take(self) -> TaskSpec | None:
        spec = super().take()  # the resumed chunks first
        if spec is None:  # then each chunk is sized as it is taken
            params = self.chunker.next_chunk()
            if params is not None:
                spec = spec_for(self._job, self._step, params)
        return spec

    def rest(self) -> list[str]:
        labels: list[str] = []
        while (params := self.chunker.next_chunk()) is not None:
            inner = ", ".join(f"{k}={v.value}" for k, v in params.items())
            labels.append(f"{self._step}[{inner}]")
        return labels

    def ended(self, spec: TaskSpec, seconds: float) -> str | None:
        if spec.resume is not None:  # a resumed chunk's time says nothing of a whole chunk
            return None
        size = self.chunker.report(len(spec.chunk_frames), seconds)
        return (
            f"{spec.label}: {len(spec.chunk_frames)} frame(s) in {seconds:.1f} s; "
            f"next chunks of {size} frame(s)"
        )


def step_feed(
    job: PreparedJob, step_name: str, records: Iterable[TaskRecord] | PlanHistory = ()
) -> tuple[TaskFeed, str | None]:
    """The feed of what ``step_name`` still has to run, given the attempt's task records (any
    iterable, read once, or their ``PlanHistory``), and a note for the log (an adaptive step
    says its target). The feed plans its tasks as they are taken (``iter_plan``).

    Raises:
        KeyError: no such step.
    """
    if not isinstance(records, PlanHistory):
        records = PlanHistory(job, (r for r in records if r.step == step_name))
    adaptive = adaptive_plan(job, step_name, records)
    if adaptive is None:
        return TaskFeed(iter_plan(job, step_name, records)), None
    resumed, chunker = adaptive
    note = (
        f"{step_name}: chunks adapt to {chunker.target_runtime_seconds} s "
        f"(first chunks of {chunker.chunk_size} frames)"
    )
    return AdaptiveFeed(job, step_name, resumed, chunker), note
