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
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from openjd.model import (
    IntRangeExpr,
    ParameterValue,
    ParameterValueType,
    StepParameterSpaceIterator,
)

from .._records import TaskRecord
from .._template import canonical_json
from ._chunks import AdaptiveChunker, group_key, is_adaptive
from ._spec import TaskSpec, params_from_record, task_key_of

if TYPE_CHECKING:
    from .._job import PreparedJob

__all__ = (
    "adaptive_plan",
    "chunk_parameter",
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
    records: Iterable[TaskRecord] = (),
    *,
    tasks: Iterable[Mapping[str, ParameterValue]] | None = None,
) -> list[TaskSpec]:
    """The tasks of a step still to run, given the records of earlier attempts.

    ``tasks`` limits the plan to those original tasks (parameter sets of the step's
    parameter space; default: all of it) and ``records`` should then be theirs: a scheduler
    that maps over a step's tasks in groups plans one group in time proportional to its
    size, not the step's.

    Rules (seed 000, "Semantics", and docs/decisions.md):
      1. a task whose record succeeded is not run again;
      2. a record with a checkpoint, in a step with ``onCheckpointResume``, resumes: its chunk
         keeps the frames not reported complete (for CONTIGUOUS chunks, the contiguous span
         from the first to the last of them);
      3. any other task runs ``onRun``; a chunk runs only its frames not reported complete,
         as one task, or one task per contiguous run of frames where CONTIGUOUS is required.
    """
    chunk_param, contiguous = chunk_parameter(job, step_name)
    resumable = job.template.is_resumable(step_name)
    by_key = {r.task_key: r for r in records if r.step == step_name}

    def group(params: Mapping[str, Any]) -> str:
        return canonical_json({k: _value(v) for k, v in params.items() if k != chunk_param})

    done: dict[str, set[int]] = {}
    for rec in by_key.values():
        if chunk_param is None:
            continue
        frames = done.setdefault(group(rec.parameters), set())
        frames.update(rec.completed_frames)
        if rec.status.value == "succeeded":
            frames.update(_frames(rec.parameters[chunk_param]["value"]))

    specs: list[TaskSpec] = []
    claimed: dict[str, set[int]] = {}
    # 2. checkpointed tasks resume.
    for rec in sorted(by_key.values(), key=lambda r: r.task_key):
        if rec.status.value == "succeeded" or rec.checkpoint is None or not resumable:
            continue
        params = params_from_record(rec.parameters)
        if chunk_param is not None:
            g = group(rec.parameters)
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
        specs.append(
            TaskSpec(
                step_name=step_name,
                task_key=rec.task_key,
                parameters=params,
                record_parameters=params_from_record(rec.parameters),
                resume=rec.checkpoint,
                chunk_parameter=chunk_param,
            )
        )
    resumed_keys = {s.task_key for s in specs}

    # 1 and 3: the parameter space, less what is done or claimed.
    space: Iterable[Mapping[str, ParameterValue]] = (
        iter_tasks(job, step_name) if tasks is None else tasks
    )
    for given in space:
        params = dict(given)
        key = task_key_of(params)
        prior = by_key.get(key)
        if key in resumed_keys or (prior is not None and prior.status.value == "succeeded"):
            continue
        if chunk_param is None:
            specs.append(TaskSpec(step_name, key, dict(params), dict(params)))
            continue
        g = group({k: _value(v) for k, v in params.items()})
        frames = _frames(str(params[chunk_param].value))
        remaining = frames - done.get(g, set()) - claimed.get(g, set())
        if not remaining:
            continue
        if remaining == frames:
            specs.append(TaskSpec(step_name, key, dict(params), dict(params), None, chunk_param))
            continue
        pieces = _contiguous_runs(remaining) if contiguous else [remaining]
        for piece in pieces:
            p = dict(params)
            p[chunk_param] = ParameterValue(type=ParameterValueType.CHUNK_INT, value=_expr(piece))
            specs.append(TaskSpec(step_name, f"{key}#{_expr(piece)}", p, p, None, chunk_param))
    return specs


def adaptive_plan(
    job: PreparedJob, step_name: str, records: Iterable[TaskRecord] = ()
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
    records = [r for r in records if r.step == step_name]
    resumed = [s for s in plan_tasks(job, step_name, records) if s.resume is not None]
    done: dict[str, set[int]] = {}
    for rec in records:
        frames = done.setdefault(group_key(rec.parameters, chunk_param), set())
        frames.update(rec.completed_frames)
        if rec.status.value == "succeeded":
            frames.update(_frames(rec.parameters[chunk_param]["value"]))
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


def _value(v: Any) -> str:
    if isinstance(v, ParameterValue):
        return str(v.value)
    if isinstance(v, Mapping):
        return str(v.get("value"))
    return str(v)


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
