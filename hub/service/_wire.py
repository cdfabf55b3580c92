"""Answers as bytes: JSON encoded once, without a second pass through the response models,
and whole answers kept until the inventory changes.

Measured on bench/serve_profile.py's mix (10,000 GPUs), most of a request's CPU went into
work that was the same for every caller: validating rows the inventory had just produced
against the route's model, serialising them through pydantic (a Python call per timestamp),
folding the same counts and rendering the same page. So:

* :class:`Json`: a handler's answer, already shaped like its route's model (the model stays
  on the route for the OpenAPI document), encoded by orjson. Timestamps are written exactly
  as the models write them (:func:`wire_time`: ISO-8601 UTC, milliseconds, ``Z``). A test
  checks every such route's answer against its model (tests/test_service_wire.py), and
  schemathesis checks them against the description.
* :class:`Stored`: the answer of a route declared ``keep`` (hub/service/_routing.py: a
  function of the inventory, the caller's scope and the request's parameters), as the one
  request pipeline keeps its encoded bytes in the app's ``answers`` memo under the route's
  key, the caller's scope and the inventory version (hub/service/_memo.py), after the
  confine step: a kept answer was confined for that scope before it was kept, and is
  served to that scope only.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson
from starlette.responses import Response

from hub.common import iso

#: answers kept as bytes at most (a 5,000-GPU page is about 2.5 MB)
KEPT_BYTES = 64 * 1024 * 1024
#: an answer larger than this is sent, not kept (it would push out dozens of small ones)
KEPT_LARGEST = 4 * 1024 * 1024


def wire_time(ts: dt.datetime) -> str | None:
    """``hub.common.iso`` without its two conversions for the naive UTC times SQLite gives
    (the same text: a GPU page has three timestamps a row)."""
    if ts.tzinfo is None:
        return ts.isoformat(timespec="milliseconds") + "Z"
    return iso(ts)


def _default(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return wire_time(value)
    if isinstance(value, Decimal):  # PostgreSQL's sums
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


#: datetimes through _default (the models' format); keys that are str subclasses (the
#: column names SQLAlchemy's rows carry) as text
OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS


def encode(data: Any) -> bytes:
    """``data`` as JSON (NaN and infinities as null, as pydantic writes them)."""
    return orjson.dumps(data, default=_default, option=OPTIONS)


@dataclass
class Json:
    """A JSON answer shaped like its route's model, sent as it is (confined first, like any
    answer: the confine step walks ``data``)."""

    data: Any
    status: int = 200

    def response(self) -> Response:
        return Response(encode(self.data), self.status, media_type="application/json")


@dataclass(frozen=True)
class Stored:
    """A response as kept: what is needed to send it again."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @classmethod
    def of(cls, response: Response) -> Stored:
        headers = tuple((k, v) for k, v in response.headers.items() if k != "content-length")
        return cls(response.status_code, headers, bytes(response.body))

    def response(self) -> Response:
        return Response(self.body, self.status, headers=dict(self.headers))


def weight(stored: Stored) -> int:
    return len(stored.body) + 256
