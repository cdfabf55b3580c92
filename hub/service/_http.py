"""HTTP plumbing of the API: plain ``http.server``, JSON encoding, the background server."""

from __future__ import annotations

import datetime as dt
import http.server
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hub.common import BackgroundHTTPServer, iso
from hub.service._api import Raw, log
from hub.service._routes import Router


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def encode_json(body: Any) -> bytes:
    return (json.dumps(body, default=_plain, separators=(",", ":")) + "\n").encode()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ApiServer
    protocol_version = "HTTP/1.1"
    timeout = 60
    disable_nagle_algorithm = True

    def version_string(self) -> str:
        return "gpufleet"  # no Python version in the Server header

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def _refuse(self) -> None:
        self._send(405, encode_json({"error": f"method {self.command} not allowed: the API "
                                              "is read-only (GET, HEAD)"}),
                   "application/json", body=True, extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _refuse

    def _dispatch(self, body: bool) -> None:
        url = urlsplit(self.path)
        try:
            query = parse_qs(url.query, keep_blank_values=True, max_num_fields=50)
        except ValueError:
            status, payload = 400, {"error": "too many query parameters"}
        else:
            status, payload = self.server.router.handle(url.path, query)
        if isinstance(payload, Raw):
            self._send(status, payload.body, payload.content_type, body, dict(payload.headers))
        else:
            self._send(status, encode_json(payload), "application/json", body)

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

    def __init__(self, router: Router, host: str, port: int) -> None:
        self.router = router
        super().__init__(host, port, _Handler)
