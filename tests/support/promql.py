"""Waiting on a real hub Prometheus until what the agents pushed is queryable."""

from __future__ import annotations

import time
from collections.abc import Callable

import requests


def wait_for(hub_url: str, query: str, predicate: Callable[[list], bool],
             timeout: float = 30.0) -> list:
    """Poll an instant query until the result satisfies the predicate."""
    deadline = time.monotonic() + timeout
    result: list = []
    while time.monotonic() < deadline:
        r = requests.post(f"{hub_url}/api/v1/query", data={"query": query}, timeout=5)
        result = r.json()["data"]["result"]
        if predicate(result):
            return result
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {query!r}; last result: {result}")


def wait_silent(hub_url: str, selector: str, window: str, timeout: float = 30.0) -> None:
    """Wait until the hub holds no sample of ``selector`` within the last ``window``: what a
    sync with ``--stale-after window`` then sees as stale. A condition, not a sleep sized to
    a guess of how long pushes take to stop."""
    wait_for(hub_url, f"count(last_over_time({selector}[{window}]))", lambda r: not r, timeout)
