"""The small HTTP server of the exporter (and the local fleet's stand-ins).

Plain ``http.server`` with a thread per connection: the exporter serves a few readers (a
Prometheus, a kubelet probe), never user traffic, and needs nothing more. `gpufleet serve`,
which faces people and slow clients, runs FastAPI on uvicorn instead (hub/service/_serve.py).
"""

from __future__ import annotations

import http.server
import socket
import socketserver
import sys
import threading


def parse_listen(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
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
    return host or default_host, port


class QuietHangups(socketserver.BaseServer):
    """A client that hung up mid-answer (a scraper's timeout, an agent stopped while it
    scraped) is not our error: no traceback for it on the exporter's, the demo's or a test
    exporter's output. Anything else still prints one."""

    def handle_error(self, request: object, client_address: object) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class BackgroundHTTPServer(QuietHangups, http.server.ThreadingHTTPServer):
    """Binds at construction (so a port in use fails at once) and serves from a thread."""

    daemon_threads = True
    thread_name = "http"

    def __init__(self, host: str, port: int,
                 handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), handler)
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

    def start(self):  # -> Self
        self._thread = threading.Thread(target=self.serve_forever, args=(0.1,),
                                        name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(5)
            self._thread = None
        self.server_close()
