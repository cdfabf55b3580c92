"""Schema migrations (Alembic), run from code so the CLI needs no alembic.ini.

Alembic is imported only to migrate: a read command (`usage`, `inventory list`) checks the
schema's revision with one SELECT against HEAD, not by loading Alembic and every migration
script (about half a second of its start-up).
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub.common import InputError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: Modules that define tables on the inventory's metadata (hub/inventory/_db.py); importing them
#: completes it.
TABLE_MODULES = ("hub.inventory._db", "hub.inventory._reconcile_runs",
                 "hub.inventory._usage_tables", "hub.inventory._sessions",
                 "hub.inventory._lease", "hub.inventory._life",
                 "hub.inventory._service_state")


def metadata() -> sa.MetaData:
    """The whole schema the code expects, whichever command happened to import what."""
    for name in TABLE_MODULES:
        importlib.import_module(name)
    from hub.inventory._db import metadata as complete

    return complete


#: The newest migration's revision (tests check it is Alembic's head of migrations/).
HEAD = "0030"


def _config(connection=None):  # -> alembic.config.Config
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    """Alembic's own head of the migration scripts (loads them all)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config()).get_current_head() or ""


def current(engine: Engine) -> str | None:
    """The database's revision (None: no schema yet), read as Alembic keeps it."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        return conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def upgrade(engine: Engine, now: dt.datetime | None = None) -> tuple[str | None, str]:
    """Bring the schema to head and create the ledger's partitions of this month (``now``,
    naive UTC) and the next on PostgreSQL; returns (before, after)."""
    from hub.inventory._db import now_utc
    from hub.inventory._partitions import ensure_ahead

    before = current(engine)
    # Two syncs on an empty database would both create the schema and the loser would crash
    # on alembic_version's key: migrate under the sync's own lock (PostgreSQL advisory lock,
    # SQLite write lock), so the loser waits and then finds the schema at head (a no-op).
    from alembic import command

    with _locked(engine) as conn:
        command.upgrade(_config(conn), "head")
        ensure_ahead(conn, now or now_utc())
    return before, head()


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    from hub.inventory._db import LOCK_KEY

    if engine.dialect.name == "sqlite":
        with engine.connect().execution_options(sqlite_immediate=True,
                                                sqlite_busy_ms=60_000) as conn, conn.begin():
            yield conn
        return
    # not `conn.begin()` as a context: a migration that moves rows in batches (0027) commits
    # each batch, and what follows its last commit must be committed too. So the lock is the
    # session's (held across those commits, released at the end), not the transaction's: a
    # transaction lock went with the first batch's commit, and a second sync on an empty
    # database then migrated beside the first (alembic_version 0026 -> 0027 found 0 rows).
    with engine.connect() as conn:
        postgresql = engine.dialect.name == "postgresql"
        if postgresql:
            conn.execute(sa.select(sa.func.pg_advisory_lock(LOCK_KEY)))
        try:
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()
        finally:
            if postgresql:
                conn.execute(sa.select(sa.func.pg_advisory_unlock(LOCK_KEY)))
                conn.commit()


def ensure_schema(engine: Engine) -> None:
    """Sync migrates an empty database itself; an older schema needs an explicit upgrade."""
    rev = current(engine)
    if rev is None:
        upgrade(engine)
        return
    if rev != HEAD:
        # Another sync may be creating the schema this moment: 0027 commits each day it
        # moves, so its revision shows before the upgrade ends. Wait for its lock and read
        # again: only a schema that is still behind once nobody migrates is the user's to
        # upgrade (two syncs on an empty database: "at revision 0026, needs 0027").
        with _locked(engine) as conn:
            rev = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    if rev != HEAD:
        raise InputError(
            f"inventory schema is at revision {rev}, this gpufleet needs {HEAD}: "
            "run `gpufleet db upgrade`"
        )
