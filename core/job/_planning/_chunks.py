"""Adaptive chunk sizes for a CHUNK[INT] task parameter with ``targetRuntimeSeconds``.

The specification (RFC 0001, TASK_CHUNKING, section 3.4.1.5) says of ``targetRuntimeSeconds``:
"If provided and its value is greater than 0, the number of seconds to aim for when forming
chunks. A scheduler can ignore this, or dynamically adjust the chunk task count to be closer to
this value once some chunks have completed." It leaves the rule to the scheduler. This module
follows the reference CLI's rule: openjd-cli's ``_calculate_adaptive_chunk_size``
(``src/openjd/cli/_run/_local_session/_session_manager.py``), which implements steps 3 to 7 of
"Adaptive Chunking" in openjd-rs ``specs/cli/run.md``. See ``adaptive_chunk_size``.

``AdaptiveChunker`` hands out the chunks of one step, one at a time, to any number of worker
threads. Chunks are formed as openjd-model's ``StepParameterSpaceIterator`` forms them in its
adaptive mode: the CHUNK[INT] parameter is the innermost dimension, a chunk takes the next
``chunk_size`` frames of the parameter's range in range order, and a CONTIGUOUS chunk also ends
where the next frame is not the last one plus 1. Frames already done (finished in an earlier
attempt, or left to a task that resumes from its checkpoint) are left out, so a resume runs
exactly the frames not yet reported, whatever the chunk boundaries of the earlier attempt were.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from openjd.model import (
    IntRangeExpr,
    ParameterValue,
    ParameterValueType,
    StepParameterSpaceIterator,
)

from core._hashing import canonical_json

if TYPE_CHECKING:
    from core.job._job import PreparedJob

__all__ = ("AdaptiveChunker", "adaptive_chunk_size", "group_key", "is_adaptive")

BLEND_BELOW_FRAMES = 10
"""While fewer frames than this have been measured, a larger estimate is blended in gradually."""


def adaptive_chunk_size(
    current: int, frames: int, seconds: float, target_seconds: float
) -> int | None:
    """The next chunk size from the measurements so far, as the reference CLI computes it.

    The rule (openjd-cli ``_calculate_adaptive_chunk_size``; openjd-rs ``specs/cli/run.md``,
    "Adaptive Chunking", steps 3 to 7):

    1. With no frames or no measurable time (``seconds`` zero, negative or not finite), keep the
       current size: return None.
    2. ``per_frame = seconds / frames`` and ``ideal = target_seconds / per_frame``.
    3. While fewer than 10 frames were measured and ``ideal`` is larger than ``current``, blend:
       ``ideal = 0.75 * current + 0.25 * ideal`` (a cautious ramp up; a shrink applies at once).
    4. ``max(int(ideal), 1)``: rounded down, at least 1.

    Args:
        current: the chunk size in use, in frames.
        frames: every frame measured so far (cumulative).
        seconds: the time those frames took, in seconds (cumulative).
        target_seconds: the parameter's ``targetRuntimeSeconds``.

    Returns:
        The new chunk size in frames, or None to keep ``current``.
    """
    if frames <= 0 or not (seconds > 0.0 and math.isfinite(seconds)):
        return None
    per_frame = seconds / frames
    if per_frame <= 0.0:  # too small to divide by (underflow): no measurable sample yet
        return None
    ideal = target_seconds / per_frame
    if frames < BLEND_BELOW_FRAMES and ideal > current:
        ideal = 0.75 * current + 0.25 * ideal
    if not math.isfinite(ideal):  # overflow, likewise
        return None
    return max(int(ideal), 1)


def group_key(parameters: Mapping[str, Any], chunk_parameter: str) -> str:
    """The key of a chunk's combination of the other (non-chunk) task parameters.

    Frames are done per combination: in a step with ``Camera * Frame``, frame 5 of camera
    ``left`` is not frame 5 of camera ``right``. The key is the canonical JSON of the other
    parameters' values as strings, the same grouping ``PreparedJob.plan_step`` uses.

    Args:
        parameters: task parameter values, name -> openjd ``ParameterValue``, a record's
            ``{"type": ..., "value": ...}``, or a plain value. The chunk parameter is ignored.
        chunk_parameter: the name of the step's CHUNK[INT] parameter.

    Returns:
        The key (``"{}"`` when the chunk parameter is the only one).
    """
    return canonical_json(
        {name: _text(value) for name, value in parameters.items() if name != chunk_parameter}
    )


def is_adaptive(space: Any) -> bool:
    """True if ``space`` (a step's ``parameterSpace``, or None) has a CHUNK[INT] parameter whose
    ``targetRuntimeSeconds`` is greater than 0, so that ``AdaptiveChunker`` takes it."""
    if space is None:
        return False
    return StepParameterSpaceIterator(space=space).chunks_adaptive


class AdaptiveChunker:
    """Hands out the chunks of one adaptive step and adapts their size to measured run times.

    Thread-safe: any number of workers may call ``next_chunk`` and ``report`` at once. Every
    frame of every parameter combination, less the frames given in ``done``, is handed out in
    exactly one chunk; none is handed out twice (not even where the parameter space repeats a
    value), and none is lost. A chunk is never larger than ``chunk_size`` when it is handed out,
    never leaves the parameter's range, and is a ``"first-last"`` interval where the
    ``rangeConstraint`` is CONTIGUOUS.

    Example:
        chunker = AdaptiveChunker.for_step(job, "Render", done={group: {1, 2, 3}})
        while (chunk := chunker.next_chunk()) is not None:
            frames = len(IntRangeExpr.from_str(str(chunk[chunker.chunk_parameter].value)))
            started = time.monotonic()
            ...  # run the chunk
            chunker.report(frames, time.monotonic() - started)

    Args:
        space: the step's ``parameterSpace`` (from the openjd-model ``Job``).
        done: frames not to hand out, per combination of the other task parameters:
            ``group_key(parameters, chunk_parameter)`` -> frame numbers. Frames outside the
            range are ignored.
        max_chunk_size: an upper bound on the chunk size, in frames (None: no bound beyond the
            range). The specification defines none; it is for callers that need one.

    Attributes:
        chunk_parameter: the CHUNK[INT] parameter's name.
        contiguous: True when its ``rangeConstraint`` is CONTIGUOUS.
        target_runtime_seconds: its ``targetRuntimeSeconds``, in seconds (> 0).
        default_task_count: its ``defaultTaskCount``: the size of the first chunks.

    Raises:
        ValueError: the space has no CHUNK[INT] parameter with ``targetRuntimeSeconds`` > 0, or
            ``max_chunk_size`` is less than 1.
    """

    def __init__(
        self,
        space: Any,
        *,
        done: Mapping[str, Iterable[int]] | None = None,
        max_chunk_size: int | None = None,
    ) -> None:
        if space is None:
            raise ValueError("the step has no parameter space, so it has no chunks")
        iterator = StepParameterSpaceIterator(space=space)
        name = iterator.chunks_parameter_name
        if name is None or not iterator.chunks_adaptive:
            raise ValueError(
                "the step has no CHUNK[INT] task parameter with targetRuntimeSeconds > 0"
            )
        if max_chunk_size is not None and max_chunk_size < 1:
            raise ValueError(f"max_chunk_size must be at least 1, not {max_chunk_size}")
        definition = space.taskParameterDefinitions[name]
        chunks = definition.chunks
        constraint = getattr(chunks.rangeConstraint, "value", chunks.rangeConstraint)
        self.chunk_parameter: str = name
        self.contiguous: bool = str(constraint) == "CONTIGUOUS"
        self.target_runtime_seconds: int = int(chunks.targetRuntimeSeconds)
        self.default_task_count: int = int(chunks.defaultTaskCount)
        self._max = max_chunk_size
        # The range's own order, for NONCONTIGUOUS chunks (CONTIGUOUS runs come in order).
        self._range = [] if self.contiguous else _unique([int(v) for v in definition.range])
        self._done = {key: set(frames) for key, frames in (done or {}).items()}
        # One segment per combination (NONCONTIGUOUS) or per contiguous run of the range
        # (CONTIGUOUS), in the iterator's order; chunks are cut from them here.
        iterator.chunks_default_task_count = sys.maxsize
        self._segments = iterator
        self._lock = threading.Lock()
        self._size = self._clamp(self.default_task_count)
        self._frames_measured = 0
        self._seconds_measured = 0.0
        self._template: dict[str, ParameterValue] = {}
        self._pending: deque[int] = deque()
        self._group: str | None = None
        self._group_frames: set[int] = set()
        self._finished_groups: set[str] = set()
        self._exhausted = False

    @classmethod
    def for_step(
        cls,
        job: PreparedJob,
        step_name: str,
        *,
        done: Mapping[str, Iterable[int]] | None = None,
        max_chunk_size: int | None = None,
    ) -> AdaptiveChunker:
        """The chunker of ``job``'s step ``step_name`` (see the class for the arguments).

        Raises:
            KeyError: the job has no such step.
            ValueError: as the constructor.
        """
        return cls(job.step(step_name).parameterSpace, done=done, max_chunk_size=max_chunk_size)

    @property
    def chunk_size(self) -> int:
        """The size of the next chunk, in frames (it may come out smaller at the end of a
        combination, or, where CONTIGUOUS, at a gap in the frames)."""
        with self._lock:
            return self._size

    @property
    def measured(self) -> tuple[int, float]:
        """Everything reported so far: (frames, seconds)."""
        with self._lock:
            return self._frames_measured, self._seconds_measured

    def next_chunk(self) -> dict[str, ParameterValue] | None:
        """The next chunk to run, or None once every frame has been handed out.

        Returns:
            Task parameter values as ``StepParameterSpaceIterator`` yields them: name ->
            openjd ``ParameterValue``, the chunk parameter's value a range expression
            (``"4-9"`` where CONTIGUOUS, e.g. ``"1-3,7,9-13:2"`` otherwise).
        """
        with self._lock:
            while not self._pending:
                if not self._load_segment():
                    return None
            frames = [self._pending.popleft()]
            while self._pending and len(frames) < self._size:
                if self.contiguous and self._pending[0] != frames[-1] + 1:
                    break
                frames.append(self._pending.popleft())
            chunk = dict(self._template)
            if self.contiguous:
                value = f"{frames[0]}-{frames[-1]}"
            else:
                value = str(IntRangeExpr.from_list(frames))
            chunk[self.chunk_parameter] = ParameterValue(
                type=ParameterValueType.CHUNK_INT, value=value
            )
            return chunk

    def report(self, frames: int, seconds: float) -> int:
        """Take a measurement and adapt the size of the chunks handed out from now on.

        Measurements add up over the whole step, from every worker, and the size follows
        ``adaptive_chunk_size`` (then ``max_chunk_size``). A report of 0 frames changes nothing.

        Args:
            frames: how many frames the measured run did (usually its chunk's frame count).
            seconds: how long that run took, in seconds (wall time).

        Returns:
            The chunk size from now on, in frames.

        Raises:
            ValueError: ``frames`` is negative, or ``seconds`` is negative or not finite.
        """
        if frames < 0:
            raise ValueError(f"frames must not be negative, not {frames}")
        if not (math.isfinite(seconds) and seconds >= 0.0):
            raise ValueError(f"seconds must be finite and not negative, not {seconds}")
        with self._lock:
            if frames == 0:
                return self._size
            self._frames_measured += frames
            self._seconds_measured += seconds
            new = adaptive_chunk_size(
                self._size,
                self._frames_measured,
                self._seconds_measured,
                self.target_runtime_seconds,
            )
            if new is not None:
                self._size = self._clamp(new)
            return self._size

    # --- internals (called with the lock held) ------------------------------------------------
    def _clamp(self, size: int) -> int:
        size = max(size, 1)
        return size if self._max is None else min(size, self._max)

    def _load_segment(self) -> bool:
        """Take the next segment of the parameter space into ``_pending``; False at the end."""
        if self._exhausted:
            return False
        try:
            params = next(self._segments)
        except StopIteration:
            self._exhausted = True
            return False
        key = group_key(params, self.chunk_parameter)
        if key != self._group:
            if self._group is not None:
                self._finished_groups.add(self._group)
            self._group = key
            self._group_frames = set()
        if key in self._finished_groups:  # the space repeats a combination already handed out
            return True
        value = IntRangeExpr.from_str(str(params[self.chunk_parameter].value))
        if self.contiguous:  # one run "first-last" of the range, in order
            ordered: Iterable[int] = value
        else:  # the whole range: keep the range's own order, as the iterator does
            members = set(value)
            ordered = [f for f in self._range if f in members]
        skip = self._done.get(key, set())
        taken = self._group_frames
        for frame in ordered:
            if frame not in skip and frame not in taken:
                taken.add(frame)
                self._pending.append(frame)
        self._template = dict(params)
        return True


def _text(value: Any) -> str:
    if isinstance(value, ParameterValue):
        return str(value.value)
    if isinstance(value, Mapping):
        return str(value.get("value"))
    return str(value)


def _unique(values: list[int]) -> list[int]:
    seen: set[int] = set()
    out: list[int] = []
    for v in values:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out
