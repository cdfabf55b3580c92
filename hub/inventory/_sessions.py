"""Browser sessions of `gpufleet serve`, kept in the inventory database.

In the database rather than in one process's memory so that every replica of the service
reads the same sessions and a restart signs nobody out. A row is keyed by the sha256 of the
session id: the id itself (what the cookie carries) is never stored, so a copy of the table
opens no session. ``owner_sha256`` is the sha256 of the person (OIDC subject, static token
name: hub.service._session.owner_of), so sessions can be capped per person;
``token_sha256`` is set for a static token only, so a session ends when its token leaves
the tokens file.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub.inventory._db import metadata

sessions = sa.Table(
    "sessions", metadata,
    sa.Column("id_sha256", sa.String(64), primary_key=True),
    sa.Column("owner_sha256", sa.String(64), nullable=False),
    sa.Column("token_sha256", sa.String(64)),
    sa.Column("caller", sa.String(253), nullable=False),
    sa.Column("scope", sa.Text, nullable=False),  # JSON: name, clusters, namespaces, fleet_counts
    sa.Column("token_expires_at", sa.Float),  # epoch seconds; None: a static token
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_sessions_owner", "owner_sha256", "created_at"),
    sa.Index("ix_sessions_expires", "expires_at"),
)


def session_row(conn: Connection, id_sha256: str) -> dict[str, Any] | None:
    row = conn.execute(sa.select(sessions).where(sessions.c.id_sha256 == id_sha256)
                       ).mappings().first()
    return dict(row) if row is not None else None


def add_session(conn: Connection, row: dict[str, Any], *, now: float, per_owner: int,
                total: int) -> bool:
    """Insert ``row`` after removing ended sessions and, past ``per_owner``, the owner's
    oldest. With ``total`` sessions live, the owner's own oldest session makes room, or else
    the oldest of the owner holding the most; False (nothing written) when every live
    session is a different owner's and none is this owner's."""
    conn.execute(sessions.delete().where(sessions.c.expires_at <= now))
    owner = row["owner_sha256"]
    mine = conn.execute(sa.select(sessions.c.id_sha256).where(
        sessions.c.owner_sha256 == owner).order_by(sessions.c.created_at.desc(),
                                                   sessions.c.id_sha256)).scalars().all()
    extra = mine[max(0, per_owner - 1):]
    if extra:
        conn.execute(sessions.delete().where(sessions.c.id_sha256.in_(extra)))
    count = conn.execute(sa.select(sa.func.count()).select_from(sessions)).scalar_one()
    if count >= total:
        victim = owner if mine[:max(0, per_owner - 1)] else None
        if victim is None:
            held = sa.func.count().label("held")
            heaviest = conn.execute(
                sa.select(sessions.c.owner_sha256, held).group_by(sessions.c.owner_sha256)
                .order_by(held.desc(), sessions.c.owner_sha256).limit(1)).first()
            if heaviest is None or heaviest.held < 2:
                return False
            victim = heaviest.owner_sha256
        oldest = conn.execute(
            sa.select(sessions.c.id_sha256).where(sessions.c.owner_sha256 == victim)
            .order_by(sessions.c.created_at, sessions.c.id_sha256).limit(1)).scalar_one()
        conn.execute(sessions.delete().where(sessions.c.id_sha256 == oldest))
    conn.execute(sessions.insert().values(**row))
    return True


def drop_session(conn: Connection, id_sha256: str) -> None:
    conn.execute(sessions.delete().where(sessions.c.id_sha256 == id_sha256))
