"""Schema migrations (Alembic), run from code so the CLI needs no alembic.ini."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine

from hub.common import InputError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: Modules that define tables on hub.inventory.metadata; importing them completes it.
TABLE_MODULES = ("hub.inventory._db", "hub.inventory._reconcile_runs",
                 "hub.inventory._ledger")


def metadata() -> sa.MetaData:
    """The whole schema the code expects, whichever command happened to import what."""
    for name in TABLE_MODULES:
        importlib.import_module(name)
    from hub.inventory._db import metadata as complete

    return complete


def _config(connection=None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head() or ""


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Bring the schema to head; returns (before, after)."""
    before = current(engine)
    # Two syncs on an empty database would both create the schema and the loser would crash
    # on alembic_version's key: migrate under the sync's own lock (PostgreSQL advisory lock,
    # SQLite write lock), so the loser waits and then finds the schema at head (a no-op).
    with _locked(engine) as conn:
        command.upgrade(_config(conn), "head")
    return before, head()


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    from hub.inventory._db import LOCK_KEY

    if engine.dialect.name == "sqlite":
        with engine.connect().execution_options(sqlite_immediate=True,
                                                sqlite_busy_ms=60_000) as conn, conn.begin():
            yield conn
        return
    with engine.connect() as conn, conn.begin():
        if engine.dialect.name == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY)))
        yield conn


def ensure_schema(engine: Engine) -> None:
    """Sync migrates an empty database itself; an older schema needs an explicit upgrade."""
    rev = current(engine)
    if rev is None:
        upgrade(engine)
    elif rev != head():
        raise InputError(
            f"inventory schema is at revision {rev}, this gpufleet needs {head()}: "
            "run `gpufleet db upgrade`"
        )
