"""An in-process OTLP/gRPC trace receiver for tests (see `otlp_receiver` fixture)."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2


class OtlpTraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace endpoint on 127.0.0.1:<ephemeral> that keeps every request."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The OTEL_* settings that point an exporter here."""
        return {"OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.endpoint,
                "OTEL_EXPORTER_OTLP_INSECURE": "true"}

    def Export(self, request, context):  # the gRPC method name
        with self._lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, object], trace_pb2.Span]]:
        """Every received span with its resource attributes."""
        with self._lock:
            requests = list(self.requests)
        out = []
        for request in requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: any_value(a.value)
                            for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope_spans.spans)
        return out

    def wait_for_spans(self, n: int, timeout: float = 5.0) -> list:
        deadline = time.monotonic() + timeout
        while len(spans := self.spans()) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return spans

    def __enter__(self) -> OtlpTraceReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(grace=None).wait(5)


def any_value(value) -> object:
    return getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
