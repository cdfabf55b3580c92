"""Headless Chromium for tests of gpufleet's HTML (the report file, the live page).

Started as the project's rules say: a fresh profile, no sandbox, no GPU, no background
networking; ``--dump-dom`` gives the document after Chromium parsed it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"


class Dom(HTMLParser):
    """Elements (tag, attrs, text) of a dumped DOM, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        el = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(el)
        if tag not in ("meta", "link", "br", "img", "input", "hr"):
            self._open.append(el)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for el in self._open:
            el["text"] += data

    def find(self, tag: str, **attrs: str) -> list[dict]:
        return [e for e in self.elements if e["tag"] == tag
                and all(e["attrs"].get(k.replace("_", "-")) == v for k, v in attrs.items())]


def chromium_dom(page: Path | str) -> Dom:
    """The DOM Chromium builds from a file or a URL (after parsing, as a user sees it)."""
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.fail("chromium not found: install the Debian package 'chromium'")
    profile = tempfile.mkdtemp(prefix="gpufleet-chromium-")
    try:
        proc = subprocess.run(
            [CHROMIUM if Path(CHROMIUM).exists() else "chromium", "--headless", "--no-sandbox",
             "--disable-gpu", "--disable-background-networking", "--no-first-run",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             "--dump-dom",
             page.resolve().as_uri() if isinstance(page, Path) else page],
            capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    return Dom(proc.stdout)
