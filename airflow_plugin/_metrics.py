"""The checkpoint metrics (``core.Figure``) through Airflow's own ``Stats``, so that the StatsD,
Datadog or OpenTelemetry backend configured for Airflow (``[metrics]``) carries them beside
Airflow's metrics (``StatsSink``), and the sinks an OpenJD task instance uses
(``task_sinks``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import core

__all__ = ("StatsSink", "task_sinks")


def _stats() -> Any:
    """Airflow 3.3's ``Stats`` of the task process: ``airflow.sdk.observability.stats`` (the
    task runner initializes it from ``[metrics]`` as it starts; ``airflow.stats`` is a
    deprecated shim of it)."""
    from airflow.sdk.observability import stats

    return stats


class StatsSink:
    """Each figure through Airflow's ``Stats``, named as the core names it
    (``openjd_checkpoint.stored``; Airflow adds its ``statsd_prefix`` or OpenTelemetry
    prefix, ``airflow`` by default), with its labels as tags:

    - a counter: ``Stats.incr(name, count, tags=labels)`` (a whole number: bytes, or 1);
    - a histogram of seconds: ``Stats.timing(name, timedelta(seconds=value), tags=labels)``:
      Airflow's backends send timings in milliseconds (StatsD ``|ms``; its OpenTelemetry
      logger records the histogram in milliseconds too);
    - a gauge: ``Stats.gauge(name, value, tags=labels)`` (seconds, as the core has it).

    Tag values are Airflow's stat-name characters (``normalize_name_for_stats``: letters,
    digits, ``_ . -``; anything else becomes ``_``, so job ``Render (4K)`` is tagged
    ``Render__4K_``): with ``[metrics] statsd_influxdb_enabled`` the tags become part of the
    StatsD name (``name,job=...,step=...:value|type``), which Airflow drops whole when it holds
    any other character. Plain StatsD has no tags: the labels reach it only that way, or
    through the Datadog or OpenTelemetry backends. A figure Airflow refuses is dropped by
    Airflow with a log line; one that raises drops this sink (``core``'s observer), never the
    task.
    """

    def __init__(self, stats: Any = None) -> None:
        self._stats = stats if stats is not None else _stats()

    def record(self, figure: core.Figure) -> None:
        name = figure.metric.name
        normalize = self._stats.normalize_name_for_stats
        tags = {k: normalize(str(v), log_warning=False) for k, v in figure.labels.items()}
        kind = figure.metric.kind
        if kind == core.MetricKind.COUNTER:
            self._stats.incr(name, int(round(figure.value)), tags=tags)
        elif kind == core.MetricKind.HISTOGRAM:
            self._stats.timing(name, timedelta(seconds=figure.value), tags=tags)
        else:
            self._stats.gauge(name, figure.value, tags=tags)


def _airflow_uses_otel(stats: Any) -> bool:
    """True when Airflow's ``Stats`` backend is its OpenTelemetry logger: ``[metrics] otel_on``
    without StatsD or Datadog, which Airflow picks first (``stats_utils.get_stats_factory``).
    ``stats.timer()`` (no name: a stopwatch, nothing sent) makes the backend now if it was not
    made yet, which sets the process's OpenTelemetry meter provider (``get_otel_logger``)."""
    from airflow.sdk.configuration import conf

    def on(key: str) -> bool:
        return conf.getboolean("metrics", key, fallback=False)

    if on("statsd_datadog_enabled") or on("statsd_on") or not on("otel_on"):
        return False
    stats.timer()
    return True


def task_sinks(stats: Any = None) -> list[core.MetricSink]:
    """The sinks of an OpenJD task instance: ``core.default_sinks()`` (OpenTelemetry, when a
    meter provider is set) and Airflow's ``Stats`` (``StatsSink``). When Airflow's own backend
    is OpenTelemetry (``[metrics] otel_on``), it set the process's meter provider, so the
    core's OpenTelemetry sink already sends every figure to Airflow's exporter, with its unit
    (seconds, bytes) and name: ``Stats`` would send each again, in milliseconds. Then only the
    core's sink is used. Never raises: without Airflow's ``Stats`` the core's sinks are used."""
    try:
        stats = stats if stats is not None else _stats()
        otel = _airflow_uses_otel(stats)
    except Exception:  # metrics must never fail a task
        return core.default_sinks()
    sinks = core.default_sinks()
    if otel and sinks:
        return sinks
    return [*sinks, StatsSink(stats)]
