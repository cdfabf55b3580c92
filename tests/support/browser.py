"""Headless Chromium for tests of gpufleet's HTML (the report file, the live page).

Started as the project's rules say: a fresh profile, no sandbox, no GPU, no background
networking; ``--dump-dom`` gives the document after Chromium parsed it, and :class:`Browser`
drives one over the DevTools protocol to fill in and submit forms.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import requests

CHROMIUM = "/usr/bin/chromium"


class Dom(HTMLParser):
    """Elements (tag, attrs, text) of a dumped DOM, in document order."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.elements: list[dict] = []
        self._open: list[dict] = []
        self.feed(html)

    def table(self, table_id: str) -> list[dict[str, str]]:
        """The rows of a page's table as {data-col: text}, in order (the live page marks
        its rows with data-key and its cells with data-col)."""
        rows: list[dict[str, str]] = []
        inside = False
        for el in self.elements:
            if el["tag"] == "table":
                inside = el["attrs"].get("id") == table_id
            elif inside and el["tag"] == "tr" and "data-key" in el["attrs"]:
                rows.append({})
            elif inside and el["tag"] == "td" and "data-col" in el["attrs"] and rows:
                rows[-1][el["attrs"]["data-col"]] = el["text"].strip()
        return rows

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


class Browser:
    """Headless Chromium driven over the Chrome DevTools Protocol (a websocket), for what
    ``--dump-dom`` cannot do: fill a form and submit it through the page, follow the
    redirects and cookies as a person's browser would, then read the DOM.

    Started with the same flags as :func:`chromium_dom` plus ``--remote-debugging-port=0``:
    Chromium picks a free loopback port and writes it to ``DevToolsActivePort`` in the fresh
    profile, so no port is guessed.
    """

    def __init__(self, timeout: float = 60.0) -> None:
        import websocket

        if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
            pytest.fail("chromium not found: install the Debian package 'chromium'")
        self.timeout = timeout
        self.profile = Path(tempfile.mkdtemp(prefix="gpufleet-cdp-"))
        self.proc = subprocess.Popen(
            [CHROMIUM if Path(CHROMIUM).exists() else "chromium", "--headless", "--no-sandbox",
             "--disable-gpu", "--disable-background-networking", "--no-first-run",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={self.profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            port = self._devtools_port()
            targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(t for t in targets if t.get("type") == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"],
                                                  timeout=timeout, suppress_origin=True)
        except BaseException:
            self.close()
            raise
        self._next_id = 0
        self._events: list[dict] = []
        self.send("Page.enable")
        self.send("Network.enable")

    def _devtools_port(self) -> int:
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                pytest.fail(f"chromium exited ({self.proc.returncode}): {err[-2000:]}")
            text = active.read_text() if active.exists() else ""
            if text.endswith("\n") or len(text.splitlines()) >= 2:
                return int(text.splitlines()[0])
            time.sleep(0.1)
        pytest.fail("chromium wrote no DevToolsActivePort")

    # -- the protocol ---------------------------------------------------------------------
    def send(self, method: str, **params: Any) -> dict:
        """One command; its result (events that arrive meanwhile are kept for wait_for)."""
        self._next_id += 1
        self.ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self._next_id:
                assert "error" not in message, (method, message["error"])
                return message.get("result", {})
            if "method" in message:
                self._events.append(message)

    def wait_for(self, event: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, message in enumerate(self._events):
                if message["method"] == event:
                    del self._events[: i + 1]
                    return message.get("params", {})
            assert time.monotonic() < deadline, f"no {event} within {self.timeout}s"
            message = json.loads(self.ws.recv())
            if "method" in message:
                self._events.append(message)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    # -- what a person does -------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Go to ``url`` and wait until the page (after any redirect) has loaded."""
        self._events.clear()
        self.send("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")

    def submit(self, form_id: str, **fields: str) -> None:
        """Fill the form's fields and press its submit button; wait for the next page."""
        self._events.clear()
        self.evaluate(
            f"(() => {{ const form = document.getElementById({json.dumps(form_id)});"
            f" const values = {json.dumps(fields)};"
            " for (const [name, value] of Object.entries(values))"
            " { form.elements[name].value = value; }"
            " form.querySelector('button[type=submit]').click(); })()")
        self.wait_for("Page.loadEventFired")

    @property
    def location(self) -> str:
        return str(self.evaluate("location.href"))

    def dom(self) -> Dom:
        return Dom(str(self.evaluate("document.documentElement.outerHTML")))

    def screenshot(self, selector: str | None = None) -> tuple[bytes, dict]:
        """A PNG of the page, or of the element ``selector`` names (scrolled into view,
        clipped to its box at scale 1); (png, the box in CSS pixels)."""
        import base64

        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        box: dict = {}
        if selector is not None:
            box = self.evaluate(
                f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                ".getBoundingClientRect(); return {x: r.x + window.scrollX, "
                "y: r.y + window.scrollY, width: r.width, height: r.height}; })()")
            params["clip"] = {**box, "scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", **params)["data"]), box

    def cookies(self) -> list[dict]:
        return self.send("Network.getCookies")["cookies"]

    def clear_cookies(self) -> None:
        self.send("Network.clearBrowserCookies")

    def close(self) -> None:
        ws = getattr(self, "ws", None)
        if ws is not None:
            ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.profile, ignore_errors=True)
