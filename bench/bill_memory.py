"""Peak memory of `gpufleet usage --bill` on a large bill (issue 42: a 100 MB bill took about
1 GB before bills were streamed and folded as read).

Writes an AWS Cost and Usage Report of --mb megabytes (the columns of
docs/examples/bills/aws-cur.csv) in one of two shapes, then runs ``gpufleet usage --bill``
over its month against an empty inventory in a child process and reads its peak RSS:

* ``distinct``: every row its own instance-hour (1,000 instances x 720 hours), the worst case
  for folding: every line is kept;
* ``folded``: 30 rows per instance-hour (one BoxUsage line, 29 data-transfer lines), as a
  real report has them.

Prints one JSON line per shape: the bill's size and rows, seconds and peak_rss_mb of the
command. Figures, not assertions.

    python bench/bill_memory.py [--mb 100] [--shape distinct --shape folded]
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
HEAD = ("identity/LineItemId,identity/TimeInterval,lineItem/LineItemType,"
        "lineItem/UsageStartDate,lineItem/UsageEndDate,lineItem/ProductCode,lineItem/UsageType,"
        "lineItem/ResourceId,lineItem/UsageAmount,lineItem/UnblendedCost,"
        "savingsPlan/SavingsPlanEffectiveCost,reservation/EffectiveCost,pricing/unit\n")
MONTH = dt.datetime(2026, 10, 1)


def write_bill(path: Path, target: int, shape: str) -> int:
    rows = size = 0
    with path.open("w") as f:
        f.write(HEAD)
        size = len(HEAD)
        while size < target:
            per_hour = 1000 if shape == "distinct" else 30_000
            start = MONTH + dt.timedelta(hours=rows // per_hour % 720)
            end = start + dt.timedelta(hours=1)
            timed = shape == "distinct" or rows % 30 == 0
            kind = "USE1-BoxUsage:p5.48xlarge" if timed else "USE1-DataTransfer-Out-Bytes"
            s, e = f"{start:%Y-%m-%dT%H:%M:%SZ}", f"{end:%Y-%m-%dT%H:%M:%SZ}"
            row = (f"l{rows},{s}/{e},Usage,{s},{e},AmazonEC2,{kind},i-{rows % 1000:017x},1,"
                   "98.32,,,Hrs\n")
            f.write(row)
            size += len(row)
            rows += 1
    return rows


def run(tmp: Path, bill: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    db = f"sqlite:///{tmp / 'inv.db'}"
    subprocess.run([sys.executable, "-m", "hub", "db", "upgrade", "--db", db], env=env,
                   check=True, capture_output=True)
    started = time.monotonic()
    child = subprocess.Popen(
        [sys.executable, "-m", "hub", "usage", "--from", "2026-10-01T00:00:00Z", "--until",
         "2026-11-01T00:00:00Z", "--bill", str(bill), "--db", db],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(child.pid, 0)
    seconds = time.monotonic() - started
    if status != 0:
        raise SystemExit(f"usage --bill failed: {child.stderr.read() if child.stderr else ''}")
    # ru_maxrss is in KiB on Linux
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--shape", action="append", choices=["distinct", "folded"])
    args = parser.parse_args()
    for shape in args.shape or ["distinct", "folded"]:
        with tempfile.TemporaryDirectory() as name:
            tmp = Path(name)
            bill = tmp / "cur.csv"
            rows = write_bill(bill, args.mb * 1_000_000, shape)
            figures = run(tmp, bill)
            print(json.dumps({"shape": shape, "bill_mb": round(bill.stat().st_size / 1e6),
                              "rows": rows, **figures}))


if __name__ == "__main__":
    main()
