"""PostgreSQL helpers for tests that need more than the one database `pg_url` gives."""

from __future__ import annotations

import uuid

import sqlalchemy as sa


def create_database(server: str, prefix: str = "t_") -> str:
    """A fresh, empty database on ``server`` (a URL without a database); its URL."""
    name = prefix + uuid.uuid4().hex[:12]
    engine = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()
    return f"{server}/{name}"
