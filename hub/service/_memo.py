"""Answers that cost a pass over the whole inventory, kept until the inventory changes.

Capacity (and the page's usage, idle and capacity sections) fold every GPU row in Python:
about 90 ms at 10,000 GPUs, against 1-6 ms for any other read. Fifty dashboards asking for
it at once would queue everything behind it. The inventory changes only when a sync, a
reconcile, a prune or a usage collect writes, and each leaves a trace that costs
microseconds to read: a new good ``sync_runs`` id, a new ``reconcile_runs`` id, a new
``events`` id, a changed ``usage_buckets`` row. An answer is
kept under that version (and its own key: the caller's scope, the grouping) and for at most
``ttl`` seconds, so a write the version does not see (a manual edit) shows within that.
Whatever is kept is shared between callers: it is never modified, only read.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import inventory as inv

TTL = 30.0
SIZE = 128


def _version_statement() -> sa.Select[Any]:
    def newest(expression: Any, table: sa.Table, *where: Any) -> Any:
        return sa.select(expression).select_from(table).where(*where).scalar_subquery()

    runs = inv.sync_runs
    return sa.select(
        # a failed sync wrote nothing else (one transaction): only a good one is news, so a
        # hub that is down does not throw every kept answer away at each retry
        newest(sa.func.max(runs.c.id), runs, runs.c.status == "ok"),
        newest(sa.func.max(inv.events.c.id), inv.events),
        newest(sa.func.max(inv.usage_buckets.c.collected_at), inv.usage_buckets),
        newest(sa.func.count(), inv.usage_buckets),
        # a reconcile (after a sync) says how each node publishes its GPUs (gpus_via)
        newest(sa.func.max(inv.reconcile_runs.c.id), inv.reconcile_runs))


#: built once: every request reads the version, and SQLAlchemy then finds the compiled
#: statement in its cache by identity rather than by walking a new one
VERSION = _version_statement()


def inventory_version(conn: Connection) -> tuple[Any, ...]:
    """What changes whenever a sync, reconcile, prune or usage collect has written: one
    statement of five indexed reads (one round trip, where three statements cost a third of
    a cheap request)."""
    return tuple(conn.execute(VERSION).one())


_VERSION_SQL: dict[str, str] = {}


def _version_sql(dialect: Any) -> str:
    sql = _VERSION_SQL.get(dialect.name)
    if sql is None:
        sql = _VERSION_SQL[dialect.name] = str(VERSION.compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


class LoopVersion:
    """The version read from the event loop, on a connection of its own outside the
    engine's pool: the loop must never wait for a pooled connection (handlers in the thread
    pool may hold them all, and every request, /healthz included, would wait behind it).
    SQLite: opened read-only, a zero busy timeout (WAL readers do not wait). PostgreSQL
    (psycopg): an asynchronous connection, awaited (:meth:`read_async`). None wherever it
    cannot answer (no SQLite file, another driver, any error): the caller then reads it in
    the thread pool. The same statement and driver as :func:`read_version`, so the two
    versions compare."""

    def __init__(self, engine: Engine | None) -> None:
        self.path: str | None = None
        self.sql = ""
        #: PostgreSQL: the driver's connection parameters, for an asynchronous connection
        self.server: dict[str, Any] | None = None
        if engine is not None and engine.dialect.name == "sqlite" \
                and engine.url.database not in (None, "", ":memory:"):
            self.path = engine.url.database
            self.sql = _version_sql(engine.dialect)
        elif engine is not None and engine.dialect.name == "postgresql" \
                and engine.dialect.driver == "psycopg":
            cparams = dict(engine.dialect.create_connect_args(engine.url)[1])
            options = cparams.get("options", "")  # read-only, as the engine's connections
            cparams["options"] = f"{options} -c default_transaction_read_only=on".strip()
            cparams.setdefault("connect_timeout", 5)
            self.server = cparams
            self.sql = _version_sql(engine.dialect)
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._aconn: Any = None  # psycopg.AsyncConnection, on the loop that made it
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._alock: asyncio.Lock | None = None

    async def read_async(self) -> tuple[Any, ...] | None:
        """The version without leaving the event loop: SQLite's file read, or PostgreSQL's
        round trip awaited on an asynchronous connection of the loop's own (autocommit: one
        round trip), so neither a thread pool trip nor a blocked loop. None on any error
        (the connection is dropped and made again next time)."""
        if self.server is None:
            return self.read()
        import psycopg

        loop = asyncio.get_running_loop()
        if self._aloop is not loop:  # a connection belongs to the loop that made it
            if self._aconn is not None:  # that loop is gone: its socket closed at once
                self._aconn.pgconn.finish()
            self._aconn, self._aloop, self._alock = None, loop, asyncio.Lock()
        assert self._alock is not None
        async with self._alock:  # one query at a time on the one connection
            try:
                if self._aconn is None or self._aconn.closed:
                    self._aconn = await psycopg.AsyncConnection.connect(
                        autocommit=True, **self.server)
                cursor = await self._aconn.execute(self.sql)
                row = await cursor.fetchone()
            except psycopg.Error:
                conn, self._aconn = self._aconn, None
                if conn is not None:
                    await conn.close()
                return None
        return tuple(row) if row is not None else None

    def read(self) -> tuple[Any, ...] | None:
        if self.path is None:
            return None
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(
                        Path(self.path).resolve().as_uri() + "?mode=ro", uri=True,
                        timeout=0, isolation_level=None, check_same_thread=False)
                return tuple(self._conn.execute(self.sql).fetchone())
            except sqlite3.Error:
                self.close()
                return None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def read_version(engine: Engine) -> tuple[Any, ...]:
    """:func:`inventory_version` on a pooled driver connection: the version every request
    of a kept answer reads, at 15 µs rather than the 110 µs of a SQLAlchemy connection and
    result (SQLite, measured). Its values are the driver's (text where SQLAlchemy would
    give a datetime): compared with versions read the same way only. A driver error is
    raised as SQLAlchemy's, as every other read's is (the service answers 503)."""
    dialect = engine.dialect
    sql = _version_sql(dialect)
    error = dialect.loaded_dbapi.Error
    try:
        raw = engine.raw_connection()  # a refused connection raises the driver's error too
    except error as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, error) from exc
    # PostgreSQL: one round trip, not three (BEGIN, the read, the pool's ROLLBACK): the read
    # alone, outside a transaction (still read-only: default_transaction_read_only)
    driver = raw.driver_connection if dialect.name == "postgresql" else None
    try:
        if driver is not None:
            driver.autocommit = True
        try:
            cursor = raw.cursor()
            try:
                cursor.execute(sql)
                row = cursor.fetchone()
            finally:
                cursor.close()
        finally:
            if driver is not None and not driver.closed:
                driver.autocommit = False  # back to the pool as SQLAlchemy expects it
    except error as exc:
        if dialect.is_disconnect(exc, raw.dbapi_connection, None):
            raw.invalidate(exc)  # as a SQLAlchemy connection would: not back to the pool
        raise sa.exc.DBAPIError.instance(sql, None, exc, error) from exc
    finally:
        raw.close()
    assert row is not None  # one row: every subquery is a scalar
    return tuple(row)


class Memo:
    """Answers by key, each valid for one inventory version and ``ttl`` seconds; at most
    ``size`` of them and, with ``weigh``, at most ``max_weight`` in all (an answer heavier
    than ``largest`` is returned, not kept)."""

    def __init__(self, *, ttl: float = TTL, size: int = SIZE,
                 clock: Callable[[], float] = time.monotonic,
                 weigh: Callable[[Any], int] | None = None, max_weight: int = 0,
                 largest: int = 0) -> None:
        self.ttl = ttl
        self.size = size
        self.clock = clock
        self.weigh = weigh
        self.max_weight = max_weight
        self.largest = largest
        self.weight = 0
        self._kept: OrderedDict[Hashable, tuple[tuple[Any, ...], float, Any, int]] = \
            OrderedDict()
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

    def peek(self, version: tuple[Any, ...], key: Hashable) -> Any:
        """The answer kept for ``key`` at ``version``, None if there is none."""
        found = self._fresh(key, version)
        return found[0] if found is not None else None

    def get(self, conn: Connection, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The kept answer for ``key``, or ``compute()``'s: one caller computes a missing
        answer while the others asking for the same key wait for it (fifty dashboards
        opening at once compute capacity once, not fifty times)."""
        return self.get_at(inventory_version(conn), key, compute)

    def get_at(self, version: tuple[Any, ...], key: Hashable,
               compute: Callable[[], Any]) -> Any:
        """:meth:`get` at a version read already (its connection given back: ``compute``
        may need one of its own)."""
        found = self._fresh(key, version)
        if found is not None:
            return found[0]
        with self._lock:
            computing = self._computing.setdefault(key, threading.Lock())
        with computing:
            found = self._fresh(key, version)
            if found is not None:
                return found[0]
            try:
                value = compute()
            except BaseException:
                with self._lock:
                    self._computing.pop(key, None)
                raise
            with self._lock:  # kept before the waiters are let in
                self._computing.pop(key, None)
                self.computed += 1
                self._keep(key, version, value)
        return value

    def _keep(self, key: Hashable, version: tuple[Any, ...], value: Any) -> None:
        heft = self.weigh(value) if self.weigh is not None else 0
        old = self._kept.pop(key, None)
        if old is not None:
            self.weight -= old[3]
        if self.weigh is not None and heft > self.largest:
            return
        self._kept[key] = (version, self.clock(), value, heft)
        self.weight += heft
        while len(self._kept) > self.size or (self.weigh is not None
                                              and self.weight > self.max_weight):
            self.weight -= self._kept.popitem(last=False)[1][3]
