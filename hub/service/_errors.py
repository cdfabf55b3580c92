"""What a refusal or failure says to a caller: one place for the handlers, the app's error
handlers, the page and the scheduler's /healthz, so none of them needs the HTTP side to word
an error (and none of them can word one with the hub's address or the driver's text).
"""

from __future__ import annotations

import re

DB_UNAVAILABLE = "inventory database unavailable"
URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")


class ApiError(Exception):
    """A request the API refuses: its status and a one-line message for ``{"error": ...}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def public_error(text: str | None) -> str | None:
    """An error as callers may read it: no URL (the hub's address), no secret, one short line.
    The full text stays in the log and the database."""
    if not text:
        return text
    if text.startswith(DB_UNAVAILABLE):  # the driver's line names host, port and user
        return f"{DB_UNAVAILABLE} (details in the service log)"
    line = URL.sub("<url>", text.splitlines()[0])
    return line[:200]


def database_error(exc: BaseException) -> str:
    """A one-line reason for a failed database read, without the URL or the statement."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if "no such table" in first or type(orig).__name__ == "UndefinedTable":
        return "the inventory is empty: no sync has completed yet"
    return f"{DB_UNAVAILABLE}: {first}"
