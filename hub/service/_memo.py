"""Answers that cost a pass over the whole inventory, kept until the inventory changes.

Capacity (and the page's usage, idle and capacity sections) fold every GPU row in Python:
about 90 ms at 10,000 GPUs, against 1-6 ms for any other read. Fifty dashboards asking for
it at once would queue everything behind it. The inventory changes only when a sync, a
prune or a usage collect writes, and each leaves a trace that costs microseconds to read:
a new ``sync_runs`` id, a new ``events`` id, a changed ``usage_buckets`` row. An answer is
kept under that version (and its own key: the caller's scope, the grouping) and for at most
``ttl`` seconds, so a write the version does not see (a manual edit) shows within that.
Whatever is kept is shared between callers: it is never modified, only read.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv

TTL = 30.0
SIZE = 128


def inventory_version(conn: Connection) -> tuple[Any, ...]:
    """What changes whenever a sync, prune or usage collect has written (three indexed
    reads)."""
    return (
        conn.execute(sa.select(sa.func.max(inv.sync_runs.c.id))).scalar(),
        conn.execute(sa.select(sa.func.max(inv.events.c.id))).scalar(),
        *conn.execute(sa.select(sa.func.max(inv.usage_buckets.c.collected_at),
                                sa.func.count()).select_from(inv.usage_buckets)).one(),
    )


class Memo:
    def __init__(self, *, ttl: float = TTL, size: int = SIZE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self._kept: OrderedDict[Hashable, tuple[tuple[Any, ...], float, Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[Hashable, threading.Lock] = {}
        #: answers computed (not found kept): what the tests and an operator's profile read
        self.computed = 0

    def _fresh(self, key: Hashable, version: tuple[Any, ...]) -> tuple[Any] | None:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == version and self.clock() - kept[1] < self.ttl:
                self._kept.move_to_end(key)
                return (kept[2],)
        return None

    def get(self, conn: Connection, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The kept answer for ``key``, or ``compute()``'s: one caller computes a missing
        answer while the others asking for the same key wait for it (fifty dashboards
        opening at once compute capacity once, not fifty times)."""
        version = inventory_version(conn)
        found = self._fresh(key, version)
        if found is not None:
            return found[0]
        with self._lock:
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            found = self._fresh(key, version)
            if found is not None:
                return found[0]
            value = compute()
            with self._lock:  # kept before the waiters are let in
                self._computing.pop(key, None)
                self.computed += 1
                self._kept[key] = (version, self.clock(), value)
                self._kept.move_to_end(key)
                while len(self._kept) > self.size:
                    self._kept.popitem(last=False)
        return value
