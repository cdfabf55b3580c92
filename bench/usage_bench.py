"""Usage ledger benchmark: `usage collect` of one hour, and `usage --since 30d` over a month.

Prints two JSON lines.

1. collect: N GPUs (8 a node, pod labels on every other GPU, NVIDIA) with one hour of samples
   every --push seconds (300: ACM's cadence; GPU_UTIL, FB_USED, POWER_USAGE) backfilled into a
   real Prometheus with
   ``promtool tsdb create-blocks-from openmetrics``; ``gpufleet usage collect`` of that hour
   runs in a child process (peak RSS read with wait4). With kube-state-metrics' series of
   every pod (start, GPU requests, Running phase; --no-intervals leaves them out) the
   allocated rows are metered from intervals (allocation_basis counts them). Figures:
   requests (a constant: the same at any N), seconds, peak_rss_mb, rows written, database
   bytes per 1,000 GPU-hours.
2. answer: M GPUs x 30 days of hourly ledger rows generated in the database (one INSERT ...
   SELECT) and the daily rollup rebuilt as `usage collect` keeps it, then
   ``usage --by namespace --since 30d`` timed in process (query_s: the database's part, three
   runs, with the idle runs asked beside the sums as the command asks them;
   query_one_connection_s: one statement after the other), in a child (answer_s: the
   whole command, three runs) and ``usage --help`` (the process start and imports alone);
   the same answer from the hourly rows only for comparison; the database's plan of the
   statement; the database's growth per GPU-hour row (pg_database_size, or the SQLite
   file, before and after the fill and the rollup);
   ``usage --since 365d`` on the same ledger (with --days 365 a year of rows); and
   ``usage export`` of the whole period to Parquet (--focus) in a child: rows per second,
   peak RSS, the file's bytes per row. On SQLite and, with --pg, PostgreSQL (--pg auto
   starts a throwaway PostgreSQL 15 as the tests do).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from hub import inventory as inv  # noqa: E402
from hub import usage  # noqa: E402
from hub.devstack import PrometheusProcess, hub_config, require_binary  # noqa: E402

HOUR = 3600
BEGAN = time.perf_counter()


def progress(what: str) -> None:
    """A line on stderr per phase: a 100,000-GPU run takes an hour, its log says where."""
    print(f"[{time.perf_counter() - BEGAN:8.1f}s load {os.getloadavg()[0]:.2f}] {what}",
          file=sys.stderr, flush=True)


def write_openmetrics(path: Path, gpus: int, t0: float, push: float,
                      intervals: bool = True) -> None:
    series = []
    pods = []
    for i in range(gpus):
        node, g = divmod(i, 8)
        pod = (f',namespace="team-{node % 20}",pod="job-{node}-{g}"' if i % 2 == 0 else
               ',namespace="gpu-operator",pod="nvidia-dcgm-exporter-x"')
        series.append(f'cluster="c{node // 50}",Hostname="n{node}",gpu="{g}",'
                      f'UUID="GPU-{i:08d}",modelName="NVIDIA H100 80GB HBM3"{pod}')
        if i % 2 == 0:
            pods.append((f'cluster="c{node // 50}",namespace="team-{node % 20}",'
                         f'pod="job-{node}-{g}",uid="u-{i}"', f"n{node}",
                         t0 - 600 - (i % 500)))
    times = [t0 + push / 2 + push * k for k in range(round(HOUR / push))]
    with path.open("w") as out:
        for name, value in (("DCGM_FI_DEV_GPU_UTIL", 40), ("DCGM_FI_DEV_FB_USED", 1000),
                            ("DCGM_FI_DEV_POWER_USAGE", 300)):
            out.write(f"# TYPE {name} gauge\n")
            for labels in series:
                out.writelines(f"{name}{{{labels}}} {value} {t:.3f}\n" for t in times)
        # kube-state-metrics of the pods, held all hour and on (interval basis): the pushes
        # after the hour say they were still running
        later = [*times, times[-1] + push, times[-1] + 2 * push]
        if intervals:
            for name, extra, value in (
                    ("kube_pod_start_time", "", None),
                    ("kube_pod_container_resource_requests",
                     ',container="main",resource="nvidia_com_gpu",unit="integer"', 1.0),
                    ("kube_pod_status_phase", ',phase="Running"', 1.0)):
                out.write(f"# TYPE {name} gauge\n")
                for labels, node, start in pods:
                    more = f',node="{node}"' if name.endswith("requests") else ""
                    v = start if value is None else value
                    out.writelines(f"{name}{{{labels}{extra}{more}}} {v} {t:.3f}\n"
                                   for t in later)
        out.write("# EOF\n")


def child(args: list[str]) -> tuple[str, float, float]:
    """Run gpufleet in a child: stdout, seconds, peak RSS MB (GNU time's %M: the child's own
    high-water mark; wait4's rusage starts from the parent's, which at 100,000 GPUs had
    read a year of idle runs: every child then showed the bench's 2.7 GB)."""
    with tempfile.NamedTemporaryFile() as rss, tempfile.TemporaryFile() as out:
        cmd = ["/usr/bin/time", "-f", "%M", "-o", rss.name, sys.executable, "-m", "hub",
               *args]
        started = time.perf_counter()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT)
        took = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"{args[0]} failed: {proc.stderr.decode()}")
        out.seek(0)
        kb = int(Path(rss.name).read_text().split()[-1])
        return out.read().decode(), took, kb / 1024


def bench_collect(gpus: int, work: Path, push: float = 300.0, intervals: bool = True,
                  pg_url: str | None = None) -> dict:
    """The collect figure; with ``pg_url`` (a fresh PostgreSQL database) the ledger is
    written there, and the database's write of the bucket is timed apart (bench_write)."""
    t0 = (time.time() // HOUR) * HOUR - 2 * HOUR
    om = work / "fleet.om"
    write_openmetrics(om, gpus, t0, push, intervals)
    data = work / "hub" / "data"
    data.mkdir(parents=True)
    progress(f"collect: {om.stat().st_size / 1e6:.0f} MB of OpenMetrics written")
    subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(om), str(data)], check=True, capture_output=True)
    om.unlink()
    progress("collect: blocks created")
    db_path = work / "usage.db"
    url = pg_url or f"sqlite:///{db_path}"
    # a loaded 2-core machine can take longer than Prometheus's default 2-minute query timeout
    hub = PrometheusProcess(work / "hub", hub_config(),
                            extra_args=["--query.timeout=10m"]).start(timeout=300)
    try:
        iso = dt.datetime.fromtimestamp(t0, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        end = dt.datetime.fromtimestamp(t0 + HOUR, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        progress("collect: hub up")
        load_before = os.getloadavg()
        out, took, rss = child(["usage", "collect", "--hub-url", hub.url, "--db",
                                url, "--from", iso, "--until", end,
                                "--push-interval", f"{push:g}s",
                                "--timeout", "600s", "-o", "json"])
    finally:
        hub.stop()
    result = json.loads(out)
    progress(f"collect: {took:.1f}s, {result['rows']} rows")
    if pg_url:
        return {"figure": "collect", "database": "postgresql", "gpus": gpus,
                "push_interval_s": push, "intervals": intervals,
                "requests": result["requests"], "seconds": round(took, 2),
                "peak_rss_mb": round(rss, 1), "rows": result["rows"],
                "load_avg_before": load_before, "load_avg": os.getloadavg(),
                **bench_write(pg_url, dt.datetime.fromtimestamp(t0, dt.UTC)
                              .replace(tzinfo=None))}
    engine = inv.make_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        gpu_hours = conn.execute(sa.select(sa.func.sum(inv.usage.c.gpu_hours))).scalar() or 0
        bases = dict(conn.execute(sa.select(inv.usage.c.allocation_basis, sa.func.count())
                                  .where(inv.usage.c.pod != "")
                                  .group_by(inv.usage.c.allocation_basis)).all())
        page_size = conn.exec_driver_sql("PRAGMA page_size").scalar()
        stat = _has_dbstat(conn)
        ledger = _bytes(conn, ("usage_rows", "ix_usage_rows_bucket", "ix_usage_rows_place",
                               "usage_places", "ix_usage_places_uuid", "usage_pods",
                               "sqlite_autoindex_usage_pods_1"))
        rollup = _bytes(conn, ("usage_daily", "ix_usage_daily_day"))
    engine.dispose()
    per = 1000 / max(gpu_hours, 1e-9)
    return {"figure": "collect", "gpus": gpus, "push_interval_s": push,
            "intervals": intervals, "allocation_basis": bases,
            "requests": result["requests"],
            "seconds": round(took, 2), "peak_rss_mb": round(rss, 1), "rows": result["rows"],
            "gpu_hours": round(gpu_hours, 3),
            "db_bytes_per_1000_gpu_hours": round(
                (ledger if stat else db_path.stat().st_size) * per),
            "ledger_bytes_measured": "dbstat" if stat else "whole file",
            # the rollup holds one row per GPU and day: over whole days 1/24 of this
            "rollup_bytes_per_1000_gpu_hours_this_hour": round(rollup * per) if stat else None,
            "sqlite_page_size": page_size, "load_avg": os.getloadavg()}


def bench_write(url: str, begin: dt.datetime, runs: int = 3) -> dict:
    """The database's part of a collect: the bucket's rows, read back as folded (the
    ``usage`` view's shape), written again by write_bucket as the collect does (in the
    ledger's locked transaction: delete the bucket, rows, marks, the day's rollup rebuilt);
    and the rollup rebuild alone, to tell the two apart."""
    from hub.usage._ledger import _ledger_transaction, write_bucket

    engine = inv.make_engine(url)
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(
            sa.select(inv.usage).where(inv.usage.c.bucket_start == begin)).mappings()]
    start = begin.replace(tzinfo=dt.UTC).timestamp()
    writes, rebuilds = [], []
    for _ in range(runs):
        began = time.perf_counter()
        with _ledger_transaction(engine, 60.0) as conn:
            write_bucket(conn, start, HOUR, rows, 19)
        writes.append(time.perf_counter() - began)
        began = time.perf_counter()
        with engine.begin() as conn:
            usage.rebuild_days(conn, [inv.day_of(begin)])
        rebuilds.append(time.perf_counter() - began)
    engine.dispose()
    progress(f"write {writes}, rebuild {rebuilds}")
    return {"write_rows": len(rows), "write_s": [round(t, 3) for t in writes],
            "write_rows_per_s": round(len(rows) / min(writes)),
            "rollup_rebuild_of_the_hour_s": [round(t, 3) for t in rebuilds],
            "write_load_avg": os.getloadavg()}


def _bytes(conn, names: tuple[str, ...]) -> int:
    marks = ", ".join(f"'{n}'" for n in names)
    try:
        return conn.exec_driver_sql(
            f"SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN ({marks})").scalar()
    except sa.exc.OperationalError:
        return 0


def _has_dbstat(conn) -> bool:
    try:
        conn.exec_driver_sql("SELECT 1 FROM dbstat LIMIT 1")
        return True
    except sa.exc.OperationalError:
        return False


# GPU i: cluster c{i//400}, node n{i//8}; even GPUs held by team-{i%20}/job-{i}, odd ones
# unallocated; utilisation (i % 10) x 10 % (so a tenth of the allocated GPUs are idle); the
# figures a collect writes for a DCGM GPU without profiling counters (memory, power, maxima). The
# ledger's tables (hub/inventory/_usage_tables.py) are filled as a collect would: the
# dictionaries once, the bucket marks, then the rows with their keys (place i + 1; pod i + 2
# or 1 for the unallocated '', ''), hour by hour as a collect writes them (the rows lie on
# disk in bucket order, as a collect leaves them; the ORDER BY says what the plan already
# did).
FILL_SQL = {
    "sqlite": [
        """INSERT INTO usage_places (id, cluster, node, uuid, slice, vendor, model, gpu_share)
WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :gpus - 1)
SELECT i + 1, 'c' || (i / 400), 'n' || (i / 8), printf('GPU-%08d', i), '', 'nvidia',
  'NVIDIA H100 80GB HBM3', 1.0 FROM g""",
        """INSERT INTO usage_pods (id, namespace, pod)
WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :gpus - 1)
SELECT 1, '', '' UNION ALL SELECT i + 2, 'team-' || (i % 20), 'job-' || i FROM g
WHERE i % 2 = 0""",
        """INSERT INTO usage_buckets (bucket_start, bucket_end, collected_at, rows, requests)
WITH RECURSIVE h(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM h WHERE k < :hours - 1)
SELECT strftime('%Y-%m-%d %H:%M:%S.000000', :base, '+' || k || ' hours'),
  strftime('%Y-%m-%d %H:%M:%S.000000', :base, '+' || (k + 1) || ' hours'),
  strftime('%Y-%m-%d %H:%M:%S.000000', :base, '+' || (k + 1) || ' hours'), :gpus, 19
FROM h""",
        """INSERT INTO usage_rows (bucket_start, place, pod, gpu_hours, coverage,
  avg_utilisation_pct, max_utilisation_pct, avg_memory_used_mib, max_memory_used_mib,
  avg_power_w, energy_wh, basis)
WITH RECURSIVE h(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM h WHERE k < :hours - 1),
g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < :gpus - 1)
SELECT strftime('%Y-%m-%d %H:%M:%S.000000', :base, '+' || k || ' hours'), i + 1,
  CASE WHEN i % 2 = 0 THEN i + 2 ELSE 1 END, 1.0, 1.0, (i % 10) * 10.0,
  (i % 10) * 10.0 + 5.5, 40000.0 + i, 41000.0 + i, 300.0 + (i % 50), 300.0 + (i % 50), 2
FROM h CROSS JOIN g ORDER BY k, i"""],
    "postgresql": [
        """INSERT INTO usage_places (id, cluster, node, uuid, slice, vendor, model, gpu_share)
SELECT i + 1, 'c' || (i / 400), 'n' || (i / 8), 'GPU-' || lpad(i::text, 8, '0'), '',
  'nvidia', 'NVIDIA H100 80GB HBM3', 1.0 FROM generate_series(0, :gpus - 1) i""",
        """INSERT INTO usage_pods (id, namespace, pod)
SELECT 1, '', '' UNION ALL SELECT i + 2, 'team-' || (i % 20), 'job-' || i
FROM generate_series(0, :gpus - 1) i WHERE i % 2 = 0""",
        """INSERT INTO usage_buckets (bucket_start, bucket_end, collected_at, rows, requests)
SELECT CAST(:base AS timestamp) + k * interval '1 hour',
  CAST(:base AS timestamp) + (k + 1) * interval '1 hour',
  CAST(:base AS timestamp) + (k + 1) * interval '1 hour', :gpus, 19
FROM generate_series(0, :hours - 1) k""",
        """INSERT INTO usage_rows (bucket_start, place, pod, gpu_hours, coverage,
  avg_utilisation_pct, max_utilisation_pct, avg_memory_used_mib, max_memory_used_mib,
  avg_power_w, energy_wh, basis)
SELECT CAST(:base AS timestamp) + k * interval '1 hour', i + 1,
  CASE WHEN i % 2 = 0 THEN i + 2 ELSE 1 END, 1.0, 1.0, (i % 10) * 10.0,
  (i % 10) * 10.0 + 5.5, 40000.0 + i, 41000.0 + i, 300.0 + (i % 50), 300.0 + (i % 50), 2
FROM generate_series(0, :hours - 1) k CROSS JOIN generate_series(0, :gpus - 1) i
ORDER BY k, i"""],
}


def fill_ledger(engine, gpus: int, hours: int, base: dt.datetime) -> tuple[float, float]:
    """gpus x hours ledger rows from ``base`` on, generated in the database, then the daily
    rollup of every day rebuilt as `usage collect` does. Returns (fill_s, rebuild_day_s: the
    rebuild of one whole day, what collect pays at a day's last bucket)."""
    started = time.perf_counter()
    with engine.begin() as conn:
        # the months' partitions on PostgreSQL, as the writer makes them
        inv.ensure_partitions(conn, [base + dt.timedelta(hours=h) for h in range(0, hours, 24)]
                              + [base + dt.timedelta(hours=hours - 1)])
        *fixed, rows_sql = FILL_SQL[engine.dialect.name]
        for sql in fixed:
            conn.execute(sa.text(sql), {"hours": hours, "gpus": gpus,
                                        "base": base.isoformat(sep=" ")})
    # the rows a day per statement and commit: a month at 100,000 GPUs is 72M rows
    for day in range(0, hours, 24):
        with engine.begin() as conn:
            conn.execute(sa.text(rows_sql), {
                "hours": min(24, hours - day), "gpus": gpus,
                "base": (base + dt.timedelta(hours=day)).isoformat(sep=" ")})
        progress(f"filled {day // 24 + 1} of {-(-hours // 24)} days")
    fill_s = time.perf_counter() - started
    days = sorted({inv.day_of(base + dt.timedelta(hours=h)) for h in range(hours)})
    took = []
    with engine.begin() as conn:
        for day in days:
            began = time.perf_counter()
            usage.rebuild_days(conn, [day])
            took.append(time.perf_counter() - began)
    return fill_s, max(took)


def fill_rollup_days(engine, source: dt.datetime, before: dt.datetime, days: int) -> float:
    """``days`` days of daily rollups before ``before`` (the first hour of the hourly rows),
    each a copy of ``source``'s (a whole day of them): a year of hourly rows at 100,000 GPUs
    does not fit a bench disk, and `usage --since 365d` reads whole days from the rollups
    alone (usage_daily, usage_idle_daily and usage_daily_groups; the hourly rows only for
    the period's edges).
    Returns seconds."""
    started = time.perf_counter()
    first = inv.day_of(before) - dt.timedelta(days=days)
    with engine.begin() as conn:
        inv.ensure_partitions(conn, [first + dt.timedelta(days=k) for k in range(days)])
    pg = engine.dialect.name == "postgresql"
    for table in (inv.usage_daily, inv.usage_idle_daily, inv.usage_daily_groups):
        rest = [c for c in table.c if c.name != "day"]
        for k in range(days):
            day = first + dt.timedelta(days=k)
            shift = (day - source).days

            def moved(c: sa.Column, shift: int = shift) -> sa.ColumnElement:
                """An idle run's times moved with its day (runs join across midnight)."""
                if c.name not in ("first_start", "last_end"):
                    return c
                return (c + sa.func.make_interval(0, 0, 0, shift) if pg else
                        sa.func.strftime("%Y-%m-%d %H:%M:%S.000000", c, f"{shift} days"))

            with engine.begin() as conn:
                conn.execute(table.insert().from_select(
                    ["day", *[c.name for c in rest]],
                    sa.select(sa.literal(day, sa.DateTime),
                              *[moved(c) for c in rest]).where(table.c.day == source)))
        progress(f"{days} days of {table.name} from {first:%Y-%m-%d}")
    return time.perf_counter() - started


def db_size(engine, url: str) -> int:
    """The database's size on disk: pg_database_size, or the SQLite file (and its WAL)."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            return conn.execute(sa.select(sa.func.pg_database_size(
                sa.func.current_database()))).scalar()
    path = Path(url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def bench_export(url: str, start: dt.datetime, end: dt.datetime, rows: int,
                 work: Path) -> dict:
    """`usage export --format parquet --focus` of [start, end) in a child process."""
    out = work / f"export-{os.getpid()}-{time.monotonic_ns()}.parquet"
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    _, took, rss = child(["usage", "export", "--db", url, "--from", start.strftime(fmt),
                          "--until", end.strftime(fmt), "--format", "parquet", "--focus",
                          "--out", str(out)])
    size = out.stat().st_size
    out.unlink()
    return {"export_s": round(took, 2), "export_rows_per_s": round(rows / max(took, 1e-9)),
            "export_peak_rss_mb": round(rss, 1),
            "parquet_bytes_per_row": round(size / max(rows, 1), 2)}


def bench_answer(gpus: int, url: str, days: int = 30, work: Path | None = None,
                 rollup_days: int = 0, export_days: tuple[int, ...] | None = None,
                 hourly_check: bool = True, hold: Hold | None = None) -> dict:
    """`usage --by namespace --since 30d` (and 365d) over ``days`` days of hourly rows for
    ``gpus`` GPUs, the ledger's bytes per row, and an export of it. ``rollup_days`` (more
    than ``days``): the daily rollups reach that many days back, the days before the hourly
    rows as rollups only (fill_rollup_days). ``export_days``: export the last that many days
    of hourly rows each, after the answer's figures (each export a JSON line of its own
    printed as it ends: a month at 100,000 GPUs takes most of an hour); None: the whole
    period, in the answer's line. ``hourly_check`` False leaves out the comparison with the
    answer from the hourly rows alone (minutes over 72M rows). ``hold``: once the answers
    are timed, keep the ledger (and its server) for experiments (Hold says how)."""
    engine = inv.make_engine(url, create=True)
    inv.upgrade(engine)
    with engine.begin() as conn:  # the hourly grid, stored with the ledger as a collect does
        conn.execute(inv.usage_ledger.insert().values(key="bucket_seconds", value="3600"))
    now_hour = dt.datetime.now(dt.UTC).replace(tzinfo=None, minute=0, second=0,
                                                microsecond=0)
    empty = db_size(engine, url)
    # the hourly rows from a midnight on (whole days, then today's hours): the rollups
    # before them then meet them with no hour missing between, as on a ledger collected all
    # along (a gap of hours breaks every idle run that crosses it)
    base = inv.day_of(now_hour) - dt.timedelta(days=days)
    hours = int((now_hour - base).total_seconds() // 3600)
    fill_s, rebuild_day_s = fill_ledger(engine, gpus, hours, base)
    grown = db_size(engine, url) - empty
    progress(f"filled {hours} hours x {gpus} GPUs in {fill_s:.0f}s, {grown / 1e9:.2f} GB")
    rollup_only_s = (fill_rollup_days(engine, inv.day_of(base), base, rollup_days - days)
                     if rollup_days > days else None)
    # the monthly rollups of the months before this one, as the writer keeps them (it sums
    # a month once the first bucket after it is written)
    began = time.perf_counter()
    with engine.begin() as conn:
        first = conn.execute(sa.select(sa.func.min(inv.usage_daily.c.day))).scalar()
        month, months = inv.month_of(first), []
        while month < inv.month_of(now_hour):
            months.append(month)
            month = inv.next_month(month)
        usage.rebuild_months(conn, months)
    months_s = time.perf_counter() - began
    progress(f"{len(months)} months summed in {months_s:.1f}s")
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE")
            conn.commit()
        rows = conn.execute(sa.select(sa.func.count()).select_from(inv.usage)).scalar()
        rollup_rows = conn.execute(
            sa.select(sa.func.count()).select_from(inv.usage_daily)).scalar()
    times, one_connection = [], []
    for _ in range(3):  # as the command asks: [now - 30d, now + 1s), the idle runs beside
        for beside, took in ((engine, times), (None, one_connection)):
            now = inv.now_utc()
            with engine.connect() as conn:
                began = time.perf_counter()
                answer = usage.usage_summary(conn, now - dt.timedelta(days=30),
                                             now + dt.timedelta(seconds=1), ["namespace"],
                                             beside=beside)
                took.append(time.perf_counter() - began)
    hourly, hourly_s = None, None
    if hourly_check:
        with engine.connect() as conn:
            began = time.perf_counter()
            hourly = usage.usage_summary(conn, now - dt.timedelta(days=30),
                                         now + dt.timedelta(seconds=1), ["namespace"],
                                         rollup=False)
            hourly_s = time.perf_counter() - began
    progress(f"30d answers {times} ({one_connection} on one connection), "
             f"hourly only {hourly_s}s")
    plan = _plan(engine, now)
    year = []
    for _ in range(3):
        now = inv.now_utc()
        with engine.connect() as conn:
            began = time.perf_counter()
            usage.usage_summary(conn, now - dt.timedelta(days=365),
                                now + dt.timedelta(seconds=1), ["namespace"])
            year.append(time.perf_counter() - began)
    progress(f"365d answers {year}")
    idle: dict[int, list[float]] = {}
    for span in (30, 365):  # the idle runs alone: usage_summary's part judged in Python once
        for _ in range(3):
            now = inv.now_utc()
            with engine.connect() as conn:
                began = time.perf_counter()
                usage.idle_runs(conn, now - dt.timedelta(days=span),
                                now + dt.timedelta(seconds=1))
                idle.setdefault(span, []).append(round(time.perf_counter() - began, 3))
    progress(f"idle runs alone {idle}")
    exported = (bench_export(url, now_hour - dt.timedelta(hours=days * 24), now_hour, rows,
                             work) if work is not None and export_days is None else {})
    progress(f"export {exported}")
    wall = []
    for _ in range(3):
        out, took, rss = child(["usage", "--by", "namespace", "--since", "30d", "--db", url,
                                "-o", "json"])
        wall.append(took)
    start_s = min(child(["usage", "--help"])[1] for _ in range(3))
    result = {"figure": "usage --by namespace --since 30d", "database": engine.dialect.name,
            "gpus": gpus, "rows": rows, "rollup_rows": rollup_rows,
            "fill_s": round(fill_s, 1), "rollup_rebuild_day_s": round(rebuild_day_s, 3),
            "days": days, "rollup_days": max(rollup_days, days),
            "rollup_only_fill_s": None if rollup_only_s is None else round(rollup_only_s, 1),
            "db_bytes_per_gpu_hour_row": round(grown / max(rows, 1), 1),
            "query_s": [round(t, 3) for t in times],
            "query_one_connection_s": [round(t, 3) for t in one_connection],
            "query_365d_s": [round(t, 3) for t in year],
            "idle_runs_30d_s": idle[30], "idle_runs_365d_s": idle[365],
            "months_summed_s": round(months_s, 1),
            "answer_s": [round(t, 3) for t in wall],
            "process_start_s": round(start_s, 3),
            "hourly_only_query_s": None if hourly_s is None else round(hourly_s, 3),
            "max_rel_diff_vs_hourly_only": None if hourly is None else _max_rel_diff(
                answer, hourly),
            "groups": len(json.loads(out)), "peak_rss_mb": round(rss, 1),
            **exported, "load_avg": os.getloadavg(), "plan": plan}
    if export_days and work is not None:
        print(json.dumps(result), flush=True)
        for n in (n for n in export_days if n > 0):  # 0: no export, only the answers
            with engine.connect() as conn:
                count = conn.execute(sa.select(sa.func.count()).select_from(inv.usage_rows)
                                     .where(inv.usage_rows.c.bucket_start
                                            >= now_hour - dt.timedelta(days=n))).scalar()
            load = os.getloadavg()
            progress(f"export of {n} days, {count} rows")
            print(json.dumps({"figure": "usage export --format parquet --focus",
                              "database": engine.dialect.name, "gpus": gpus, "days": n,
                              "rows": count, **bench_export(
                                  url, now_hour - dt.timedelta(days=n), now_hour, count, work),
                              "load_avg_before": load, "load_avg": os.getloadavg()}),
                  flush=True)
        result = {}
    engine.dispose()
    if hold is not None:
        if result:
            print(json.dumps(result), flush=True)
            result = {}
        hold.keep(url)
    return result


class Hold:
    """Keep a filled ledger after its figures: its URL written to ``path``, then wait up to
    ``seconds`` or until that file is removed. A 100,000-GPU ledger takes ten minutes to
    fill; a plan's EXPLAIN (ANALYZE) or a changed statement is tried on it in seconds."""

    def __init__(self, seconds: float, path: Path) -> None:
        self.seconds, self.path = seconds, path

    def keep(self, url: str) -> None:
        self.path.write_text(url + "\n")
        progress(f"holding the ledger at {url} for {self.seconds:.0f}s "
                 f"(rm {self.path} to end sooner)")
        until = time.monotonic() + self.seconds
        while time.monotonic() < until and self.path.exists():
            time.sleep(2)
        self.path.unlink(missing_ok=True)


def _max_rel_diff(a: list[dict], b: list[dict]) -> float | None:
    """The largest relative difference between two answers' figures (None: different
    groups). Summing millions of floats in another order moves the last digits only."""
    if [r["namespace"] for r in a] != [r["namespace"] for r in b]:
        return None
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        for f in usage.USAGE_FIGURES:
            if x[f] != y[f]:
                worst = max(worst, abs(x[f] - y[f]) / max(abs(x[f]), abs(y[f])))
    return worst


def _plan(engine, now: dt.datetime) -> list[str]:
    """The database's plan of the statement usage_summary runs for --since 30d."""
    with engine.connect() as conn:
        stmt = usage.summary_select(conn, now - dt.timedelta(days=30),
                                    now + dt.timedelta(seconds=1), ["namespace"], 5.0)
        sql = str(stmt.compile(dialect=engine.dialect,
                               compile_kwargs={"literal_binds": True}))
        if engine.dialect.name == "sqlite":
            return [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
        return [r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql)]


def _pg_answer(gpus: int, server: str, days: int, work: Path, rollup_days: int = 0,
               export_days: tuple[int, ...] | None = None, hourly_check: bool = True,
               hold: Hold | None = None) -> dict:
    from tests.support.pg import create_database

    return bench_answer(gpus, create_database(server, prefix="bench_"), days, work,
                        rollup_days, export_days, hourly_check, hold)


@contextlib.contextmanager
def _pg_server(pg: str | None):
    """The PostgreSQL server URL --pg names (None: none), a throwaway one for 'auto'."""
    if pg == "auto":
        from tests.support.pg import throwaway_server

        with throwaway_server() as server:
            yield server
    else:
        yield pg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs for the collect figure")
    parser.add_argument("--answer-gpus", type=int, default=1000,
                        help="GPUs x 30 days of ledger rows for the answer figure")
    parser.add_argument("--days", type=int, default=30,
                        help="days of hourly ledger rows for the answer figure (365: a year)")
    parser.add_argument("--pg", help="also time the answer on this PostgreSQL server URL "
                        "(without a database; one is created), or 'auto': start a throwaway "
                        "PostgreSQL 15 as the tests do")
    parser.add_argument("--push", type=float, default=300.0,
                        help="push interval of the collect figure's samples (s; ACM: 300)")
    parser.add_argument("--no-intervals", dest="intervals", action="store_false",
                        help="collect figure without kube-state-metrics' pod series (every "
                        "allocated row sampled)")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--rollup-days", type=int, default=0,
                        help="daily rollups this many days back (beyond --days: rollups "
                        "only, copies of a day's), for --since 365d at a scale whose year of "
                        "hourly rows does not fit the disk")
    parser.add_argument("--pg-only", action="store_true",
                        help="the answer figure on PostgreSQL only (not SQLite too), and the "
                        "collect figure's ledger on PostgreSQL with its write timed apart")
    parser.add_argument("--export-days", type=int, nargs="+",
                        help="export the last that many days (each a figure of its own, "
                        "after the answer's) instead of the whole period")
    parser.add_argument("--no-hourly-check", dest="hourly_check", action="store_false",
                        help="leave out the answer from the hourly rows alone")
    parser.add_argument("--hold", type=float, metavar="SECONDS",
                        help="after the answer figures keep the ledger this long (its URL in "
                        "--hold-file; removing that file ends the wait), for EXPLAIN runs")
    parser.add_argument("--hold-file", type=Path, default=Path("usage_bench.url"),
                        help="where --hold writes the held ledger's URL")
    args = parser.parse_args()
    hold = None if args.hold is None else Hold(args.hold, args.hold_file.resolve())
    export_days = tuple(args.export_days) if args.export_days else None
    if args.pg_only and not args.pg:
        parser.error("--pg-only needs --pg")
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp, _pg_server(args.pg) as server:
        work = Path(tmp)
        if args.gpus:
            collect_url = None
            if args.pg_only:
                from tests.support.pg import create_database

                collect_url = create_database(server, prefix="bench_collect_")
            print(json.dumps(bench_collect(args.gpus, work, args.push, args.intervals,
                                           collect_url)), flush=True)
        if args.answer_gpus:
            if not args.pg_only:
                answer = bench_answer(args.answer_gpus, f"sqlite:///{work / 'a.db'}",
                                      args.days, work, args.rollup_days, export_days,
                                      args.hourly_check, hold)
                if answer:
                    print(json.dumps(answer), flush=True)
            if server:
                answer = _pg_answer(args.answer_gpus, server, args.days, work,
                                    args.rollup_days, export_days, args.hourly_check, hold)
                if answer:
                    print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
