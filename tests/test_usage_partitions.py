"""The ledger's monthly partitions (issue 40, hub/inventory/_partitions.py): migration 0027
moves a ledger of months into them with every answer as before, also when it was killed
halfway and run again; the writer and `gpufleet db upgrade` create this month and the next;
retention drops whole months on PostgreSQL and deletes rows on SQLite, with the same answer.
"""

from __future__ import annotations

import datetime as dt
import importlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command

from hub import inventory as inv
from hub import usage
from hub.inventory._migrate import HEAD, _config, current
from hub.inventory._partitions import PARTITIONED, is_partitioned
from tests.test_usage_rollup import bucket_rows

HOUR = 3600.0
START = dt.datetime(2026, 9, 28, 5)
# every 5 hours from late September to early December: four months, month ends crossed
STARTS = [START + dt.timedelta(hours=5 * k) for k in range(330)]
PERIODS = [(dt.datetime(2026, 9, 1), dt.datetime(2027, 1, 1)),
           (dt.datetime(2026, 9, 30, 7), dt.datetime(2026, 11, 2, 13)),
           (dt.datetime(2026, 10, 1), dt.datetime(2026, 11, 1))]
MIGRATION = importlib.import_module("hub.inventory.migrations.versions.0027_usage_partitions")


def ts(moment: dt.datetime) -> float:
    return moment.replace(tzinfo=dt.UTC).timestamp()


def fill(engine: sa.Engine, starts: list[dt.datetime]) -> None:
    rng = random.Random(5)
    with engine.begin() as conn:
        for start in starts:
            usage.write_bucket(conn, ts(start), HOUR, bucket_rows(ts(start), rng), 9)


def answers(engine: sa.Engine) -> dict[str, Any]:
    """Everything a reader can ask: the rows as the view shows them, the rollups, and
    summaries (rollup-based and hourly-only) over periods crossing months."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for table in (inv.usage, inv.usage_daily, inv.usage_idle_daily):
            columns = list(table.c)
            out[table.name] = sorted(
                (tuple(r) for r in conn.execute(sa.select(*columns))),
                key=lambda r: tuple((v is None, "" if v is None else str(v)) for v in r))
        for start, end in PERIODS:
            for by in (["namespace"], ["gpu"], ["cluster", "model"]):
                for rollup in (True, False):
                    out[f"{start} {end} {by} {rollup}"] = usage.usage_summary(
                        conn, start, end, by, rollup=rollup)
    return out


def ledger_at_0026(url: str) -> sa.Engine:
    engine = inv.make_engine(url, create=True)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0026")
    fill(engine, STARTS)
    return engine


def test_migration_0027_moves_a_ledger_of_months(db_url):
    engine = ledger_at_0026(db_url)
    before = answers(engine)
    assert len(before["usage"]) == len(STARTS) * 12
    inv.upgrade(engine, now=dt.datetime(2026, 12, 5))
    assert current(engine) == HEAD
    assert answers(engine) == before
    with engine.connect() as conn:
        months = sorted(inv.partitions(conn, "usage_rows"))
        daily = sorted(inv.partitions(conn, "usage_daily"))
        old = sa.inspect(conn).has_table("usage_rows_0026")
    if engine.dialect.name == "postgresql":
        assert months == daily == [dt.datetime(2026, m, 1) for m in (9, 10, 11, 12)] + [
            dt.datetime(2027, 1, 1)]  # the months with rows, and December's next
    else:
        assert months == daily == []  # no partitions on SQLite: the migration does nothing
    assert not old
    engine.dispose()


def monthly(engine: sa.Engine) -> dict[str, Any]:
    """`usage` of each calendar month the ledger spans (a month is what a partition holds,
    and what a bill asks), by namespace and by GPU, from the rollups and from the hours."""
    out: dict[str, Any] = {}
    with engine.connect() as conn:
        for month in [dt.datetime(2026, m, 1) for m in (9, 10, 11, 12)]:
            end = inv.next_month(month)
            for by in (["namespace"], ["gpu"]):
                for rollup in (True, False):
                    out[f"{month:%Y-%m} {by} {rollup}"] = usage.usage_summary(
                        conn, month, end, by, rollup=rollup)
    return out


def test_migration_0027_downgrade_and_upgrade_again_keep_every_answer(db_url):
    """An operator who rolls gpufleet back runs `alembic downgrade 0026`: the partitioned
    tables are copied back into plain ones (PostgreSQL; SQLite has nothing to undo). Every
    answer, month by month, is the one of before, at 0026 and after upgrading again, and
    the second upgrade partitions the ledger as the first did."""
    engine = ledger_at_0026(db_url)
    before, months_before = answers(engine), monthly(engine)
    assert all(months_before.values())  # every month has usage to compare
    inv.upgrade(engine, now=dt.datetime(2026, 12, 5))
    with engine.connect() as conn:
        partitioned = sorted(inv.partitions(conn, "usage_rows"))
    assert monthly(engine) == months_before
    with engine.begin() as conn:
        command.downgrade(_config(conn), "0026")
    assert current(engine) == "0026"
    with engine.connect() as conn:
        for table in PARTITIONED:
            assert not is_partitioned(conn, table)
            assert not sa.inspect(conn).has_table(f"{table}_0026")
    assert monthly(engine) == months_before
    assert answers(engine) == before
    assert inv.upgrade(engine, now=dt.datetime(2026, 12, 5)) == ("0026", HEAD)
    with engine.connect() as conn:
        assert sorted(inv.partitions(conn, "usage_rows")) == partitioned
    assert monthly(engine) == months_before
    assert answers(engine) == before
    engine.dispose()


def test_a_migration_killed_halfway_finishes_when_run_again(pg_url):
    """A run that committed some days and died (its connection gone without another
    commit) leaves the schema at 0026, which gpufleet refuses; `db upgrade` again moves the
    rest and the answers are those of before."""
    engine = ledger_at_0026(pg_url)
    before = answers(engine)
    with engine.connect() as conn:
        MIGRATION.swap_in(conn)
        conn.commit()
        assert MIGRATION.move_batches(conn, None, batches=20) is False
        conn.execute(sa.text("DELETE FROM usage_buckets"))  # never committed: the kill
    with engine.connect() as conn:
        moved = conn.execute(sa.text("SELECT count(*) FROM usage_rows")).scalar()
        left = conn.execute(sa.text("SELECT count(*) FROM usage_rows_0026")).scalar()
    assert 0 < moved < len(STARTS) * 12 and moved + left == len(STARTS) * 12
    assert current(engine) == "0026"
    assert inv.upgrade(engine, now=dt.datetime(2026, 12, 5)) == ("0026", HEAD)
    assert answers(engine) == before
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table("usage_rows_0026")
    engine.dispose()


def test_writer_and_upgrade_create_this_month_and_the_next(pg_url):
    engine = inv.make_engine(pg_url, create=True)
    inv.upgrade(engine, now=dt.datetime(2027, 1, 15, 8))
    with engine.connect() as conn:
        for table in ("usage_rows", "usage_daily", "usage_idle_daily"):
            assert sorted(inv.partitions(conn, table)) == [
                dt.datetime(2027, 1, 1), dt.datetime(2027, 2, 1)]
    fill(engine, [dt.datetime(2027, 3, 31, 23)])  # the last hour of March
    with engine.connect() as conn:
        assert sorted(inv.partitions(conn, "usage_rows")) == [
            dt.datetime(2027, m, 1) for m in (1, 2, 3, 4)]
        assert conn.execute(sa.text("SELECT count(*) FROM usage_rows_p202703")).scalar() == 12
    engine.dispose()


def test_retention_drops_whole_months_with_the_answer_of_deleted_rows(db_url):
    """A cut in November: September's and October's partitions go whole on PostgreSQL,
    November's rows before the cut are deleted; SQLite deletes them all row by row. Either
    way the ledger holds what a ledger written from the cut on holds."""
    cut = dt.datetime(2026, 11, 3, 9)
    engine = inv.make_engine(db_url, create=True)
    inv.upgrade(engine, now=dt.datetime(2026, 9, 28))
    fill(engine, STARTS)
    with engine.begin() as conn:
        removed = usage.apply_retention(conn, ts(cut))
    assert removed == sum(1 for s in STARTS if s < cut) * 12
    with engine.connect() as conn:
        first = conn.execute(sa.select(sa.func.min(inv.usage.c.bucket_start))).scalar()
        assert first == min(s for s in STARTS if s >= cut)
        assert conn.execute(sa.select(sa.func.min(inv.usage_daily.c.day))).scalar() == (
            dt.datetime(2026, 11, 3))
        months = sorted(inv.partitions(conn, "usage_rows"))
        daily = sorted(inv.partitions(conn, "usage_idle_daily"))
        kept = answers(engine)
    if engine.dialect.name == "postgresql":
        # (January: the writer made it ahead of December's buckets)
        assert months == daily == [dt.datetime(2026, m, 1) for m in (11, 12)] + [
            dt.datetime(2027, 1, 1)]
    # the same answers as a ledger that only ever held the buckets from the cut on (the
    # figures drawn per bucket in the same order: the same rows)
    fresh_url = db_url.replace("inventory.db", "fresh.db") if "sqlite" in db_url else None
    if fresh_url:
        fresh = inv.make_engine(fresh_url, create=True)
        inv.upgrade(fresh)
        rng = random.Random(5)
        with fresh.begin() as conn:
            for start in STARTS:
                rows = bucket_rows(ts(start), rng)
                if start >= cut:
                    usage.write_bucket(conn, ts(start), HOUR, rows, 9)
        assert answers(fresh)["usage"] == kept["usage"]
        fresh.dispose()
    engine.dispose()


def test_db_upgrade_killed_mid_move_finishes_when_run_again(pg_url):
    """A real `gpufleet db upgrade` killed (SIGKILL) while it moves the ledger: held up by
    a lock on the last old table it empties, after it committed days of rows, then killed.
    The schema is still 0026; the next `db upgrade` finishes with the answers of before."""
    engine = ledger_at_0026(pg_url)
    before = answers(engine)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "db", "upgrade", "--db", pg_url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    holder = engine.connect()
    try:
        deadline = time.monotonic() + 60
        while not holder.execute(sa.text(
                "SELECT to_regclass('usage_rows_0026') IS NOT NULL")).scalar():
            holder.rollback()
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.005)
        holder.execute(sa.text("LOCK TABLE usage_idle_daily_0026 IN ACCESS EXCLUSIVE MODE"))
        # (another connection: pg_stat_activity stays as it was within a transaction)
        with engine.connect() as watch:
            while not watch.execute(sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%usage_idle_daily_0026%'")).scalar():
                watch.rollback()
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            moved = watch.execute(sa.text("SELECT count(*) FROM usage_rows")).scalar()
        assert moved == len(STARTS) * 12  # the hourly rows moved, days committed
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        holder.rollback()
        holder.close()
    assert current(engine) == "0026"
    result = subprocess.run(
        [sys.executable, "-m", "hub", "db", "upgrade", "--db", pg_url], capture_output=True,
        text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert result.returncode == 0 and f"0026 -> {HEAD}" in result.stdout, result.stderr
    assert answers(engine) == before
    engine.dispose()


def _close(a: Any, b: Any) -> bool:
    """Answers equal but for the last bits of float sums (a month's rows are summed by
    month, then by group: another order than the days')."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6 + 1e-9 * abs(b)
    return bool(a == b)


def _rows(engine: sa.Engine, *tables: sa.Table) -> dict[str, list[tuple]]:
    """Each table's rows, in one order whatever the database returned them in."""
    with engine.connect() as conn:
        return {t.name: sorted((tuple(r) for r in conn.execute(sa.select(t))),
                               key=lambda r: tuple(str(v) for v in r))
                for t in tables}


def _months(engine: sa.Engine) -> dict[str, list[tuple]]:
    return _rows(engine, inv.usage_monthly, inv.usage_idle_monthly)


def test_migration_0029_sums_the_months_of_a_ledger_as_the_writer_keeps_them(db_url):
    """A ledger of four months at 0027: the upgrade sums its months before the latest
    bucket's (September to November) into the monthly rollups, the very rows the writer
    keeps (rebuild_months), and every answer is the one of before; downgrade drops them,
    and answers stay."""
    engine = inv.make_engine(db_url, create=True)
    with engine.connect() as conn:  # 0027 commits as it goes (PostgreSQL)
        command.upgrade(_config(conn), "0027")
        conn.commit()
    fill(engine, STARTS)
    before, months_before = answers(engine), monthly(engine)
    inv.upgrade(engine, now=dt.datetime(2026, 12, 5))
    migrated = _months(engine)
    assert {r[0] for r in migrated["usage_monthly"]} == {
        dt.datetime(2026, m, 1) for m in (9, 10, 11)}
    assert {r[0] for r in migrated["usage_idle_monthly"]} <= {
        dt.datetime(2026, m, 1) for m in (9, 10, 11)}
    with engine.begin() as conn:
        usage.rebuild_months(conn, [dt.datetime(2026, m, 1) for m in (9, 10, 11)])
    assert _close(_months(engine), migrated)
    assert _close(answers(engine), before)
    assert _close(monthly(engine), months_before)
    with engine.begin() as conn:
        command.downgrade(_config(conn), "0027")
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table("usage_monthly")
    assert answers(engine) == before
    engine.dispose()


def _groups(engine: sa.Engine) -> dict[str, list[tuple]]:
    return _rows(engine, inv.usage_daily_groups, inv.usage_monthly_groups)


def test_migration_0030_sums_the_groups_of_a_ledger_as_the_writer_keeps_them(db_url):
    """A ledger of four months at 0029 (written by this gpufleet, which keeps no group
    rollups there): the upgrade sums each day's rollup by cluster, namespace and model and
    the built months from those days, the very rows the writer keeps (rebuild_days,
    rebuild_months), and every answer is the one of before; downgrade drops them, and
    answers stay."""
    engine = inv.make_engine(db_url, create=True)
    with engine.connect() as conn:
        command.upgrade(_config(conn), "0029")
        conn.commit()
    fill(engine, STARTS)
    before, months_before = answers(engine), monthly(engine)
    inv.upgrade(engine, now=dt.datetime(2026, 12, 5))
    assert answers(engine) == before
    assert monthly(engine) == months_before
    migrated = _groups(engine)
    days = {r[0] for r in migrated["usage_daily_groups"]}
    with engine.connect() as conn:
        assert days == set(conn.execute(sa.select(inv.usage_daily.c.day).distinct()
                                        ).scalars())
    assert {r[0] for r in migrated["usage_monthly_groups"]} == {
        dt.datetime(2026, m, 1) for m in (9, 10, 11)}
    with engine.begin() as conn:
        usage.rebuild_days(conn, days)
        usage.rebuild_months(conn, [dt.datetime(2026, m, 1) for m in (9, 10, 11)])
    assert _close(_groups(engine), migrated)
    with engine.begin() as conn:
        command.downgrade(_config(conn), "0029")
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table("usage_daily_groups")
        assert not sa.inspect(conn).has_table("usage_monthly_groups")
    assert _close(answers(engine), before)
    engine.dispose()


def test_a_year_is_read_from_whole_months_and_agrees_with_the_hours(db_url):
    """`--since` over months: the whole months from the monthly rollups, the edge days
    from the daily ones, the edge hours from the ledger, the same as the hours alone; a
    bucket of a past month collected again, and retention cutting into a month, rebuild
    that month's sums."""
    engine = inv.make_engine(db_url, create=True)
    inv.upgrade(engine, now=dt.datetime(2026, 12, 5))
    fill(engine, STARTS)
    period = (dt.datetime(2026, 9, 29, 7), dt.datetime(2026, 12, 6))

    def agree() -> None:
        with engine.connect() as conn:
            for by in (["namespace"], ["gpu"], ["cluster", "model"]):
                assert _close(usage.usage_summary(conn, *period, by),
                              usage.usage_summary(conn, *period, by, rollup=False))

    agree()
    again = STARTS[100]  # mid-October: its month is summed again
    with engine.begin() as conn:
        usage.write_bucket(conn, ts(again), HOUR, bucket_rows(ts(again), random.Random(9)),
                           9)
    agree()
    with engine.begin() as conn:
        usage.apply_retention(conn, ts(dt.datetime(2026, 10, 10, 3)))
    agree()
    with engine.connect() as conn:
        assert min(conn.execute(sa.select(inv.usage_monthly.c.month)).scalars()) == \
            dt.datetime(2026, 10, 1)
    engine.dispose()
