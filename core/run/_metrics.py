"""Checkpoint metrics as they happen: ``MetricsObserver`` turns a run's task events into the
figures ``core._figures`` defines and gives them to sinks: OpenTelemetry here
(``OpenTelemetrySink``, through its API), Airflow's ``Stats`` and Prefect's events in the
adapters (each a ``MetricSink``). The executor feeds every ``TaskEvent`` to its observer.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from core._figures import (
    CHECKPOINT_AGE,
    Figure,
    Metric,
    MetricKind,
    attempt_figures,
    checkpoint_figures,
    running_age,
)
from core._records import TaskRecord
from core.task import TaskEvent, TaskEventKind, TaskExecution

__all__ = (
    "AGE_EVERY_SECONDS",
    "SECONDS_BUCKETS",
    "MetricSink",
    "MetricsObserver",
    "OpenTelemetrySink",
    "default_sinks",
)


class MetricSink(Protocol):
    """Where figures go (OpenTelemetry, Airflow's ``Stats``, Prefect events). ``record`` is
    called on the task's threads: keep it fast, and never raise (a sink that fails must not
    fail a task)."""

    def record(self, figure: Figure) -> None: ...


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
        self._zero: set[int] = set()  # tasks whose age was last sent as 0 (a checkpoint)

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
            cp, spec = event.checkpoint, execution.spec
            if cp is None:
                return
            figures = checkpoint_figures(self.job, spec.step_name, spec.task_key, cp, at=event.time)
            with self._lock:
                self._age_sent[id(execution)] = event.time
                self._zero.add(id(execution))
        elif kind == TaskEventKind.STARTED:
            rec = event.record  # not a copy: read here only
            lost = rec is not None and len(rec.history) > 1 and rec.history[-2].ended_at is None
            figures = attempt_figures(self.job, rec, -2) if rec is not None and lost else []
        elif kind == TaskEventKind.ENDED:
            ended = getattr(event.value, "record", None)
            figures = attempt_figures(self.job, ended) if isinstance(ended, TaskRecord) else []
            with self._lock:
                self._age_sent.pop(id(execution), None)
                if id(execution) in self._zero:  # the gauge says 0 already: no work at risk
                    self._zero.discard(id(execution))
                    figures = [f for f in figures if f.metric is not CHECKPOINT_AGE or f.value]
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
            self._zero.discard(id(execution))
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


SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600)
"""Histogram bucket bounds, in seconds, advised to OpenTelemetry (its default bounds are for
milliseconds)."""

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
            meter, name, unit, text = self._meter, metric.name, metric.unit, metric.description
            if metric.kind == MetricKind.HISTOGRAM:
                found = meter.create_histogram(
                    name, unit, text, explicit_bucket_boundaries_advisory=SECONDS_BUCKETS
                )
            elif metric.kind == MetricKind.COUNTER:
                found = meter.create_counter(name, unit, text)
            else:
                found = meter.create_gauge(name, unit, text)
            self._instruments[metric.name] = found
        return found

    def record(self, figure: Figure) -> None:
        if self._meter is None:
            return
        instrument = self._instrument(figure.metric)
        attributes = figure.labels
        if figure.metric.kind == MetricKind.COUNTER:  # counts and bytes: whole numbers
            value = figure.value
            instrument.add(int(value) if float(value).is_integer() else value, attributes)
        elif figure.metric.kind == MetricKind.HISTOGRAM:
            instrument.record(figure.value, attributes)
        else:
            instrument.set(figure.value, attributes)


def default_sinks() -> list[MetricSink]:
    """The sinks a runner uses when its caller names none: OpenTelemetry when its API is
    installed (the ``[otel]`` extra), else none (and then metrics cost nothing)."""
    if "opentelemetry.metrics" not in sys.modules:  # no one in this process set a provider
        return []  # (and the API's import, ~50 ms, is not paid for nothing)
    sink = OpenTelemetrySink()
    return [sink] if sink.active else []
