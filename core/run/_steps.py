"""The steps of one phase of a run, in dependency order, and which of them are blocked: the one
step loop every runner walks (the CLI's ``JobRunner``, a Prefect flow's regular and finally
steps), so that none decides again when a step may not start.

A step is blocked (it does not start; its tasks are skipped) when:

- the run is stopping (the caller's ``stopping``: a termination mode that starts no task of
  the phase, its time budget expired);
- one of its dependencies did not succeed (it ended not ok, or was blocked itself);
- in the regular phase, an earlier step failed while the run was not stopping: the rest of
  the regular steps do not start (the finally steps still run, TEP-0058).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from core._records import RunPhase
from core.job import PreparedJob

__all__ = ("StepTurn", "StepWalk")


@dataclass(frozen=True)
class StepTurn:
    """One step's turn in a ``StepWalk``.

    Attributes:
        step: the step's name.
        dependencies: the steps it depends on (all of the same phase), as the template lists
            them: a scheduler that starts every step at once makes it wait for these.
        blocked: why it may not start (a sentence for people), or None: it may.
    """

    step: str
    dependencies: tuple[str, ...]
    blocked: str | None = None


class StepWalk:
    """Walks the steps of one phase of ``job`` in dependency order (``PreparedJob.step_order``),
    saying of each whether it is blocked (the module docstring gives the rules).

    Iterate it for one ``StepTurn`` per step of the phase; tell it how each step that ran ended
    (``ended``) before taking the next turn. A scheduler that starts every step at once and
    lets its own dependencies wait (Prefect's ``wait_for``) need not call ``ended``: a step
    whose dependencies have not ended is not blocked by them. A blocked step counts as not ok
    for the steps after it. Not thread-safe: one walker at a time.

    Args:
        job: the prepared job.
        phase: ``RunPhase.REGULAR`` (the regular steps) or ``RunPhase.FINALLY`` (the finally
            steps).
        stopping: True when no step of the phase may start now (read before each turn, and
            when a step ends not ok: a step that failed because the run was stopping does not
            block the rest as a failure). None: never.

    Raises:
        ValueError: ``phase`` is ``RunPhase.ENDED``.
    """

    def __init__(
        self,
        job: PreparedJob,
        phase: RunPhase,
        *,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        if phase == RunPhase.ENDED:
            raise ValueError("a run that has ended has no steps to walk")
        self.job = job
        self.phase = RunPhase(phase)
        self._stopping = stopping
        template = job.template
        names = template.finally_steps if self.phase == RunPhase.FINALLY else template.regular_steps
        self.steps: tuple[str, ...] = tuple(n for n in job.step_order() if n in names)
        """The phase's steps, in the order they are walked."""
        self.ok: dict[str, bool] = {}
        """Step name -> whether it succeeded, for each step ended or blocked so far."""
        self.failed: str | None = None
        """The regular step that failed (not while stopping), which blocks the rest."""

    def __iter__(self) -> Iterator[StepTurn]:
        for step in self.steps:
            turn = self._turn(step)
            if turn.blocked is not None:
                self.ok[step] = False
            yield turn

    def _turn(self, step: str) -> StepTurn:
        dependencies = tuple(self.job.dependencies(step))
        if self._stopping is not None and self._stopping():
            why: str | None = "the run is stopping"
        elif self.failed is not None:
            why = f"step {self.failed} failed"
        else:
            not_ok = [d for d in dependencies if self.ok.get(d) is False]
            why = f"its dependency {', '.join(not_ok)} did not succeed" if not_ok else None
        return StepTurn(step, dependencies, why)

    def ended(self, step: str, ok: bool) -> None:
        """``step`` ran and ended: ``ok`` True if every task of it succeeded. In the regular
        phase, a step that did not, while the run was not stopping, blocks the rest."""
        self.ok[step] = ok
        stopping = self._stopping is not None and self._stopping()
        if not ok and self.phase == RunPhase.REGULAR and not stopping and self.failed is None:
            self.failed = step
