"""Render a validation report: a terminal table, JSON, a pull-request comment, an HTML page.

Only rendering happens here; the findings come from :mod:`hub.validate._checks`. The Markdown fits a
pull-request comment (GitHub's limit is 65536 characters: findings are capped with an "and N
more" line). The HTML is one self-contained page (inline CSS and SVG, no script, no external
asset) rendered by an autoescaping Jinja2 template, so a hostile cluster or pod name is text,
never markup. ``write_atomic`` replaces a file by rename, so a cron job serving the page never
serves half of it.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hub import common
from hub.common import InputError, html_environment, iso, to_json, to_table
from hub.inventory import STATES
from hub.validate._checks import ERROR, INFO, SEVERITIES, WARNING, Finding, human

FORMATS = ("table", "json", "markdown", "html")
#: GitHub's limit for one comment; the Markdown stays below it
MARKDOWN_LIMIT = 65536
FINDING_COLUMNS = ["severity", "check", "cluster", "node", "gpu", "message"]
_STATUS_RANK = {ERROR: 0, WARNING: 1, "ok": 2}


@dataclass
class Report:
    generated_at: dt.datetime
    max_age: float
    push_interval: float
    window: float
    summary: list[dict[str, Any]]
    findings: list[Finding]
    hub: str | None = None  # the hub's URL without credentials, when hub checks ran
    reconcile: dict[str, Any] | None = None  # {"finished_at", "source"} of the latest run
    #: {"since", "by_namespace", "idle", "capacity"} from the usage ledger and inventory
    usage: dict[str, Any] | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}

    @property
    def failed(self) -> bool:
        return any(f.severity == ERROR for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "generated_at": iso(self.generated_at),
            "settings": {"max_age_seconds": self.max_age,
                         "push_interval_seconds": self.push_interval,
                         "window_seconds": self.window, "hub": self.hub},
            "reconcile": {k: iso(v) if isinstance(v, dt.datetime) else v
                          for k, v in self.reconcile.items()} if self.reconcile else None,
            "counts": self.counts,
            "summary": [{**row, "last_sample_at": iso(row.get("last_sample_at"))}
                        for row in self.summary],
            "findings": [f.as_dict() for f in self.findings],
            "usage": _plain_usage(self.usage),
        }


def _plain_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {k: ([{c: iso(v) if isinstance(v, dt.datetime) else v for c, v in row.items()}
                 for row in rows] if isinstance(rows, list) else
                iso(rows) if isinstance(rows, dt.datetime) else rows)
            for k, rows in usage.items()}


def _counts_line(report: Report) -> str:
    return common.counts_line(report.counts)


def _settings_line(report: Report) -> str:
    hub = report.hub or "no hub checks"
    return (f"generated {iso(report.generated_at)} · max age {human(report.max_age)} · push "
            f"interval {human(report.push_interval)} · window {human(report.window)} · {hub}")


def _sorted_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (_STATUS_RANK.get(r["status"], 3), r["cluster"]))


# -- table ---------------------------------------------------------------------------------------
def render_table(report: Report) -> str:
    rows = [{**r, "nodes_reporting": f"{r['nodes_reporting']}/{r['nodes_expected']}",
             "gpus": r.get("gpus_reporting", r["gpus"])}
            for r in _sorted_summary(report.summary)]
    parts = [_settings_line(report) + "\n"]
    cols = ["cluster", "status", "state", "last_sample_at", "age", "nodes_reporting", "gpus",
            "seen_through", "cards"]
    parts.append(to_table(rows, cols, title="clusters") if rows else "(no clusters)\n")
    states = (report.usage or {}).get("states")
    if states:
        parts.append(to_table(states, ["cluster", *STATES], title="fleet states"))
    findings = [f.as_dict() for f in report.findings]
    parts.append(to_table(findings, FINDING_COLUMNS, title="findings") if findings
                 else "(no findings)\n")
    parts.append(_counts_line(report) + "\n")
    return "\n".join(parts)


# -- markdown ------------------------------------------------------------------------------------
_ICON = {ERROR: "❌ error", WARNING: "⚠️ warning", INFO: "ℹ️ info", "ok": "✅ ok"}


def _md(value: Any) -> str:
    """One table cell: no line breaks, no pipes, no HTML (PR comments render it). Markdown's
    own backslash escapes, not HTML entities: a tag needs a ``<`` and an entity an ``&``, and
    ``\\<`` reads as ``<`` where the text is shown unrendered (a chat, a terminal), where
    ``&gt;`` would not; ``>`` inside a cell is plain text."""
    if value is None:
        return ""
    text = str(iso(value) if isinstance(value, dt.datetime) else value)
    text = " ".join(text.split())
    for raw, escaped in (("\\", "\\\\"), ("&", "\\&"), ("<", "\\<"), ("|", "\\|"),
                         ("`", "\\`")):
        text = text.replace(raw, escaped)
    return text


def _markdown(report: Report, max_findings: int, max_clusters: int) -> str:
    lines = ["## GPU fleet report", "",
             f"**{_counts_line(report)}** · {_md(_settings_line(report))}", ""]
    summary = _sorted_summary(report.summary)
    lines += ["| Cluster | Status | Newest sample | Age | Nodes reporting | GPUs |",
              "|---|---|---|---|---|---|"]
    for r in summary[:max_clusters]:
        lines.append(f"| {_md(r['cluster'])} | {_ICON.get(r['status'], _md(r['status']))} | "
                     f"{_md(r['last_sample_at']) or 'never'} | {_md(r['age'])} | "
                     f"{r['nodes_reporting']}/{r['nodes_expected']} | "
                     f"{r.get('gpus_reporting', r['gpus'])} |")
    if len(summary) > max_clusters:
        lines.append(f"\n_…and {len(summary) - max_clusters} more clusters._")
    if not summary:
        lines.append("| _no clusters_ | | | | | |")
    states = (report.usage or {}).get("states")
    if states:
        lines += ["", "### Fleet states", "",
                  "| Cluster | Delivered | Healthy | Reserved | Active |", "|---|---|---|---|---|"]
        lines += [f"| {_md(r['cluster'])} | {r['delivered']} | {r['healthy']} | "
                  f"{r['reserved']} | {r['active']} |" for r in states[:max_clusters]]
    lines += ["", "### Findings", ""]
    if report.findings:
        lines += ["| Severity | Check | Cluster | Node | GPU | Message |",
                  "|---|---|---|---|---|---|"]
        for f in report.findings[:max_findings]:
            lines.append(f"| {_ICON[f.severity]} | {_md(f.check)} | {_md(f.cluster)} | "
                         f"{_md(f.node)} | {_md(f.gpu)} | {_md(f.message)} |")
        rest = len(report.findings) - max_findings
        if rest > 0:
            lines.append(f"\n_…and {rest} more finding{'s' * (rest != 1)} "
                         "(`gpufleet report -o json` lists all)._")
    else:
        lines.append("No findings.")
    return "\n".join(lines) + "\n"


def render_markdown(report: Report, max_findings: int = 50, max_clusters: int = 100) -> str:
    """Markdown for a pull-request comment, always under :data:`MARKDOWN_LIMIT` characters."""
    text = _markdown(report, max_findings, max_clusters)
    while len(text) >= MARKDOWN_LIMIT and (max_findings > 1 or max_clusters > 1):
        max_findings, max_clusters = max(1, max_findings // 2), max(1, max_clusters // 2)
        text = _markdown(report, max_findings, max_clusters)
    return text[:MARKDOWN_LIMIT - 1]


# -- html ----------------------------------------------------------------------------------------
def _chart(report: Report) -> dict[str, Any]:
    """Geometry of the sample-age bar chart: one bar per cluster, coloured by its age against
    the two thresholds, which are drawn as lines.

    The scale ends at 1.5 × max age; older (or never seen) clusters get a full bar marked as
    beyond the scale, so one long-dead cluster does not flatten every other bar.
    """
    label_w, bar_w, row_h, top = 180, 460, 22, 24
    scale = max(report.max_age * 1.5, 1.0)
    bars = []
    for i, r in enumerate(_sorted_summary(report.summary)):
        age = r.get("age_seconds")
        over = age is None or age > scale
        width = bar_w if age is None or over else max(2.0, bar_w * age / scale)
        name = r["cluster"]
        label = name if len(name) <= 24 else name[:23] + "…"
        # the colour tells freshness only; the cluster table tells every other finding
        fresh = ("error" if age is None or age > report.max_age
                 else "warning" if age > 2 * report.push_interval else "ok")
        if fresh == "ok" and r.get("state") not in (None, "active"):
            fresh = "warning"  # stale in the inventory: never a green bar
        bars.append({"cluster": name, "label": label, "status": fresh, "age": r["age"],
                     "x": label_w, "y": top + i * row_h, "width": round(width, 1),
                     "height": row_h - 6, "over": over, "text_y": top + i * row_h + row_h - 10})

    def at(seconds: float) -> float:
        return round(label_w + bar_w * min(seconds, scale) / scale, 1)

    push2 = 2 * report.push_interval
    lines = [{"x": at(push2), "label": f"2×push {human(push2)}", "kind": "warning"},
             {"x": at(report.max_age), "label": f"max age {human(report.max_age)}",
              "kind": "error"}]
    height = top + max(1, len(bars)) * row_h + 10
    return {"width": label_w + bar_w + 90, "height": height, "bars": bars, "lines": lines,
            "top": top, "bottom": height - 6, "label_w": label_w}


def stale_cluster_rows(summary: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Clusters with stale GPUs, one row each with how many: a switched-off cluster is one
    line, not one per GPU."""
    return [{"cluster": r["cluster"], "stale_gpus": r.get("stale_gpus") or 0,
             "last_sample_at": r.get("last_sample_at")}
            for r in summary if r.get("stale_gpus")]


def report_charts(report: Report) -> dict[str, Any]:
    """The page's charts as HTML (inline SVG with its text and table), drawn from the same
    data the report's tables show; {} parts are left out when there is no usage section."""
    from markupsafe import Markup

    out = {"stale": Markup(common.stale_clusters_chart(stale_cluster_rows(report.summary),
                                                       table=False))}
    usage = report.usage
    if usage is None:
        return out
    now = report.generated_at
    days = [usage["days_since"] + dt.timedelta(days=i)
            for i in range(max(1, (now - usage["days_since"]).days + 1))] \
        if usage.get("days_since") else None
    out["by_day"] = Markup(common.gpu_hours_by_day_chart(usage.get("by_day") or [], days=days))
    out["utilisation"] = Markup(common.utilisation_chart(
        usage.get("utilisation") or [], start=usage["since"], end=now))
    out["idle"] = Markup(common.idle_gpu_hours_chart(usage.get("by_namespace") or []))
    out["capacity"] = Markup(common.capacity_chart(usage.get("capacity") or []))
    return out


def render_html(report: Report) -> str:
    return html_environment().get_template("report.html.j2").render(
        report=report, data=report.as_dict(), counts=report.counts,
        counts_line=_counts_line(report), settings_line=_settings_line(report),
        summary=[{**r, "last_sample_at": iso(r.get("last_sample_at"))}
                 for r in _sorted_summary(report.summary)],
        findings=[f.as_dict() for f in report.findings], chart=_chart(report),
        usage=_plain_usage(report.usage), charts=report_charts(report),
    )


def render(report: Report, fmt: str, *, max_findings: int = 50) -> str:
    if fmt == "json":
        return to_json(report.as_dict()) + "\n"
    if fmt == "markdown":
        return render_markdown(report, max_findings)
    if fmt == "html":
        return render_html(report)
    return render_table(report)


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename:
    readers see the old file or the new one, never a part."""
    target = Path(os.path.abspath(path))
    if target.is_dir():
        raise InputError(f"--out {path} is a directory")
    if not target.parent.is_dir():
        # A typo in the directory must not silently grow a new tree (cron would write there
        # forever while the web server serves the old page).
        raise InputError(f"--out {path}: directory {target.parent} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {path}: {exc.strerror}") from None
    return target
