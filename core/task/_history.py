"""A task's attempt history: one ``AttemptSpan`` per attempt in its record, opened as the
attempt starts and closed as it ends (``TaskExecution``), so that a timeline can show
attempts, interruptions and resumes (``core.job._summary.task_timeline``).

The record keeps the latest ``MAX_SPANS`` spans, so that a task retried without end does not
grow its record (a span is about 150 bytes of JSON). A span whose process died stays open (no
end time, no outcome): a timeline shows it cut off where the next attempt starts.
"""

from __future__ import annotations

import time

from core._host import host_id
from core._records import AttemptSpan, CheckpointData, TaskRecord

__all__ = ("MAX_SPANS", "close_span", "open_span")

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


def close_span(rec: TaskRecord) -> None:
    """``rec``'s open attempt ends now, with the record's status as its outcome."""
    if rec.history and rec.history[-1].ended_at is None:
        rec.history[-1].ended_at = time.time()
        rec.history[-1].outcome = rec.status.value
