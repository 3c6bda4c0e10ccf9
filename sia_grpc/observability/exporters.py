"""Which exporters a `Telemetry` gets (`setup_telemetry`), from the standard OTEL_*
settings: OTLP over gRPC, the console, or none, for traces and for metrics, and a
Prometheus reader when the controller serves /metrics. A misspelt setting fails at
start rather than turning telemetry off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter
from prometheus_client import CollectorRegistry

from sia_grpc.observability.telemetry import Telemetry

__all__ = ["setup_telemetry"]

_EXPORTERS = ("otlp", "console", "none")


def _exporter_names(env: Mapping[str, str], key: str) -> list[str]:
    """The exporters named by `key` (comma-separated, as the spec allows); default none."""
    names = [n.strip().lower() for n in env.get(key, "none").split(",") if n.strip()]
    bad = [n for n in names if n not in _EXPORTERS]
    if bad:
        # Fail fast: a typo would otherwise silently turn telemetry off.
        raise ValueError(f"{key}={env.get(key)!r}: unknown exporter {bad[0]!r} "
                         "(otlp, console, none)")
    return [] if "none" in names else names


def _otlp_kwargs(env: Mapping[str, str], signal: str) -> dict[str, Any]:
    """OTLP/gRPC exporter settings from `env`, signal-specific before generic.

    Resolved here rather than by the exporter so that an explicit `env` mapping is honoured;
    TLS certificate settings are still read by the exporter from os.environ.
    """

    def get(name: str) -> str | None:
        specific = env.get(f"OTEL_EXPORTER_OTLP_{signal}_{name}")
        return specific or env.get(f"OTEL_EXPORTER_OTLP_{name}")

    endpoint = get("ENDPOINT") or "http://localhost:4317"
    insecure_s = get("INSECURE")
    if insecure_s is not None:
        insecure = insecure_s.strip().lower() == "true"
    else:
        insecure = urlparse(endpoint).scheme == "http"
    kwargs: dict[str, Any] = {"endpoint": endpoint, "insecure": insecure}
    if headers := get("HEADERS"):
        kwargs["headers"] = headers
    if timeout := get("TIMEOUT"):
        kwargs["timeout"] = float(timeout)
    if compression := get("COMPRESSION"):
        from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression

        choices = {"gzip": Compression.Gzip, "deflate": Compression.Deflate,
                   "none": Compression.NoCompression}
        if compression.strip().lower() not in choices:
            raise ValueError(f"unknown OTLP compression {compression!r} (gzip, deflate, none)")
        kwargs["compression"] = choices[compression.strip().lower()]
    return kwargs


def _span_exporters(env: Mapping[str, str]) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    for name in _exporter_names(env, "OTEL_TRACES_EXPORTER"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter(**_otlp_kwargs(env, "TRACES")))
        else:
            exporters.append(ConsoleSpanExporter())
    return exporters


def _metric_readers(env: Mapping[str, str]) -> list[MetricReader]:
    interval = float(env.get("OTEL_METRIC_EXPORT_INTERVAL") or 60_000)
    readers: list[MetricReader] = []
    for name in _exporter_names(env, "OTEL_METRICS_EXPORTER"):
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

            exporter: Any = OTLPMetricExporter(**_otlp_kwargs(env, "METRICS"))
        else:
            exporter = ConsoleMetricExporter()
        readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=interval))
    return readers


def setup_telemetry(
    service_name: str = "sia-controller",
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
    env: Mapping[str, str] = os.environ,
    prometheus: bool = False,
) -> Telemetry:
    """A `Telemetry` configured from the standard OTEL_* settings in `env`.

    `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: "otlp" (gRPC; endpoint, insecure,
    headers, timeout, compression from `OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]*`), "console",
    or "none" (the default: spans are still recorded, just not exported). An explicit
    `span_exporter` / `metric_reader` replaces the setting. `OTEL_SERVICE_NAME` overrides
    `service_name`. `OTEL_SDK_DISABLED=true` gives a no-op Telemetry whatever else is given.
    `prometheus=True` adds a reader that the Telemetry's own `prometheus_registry` (never
    prometheus_client's global one) collects from at each scrape, besides any exporter.
    Raises ValueError for an unknown exporter name, or for `prometheus` with the SDK disabled.
    """
    name = env.get("OTEL_SERVICE_NAME") or service_name
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        if prometheus:  # an endpoint that never has a metric would hide the mistake
            raise ValueError("OTEL_SDK_DISABLED=true turns off the metrics that metrics_listen "
                             "would serve: unset one of them")
        return Telemetry(name, enabled=False, traces_exporter="disabled",
                         metrics_exporter="disabled")
    # Both settings validated before any exporter (and its channel) is made.
    traces = ",".join(_exporter_names(env, "OTEL_TRACES_EXPORTER")) or "none"
    metrics_ = ",".join(_exporter_names(env, "OTEL_METRICS_EXPORTER")) or "none"
    if span_exporter is not None:
        span_exporters: list[SpanExporter] = [span_exporter]
        traces = "custom"
    else:
        span_exporters = _span_exporters(env)
    if metric_reader is not None:
        readers: list[MetricReader] = [metric_reader]
        metrics_ = "custom"
    else:
        readers = _metric_readers(env)
    registry = None
    if prometheus:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        registry = CollectorRegistry()
        # No otel_scope_* labels: one scope (sia_grpc) makes them noise on every series.
        readers.append(PrometheusMetricReader(registry=registry, scope_info_enabled=False))
    return Telemetry(name, span_exporters=span_exporters, metric_readers=readers,
                     traces_exporter=traces, metrics_exporter=metrics_,
                     prometheus_registry=registry)
