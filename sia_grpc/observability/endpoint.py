"""The controller's `GET /metrics` (`MetricsServer`): its Telemetry's own
prometheus_client registry in the Prometheus text format, over plain HTTP from a
background thread; a link to it at /, 404 elsewhere.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

__all__ = ["MetricsServer"]

log = structlog.get_logger(__name__)

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
