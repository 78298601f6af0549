"""A task's attempt history: one ``AttemptSpan`` per attempt in its record, opened as the
attempt starts and closed as it ends (``TaskExecution``), so that a timeline can show
attempts, interruptions and resumes (``core.job._summary.task_timeline``).

The record keeps the latest ``MAX_SPANS`` spans, so that a task retried without end does not
grow its record (a span is about 150 bytes of JSON). A span whose process died stays open (no
end time, no outcome): a timeline shows it cut off where the next attempt starts, and the
metrics count it as an interruption by a lost worker (``core._figures``).

Each span also keeps what the checkpoint metrics need (``core._figures``): what stopped
it and when, when its last checkpoint and the first one after the stop were stored.
"""

from __future__ import annotations

import time

from core._figures import checkpoint_bytes
from core._host import host_id
from core._records import AttemptSpan, CheckpointData, InterruptionCause, TaskRecord

__all__ = (
    "MAX_SPANS",
    "close_span",
    "note_committed",
    "note_stored",
    "open_span",
)

MAX_SPANS = 20
"""Attempt spans a task record keeps (the latest)."""


def open_span(rec: TaskRecord, resume: CheckpointData | None) -> None:
    """``rec`` starts attempt ``rec.attempt`` now, on this host, resuming from ``resume``
    (None: from the top)."""
    rec.history.append(
        AttemptSpan(
            attempt=rec.attempt,
            run_attempt=rec.run_attempt,
            started_at=time.time(),
            host=host_id(),
            resumed_from=resume.generation if resume is not None else None,
            resumed_saved_at=resume.saved_at if resume is not None else None,
        )
    )
    del rec.history[:-MAX_SPANS]


def note_stored(
    rec: TaskRecord, data: CheckpointData, stopped_at: float | None
) -> AttemptSpan | None:
    """Checkpoint ``data`` of ``rec``'s open attempt is being stored, with the record; the
    task was asked to stop at ``stopped_at`` (None: it was not). The span counts it (its size,
    its commit duration so far: ``note_committed`` adds the rest). Returns the span as it was
    (to put back if the write fails), None when no attempt is open."""
    if not rec.history or rec.history[-1].ended_at is not None:
        return None
    span = rec.history[-1]
    before = span.model_copy()
    span.saved_at = data.saved_at
    if stopped_at is not None and span.stored_after_stop_at is None:
        span.stored_after_stop_at = data.saved_at
    span.commits += 1
    span.stored_bytes += checkpoint_bytes(data)
    span.commit_seconds += data.commit_seconds or 0.0
    span.commit_seconds_max = max(span.commit_seconds_max, data.commit_seconds or 0.0)
    return before


def note_committed(
    rec: TaskRecord, earlier: AttemptSpan | None, before: float | None, after: float
) -> None:
    """The commit ``note_stored`` counted took ``after`` seconds in all, not ``before``: the
    open span's sums say so (written with the record's next write). ``earlier``: the span as
    ``note_stored`` returned it, whose largest commit is the one before this commit's estimate
    (``before`` may exceed ``after``, and must not stay the largest)."""
    if rec.history and rec.history[-1].ended_at is None and before is not None:
        span = rec.history[-1]
        span.commit_seconds += after - before
        largest = earlier.commit_seconds_max if earlier is not None else span.commit_seconds_max
        span.commit_seconds_max = max(largest, after)


def close_span(
    rec: TaskRecord,
    cause: InterruptionCause | None = None,
    stopped_at: float | None = None,
) -> None:
    """``rec``'s open attempt ends now, with the record's status as its outcome; ``cause`` and
    ``stopped_at``: what asked it to stop, and when (None: nothing did)."""
    if rec.history and rec.history[-1].ended_at is None:
        span = rec.history[-1]
        span.ended_at = time.time()
        span.outcome = rec.status.value
        if stopped_at is not None:
            span.cause, span.stopped_at = cause, stopped_at
