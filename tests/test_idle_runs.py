"""hub.usage.idle_runs, the one idle answer, against a brute-force oracle (hypothesis):
random hourly ledgers over three UTC days (pods changing, gaps, buckets without samples,
unknown utilisation, MIG shares), random periods and rules. The periods cross whole days,
so the rollup's narrowing to candidate GPUs is exercised as well as the edge hours."""

from __future__ import annotations

import datetime as dt
import math

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hub import usage
from hub.inventory import (
    _db,
    usage_buckets,
    usage_daily,
    usage_idle_daily,
    usage_idle_monthly,
    usage_ledger,
    usage_monthly,
    usage_places,
    usage_pods,
    usage_rows,
)
from hub.inventory import _migrate as migrate
from hub.usage import write_bucket

HOUR = dt.timedelta(hours=1)
BASE = dt.datetime(2026, 11, 2, 18)  # 60 hours: part of a day, a whole day, part of a third
HOURS = 60
#: buckets of 16 hours from here: 40 days, with the whole of November in them (read from the
#: monthly rollups, built as the first bucket of December is written)
BASE_16H = dt.datetime(2026, 10, 25, 16)

#: one bucket of one GPU: (pod or "", coverage, utilisation or None), or None: no row
bucket = st.one_of(st.none(), st.tuples(st.sampled_from(["", "p1", "p2"]),
                                        st.sampled_from([0.0, 0.5, 1.0]),
                                        st.one_of(st.none(), st.sampled_from(
                                            [0.0, 3.0, 4.9, 5.0, 50.0]))))


def _oracle(rows: list[dict], start: dt.datetime, end: dt.datetime, threshold: float,
            for_s: float, base: dt.datetime = BASE, step: dt.timedelta = HOUR
            ) -> dict[tuple, tuple[float, float]]:
    """(idle hours, wasted GPU-hours) per GPU and pod: every run of consecutive idle
    buckets, by walking the buckets one by one."""
    out: dict[tuple, tuple[float, float]] = {}
    keys = sorted({(r["uuid"], r["slice"], r["pod"]) for r in rows if r["pod"]})
    for key in keys:
        mine = {r["bucket_start"]: r for r in rows
                if (r["uuid"], r["slice"], r["pod"]) == key and start <= r["bucket_start"] < end}
        run: list[dict] = []
        for h in range(HOURS + 1):
            r = mine.get(base + h * step)
            idle = (r is not None and r["gpu_hours"] > 0 and r["avg_utilisation_pct"] is not None
                    and r["avg_utilisation_pct"] < threshold)
            if idle:
                run.append(r)
                continue
            if run and len(run) * step.total_seconds() >= for_s:
                hours, wasted = out.get(key, (0.0, 0.0))
                out[key] = (hours + len(run) * step / HOUR,
                            wasted + sum(x["gpu_hours"] for x in run))
            run = []
    return out


@pytest.fixture
def engine(db_url):
    """Both databases: the run detection sums in SQL and compares times in Python."""
    eng = _db.make_engine(db_url, create=True)
    migrate.ensure_schema(eng)
    yield eng
    eng.dispose()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpus=st.lists(st.tuples(st.sampled_from([1.0, 3 / 7]),
                               st.lists(bucket, min_size=HOURS, max_size=HOURS),
                               st.booleans()),
                     min_size=1, max_size=3),
       first=st.integers(0, HOURS - 1), length=st.integers(1, HOURS),
       threshold=st.sampled_from([5.0, 4.0, 10.0]), for_h=st.integers(0, 30),
       grid=st.booleans())
# idle only in the partial first day of the period: found through the edge hours, not the
# rollup's whole days
@example(gpus=[(1.0, [("p1", 1.0, 0.0)] * HOURS, True)], first=10, length=HOURS,
         threshold=5.0, for_h=0, grid=True)
# idle all along, read by days: one run across three days' rows and the edge hours
@example(gpus=[(1.0, [("p1", 1.0, 0.0)] * HOURS, False)], first=0, length=HOURS,
         threshold=5.0, for_h=30, grid=True)
# a day whose idle buckets are not one run (a busy hour inside it) is read by its rows
@example(gpus=[(1.0, [("p1", 1.0, 0.0)] * 20 + [("p1", 1.0, 50.0)] + [("p1", 1.0, 0.0)] * 39,
                False)], first=0, length=HOURS, threshold=5.0, for_h=3, grid=True)
@pytest.mark.parametrize("step_h", [1, 16])
def test_idle_runs_are_the_runs_walked_bucket_by_bucket(engine, gpus, first, length,
                                                        threshold, for_h, grid, step_h):
    """``grid``: the ledger's bucket size is stored (as every collect stores it), so whole
    days (and with 16-hour buckets a whole month) are read from the rollups; without it,
    from the ledger's rows."""
    step = step_h * HOUR
    base = BASE if step_h == 1 else BASE_16H
    rows: list[dict] = []
    for i, (share, buckets, busy_late) in enumerate(gpus):
        for h, b in enumerate(buckets):
            if b is None:
                continue
            pod, covered, util = b
            if busy_late and h >= 30:  # idle only before the last two days
                util = 50.0
            start = base + h * step
            rows.append({"cluster": "c", "node": "n", "uuid": f"GPU-{i}",
                         "slice": "" if share == 1.0 else "MIG-1",
                         "namespace": "ns" if pod else "", "pod": pod,
                         "bucket_start": start, "bucket_end": start + step, "vendor": "nvidia",
                         "model": "H100", "gpu_share": share, "gpu_hours": share * covered,
                         "avg_utilisation_pct": util, "max_utilisation_pct": util,
                         "avg_memory_used_mib": 1.0, "max_memory_used_mib": 1.0,
                         "avg_power_w": 1.0, "energy_wh": share * covered,
                         "coverage": covered})
    with engine.begin() as conn:
        # the compact ledger's tables (usage is a view over them)
        for t in (usage_rows, usage_places, usage_pods, usage_daily, usage_buckets,
                  usage_idle_daily, usage_ledger, usage_monthly, usage_idle_monthly):
            conn.execute(t.delete())
        if grid:
            conn.execute(usage_ledger.insert().values(key="bucket_seconds",
                                                      value=f"{step.total_seconds():g}"))
        for h in range(HOURS):
            start = base + h * step
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), step.total_seconds(),
                         [r for r in rows if r["bucket_start"] == start], 1)
        if step_h == 16:  # October and November are whole: summed by month as written
            days = set(conn.execute(sa.select(usage_daily.c.day).distinct()).scalars())
            assert set(conn.execute(sa.select(usage_monthly.c.month).distinct()).scalars()
                       ) == {d.replace(day=1) for d in days if d < dt.datetime(2026, 12, 1)}
    start, end = base + first * step, base + min(HOURS, first + length) * step
    with engine.connect() as conn:
        got = usage.idle_runs(conn, start, end, threshold=threshold,
                              for_seconds=for_h * 3600.0)
        by_ns = usage.usage_summary(conn, start, end, ["namespace"], threshold,
                                    idle_for=for_h * 3600.0)
        hourly = usage.usage_summary(conn, start, end, ["namespace"], threshold,
                                     idle_for=for_h * 3600.0, rollup=False)
    want = _oracle(rows, start, end, threshold, for_h * 3600.0, base, step)
    assert {(r["uuid"], r["slice"] or "", r["pod"]) for r in got} == set(want)
    for r in got:
        hours, wasted = want[(r["uuid"], r["slice"] or "", r["pod"])]
        assert math.isclose(r["idle_hours"], hours, abs_tol=1e-6)
        assert math.isclose(r["wasted_gpu_hours"], wasted, abs_tol=1e-6)
    # usage's idle GPU-hours are the list's
    total = sum(w for _, w in want.values())
    assert math.isclose(sum(r["idle_allocated_gpu_hours"] for r in by_ns), total,
                        abs_tol=1e-5)
    # and the rollups' sums (days, months) are the ledger rows' own
    assert [r["namespace"] for r in by_ns] == [r["namespace"] for r in hourly]
    for got_row, want_row in zip(by_ns, hourly, strict=True):
        for key, value in want_row.items():
            if isinstance(value, float):
                assert math.isclose(got_row[key], value, abs_tol=1e-5), key
            else:
                assert got_row[key] == value, key
