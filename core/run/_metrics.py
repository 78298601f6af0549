"""Checkpoint metrics: the one definition of each figure a person can watch and alert on, and
the sinks that carry them (OpenTelemetry here; Airflow's ``Stats`` and Prefect's events in the
adapters).

What a checkpoint exists to cut is the work an interruption loses. The figures (``METRICS``):

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

Every figure is computed from what the store keeps (a task record's attempt spans and its
checkpoint: ``core._records.AttemptSpan``, ``CheckpointData.commit_seconds``), by the functions
below, whether it is sent as it happens (``MetricsObserver``, fed by the executor's task
events) or read back later (``run_figures``, for ``openjd-checkpoint runs`` and ``checkpoints
show``). The suggested save interval (``suggested_interval``) is Young's first-order formula
over the same figures.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from core._records import AttemptSpan, InterruptionCause, TaskRecord, TaskStatus
from core.task import TaskEvent, TaskEventKind, TaskExecution

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
    "MetricSink",
    "MetricsObserver",
    "OpenTelemetrySink",
    "RunFigures",
    "attempt_figures",
    "default_sinks",
    "checkpoint_figures",
    "run_figures",
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


class MetricSink(Protocol):
    """Where figures go (OpenTelemetry, Airflow's ``Stats``, Prefect events). ``record`` is
    called on the task's threads: keep it fast, and never raise (a sink that fails must not
    fail a task)."""

    def record(self, figure: Figure) -> None: ...


# --- the one definition of each figure ------------------------------------------------------------
def _stopped_early(span: AttemptSpan) -> bool:
    return span.cause is not None and span.outcome not in (
        TaskStatus.SUCCEEDED.value,
        TaskStatus.FAILED.value,
    )


def checkpoint_figures(job: str, rec: TaskRecord, *, at: float | None = None) -> list[Figure]:
    """The figures of the checkpoint ``rec`` just stored: its commit duration and bytes, and
    the task's checkpoint age (0)."""
    cp = rec.checkpoint
    if cp is None:
        return []
    at = cp.saved_at if at is None else at
    step = {"job": job, "step": rec.step}
    out = [Figure(CHECKPOINT_AGE, 0.0, {**step, "task": rec.task_key}, at)]
    if cp.commit_seconds is not None:
        out.append(Figure(COMMIT_DURATION, cp.commit_seconds, step, at))
    size = len((cp.state or "").encode()) + (cp.file_bytes or 0)
    out.append(Figure(STORED_BYTES, float(size), step, at))
    return out


def _lost_end(rec: TaskRecord, index: int) -> float | None:
    """When span ``index`` of ``rec`` ended: its end; for an open span followed by another (its
    process died), when the next one started; None while it runs."""
    span = rec.history[index]
    if span.ended_at is not None:
        return span.ended_at
    if index + 1 < len(rec.history):
        return rec.history[index + 1].started_at
    return None


def attempt_figures(job: str, rec: TaskRecord, index: int = -1) -> list[Figure]:
    """The figures of ``rec``'s attempt span ``index`` (default: the latest), once it ended:
    an interruption (its cause; a span left open and followed by another is a lost worker),
    the work it lost, its stop-to-stored time, its resume status, and the checkpoint age it
    ended with."""
    if not rec.history:
        return []
    index = index % len(rec.history)
    span = rec.history[index]
    end = _lost_end(rec, index)
    if end is None:
        return []
    step = {"job": job, "step": rec.step}
    lost_worker = span.ended_at is None
    out: list[Figure] = []
    covered = max(span.started_at, span.saved_at or span.started_at)
    if lost_worker or _stopped_early(span):
        cause = (InterruptionCause.WORKER_LOST if lost_worker else span.cause) or "stop"
        labels = {**step, "cause": InterruptionCause(cause).value}
        out.append(Figure(INTERRUPTIONS, 1.0, labels, end))
        out.append(Figure(WORK_LOST, max(0.0, end - covered), labels, end))
        if span.stopped_at is not None and span.stored_after_stop_at is not None:
            wait = max(0.0, span.stored_after_stop_at - span.stopped_at)
            out.append(Figure(STOP_TO_STORED, wait, labels, end))
    if span.resumed_from is not None and not lost_worker:
        status = rec.resume_status if index == len(rec.history) - 1 else None
        if status is not None:
            out.append(Figure(RESUMES, 1.0, {**step, "status": status}, end))
    if not lost_worker:
        age = max(0.0, end - covered)
        out.append(Figure(CHECKPOINT_AGE, age, {**step, "task": rec.task_key}, end))
    return out


def running_age(rec: TaskRecord, now: float | None = None) -> float | None:
    """The checkpoint age of ``rec``'s running attempt now (None: no attempt runs)."""
    if not rec.history or rec.history[-1].ended_at is not None:
        return None
    span = rec.history[-1]
    now = time.time() if now is None else now
    return max(0.0, now - max(span.started_at, span.saved_at or span.started_at))


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
class RunFigures:
    """A run's figures, read back from its task records (``run_figures``).

    Attributes:
        interruptions: attempts stopped before their task's end, by cause value.
        work_lost_seconds: the work each interruption lost, in seconds.
        stop_to_stored_seconds: each stop-to-stored time, in seconds.
        commit_seconds: each task's latest commit duration, in seconds.
        stored_bytes: bytes of each task's latest checkpoint.
        resumes: resumed attempts by the status the task said.
        ages: task label (step and task key) -> checkpoint age in seconds, for attempts running.
        run_seconds: attempt time summed over the run's tasks (running attempts to now).
    """

    interruptions: dict[str, int] = field(default_factory=dict)
    work_lost_seconds: list[float] = field(default_factory=list)
    stop_to_stored_seconds: list[float] = field(default_factory=list)
    commit_seconds: list[float] = field(default_factory=list)
    stored_bytes: list[int] = field(default_factory=list)
    resumes: dict[str, int] = field(default_factory=dict)
    ages: dict[str, float] = field(default_factory=dict)
    run_seconds: float = 0.0

    @property
    def suggested_interval(self) -> float | None:
        """The save interval that minimises expected lost work plus checkpoint cost
        (``suggested_interval``) from these figures, in seconds; None without at least one
        interruption and one commit duration."""
        count = sum(self.interruptions.values())
        if not count or not self.commit_seconds or self.run_seconds <= 0:
            return None
        cost = sum(self.commit_seconds) / len(self.commit_seconds)
        return suggested_interval(max(cost, 1e-6), self.run_seconds / count)


def run_figures(records: Iterable[TaskRecord], now: float | None = None) -> RunFigures:
    """Every figure of a run's task records (each span once), for a report."""
    now = time.time() if now is None else now
    out = RunFigures()
    for rec in records:
        for index, span in enumerate(rec.history):
            end = _lost_end(rec, index)
            out.run_seconds += max(0.0, (end if end is not None else now) - span.started_at)
            for fig in attempt_figures("", rec, index):
                if fig.metric is INTERRUPTIONS:
                    cause = fig.labels["cause"]
                    out.interruptions[cause] = out.interruptions.get(cause, 0) + 1
                elif fig.metric is WORK_LOST:
                    out.work_lost_seconds.append(fig.value)
                elif fig.metric is STOP_TO_STORED:
                    out.stop_to_stored_seconds.append(fig.value)
                elif fig.metric is RESUMES:
                    status = fig.labels["status"]
                    out.resumes[status] = out.resumes.get(status, 0) + 1
        for fig in checkpoint_figures("", rec):
            if fig.metric is COMMIT_DURATION:
                out.commit_seconds.append(fig.value)
            elif fig.metric is STORED_BYTES:
                out.stored_bytes.append(int(fig.value))
        age = running_age(rec, now)
        if age is not None:
            out.ages[f"{rec.step} {rec.task_key}"] = age
    return out


# --- sent as it happens ---------------------------------------------------------------------------
AGE_EVERY_SECONDS = 10.0
"""At most how often a running task's checkpoint age is sent with its progress."""


class MetricsObserver:
    """Turns a run's task events into figures for ``sinks`` (the executor feeds it every
    ``TaskEvent``; ``wrap`` puts it before the caller's ``on_event``). A sink that raises is
    dropped with one note, so metrics never fail a task.

    Args:
        job: the job's name (the ``job`` label).
        sinks: where the figures go.
        on_note: told once per sink that failed.
    """

    def __init__(
        self,
        job: str,
        sinks: Sequence[MetricSink],
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.job = job
        self._sinks = list(sinks)
        self._on_note = on_note
        self._lock = threading.Lock()
        self._age_sent: dict[int, float] = {}

    def wrap(
        self, on_event: Callable[[TaskExecution, TaskEvent], None] | None
    ) -> Callable[[TaskExecution, TaskEvent], None] | None:
        """``on_event`` with this observer before it (``on_event`` itself with no sink)."""
        if not self._sinks:
            return on_event

        def both(execution: TaskExecution, event: TaskEvent) -> None:
            self.on_event(execution, event)
            if on_event is not None:
                on_event(execution, event)

        return both

    def on_event(self, execution: TaskExecution, event: TaskEvent) -> None:
        kind = event.kind
        if kind == TaskEventKind.CHECKPOINT_SAVED:
            figures = checkpoint_figures(self.job, execution.record, at=event.time)
            with self._lock:
                self._age_sent[id(execution)] = event.time
        elif kind == TaskEventKind.STARTED:
            rec = execution.record
            figures = attempt_figures(self.job, rec, -2) if len(rec.history) > 1 else []
            figures = [f for f in figures if f.labels.get("cause") == "worker_lost"]
        elif kind == TaskEventKind.ENDED:
            ended = getattr(event.value, "record", None)
            figures = attempt_figures(self.job, ended) if isinstance(ended, TaskRecord) else []
            with self._lock:
                self._age_sent.pop(id(execution), None)
        elif kind in (TaskEventKind.PROGRESS, TaskEventKind.FRAME_COMPLETE):
            figures = self._age(execution, event.time)
        else:
            return
        self.send(figures)

    def _age(self, execution: TaskExecution, now: float) -> list[Figure]:
        with self._lock:
            last = self._age_sent.get(id(execution), 0.0)
            if now - last < AGE_EVERY_SECONDS:
                return []
            self._age_sent[id(execution)] = now
        rec = execution.record
        age = running_age(rec, now)
        if age is None:
            return []
        labels = {"job": self.job, "step": rec.step, "task": rec.task_key}
        return [Figure(CHECKPOINT_AGE, age, labels, now)]

    def send(self, figures: Sequence[Figure]) -> None:
        """Give each figure to every sink; a sink that raises is dropped, with a note."""
        for sink in list(self._sinks):
            try:
                for fig in figures:
                    sink.record(fig)
            except Exception as exc:  # a metrics backend must never fail a task
                self._sinks.remove(sink)
                if self._on_note is not None:
                    self._on_note(
                        f"metrics: {type(sink).__name__} failed and is no longer used: "
                        f"{type(exc).__name__}: {exc}"
                    )


_UNSET_PROVIDERS = ("_ProxyMeterProvider", "NoOpMeterProvider")
"""The API's own providers before an application configures one (the API has no public way to
ask whether one was set): a sink made then does nothing, so figures are not even computed."""


class OpenTelemetrySink:
    """Figures as OpenTelemetry metrics, through the OpenTelemetry API (the ``[otel]`` extra):
    counters, histograms and gauges of the meter ``openjd_checkpoint`` with the names, units
    and labels of ``METRICS``. Without the API installed, or before the application set a meter
    provider (``opentelemetry.metrics.set_meter_provider``), it is not ``active``. The CLI
    configures the SDK when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``) is set (``core.cli``)."""

    def __init__(self, meter_provider: Any = None) -> None:
        self._instruments: dict[str, Any] = {}
        try:
            from opentelemetry import metrics  # noqa: PLC0415 (optional: the [otel] extra)
        except ImportError:
            self._meter = None
            return
        provider = meter_provider or metrics.get_meter_provider()
        if type(provider).__name__ in _UNSET_PROVIDERS:  # nothing would be exported
            self._meter = None
            return
        self._meter = provider.get_meter("openjd_checkpoint")

    @property
    def active(self) -> bool:
        """True when the OpenTelemetry API is installed and a meter provider is set."""
        return self._meter is not None

    def _instrument(self, metric: Metric) -> Any:
        found = self._instruments.get(metric.name)
        if found is None:
            assert self._meter is not None
            make = {
                MetricKind.COUNTER: self._meter.create_counter,
                MetricKind.HISTOGRAM: self._meter.create_histogram,
                MetricKind.GAUGE: self._meter.create_gauge,
            }[metric.kind]
            found = make(metric.name, unit=metric.unit, description=metric.description)
            self._instruments[metric.name] = found
        return found

    def record(self, figure: Figure) -> None:
        if self._meter is None:
            return
        instrument = self._instrument(figure.metric)
        attributes = dict(figure.labels)
        if figure.metric.kind == MetricKind.COUNTER:
            instrument.add(figure.value, attributes)
        elif figure.metric.kind == MetricKind.HISTOGRAM:
            instrument.record(figure.value, attributes)
        else:
            instrument.set(figure.value, attributes)


def default_sinks() -> list[MetricSink]:
    """The sinks a runner uses when its caller names none: OpenTelemetry when its API is
    installed (the ``[otel]`` extra), else none (and then metrics cost nothing)."""
    sink = OpenTelemetrySink()
    return [sink] if sink.active else []
