"""The inline-SVG charts of the report and the live page.

Three layers: the geometry as arithmetic (a day's segments add up to its column, one segment
per namespace, bars to their totals), the series read from a real ledger (days add up to the
`usage` answer), and the drawn pages in headless Chromium: element sizes as the browser lays
them out, the text a reader gets, and the pixels of a screenshot of each chart.
"""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub import common
from hub import usage as usage_answers
from hub.common import _charts as charts
from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.usage import write_bucket
from tests.support.browser import Browser, Dom
from tests.support.clirun import gpufleet
from tests.support.png import decode

HOSTILE = '<script>alert("ns")</script>'
names = st.sampled_from(["team-a", "team-b", "ml", "infra", "", "x" * 30, HOSTILE, "a", "b",
                         "c", "d", "e", "f", "g"])
days = st.lists(st.tuples(st.sampled_from([f"2026-11-{d:02d}" for d in range(1, 29)]),
                          st.dictionaries(names, st.floats(0, 5000), max_size=12)),
                max_size=20, unique_by=lambda c: c[0])


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


# -- geometry ---------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(days)
def test_each_days_segments_stack_to_its_total(columns):
    geo = charts.stacked_columns(columns)
    assert geo["scale"] >= max([sum(v.values()) for _, v in columns], default=0)
    keys = {k["key"]: k for k in geo["keys"]}
    assert len(keys) <= charts.MAX_KEYS
    for (label, values), col in zip(columns, geo["columns"], strict=True):
        assert col["label"] == label
        assert col["total"] == pytest.approx(sum(values.values()))
        assert col["height"] == pytest.approx(geo["plot_h"] * col["total"] / geo["scale"])
        # the segments stack without gaps from the baseline up to the column's height
        assert sum(s["height"] for s in col["segments"]) == pytest.approx(col["height"])
        bottom = geo["top"] + geo["plot_h"]
        for s in col["segments"]:
            assert s["y"] + s["height"] == pytest.approx(bottom)
            bottom = s["y"]
            assert s["colour"] == keys[s["key"]]["colour"]  # one colour per key, every day
        # one segment per namespace with GPU-hours (or the shared rest), values unchanged
        shown = {s["key"]: s["value"] for s in col["segments"]}
        for k in geo["keys"]:
            members = k.get("members", [k["key"]])
            value = sum(values.get(m, 0.0) for m in members)
            assert shown.get(k["key"], 0.0) == pytest.approx(value)


def test_past_nine_namespaces_the_smallest_share_one_grey_segment():
    columns = [("2026-11-01", {f"ns-{i:02d}": float(100 - i) for i in range(20)})]
    geo = charts.stacked_columns(columns, rest_label="more namespaces")
    assert [k["key"] for k in geo["keys"][:-1]] == [f"ns-{i:02d}" for i in range(8)]
    rest = geo["keys"][-1]
    assert rest["key"] == "12 more namespaces" and rest["colour"] == charts.REST_COLOUR
    assert rest["total"] == pytest.approx(sum(100.0 - i for i in range(8, 20)))
    assert len({k["colour"] for k in geo["keys"]}) == len(geo["keys"])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=40),
                          st.fixed_dictionaries({p: st.floats(0, 1e5)
                                                 for p in charts.CAPACITY_PARTS})),
                max_size=30))
def test_bars_are_their_segments_end_to_end(rows):
    geo = charts.stacked_bars(rows, charts.CAPACITY_PARTS)
    for (_, values), bar in zip(rows, geo["bars"], strict=True):
        assert bar["total"] == pytest.approx(sum(values.values()))
        assert bar["length"] <= geo["bar_w"] + 1e-6
        assert sum(s["width"] for s in bar["segments"]) == pytest.approx(bar["length"])
        x = geo["label_w"]
        for s in bar["segments"]:  # in parts order, each starting where the last ended
            assert s["x"] == pytest.approx(x)
            x += s["width"]
        assert [s["key"] for s in bar["segments"]] == [
            p for p in charts.CAPACITY_PARTS if values[p] > 0]


def test_a_bucket_without_data_breaks_the_line():
    start = dt.datetime(2026, 11, 1)
    at = [start + dt.timedelta(hours=h) for h in range(6)]
    geo = charts.time_lines({"u": list(zip(at, [10.0, 20.0, None, None, 50.0, 100.0],
                                           strict=True))},
                            start=start, end=start + dt.timedelta(hours=6))
    runs = geo["series"]["u"]
    assert [len(r) for r in runs] == [2, 2]
    bottom = geo["top"] + geo["plot_h"]
    assert runs[1][1][1] == pytest.approx(geo["top"])  # 100 % at the top
    assert runs[0][0][1] == pytest.approx(bottom - geo["plot_h"] * 0.1)
    assert runs[0][0][0] == pytest.approx(geo["left"])


def test_a_young_fleets_utilisation_spans_the_chart():
    """Ten minutes of buckets in a 24-hour window: the line runs across the plot (the axis
    starts at the fleet's first bucket), not a few pixels at its right edge."""
    end = dt.datetime(2026, 11, 2, 12)
    points = [{"at": end - dt.timedelta(minutes=10) + dt.timedelta(minutes=m),
               "utilisation_pct": 40.0 + m, "sm_active_pct": None} for m in range(10)]
    dom = Dom(common.utilisation_chart(points, start=end - dt.timedelta(hours=24), end=end))
    [line] = dom.find("polyline")
    xs = [float(p.split(",")[0]) for p in line["attrs"]["points"].split()]
    width = float(dom.find("svg")[0]["attrs"]["width"])
    assert xs[-1] - xs[0] > 0.6 * width, (xs[0], xs[-1], width)
    ticks = [t["text"] for t in dom.find("text") if re.fullmatch(r"\d\d:\d\d:\d\d", t["text"])]
    assert ticks[0] == "11:50:00" and len(set(ticks)) == len(ticks)  # labels that differ


def test_charts_escape_names_and_say_in_words_what_they_show():
    html = "".join([
        common.gpu_hours_by_day_chart([{"day": dt.date(2026, 11, 1), "namespace": HOSTILE,
                                        "gpu_hours": 12.5}]),
        common.idle_gpu_hours_chart([{"namespace": HOSTILE, "idle_allocated_gpu_hours": 3}]),
        common.capacity_chart([{"model": HOSTILE, "allocated": 1, "free": 2, "stale": 3}]),
        common.stale_clusters_chart([{"cluster": HOSTILE, "stale_gpus": 4,
                                      "last_sample_at": None}]),
    ])
    assert "<script>" not in html and "&lt;script&gt;" in html
    dom = Dom(html)
    assert dom.find("script") == []
    svgs = dom.find("svg")
    assert len(svgs) == 4 and all(s["attrs"]["role"] == "img" for s in svgs)
    descs = [e["text"] for e in dom.find("desc")]
    assert "2026-11-01: 12.5 GPU-hours (" + HOSTILE + " 12.5)" in descs[0]
    assert descs[1] == f"{HOSTILE}: 3 GPU-hours"
    assert descs[2] == (f"{HOSTILE}: 6 GPU-equivalents, 2 free (allocated 1, free 2, "
                        "stale 3)")
    assert descs[3] == f"{HOSTILE}: 4 stale GPUs, last sample never"
    assert dom.find("table", id="gpu-hours-by-day-table")  # the figures, folded


def test_sm_activity_is_not_exported_rather_than_zero():
    start = dt.datetime(2026, 11, 1)
    points = [{"at": start + dt.timedelta(hours=h), "utilisation_pct": 40.0,
               "sm_active_pct": None} for h in range(3)]
    dom = Dom(common.utilisation_chart(points, start=start,
                                       end=start + dt.timedelta(hours=3)))
    assert [e["attrs"]["class"] for e in dom.find("polyline")] == ["line utilisation"]
    assert "SM activity: not exported" in dom.find("svg")[0]["text"]
    points[1]["sm_active_pct"] = 30.0
    dom = Dom(common.utilisation_chart(points, start=start,
                                       end=start + dt.timedelta(hours=3)))
    assert [e["attrs"]["class"] for e in dom.find("circle")] == ["line sm_active"]
    assert "not exported" not in dom.find("desc")[0]["text"]


# -- the series from a real ledger --------------------------------------------------------------
HOUR = dt.timedelta(hours=1)


def _fleet(url: str, now: dt.datetime, hours: int = 60) -> None:
    """c1: team-a trains on 2 GPUs at 80 %, team-b holds 1 idle GPU, 1 GPU free at 2 %;
    'gone' was switched off two days ago with 40 GPUs. ``hours`` of hourly buckets."""
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    users = [("GPU-a0", "team-a", "train-0", 80.0), ("GPU-a1", "team-a", "train-1", 80.0),
             ("GPU-b0", "team-b", "notebook", 0.0), ("GPU-free", "", "", 2.0)]
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("gone", f"old-{i // 8}", f"GPU-gone-{i}", "nvidia", index=i % 8,
                        model="A100") for i in range(40)], now - 2 * 24 * HOUR)
        apply_observations(conn, [
            Observation("c1", "n1", uuid, "nvidia", index=i, model="H100",
                        allocations={(ns, pod, "main")} if pod else set())
            for i, (uuid, ns, pod, _) in enumerate(users)], now)
        for h in range(hours, 0, -1):
            start = now - h * HOUR
            rows = [{"cluster": "c1", "node": "n1", "uuid": uuid, "slice": "",
                     "namespace": ns, "pod": pod, "bucket_start": start,
                     "bucket_end": start + HOUR, "vendor": "nvidia", "model": "H100",
                     "gpu_share": 1.0, "gpu_hours": 1.0, "avg_utilisation_pct": util,
                     "max_utilisation_pct": util, "avg_memory_used_mib": 1.0,
                     "max_memory_used_mib": 1.0, "avg_power_w": 100.0, "energy_wh": 100.0,
                     "coverage": 1.0} for uuid, ns, pod, util in users]
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, rows, 14)
    engine.dispose()


#: hours of the day the tests that read "now" run at: each takes its clock as an argument, so
#: none passes or fails by the time of day (00:00-02:00 UTC used to fail: an idle run
#: crossing midnight was judged per day, its short part not idle)
HOURS_OF_DAY = [0, 1, 13, 23]


def _clock(hour: int) -> dt.datetime:
    return dt.datetime(2026, 11, 20, hour)


@pytest.mark.parametrize("hour", HOURS_OF_DAY)
def test_days_add_up_to_the_usage_answer_and_utilisation_is_weighted(tmp_path, hour):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _clock(hour)
    _fleet(url, now)
    engine = _db.make_engine(url)
    start = now - 60 * HOUR
    with engine.connect() as conn:
        daily = usage_answers.daily_by_namespace(conn, start, now)
        whole = usage_answers.usage_summary(conn, start, now, ("namespace",))
        series = usage_answers.utilisation_over_time(conn, now - 24 * HOUR, now)
        scoped = usage_answers.daily_by_namespace(conn, start, now, namespaces={"team-b"})
    engine.dispose()
    for row in whole:
        per_day = [d for d in daily if d["namespace"] == row["namespace"]]
        for figure in ("gpu_hours", "busy_gpu_hours", "idle_allocated_gpu_hours"):
            assert sum(d[figure] for d in per_day) == pytest.approx(row[figure]), figure
    # team-b's notebook idled all 60 hours: one run, every hour of it on some day
    assert sum(d["idle_allocated_gpu_hours"] for d in daily if d["namespace"] == "team-b") \
        == pytest.approx(60.0)
    assert {d["day"] for d in daily} == set(usage_answers.day_starts(start, now))
    assert sum(d["gpu_hours"] for d in daily if d["namespace"] == "team-a") == 120.0
    assert {d["namespace"] for d in scoped} == {"team-b"}
    assert len(series) == 24
    # (80 + 80 + 0 + 2) / 4 GPUs, each 1 GPU-hour
    assert {p["utilisation_pct"] for p in series} == {40.5}
    assert {p["sm_active_pct"] for p in series} == {None}


# -- the pages in Chromium ----------------------------------------------------------------------
COLUMNS_JS = """((id) => [...document.querySelectorAll('#' + id + ' g.column')].map(g => ({
  day: g.dataset.day, total: parseFloat(g.dataset.total),
  segments: [...g.querySelectorAll('rect.segment')].map(r => ({
    key: r.dataset.key, value: parseFloat(r.dataset.value),
    height: r.getBoundingClientRect().height, width: r.getBoundingClientRect().width}))})))"""
BARS_JS = """((id) => [...document.querySelectorAll('#' + id + ' g.bar-row')].map(g => ({
  total: parseFloat(g.dataset.total),
  label: g.getAttribute('data-model') || g.getAttribute('data-cluster') ||
         g.getAttribute('data-namespace'),
  segments: [...g.querySelectorAll('rect.segment')].map(r => ({
    key: r.dataset.key, width: r.getBoundingClientRect().width}))})))"""


def _open(browser: Browser, url: str) -> None:
    browser.send("Emulation.setDeviceMetricsOverride", width=1200, height=900,
                 deviceScaleFactor=1, mobile=False)
    browser.open(url)


def _check_day_columns(browser: Browser, chart: str) -> list[dict]:
    """Per day column as laid out: segment heights proportional to their GPU-hours on one
    scale, so each column's drawn height stands for its total."""
    columns = browser.evaluate(COLUMNS_JS + f"('{chart}')")
    assert len(columns) == 14
    px_per_hour = [s["height"] / s["value"] for c in columns for s in c["segments"]]
    assert px_per_hour and max(px_per_hour) - min(px_per_hour) < 0.02
    for c in columns:
        assert sum(s["value"] for s in c["segments"]) == pytest.approx(c["total"])
        assert sum(s["height"] for s in c["segments"]) == pytest.approx(
            c["total"] * px_per_hour[0], abs=0.5)
        assert all(s["width"] > 8 for s in c["segments"])
    return columns


def _check_screenshot(browser: Browser, selector: str,
                      expected: dict[tuple[int, int, int], float]) -> None:
    """The chart as pixels: each colour covers an area in proportion to what it stands for
    (``expected``: colour -> relative amount), so the drawing says what the numbers say."""
    png, box = browser.screenshot(selector)
    image = decode(png)
    assert image.width == round(box["width"]) and image.height == round(box["height"])
    # less each colour's legend swatch (12 x 12 px)
    counts = {colour: image.count(colour) - 144 for colour in expected}
    assert all(n > 50 for n in counts.values()), counts
    first = next(iter(expected))
    for colour, amount in expected.items():
        ratio = counts[colour] / counts[first]
        assert ratio == pytest.approx(amount / expected[first], rel=0.08), (colour, counts)


def test_the_live_page_draws_its_charts_from_the_ledger(tmp_path):
    from hub.common import html_environment
    from hub.service import USAGE_SECTIONS, read_only_engine
    from hub.service._auth import Scope
    from hub.service._page import page_data

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    _fleet(url, now)
    engine = read_only_engine(url)

    def page(scope: Scope | None = None) -> str:
        data = page_data(engine, search=None, findings=[], findings_at=None,
                         extra=USAGE_SECTIONS, **({"scope": scope} if scope else {}))
        path = tmp_path / f"page-{scope.name if scope else 'all'}.html"
        path.write_text(html_environment().get_template("fleet.html.j2").render(**data))
        return path.as_uri()

    browser = Browser()
    try:
        _open(browser, page())
        dom = browser.dom()
        assert dom.find("script") == []
        for chart in ("usage-by-day-chart", "utilisation-chart", "idle-chart-figure",
                      "capacity-chart-figure", "stale-clusters-chart"):
            assert len(dom.find("figure", id=chart)) == 1
            size = browser.evaluate(f"(() => {{ const r = document.querySelector("
                                    f"'#{chart} svg').getBoundingClientRect();"
                                    " return [r.width, r.height]; })()")
            assert size[0] > 600 and size[1] >= 30, (chart, size)
            assert dom.find("title", id=f"{chart}-title") and dom.find("desc", id=f"{chart}-desc")
        # GPU-hours per day: team-a 2 GPUs, team-b 1, unallocated 1, every hour
        columns = _check_day_columns(browser, "usage-by-day-chart")
        full = [c for c in columns if c["total"] == 96.0]
        assert full and all({s["key"]: s["value"] for s in c["segments"]} == {
            "team-a": 48.0, "team-b": 24.0, "(unallocated)": 24.0} for c in full)
        palette = [_rgb(c) for c in charts.PALETTE]
        _check_screenshot(browser, "#usage-by-day-chart svg",
                          {palette[0]: 2.0, palette[1]: 1.0, palette[2]: 1.0})
        figcaption = dom.find("figure", id="usage-by-day-chart")[0]["text"]
        assert "240 GPU-hours in 14 days" in figcaption
        # utilisation: a line across the day at 40.5 %; SM activity said to be missing
        line = browser.evaluate("(() => { const r = document.querySelector("
                                "'#utilisation-chart polyline').getBoundingClientRect();"
                                " return [r.width, r.height]; })()")
        assert line[0] > 500 and line[1] < 3  # flat: every bucket 40.5 %
        assert "SM activity: not exported" in dom.find("figure", id="utilisation-chart")[0][
            "text"]
        # capacity: H100 3 allocated + 1 free; A100 40 stale: lengths in proportion
        bars = {b["label"]: b for b in browser.evaluate(BARS_JS + "('capacity-chart-figure')")}
        a100 = {s["key"]: s["width"] for s in bars["A100"]["segments"]}
        h100 = {s["key"]: s["width"] for s in bars["H100"]["segments"]}
        assert set(a100) == {"stale"} and set(h100) == {"allocated", "free"}
        assert h100["allocated"] == pytest.approx(3 * h100["free"], rel=0.02)
        assert a100["stale"] == pytest.approx(10 * (h100["allocated"] + h100["free"]),
                                              rel=0.02)
        _check_screenshot(browser, "#capacity-chart-figure svg",
                          {_rgb(charts.PART_COLOURS["stale"]): 40.0,
                           _rgb(charts.PART_COLOURS["allocated"]): 3.0})
        # stale clusters: one line for the 40 GPUs of 'gone', not 40 rows
        rows = [r for r in dom.find("tr") if "data-key" in r["attrs"]
                and dom.elements.index(r) > dom.elements.index(
                    dom.find("table", id="stale-clusters")[0])][:2]
        assert rows[0]["attrs"]["data-key"] == "gone" and "40" in rows[0]["text"]
        assert [e["text"] for e in dom.find("span") if e["attrs"].get("data-count")
                == "stale-clusters"] == ["(1)"]
        stale = browser.evaluate(BARS_JS + "('stale-clusters-chart')")
        assert [(b["label"], b["total"]) for b in stale] == [("gone", 40.0)]
        # idle: team-b's idle GPU, a bar with its GPU-hours
        idle = browser.evaluate(BARS_JS + "('idle-chart-figure')")
        assert [b["label"] for b in idle] == ["team-b"] and idle[0]["segments"][0]["width"] > 100

        # a team's page: its own namespaces and cluster only, in every chart and its words
        _open(browser, page(Scope("team-a", frozenset({"c1"}), frozenset({"team-a"}),
                                  fleet_counts=False)))
        scoped = browser.dom()
        text = json.dumps(scoped.elements)
        assert "team-b" not in text and "gone" not in text and "A100" not in text
        columns = browser.evaluate(COLUMNS_JS + "('usage-by-day-chart')")
        assert {s["key"] for c in columns for s in c["segments"]} == {"team-a"}
    finally:
        browser.close()
        engine.dispose()


def test_the_report_file_draws_the_same_charts(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    _fleet(url, now)
    out = tmp_path / "report.html"
    result = gpufleet("report", "--db", url, "-o", "html", "--out", str(out))
    assert result.exit_code in (0, 1), result.output
    browser = Browser()
    try:
        _open(browser, out.as_uri())
        dom = browser.dom()
        assert dom.find("script") == []
        columns = _check_day_columns(browser, "gpu-hours-by-day")
        assert sum(c["total"] for c in columns) == 240.0
        palette = [_rgb(c) for c in charts.PALETTE]
        _check_screenshot(browser, "#gpu-hours-by-day svg",
                          {palette[0]: 2.0, palette[1]: 1.0, palette[2]: 1.0})
        [stale] = dom.find("figure", id="stale-clusters-chart")
        assert "40 stale GPUs" in stale["text"]
        for chart in ("utilisation", "idle-chart", "capacity-chart"):
            assert dom.find("figure", id=chart), chart
        # the table under <details> opens without script and holds every day's figures
        browser.evaluate("document.querySelector('#gpu-hours-by-day details').open = true")
        height = browser.evaluate("document.getElementById('gpu-hours-by-day-table')"
                                  ".getBoundingClientRect().height")
        assert height > 100
    finally:
        browser.close()


BASE = dt.datetime(2026, 11, 2)
ledger_rows = st.lists(st.tuples(st.integers(0, 5 * 24 - 1),  # hour after BASE
                                 st.sampled_from(["team-a", "team-b", ""]),
                                 st.sampled_from(["GPU-1", "GPU-2"]),
                                 st.floats(0.05, 1.0), st.floats(0, 100)),
                       min_size=1, max_size=40,
                       unique_by=lambda r: (r[0], r[1], r[2]))


@settings(max_examples=25, deadline=None)
@given(ledger_rows, st.integers(0, 5 * 24), st.integers(1, 5 * 24))
def test_a_days_column_is_the_brute_force_sum_of_its_buckets(tmp_path_factory, rows, a, span):
    """Whatever the period's edges (mid-day, whole days, partly collected days), each day's
    GPU-hours per namespace are the sum of the ledger rows starting that day inside the
    period: the rollup's whole days and the hourly edges never count twice or miss."""
    path = tmp_path_factory.mktemp("ledger") / "inv.db"
    engine = _db.make_engine(f"sqlite:///{path}", create=True)
    migrate.ensure_schema(engine)
    by_hour: dict[int, list[dict]] = {}
    for hour, ns, uuid, hours, util in rows:
        start = BASE + hour * HOUR
        by_hour.setdefault(hour, []).append({
            "cluster": "c1", "node": "n1", "uuid": uuid, "slice": "", "namespace": ns,
            "pod": "p" if ns else "", "bucket_start": start, "bucket_end": start + HOUR,
            "vendor": "nvidia", "model": "H100", "gpu_share": 1.0, "gpu_hours": hours,
            "avg_utilisation_pct": util, "max_utilisation_pct": util,
            "avg_memory_used_mib": 1.0, "max_memory_used_mib": 1.0, "avg_power_w": 1.0,
            "energy_wh": 1.0, "coverage": hours})
    with engine.begin() as conn:
        for hour, bucket in by_hour.items():
            write_bucket(conn, (BASE + hour * HOUR).replace(tzinfo=dt.UTC).timestamp(),
                         3600.0, bucket, 1)
    start, end = BASE + a * HOUR, BASE + (a + span) * HOUR
    with engine.connect() as conn:
        got = {(r["day"], r["namespace"]): r["gpu_hours"]
               for r in usage_answers.daily_by_namespace(conn, start, end)}
    engine.dispose()
    oracle: dict[tuple, float] = {}
    for hour, ns, _, hours, _ in rows:
        at = BASE + hour * HOUR
        if start <= at < end:
            key = (at.replace(hour=0), ns or None)
            oracle[key] = oracle.get(key, 0.0) + hours
    assert got.keys() == oracle.keys()
    for key, value in oracle.items():
        assert got[key] == pytest.approx(value, abs=1e-5)
