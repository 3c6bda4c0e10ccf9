"""Logs, traces and metrics for the controller.

Logging is structlog everywhere: library code calls `structlog.get_logger()` and
`structlog.contextvars.bind_contextvars(round=..., job_id=..., node_id=...)`, and
`configure_logging` decides once, at process start, how lines look (one JSON object a
line in production, a readable console line on a terminal). Stdlib `logging` records
(gRPC's) at WARNING+ are forwarded into the same output so nothing bypasses the format.

Tracing and metrics use OpenTelemetry through a `Telemetry` object that owns its own
`TracerProvider` and `MeterProvider`: the global providers are never set, so several
controllers (and tests) in one process stay isolated. A scheduling round is recorded
after the fact from measured timestamps (the solve runs in another process, so no span
can be "open" around it): one `sia.round` span with a child span per phase.

The same meters also feed Prometheus when asked (`setup_telemetry(prometheus=True)`):
OpenTelemetry's Prometheus reader collects into the Telemetry's own prometheus_client
registry at each scrape, and `MetricsServer` serves it at `GET /metrics`. One
instrumentation, so OTLP and Prometheus never disagree.

The parts, one module each: `logs` (configure_logging), `metrics` (what is measured:
the gauges, counters' reasons, histogram buckets), `telemetry` (the Telemetry object:
round spans and the instruments), `exporters` (setup_telemetry: which exporters, from
the OTEL_* settings) and `endpoint` (the /metrics HTTP server).
"""

from sia_grpc.observability.endpoint import MetricsServer
from sia_grpc.observability.exporters import setup_telemetry
from sia_grpc.observability.logs import (
    LOG_FORMATS,
    LOG_LEVELS,
    add_logging_arguments,
    configure_logging,
)
from sia_grpc.observability.metrics import PREEMPTION_REASONS, RENEW_FAILURES
from sia_grpc.observability.telemetry import ROUND_SPAN, SOLVE_PHASE, Telemetry

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "PREEMPTION_REASONS",
    "RENEW_FAILURES",
    "ROUND_SPAN",
    "SOLVE_PHASE",
    "MetricsServer",
    "Telemetry",
    "add_logging_arguments",
    "configure_logging",
    "setup_telemetry",
]
