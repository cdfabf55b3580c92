"""`usage export`: a period's ledger rows as Parquet or CSV, in the ledger's columns or in
FOCUS's, on SQLite and PostgreSQL. An export of a period sums to `usage` of that period,
GPU-hour for GPU-hour, group by group (both read through the real CLI); the rows come in
chunks (one Parquet row group per chunk); bad input is one line, exit 2, and no file.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from hub import inventory as inv
from hub import usage
from tests.support.clirun import gpufleet, gpufleet_json
from tests.test_usage_rollup import DAY0, HOUR, T0, bucket_rows

BUCKETS = 60  # 05:00 on the first day to 17:00 on the third
PERIOD = ("2026-11-01T07:30:00Z", "2026-11-03T11:00:00Z")


def _ledger(url: str, buckets: int = BUCKETS) -> None:
    engine = inv.make_engine(url, create=True)
    inv.upgrade(engine)
    rng = random.Random(11)
    for b in range(buckets):
        rows = bucket_rows(T0 + b * HOUR, rng)
        # a pod named like a spreadsheet formula (CSV must not let it run)
        rows[1]["pod"] = "=HYPERLINK(\"http://x\")"
        with engine.begin() as conn:
            usage.write_bucket(conn, T0 + b * HOUR, HOUR, rows, 9)
    engine.dispose()


def _export(url: str, out: Path, *extra: str, period=PERIOD):
    return gpufleet("usage", "export", "--from", period[0], "--until", period[1], "--out",
                    str(out), *extra, env={"GPUFLEET_DB": url})


def _sums(rows, key, hours) -> dict:
    out: dict = {}
    for r in rows:
        k = key(r)
        out[k] = out.get(k, 0.0) + hours(r)
    return out


def _usage(url: str, by: str, period=PERIOD) -> dict:
    answer = gpufleet_json("usage", "--from", period[0], "--until", period[1], "--by", by,
                           env={"GPUFLEET_DB": url})
    return {r[by]: r for r in answer}


def test_parquet_and_csv_exports_equal_usage_of_the_period(db_url, tmp_path):
    _ledger(db_url)
    by_ns = _usage(db_url, "namespace")
    by_cluster = _usage(db_url, "cluster")
    pq_file, csv_file = tmp_path / "month.parquet", tmp_path / "month.csv"
    done = _export(db_url, pq_file, "--format", "parquet")
    assert done.exit_code == 0, done.output
    assert "rows" in done.stderr and str(pq_file) in done.stderr
    table = pq.read_table(pq_file)
    assert table.column_names == inv.USAGE_COLUMNS
    assert pq.ParquetFile(pq_file).metadata.row_group(0).column(0).compression == "ZSTD"
    rows = table.to_pylist()
    start = dt.datetime(2026, 11, 1, 7, 30, tzinfo=dt.UTC)
    end = dt.datetime(2026, 11, 3, 11, tzinfo=dt.UTC)
    assert rows and all(start <= r["bucket_start"] < end for r in rows)
    # every bucket of the period, and none outside it: 08:00 on day 1 .. 10:00 on day 3
    assert len({r["bucket_start"] for r in rows}) == 16 + 24 + 11
    per_ns = _sums(rows, lambda r: r["namespace"] or None, lambda r: r["gpu_hours"])
    assert set(per_ns) == set(by_ns)
    for ns, hours in per_ns.items():
        assert hours == pytest.approx(by_ns[ns]["gpu_hours"], abs=1e-5)
        busy = sum(r["gpu_hours"] * (r["avg_utilisation_pct"] or 0) / 100 for r in rows
                   if (r["namespace"] or None) == ns)
        assert busy == pytest.approx(by_ns[ns]["busy_gpu_hours"], abs=1e-5)
    assert _export(db_url, csv_file, "--format", "csv").exit_code == 0
    with csv_file.open(newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert list(lines[0]) == inv.USAGE_COLUMNS and len(lines) == len(rows)
    per_cluster = _sums(lines, lambda r: r["cluster"], lambda r: float(r["gpu_hours"]))
    assert per_cluster == pytest.approx({c: r["gpu_hours"] for c, r in by_cluster.items()},
                                        abs=1e-5)
    # the formula-shaped pod is text to a spreadsheet; negative numbers stay numbers
    assert {r["pod"] for r in lines} >= {"'=HYPERLINK(\"http://x\")"}
    assert lines[0]["bucket_start"] == "2026-11-01T08:00:00.000Z"


def test_focus_export_names_charges_as_focus_does(db_url, tmp_path):
    _ledger(db_url)
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nH100: 2.5\nclusters:\n  c1:\n    A100: 1.5\n")
    out = tmp_path / "focus.parquet"
    done = _export(db_url, out, "--format", "parquet", "--focus", "--prices", str(prices))
    assert done.exit_code == 0, done.output
    rows = pq.read_table(out).to_pylist()
    assert list(rows[0]) == usage.FOCUS_COLUMNS
    by_ns = _usage(db_url, "namespace")
    per_ns = _sums(rows, lambda r: json.loads(r["Tags"]).get("namespace"),
                   lambda r: r["x_GpuHours"])
    assert per_ns == pytest.approx({n: r["gpu_hours"] for n, r in by_ns.items()}, abs=1e-5)
    sm = _sums(rows, lambda r: json.loads(r["Tags"]).get("namespace"),
               lambda r: r["x_SmActiveGpuHours"] or 0.0)
    assert all(sm[n] == pytest.approx(r["sm_active_gpu_hours"] or 0.0, abs=1e-5)
               for n, r in by_ns.items())
    for r in rows:
        tags = json.loads(r["Tags"])
        assert r["ConsumedQuantity"] == r["x_GpuHours"] and r["ChargeCategory"] == "Usage"
        assert r["ChargePeriodEnd"] - r["ChargePeriodStart"] == dt.timedelta(hours=1)
        assert {"cluster", "node"} <= set(tags) and ("pod" in tags) == ("namespace" in tags)
        price = {("c0", "H100"): 2.5, ("c1", "H100"): 2.5, ("c1", "A100"): 1.5}.get(
            (tags["cluster"], r["SkuId"]))
        if price is None:  # unpriced is empty, never 0
            assert r["BilledCost"] is None and r["EffectiveCost"] is None
        else:
            assert r["BilledCost"] == pytest.approx(r["x_GpuHours"] * price)
            assert r["BillingCurrency"] == "EUR"
        assert r["ResourceType"] == ("MIG slice" if "/" in r["ResourceId"] else "GPU")
        if "pod" not in tags:
            assert r["x_AllocatedGpuHours"] == 0 and r["x_AllocationBasis"] is None
    assert any(r["ResourceType"] == "MIG slice" for r in rows)
    # the same charges as CSV: FOCUS's header, the same GPU-hours per namespace
    as_csv = tmp_path / "focus.csv"
    assert _export(db_url, as_csv, "--format", "csv", "--focus").exit_code == 0
    with as_csv.open(newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert list(lines[0]) == usage.FOCUS_COLUMNS and len(lines) == len(rows)
    assert {r["BilledCost"] for r in lines} == {""}  # no --prices: no cost, not 0
    per_ns = _sums(lines, lambda r: json.loads(r["Tags"]).get("namespace"),
                   lambda r: float(r["x_GpuHours"]))
    assert per_ns == pytest.approx({n: r["gpu_hours"] for n, r in by_ns.items()}, abs=1e-5)
    assert lines[0]["ChargePeriodStart"].endswith("Z")


def test_the_rows_stream_in_chunks(tmp_path):
    """The database's rows come ``chunk`` at a time (what an export holds as Python
    objects), and the Parquet file's row groups have ``row_group`` rows whatever the chunks
    (what its readers skip by): a file made from chunks of 10 rows is byte for byte the one
    made from chunks of a whole row group."""
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _ledger(url, buckets=8)
    engine = inv.make_engine(url)
    seen: list[int] = []
    with engine.connect() as conn:
        done = usage.export_usage(conn, DAY0, DAY0 + dt.timedelta(days=1),
                                  str(tmp_path / "x.parquet"), fmt="parquet", focus=True,
                                  chunk=10, row_group=25, on_chunk=seen.append)
        usage.export_usage(conn, DAY0, DAY0 + dt.timedelta(days=1),
                           str(tmp_path / "y.parquet"), fmt="parquet", focus=True, chunk=25,
                           row_group=25)
        total = conn.execute(sa.select(sa.func.count()).select_from(inv.usage)).scalar()
    assert done.rows == total == sum(seen) == 8 * 12 and max(seen) == 10
    meta = pq.ParquetFile(tmp_path / "x.parquet").metadata
    assert [meta.row_group(g).num_rows for g in range(meta.num_row_groups)] == [25, 25, 25, 21]
    assert (tmp_path / "x.parquet").read_bytes() == (tmp_path / "y.parquet").read_bytes()


def _one_line_no_file(result, message: str, where: Path) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not [p for p in where.iterdir() if p.name.startswith(".")], list(where.iterdir())


def test_bad_input_is_one_line_and_leaves_no_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _ledger(url, buckets=3)
    kept = tmp_path / "kept.csv"
    kept.write_text("mine\n")
    r = _export(url, kept, "--format", "csv")
    _one_line_no_file(r, "exists; add --force", tmp_path)
    assert kept.read_text() == "mine\n"
    assert _export(url, kept, "--format", "csv", "--force").exit_code == 0
    assert kept.read_text().startswith("cluster,node,uuid")
    r = _export(url, tmp_path / "x.xlsx", "--format", "xlsx")
    _one_line_no_file(r, "--format 'xlsx' is not one of parquet, csv", tmp_path)
    r = _export(url, tmp_path / "nowhere" / "x.csv", "--format", "csv")
    _one_line_no_file(r, "does not exist", tmp_path)
    blocker = tmp_path / "afile"
    blocker.write_text("")
    r = _export(url, blocker / "x.csv", "--format", "csv")
    _one_line_no_file(r, "does not exist", tmp_path)
    # a directory nobody may write to, root included (sysfs is read-only)
    r = _export(url, Path("/sys/usage.csv"), "--format", "csv")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.output
    assert "cannot write /sys/usage.csv" in r.stderr or "is not writable" in r.stderr
    assert not Path("/sys/usage.csv").exists()
    r = _export(url, tmp_path / "ages.parquet", "--format", "parquet",
                period=("2000-01-01T00:00:00Z", "2026-01-01T00:00:00Z"))
    _one_line_no_file(r, "buckets of 1h (at most 100,000)", tmp_path)
    assert not (tmp_path / "ages.parquet").exists()
    r = _export(url, tmp_path / "z.csv", "--format", "csv", period=(PERIOD[1], PERIOD[0]))
    _one_line_no_file(r, "--until must be after --from", tmp_path)
    r = _export(url, tmp_path / "z.csv", "--format", "csv", "--prices", str(kept))
    _one_line_no_file(r, "add --focus", tmp_path)
    r = gpufleet("usage", "export", "--from", PERIOD[0], "--format", "csv", "--out",
                 str(tmp_path / "y.csv"), env={"GPUFLEET_DB": url})
    _one_line_no_file(r, "--until is required", tmp_path)


def test_an_error_mid_export_leaves_no_file(tmp_path):
    """A failure after rows were written (here: the caller's callback raises on the second
    chunk) removes the temporary file; the target never appears."""
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _ledger(url, buckets=4)
    engine = inv.make_engine(url)
    out = tmp_path / "half.csv"

    def boom(n: int, calls: list[int] = []) -> None:  # noqa: B006
        calls.append(n)
        if len(calls) == 2:
            raise RuntimeError("disk went away")

    with engine.connect() as conn, pytest.raises(RuntimeError):
        usage.export_usage(conn, DAY0, DAY0 + dt.timedelta(days=1), str(out), fmt="csv",
                           chunk=12, on_chunk=boom)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("inv.db")] == []


@pytest.mark.parametrize("text, expected", [
    ("=1+2", "'=1+2"), ("+cmd", "'+cmd"), ("-x", "'-x"), ("@SUM(A1)", "'@SUM(A1)"),
    ("\tx", "'\tx"), ("\rx", "'\rx"), ("team-a", "team-a"), ("", ""), (-1.5, -1.5),
])
def test_formula_cells_are_quoted(text, expected):
    assert usage.safe_cell(text) == expected


def test_sigterm_mid_export_leaves_no_file(tmp_path):
    """`usage export` stopped by SIGTERM (a pod's shutdown, a cron's timeout) while rows are
    being written: the temporary file is removed and --out never appears."""
    import os
    import signal
    import subprocess
    import sys
    import time

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _ledger(url, buckets=1)
    engine = inv.make_engine(url)
    with engine.begin() as conn:  # a month of 200 GPUs (144,000 rows), made in SQL at once
        hours = ("WITH RECURSIVE h(k) AS (SELECT 0 UNION ALL SELECT k + 1 FROM h WHERE "
                 "k < 719) ")
        gpus = "WITH RECURSIVE g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < 199) "
        at = "strftime('%Y-%m-%d %H:%M:%S.000000', '2026-12-01', '+' || {} || ' hours')"
        conn.exec_driver_sql(
            "INSERT INTO usage_places (id, cluster, node, uuid, slice, vendor, model, "
            f"gpu_share) {gpus} SELECT 1000 + i, 'c', 'n' || (i / 8), 'GPU-' || i, '', "
            "'nvidia', 'H100', 1.0 FROM g")
        conn.exec_driver_sql(f"INSERT INTO usage_pods (id, namespace, pod) {gpus} "
                             "SELECT 1000 + i, 'ns', 'p' || i FROM g")
        conn.exec_driver_sql(
            "INSERT INTO usage_buckets (bucket_start, bucket_end, collected_at, rows, "
            f"requests) {hours} SELECT {at.format('k')}, {at.format('(k + 1)')}, "
            f"{at.format('(k + 1)')}, 200, 1 FROM h")
        conn.exec_driver_sql(
            "INSERT INTO usage_rows (bucket_start, place, pod, gpu_hours, coverage, basis) "
            f"{hours}, g(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM g WHERE i < 199) "
            f"SELECT {at.format('k')}, 1000 + i, 1000 + i, 1.0, 1.0, 2 FROM h CROSS JOIN g")
    engine.dispose()
    out = tmp_path / "month.csv"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "usage", "export", "--db", url, "--from",
         "2026-12-01T00:00:00Z", "--until", "2027-01-01T00:00:00Z", "--format", "csv",
         "--focus", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    deadline = time.monotonic() + 60
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".month.csv.")]:
        assert proc.poll() is None and not out.exists(), "finished before it could be stopped"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("inv.db")] == []


def test_a_parquet_export_never_imports_pandas(tmp_path):
    """pyarrow imports pandas to ask whether a Python list it converts is a pandas object:
    46 MB an export would carry to its end (a month at 100,000 GPUs must stay under 300 MB).
    The real command in a fresh process, with and without FOCUS and prices, lists every
    module it imports (python -X importtime): pandas is not among them."""
    import os
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _ledger(url, buckets=3)
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nH100: 2.5\n")
    for n, extra in enumerate([[], ["--focus"], ["--focus", "--prices", str(prices)]]):
        out = tmp_path / f"x{n}.parquet"
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "hub", "usage", "export", "--db", url,
             "--from", "2026-11-01T00:00:00Z", "--until", "2026-11-02T00:00:00Z", "--format",
             "parquet", *extra, "--out", str(out)], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert proc.returncode == 0, proc.stderr
        imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "pyarrow.parquet" in imported and pq.ParquetFile(out).metadata.num_rows > 0
        assert not {m for m in imported if m.split(".")[0] == "pandas"}, extra
