"""The HTTP face: ``/metrics`` (Prometheus text format 0.0.4) and ``/healthz``.

Plain ``http.server``: the exporter serves one Prometheus and one kubelet probe, so threads per
connection are plenty, and nothing here may block on the GPU library (it only reads the
exporter's current snapshot).
"""

from __future__ import annotations

import http.server

from hub.common import BackgroundHTTPServer, parse_listen
from spoke._exporter import Exporter

__all__ = ["CONTENT_TYPE", "DEFAULT_PORT", "MetricsServer", "parse_listen"]

# dcgm-exporter answers in the classic text format whatever the Accept header says; so do
# we, so the hub and Prometheus see byte-for-byte the same kind of payload from both.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_PORT = 9400


class _Handler(http.server.BaseHTTPRequestHandler):
    server: MetricsServer
    protocol_version = "HTTP/1.1"  # keep-alive: Prometheus reuses its connection
    timeout = 60  # drop idle keep-alive connections
    # Headers and body go out in two writes; without TCP_NODELAY, Nagle plus delayed ACK
    # holds the body ~40 ms on a kept-alive connection, on every scrape.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.server.exporter.exposition(), CONTENT_TYPE)
        elif path == "/healthz":
            ok, message = self.server.exporter.health()
            self._send(200 if ok else 503, (message + "\n").encode(), "text/plain; charset=utf-8")
        elif path == "/":
            body = b"gpufleet exporter: see /metrics and /healthz\n"
            self._send(200, body, "text/plain; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # one line per scrape would drown the log; Prometheus records failures


class MetricsServer(BackgroundHTTPServer):
    """Serves one exporter. Binding errors (port in use, bad host) raise OSError at once."""

    thread_name = "metrics-http"

    def __init__(self, exporter: Exporter, host: str = "0.0.0.0",
                 port: int = DEFAULT_PORT) -> None:
        self.exporter = exporter
        super().__init__(host, port, _Handler)
