"""The plan of one step: which of its tasks still run, given the records of earlier attempts.

The plan of a resumed step (seed 000, "Semantics"): tasks that finished are not run again,
checkpointed tasks run ``onCheckpointResume``, and the frames of a chunk that were not reported
complete run through ``onRun`` (split into contiguous pieces where the chunk parameter's
``rangeConstraint`` is CONTIGUOUS). openjd-model walks the parameter space
(``StepParameterSpaceIterator``, which also balances chunks). A pure function of the job and the
records it is given: ``PreparedJob.plan_step`` and the store-reading ``core.plan_step`` call it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from openjd.model import (
    IntRangeExpr,
    ParameterValue,
    ParameterValueType,
    StepParameterSpaceIterator,
)

from core._records import TaskRecord
from core.job._planning._chunks import AdaptiveChunker, group_key, is_adaptive
from core.job._planning._spec import (
    TaskSpec,
    fresh_spec,
    json_string,
    params_from_record,
    task_key_of,
)

if TYPE_CHECKING:
    from core.job._job import PreparedJob

__all__ = (
    "PlanHistory",
    "adaptive_plan",
    "chunk_parameter",
    "iter_plan",
    "iter_tasks",
    "original_tasks",
    "plan_tasks",
    "spec_for",
    "task_count",
)


def chunk_parameter(job: PreparedJob, step_name: str) -> tuple[str | None, bool]:
    """The step's CHUNK[INT] parameter name and whether its chunks must be CONTIGUOUS."""
    space = job.step(step_name).parameterSpace
    if space is None:
        return None, False
    for name, definition in space.taskParameterDefinitions.items():
        if str(getattr(definition.type, "value", definition.type)) == "CHUNK[INT]":
            chunks = getattr(definition, "chunks", None)
            constraint = getattr(chunks, "rangeConstraint", None)
            contiguous = str(getattr(constraint, "value", constraint)) == "CONTIGUOUS"
            return name, contiguous
    return None, False


def iter_tasks(job: PreparedJob, step_name: str) -> Iterable[dict[str, ParameterValue]]:
    space = job.step(step_name).parameterSpace
    if space is None:
        yield {}
        return
    yield from StepParameterSpaceIterator(space=space)


def plan_tasks(
    job: PreparedJob,
    step_name: str,
    records: Iterable[TaskRecord] | PlanHistory = (),
    *,
    tasks: Iterable[Mapping[str, ParameterValue]] | None = None,
) -> list[TaskSpec]:
    """The tasks of a step still to run, given the records of earlier attempts: ``iter_plan``
    as a list (which states the rules)."""
    return list(iter_plan(job, step_name, records, tasks=tasks))


def iter_plan(
    job: PreparedJob,
    step_name: str,
    records: Iterable[TaskRecord] | PlanHistory = (),
    *,
    tasks: Iterable[Mapping[str, ParameterValue]] | None = None,
) -> Iterator[TaskSpec]:
    """The tasks of a step still to run, given the records of earlier attempts, made one at a
    time as they are taken: a step of any size is planned in memory that does not grow with
    its task count (the records are read once, now, and kept only as ``PlanHistory`` keeps
    them; the parameter space is walked as the tasks are taken).

    ``records`` may be any iterable (a stream from the store) or a ``PlanHistory`` already
    made of them. ``tasks`` limits the plan to those original tasks (parameter sets of the
    step's parameter space; default: all of it) and ``records`` should then be theirs: a
    scheduler that maps over a step's tasks in groups plans one group in time proportional to
    its size, not the step's.

    Rules (seed 000, "Semantics", and docs/decisions.md):
      1. a task whose record succeeded is not run again;
      2. a record with a checkpoint, in a step with ``onCheckpointResume``, resumes: its chunk
         keeps the frames not reported complete (for CONTIGUOUS chunks, the contiguous span
         from the first to the last of them); these come first, in task key order;
      3. any other task runs ``onRun``, in the parameter space's order; a chunk runs only its
         frames not reported complete, as one task, or one task per contiguous run of frames
         where CONTIGUOUS is required.

    Raises:
        KeyError: no such step (at once, not when the first task is taken).
    """
    chunk_param, contiguous = chunk_parameter(job, step_name)
    history = records if isinstance(records, PlanHistory) else PlanHistory(job, records)
    resumable = job.template.is_resumable(step_name)
    space: Iterable[Mapping[str, ParameterValue]]
    if tasks is not None:
        space = tasks
    else:
        parameter_space = job.step(step_name).parameterSpace
        space = (
            [{}] if parameter_space is None else StepParameterSpaceIterator(space=parameter_space)
        )
    return _plan(
        step_name, history.step(step_name), space, chunk_param, contiguous, resumable, tasks is None
    )


class _StepHistory:
    """One step's earlier records as planning needs them: the keys of the tasks that succeeded,
    the records of the others, and (for a chunked step) the frames each record reported."""

    __slots__ = ("frames", "others", "succeeded")

    def __init__(self) -> None:
        self.succeeded: set[str] = set()
        self.others: dict[str, TaskRecord] = {}
        self.frames: dict[str, tuple[str, set[int]]] = {}  # task key -> (group, frames done)


class PlanHistory:
    """The task records of earlier attempts, read once and kept as planning needs them
    (``iter_plan``): for each step, the keys of the tasks that succeeded, the full records of
    the tasks that did not (failed, interrupted, checkpointed), and the frames a chunk's
    record reported. A succeeded task costs its key, not its record, so that the history of a
    step of thousands of finished tasks stays small.

    Args:
        job: the job whose steps the records are of.
        records: any iterable of its task records (read once); a task key seen twice keeps
            the last record, as a mapping by key would.
    """

    def __init__(self, job: PreparedJob, records: Iterable[TaskRecord] = ()) -> None:
        self._job = job
        self._steps: dict[str, _StepHistory] = {}
        self._chunk: dict[str, str | None] = {}
        for rec in records:
            self.add(rec)

    def add(self, rec: TaskRecord) -> None:
        """Take one more record (a later record of the same task replaces the earlier)."""
        step = self._steps.get(rec.step)
        if step is None:
            step = self._steps[rec.step] = _StepHistory()
        key = rec.task_key
        if rec.status.value == "succeeded":
            step.succeeded.add(key)
            step.others.pop(key, None)
        else:
            step.others[key] = rec
            step.succeeded.discard(key)
        chunk_param = self._chunk_param(rec.step)
        if chunk_param is not None:
            frames = set(rec.completed_frames)
            if rec.status.value == "succeeded":
                frames.update(_frames(rec.parameters[chunk_param]["value"]))
            step.frames[key] = (group_key(rec.parameters, chunk_param), frames)

    def step(self, step_name: str) -> _StepHistory:
        return self._steps.get(step_name) or _StepHistory()

    def records(self, step_name: str) -> list[TaskRecord]:
        """The kept records of ``step_name``'s tasks that did not succeed, by task key."""
        return list(self.step(step_name).others.values())

    def _chunk_param(self, step_name: str) -> str | None:
        if step_name not in self._chunk:
            try:
                self._chunk[step_name] = chunk_parameter(self._job, step_name)[0]
            except KeyError:  # a record of a step the job no longer has: never planned
                self._chunk[step_name] = None
        return self._chunk[step_name]


def _plan(
    step_name: str,
    history: _StepHistory,
    space: Iterable[Mapping[str, ParameterValue]],
    chunk_param: str | None,
    contiguous: bool,
    resumable: bool,
    owned: bool,
) -> Iterator[TaskSpec]:
    done: dict[str, set[int]] = {}
    for g, frames in history.frames.values():
        done.setdefault(g, set()).update(frames)
    claimed: dict[str, set[int]] = {}
    resumed_keys: set[str] = set()
    # 2. checkpointed tasks resume.
    for key in sorted(history.others) if resumable else ():
        rec = history.others[key]
        if rec.checkpoint is None:
            continue
        params = params_from_record(rec.parameters)
        if chunk_param is not None:
            g = group_key(rec.parameters, chunk_param)
            remaining = _frames(rec.parameters[chunk_param]["value"]) - done.get(g, set())
            if not remaining:
                continue
            if contiguous:
                remaining = set(range(min(remaining), max(remaining) + 1))
            claimed.setdefault(g, set()).update(remaining)
            params = dict(params)
            params[chunk_param] = ParameterValue(
                type=ParameterValueType.CHUNK_INT, value=_expr(remaining)
            )
        resumed_keys.add(key)
        yield TaskSpec(
            step_name=step_name,
            task_key=key,
            parameters=params,
            record_parameters=params_from_record(rec.parameters),
            resume=rec.checkpoint,
            chunk_parameter=chunk_param,
        )

    # 1 and 3: the parameter space, less what is done or claimed.
    succeeded = history.succeeded
    skip = succeeded | resumed_keys if resumed_keys else succeeded
    key_of = _key_maker()
    if chunk_param is None:  # the common case, kept to the fewest steps a task
        names: set[str] | None = None
        name, prefix = "", ""
        for given in space:
            # the iterator's own dict is not shared: no copy of it
            params = given if owned else dict(given)  # type: ignore[assignment]
            if params.keys() != names:  # the first task (and any of other names)
                names = set(params)
                name = next(iter(names)) if len(names) == 1 else ""
                prefix = "{" + json_string(name) + ":"
            if name:  # one parameter: task_key_of, inlined
                key = prefix + json_string(str(params[name].value)) + "}"
            else:
                key = key_of(params)
            if key not in skip:
                yield fresh_spec(step_name, key, params, dict(params))
        return
    for given in space:
        params = given if owned else dict(given)  # type: ignore[assignment]
        key = key_of(params)
        if key in skip:
            continue
        g = group_key(params, chunk_param)
        frames = _frames(str(params[chunk_param].value))
        remaining = frames - done.get(g, set()) - claimed.get(g, set())
        if not remaining:
            continue
        if remaining == frames:
            yield fresh_spec(step_name, key, params, dict(params), chunk_param)
            continue
        pieces = _contiguous_runs(remaining) if contiguous else [remaining]
        for piece in pieces:
            p = dict(params)
            p[chunk_param] = ParameterValue(type=ParameterValueType.CHUNK_INT, value=_expr(piece))
            yield TaskSpec(step_name, f"{key}#{_expr(piece)}", p, p, None, chunk_param)


def _key_maker() -> Callable[[Mapping[str, ParameterValue]], str]:
    """``task_key_of``, faster for the sets of one parameter space (the same names each time):
    the names' part of the key is made once."""
    names: tuple[str, ...] = ()
    given: set[str] | None = None
    parts: list[str] = []

    def key_of(params: Mapping[str, ParameterValue]) -> str:
        nonlocal names, given, parts
        if params.keys() != given:
            given = set(params)
            names = tuple(sorted(given))
            parts = [json_string(n) + ":" for n in names]
        if not names:
            return "{}"
        if len(names) == 1:
            return "{" + parts[0] + json_string(str(params[names[0]].value)) + "}"
        return (
            "{"
            + ",".join(
                p + json_string(str(params[n].value)) for p, n in zip(parts, names, strict=True)
            )
            + "}"
        )

    return key_of


def adaptive_plan(
    job: PreparedJob, step_name: str, records: Iterable[TaskRecord] | PlanHistory = ()
) -> tuple[list[TaskSpec], AdaptiveChunker] | None:
    """For a step whose CHUNK[INT] parameter has ``targetRuntimeSeconds`` (TASK_CHUNKING):
    the checkpointed chunks that resume (``plan_tasks``' rule 2), and an
    ``AdaptiveChunker`` that hands out every other frame not yet reported, in chunks whose
    size follows the measured time per frame. None for any other step.

    Frames are counted per frame, so a resume runs exactly the frames not yet reported,
    whatever the chunk boundaries of earlier attempts were.
    """
    chunk_param, _contiguous = chunk_parameter(job, step_name)
    if chunk_param is None or not is_adaptive(job.step(step_name).parameterSpace):
        return None
    history = records if isinstance(records, PlanHistory) else PlanHistory(job, records)
    resumed = [s for s in iter_plan(job, step_name, history, tasks=()) if s.resume is not None]
    done: dict[str, set[int]] = {}
    for group, frames in history.step(step_name).frames.values():
        done.setdefault(group, set()).update(frames)
    for spec in resumed:
        done.setdefault(group_key(spec.parameters, chunk_param), set()).update(spec.chunk_frames)
    chunker = AdaptiveChunker.for_step(job, step_name, done=done)
    return resumed, chunker


def task_count(job: PreparedJob, step_name: str) -> int:
    """How many tasks (chunks, for a chunked step) the step's parameter space defines: the
    length of ``plan_tasks(job, step_name)`` with no records."""
    space = job.step(step_name).parameterSpace
    if space is None:
        return 1
    walker = StepParameterSpaceIterator(space=space)
    try:
        return len(walker)
    except ValueError:  # adaptive chunking: no length, count them
        return sum(1 for _ in walker)


def original_tasks(
    job: PreparedJob, step_name: str, start: int = 0, stop: int | None = None
) -> list[TaskSpec]:
    """``plan_tasks(job, step_name)[start:stop]`` (the step's fresh tasks, with no records)
    without building the others: a scheduler that maps over a step of thousands of tasks
    in groups passes each group a range of indexes, not the tasks, and each group builds
    its own in time proportional to its size (openjd-model's random access into the
    parameter space; a step with adaptive chunking, which has none, is walked instead).

    Args:
        start, stop: indexes into the step's task list (0-based, ``stop`` excluded, None:
            to the end); not negative.

    Raises:
        KeyError: no such step.
    """
    space = job.step(step_name).parameterSpace
    if space is None:
        return [spec_for(job, step_name, {})][start:stop]
    walker = StepParameterSpaceIterator(space=space)
    try:
        first, last, _ = slice(start, stop).indices(len(walker))
        chosen = [walker[i] for i in range(first, last)]
    except (ValueError, RuntimeError):  # adaptive chunking: no random access
        chosen = list(itertools.islice(walker, start, stop))
    return [spec_for(job, step_name, params) for params in chosen]


def spec_for(job: PreparedJob, step_name: str, params: Mapping[str, ParameterValue]) -> TaskSpec:
    """A fresh task (``onRun``) of ``step_name`` with these task parameter values."""
    chunk_param, _ = chunk_parameter(job, step_name)
    return TaskSpec(step_name, task_key_of(params), dict(params), dict(params), None, chunk_param)


def _frames(expr: str) -> set[int]:
    return set(IntRangeExpr.from_str(str(expr)))


def _expr(frames: Iterable[int]) -> str:
    return str(IntRangeExpr.from_list(sorted(frames)))


def _contiguous_runs(frames: set[int]) -> list[set[int]]:
    runs: list[set[int]] = []
    current: list[int] = []
    for f in sorted(frames):
        if current and f != current[-1] + 1:
            runs.append(set(current))
            current = []
        current.append(f)
    if current:
        runs.append(set(current))
    return runs
