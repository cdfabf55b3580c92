"""A loopback HTTP server whose behaviour is a plain function (like httpx.MockTransport).

Used for what a real Prometheus will not do on demand: 5xx, slow answers, Thanos partial
responses, and a bearer-token-checking front (Prometheus's web config has no bearer auth).
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass

import requests


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"


def json_response(status: int, data: object) -> Response:
    return Response(status, json.dumps(data).encode())


Handler = Callable[[Request], Response]


def forward(target: str, req: Request) -> Response:
    """Pass a request on to a real server (the proxy case)."""
    try:
        r = requests.request(req.method, target + req.path, data=req.body, timeout=10,
                             headers={"Content-Type": req.headers.get("Content-Type", "")})
    except requests.ConnectionError:
        return Response(502, b"upstream unreachable", "text/plain")
    return Response(r.status_code, r.content, r.headers.get("Content-Type", "text/plain"))


class StubServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, handler: Handler) -> None:
        outer = self

        class _H(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                req = Request(self.command, self.path, dict(self.headers.items()),
                              self.rfile.read(length))
                outer.seen.append(req)
                resp = outer.handler(req)
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.content_type)
                self.send_header("Content-Length", str(len(resp.body)))
                self.end_headers()
                self.wfile.write(resp.body)

            do_GET = do_POST = _serve

            def log_message(self, *args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), _H)
        self.handler = handler
        self.seen: list[Request] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
