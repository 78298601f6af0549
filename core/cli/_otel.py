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

import os
from collections.abc import Callable

__all__ = ("metrics_from_environment",)

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def _asked(env: os._Environ[str] | dict[str, str]) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() not in ("otlp", ""):
        return False
    return any(env.get(name, "").strip() for name in _ENDPOINTS)


def metrics_from_environment(warn: Callable[[str], None]) -> Callable[[], None]:
    """Set an OTLP/HTTP meter provider when the environment asks for one (see the module).

    Returns:
        What to call when the command ends: flushes and shuts the provider down (within the
        exporter's timeout); does nothing when none was set.
    """
    if not _asked(os.environ):
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
            f"{exc.name or exc} is not installed (pip install 'openjd-checkpoint[otel]')"
        )
        return _nothing
    service = os.environ.get("OTEL_SERVICE_NAME") or "openjd-checkpoint"
    provider = MeterProvider(
        metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
        resource=Resource.create({"service.name": service}),
    )
    metrics.set_meter_provider(provider)

    def shutdown() -> None:
        try:
            provider.shutdown()  # exports what is left
        except Exception as exc:  # an unreachable collector must not change the exit code
            warn(f"warning: the last metrics were not exported: {type(exc).__name__}: {exc}")

    return shutdown


def _nothing() -> None:
    return None
