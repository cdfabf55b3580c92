"""CSV exports are safe to open: a name a spoke controls (a namespace, a pod, a label) that
would start a spreadsheet formula is written with OWASP's leading single quote, in every
``-o csv`` the CLI writes; numbers stay numbers."""

from __future__ import annotations

import csv
import datetime as dt
import io
from pathlib import Path

import pytest

from hub import inventory as inv
from hub import usage
from hub.common import csv_cell, frame_to_csv
from hub.common._output import to_csv
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.store import range_frame
from tests.support.clirun import gpufleet

#: one hostile name per character OWASP lists, and what a spreadsheet must be shown instead
HOSTILE = {
    "=HYPERLINK(\"http://x\",\"y\")": "'=HYPERLINK(\"http://x\",\"y\")",
    "+cmd|' /C calc'!A0": "'+cmd|' /C calc'!A0",
    "-2+3": "'-2+3",
    "@SUM(1,1)": "'@SUM(1,1)",
    "\t=1+1": "'\t=1+1",
    "\r=1+1": "'\r=1+1",
}


def _read(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_the_shared_writer_escapes_formula_starts_and_keeps_numbers():
    rows = [{"name": name, "n": -1.5, "m": -3, "ok": "ml-team"} for name in HOSTILE]
    got = _read(to_csv(rows, ["name", "n", "m", "ok"]))
    assert [r["name"] for r in got] == list(HOSTILE.values())
    # a negative number is a value, not a formula: unescaped, a spreadsheet sums it
    assert {(r["n"], r["m"]) for r in got} == {("-1.5", "-3")}
    assert {r["ok"] for r in got} == {"ml-team"}  # a dash inside a name is left alone
    assert csv_cell(-0.25) == -0.25 and csv_cell(None) is None and csv_cell("a=b") == "a=b"


def test_query_range_frame_escapes_label_values_and_keeps_values_numeric():
    matrix = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "pod": name},
               "values": [[1_790_000_000, "-1.5"]]} for name in HOSTILE]
    got = _read(frame_to_csv(range_frame(matrix)))
    assert sorted(r["pod"] for r in got) == sorted(HOSTILE.values())
    assert {r["value"] for r in got} == {"-1.5"}
    assert {r["__name__"] for r in got} == {"DCGM_FI_DEV_GPU_UTIL"}


HOUR = 3600.0
T0 = dt.datetime(2026, 10, 1, 20, tzinfo=dt.UTC)
PERIOD = ["--from", "2026-10-01T20:00:00Z", "--until", "2026-10-01T22:00:00Z"]


def _naive(ts: dt.datetime) -> dt.datetime:
    return ts.replace(tzinfo=None)


def _usage_ledger(url: str) -> None:
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    for b in range(2):
        start = T0 + dt.timedelta(hours=b)
        rows = [{"bucket_start": _naive(start), "bucket_end": _naive(start) +
                 dt.timedelta(hours=1), "cluster": "east", "node": "n1",
                 "uuid": f"GPU-{i}", "slice": "", "namespace": name, "pod": name,
                 "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "gpu_share": 1.0,
                 "gpu_hours": 1.0, "avg_utilisation_pct": 50.0, "max_utilisation_pct": 50.0,
                 "avg_power_w": None, "energy_wh": None, "coverage": 1.0}
                for i, name in enumerate(HOSTILE)]
        with engine.begin() as conn:
            usage.write_bucket(conn, start.timestamp(), HOUR, rows, 9)
    engine.dispose()


def test_usage_showback_csv_escapes_namespaces(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _usage_ledger(url)
    prices = tmp_path / "prices.yaml"
    prices.write_text('currency: EUR\n"NVIDIA H100 80GB HBM3": 2.5\n')
    out = gpufleet("usage", *PERIOD, "--by", "namespace", "--prices", str(prices),
                   "-o", "csv", env={"GPUFLEET_DB": url})
    assert out.exit_code == 0, out.output
    got = _read(out.stdout)
    assert sorted(r["namespace"] for r in got) == sorted(HOSTILE.values())
    # the figures are still plain numbers: 2 h of a whole H100 at 2.5 each
    assert [float(r["cost"]) for r in got] == pytest.approx([5.0] * len(HOSTILE))
    assert [float(r["gpu_hours"]) for r in got] == pytest.approx([2.0] * len(HOSTILE))


def test_inventory_allocations_csv_escapes_what_a_spoke_names(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("east", "n1", f"GPU-{i}", "nvidia", index=i, model="H100",
                        allocations={(name, name, name)})
            for i, name in enumerate(HOSTILE)], _naive(T0))
    engine.dispose()
    out = gpufleet("inventory", "allocations", "-o", "csv", env={"GPUFLEET_DB": url})
    assert out.exit_code == 0, out.output
    got = _read(out.stdout)
    for column in ("namespace", "pod", "container"):
        assert sorted(r[column] for r in got) == sorted(HOSTILE.values()), column
    assert {r["uuid"] for r in got} == {f"GPU-{i}" for i in range(len(HOSTILE))}
