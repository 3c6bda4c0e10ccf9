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
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import numbers
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO, Any
from urllib.parse import urlparse
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import SpanContext, Status, StatusCode
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

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

log = structlog.get_logger(__name__)

# --------------------------------------------------------------------------- logging

_FORMATS = ("json", "console")
LOG_FORMATS = ("auto", *_FORMATS)  # auto: console on a terminal, JSON otherwise
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def add_logging_arguments(parser: Any) -> None:
    """`--log-format` and `--log-level` on an argparse parser: one definition for
    every daemon (sia-controller, the node agent), passed to `configure_logging`."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help="json (one object a line), console, or auto: console on a "
                             "terminal, JSON otherwise (default: env SIA_LOG_FORMAT, else "
                             "auto)")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="the least severe level written (default: env SIA_LOG_LEVEL, "
                             "else info)")


class _Unfailing:
    """A log stream whose writes never raise. A reader that went away (a closed
    pipe: BrokenPipeError) must not turn every log call into an exception; above
    all not in a signal handler that logs before it acts, which then never acts."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):  # ValueError: the stream was closed
            return 0

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


class _ForwardToStructlog(logging.Handler):
    """Re-emits stdlib records through structlog, so they share its format and stream."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            kw: dict[str, Any] = {"logger": record.name}
            if record.exc_info:
                kw["exc_info"] = record.exc_info
            structlog.get_logger().log(record.levelno, record.getMessage(), **kw)
        except Exception:
            self.handleError(record)


def _level_number(level: str) -> int:
    number = logging.getLevelNamesMapping().get(level.strip().upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r} (debug, info, warning, error, critical)")
    return number


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def configure_logging(
    *, fmt: str | None = None, level: str | None = None, stream: IO[str] | None = None
) -> None:
    """Configure structlog (and stdlib logging at WARNING+) to write to `stream`.

    `fmt` is "json", "console" or "auto"; unset, env `SIA_LOG_FORMAT` decides; auto (the
    default) is console on a TTY and JSON otherwise. `level` defaults to env
    `SIA_LOG_LEVEL`, else "info". `stream` defaults to `sys.stderr` at call time; writes
    to it never raise (`_Unfailing`). Calling again replaces the previous setup.
    """
    out = sys.stderr if stream is None else stream
    chosen = (fmt or os.environ.get("SIA_LOG_FORMAT") or "auto").strip().lower()
    if chosen == "auto":
        chosen = "console" if _isatty(out) else "json"
    # A bad value from the environment names the variable: the flags have choices.
    if chosen not in _FORMATS:
        where = "" if fmt else "SIA_LOG_FORMAT: "
        raise ValueError(f"{where}unknown log format {chosen!r} (json, console or auto)")
    try:
        min_level = _level_number(level or os.environ.get("SIA_LOG_LEVEL") or "info")
    except ValueError as err:
        raise ValueError(f"{'' if level else 'SIA_LOG_LEVEL: '}{err}") from None

    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if chosen == "json":
        # Tracebacks as one escaped string keep "one JSON object per line".
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        # ConsoleRenderer formats exc_info itself (and warns if format_exc_info ran first).
        processors.append(structlog.dev.ConsoleRenderer(colors=_isatty(out)))

    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(min_level),
        # (structlog asks for a TextIO; a WriteLogger only writes and flushes)
        logger_factory=structlog.WriteLoggerFactory(file=_Unfailing(out)),  # type: ignore[arg-type]
        # Not cached: module-level loggers must follow a later reconfiguration.
        cache_logger_on_first_use=False,
    )

    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _ForwardToStructlog)]:
        root.removeHandler(handler)
    root.addHandler(_ForwardToStructlog(level=logging.WARNING))
    if root.level > logging.WARNING:
        root.setLevel(logging.WARNING)


# --------------------------------------------------------------------------- telemetry

ROUND_SPAN = "sia.round"
SOLVE_PHASE = "solve"  # the phase whose duration feeds sia.solve.duration

_EXPORTERS = ("otlp", "console", "none")
# Seconds: rounds are bounded by the 60 s interval, solves by their timeout (45 s by
# default: 40 and 45 show solves close to it).
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0,
                     40.0, 45.0, 60.0, 120.0)

# The gauges, read through callables given to `Telemetry.observe(key=...)`:
# (name, key, unit, description, attribute of a per-value mapping, or a tuple of them
# for a mapping keyed by tuples, or None). With the
# Prometheus exporter "sia.queue.max_wait" (unit s) becomes sia_queue_max_wait_seconds,
# "sia.jobs" becomes sia_jobs{state=...}; docs/operations.md lists them all.
_GAUGES: tuple[tuple[str, str, str, str, str | tuple[str, ...] | None], ...] = (
    ("sia.queue.length", "queue_length", "{job}",
     "Jobs waiting for GPUs (profiled, queued, holding none)", None),
    ("sia.queue.max_wait", "queue_max_wait", "s",
     "Longest wait of a job not yet started (PROFILING or QUEUED since submission)", None),
    ("sia.events.pending", "events_pending", "{event}",
     "Controller events not yet handled; growth means it is falling behind", None),
    ("sia.jobs", "jobs_by_state", "{job}", "Jobs by state (the CLI's names)", "state"),
    ("sia.nodes", "nodes_by_state", "{node}", "Nodes by state (READY, DRAINING, LOST)",
     "state"),
    # A node that separates nothing ("none") among a cluster's nodes should page.
    ("sia.nodes.isolation", "nodes_by_isolation", "{node}",
     "Nodes not LOST by how their agent separates jobs (none, user, sandbox; modeled: "
     "runs no job code; unknown: an agent too old to say)", "isolation"),
    ("sia.gpus.allocated", "gpus_allocated", "{gpu}", "GPUs held by jobs, by type",
     "gpu_type"),
    ("sia.gpus.capacity", "gpus_capacity", "{gpu}",
     "GPUs on ready nodes (connected, not draining), by type", "gpu_type"),
    ("sia.agents.connected", "agents_connected", "{agent}", "Connected node agents", None),
    ("sia.solve.timeout", "solve_timeout", "s",
     "The solve_timeout setting: a slower solve keeps the previous allocation", None),
    ("sia.queue.gpus.held", "queue_gpus_held", "{gpu}",
     "GPUs the jobs of each queue hold, by type", ("queue", "gpu_type")),
    ("sia.queue.gpus.guarantee", "queue_gpus_guarantee", "{gpu}",
     "GPUs each queue is guaranteed, by type", ("queue", "gpu_type")),
    ("sia.queue.gpus.borrowed", "queue_gpus_borrowed", "{gpu}",
     "GPUs each queue holds beyond its guarantee, by type", ("queue", "gpu_type")),
    ("sia.queue.jobs.pending", "queue_jobs_pending", "{job}",
     "Jobs of each queue waiting to start (PROFILING or QUEUED)", "queue"),
    # Summed over a controller pair: 1 (exactly one leader); 0 for longer than a lease's
    # TTL means no controller schedules.
    ("sia.leader", "leader", "",
     "1 while this controller acts as leader, 0 while it is a standby", None),
)
# Why a round preempted a job (the `reason` of sia.preemptions).
PREEMPTION_REASONS = ("reclaim", "policy")
# How a leader's lease renewal failed (the `reason` of sia.lease.renew_failures): the
# store call failed (retried), took too long (the leader steps down), or the store
# refused it (the lease expired or was taken: the leader steps down).
RENEW_FAILURES = ("error", "timeout", "refused")
_GAUGE_KEYS = frozenset(key for _, key, _, _, _ in _GAUGES)


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


def _attr_value(value: Any) -> Any:
    """An OpenTelemetry attribute value (numpy scalars and the like coerced); None drops."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list | tuple):
        items = [_attr_value(v) for v in value if v is not None]
        return items if len({type(v) for v in items}) <= 1 else [str(v) for v in items]
    return str(value)


class Telemetry:
    """One controller's tracer and meter, with the round span and the `sia.*` metrics.

    Made by `setup_telemetry`. `tracer` and `meter` are public for extra spans or
    instruments. `prometheus_registry` is this Telemetry's own prometheus_client registry
    when it was made with `prometheus=True` (serve it with `MetricsServer`), else None.
    Call `shutdown()` when the controller stops (also run at exit).
    """

    def __init__(
        self,
        service_name: str,
        *,
        span_exporters: Sequence[SpanExporter] = (),
        metric_readers: Sequence[MetricReader] = (),
        enabled: bool = True,
        traces_exporter: str = "none",
        metrics_exporter: str = "none",
        prometheus_registry: CollectorRegistry | None = None,
    ) -> None:
        self.service_name = service_name
        self.prometheus_registry = prometheus_registry
        self.enabled = enabled
        # What the exporters are, in words ("otlp", "console", "custom", "none", "disabled"),
        # for the controller's startup log line.
        self.traces_exporter = traces_exporter
        self.metrics_exporter = metrics_exporter
        self._lock = threading.Lock()
        self._closed = False
        if enabled:
            resource = Resource.create({"service.name": service_name})
            tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
            for exporter in span_exporters:
                tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
            meter_provider = MeterProvider(metric_readers=list(metric_readers), resource=resource,
                                           shutdown_on_exit=False)
            self._tracer_provider: trace.TracerProvider = tracer_provider
            self._meter_provider: metrics.MeterProvider = meter_provider
            atexit.register(self.shutdown)
        else:
            self._tracer_provider = trace.NoOpTracerProvider()
            self._meter_provider = metrics.NoOpMeterProvider()
        self.tracer = self._tracer_provider.get_tracer("sia_grpc")
        self.meter = self._meter_provider.get_meter("sia_grpc")

        self._round_duration = self.meter.create_histogram(
            "sia.round.duration", unit="s", description="Scheduling round, start to dispatch",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self._solve_duration = self.meter.create_histogram(
            "sia.solve.duration", unit="s", description="Allocation solve (the 'solve' phase)",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS)
        self._rounds = self.meter.create_counter(
            "sia.rounds", unit="{round}", description="Scheduling rounds, by trigger and outcome")
        self._preemptions = self.meter.create_counter(
            "sia.preemptions", unit="{job}",
            description="Jobs a round preempted, by queue and reason (reclaim: for another "
                        "queue's guarantee; policy: the goodput ILP's choice)")
        self._renew_failures = self.meter.create_counter(
            "sia.lease.renew_failures", unit="{renewal}",
            description="Lease renewals of a leader that failed, by reason (error: retried; "
                        "timeout, refused: it stepped down)")

        self._callbacks: dict[str, Callable[[], Any]] = {}
        for name, key, unit, description, attr in _GAUGES:
            self.meter.create_observable_gauge(
                name, callbacks=[self._gauge_callback(name, key, attr)], unit=unit,
                description=description)

    # ------------------------------------------------------------------ metrics

    def observe(self, **fns: Callable[[], Any] | None) -> None:
        """Register the callables behind the gauges (keywords: the keys in `_GAUGES`, e.g.
        `queue_length=`, `jobs_by_state=`); each given one replaces the last.

        They run on the metric reader's thread at each export or scrape (or on `collect`
        in tests), so they should return a cheap snapshot: a number, or for a gauge with
        an attribute a mapping from its value (job state, GPU type) to a number.
        """
        unknown = sorted(set(fns) - _GAUGE_KEYS)
        if unknown:
            raise TypeError(f"observe: unknown gauge {unknown[0]!r} "
                            f"({', '.join(sorted(_GAUGE_KEYS))})")
        self._callbacks.update({k: fn for k, fn in fns.items() if fn is not None})

    def count_preemptions(self, preempted: Iterable[tuple[str, str]], *,
                          zero: bool = False) -> None:
        """Count preempted jobs, each (queue, reason in PREEMPTION_REASONS); `zero` adds 0
        for each, so that the series exist before the first preemption (an alert on a
        series that never appeared would never fire)."""
        for queue, reason in preempted:
            self._preemptions.add(0 if zero else 1, {"queue": queue, "reason": reason})

    def count_renew_failure(self, reason: str, *, zero: bool = False) -> None:
        """Count a failed lease renewal (`reason` in RENEW_FAILURES); `zero` adds 0, so the
        series exist before the first failure (as for count_preemptions)."""
        self._renew_failures.add(0 if zero else 1, {"reason": reason})

    def _gauge_callback(
        self, name: str, key: str, attr: str | tuple[str, ...] | None
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            fn = self._callbacks.get(key)
            if fn is None:
                return []
            try:
                value = fn()
                if value is None:
                    return []
                if attr is None:
                    return [Observation(_attr_value(value))]
                if isinstance(attr, tuple):  # keys are tuples, one value per attribute
                    return [Observation(_attr_value(v), dict(zip(attr, map(str, k), strict=True)))
                            for k, v in value.items()]
                return [Observation(_attr_value(v), {attr: str(k)}) for k, v in value.items()]
            except Exception:
                log.warning("telemetry.gauge_callback_failed", gauge=name, exc_info=True)
                return []

        return callback

    # ------------------------------------------------------------------ rounds

    def record_round(
        self,
        round_no: int,
        *,
        trigger: str,
        start_ns: int,
        phases: Sequence[tuple[str, int, int]],
        attributes: Mapping[str, Any] | None = None,
        error: str | None = None,
        end_ns: int | None = None,
    ) -> SpanContext:
        """Record a finished round: its span, one child per phase, and the round metrics.

        Timestamps are `time.time_ns()` values. `phases` are (name, start_ns, end_ns); the
        round span runs from `start_ns` to `end_ns` (default: the last phase end), widened
        to contain every phase. `attributes` go on the round span under a "sia." prefix
        (added when missing; None values dropped). `error` marks the round span ERROR with
        that message, e.g. "solver timed out: previous allocation kept". Never raises:
        telemetry must not break a round. Returns the round span's context (for logs).
        """
        try:
            return self._record_round(round_no, trigger, start_ns, phases, attributes or {},
                                      error, end_ns)
        except Exception:
            log.warning("telemetry.record_round_failed", round=round_no, exc_info=True)
            return trace.INVALID_SPAN_CONTEXT

    def _record_round(
        self,
        round_no: int,
        trigger: str,
        start_ns: int,
        phases: Sequence[tuple[str, int, int]],
        attributes: Mapping[str, Any],
        error: str | None,
        end_ns: int | None,
    ) -> SpanContext:
        spans = [(name, int(s), max(int(s), int(e))) for name, s, e in phases]
        start = min([int(start_ns)] + [s for _, s, _ in spans])
        if end_ns is None:
            end_ns = spans[-1][2] if spans else int(start_ns)
        end = max([int(end_ns), start] + [e for _, _, e in spans])

        attrs: dict[str, Any] = {"sia.round": int(round_no), "sia.trigger": trigger}
        for key, value in attributes.items():
            converted = _attr_value(value)
            if converted is not None:
                attrs[key if key.startswith("sia.") else f"sia.{key}"] = converted

        # An empty context: a round is a root span even if called inside an RPC's span.
        round_span = self.tracer.start_span(ROUND_SPAN, context=otel_context.Context(),
                                            attributes=attrs, start_time=start)
        parent = trace.set_span_in_context(round_span)
        for name, s, e in spans:
            self.tracer.start_span(name, context=parent, start_time=s).end(end_time=e)
        if error:
            round_span.set_status(Status(StatusCode.ERROR, error))
        round_span.end(end_time=end)

        self._round_duration.record((end - start) / 1e9, {"trigger": trigger})
        for name, s, e in spans:
            if name == SOLVE_PHASE:
                self._solve_duration.record((e - s) / 1e9)
        self._rounds.add(1, {"trigger": trigger, "outcome": "error" if error else "ok"})
        return round_span.get_span_context()

    # ------------------------------------------------------------------ lifecycle

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        """Export what is buffered now; False if an exporter failed or timed out."""
        if not self.enabled or self._closed:
            return True
        deadline = time.monotonic() + timeout_millis / 1000
        ok = True
        providers: tuple[Any, ...] = (self._tracer_provider, self._meter_provider)  # (the SDK's)
        for provider in providers:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            try:
                ok = bool(provider.force_flush(left)) and ok
            except Exception:
                log.warning("telemetry.flush_failed", exc_info=True)
                ok = False
        return ok

    def shutdown(self) -> None:
        """Flush and stop the exporters; later calls (and the one at exit) do nothing."""
        with self._lock:
            if self._closed or not self.enabled:
                self._closed = True
                return
            self._closed = True
        atexit.unregister(self.shutdown)
        providers: tuple[Any, ...] = (self._tracer_provider, self._meter_provider)  # (the SDK's)
        for provider in providers:
            try:
                provider.shutdown()
            except Exception:
                log.warning("telemetry.shutdown_failed", exc_info=True)


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


# --------------------------------------------------------------------------- /metrics

_INDEX = (b'<!doctype html><title>sia-controller</title>'
          b'<p>sia-controller: <a href="/metrics">/metrics</a> (Prometheus)</p>\n')


def _metrics_routes(metrics_app: Callable) -> Callable:
    """A WSGI app: `metrics_app` at /metrics, a link to it at /, 404 elsewhere (whereas
    prometheus_client's app answers metrics on every path)."""

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path == "/":
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [_INDEX]
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [b"not found: the metrics are at /metrics\n"]

    return app


class _QuietHandler(WSGIRequestHandler):
    timeout = 30  # seconds: a client that connects and stalls loses its thread after this

    def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
        pass


class _MetricsHTTPServer(ThreadingWSGIServer):  # a thread per request, daemon threads
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hung up or stalled: not worth socketserver's traceback on stderr.
        log.debug("metrics request failed", client=str(client_address), exc_info=True)


class MetricsServer:
    """`GET /metrics` of `registry` in the Prometheus text format (prometheus_client's
    encoder; gzip when asked) over plain HTTP on `address`, "HOST:PORT" (port 0: a free
    one, then `port` says which), from a background thread until `close()`.

    Raises OSError when the address cannot be bound or resolved.
    """

    def __init__(self, registry: CollectorRegistry, address: str) -> None:
        host, _, port_s = address.rpartition(":")
        host = host.strip("[]")  # "[::1]:9464", as gRPC writes IPv6 addresses
        family = socket.getaddrinfo(host or None, int(port_s), type=socket.SOCK_STREAM,
                                    flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsHTTPServer", (_MetricsHTTPServer,),
                            {"address_family": family})
        self._httpd: _MetricsHTTPServer = make_server(
            host, int(port_s), _metrics_routes(make_wsgi_app(registry)), server_class,
            handler_class=_QuietHandler)
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        name="sia-metrics-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (blocks up to half a second: serve_forever's poll) and close the
        socket. Safe twice."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()
