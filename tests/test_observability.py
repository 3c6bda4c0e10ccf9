"""Round traces over real OTLP/gRPC, the sia.* metrics, and the log format.

`OtlpTraceReceiver` is a minimal in-process OTLP collector (trace service only) meant to
be copied or imported by other tests, e.g. the controller's end-to-end test.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receiver import OtlpTraceReceiver, any_value

from sia_grpc import observability
from sia_grpc.observability import configure_logging, setup_telemetry

PHASES = ("estimate", "solve", "place", "dispatch")


# --------------------------------------------------------------------------- helpers


def _phases(start: int, step: int = 10_000_000) -> list[tuple[str, int, int]]:
    """Four back-to-back 10 ms phases (with a 1 ms gap) starting 1 ms after `start`."""
    return [(name, start + (i * step) + 1_000_000, start + (i + 1) * step)
            for i, name in enumerate(PHASES)]


def _attrs(span: trace_pb2.Span) -> dict[str, object]:
    return {a.key: any_value(a.value) for a in span.attributes}


# --------------------------------------------------------------------------- tracing


def test_rounds_export_over_otlp_with_phase_children(otlp_receiver: OtlpTraceReceiver) -> None:
    telemetry = setup_telemetry(env=otlp_receiver.env())
    try:
        assert telemetry.traces_exporter == "otlp"
        t0 = time.time_ns()
        telemetry.record_round(7, trigger="timer", start_ns=t0, phases=_phases(t0),
                               attributes={"jobs": 12, "gpus": 64, "objective": 3.5,
                                           "sia.jobs_moved": 2, "note": None})
        t1 = t0 + 100_000_000
        telemetry.record_round(8, trigger="submit", start_ns=t1, phases=_phases(t1),
                               attributes={"jobs": 13},
                               error="solver timed out: previous allocation kept")
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()

    received = otlp_receiver.wait_for_spans(10)
    assert len(received) == 10
    assert {r["service.name"] for r, _ in received} == {"sia-controller"}
    spans = [s for _, s in received]
    rounds = {_attrs(s)["sia.round"]: s for s in spans if s.name == "sia.round"}
    assert set(rounds) == {7, 8}
    assert rounds[7].trace_id != rounds[8].trace_id

    for round_no, start in ((7, t0), (8, t1)):
        root = rounds[round_no]
        assert root.parent_span_id == b""
        assert root.start_time_unix_nano == start
        assert root.end_time_unix_nano == start + 40_000_000  # the dispatch phase's end
        children = {s.name: s for s in spans if s.parent_span_id == root.span_id}
        assert set(children) == set(PHASES)
        for name, s, e in _phases(start):
            child = children[name]
            assert child.trace_id == root.trace_id
            assert (child.start_time_unix_nano, child.end_time_unix_nano) == (s, e)
            assert root.start_time_unix_nano <= s <= e <= root.end_time_unix_nano

    ok = _attrs(rounds[7])
    assert ok == {"sia.round": 7, "sia.trigger": "timer", "sia.jobs": 12, "sia.gpus": 64,
                  "sia.objective": 3.5, "sia.jobs_moved": 2}
    assert rounds[7].status.code == trace_pb2.Status.STATUS_CODE_UNSET
    assert _attrs(rounds[8])["sia.trigger"] == "submit"
    assert rounds[8].status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert rounds[8].status.message == "solver timed out: previous allocation kept"


def test_otlp_settings_come_from_the_process_environment(
    otlp_receiver: OtlpTraceReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in otlp_receiver.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "sia-test")
    telemetry = setup_telemetry()
    try:
        t0 = time.time_ns()
        telemetry.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0)[:1],
                               attributes={})
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    received = otlp_receiver.wait_for_spans(2)
    assert sorted(s.name for _, s in received) == ["estimate", "sia.round"]
    assert {r["service.name"] for r, _ in received} == {"sia-test"}


def test_round_span_is_widened_to_contain_every_phase() -> None:
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(span_exporter=exporter, env={})
    try:
        t0 = time.time_ns()
        # A phase measured (by a clock step) before the round start, and an explicit end.
        ctx = telemetry.record_round(1, trigger="timer", start_ns=t0,
                                     phases=[("estimate", t0 - 5, t0 + 10),
                                             ("solve", t0 + 10, t0 + 20)],
                                     attributes={}, end_ns=t0 + 50)
        telemetry.force_flush()
        spans = {s.name: s for s in exporter.get_finished_spans()}
    finally:
        telemetry.shutdown()
    assert ctx.is_valid and ctx.span_id == spans["sia.round"].context.span_id
    assert (spans["sia.round"].start_time, spans["sia.round"].end_time) == (t0 - 5, t0 + 50)


def test_none_exporter_records_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import opentelemetry.exporter.otlp.proto.grpc.exporter as otlp

    def no_channels(*args: object, **kwargs: object) -> None:
        raise AssertionError("no gRPC channel may be opened without an exporter")

    monkeypatch.setattr(otlp, "insecure_channel", no_channels)
    monkeypatch.setattr(otlp, "secure_channel", no_channels)
    # An endpoint alone does not turn export on (unlike the SDK's autoconfigure default).
    telemetry = setup_telemetry(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    try:
        assert (telemetry.traces_exporter, telemetry.metrics_exporter) == ("none", "none")
        t0 = time.time_ns()
        ctx = telemetry.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0),
                                     attributes={"jobs": 1})
        assert ctx.is_valid  # recorded, just not exported
        assert telemetry.force_flush()
    finally:
        telemetry.shutdown()
    telemetry.shutdown()  # a second shutdown is a no-op, not an error


def test_sdk_disabled_and_bad_settings() -> None:
    telemetry = setup_telemetry(env={"OTEL_SDK_DISABLED": "true",
                                     "OTEL_TRACES_EXPORTER": "otlp"})
    t0 = time.time_ns()
    ctx = telemetry.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0),
                                 attributes={})
    assert not telemetry.enabled and not ctx.is_valid
    assert telemetry.force_flush()
    telemetry.shutdown()
    telemetry.shutdown()
    with pytest.raises(ValueError, match="OTEL_METRICS_EXPORTER"):
        setup_telemetry(env={"OTEL_METRICS_EXPORTER": "prometheus"})


def test_shutdown_twice_flushes_once_and_stays_quiet(caplog: pytest.LogCaptureFixture) -> None:
    exporter = InMemorySpanExporter()
    telemetry = setup_telemetry(span_exporter=exporter, metric_reader=InMemoryMetricReader(),
                                env={})
    t0 = time.time_ns()
    telemetry.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0), attributes={})
    with caplog.at_level(logging.WARNING):
        telemetry.shutdown()  # flushes the batch processor
        assert len(exporter.get_finished_spans()) == 5
        telemetry.shutdown()
        assert telemetry.force_flush()
    assert not caplog.records  # e.g. the SDK's "shutdown can only be called once"


# --------------------------------------------------------------------------- metrics


def _metrics(reader: InMemoryMetricReader) -> dict[str, list]:
    data = reader.get_metrics_data()
    out: dict[str, list] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = list(metric.data.data_points)
    return out


def test_round_metrics_and_gauges() -> None:
    reader = InMemoryMetricReader()
    telemetry = setup_telemetry(metric_reader=reader, env={})
    try:
        telemetry.observe(queue_length=lambda: 3,
                          jobs_by_state=lambda: {"running": 5, "pending": 3},
                          gpus_allocated=lambda: {"a100": 8, "t4": 2},
                          gpus_capacity=lambda: {"a100": 16, "t4": 2},
                          nodes_by_state=lambda: {"READY": 3, "LOST": 1},
                          queue_max_wait=lambda: 12.5, solve_timeout=lambda: 45.0,
                          agents_connected=lambda: 4)
        t0 = time.time_ns()
        telemetry.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0),
                               attributes={})
        telemetry.record_round(2, trigger="submit", start_ns=t0, phases=_phases(t0),
                               attributes={}, error="solver timed out")
        metrics = _metrics(reader)
    finally:
        telemetry.shutdown()

    durations = {p.attributes["trigger"]: p for p in metrics["sia.round.duration"]}
    assert {t: p.count for t, p in durations.items()} == {"timer": 1, "submit": 1}
    assert durations["timer"].sum == pytest.approx(0.040)  # start to dispatch end, ns -> s
    [solve] = metrics["sia.solve.duration"]
    assert solve.count == 2 and solve.sum == pytest.approx(2 * 0.009)
    rounds = {(p.attributes["trigger"], p.attributes["outcome"]): p.value
              for p in metrics["sia.rounds"]}
    assert rounds == {("timer", "ok"): 1, ("submit", "error"): 1}

    def gauge(name: str, attr: str | None = None) -> dict:
        return {(p.attributes[attr] if attr else None): p.value for p in metrics[name]}

    assert gauge("sia.queue.length") == {None: 3}
    assert gauge("sia.jobs", "state") == {"running": 5, "pending": 3}
    assert gauge("sia.gpus.allocated", "gpu_type") == {"a100": 8, "t4": 2}
    assert gauge("sia.agents.connected") == {None: 4}
    assert gauge("sia.gpus.capacity", "gpu_type") == {"a100": 16, "t4": 2}
    assert gauge("sia.nodes", "state") == {"READY": 3, "LOST": 1}
    assert gauge("sia.queue.max_wait") == {None: 12.5}
    assert gauge("sia.solve.timeout") == {None: 45.0}
    with pytest.raises(TypeError, match="unknown gauge 'queue_lenght'"):
        telemetry.observe(queue_lenght=lambda: 1)


def test_prometheus_registries_are_per_telemetry_and_never_global() -> None:
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    first = setup_telemetry(env={}, prometheus=True)
    second = setup_telemetry(env={}, prometheus=True)
    try:
        assert setup_telemetry(env={}).prometheus_registry is None  # only when asked
        assert first.prometheus_registry is not second.prometheus_registry
        first.observe(agents_connected=lambda: 1)
        second.observe(agents_connected=lambda: 2)
        t0 = time.time_ns()
        first.record_round(1, trigger="timer", start_ns=t0, phases=_phases(t0), attributes={})
        text = {t: generate_latest(t.prometheus_registry).decode() for t in (first, second)}
    finally:
        first.shutdown()
        second.shutdown()
    families = {t: {f.name: f for f in text_string_to_metric_families(body)}
                for t, body in text.items()}
    assert [s.value for s in families[first]["sia_agents_connected"].samples] == [1]
    assert [s.value for s in families[second]["sia_agents_connected"].samples] == [2]
    assert "sia_rounds" in families[first] and "sia_rounds" not in families[second]
    assert "otel_scope_name" not in text[first]  # one scope: its labels would be noise
    assert b"sia_" not in generate_latest(REGISTRY)


def test_a_failing_gauge_callback_does_not_hide_the_others() -> None:
    reader = InMemoryMetricReader()
    telemetry = setup_telemetry(metric_reader=reader, env={})
    try:
        telemetry.observe(queue_length=lambda: 1 // 0, agents_connected=lambda: 2)
        metrics = _metrics(reader)
    finally:
        telemetry.shutdown()
    assert "sia.queue.length" not in metrics
    assert [p.value for p in metrics["sia.agents.connected"]] == [2]


# --------------------------------------------------------------------------- logging


@pytest.fixture
def restore_logging(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo configure_logging's global changes (structlog config, root handlers)."""
    monkeypatch.delenv("SIA_LOG_FORMAT", raising=False)
    monkeypatch.delenv("SIA_LOG_LEVEL", raising=False)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _json_lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_logs_carry_level_utc_time_and_context(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging(fmt="console", stream=io.StringIO())
    configure_logging(fmt="json", stream=out)  # the second call replaces the first
    log = structlog.get_logger()
    structlog.contextvars.bind_contextvars(round=3, job_id="job-1")
    log.info("job placed", node_id="n1")
    log.debug("too chatty")
    try:
        raise ValueError("bad estimate")
    except ValueError:
        log.exception("estimate failed")
    logging.getLogger("grpc._server").warning("stream %s reset", "s1")
    logging.getLogger("grpc._server").info("not at warning")

    lines = _json_lines(out)
    assert [line["event"] for line in lines] == ["job placed", "estimate failed", "stream s1 reset"]
    placed, failed, grpc_line = lines
    assert placed["level"] == "info" and placed["node_id"] == "n1"
    assert (placed["round"], placed["job_id"]) == (3, "job-1")
    assert placed["timestamp"].endswith(("Z", "+00:00"))
    assert failed["level"] == "error" and "ValueError: bad estimate" in failed["exception"]
    assert grpc_line["level"] == "warning" and grpc_line["logger"] == "grpc._server"
    assert grpc_line["round"] == 3  # stdlib records share the bound context
    assert len([h for h in logging.getLogger().handlers
                if isinstance(h, observability.logs._ForwardToStructlog)]) == 1


def test_console_format_when_forced_or_on_a_tty(
    restore_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    tty = _Tty()
    configure_logging(stream=tty)
    structlog.get_logger().info("on a terminal", round=1)
    monkeypatch.setenv("SIA_LOG_FORMAT", "console")
    forced = io.StringIO()
    configure_logging(stream=forced)
    structlog.get_logger().warning("forced", job_id="j9")

    for stream, event in ((tty, "on a terminal"), (forced, "forced")):
        text = stream.getvalue()
        assert event in text
        with pytest.raises(json.JSONDecodeError):
            json.loads(text.splitlines()[0])
    assert "job_id=j9" in forced.getvalue() and "\x1b[" not in forced.getvalue()


def test_level_from_environment(restore_logging: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIA_LOG_LEVEL", "WARNING")
    out = io.StringIO()
    configure_logging(stream=out)  # not a TTY: JSON
    log = structlog.get_logger()
    log.info("dropped")
    log.warning("kept")
    assert [line["event"] for line in _json_lines(out)] == ["kept"]
    with pytest.raises(ValueError, match="log level"):
        configure_logging(level="loud", stream=out)


def test_sia_controller_and_the_agent_take_the_same_log_flags() -> None:
    from sia_grpc.controller.__main__ import parser as controller_parser
    from sia_grpc.nodeagent.__main__ import _parser as agent_parser
    from sia_grpc.observability import LOG_FORMATS, LOG_LEVELS

    def flags(p) -> dict:
        return {a.dest: (tuple(a.choices), a.default) for a in p._actions
                if a.dest in ("log_format", "log_level")}

    assert flags(controller_parser()) == flags(agent_parser()) == {
        "log_format": (("auto", "json", "console"), None), "log_level": (LOG_LEVELS, None)}
    assert LOG_FORMATS == ("auto", "json", "console")
    args = ["--log-format", "auto", "--log-level", "warning"]
    assert controller_parser().parse_args(args).log_level == "warning"
    assert agent_parser().parse_args(["--controller", "c:1", *args]).log_format == "auto"


def test_auto_format_follows_the_terminal(restore_logging: None) -> None:
    tty, pipe = _Tty(), io.StringIO()
    configure_logging(fmt="auto", stream=tty)
    structlog.get_logger().info("on a terminal")
    configure_logging(fmt="auto", stream=pipe)
    structlog.get_logger().info("in a pipe")
    assert "on a terminal" in tty.getvalue() and not tty.getvalue().startswith("{")
    assert [line["event"] for line in _json_lines(pipe)] == ["in a pipe"]


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_logging_into_a_closed_pipe_never_raises(restore_logging: None) -> None:
    configure_logging(fmt="json", stream=_ClosedPipe())
    structlog.get_logger().info("nobody reads this")  # no BrokenPipeError
    logging.getLogger("grpc").warning("nor this")
