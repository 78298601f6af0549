"""The command line's OpenTelemetry set-up: when the environment asks for an OTLP exporter, the
CLI (an application, so the one that configures the SDK) sets a meter provider that exports the
checkpoint metrics (``core.run._metrics``) over OTLP/HTTP, and flushes it when the command ends.

Asked for by the standard variables: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` set, ``OTEL_SDK_DISABLED`` not ``true`` and
``OTEL_METRICS_EXPORTER`` unset or ``otlp``. The exporter reads its own variables (headers,
timeout, ``OTEL_METRIC_EXPORT_INTERVAL`` in milliseconds, default 60000); ``OTEL_SERVICE_NAME``
defaults to ``openjd-checkpoint``. Needs the ``[otel]`` extra (opentelemetry-sdk and
opentelemetry-exporter-otlp-proto-http); without it the CLI says so once and runs on.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable

__all__ = ("EXPORT_WAIT_SECONDS", "metrics_from_environment")

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


EXPORT_WAIT_SECONDS = 5.0
"""How long the command waits at its end for the last metrics to be exported."""
MAX_INTERVAL_MILLIS = 86_400_000.0
"""The longest ``OTEL_METRIC_EXPORT_INTERVAL`` taken (a day); beyond it the SDK's reader
thread cannot wait, and the default (60000 ms) is used with a warning."""


def _asked(env: os._Environ[str] | dict[str, str], warn: Callable[[str], None]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if not any(env.get(name, "").strip() for name in _ENDPOINTS):
        return False
    exporter = env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower()
    if exporter in ("otlp", ""):
        return True
    if exporter != "none":
        warn(
            f"warning: OTEL_METRICS_EXPORTER={exporter!r}: the checkpoint metrics are exported "
            "only with otlp (the default) or not at all (none); none are exported"
        )
    return False


def _interval_millis(env: os._Environ[str] | dict[str, str], warn: Callable[[str], None]) -> float:
    raw = env.get("OTEL_METRIC_EXPORT_INTERVAL", "").strip()
    if not raw:
        return 60_000.0
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_INTERVAL_MILLIS:
        warn(
            f"warning: OTEL_METRIC_EXPORT_INTERVAL={raw!r} is not a number of milliseconds "
            f"above 0 and at most {MAX_INTERVAL_MILLIS:.0f}; 60000 is used"
        )
        return 60_000.0
    return value


def metrics_from_environment(warn: Callable[[str], None]) -> Callable[[], None]:
    """Set an OTLP/HTTP meter provider when the environment asks for one (see the module).
    A setting the SDK would refuse is warned about and replaced, or the metrics left off: the
    command itself never fails for them.

    Returns:
        What to call when the command ends: exports what is left and shuts the provider down,
        waiting at most ``EXPORT_WAIT_SECONDS`` (then one warning says the last figures were
        not exported); does nothing when no provider was set.
    """
    if not _asked(os.environ, warn):
        return _nothing
    try:
        from opentelemetry import metrics  # noqa: PLC0415 (the [otel] extra)
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter,
        )
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415
        from opentelemetry.sdk.metrics.export import (  # noqa: PLC0415
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    except ImportError as exc:
        warn(
            "warning: OTEL_EXPORTER_OTLP_ENDPOINT is set but no metrics are exported: "
            f"{exc.name or exc} is not installed (the [otel] extra: pip install -e '.[otel]')"
        )
        return _nothing
    service = os.environ.get("OTEL_SERVICE_NAME") or "openjd-checkpoint"
    interval = _interval_millis(os.environ, warn)
    try:
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(), export_interval_millis=interval
        )
        provider = MeterProvider(
            metric_readers=[reader],
            resource=Resource.create({"service.name": service}),
            shutdown_on_exit=False,  # ours, bounded: an exit never waits on a collector
        )
    except Exception as exc:  # a setting the SDK refuses: the command runs without metrics
        warn(f"warning: no metrics are exported: {type(exc).__name__}: {exc}")
        return _nothing
    metrics.set_meter_provider(provider)
    # the exporter's "Transient error ... retrying" lines: one warning of ours says it instead
    logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.ERROR)
    endpoint = next(os.environ[n] for n in _ENDPOINTS if os.environ.get(n, "").strip())

    def shutdown() -> None:
        done: list[bool] = []

        def export() -> None:
            try:
                done.append(provider.force_flush(timeout_millis=EXPORT_WAIT_SECONDS * 1000))
                provider.shutdown(timeout_millis=1000)
            except Exception:  # reported below as not exported
                done.append(False)

        thread = threading.Thread(target=export, name="openjd-otel-export", daemon=True)
        thread.start()
        thread.join(EXPORT_WAIT_SECONDS)
        if not done or not done[0]:
            warn(
                "warning: the last checkpoint metrics were not exported within "
                f"{EXPORT_WAIT_SECONDS:g} s (OTLP endpoint {endpoint})"
            )

    return shutdown


def _nothing() -> None:
    return None
