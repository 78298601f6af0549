"""Checkpoint metrics: the one definition of each figure a person can watch and alert on,
computed from what the store keeps (a task record's attempt spans and its checkpoint:
``core._records.AttemptSpan``, ``CheckpointData.commit_seconds``), whether a figure is sent as
it happens (``core.run._metrics.MetricsObserver``) or read back later (``run_figures``: the
CLI's ``runs`` and ``checkpoints show``, and the summary a finished run keeps).

=========================================  =========  =====  ==========================
name                                       kind       unit   labels
=========================================  =========  =====  ==========================
``openjd_checkpoint.checkpoint.age``       gauge      s      job, step, task
``openjd_checkpoint.work_lost``            histogram  s      job, step, cause
``openjd_checkpoint.stop_to_stored``       histogram  s      job, step, cause
``openjd_checkpoint.commit.duration``      histogram  s      job, step
``openjd_checkpoint.stored``               counter    By     job, step
``openjd_checkpoint.resumes``              counter    1      job, step, status
``openjd_checkpoint.interruptions``        counter    1      job, step, cause
=========================================  =========  =====  ==========================

The suggested save interval (``suggested_interval``) is Young's first-order formula over the
same figures. docs/metrics.md says where each runner sends them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from core._records import AttemptSpan, CheckpointData, InterruptionCause, TaskRecord, TaskStatus

__all__ = (
    "CHECKPOINT_AGE",
    "COMMIT_DURATION",
    "INTERRUPTIONS",
    "METRICS",
    "RESUMES",
    "STOP_TO_STORED",
    "STORED_BYTES",
    "SUGGESTED_INTERVAL_VARIABLE",
    "WORK_LOST",
    "Figure",
    "Metric",
    "MetricKind",
    "RunFigures",
    "Stat",
    "attempt_figures",
    "checkpoint_figures",
    "figures_words",
    "interval_env",
    "read_figures",
    "span_interruption",
    "checkpoint_bytes",
    "run_figures",
    "running_age",
    "seconds_words",
    "suggested_interval",
)

SUGGESTED_INTERVAL_VARIABLE = "OPENJD_CHECKPOINT_SUGGESTED_INTERVAL"
"""The environment variable a task reads the suggested save interval from (seconds, advice)."""


class MetricKind(str, Enum):
    """How a metric adds up: a counter (sums), a histogram (a distribution of values), a gauge
    (the last value)."""

    COUNTER = "counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"


@dataclass(frozen=True)
class Metric:
    """One metric: its name (OpenTelemetry's dotted form), kind, unit (UCUM: ``s``, ``By``,
    ``1``), label names and what it says."""

    name: str
    kind: MetricKind
    unit: str
    labels: tuple[str, ...]
    description: str


CHECKPOINT_AGE = Metric(
    "openjd_checkpoint.checkpoint.age",
    MetricKind.GAUGE,
    "s",
    ("job", "step", "task"),
    "Seconds of a running task's work no stored checkpoint covers: since its attempt's last "
    "durable checkpoint, or since the attempt started when it stored none (what losing the "
    "host now would cost). Sent at each checkpoint (0), with progress (at most every 10 s) and "
    "when the attempt ends.",
)
WORK_LOST = Metric(
    "openjd_checkpoint.work_lost",
    MetricKind.HISTOGRAM,
    "s",
    ("job", "step", "cause"),
    "Per interruption: the task's time from its attempt's last stored checkpoint (or the "
    "attempt's start) to its end. For a lost worker, to when the next attempt started (an upper "
    "bound: when the process died is not known).",
)
STOP_TO_STORED = Metric(
    "openjd_checkpoint.stop_to_stored",
    MetricKind.HISTOGRAM,
    "s",
    ("job", "step", "cause"),
    "From an interruption notice or stop request reaching the task to its first checkpoint "
    "stored after it (not sent when none was stored).",
)
COMMIT_DURATION = Metric(
    "openjd_checkpoint.commit.duration",
    MetricKind.HISTOGRAM,
    "s",
    ("job", "step"),
    "From an openjd_checkpoint_save line read to the generation durably stored (managed files "
    "uploaded, record written).",
)
STORED_BYTES = Metric(
    "openjd_checkpoint.stored",
    MetricKind.COUNTER,
    "By",
    ("job", "step"),
    "Bytes of each stored checkpoint generation: its state (UTF-8) plus its managed files.",
)
RESUMES = Metric(
    "openjd_checkpoint.resumes",
    MetricKind.COUNTER,
    "1",
    ("job", "step", "status"),
    "Attempts that ran onCheckpointResume, by what the task said: RESUMED, DISCARDED, or "
    "UNKNOWN when it never said.",
)
INTERRUPTIONS = Metric(
    "openjd_checkpoint.interruptions",
    MetricKind.COUNTER,
    "1",
    ("job", "step", "cause"),
    "Attempts that ended before their task did, by cause: notice (an interruption notice), "
    "stop (a stop request, the framework's kill or cancel), timeout, worker_lost.",
)
METRICS = (
    CHECKPOINT_AGE,
    WORK_LOST,
    STOP_TO_STORED,
    COMMIT_DURATION,
    STORED_BYTES,
    RESUMES,
    INTERRUPTIONS,
)
"""Every metric, in the order the docs' table lists them."""


@dataclass(frozen=True)
class Figure:
    """One value of a metric: ``value`` in the metric's unit, its ``labels`` (every name of
    ``metric.labels``), and ``at``, when it was true (seconds since the epoch)."""

    metric: Metric
    value: float
    labels: Mapping[str, str]
    at: float = field(default_factory=time.time)


# --- the one definition of each figure ------------------------------------------------------------
FUTURE_SLACK_SECONDS = 86_400.0
"""A time more than this after now (or before the epoch) in a record is not believed: a
figure that would need it is left out (a hand-edited or damaged record)."""
MAX_SUGGESTED_SECONDS = 7 * 86_400.0
"""The longest save interval suggested (a week)."""


def _moment(value: float | None, now: float) -> float | None:
    """``value`` as a believable time (seconds since the epoch), else None."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return value if value <= now + FUTURE_SLACK_SECONDS else None


def _amount(value: float | None) -> float | None:
    """``value`` as a believable duration or size (finite, not negative), else None."""
    return value if value is not None and math.isfinite(value) and value >= 0 else None


def span_interruption(rec: TaskRecord, index: int) -> InterruptionCause | None:
    """What interrupted ``rec``'s attempt span ``index``: ``worker_lost`` for a span left open
    and followed by another (its process died), else its ``cause`` when it ended before its
    task did (not succeeded, not failed by itself); None when nothing did. The one rule the
    figures and ``core.run.interruptions_so_far`` count by."""
    span = rec.history[index]
    if span.ended_at is None:
        return InterruptionCause.WORKER_LOST if index + 1 < len(rec.history) else None
    if span.cause is None or span.outcome in (TaskStatus.SUCCEEDED.value, TaskStatus.FAILED.value):
        return None
    try:
        return InterruptionCause(span.cause)
    except ValueError:
        return InterruptionCause.STOP


def checkpoint_bytes(cp: CheckpointData) -> int:
    """A checkpoint's size: its state (UTF-8) plus its managed files, in bytes."""
    return len((cp.state or "").encode()) + max(0, cp.file_bytes or 0)


def checkpoint_figures(
    job: str, step: str, task_key: str, cp: CheckpointData, *, at: float | None = None
) -> list[Figure]:
    """The figures of checkpoint ``cp`` of task ``task_key`` of ``step``, just stored: its
    commit duration and bytes, and the task's checkpoint age (0)."""
    at = cp.saved_at if at is None else at
    labels = {"job": job, "step": step}
    out = [Figure(CHECKPOINT_AGE, 0.0, {**labels, "task": task_key}, at)]
    commit = _amount(cp.commit_seconds)
    if commit is not None:
        out.append(Figure(COMMIT_DURATION, commit, labels, at))
    out.append(Figure(STORED_BYTES, float(checkpoint_bytes(cp)), labels, at))
    return out


def _span_times(
    rec: TaskRecord, index: int, now: float
) -> tuple[float, float | None, float] | None:
    """(start, end, covered) of span ``index``, believable: its start; its end (for an open
    span followed by another, when the next one started; None while it runs); the time its
    work is covered to (its last stored checkpoint, else its start). None when the record's
    times cannot be believed (the span's figures are left out)."""
    span = rec.history[index]
    start = _moment(span.started_at, now)
    if start is None:
        return None
    end: float | None = None
    if span.ended_at is not None:
        end = _moment(span.ended_at, now)
        if end is None:
            return None
    elif index + 1 < len(rec.history):
        end = _moment(rec.history[index + 1].started_at, now)
        if end is None:
            return None
    if end is not None and end < start:
        return None
    saved = _moment(span.saved_at, now)
    covered = saved if saved is not None and start <= saved <= (end or now) else start
    return start, end, covered


def attempt_figures(
    job: str, rec: TaskRecord, index: int = -1, now: float | None = None
) -> list[Figure]:
    """The figures of ``rec``'s attempt span ``index`` (default: the latest), once it ended:
    an interruption (``span_interruption``), the work it lost, its stop-to-stored time, its
    resume status, and the checkpoint age it ended with (0 for a task that succeeded). Times
    a record cannot hold (``FUTURE_SLACK_SECONDS``) leave the span's figures out."""
    if not rec.history:
        return []
    now = time.time() if now is None else now
    index = index % len(rec.history)
    span = rec.history[index]
    times = _span_times(rec, index, now)
    if times is None:
        return []
    _start, end, covered = times
    if end is None:  # it runs
        return []
    step = {"job": job, "step": rec.step}
    out: list[Figure] = []
    cause = span_interruption(rec, index)
    if cause is not None:
        labels = {**step, "cause": cause.value}
        out.append(Figure(INTERRUPTIONS, 1.0, labels, end))
        out.append(Figure(WORK_LOST, end - covered, labels, end))
        stopped = _moment(span.stopped_at, now)
        stored = _moment(span.stored_after_stop_at, now)
        if stopped is not None and stored is not None and _start <= stopped <= stored <= end:
            out.append(Figure(STOP_TO_STORED, stored - stopped, labels, end))
    if span.resumed_from is not None:
        last = index == len(rec.history) - 1
        status = span.resume_status or (rec.resume_status if last else None) or "UNKNOWN"
        out.append(Figure(RESUMES, 1.0, {**step, "status": status}, end))
    if span.ended_at is not None:  # a finished task has no work at risk
        age = 0.0 if span.outcome == TaskStatus.SUCCEEDED.value else end - covered
        out.append(Figure(CHECKPOINT_AGE, age, {**step, "task": rec.task_key}, end))
    return out


def running_age(rec: TaskRecord, now: float | None = None) -> float | None:
    """The checkpoint age of ``rec``'s running attempt now (None: no attempt runs, or its
    times cannot be believed)."""
    if not rec.history or rec.history[-1].ended_at is not None:
        return None
    now = time.time() if now is None else now
    times = _span_times(rec, len(rec.history) - 1, now)
    return None if times is None else max(0.0, now - times[2])


def suggested_interval(commit_seconds: float, mean_seconds_between: float) -> float:
    """Young's first-order optimum save interval, in seconds: ``sqrt(2 * C * M)`` for a
    checkpoint that costs ``C`` seconds and interruptions ``M`` seconds apart on average
    (J. W. Young, 1974; Daly, 2006, shows it is the first-order term of the optimum). It
    minimises the expected work lost plus checkpoint cost; it is advice.

    Raises:
        ValueError: a figure is not a positive finite number of seconds.
    """
    for name, v in (
        ("commit_seconds", commit_seconds),
        ("mean_seconds_between", mean_seconds_between),
    ):
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(
                f"suggested_interval: {name} must be a positive number of seconds, got {v!r}"
            )
    return math.sqrt(2.0 * commit_seconds * mean_seconds_between)


@dataclass
class Stat:
    """A figure's values summed up: how many, their sum and their largest (in its unit)."""

    count: int = 0
    total: float = 0.0
    largest: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.largest = max(self.largest, value)

    def merge(self, count: int, total: float, largest: float | None) -> None:
        """Add ``count`` values summing to ``total`` whose largest is ``largest`` (None: not
        known; then their mean stands in for it)."""
        if count <= 0:
            return
        self.count += count
        self.total += total
        self.largest = max(self.largest, total / count if largest is None else largest)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def as_json(self) -> dict[str, float | int]:
        return {"count": self.count, "total": round(self.total, 6), "max": round(self.largest, 6)}


@dataclass
class RunFigures:
    """A run's figures, read back from its task records (``run_figures``, or ``add`` one record
    at a time: memory does not grow with the task count but for ``ages``).

    Attributes:
        interruptions: attempts stopped before their task's end, by cause value.
        work_lost: the work each interruption lost, in seconds.
        stop_to_stored: each stop-to-stored time, in seconds.
        commit: each task's latest commit duration, in seconds.
        stored_bytes: bytes of each task's latest checkpoint.
        resumes: resumed attempts by the status the task said.
        ages: ``step task_key`` -> checkpoint age in seconds, of each attempt running now.
        run_seconds: attempt time summed over the tasks (a running attempt's to now).
    """

    interruptions: dict[str, int] = field(default_factory=dict)
    work_lost: Stat = field(default_factory=Stat)
    stop_to_stored: Stat = field(default_factory=Stat)
    commit: Stat = field(default_factory=Stat)
    stored_bytes: Stat = field(default_factory=Stat)
    resumes: dict[str, int] = field(default_factory=dict)
    ages: dict[str, float] = field(default_factory=dict)
    run_seconds: float = 0.0

    def add(self, rec: TaskRecord, now: float | None = None) -> None:
        """Count one task record's figures (each attempt span once; values a record cannot
        hold are left out)."""
        now = time.time() if now is None else now
        for index in range(len(rec.history)):
            times = _span_times(rec, index, now)
            if times is None:
                continue
            start, end, _ = times
            self.run_seconds += (end if end is not None else now) - start
            for fig in attempt_figures("", rec, index, now):
                if fig.metric is INTERRUPTIONS:
                    cause = fig.labels["cause"]
                    self.interruptions[cause] = self.interruptions.get(cause, 0) + 1
                elif fig.metric is WORK_LOST:
                    self.work_lost.add(fig.value)
                elif fig.metric is STOP_TO_STORED:
                    self.stop_to_stored.add(fig.value)
                elif fig.metric is RESUMES:
                    status = fig.labels["status"]
                    self.resumes[status] = self.resumes.get(status, 0) + 1
        if any(span.commits for span in rec.history):  # every commit, counted by its span
            for span in rec.history:
                total, largest = _amount(span.commit_seconds), _amount(span.commit_seconds_max)
                if span.commits > 0 and total is not None and largest is not None:
                    self.commit.merge(span.commits, total, largest)
                if span.commits > 0 and span.stored_bytes >= 0:
                    self.stored_bytes.merge(span.commits, span.stored_bytes, None)
        elif rec.checkpoint is not None:  # a record of an earlier version: its latest only
            for fig in checkpoint_figures("", rec.step, rec.task_key, rec.checkpoint):
                if fig.metric is COMMIT_DURATION:
                    self.commit.add(fig.value)
                elif fig.metric is STORED_BYTES:
                    self.stored_bytes.add(fig.value)
        age = running_age(rec, now)
        if age is not None:
            self.ages[f"{rec.step} {rec.task_key}"] = age

    @property
    def suggested_interval(self) -> float | None:
        """The save interval that minimises expected lost work plus checkpoint cost
        (``suggested_interval``) from these figures, in seconds: ``C`` the mean commit
        duration, ``M`` the attempt time per interruption; None without at least one
        interruption and one commit duration."""
        count = sum(self.interruptions.values())
        cost = self.commit.mean
        if (
            not count
            or cost is None
            or not math.isfinite(self.run_seconds / count)
            or (self.run_seconds <= 0 or not math.isfinite(cost))
        ):
            return None
        interval = suggested_interval(max(cost, 1e-6), self.run_seconds / count)
        return min(interval, MAX_SUGGESTED_SECONDS) if math.isfinite(interval) else None

    def as_json(self) -> dict[str, Any]:
        """As ``runs --json`` and ``checkpoints show --json`` give it (``metrics``), and as a
        finished run keeps it (``CheckpointsKept.figures``): seconds and bytes."""
        interval = self.suggested_interval
        return {
            "interruptions": dict(sorted(self.interruptions.items())),
            "work_lost_seconds": self.work_lost.as_json(),
            "stop_to_stored_seconds": self.stop_to_stored.as_json(),
            "commit_seconds": self.commit.as_json(),
            "stored_bytes": self.stored_bytes.as_json(),
            "resumes": dict(sorted(self.resumes.items())),
            "checkpoint_age_seconds": {k: round(v, 3) for k, v in self.ages.items()},
            "attempt_seconds": round(self.run_seconds, 3),
            "suggested_interval_seconds": None if interval is None else round(interval, 3),
        }


def run_figures(records: Iterable[TaskRecord], now: float | None = None) -> RunFigures:
    """Every figure of a run's task records (each attempt span once), for a report."""
    out = RunFigures()
    for rec in records:
        out.add(rec, now)
    return out


def interval_env(record: TaskRecord | None) -> dict[str, str]:
    """The task action's ``SUGGESTED_INTERVAL_VARIABLE`` (whole seconds, at least 1), from the
    task's own history (``run_figures`` of its record: its interruptions and commit cost so
    far); empty while it has none of either (its first attempt, or no checkpoint stored)."""
    if record is None:
        return {}
    if record.history and record.history[-1].ended_at is None:  # its process died: lost
        record = record.model_copy(deep=True)
        record.history.append(AttemptSpan(attempt=record.attempt + 1, started_at=time.time()))
    interval = run_figures([record]).suggested_interval  # finite, at most a week
    if interval is None:
        return {}
    return {SUGGESTED_INTERVAL_VARIABLE: str(max(1, round(interval)))}


def seconds_words(value: float) -> str:
    """Seconds for a person: ``32.5 ms``, ``1.25 s``, ``3,600 s``."""
    return _seconds(value)


def _seconds(value: float) -> str:
    if value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s" if value < 100 else f"{value:,.0f} s"


def figures_words(doc: Mapping[str, Any]) -> list[str]:
    """A run's figures (``RunFigures.as_json``) in words, a line each, for ``checkpoints show``
    and ``runs``: interruptions and the work they lost, stop-to-stored, commits, resumes, the
    suggested save interval, and the work no checkpoint covers in attempts running now."""
    out = []
    causes = doc.get("interruptions") or {}
    lost = doc.get("work_lost_seconds") or {}
    if causes:
        each = ", ".join(f"{c} {n}" for c, n in causes.items())
        text = f"interruptions: {sum(causes.values())} ({each})"
        if lost.get("count"):
            text += f"; work lost {_seconds(lost['total'])} (largest {_seconds(lost['max'])})"
            if "worker_lost" in causes:
                text += "; a lost worker's loss is counted up to the next attempt's start"
        out.append(text)
    else:
        out.append("interruptions: none")
    waited = doc.get("stop_to_stored_seconds") or {}
    if waited.get("count"):
        mean = waited["total"] / waited["count"]
        out.append(
            f"stop to checkpoint stored: {_seconds(mean)} on average over {waited['count']} "
            f"(largest {_seconds(waited['max'])})"
        )
    commit = doc.get("commit_seconds") or {}
    stored = doc.get("stored_bytes") or {}
    if commit.get("count"):
        mean = commit["total"] / commit["count"]
        out.append(
            f"commits: {commit['count']:,}, {_seconds(mean)} on average (largest "
            f"{_seconds(commit['max'])}); {int(stored.get('total', 0)):,} bytes committed "
            "over them (content the store had already is kept once)"
        )
    resumes = doc.get("resumes") or {}
    if resumes:
        out.append("resumes: " + ", ".join(f"{s} {n}" for s, n in resumes.items()))
    interval = doc.get("suggested_interval_seconds")
    if interval is not None:
        out.append(
            f"suggested save interval: {_seconds(interval)} (Young's sqrt(2 x commit x time "
            "between interruptions), advice; a resumed task gets its own, from its history, "
            f"in whole seconds (at least 1), as ${SUGGESTED_INTERVAL_VARIABLE})"
        )
    ages = doc.get("checkpoint_age_seconds") or {}
    for task, age in sorted(ages.items(), key=lambda kv: -kv[1])[:5]:
        out.append(f"running {task}: {_seconds(age)} of work since its last checkpoint")
    return out


def _stat_ok(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("count"), int)
        and value["count"] >= 0
        and all(
            isinstance(value.get(k), (int, float)) and math.isfinite(value[k]) and value[k] >= 0
            for k in ("total", "max")
        )
    )


def _counts_ok(value: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in value.items()
    )


_STATS = ("work_lost_seconds", "stop_to_stored_seconds", "commit_seconds", "stored_bytes")


def read_figures(doc: Any) -> dict[str, Any] | None:
    """A figures document (``RunFigures.as_json``) read from a record (a run's
    ``kept.figures``), when every field has the shape ``as_json`` gives it; None otherwise (a
    hand-edited or damaged record: a report leaves the figures out and says so)."""
    if not isinstance(doc, dict):
        return None
    ages = doc.get("checkpoint_age_seconds", {})
    interval = doc.get("suggested_interval_seconds")
    seconds = doc.get("attempt_seconds", 0.0)
    ok = (
        all(_stat_ok(doc.get(k)) for k in _STATS)
        and _counts_ok(doc.get("interruptions"))
        and _counts_ok(doc.get("resumes"))
        and isinstance(ages, dict)
        and all(isinstance(v, (int, float)) and math.isfinite(v) for v in ages.values())
        and isinstance(seconds, (int, float))
        and math.isfinite(seconds)
        and (interval is None or (isinstance(interval, (int, float)) and math.isfinite(interval)))
    )
    return doc if ok else None
