"""What the service knows of its syncs, and the rule that turns it into /healthz.

Its own module, below both the scheduler (which writes the snapshot) and the shared status
(which reads the database's copy of it for every worker and replica): each used to reach into
the other for it, the service room's one import circle (issue 41).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import click
import sqlalchemy as sa

from hub.common import redact
from hub.inventory import SyncResult
from hub.service._errors import database_error, public_error

Finding = dict[str, Any]


@dataclass(frozen=True)
class SyncState:
    """What the scheduler knows, as an immutable snapshot (clock seconds throughout)."""

    started_at: float
    last_attempt_at: float | None = None
    last_success_at: float | None = None
    last_result: SyncResult | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    lock_held: bool = False
    next_run_at: float | None = None
    findings: tuple[Finding, ...] = ()
    findings_at: float | None = None
    #: the last time the checks could not run (the sync or the findings job failed), and why:
    #: /api/v1/findings says so rather than serving an empty or old list as if all were well
    checks_failed_at: float | None = None
    checks_error: str | None = None
    #: whether this process runs the schedule (None: not decided yet)
    leader: bool | None = None
    #: a follower's last read of the database failed, and why: it cannot serve (None: read)
    unreadable: str | None = None


def describe_error(exc: BaseException) -> str:
    """One line for the log and /healthz: a GpufleetError's own message, else a short one.

    Never ``str()`` of a database exception, which carries the SQL and its parameters; and
    never a registered secret (the hub token), whatever raised.
    """
    if isinstance(exc, click.ClickException):
        return redact(exc.format_message())
    if isinstance(exc, sa.exc.SQLAlchemyError):
        return redact(database_error(exc))
    lines = str(exc).strip().splitlines()
    return redact(f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__)


def health(state: SyncState, every: float, now: float,
           slack: float = 0.0) -> tuple[bool, dict[str, Any]]:
    """Healthy while the last successful sync is at most two intervals old.

    Two, not one: a sync that takes a while, or one retried after a blip, must not flap the
    probe; a hub that has been failing for two whole intervals is worth a page. ``slack``:
    a follower learns of the leader's syncs only when it next looks (every follow interval),
    so its view may lag by that much without anything being wrong.
    """
    details: dict[str, Any] = {
        "status": "ok",
        "interval_seconds": every,
        "last_success": _utc(state.last_success_at),
        "last_success_age_seconds": (round(now - state.last_success_at, 3)
                                     if state.last_success_at is not None else None),
        "last_error": public_error(state.last_error),
        "consecutive_failures": state.consecutive_failures,
    }
    if state.last_result is not None:
        result = state.last_result
        details["last_sync"] = {"clusters": result.clusters, "nodes": result.nodes,
                                "gpus": result.gpus, "requests": result.requests}
    reason = None
    if state.unreadable is not None:
        reason = f"cannot read the inventory database: {public_error(state.unreadable)}"
    elif state.last_success_at is None:
        reason = "never synced yet"
    elif now - state.last_success_at > 2 * every + slack:
        reason = (f"last successful sync {now - state.last_success_at:.0f}s ago, more than "
                  f"two intervals ({2 * every + slack:g}s)")
    if reason is None:
        return True, details
    if state.lock_held:
        reason += "; another sync holds the inventory lock"
    elif state.last_error:
        reason += f"; last error: {public_error(state.last_error)}"
    return False, {**details, "status": "unavailable", "reason": reason}


def _utc(ts: float | None) -> dt.datetime | None:
    return None if ts is None else dt.datetime.fromtimestamp(ts, dt.UTC)


# -- metrics ----------------------------------------------------------------------------------
