"""Showback: `usage --prices` and `serve --prices` add what the GPU-hours cost.

The cost arithmetic is checked against a brute-force oracle (hypothesis): random ledger rows
(whole GPUs and MIG slices, two clusters, priced, overridden and unpriced models) written
through the ledger's own writer, priced by usage_summary, and re-priced row by row.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest
import requests
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import usage
from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._ledger import usage as ledger
from hub.inventory._ledger import usage_buckets, usage_daily, write_bucket
from hub.inventory._sync import SyncResult
from hub.service import Jobs, build_service, read_only_engine
from tests.support.clirun import gpufleet

HOUR = dt.timedelta(hours=1)
H100 = "NVIDIA H100 80GB HBM3"
MI300 = "AMD Instinct MI300X"
A100 = "NVIDIA A100-SXM4-40GB"
MODELS = [H100, MI300, A100, None]
SHARES = [1.0, 3 / 7, 1 / 7]
BASE = dt.datetime(2026, 11, 2, 20)  # the buckets cross a day: rollup and ledger both read


def _row(start: dt.datetime, i: int, cluster: str, model: str | None, ns: str,
         share: float, coverage: float) -> dict:
    return {"cluster": cluster, "node": f"{cluster}-n", "uuid": f"GPU-{i}",
            "slice": "" if share == 1.0 else f"MIG-{i}", "namespace": ns,
            "pod": f"p-{i}" if ns else "", "bucket_start": start, "bucket_end": start + HOUR,
            "vendor": "nvidia", "model": model, "gpu_share": share,
            "gpu_hours": share * coverage, "avg_utilisation_pct": 10.0,
            "max_utilisation_pct": 10.0, "avg_memory_used_mib": 1.0,
            "max_memory_used_mib": 1.0, "avg_power_w": 100.0,
            "energy_wh": 100.0 * share * coverage, "coverage": coverage}


gpu = st.tuples(st.sampled_from(["c1", "c2"]), st.sampled_from(MODELS),
                st.sampled_from(["", "team-a", "team-b"]), st.sampled_from(SHARES))
price = st.floats(min_value=0, max_value=50, allow_nan=False)
prices = st.builds(
    lambda models, overrides: usage.Prices(models, overrides),
    st.dictionaries(st.sampled_from([H100, MI300, A100]), price),
    st.dictionaries(st.sampled_from(["c1", "c2"]),
                    st.dictionaries(st.sampled_from([H100, MI300, A100]), price)))


def _oracle(rows: list[dict], table: usage.Prices,
            cols: list[str]) -> dict[tuple, float | None]:
    """Row by row: the price the row's cluster pays for its model, else the fleet's."""
    out: dict[tuple, float | None] = {}
    for r in rows:
        k = tuple(r[c] or None for c in cols)
        out.setdefault(k, 0.0)
        p = None
        if r["model"] is not None:
            p = table.clusters.get(r["cluster"], {}).get(r["model"],
                                                           table.models.get(r["model"]))
        if p is None:
            if r["gpu_hours"] > 0:
                out[k] = None
        elif out[k] is not None:
            out[k] += r["gpu_hours"] * p
    return out


@pytest.fixture
def ledger_engine(db_url):
    engine = _db.make_engine(db_url, create=True)
    migrate.ensure_schema(engine)
    yield engine
    engine.dispose()


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gpus=st.lists(gpu, min_size=1, max_size=8),
       coverage=st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=8,
                                  max_size=8), min_size=1, max_size=6),
       table=prices, by=st.sampled_from([["namespace"], ["cluster"], ["model"],
                                         ["cluster", "namespace"], ["gpu"]]))
def test_cost_is_gpu_hours_times_the_price_row_by_row(ledger_engine, gpus, coverage, table,
                                                      by):
    written: list[dict] = []
    with ledger_engine.begin() as conn:
        for t in (ledger, usage_daily, usage_buckets):
            conn.execute(t.delete())
        for b, covered in enumerate(coverage):
            start = BASE + b * HOUR
            rows = [_row(start, i, *g, covered[i]) for i, g in enumerate(gpus)]
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, rows, 1)
            written += rows
    with ledger_engine.connect() as conn:
        got = usage.usage_summary(conn, BASE - 24 * HOUR, BASE + 24 * HOUR, by, prices=table)
    cols = usage.group_columns(by)
    want = _oracle(written, table, cols)
    assert {tuple(r[c] for c in cols) for r in got} == set(want)
    for r in got:
        expected = want[tuple(r[c] for c in cols)]
        if expected is None:
            assert r["cost"] is None and r["cost_note"].startswith("no price for ")
        else:
            assert r["cost_note"] is None
            assert math.isclose(r["cost"], expected, rel_tol=1e-9, abs_tol=1e-6)


@pytest.mark.parametrize(("text", "problem"), [
    ('"NVIDIA H100 80GB HBM3": -1\n', "0 or more"),
    ('"NVIDIA H100 80GB HBM3": two\n', "must be a number"),
    ('"NVIDIA H100 80GB HBM3": true\n', "must be a number"),
    ('"NVIDIA H100 80GB HBM3": .nan\n', "finite"),
    ("3: 2.5\n", "model names are strings"),
    ("- 2.5\n", "expected a mapping"),
    ("clusters: [a]\n", "clusters: expected a mapping"),
    ('clusters:\n  east:\n    "NVIDIA H100 80GB HBM3": -2\n', "clusters: east"),
    ("a: [\n", "not valid YAML"),
])
def test_a_bad_price_file_is_one_line_and_exit_2(tmp_path, text, problem):
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    result = gpufleet("usage", "--prices", str(path), "--db",
                      f"sqlite:///{tmp_path / 'none.db'}")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and problem in lines[0], result.stderr


def _fleet_db(tmp_path) -> tuple[str, dt.datetime]:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    with engine.begin() as conn:
        for ago in (3, 2, 1):
            start = now - ago * HOUR
            rows = [_row(start, 0, "east", H100, "team-a", 1.0, 1.0),
                    _row(start, 1, "west", H100, "team-a", 3 / 7, 1.0),
                    _row(start, 2, "east", A100, "team-b", 1.0, 0.5)]
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, rows, 1)
    engine.dispose()
    return url, now


PRICES = f'"{H100}": 2.5\nclusters:\n  west:\n    "{H100}": 2.1\n'


def test_usage_prices_in_table_json_csv_and_the_api(tmp_path):
    url, now = _fleet_db(tmp_path)
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES)
    team_a = round(3 * 2.5 + 3 * 3 / 7 * 2.1, 6)  # a MIG slice at its share, west's price

    result = gpufleet("usage", "--since", "30d", "--by", "namespace", "--prices", str(path),
                      "--db", url, "-o", "json")
    assert result.exit_code == 0, result.output
    rows = {r["namespace"]: r for r in json.loads(result.stdout)}
    assert rows["team-a"]["cost"] == team_a and rows["team-a"]["cost_note"] is None
    assert rows["team-b"]["cost"] is None  # never 0 for a model without a price
    assert rows["team-b"]["cost_note"] == f"no price for {A100}"
    assert f"note: no price for {A100}: cost left empty, not 0" in result.stderr

    # the monthly showback export
    csv = gpufleet("usage", "--since", "30d", "--by", "namespace", "--prices", str(path),
                   "--db", url, "-o", "csv")
    assert csv.exit_code == 0, csv.output
    header, *lines = csv.stdout.strip().splitlines()
    assert header.split(",")[-2:] == ["cost", "cost_note"]
    assert f"team-a,{rows['team-a']['gpu_hours']}," in csv.stdout
    assert any(line.startswith("team-a,") and f",{team_a}," in line for line in lines)
    table = gpufleet("usage", "--prices", str(path), "--db", url, env={"COLUMNS": "250"})
    assert "COST" in table.stdout.splitlines()[0], table.stdout
    plain = gpufleet("usage", "--db", url, "-o", "json")
    assert "cost" not in json.loads(plain.stdout)[0]  # no price file, no cost column

    def no_sync() -> SyncResult:
        return SyncResult(now, now, 0, 2, 2, 3)

    service = build_service(Jobs(sync=no_sync), every=3600.0, engine=read_only_engine(url),
                            process_metrics=False, prices=usage.load_prices(path)).start()
    try:
        api = requests.get(service.url + "/api/v1/usage?by=namespace&since=30d",
                           timeout=10).json()["items"]
    finally:
        service.stop()
    assert {r["namespace"]: (r["cost"], r["cost_note"]) for r in api} == {
        ns: (r["cost"], r["cost_note"]) for ns, r in rows.items()}
    with _db.make_engine(url).connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ledger)).scalar() == 9


def test_serve_refuses_a_bad_price_file_before_it_starts(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(f'"{H100}": -2.5\n')
    result = gpufleet("serve", "--prices", str(path), "--hub-url", "http://127.0.0.1:9",
                      "--db", f"sqlite:///{tmp_path / 'inv.db'}")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"error: --prices {path}: '{H100}': the price must be a "
                                     "finite number of 0 or more, not -2.5")
    assert not (tmp_path / "inv.db").exists()  # nothing half-done
