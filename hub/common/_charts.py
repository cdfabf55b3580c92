"""Charts drawn on the server as inline SVG, for the report file and the live page alike.

Why on the server and by hand: both pages must work offline, without script and behind a
Content-Security-Policy that forbids every other origin, so a JavaScript charting library is
out; and the shapes needed (stacked columns, lines, horizontal bars) are a few rectangles
and polylines each, less code than vendoring a library would be.

Each chart is two plain functions: a *geometry* function (plain data in, plain dicts of
rectangles and points out, tested for arithmetic: bars sum to totals, one segment per key)
and a *render* function that turns it into a ``<figure>``: an ``<svg role="img">`` with
``<title>`` and ``<desc>`` (the figures in words, for screen readers and text browsers), a
``<figcaption>``, and optionally a table of the same figures. The callers choose and scope
the data (a team's page passes its own namespaces only); nothing here reads a database.

Everything shown is escaped here (``html.escape``): a hostile namespace or cluster name is
text. The return values are HTML strings; Jinja2 callers mark them safe. Standard library
only, because hub.common is shared with the spoke exporter.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any, NotRequired, TypedDict

#: Tableau 10: distinguishable in print and for the common colour-vision deficiencies
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f")
REST_COLOUR = "#bab0ac"
#: fixed meanings: capacity parts and the time series
PART_COLOURS = {"allocated": "#4e79a7", "free": "#59a14f", "stale": "#bab0ac"}
SERIES_COLOURS = {"utilisation": "#4e79a7", "sm_active": "#f28e2b"}
#: the most keys (namespaces) a stacked chart colours; the rest share one grey segment
MAX_KEYS = len(PALETTE)
WIDTH = 760
FONT = "font-family:system-ui,sans-serif;font-size:12px"
UNALLOCATED = "(unallocated)"


def _x(text: Any) -> str:
    return escape(str(text), quote=True)


def _num(value: float) -> str:
    """A figure as people read it: 12.5, 0.25, 1,234; a tiny one as <0.01, never 0 above a
    table that holds 0.002 (the tables round with the same rule: hub.common.for_people)."""
    if value == 0:
        return "0"
    if abs(value) < 0.01:
        return "<0.01" if value > 0 else ">-0.01"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value`` (an axis end people read)."""
    if value <= 1e-12 or not math.isfinite(value):
        return 1.0  # nothing to draw (and 10**k of a subnormal value underflows to 0)
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def _ticks(top: float, count: int = 4) -> list[float]:
    return [top * i / count for i in range(count + 1)]


def _short(label: str, limit: int = 22) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _day_label(day: Any) -> str:
    if isinstance(day, dt.datetime | dt.date):
        return day.strftime("%Y-%m-%d")
    return str(day)[:10]


# -- stacked columns: GPU-hours per day by namespace --------------------------------------------
class _LegendKey(TypedDict):
    """One key of a stacked chart's legend: a namespace, or the grey rest of them."""

    key: str
    colour: str
    total: float
    members: NotRequired[list[str]]  # the rest's keys; absent on a key of its own


def stacked_columns(columns: Sequence[tuple[str, Mapping[str, float]]], *,
                    max_keys: int = MAX_KEYS, width: float = WIDTH, height: float = 220,
                    left: float = 56, top: float = 22, bottom: float = 36,
                    rest_label: str = "others") -> dict[str, Any]:
    """Geometry of stacked columns: one column per (label, {key: value}), one segment per key.

    Keys are ranked by their total over all columns; the first ``max_keys`` get a colour each
    (the same key the same colour in every column) and the rest are summed into one grey
    ``rest_label`` segment, so the legend stays readable with 200 namespaces. Segment heights
    are proportional to values on one scale (0 .. a round number above the tallest column),
    so a column's segments add up to its total's height.
    """
    totals: dict[str, float] = {}
    for _, values in columns:
        for key, value in values.items():
            totals[key] = totals.get(key, 0.0) + max(0.0, float(value))
    ranked = sorted(totals, key=lambda k: (-totals[k], k))
    shown = ranked if len(ranked) <= max_keys else ranked[: max_keys - 1]
    rest = [k for k in ranked if k not in shown]
    keys: list[_LegendKey] = [{"key": k, "colour": PALETTE[i % len(PALETTE)], "total": totals[k]}
                             for i, k in enumerate(shown)]
    if rest:
        keys.append({"key": f"{len(rest)} {rest_label}", "colour": REST_COLOUR,
                     "total": sum(totals[k] for k in rest), "members": rest})
    column_totals = [sum(max(0.0, float(v)) for v in values.values()) for _, values in columns]
    scale = nice_ceiling(max(column_totals, default=0.0))
    plot_h = height - top - bottom
    plot_w = width - left - 8
    slot = plot_w / max(1, len(columns))
    bar_w = max(2.0, min(48.0, slot * 0.7))
    out = []
    for i, ((label, values), total) in enumerate(zip(columns, column_totals, strict=True)):
        x = left + i * slot + (slot - bar_w) / 2
        y = top + plot_h
        segments = []
        parts = [(k["key"], k["colour"],
                  sum(max(0.0, float(values.get(m, 0.0))) for m in k.get("members", [k["key"]])))
                 for k in keys]
        for key, colour, value in parts:
            if value <= 0:
                continue
            h = plot_h * value / scale
            y -= h
            segments.append({"key": key, "value": value, "colour": colour, "x": x,
                             "y": y, "width": bar_w, "height": h})
        out.append({"label": label, "total": total, "x": x, "width": bar_w,
                    "height": plot_h * total / scale, "segments": segments})
    ticks = [{"value": v, "y": top + plot_h - plot_h * v / scale} for v in _ticks(scale)]
    return {"columns": out, "keys": keys, "scale": scale, "ticks": ticks, "width": width,
            "height": height, "left": left, "top": top, "plot_h": plot_h, "plot_w": plot_w}


def _figure(chart_id: str, title: str, desc: str, svg_body: str, width: float, height: float,
            caption: str, table: str = "") -> str:
    return (f'<figure class="chart" id="{_x(chart_id)}">'
            f'<svg xmlns="http://www.w3.org/2000/svg" role="img" '
            f'aria-labelledby="{_x(chart_id)}-title {_x(chart_id)}-desc" '
            f'width="{width:g}" height="{height:g}" viewBox="0 0 {width:g} {height:g}" '
            f'style="max-width:100%;height:auto;{FONT}">'
            f'<title id="{_x(chart_id)}-title">{_x(title)}</title>'
            f'<desc id="{_x(chart_id)}-desc">{_x(desc)}</desc>{svg_body}</svg>'
            f'<figcaption class="meta">{_x(caption)}</figcaption>{table}</figure>')


def _table(chart_id: str, headings: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The chart's figures as a table, folded under <details> (opens without script)."""
    head = "".join(f"<th>{_x(h)}</th>" for h in headings)
    body = "".join(
        "<tr>" + "".join(f'<td class="num">{_x(_num(c))}</td>' if isinstance(c, int | float)
                         else f"<td>{_x(c)}</td>" for c in row) + "</tr>"
        for row in rows)
    return (f'<details class="chart-data"><summary>The figures as a table</summary>'
            f'<table id="{_x(chart_id)}-table"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></details>")


def _y_axis(geo: Mapping[str, Any], unit: str) -> str:
    parts = []
    for t in geo["ticks"]:
        y = t["y"]
        parts.append(f'<line x1="{geo["left"]:g}" x2="{geo["width"] - 8:g}" y1="{y:.1f}" '
                     f'y2="{y:.1f}" stroke="#e4e4e4"/>'
                     f'<text x="{geo["left"] - 6:g}" y="{y + 4:.1f}" text-anchor="end" '
                     f'fill="#555">{_x(_num(t["value"]))}</text>')
    parts.append(f'<text x="4" y="{geo["top"] - 12:g}" fill="#555" font-size="10">'
                 f"{_x(unit)}</text>")
    return "".join(parts)


def _legend(items: Sequence[tuple[str, str]], x: float, y: float,
            width: float) -> tuple[str, float]:
    """Legend swatches in rows; (svg, height used)."""
    parts, cx, cy = [], x, y
    for label, colour in items:
        text = _short(label, 28)
        w = 18 + 7 * len(text) + 14
        if cx + w > width and cx > x:
            cx, cy = x, cy + 18
        parts.append(f'<g class="legend-item" data-key="{_x(label)}">'
                     f'<rect x="{cx:g}" y="{cy:g}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{cx + 16:g}" y="{cy + 10:g}">{_x(text)}</text></g>')
        cx += w
    return "".join(parts), cy - y + 18


def gpu_hours_by_day_chart(rows: Sequence[Mapping[str, Any]], *,
                           days: Sequence[Any] | None = None,
                           chart_id: str = "gpu-hours-by-day", table: bool = True) -> str:
    """GPU-hours per day, one column per day stacked by namespace.

    ``rows``: ``{"day", "namespace", "gpu_hours"}`` (namespace None or "" = unallocated);
    ``days``: every day to show, in order, so a day without usage is an empty column rather
    than a missing one (default: the days in ``rows``).
    """
    by_day: dict[str, dict[str, float]] = {}
    for day in days or []:
        by_day.setdefault(_day_label(day), {})
    for r in rows:
        values = by_day.setdefault(_day_label(r["day"]), {})
        ns = r.get("namespace") or UNALLOCATED
        values[ns] = values.get(ns, 0.0) + float(r.get("gpu_hours") or 0.0)
    columns = sorted(by_day.items()) if days is None else list(by_day.items())
    geo = stacked_columns(columns, rest_label="more namespaces")
    legend, legend_h = _legend([(k["key"], k["colour"]) for k in geo["keys"]],
                               geo["left"], geo["height"] - 14, geo["width"])
    height = geo["height"] + legend_h
    body = [_y_axis(geo, "GPU-hours")]
    every = max(1, math.ceil(len(geo["columns"]) / 14))
    for i, col in enumerate(geo["columns"]):
        body.append(f'<g class="column" data-day="{_x(col["label"])}" '
                    f'data-total="{col["total"]:.6f}">')
        for s in col["segments"]:
            body.append(f'<rect class="segment" data-key="{_x(s["key"])}" '
                        f'data-value="{s["value"]:.6f}" x="{s["x"]:.2f}" y="{s["y"]:.2f}" '
                        f'width="{s["width"]:.2f}" height="{s["height"]:.2f}" '
                        f'fill="{s["colour"]}"><title>{_x(col["label"])} · {_x(s["key"])}: '
                        f'{_x(_num(s["value"]))} GPU-hours</title></rect>')
        if i % every == 0:
            body.append(f'<text x="{col["x"] + col["width"] / 2:.1f}" '
                        f'y="{geo["top"] + geo["plot_h"] + 14:.1f}" text-anchor="middle" '
                        f'fill="#555">{_x(col["label"][5:])}</text>')
        body.append("</g>")
    body.append(legend)
    total = sum(c["total"] for c in geo["columns"])
    if not geo["columns"] or total == 0:
        body.append(f'<text x="{geo["left"] + 10:g}" y="{geo["top"] + 30:g}">'
                    "No usage collected in these days.</text>")
    desc = "; ".join(
        f"{c['label']}: {_num(c['total'])} GPU-hours"
        + (" (" + ", ".join(f"{s['key']} {_num(s['value'])}" for s in c["segments"]) + ")"
           if c["segments"] else "")
        for c in geo["columns"])
    caption = (f"{_num(total)} GPU-hours in {len(geo['columns'])} "
               f"day{'s' * (len(geo['columns']) != 1)}; "
               + (", ".join(f"{k['key']} {_num(k['total'])}" for k in geo["keys"][:5])
                  or "no usage"))
    # the table holds what the chart draws (its namespaces and the grey rest), so it stays
    # as long as the chart whatever the number of namespaces
    data = _table(chart_id, ["Day", "Namespace", "GPU-hours"],
                  [(c["label"], s["key"], s["value"]) for c in geo["columns"]
                   for s in c["segments"]]) if table else ""
    return _figure(chart_id, "GPU-hours per day by namespace", desc or "No days.",
                   "".join(body), geo["width"], height, caption, data)


# -- lines over time: fleet utilisation and SM activity -----------------------------------------
def time_lines(series: Mapping[str, Sequence[tuple[dt.datetime, float | None]]], *,
               start: dt.datetime, end: dt.datetime, width: float = WIDTH,
               height: float = 200, left: float = 56, top: float = 22,
               bottom: float = 30, y_max: float = 100.0) -> dict[str, Any]:
    """Geometry of lines over time on a 0..y_max scale: per series a list of runs of points
    (a None value, a bucket without data, breaks the line instead of drawing through it)."""
    span = max(1.0, (end - start).total_seconds())
    plot_h = height - top - bottom
    plot_w = width - left - 8
    out = {}
    for name, points in series.items():
        runs: list[list[tuple[float, float]]] = [[]]
        for at, value in sorted(points, key=lambda p: p[0]):
            if value is None:
                if runs[-1]:
                    runs.append([])
                continue
            x = left + plot_w * min(max((at - start).total_seconds(), 0.0), span) / span
            y = top + plot_h - plot_h * min(max(float(value), 0.0), y_max) / y_max
            runs[-1].append((x, y))
        out[name] = [r for r in runs if r]
    ticks = [{"value": v, "y": top + plot_h - plot_h * v / y_max} for v in _ticks(y_max)]
    return {"series": out, "ticks": ticks, "width": width, "height": height, "left": left,
            "top": top, "plot_h": plot_h, "plot_w": plot_w, "start": start, "end": end}


def utilisation_chart(points: Sequence[Mapping[str, Any]], *, start: dt.datetime,
                      end: dt.datetime, chart_id: str = "utilisation",
                      table: bool = True) -> str:
    """Fleet utilisation and SM activity (%, GPU-hour weighted) per bucket over [start, end).

    ``points``: ``{"at", "utilisation_pct", "sm_active_pct"}``; ``sm_active_pct`` None
    everywhere (the exporters do not send the profiling field, or the ledger does not keep
    it) draws no line and says "not exported" in the legend, rather than a flat zero.

    The time axis starts at the first point when that is later than ``start``: a fleet
    younger than the window spans its whole life across the chart, not a few pixels at its
    right edge.
    """
    if points:
        start = max(start, min(p["at"] for p in points))
    util = [(p["at"], p.get("utilisation_pct")) for p in points]
    sm = [(p["at"], p.get("sm_active_pct")) for p in points]
    has_sm = any(v is not None for _, v in sm)
    geo = time_lines({"utilisation": util, **({"sm_active": sm} if has_sm else {})},
                     start=start, end=end)
    body = [_y_axis(geo, "%")]
    for name, runs in geo["series"].items():
        for run in runs:
            if len(run) == 1:
                (x, y), = run
                body.append(f'<circle class="line {name}" cx="{x:.1f}" cy="{y:.1f}" r="2.5" '
                            f'fill="{SERIES_COLOURS[name]}"/>')
            else:
                pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in run)
                body.append(f'<polyline class="line {name}" points="{pts}" fill="none" '
                            f'stroke="{SERIES_COLOURS[name]}" stroke-width="2"/>')
    span = (end - start).total_seconds()
    fmt = "%H:%M:%S" if span < 3600 else "%H:%M" if span <= 2 * 86400 else "%m-%d"
    for i in range(5):
        at = start + (end - start) * i / 4
        x = geo["left"] + geo["plot_w"] * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        body.append(f'<text x="{x:.1f}" y="{geo["top"] + geo["plot_h"] + 16:.1f}" '
                    f'text-anchor="{anchor}" fill="#555">{_x(at.strftime(fmt))}</text>')
    items = [("utilisation", SERIES_COLOURS["utilisation"]),
             ("SM activity" if has_sm else "SM activity: not exported",
              SERIES_COLOURS["sm_active"] if has_sm else REST_COLOUR)]
    legend, legend_h = _legend(items, geo["left"], geo["height"] - 4, geo["width"])
    body.append(legend)
    known = [v for _, v in util if v is not None]
    if not known:
        body.append(f'<text x="{geo["left"] + 10:g}" y="{geo["top"] + 30:g}">'
                    "No utilisation collected in this period.</text>")

    def stats(values: list[float]) -> str:
        return (f"average {_num(sum(values) / len(values))}%, lowest {_num(min(values))}%, "
                f"highest {_num(max(values))}%" if values else "no data")

    sm_known = [v for _, v in sm if v is not None]
    desc = (f"Utilisation per bucket from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC: "
            f"{stats(known)}. SM activity: "
            + (stats(sm_known) if has_sm else "not exported") + ".")
    caption = (f"Utilisation {stats(known)}; SM activity "
               + (stats(sm_known) if has_sm else "not exported"))
    data = _table(chart_id, ["Bucket start (UTC)", "Utilisation %", "SM activity %"],
                  [(p["at"].strftime("%Y-%m-%d %H:%M"),
                    "" if p.get("utilisation_pct") is None else round(p["utilisation_pct"], 2),
                    "not exported" if p.get("sm_active_pct") is None
                    else round(p["sm_active_pct"], 2))
                   for p in points]) if table else ""
    return _figure(chart_id, "Fleet utilisation and SM activity over time", desc,
                   "".join(body), geo["width"], geo["height"] + legend_h, caption, data)


# -- horizontal bars: idle allocated GPU-hours, capacity by model, stale clusters ---------------
def stacked_bars(rows: Sequence[tuple[str, Mapping[str, float]]], parts: Sequence[str], *,
                 width: float = WIDTH, label_w: float = 190, row_h: float = 24,
                 top: float = 8, value_w: float = 150) -> dict[str, Any]:
    """Geometry of horizontal bars, one per (label, {part: value}), segments in ``parts``
    order, all on one scale (0 .. a round number above the longest bar); a bar's segments
    add up to its total's length."""
    totals = [sum(max(0.0, float(v.get(p, 0.0))) for p in parts) for _, v in rows]
    scale = nice_ceiling(max(totals, default=0.0))
    bar_w = width - label_w - value_w
    out = []
    for i, ((label, values), total) in enumerate(zip(rows, totals, strict=True)):
        y = top + i * row_h
        x = label_w
        segments = []
        for part in parts:
            value = max(0.0, float(values.get(part, 0.0)))
            if value <= 0:
                continue
            w = bar_w * value / scale
            segments.append({"key": part, "value": value, "x": x, "y": y, "width": w,
                             "height": row_h - 8})
            x += w
        out.append({"label": label, "total": total, "y": y, "length": bar_w * total / scale,
                    "segments": segments, "text_y": y + row_h - 12})
    return {"bars": out, "scale": scale, "width": width, "label_w": label_w,
            "bar_w": bar_w, "height": top + max(1, len(out)) * row_h + 4}


def _bar_chart(chart_id: str, title: str, rows: Sequence[tuple[str, Mapping[str, float]]],
               parts: Sequence[str], colours: Mapping[str, str], unit: str, empty: str,
               caption: str, headings: Sequence[str] | None, attr: str,
               value_text: Any = None) -> str:
    geo = stacked_bars(rows, parts)
    body = []
    for bar in geo["bars"]:
        label = bar["label"]
        body.append(f'<g class="bar-row" data-{attr}="{_x(label)}" '
                    f'data-total="{bar["total"]:.6f}">'
                    f'<text x="{geo["label_w"] - 8:g}" y="{bar["text_y"]:.1f}" '
                    f'text-anchor="end">{_x(_short(label))}<title>{_x(label)}</title></text>')
        for s in bar["segments"]:
            body.append(f'<rect class="segment" data-key="{_x(s["key"])}" '
                        f'data-value="{s["value"]:.6f}" x="{s["x"]:.2f}" y="{s["y"]:.1f}" '
                        f'width="{s["width"]:.2f}" height="{s["height"]:g}" '
                        f'fill="{colours[s["key"]]}"><title>{_x(label)} · {_x(s["key"])}: '
                        f'{_x(_num(s["value"]))} {_x(unit)}</title></rect>')
        text = value_text(bar) if value_text else f"{_num(bar['total'])} {unit}"
        body.append(f'<text class="value" x="{geo["label_w"] + bar["length"] + 6:.1f}" '
                    f'y="{bar["text_y"]:.1f}">{_x(text)}</text></g>')
    height = geo["height"]
    if not geo["bars"]:
        body.append(f'<text x="8" y="20">{_x(empty)}</text>')
        height = 30
    if len(parts) > 1:
        legend, legend_h = _legend([(p, colours[p]) for p in parts], geo["label_w"],
                                   height + 2, geo["width"])
        body.append(legend)
        height += legend_h + 4
    desc = "; ".join(
        f"{b['label']}: " + (value_text(b) if value_text else f"{_num(b['total'])} {unit}")
        + (" (" + ", ".join(f"{s['key']} {_num(s['value'])}" for s in b["segments"]) + ")"
           if len(parts) > 1 else "")
        for b in geo["bars"]) or empty
    data = _table(chart_id, headings, [(label, *[float(v.get(p, 0.0)) for p in parts])
                                       for label, v in rows]) if headings else ""
    return _figure(chart_id, title, desc, "".join(body), geo["width"], height, caption, data)


def idle_gpu_hours_chart(rows: Sequence[Mapping[str, Any]], *, chart_id: str = "idle-chart",
                         table: bool = False, limit: int = 15) -> str:
    """Idle allocated GPU-hours per namespace, most first.

    ``rows``: ``{"namespace", "idle_allocated_gpu_hours"}`` (``usage --by namespace`` rows,
    or several a namespace, summed); namespaces past ``limit`` are summed into one bar.
    """
    sums: dict[str, float] = {}
    for r in rows:
        ns = r.get("namespace") or UNALLOCATED
        sums[ns] = sums.get(ns, 0.0) + float(r.get("idle_allocated_gpu_hours") or 0.0)
    ranked = sorted(((ns, v) for ns, v in sums.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))
    if len(ranked) > limit:
        rest = ranked[limit - 1:]
        ranked = [*ranked[: limit - 1], (f"{len(rest)} more namespaces",
                                         sum(v for _, v in rest))]
    total = sum(v for _, v in ranked)
    return _bar_chart(chart_id, "Idle allocated GPU-hours by namespace",
                      [(ns, {"idle": v}) for ns, v in ranked], ["idle"],
                      {"idle": PALETTE[3]}, "GPU-hours",
                      "No idle allocated GPU-hours.",
                      f"{_num(total)} allocated GPU-hours spent idle"
                      + (f", most in {ranked[0][0]}" if ranked else ""),
                      ["Namespace", "Idle allocated GPU-hours"] if table else None,
                      "namespace")


CAPACITY_PARTS = ("allocated", "free", "stale")


def capacity_chart(rows: Sequence[Mapping[str, Any]], *, chart_id: str = "capacity-chart",
                   table: bool = False) -> str:
    """GPU-equivalents per model: allocated, free and stale, one bar per model.

    ``rows``: ``hub.usage.capacity`` rows by model (``model``, ``allocated``, ``free``,
    ``stale``); their sum is the model's total.
    """
    data = [(str(r.get("model") or "unknown"), {p: float(r.get(p) or 0.0)
                                                for p in CAPACITY_PARTS}) for r in rows]
    free = sum(v["free"] for _, v in data)
    allocated = sum(v["allocated"] for _, v in data)
    stale = sum(v["stale"] for _, v in data)
    return _bar_chart(chart_id, "Capacity by model: allocated, free, stale", data,
                      CAPACITY_PARTS, PART_COLOURS, "GPU-equivalents",
                      "No GPUs in the inventory.",
                      f"{_num(allocated)} allocated, {_num(free)} free, {_num(stale)} stale "
                      "GPU-equivalents",
                      ["Model", "Allocated", "Free", "Stale"] if table else None, "model",
                      value_text=lambda b: (f"{_num(b['total'])} GPU-equivalents, "
                                            f"{_num(_part(b, 'free'))} free"))


def _part(bar: Mapping[str, Any], key: str) -> float:
    return next((s["value"] for s in bar["segments"] if s["key"] == key), 0.0)


def stale_clusters_chart(rows: Sequence[Mapping[str, Any]], *,
                         chart_id: str = "stale-clusters-chart", table: bool = False) -> str:
    """Clusters with stale GPUs, one line each with how many (not a row per GPU).

    ``rows``: ``{"cluster", "stale_gpus", "last_sample_at"}``, ``last_sample_at`` being the
    newest sample of those GPUs (text or datetime; None: never).
    """
    ordered = sorted(rows, key=lambda r: (-float(r.get("stale_gpus") or 0), str(r["cluster"])))
    seen = {str(r["cluster"]): r for r in ordered}

    def text(bar: Mapping[str, Any]) -> str:
        last = seen[bar["label"]].get("last_sample_at")
        when = (last.strftime("%Y-%m-%d %H:%M") if isinstance(last, dt.datetime)
                else str(last)[:16].replace("T", " ") if last else "never")
        return f"{_num(bar['total'])} stale GPUs, last sample {when}"

    total = sum(float(r.get("stale_gpus") or 0) for r in ordered)
    return _bar_chart(chart_id, "Stale GPUs by cluster",
                      [(str(r["cluster"]), {"stale": float(r.get("stale_gpus") or 0)})
                       for r in ordered], ["stale"], {"stale": PALETTE[1]}, "stale GPUs",
                      "No stale GPU.",
                      f"{_num(total)} stale GPUs in {len(ordered)} "
                      f"cluster{'s' * (len(ordered) != 1)}",
                      ["Cluster", "Stale GPUs"] if table else None, "cluster",
                      value_text=text)
