"""Schema migrations (Alembic), run from code so the CLI needs no alembic.ini."""

from __future__ import annotations

import importlib
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from hub.common import InputError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: Modules that define tables on hub.inventory.metadata; importing them completes it.
TABLE_MODULES = ("hub.inventory._db", "hub.inventory._reconcile_runs")


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
    with engine.begin() as conn:
        command.upgrade(_config(conn), "head")
    return before, head()


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
