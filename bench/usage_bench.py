"""Usage ledger benchmark: `usage collect` of one hour, and `usage --since 30d` over a month.

Prints two JSON lines.

1. collect: N GPUs (8 a node, pod labels on every other GPU, NVIDIA) with one hour of samples
   every 30 s (GPU_UTIL, FB_USED, POWER_USAGE) backfilled into a real Prometheus with
   ``promtool tsdb create-blocks-from openmetrics``; ``gpufleet usage collect`` of that hour
   runs in a child process (peak RSS read with wait4). Figures: requests (a constant: the
   same at any N), seconds, peak_rss_mb, rows written, database bytes per 1,000 GPU-hours.
2. answer: M GPUs x 30 days of hourly ledger rows written straight into the database, then
   ``usage --by namespace --since 30d`` timed in a child (answer_s, process start included)
   and in process (query_s: the database's part), on SQLite and (with --pg URL) PostgreSQL,
   with the database's query plan of the ledger scan.
"""

from __future__ import annotations

import argparse
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


def write_openmetrics(path: Path, gpus: int, t0: float) -> None:
    series = []
    for i in range(gpus):
        node, g = divmod(i, 8)
        pod = (f',namespace="team-{node % 20}",pod="job-{node}-{g}"' if i % 2 == 0 else
               ',namespace="gpu-operator",pod="nvidia-dcgm-exporter-x"')
        series.append(f'cluster="c{node // 50}",Hostname="n{node}",gpu="{g}",'
                      f'UUID="GPU-{i:08d}",modelName="NVIDIA H100 80GB HBM3"{pod}')
    times = [t0 + 15 + 30 * k for k in range(HOUR // 30)]
    with path.open("w") as out:
        for name, value in (("DCGM_FI_DEV_GPU_UTIL", 40), ("DCGM_FI_DEV_FB_USED", 1000),
                            ("DCGM_FI_DEV_POWER_USAGE", 300)):
            out.write(f"# TYPE {name} gauge\n")
            for labels in series:
                out.writelines(f"{name}{{{labels}}} {value} {t:.3f}\n" for t in times)
        out.write("# EOF\n")


def child(args: list[str]) -> tuple[str, float, float]:
    """Run gpufleet in a child: stdout, seconds, peak RSS MB."""
    cmd = [sys.executable, "-m", "hub", *args]
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, cwd=ROOT)
        _, status, ru = os.wait4(proc.pid, 0)
        took = time.perf_counter() - started
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{args[0]} failed: {proc.stderr.read().decode()}")
        out.seek(0)
        return out.read().decode(), took, ru.ru_maxrss / 1024


def bench_collect(gpus: int, work: Path) -> dict:
    t0 = (time.time() // HOUR) * HOUR - 2 * HOUR
    om = work / "fleet.om"
    write_openmetrics(om, gpus, t0)
    data = work / "hub" / "data"
    data.mkdir(parents=True)
    subprocess.run([require_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics",
                    str(om), str(data)], check=True, capture_output=True)
    om.unlink()
    db_path = work / "usage.db"
    hub = PrometheusProcess(work / "hub", hub_config()).start(timeout=300)
    try:
        iso = dt.datetime.fromtimestamp(t0, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        end = dt.datetime.fromtimestamp(t0 + HOUR, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out, took, rss = child(["usage", "collect", "--hub-url", hub.url, "--db",
                                f"sqlite:///{db_path}", "--from", iso, "--until", end,
                                "--timeout", "600s", "-o", "json"])
    finally:
        hub.stop()
    result = json.loads(out)
    engine = inv.make_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        gpu_hours = conn.execute(sa.select(sa.func.sum(inv.usage.c.gpu_hours))).scalar() or 0
        page_size = conn.exec_driver_sql("PRAGMA page_size").scalar()
        ledger_pages = conn.exec_driver_sql(
            "SELECT sum(pgsize) FROM dbstat WHERE name IN ('usage', 'ix_usage_uuid_bucket')"
            " OR name LIKE 'sqlite_autoindex_usage%'").scalar() if _has_dbstat(conn) else None
    engine.dispose()
    ledger_bytes = ledger_pages or db_path.stat().st_size
    return {"figure": "collect", "gpus": gpus, "requests": result["requests"],
            "seconds": round(took, 2), "peak_rss_mb": round(rss, 1), "rows": result["rows"],
            "gpu_hours": round(gpu_hours, 3),
            "db_bytes_per_1000_gpu_hours": round(ledger_bytes / max(gpu_hours, 1e-9) * 1000),
            "ledger_bytes_measured": "dbstat" if ledger_pages else "whole file",
            "sqlite_page_size": page_size}


def _has_dbstat(conn) -> bool:
    try:
        conn.exec_driver_sql("SELECT 1 FROM dbstat LIMIT 1")
        return True
    except sa.exc.OperationalError:
        return False


def bench_answer(gpus: int, url: str) -> dict:
    engine = inv.make_engine(url, create=True)
    inv.upgrade(engine)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, minute=0, second=0, microsecond=0)
    started = time.perf_counter()
    with engine.begin() as conn:
        for h in range(30 * 24):
            start = now - dt.timedelta(hours=30 * 24 - h)
            conn.execute(inv.usage.insert(), [{
                "bucket_start": start, "bucket_end": start + dt.timedelta(hours=1),
                "cluster": f"c{i // 400}", "node": f"n{i // 8}", "uuid": f"GPU-{i:08d}",
                "slice": "", "namespace": f"team-{i % 20}" if i % 2 == 0 else "",
                "pod": f"job-{i}" if i % 2 == 0 else "", "vendor": "nvidia",
                "model": "NVIDIA H100 80GB HBM3", "gpu_share": 1.0, "gpu_hours": 1.0,
                "avg_utilisation_pct": 40.0, "coverage": 1.0, "energy_wh": 300.0,
            } for i in range(gpus)])
    fill_s = time.perf_counter() - started
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE usage")
    stmt_plan = _plan(engine)
    with engine.connect() as conn:
        began = time.perf_counter()
        usage.usage_summary(conn, now - dt.timedelta(days=30), now + dt.timedelta(hours=1))
        query_s = time.perf_counter() - began
    out, took, rss = child(["usage", "--by", "namespace", "--since", "30d", "--db", url,
                            "-o", "json"])
    engine.dispose()
    return {"figure": "usage --by namespace --since 30d", "database": engine.dialect.name,
            "gpus": gpus, "rows": gpus * 720, "fill_s": round(fill_s, 1),
            "answer_s": round(took, 3), "query_s": round(query_s, 3),
            "groups": len(json.loads(out)),
            "peak_rss_mb": round(rss, 1), "plan": stmt_plan}


def _plan(engine) -> str:
    since = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(days=30)
    with engine.connect() as conn:
        compiled = sa.select(sa.func.sum(inv.usage.c.gpu_hours)).where(
            inv.usage.c.bucket_start >= since).compile(
            dialect=engine.dialect, compile_kwargs={"literal_binds": True})
        prefix = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
        rows = conn.exec_driver_sql(prefix + str(compiled)).all()
    return " | ".join(str(r[-1]) for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=1000, help="GPUs for the collect figure")
    parser.add_argument("--answer-gpus", type=int, default=1000,
                        help="GPUs x 30 days of ledger rows for the answer figure")
    parser.add_argument("--pg", help="also time the answer on this PostgreSQL URL")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        if args.gpus:
            print(json.dumps(bench_collect(args.gpus, work)), flush=True)
        if args.answer_gpus:
            print(json.dumps(bench_answer(args.answer_gpus, f"sqlite:///{work / 'a.db'}")),
                  flush=True)
            if args.pg:
                print(json.dumps(bench_answer(args.answer_gpus, args.pg)), flush=True)


if __name__ == "__main__":
    main()
