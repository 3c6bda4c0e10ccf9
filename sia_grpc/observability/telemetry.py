"""One controller's tracer and meter (`Telemetry`): the round span with a child per
phase, recorded after the fact from measured timestamps, and the `sia.*`
instruments (the catalogue: `metrics`). Its own providers, never the global ones,
so that several controllers (and tests) in one process stay isolated.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanContext, Status, StatusCode
from prometheus_client import CollectorRegistry

from sia_grpc.observability.metrics import DURATION_BUCKETS, GAUGE_KEYS, GAUGES, attr_value

__all__ = ["ROUND_SPAN", "SOLVE_PHASE", "Telemetry"]

log = structlog.get_logger(__name__)

ROUND_SPAN = "sia.round"
SOLVE_PHASE = "solve"  # the phase whose duration feeds sia.solve.duration


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
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self._solve_duration = self.meter.create_histogram(
            "sia.solve.duration", unit="s", description="Allocation solve (the 'solve' phase)",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
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
        for name, key, unit, description, attr in GAUGES:
            self.meter.create_observable_gauge(
                name, callbacks=[self._gauge_callback(name, key, attr)], unit=unit,
                description=description)

    # ------------------------------------------------------------------ metrics

    def observe(self, **fns: Callable[[], Any] | None) -> None:
        """Register the callables behind the gauges (keywords: the keys in `GAUGES`, e.g.
        `queue_length=`, `jobs_by_state=`); each given one replaces the last.

        They run on the metric reader's thread at each export or scrape (or on `collect`
        in tests), so they should return a cheap snapshot: a number, or for a gauge with
        an attribute a mapping from its value (job state, GPU type) to a number.
        """
        unknown = sorted(set(fns) - GAUGE_KEYS)
        if unknown:
            raise TypeError(f"observe: unknown gauge {unknown[0]!r} "
                            f"({', '.join(sorted(GAUGE_KEYS))})")
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
                    return [Observation(attr_value(value))]
                if isinstance(attr, tuple):  # keys are tuples, one value per attribute
                    return [Observation(attr_value(v), dict(zip(attr, map(str, k), strict=True)))
                            for k, v in value.items()]
                return [Observation(attr_value(v), {attr: str(k)}) for k, v in value.items()]
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
            converted = attr_value(value)
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
