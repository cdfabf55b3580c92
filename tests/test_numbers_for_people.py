"""Numbers for people: pages and the report round (no ``0.08333333333333333`` or
``32.08288472222223`` in a cell), counts read as integers, GPU-equivalents say so, a tiny
figure is ``<0.01`` rather than a ``0`` above a table holding 0.002; JSON keeps machine
precision without float noise (``101.85714300000001``)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hub.common import counted, counts_line, for_people, json_number
from hub.inventory import _db
from tests.support.asgi import page_client
from tests.support.browser import Dom
from tests.support.clirun import gpufleet
from tests.test_idle_agreement import _ledger

#: a decimal with more digits than a person reads
NOISE = re.compile(r"\d\.\d{4,}")


def test_the_rules():
    assert counts_line({"error": 6, "warning": 5, "info": 1}) == "6 errors, 5 warnings, 1 info"
    assert counts_line({"error": 1, "warning": 0}) == "1 error, 0 warnings, 0 info"
    assert counted(1, "GPU") == "1 GPU" and counted(1200, "bucket") == "1,200 buckets"
    assert for_people(3.0) == "3" and for_people(69.857142857) == "69.86"
    assert for_people(0.08333333333333333) == "0.08" and for_people(0.002222) == "<0.01"
    assert for_people(0) == "0" and for_people(12345) == "12,345" and for_people(None) == "–"
    assert json_number(101.85714300000001) == 101.857143


def _texts(html: str) -> list[str]:
    """What a person reads: the text of the page, not its attributes (a chart's data-value
    keeps the exact figure for scripts)."""
    dom = Dom(html)
    return [e["text"] for e in dom.elements if e["tag"] in ("td", "p", "figcaption", "text",
                                                            "h2", "h3", "span", "desc")]


@pytest.fixture()
def client(tmp_path) -> Any:
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    _ledger(url, now)  # a MIG slice at 3/7 of a GPU: 0.428571... GPU-hours an hour
    return page_client(url), url


def test_pages_round_for_people_and_json_has_no_float_noise(client):
    http, _ = client
    for path in ("/", "/clusters/c1", "/nodes/c1/n1", "/gpus/GPU-idle", "/gpus/GPU-late"):
        page = http.get(path)
        assert page.status_code == 200, path
        noisy = [t.strip()[:80] for t in _texts(page.text) if NOISE.search(t)]
        assert noisy == [], (path, noisy)
    page = http.get("/").text
    assert "Capacity by model (GPU-equivalents;" in page
    assert "GPU-equivalents, " in page and " GPUs, " not in page  # the chart's bar labels
    for path in ("/api/v1/gpus/GPU-late/history", "/api/v1/capacity?by=model",
                 "/api/v1/usage?by=gpu&since=24h", "/api/v1/idle?since=24h"):
        body = http.get(path).text
        floats = re.findall(r"-?\d+\.\d+(?:e-?\d+)?", body)
        assert floats and all(len(f.split(".")[1]) <= 6 for f in floats), (path, floats[:5])
    json.loads(http.get("/api/v1/capacity?by=model").text)["fleet"]


def test_the_report_labels_agree_with_its_tables(client, tmp_path):
    _, url = client
    out = tmp_path / "report.html"
    result = gpufleet("report", "--db", url, "-o", "html", "--out", str(out))
    assert result.exit_code in (0, 1), result.output
    html = out.read_text()
    noisy = [t.strip()[:80] for t in _texts(html) if NOISE.search(t)]
    assert noisy == []
    assert "GPU-equivalents" in html
