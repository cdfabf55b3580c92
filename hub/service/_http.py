"""HTTP plumbing of the API: plain ``http.server``, JSON encoding, the background server.

The server bounds its work (``max_requests`` connections served at once; the others wait in
the kernel's backlog), answers every error in JSON (no HTML page from ``http.server``), speaks
TLS when given certificate files, and takes a client that goes away mid-answer as normal:
logged at debug, never a traceback on stderr.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hub.common import BackgroundHTTPServer, iso
from hub.service._api import Raw, log
from hub.service._routes import Router
from hub.service._session import MAX_FORM, FormPost, same_origin
from hub.service._tls import TlsFiles

MAX_REQUESTS = 32
#: Seconds a connection may sit idle or trickle a request; bounds what a slow client holds.
CONNECTION_TIMEOUT = 15


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def encode_json(body: Any) -> bytes:
    return (json.dumps(body, default=_plain, separators=(",", ":")) + "\n").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"
    timeout = CONNECTION_TIMEOUT
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):  # handshake here, in this thread
            self.connection.do_handshake()

    def version_string(self) -> str:
        return "gpufleet"  # no Python version in the Server header

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def _refuse(self) -> None:
        allowed = ", ".join(self.server.router.methods(urlsplit(getattr(self, "path", "/")).path))
        self.close_connection = True  # a body we did not read must not pass for a request
        self._send(405, encode_json({"error": f"method {self.command} not allowed here "
                                              f"({allowed}): the API is read-only"}),
                   "application/json", body=True,
                   extra={"Allow": allowed, "Connection": "close"})

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = _refuse

    def do_POST(self) -> None:
        """Only the sign-in and sign-out forms take a POST; its body is read only there, and
        only up to MAX_FORM bytes (a larger or unsized one is not read, and the connection
        closes after the answer)."""
        path = urlsplit(self.path).path
        if "POST" not in self.server.router.methods(path):
            self._refuse()
            return
        body: bytes | None = None
        length = self.headers.get("Content-Length", "")
        if length.isascii() and length.isdigit() and int(length) <= MAX_FORM \
                and "Transfer-Encoding" not in self.headers:
            body = self.rfile.read(int(length))
            if len(body) != int(length):
                body = None
        if body is None:
            self.close_connection = True
        post = FormPost(body, self.headers.get("Content-Type", ""),
                        self.headers.get("Cookie"),
                        same_origin(self.headers.get("Sec-Fetch-Site"),
                                    self.headers.get("Origin"), self.headers.get("Host")))
        self._answer(*self.server.router.handle_post(path, post), body=True)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own errors (bad request line, unknown method) in JSON, not HTML.

        A method http.server does not know (QUERY, BREW) is as refused as POST: 405.
        """
        if code == 501:
            self._refuse()
            return
        self.close_connection = True
        text = message or self.responses.get(code, ("error",))[0]
        self._send(code, encode_json({"error": text}), "application/json",
                   body=self.command != "HEAD" and code >= 200 and code not in (204, 304),
                   extra={"Connection": "close"})

    def _dispatch(self, body: bool) -> None:
        url = urlsplit(self.path)
        if "GET" not in self.server.router.methods(url.path):
            self._refuse()
            return
        try:
            query = parse_qs(url.query, keep_blank_values=True, max_num_fields=50,
                             errors="strict")
        except ValueError:
            status, payload = 400, {"error": "invalid query string (too many parameters or "
                                             "not UTF-8)"}
        else:
            status, payload = self.server.router.handle(
                url.path, query, self.headers.get("Authorization"),
                cookie=self.headers.get("Cookie"), accept=self.headers.get("Accept"))
        self._answer(status, payload, body)

    def _answer(self, status: int, payload: Any, body: bool) -> None:
        extra = {"WWW-Authenticate": 'Bearer realm="gpufleet"'} if status == 401 else None
        if isinstance(payload, Raw):
            self._send(status, payload.body, payload.content_type, body, dict(payload.headers))
        else:
            self._send(status, encode_json(payload), "application/json", body, extra)

    def _send(self, status: int, data: bytes, content_type: str, body: bool,
              extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class ApiServer(BackgroundHTTPServer):
    """Serves a router. Binding errors (port in use, bad host) raise OSError at once."""

    thread_name = "api-http"
    request_queue_size = 128

    def __init__(self, router: Router, host: str, port: int, *, tls: TlsFiles | None = None,
                 max_requests: int = MAX_REQUESTS) -> None:
        self.router = router
        self.tls = tls
        self._slots = threading.BoundedSemaphore(max_requests)
        self._stopping = threading.Event()
        super().__init__(host, port, _Handler)

    @property
    def url(self) -> str:
        url = super().url
        return "https" + url[4:] if self.tls is not None else url

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self.tls is not None:
            sock.settimeout(CONNECTION_TIMEOUT)
            sock = self.tls.context().wrap_socket(sock, server_side=True,
                                                  do_handshake_on_connect=False)
        return sock, addr

    def process_request(self, request: Any, client_address: Any) -> None:
        # Wait for a free slot before taking on another connection: a burst queues in the
        # backlog instead of growing one thread per connection without bound. Stopping
        # does not wait for idle keep-alive connections to give a slot back.
        while not self._slots.acquire(timeout=0.2):
            if self._stopping.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def stop(self) -> None:
        self._stopping.set()
        super().stop()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up, times out or fails the TLS handshake is routine; anything
        else is a bug worth a traceback, in the log (not on stderr)."""
        import sys

        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, ssl.SSLError, socket.timeout)):
            log.debug("connection from %s ended: %s", client_address[0], type(exc).__name__)
        else:
            log.exception("error serving %s", client_address[0])
