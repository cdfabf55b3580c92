"""The usage ledger's daily rollup gives the same answers as the hourly rows it sums, on
SQLite and PostgreSQL: over several days with partial first and last days, after a bucket is
re-collected with other rows, after retention cuts into a day, at another idle threshold,
for a scoped caller; and migration 0006 fills it from the hourly rows of an older database,
and 0016 says which of its days had energy measured.
"""

from __future__ import annotations

import datetime as dt
import random

import pytest
import sqlalchemy as sa
from alembic import command

from hub import inventory as inv
from hub import usage
from hub.inventory._migrate import HEAD, _config
from hub.usage import apply_retention, write_bucket

HOUR = 3600.0
DAY0 = dt.datetime(2026, 11, 1)
T0 = DAY0.replace(tzinfo=dt.UTC).timestamp() + 5 * HOUR  # 05:00 on the first day
BUCKETS = 4 * 24 - 7  # until 22:00 on the fourth day


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC).replace(tzinfo=None)


def bucket_rows(start: float, rng: random.Random) -> list[dict]:
    """One bucket of ledger rows: whole GPUs and MIG slices, allocated or not, some idle
    around the 5 % threshold, a model not known, a GPU that changes namespace, a GPU that
    never reports power (GPU-10: its energy is unknown, not 0)."""
    rows = []
    for g in range(12):
        ns, pod = (f"team-{g % 3}", f"job-{g}") if g % 4 else ("", "")
        if g == 5 and start >= T0 + 30 * HOUR:
            ns, pod = "team-late", "job-moved"
        share, piece = (3 / 7, "3g.40gb/1") if g == 7 else (1.0, "")
        coverage = rng.choice([1.0, 1.0, 2 / 3, 0.5])
        util = rng.choice([0.0, 2.0, 4.99, 5.0, 7.5, 40.0, 100.0, None])
        power = rng.choice([None, 90.0, 300.0])
        if g == 10:
            power = None
        rows.append({
            "bucket_start": utc(start), "bucket_end": utc(start + HOUR),
            "cluster": f"c{g % 2}", "node": f"n{g // 4}", "uuid": f"GPU-{g}", "slice": piece,
            "namespace": ns, "pod": pod, "vendor": "nvidia",
            "model": None if g == 11 else ("A100" if g % 2 else "H100"),
            "gpu_share": share, "gpu_hours": share * coverage, "avg_utilisation_pct": util,
            "max_utilisation_pct": util, "avg_power_w": power,
            "energy_wh": None if power is None else power * coverage * share,
            "coverage": coverage})
    return rows


def fill(engine: sa.Engine, seed: int = 7) -> None:
    rng = random.Random(seed)
    for b in range(BUCKETS):
        with engine.begin() as conn:
            write_bucket(conn, T0 + b * HOUR, HOUR, bucket_rows(T0 + b * HOUR, rng), 9)


PERIODS = [
    (DAY0 + dt.timedelta(hours=7, minutes=30), DAY0 + dt.timedelta(days=3, hours=13)),
    (DAY0, DAY0 + dt.timedelta(days=4)),
    (DAY0 - dt.timedelta(days=2), DAY0 + dt.timedelta(days=9)),  # like --since: no later rows
    (DAY0 + dt.timedelta(days=1, hours=2), DAY0 + dt.timedelta(days=1, hours=20)),
    (DAY0 + dt.timedelta(hours=23), DAY0 + dt.timedelta(days=2, hours=1)),
    (dt.datetime.min, DAY0 + dt.timedelta(days=2, hours=6)),  # --until only
]
GROUPINGS = [("namespace",), ("cluster", "model"), ("gpu",), ("node", "namespace")]


def assert_rollup_matches_hourly(conn, **kw) -> int:
    """Every period and grouping: rollup-based answer == hourly-only answer. Returns how
    many answers were compared (each a list of group rows)."""
    compared = 0
    for start, end in PERIODS:
        for by in GROUPINGS:
            fast = usage.usage_summary(conn, start, end, by, **kw)
            slow = usage.usage_summary(conn, start, end, by, rollup=False, **kw)
            # as the CLI asks: on PostgreSQL the idle runs on a connection of their own
            beside = usage.usage_summary(conn, start, end, by, beside=conn.engine, **kw)
            assert beside == fast, (start, end, by)
            assert len(fast) == len(slow), (start, end, by)
            for f, s in zip(fast, slow, strict=True):
                assert f == s, (start, end, by, f, s)
            compared += 1
    return compared


def test_rollup_answers_equal_the_hourly_ledger(db_url):
    engine = inv.make_engine(db_url, create=True)
    inv.upgrade(engine)
    fill(engine)
    with engine.connect() as conn:
        days = conn.execute(sa.select(sa.func.count(sa.distinct(inv.usage_daily.c.day)))
                            ).scalar()
        assert days == 4
        assert usage.rollup_days(conn, DAY0 + dt.timedelta(hours=7),
                                 DAY0 + dt.timedelta(days=3, hours=13)) == (
            DAY0 + dt.timedelta(days=1), DAY0 + dt.timedelta(days=3))
        assert assert_rollup_matches_hourly(conn) == len(PERIODS) * len(GROUPINGS)
        # a GPU that never reported power has unknown energy, in the rollup's whole days as
        # in the hourly rows; its namespace keeps the energy its other GPUs measured
        for rollup in (True, False):
            gpus = {r["uuid"]: r for r in usage.usage_summary(
                conn, DAY0, DAY0 + dt.timedelta(days=4), ["gpu"], rollup=rollup)}
            assert gpus["GPU-10"]["energy_kwh"] is None and gpus["GPU-10"]["gpu_hours"] > 0
            team = {r["namespace"]: r for r in usage.usage_summary(
                conn, DAY0, DAY0 + dt.timedelta(days=4), ["namespace"], rollup=rollup)}
            assert team["team-1"]["energy_kwh"] == pytest.approx(sum(
                r["energy_kwh"] or 0.0 for u, r in gpus.items()
                if u in ("GPU-1", "GPU-7", "GPU-10")), abs=1e-5)  # team-1 (g % 3 == 1)
        # another idle threshold reads the ledger (the rollup's idle is for 5 %)
        other = usage.usage_summary(conn, DAY0, DAY0 + dt.timedelta(days=4), ["namespace"],
                                    idle_threshold=50.0)
        default = usage.usage_summary(conn, DAY0, DAY0 + dt.timedelta(days=4), ["namespace"])
        assert ([r["idle_allocated_gpu_hours"] for r in other]
                > [r["idle_allocated_gpu_hours"] for r in default])
        assert_rollup_matches_hourly(conn, idle_threshold=50.0)
        # a scoped caller's answer counts only its own rows, in the rollup as in the ledger
        assert_rollup_matches_hourly(conn, clusters={"c1"}, namespaces={"team-1", ""})

    # re-collecting buckets with other rows (one GPU gone, other figures) keeps it exact
    rng = random.Random(99)
    with engine.begin() as conn:
        for b in (3, 30, 31, BUCKETS - 1):
            rows = bucket_rows(T0 + b * HOUR, rng)[1:]
            write_bucket(conn, T0 + b * HOUR, HOUR, rows, 9)
    with engine.connect() as conn:
        assert_rollup_matches_hourly(conn)
    # retention cuts the second day in two: the rollup of that day loses the same hours
    with engine.begin() as conn:
        removed = apply_retention(
            conn, (DAY0 + dt.timedelta(days=1, hours=9)).replace(tzinfo=dt.UTC).timestamp())
        assert removed == (19 + 9) * 12 - 1
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.min(inv.usage_daily.c.day))).scalar() == (
            DAY0 + dt.timedelta(days=1))
        assert_rollup_matches_hourly(conn)
        whole = usage.usage_summary(conn, DAY0 + dt.timedelta(days=2),
                                    DAY0 + dt.timedelta(days=3), ["cluster"])
    # whole days are read from the rollup alone: without their hourly rows, the same answer
    with engine.begin() as conn:
        conn.execute(inv.usage_rows.delete().where(
            inv.usage_rows.c.bucket_start >= DAY0 + dt.timedelta(days=2),
            inv.usage_rows.c.bucket_start < DAY0 + dt.timedelta(days=3)))
    # (idle GPU-hours excepted: they are idle runs, read from the ledger by hub.usage's one
    # idle function, and the rollup cannot say where a run starts)
    def sums(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "idle_allocated_gpu_hours"} for r in rows]

    with engine.connect() as conn:
        assert whole and sums(usage.usage_summary(conn, DAY0 + dt.timedelta(days=2),
                                                  DAY0 + dt.timedelta(days=3),
                                                  ["cluster"])) == sums(whole)
    engine.dispose()


def test_the_idle_runs_are_asked_beside_the_sums_on_postgresql(db_url):
    """`usage` on PostgreSQL asks the idle runs on a second connection while the first sums
    the period (the two statements cost about the same): two connections held at once,
    the same answer as one after the other. SQLite answers on the one connection."""
    engine = inv.make_engine(db_url, create=True)
    inv.upgrade(engine)
    fill(engine)
    held, most = 0, 0

    def checkout(*_: object) -> None:
        nonlocal held, most
        held += 1
        most = max(most, held)

    def checkin(*_: object) -> None:
        nonlocal held
        held -= 1

    start, end = DAY0 + dt.timedelta(hours=7, minutes=30), DAY0 + dt.timedelta(days=3, hours=13)
    with engine.connect() as conn:
        alone = usage.usage_summary(conn, start, end, ["namespace"])
    sa.event.listen(engine, "checkout", checkout)
    sa.event.listen(engine, "checkin", checkin)
    with engine.connect() as conn:
        beside = usage.usage_summary(conn, start, end, ["namespace"], beside=engine)
        # the transaction goes on as it was (the sums' worker limit was for them alone)
        if engine.dialect.name == "postgresql":
            assert conn.exec_driver_sql("SHOW max_parallel_workers_per_gather").scalar() == "2"
    assert held == 0
    assert most == (2 if engine.dialect.name == "postgresql" else 1)
    assert beside == alone and any(r["idle_allocated_gpu_hours"] for r in alone)
    engine.dispose()


def ledger_at_0005(db_url: str, seed: int) -> sa.Engine:
    """A database at revision 0005 (hourly ledger, no rollup) holding the test's buckets."""
    engine = inv.make_engine(db_url, create=True)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0005")
    rng = random.Random(seed)
    ledger = sa.table("usage", *[sa.column(c) for c in inv.USAGE_COLUMNS])
    with engine.begin() as conn:
        for b in range(BUCKETS):
            conn.execute(ledger.insert(), bucket_rows(T0 + b * HOUR, rng))
    return engine


def test_migration_0006_fills_the_rollup_from_hourly_rows(db_url):
    engine = ledger_at_0005(db_url, 3)
    before, after = inv.upgrade(engine)
    assert (before, after) == ("0005", HEAD)  # through 0006 (rollup) and on
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(inv.usage_daily)
                            ).scalar() > 0
        assert_rollup_matches_hourly(conn)
    engine.dispose()


def test_migration_0010_marks_the_rows_before_it_sampled(db_url):
    """Rows written before metered allocation were sampled, and their days say so."""
    engine = inv.make_engine(db_url, create=True)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0009")
    rng = random.Random(5)
    ledger = sa.table("usage", *[sa.column(c) for c in inv.USAGE_COLUMNS
                                 if c != "allocation_basis"])
    with engine.begin() as conn:
        for b in range(BUCKETS):
            conn.execute(ledger.insert(), bucket_rows(T0 + b * HOUR, rng))
        # the rollup as 0009 kept it (no basis column yet)
        days: dict[tuple, dict] = {}
        for r in conn.execute(sa.select(ledger)).mappings():
            key = (r["cluster"], r["node"], r["uuid"], r["slice"], r["namespace"])
            day = days.setdefault(key, {
                "day": DAY0, **dict(zip(("cluster", "node", "uuid", "slice", "namespace"), key,
                                        strict=True)),
                "model": r["model"], "gpu_hours": 0.0, "allocated_gpu_hours": 0.0,
                "busy_gpu_hours": 0.0, "idle_allocated_gpu_hours": 0.0, "energy_wh": 0.0})
            day["gpu_hours"] += r["gpu_hours"]
            day["allocated_gpu_hours"] += r["gpu_hours"] if r["pod"] else 0.0
        conn.execute(inv.usage_daily.insert(), list(days.values()))
    before, after = inv.upgrade(engine)
    assert (before, after) == ("0009", HEAD)
    with engine.connect() as conn:
        assert {r for (r,) in conn.execute(sa.select(inv.usage.c.allocation_basis).distinct())
                } == {"sampled"}
        rows = usage.usage_summary(conn, DAY0, DAY0 + dt.timedelta(days=1), ("namespace",))
    assert rows, rows
    assert {r["allocation_basis"] for r in rows if r["namespace"]} == {"sampled"}, rows
    assert {r["allocation_basis"] for r in rows if not r["namespace"]} == {None}
    engine.dispose()


def test_migration_0016_leaves_energy_unknown_where_no_power_was_reported(db_url):
    """Days rolled up before 0016 summed a GPU without power as 0 Wh: after it, their energy
    is null (unknown), a day with energy keeps it, and the rollup still answers as the
    hourly rows do."""
    engine = ledger_at_0005(db_url, 11)
    with engine.begin() as conn:
        command.upgrade(_config(conn), "0015")  # 0006 rolls the days up, energy NULL as 0
    daily = sa.table("usage_daily", *[sa.column(c) for c in ("uuid", "energy_wh")])
    with engine.connect() as conn:
        old = {u: e for u, e in conn.execute(
            sa.select(daily.c.uuid, sa.func.sum(daily.c.energy_wh)).group_by(daily.c.uuid))}
    assert old["GPU-10"] == 0.0 and old["GPU-0"] > 0  # the old rollup's claim: 0 Wh
    assert inv.upgrade(engine) == ("0015", HEAD)
    D = inv.usage_daily
    with engine.connect() as conn:
        for r in conn.execute(sa.select(D)).mappings():
            assert r["energy_measured_gpu_hours"] == (r["gpu_hours"] if r["energy_wh"] > 0
                                                      else 0.0), dict(r)
        whole = usage.usage_summary(conn, DAY0 + dt.timedelta(days=1),
                                    DAY0 + dt.timedelta(days=3), ["gpu"])
        assert_rollup_matches_hourly(conn)
    energy = {r["uuid"]: r["energy_kwh"] for r in whole}
    assert energy["GPU-10"] is None
    assert all(e > 0 for u, e in energy.items() if u != "GPU-10")
    engine.dispose()
