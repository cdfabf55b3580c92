"""A hub store whose behaviour is a plain function from request to answer, as httpx's
``MockTransport``: in memory (:class:`MockTransport`, mounted on the ``requests.Session`` the
hub client takes as its I/O seam) or on a loopback port (:class:`StubServer`, for the CLI and
``serve``, which build their own session).

Used for what a real Prometheus will not do on demand: 5xx, timeouts, Thanos partial
responses, and a bearer-token-checking front (Prometheus's web config has no bearer auth).
A handler may raise a ``requests`` exception (``requests.ReadTimeout``, ``ConnectionError``)
to stand for a transport failure without a socket or a sleep.
"""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import requests
import requests.adapters
import requests.structures


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
    return Response(status, json.dumps(data, separators=(",", ":")).encode())  # as Prometheus


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


class MockTransport(requests.adapters.BaseAdapter):
    """requests' counterpart of ``httpx.MockTransport``: every request the session sends is
    answered by ``handler`` in memory, with no socket; ``seen`` keeps the requests."""

    def __init__(self, handler: Handler) -> None:
        super().__init__()
        self.handler = handler
        self.seen: list[Request] = []

    def send(self, request: requests.PreparedRequest, stream: bool = False,
             timeout: Any = None, verify: Any = True, cert: Any = None,
             proxies: Any = None) -> requests.Response:
        parts = urlsplit(request.url or "")
        body = request.body or b""
        req = Request(request.method or "GET",
                      parts.path + (f"?{parts.query}" if parts.query else ""),
                      dict(request.headers.items()),
                      body.encode() if isinstance(body, str) else bytes(body))  # type: ignore[arg-type]
        self.seen.append(req)
        answer = self.handler(req)  # may raise a requests exception: a transport failure
        resp = requests.Response()
        resp.status_code = answer.status
        resp.reason = HTTPStatus(answer.status).phrase
        resp.headers = requests.structures.CaseInsensitiveDict(
            {"Content-Type": answer.content_type, "Content-Length": str(len(answer.body))})
        resp.raw = io.BytesIO(answer.body)
        resp.url = request.url or ""
        resp.request = request
        resp.encoding = "utf-8"
        return resp

    def close(self) -> None:
        return


#: the address a client of the in-memory store is given (nothing listens there)
MOCK_URL = "http://hub.invalid"


def mock_client(handler: Handler, **kwargs: Any):  # -> hub.store.HubClient
    """A hub client whose store is ``handler``; its transport is ``client.transport``."""
    from hub.store import HubClient

    transport = MockTransport(handler)
    session = requests.Session()
    session.mount("http://", transport)
    session.mount("https://", transport)
    client = HubClient(MOCK_URL, session=session, **kwargs)
    client.transport = transport  # type: ignore[attr-defined]
    return client
