"""Feeds of a step's tasks for the executor (``TaskExecutor.run``): a planned list, or an
adaptive step's chunks, sized as they are taken (TASK_CHUNKING ``targetRuntimeSeconds``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .._records import TaskRecord
from ._chunks import AdaptiveChunker
from ._spec import TaskSpec

if TYPE_CHECKING:
    from .._job import PreparedJob

__all__ = ("AdaptiveFeed", "TaskFeed", "step_feed")


class TaskFeed:
    """A step's tasks, handed out one at a time in order."""

    def __init__(self, specs: Iterable[TaskSpec] = ()) -> None:
        self._pending = list(specs)

    def take(self) -> TaskSpec | None:
        """The next task to start (None: the feed is empty)."""
        return self._pending.pop(0) if self._pending else None

    def drain(self) -> list[TaskSpec]:
        """Every task planned but not taken; the feed is empty after."""
        rest, self._pending = self._pending, []
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
        if not self._pending:  # each chunk is sized as it is taken
            params = self.chunker.next_chunk()
            if params is not None:
                self._pending.append(self._job.spec_for(self._step, params))
        return super().take()

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
    job: PreparedJob, step_name: str, records: Iterable[TaskRecord] = ()
) -> tuple[TaskFeed, str | None]:
    """The feed of what ``step_name`` still has to run, given the attempt's task records, and
    a note for the log (an adaptive step says its target).

    Raises:
        KeyError: no such step.
    """
    records = [r for r in records if r.step == step_name]
    adaptive = job.adaptive_plan(step_name, records)
    if adaptive is None:
        return TaskFeed(job.plan_step(step_name, records)), None
    resumed, chunker = adaptive
    note = (
        f"{step_name}: chunks adapt to {chunker.target_runtime_seconds} s "
        f"(first chunks of {chunker.chunk_size} frames)"
    )
    return AdaptiveFeed(job, step_name, resumed, chunker), note
