"""The HTTP face: ``/metrics`` (Prometheus text format 0.0.4) and ``/healthz``.

Plain ``http.server``: the exporter serves one Prometheus and one kubelet probe, so threads per
connection are plenty, and nothing here may block on the GPU library (it only reads the
exporter's current snapshot).
"""

from __future__ import annotations

import http.server
import socket
import socketserver
import threading

from spoke._exporter import Exporter

# dcgm-exporter answers in the classic text format whatever the Accept header says; so do
# we, so the hub and Prometheus see byte-for-byte the same kind of payload from both.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_PORT = 9400


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9400`` for IPv6, ``:9400`` for all interfaces)."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"invalid listen address {text!r} (use HOST:PORT, e.g. 0.0.0.0:9400)")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"invalid port {port} in {text!r} (0-65535)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"invalid listen address {text!r} (write IPv6 hosts as [::1]:9400)")
    return host or "0.0.0.0", port


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


class MetricsServer(http.server.ThreadingHTTPServer):
    """Serves one exporter. Binding errors (port in use, bad host) raise OSError at once."""

    daemon_threads = True

    def __init__(self, exporter: Exporter, host: str = "0.0.0.0",
                 port: int = DEFAULT_PORT) -> None:
        self.exporter = exporter
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)
        self._thread: threading.Thread | None = None

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS lookup that can hang for
        # seconds on a node without DNS; we never use the name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = str(self.server_address[0])
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1" if self.address_family == socket.AF_INET else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> MetricsServer:
        """Serve in a background thread (tests, benchmarks, in-process demos)."""
        self._thread = threading.Thread(target=self.serve_forever, args=(0.1,),
                                        name="metrics-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server_close()
