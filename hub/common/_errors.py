"""Exceptions that carry the CLI's exit codes (0 ok, 1 findings, 2 input, 3 unavailable).

They subclass ``click.ClickException`` so a command can raise them from deep inside plain
functions and the user still gets one line and the documented exit code, never a traceback.
"""

from __future__ import annotations

import click

from hub.common._redact import redact

EXIT_OK = 0
EXIT_FINDINGS = 1  # the command ran and found problems
EXIT_INPUT = 2  # usage or input error, a PromQL error included
EXIT_UNAVAILABLE = 3  # a dependency could not be reached or is missing, or the lock is held


def shorten(text: str, limit: int = 200) -> str:
    """One line of at most ``limit`` characters, cut at a word boundary with an ellipsis:
    a message cut mid-word (``SSLError(SSLError(1, '[SSL``) hides what went wrong."""
    line = " ".join(str(text).split())
    if len(line) <= limit:
        return line
    cut = line[:limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:(") + "…"


class GpufleetError(click.ClickException):
    """Base class: a one-line message and an exit code."""

    exit_code = EXIT_INPUT
    #: the HTTP status of the upstream answer behind the error, where one was read (a
    #: Kubernetes 403 or 404): callers tell "refused" and "absent" from "unreachable" by it
    http_status: int | None = None

    def __init__(self, message: str) -> None:
        # One line, always: multi-line upstream messages would break log parsers and cron mail.
        # Redacted, always: this text is printed, logged, served and stored in sync_runs.
        super().__init__(redact(" ".join(str(message).split())))

    def show(self, file=None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class InputError(GpufleetError):
    """The user's input (flags, files, names, PromQL) is wrong."""

    exit_code = EXIT_INPUT


class UnavailableError(GpufleetError):
    """Something we depend on (hub, database, Kubernetes API, GPU library, lock) is not there."""

    exit_code = EXIT_UNAVAILABLE


