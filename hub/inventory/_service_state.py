"""What `gpufleet serve`'s leader found, and what sign-ins failed, kept in the inventory
database so that every worker and replica answers alike.

``service_checks``: one row (``name`` "checks") that the leader replaces after each run of
the report's checks: the findings (JSON), when they ran, the sync they followed, and when
and why the latest checks could *not* run (the sync failed, or the checks did). A process
that serves reads this row; none runs the checks itself, and one that finds no row says
"not checked yet".

``sign_in_strikes``: failed browser sign-ins per key (the sha256 of the token tried, or
``*`` for all of them together): the failures in the current window (epoch seconds, JSON),
the lockout's end and how many lockouts followed each other. In the database rather than in
each process's memory, so the documented 5 failures per token hold across every worker and
replica, not 5 in each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.inventory._db import metadata, sync_runs

CHECKS = "checks"

service_checks = sa.Table(
    "service_checks", metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    # grows by one with each write: a reader re-reads the findings only when it changed
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("findings", sa.Text),  # JSON list; NULL: never checked
    sa.Column("checked_at", sa.Float),  # epoch seconds of the findings; NULL: never
    sa.Column("sync_id", sa.Integer),  # the sync_runs id the checks followed
    sa.Column("failed_at", sa.Float),  # the latest time the checks could not run
    sa.Column("error", sa.Text),  # and why (public text: no URL password, no SQL)
)

sign_in_strikes = sa.Table(
    "sign_in_strikes", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("failures", sa.Text, nullable=False),  # JSON list of epoch seconds
    sa.Column("locked_until", sa.Float, nullable=False),
    sa.Column("lockouts", sa.Integer, nullable=False),
    sa.Column("seen_at", sa.Float, nullable=False),
    sa.Index("ix_sign_in_strikes_seen", "seen_at"),
)


@dataclass(frozen=True)
class Checks:
    """The latest checks as the leader wrote them (``checked_at`` None: never ran)."""

    version: int
    findings: tuple[dict[str, Any], ...]
    checked_at: float | None
    sync_id: int | None
    failed_at: float | None
    error: str | None


def checks_version(conn: Connection) -> int | None:
    """The row's version alone (a primary-key read): whether a reader's copy is current."""
    return conn.execute(sa.select(service_checks.c.version)
                        .where(service_checks.c.name == CHECKS)).scalar()


def read_checks(conn: Connection) -> Checks | None:
    row = conn.execute(sa.select(service_checks).where(service_checks.c.name == CHECKS)
                       ).first()
    if row is None:
        return None
    found = tuple(json.loads(row.findings)) if row.findings is not None else ()
    return Checks(row.version, found, row.checked_at, row.sync_id, row.failed_at, row.error)


def write_checks(conn: Connection, *, findings: list[dict[str, Any]] | None = None,
                 checked_at: float | None = None, sync_id: int | None = None,
                 failed_at: float | None = None, error: str | None = None) -> None:
    """New findings (``findings`` and ``checked_at``), or a failure to check (``failed_at``
    and ``error``: the findings before it stay, marked as older than the failure)."""
    values: dict[str, Any] = {}
    if findings is not None:
        values.update(findings=json.dumps(findings, default=str, sort_keys=True),
                      checked_at=checked_at, sync_id=sync_id)
    if failed_at is not None:
        values.update(failed_at=failed_at, error=error)
    updated = conn.execute(service_checks.update().where(service_checks.c.name == CHECKS)
                           .values(version=service_checks.c.version + 1, **values)).rowcount
    if not updated:
        conn.execute(service_checks.insert().values(name=CHECKS, version=1, **values))


def latest_ok_sync_id(conn: Connection) -> int | None:
    return conn.execute(sa.select(sa.func.max(sync_runs.c.id))
                        .where(sync_runs.c.status == "ok")).scalar()


def read_strikes(conn: Connection, key: str, *, for_update: bool = False
                 ) -> tuple[list[float], float, int] | None:
    """A key's failures, lockout end and lockouts; ``for_update``: held until the
    transaction ends (PostgreSQL), so two processes counting one key never lose a failure."""
    query = sa.select(sign_in_strikes).where(sign_in_strikes.c.key == key)
    row = conn.execute(query.with_for_update() if for_update else query).first()
    if row is None:
        return None
    return [float(t) for t in json.loads(row.failures)], row.locked_until, row.lockouts


def write_strikes(conn: Connection, key: str, failures: list[float], locked_until: float,
                  lockouts: int, now: float) -> None:
    values = {"failures": json.dumps(failures), "locked_until": locked_until,
              "lockouts": lockouts, "seen_at": now}
    updated = conn.execute(sign_in_strikes.update().where(sign_in_strikes.c.key == key)
                           .values(**values)).rowcount
    if not updated:
        conn.execute(sign_in_strikes.insert().values(key=key, **values))


def forget_strikes(conn: Connection, key: str | None = None, *,
                   unseen_since: float | None = None) -> None:
    """Drop one key's strikes (a successful sign-in), or every key not seen since."""
    where = (sign_in_strikes.c.key == key if key is not None
             else sign_in_strikes.c.seen_at < (unseen_since or 0.0))
    conn.execute(sign_in_strikes.delete().where(where))
