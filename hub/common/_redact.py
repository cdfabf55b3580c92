"""Secrets known to this process, kept out of every error text that is shown or stored.

The hub token, URL passwords and the like are registered when they are read; every
:class:`~hub.common.GpufleetError` message (what the CLI prints, the serve log and /healthz
show, and ``sync_runs.error`` stores) passes through :func:`redact`. A registry, not a
parameter, because an error can be raised deep below the code that knows the secret (a
``requests`` header check echoing the token, a database driver quoting the URL).
"""

from __future__ import annotations

import logging
import re
import threading

REDACTED = "<redacted>"
#: shorter values are not treated as secrets: redacting "ab" everywhere would garble messages
MIN_SECRET_LENGTH = 6

_lock = threading.Lock()
_secrets: set[str] = set()


def register_secret(value: str | None) -> None:
    """Remember a secret (and each of its lines) so :func:`redact` hides it from now on."""
    if not value:
        return
    with _lock:
        for part in (value, *value.splitlines()):
            part = part.strip()
            if len(part) >= MIN_SECRET_LENGTH:
                _secrets.add(part)


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``<redacted>``; longest first, so a
    secret that contains another is hidden whole."""
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/@\s:]*):(?P<pw>[^/@\s]*)@")


def redact_urls(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` in it hidden, and
    every registered secret: what a log line may carry (an OIDC issuer URL with a password,
    a database URL a driver quotes)."""
    return redact(_URL_PASSWORD.sub(lambda m: f"{m['head']}:{REDACTED}@", text))


class RedactingFilter(logging.Filter):
    """A handler filter that passes every record through :func:`redact_urls`, whatever
    logged it (ours, uvicorn's, a driver's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact_urls(message)
        if clean != message:
            record.msg, record.args = clean, ()
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            record.exc_text = redact_urls(logging.Formatter().formatException(record.exc_info))
        return True
