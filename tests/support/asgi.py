"""Asking the service's app without a socket: starlette's TestClient over the ASGI app, the
same app `serve` runs on uvicorn, for tests of what an endpoint answers rather than how it is
carried."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

with warnings.catch_warnings():  # starlette 1.x prefers httpx2, which is not installed here
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient


class AppClient:
    """``handle(path, query)`` -> (status, body): JSON decoded, anything else the response."""

    def __init__(self, app: Any) -> None:
        self.client = TestClient(app, raise_server_exceptions=False)

    def handle(self, path: str, query: Mapping[str, Sequence[str]] | None = None,
               **headers: str) -> tuple[int, Any]:
        params = [(k, v) for k, values in (query or {}).items() for v in values]
        r = self.client.get(path, params=params, headers=headers)
        return r.status_code, _body(r)


def _body(r: httpx.Response) -> Any:
    if r.headers.get("content-type", "").startswith("application/json"):
        return r.json()
    return r


def no_metrics(accept: str | None = None, encoding: str | None = None
               ) -> tuple[bytes, dict[str, str]]:
    return b"", {"Content-Type": "text/plain"}


def page_client(db_url: str, **kwargs: Any) -> TestClient:
    """The service's app over a read-only engine of ``db_url`` (no scheduler, no findings,
    every usage section), for tests that read its pages and JSON."""
    from hub.service import USAGE_SECTIONS, build_app, read_only_engine

    app = build_app(read_only_engine(db_url), health=lambda: (True, {}),
                    findings=lambda: ([], None), metrics=no_metrics,
                    page_sections=USAGE_SECTIONS, **kwargs)
    return TestClient(app, raise_server_exceptions=False)
