"""Two syncs started together on an empty PostgreSQL database: schema creation is under the
sync lock, so the loser waits and never crashes on alembic_version's key."""

from __future__ import annotations

import subprocess
import sys

import sqlalchemy as sa

from hub.inventory import _migrate as migrate
from tests.support.pg import create_database

CLOSED = "http://127.0.0.1:1"


def test_two_syncs_on_an_empty_postgresql_never_race_in_schema_creation(postgres_server):
    for _trial in range(6):
        url = create_database(postgres_server, "race_")
        cmd = [sys.executable, "-m", "hub", "sync", "--db", url, "--hub-url", CLOSED]
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            # each finds the schema made (by itself or the other) and then fails on the
            # closed hub or on the sync lock the other holds: exit 3, one line, no traceback
            assert proc.returncode == 3, err
            assert "Traceback" not in err and err.count("\n") == 1, err
            assert "unreachable" in err or "holds the inventory lock" in err, err
        engine = sa.create_engine(url)
        try:
            assert migrate.current(engine) == migrate.head()
            with engine.connect() as conn:
                failed = conn.exec_driver_sql(
                    "SELECT count(*) FROM sync_runs WHERE status = 'failed'").scalar()
            assert failed in (1, 2)
        finally:
            engine.dispose()
