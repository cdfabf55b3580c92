"""Showback: `usage --prices` against a brute-force oracle over random ledgers (hypothesis),
and the price file's errors as a user meets them.

The oracle prices every ledger row on its own (share x coverage x hours x the price of its
cluster and model) and adds rows up per group; the answer comes from the database's sums
(whole days from the rollup, the edges from the ledger) grouped by cluster and model.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub import usage
from tests.support.clirun import gpufleet

HOUR = 3600.0
DAY0 = dt.datetime(2026, 10, 1)
T0 = DAY0.replace(tzinfo=dt.UTC).timestamp() + 20 * HOUR  # 20:00 on the first day
MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "AMD Instinct MI300X OAM", None]

row_strategy = st.fixed_dictionaries({
    "gpu": st.integers(0, 5), "cluster": st.sampled_from(["east", "west"]),
    "model": st.sampled_from(MODELS), "namespace": st.sampled_from(["", "ml", "vision"]),
    "share": st.sampled_from([1.0, 3 / 7, 1 / 7]),
    "coverage": st.sampled_from([1.0, 0.5, 2 / 3, 1 / 12]),
})
price = st.floats(0, 50, allow_nan=False).map(lambda p: round(p, 3))
prices_strategy = st.builds(
    usage.Prices,
    models=st.dictionaries(st.sampled_from(MODELS[:3]), price, max_size=3),
    clusters=st.dictionaries(st.sampled_from(["east", "west"]),
                             st.dictionaries(st.sampled_from(MODELS[:3]), price, max_size=2),
                             max_size=2))


def ledger_rows(bucket: int, drawn: list[dict]) -> list[dict]:
    start = T0 + bucket * HOUR
    rows = {}
    for d in drawn:
        key = (d["cluster"], f"n{d['gpu']}", f"GPU-{d['gpu']}", "" if d["share"] == 1 else
               "3g.40gb/1", d["namespace"], f"pod-{d['gpu']}" if d["namespace"] else "")
        rows[key] = {
            "bucket_start": _utc(start), "bucket_end": _utc(start + HOUR),
            "cluster": key[0], "node": key[1], "uuid": key[2], "slice": key[3],
            "namespace": key[4], "pod": key[5], "vendor": "nvidia", "model": d["model"],
            "gpu_share": d["share"], "gpu_hours": d["share"] * d["coverage"],
            "avg_utilisation_pct": 50.0, "max_utilisation_pct": 50.0,
            "avg_power_w": None, "energy_wh": None, "coverage": d["coverage"]}
    return list(rows.values())


def _utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC).replace(tzinfo=None)


def oracle(rows: list[dict], by: list[str], prices: usage.Prices) -> dict:
    out: dict = {}
    for r in rows:
        key = tuple(r[c] or None for c in by)
        group = out.setdefault(key, {"cost": 0.0, "unpriced": 0.0})
        p = prices.price(r["cluster"], r["model"])
        if p is None:
            group["unpriced"] += r["gpu_hours"]
        else:
            group["cost"] += r["gpu_share"] * r["coverage"] * (HOUR / 3600) * p
    return {k: (None if g["unpriced"] > 1e-9 else g["cost"], g["unpriced"])
            for k, g in out.items()}


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(buckets=st.lists(st.lists(row_strategy, min_size=1, max_size=6), min_size=1,
                        max_size=60),
       prices=prices_strategy,
       by=st.sampled_from([["namespace"], ["cluster"], ["model"], ["cluster", "namespace"],
                           ["node"]]))
def test_cost_per_group_equals_the_oracle(tmp_path_factory, buckets, prices, by):
    engine = inv.make_engine(f"sqlite:///{tmp_path_factory.mktemp('s') / 'inv.db'}",
                             create=True)
    inv.ensure_schema(engine)
    written = []
    for b, drawn in enumerate(buckets):
        rows = ledger_rows(b, drawn)
        written += rows
        with engine.begin() as conn:
            usage.write_bucket(conn, T0 + b * HOUR, HOUR, rows, 9)
    with engine.connect() as conn:
        got = usage.usage_summary(conn, _utc(T0), _utc(T0 + 70 * HOUR), by, prices=prices)
    engine.dispose()
    cols = usage.group_columns(by)
    want = oracle(written, cols, prices)
    assert {tuple(r[c] for c in cols) for r in got} == set(want)
    for r in got:
        cost, unpriced = want[tuple(r[c] for c in cols)]
        assert r["unpriced_gpu_hours"] == pytest.approx(unpriced, abs=1e-6)
        if cost is None:
            assert r["cost"] is None
        else:
            assert r["cost"] == pytest.approx(cost, rel=1e-9, abs=1e-6)


def _ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    drawn = [{"gpu": 0, "cluster": "east", "model": MODELS[0], "namespace": "ml",
              "share": 1.0, "coverage": 1.0},
             {"gpu": 1, "cluster": "west", "model": MODELS[0], "namespace": "ml",
              "share": 3 / 7, "coverage": 1.0},
             {"gpu": 2, "cluster": "west", "model": MODELS[1], "namespace": "vision",
              "share": 1.0, "coverage": 0.5}]
    for b in range(3):
        with engine.begin() as conn:
            usage.write_bucket(conn, T0 + b * HOUR, HOUR, ledger_rows(b, drawn), 9)
    engine.dispose()
    return url


PERIOD = ["--from", "2026-10-01T20:00:00Z", "--until", "2026-10-01T23:00:00Z"]


def test_showback_csv_export_with_cluster_override_and_mig_share(tmp_path):
    url = _ledger(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text('"NVIDIA H100 80GB HBM3": 2.5\n"NVIDIA A100-SXM4-80GB": 1.2\n'
                      'clusters:\n  west:\n    "NVIDIA H100 80GB HBM3": 2.1\n')
    out = gpufleet("usage", *PERIOD, "--by", "namespace", "--prices", str(prices), "-o", "csv",
                   env={"GPUFLEET_DB": url})
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0].endswith(",energy_kwh,allocation_basis,cost,unpriced_gpu_hours,period_start,"
                             "period_end,currency")
    rows = {line.split(",")[0]: line.split(",") for line in lines[1:]}
    # ml: 3 h of a whole H100 in east at 2.5 + 3 h of a 3/7 slice of one in west at 2.1
    assert float(rows["ml"][-5]) == pytest.approx(3 * 2.5 + 3 * 3 / 7 * 2.1)
    assert float(rows["vision"][-5]) == pytest.approx(3 * 0.5 * 1.2)
    # the export says which period it bills (no currency named in this price file)
    assert rows["ml"][-3:] == ["2026-10-01T20:00:00.000Z", "2026-10-01T23:00:00.000Z", ""]
    assert out.stderr == ""


def test_showback_names_its_currency_and_flags_prices_nothing_used(tmp_path):
    url = _ledger(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text('currency: EUR\n"NVIDIA H100 80GB HBM3": 2.5\n'
                      '"NVIDIA A100-SXM4-80GB": 1.2\n"NVIDIA H100 80GB  HBM3": 9\n'
                      'clusters:\n  north:\n    "NVIDIA H100 80GB HBM3": 2.1\n')
    out = gpufleet("usage", *PERIOD, "--prices", str(prices), "-o", "json",
                   env={"GPUFLEET_DB": url})
    assert out.exit_code == 0, out.output
    import json

    assert {r["currency"] for r in json.loads(out.stdout)} == {"EUR"}
    [note] = [line for line in out.stderr.splitlines() if line.startswith("note: ")]
    assert "'NVIDIA H100 80GB  HBM3'" in note and "'NVIDIA H100 80GB HBM3' (clusters.north)" \
        in note and "no GPU-hour of the period has" in note
    bad = tmp_path / "bad.yaml"
    bad.write_text('currency: euros\n"NVIDIA H100 80GB HBM3": 2.5\n')
    out = gpufleet("usage", *PERIOD, "--prices", str(bad), env={"GPUFLEET_DB": url})
    assert out.exit_code == 2 and "currency 'euros' is not an ISO 4217 code" in out.stderr


@pytest.mark.parametrize("text, message", [
    ('"NVIDIA H100 80GB HBM3": -1\n', "prices are 0 or more"),
    ('"NVIDIA H100 80GB HBM3": cheap\n', "is 'cheap', not a number"),
    ("- 2.5\n", "expected a mapping of model names"),
    ("clusters: [a]\n", "clusters must map cluster names"),
    ('"NVIDIA H100 80GB HBM3": [2\n', "is not valid YAML"),
    ("1: 2.5\n", "1 is not a model name"),
])
def test_bad_price_files_are_one_line_errors(tmp_path, text, message):
    url = _ledger(tmp_path)
    prices = tmp_path / "prices.yaml"
    prices.write_text(text)
    out = gpufleet("usage", *PERIOD, "--prices", str(prices), env={"GPUFLEET_DB": url})
    assert out.exit_code == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    missing = gpufleet("usage", "--prices", str(tmp_path / "nope.yaml"),
                       env={"GPUFLEET_DB": url})
    assert missing.exit_code == 2 and "cannot read price file" in missing.stderr


def test_the_api_answers_the_same_cost_when_serve_has_prices(tmp_path):
    from hub.service import build_app
    from tests.support.asgi import AppClient, no_metrics

    url = _ledger(tmp_path)
    prices = usage.parse_prices({"NVIDIA H100 80GB HBM3": 2.5, "NVIDIA A100-SXM4-80GB": 1.2,
                                 "clusters": {"west": {"NVIDIA H100 80GB HBM3": 2.1}}})
    engine = inv.make_engine(url)
    app = build_app(engine, health=lambda: (True, {}), findings=lambda: ([], None),
                    metrics=no_metrics, prices=prices)
    status, body = AppClient(app).handle("/api/v1/usage", {
        "from": ["2026-10-01T20:00:00Z"], "until": ["2026-10-01T23:00:00Z"]})
    engine.dispose()
    assert status == 200, body
    cost = {r["namespace"]: r["cost"] for r in body["items"]}
    assert cost["ml"] == pytest.approx(3 * 2.5 + 3 * 3 / 7 * 2.1)
    assert cost["vision"] == pytest.approx(1.8)
    # and the CLI's answer is the same figure
    path = tmp_path / "prices.yaml"
    path.write_text('"NVIDIA H100 80GB HBM3": 2.5\n"NVIDIA A100-SXM4-80GB": 1.2\n'
                    'clusters:\n  west:\n    "NVIDIA H100 80GB HBM3": 2.1\n')
    import json

    cli = json.loads(gpufleet("usage", *PERIOD, "--prices", str(path), "-o", "json",
                              env={"GPUFLEET_DB": url}).stdout)
    assert {r["namespace"]: r["cost"] for r in cli} == cost


def test_serve_refuses_a_bad_price_file_before_it_starts(tmp_path):
    bad = tmp_path / "prices.yaml"
    bad.write_text('"NVIDIA H100 80GB HBM3": -2\n')
    out = gpufleet("serve", "--prices", str(bad), "--hub-url", "http://127.0.0.1:9",
                   "--db", f"sqlite:///{tmp_path / 'inv.db'}")
    assert out.exit_code == 2 and "prices are 0 or more" in out.stderr
