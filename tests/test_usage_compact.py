"""The compact ledger (issue 40): migration 0025 moves a ledger of months of rows from the
table of strings into usage_rows and its dictionaries, and every answer read from it is the
same before and after, on SQLite and PostgreSQL; the view shows the rows as they were written.
"""

from __future__ import annotations

import datetime as dt
import random

import sqlalchemy as sa
from alembic import command

from hub import inventory as inv
from hub import usage
from hub.inventory._migrate import HEAD, _config
from tests.test_usage_rollup import GROUPINGS, bucket_rows

HOUR = 3600.0
START = dt.datetime(2026, 8, 30, 18)  # three months and a bit, across month ends
STEP = 5 * HOUR  # a bucket every five hours: every hour of the day over the months
BUCKETS = 480  # 100 days


def _ts(moment: dt.datetime) -> float:
    return moment.replace(tzinfo=dt.UTC).timestamp()


def old_ledger(db_url: str) -> sa.Engine:
    """A database at 0024 (the ledger as a table of strings) with months of rows, its
    rollup rebuilt as that version's collect kept it; a few buckets have no mark (rows from
    before marks were written must not vanish)."""
    engine = inv.make_engine(db_url, create=True)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0024")
    table = sa.table("usage", *[sa.column(c) for c in inv.USAGE_COLUMNS])
    rng = random.Random(40)
    days = set()
    with engine.begin() as conn:
        for b in range(BUCKETS):
            start = _ts(START) + b * STEP
            rows = bucket_rows(start, rng)
            for r in rows:
                r["allocation_basis"] = rng.choice(["interval", "estimated", "sampled"])
                r["avg_sm_active_pct"] = rng.choice([None, 55.5])
            conn.execute(table.insert(), rows)
            if b % 17:
                conn.execute(inv.usage_buckets.insert().values(
                    bucket_start=rows[0]["bucket_start"], bucket_end=rows[0]["bucket_end"],
                    collected_at=rows[0]["bucket_end"], rows=len(rows), requests=9))
            days.add(inv.day_of(rows[0]["bucket_start"]))
        usage.rebuild_days(conn, days, by_names=True)  # "usage": here the old table
        conn.execute(inv.usage_ledger.insert().values(key="bucket_seconds", value="3600"))
    return engine


PERIODS = [
    (START, START + dt.timedelta(days=120)),
    (dt.datetime(2026, 9, 1), dt.datetime(2026, 10, 1)),
    (dt.datetime(2026, 9, 15, 7), dt.datetime(2026, 11, 2, 13)),
    (dt.datetime.min, dt.datetime(2026, 10, 3, 4)),
]


def answers(engine: sa.Engine) -> dict:
    out: dict = {}
    with engine.connect() as conn:
        for start, end in PERIODS:
            for by in GROUPINGS:
                out[(start, end, by)] = usage.usage_summary(conn, start, end, by)
                out[(start, end, by, "hourly")] = usage.usage_summary(conn, start, end, by,
                                                                      rollup=False)
            out[(start, end, "idle")] = usage.idle_runs(conn, start, end, threshold=5.0,
                                                        for_seconds=2 * HOUR)
        out["rows"] = sorted(
            (tuple(r) for r in conn.execute(sa.select(
                *[inv.usage.c[c] for c in inv.USAGE_COLUMNS]))), key=repr)
        out["recent"] = inv.recent_usage(conn, "GPU-7")
    return out


def test_migration_0025_moves_months_of_rows_and_answers_stay_the_same(db_url):
    engine = old_ledger(db_url)
    before = answers(engine)
    assert len(before["rows"]) == BUCKETS * 12
    assert inv.upgrade(engine) == ("0024", HEAD)
    with engine.connect() as conn:
        assert "usage" in sa.inspect(conn).get_view_names()  # a view now
        stored = conn.execute(sa.select(sa.func.count()).select_from(inv.usage_rows)).scalar()
        places = conn.execute(sa.select(sa.func.count()).select_from(inv.usage_places)
                              ).scalar()
        pods = conn.execute(sa.select(sa.func.count()).select_from(inv.usage_pods)).scalar()
    assert stored == BUCKETS * 12
    # GPU-5 moves namespace, GPU-11's model is unknown: each place and pod is stored once
    assert places == 12 and pods == 1 + 9 + 1
    after = answers(engine)
    assert after.keys() == before.keys()
    for key in before:
        assert after[key] == before[key], key
    engine.dispose()


def test_the_view_shows_what_was_written(db_url):
    """Rows written through write_bucket come back column for column: a model changing on one
    GPU, an unknown model, MIG shares, every allocation basis, a re-collected bucket."""
    engine = inv.make_engine(db_url, create=True)
    inv.upgrade(engine)
    rng = random.Random(3)
    written: dict = {}
    for b in (0, 1, 2, 1):
        start = _ts(START) + b * HOUR
        rows = bucket_rows(start, rng)
        for i, r in enumerate(rows):
            r["allocation_basis"] = ("interval", "estimated", "sampled")[(i + b) % 3]
            if r["uuid"] == "GPU-2" and b == 2:
                r["model"] = "H200"
        with engine.begin() as conn:
            usage.write_bucket(conn, start, HOUR, rows, 1)
        written[b] = rows
    want = sorted((tuple(r.get(c) for c in inv.USAGE_COLUMNS)
                   for rows in written.values() for r in rows), key=repr)
    with engine.connect() as conn:
        got = sorted((tuple(r) for r in conn.execute(
            sa.select(*[inv.usage.c[c] for c in inv.USAGE_COLUMNS]))), key=repr)
        models = {m for (m,) in conn.execute(
            sa.select(inv.usage_places.c.model).where(inv.usage_places.c.uuid == "GPU-2"))}
    assert got == want
    assert models == {"H100", "H200"}
    engine.dispose()
