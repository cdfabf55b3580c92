"""A cluster's page as a person sees it in Chromium: not every GPU of the cluster in one very
long table (its nodes' pages list them), no column that repeats the page's own cluster, and
UUIDs and timestamps on one line each (a wrapped UUID cannot be read or copied whole)."""

from __future__ import annotations

import datetime as dt

from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from tests.support.asgi import page_client
from tests.support.browser import Browser, Dom

NODES, PER_NODE = 10, 8


def _inventory(url: str) -> None:
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = dt.datetime(2026, 11, 20, 12)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("prod-east", f"prod-east-gpu-{n:02d}",
                        f"GPU-{n:02d}{i:02d}a1b2-c3d4-e5f6-0718-293a4b5c6d7e", "nvidia",
                        index=i, model="NVIDIA H100 80GB HBM3")
            for n in range(NODES) for i in range(PER_NODE)], now)
    engine.dispose()


def test_a_clusters_page_is_short_and_its_ids_do_not_wrap(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _inventory(url)
    html = page_client(url).get("/clusters/prod-east").text
    dom = Dom(html)
    rows = dom.table("gpus")
    assert 0 < len(rows) <= 32 and all("cluster" not in r for r in rows)
    assert f"and {NODES * PER_NODE - len(rows)} more" in html
    page = tmp_path / "cluster.html"
    page.write_text(html)
    browser = Browser()
    try:
        browser.send("Emulation.setDeviceMetricsOverride", width=1000, height=800,
                     deviceScaleFactor=1, mobile=False)
        browser.open(page.as_uri())
        # the lines each UUID and timestamp takes on screen (distinct tops of its text's boxes)
        lines = browser.evaluate(
            "[...document.querySelectorAll('td[data-col=\"uuid\"], td[data-col$=\"_at\"], "
            "td[data-col=\"last_seen\"]')].filter(td => td.textContent.trim()).map(td => {"
            " const r = document.createRange(); r.selectNodeContents(td); return new Set("
            "[...r.getClientRects()].map(b => Math.round(b.top))).size; })")
        assert len(lines) >= len(rows) and set(lines) == {1}, lines[:6]
        total = browser.evaluate("document.body.getBoundingClientRect().height")
        assert total < 2500, total  # one row per GPU of the cluster made it ~3,400 px here
    finally:
        browser.close()
