"""The GPU inventory database (SQLAlchemy Core; SQLite by default, PostgreSQL by URL).

The store remembers: a GPU, node or cluster that stops reporting is marked stale, never
deleted, and becomes active again when it reports. Writes are bulk upserts (one statement per
table per sync) so a sync's cost is a handful of round trips whatever the fleet size.

Timestamps are stored as naive UTC datetimes on both databases and turned into ISO-8601 with a
``Z`` at the output edge.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from hub.common import InputError, UnavailableError, redact, shorten
from hub.store import Refused

metadata = sa.MetaData()


def _seen() -> list[sa.Column]:
    """When a row was first and last seen by a sync, and the data's own newest sample time."""
    return [
        sa.Column("first_seen", sa.DateTime, nullable=False),
        sa.Column("last_seen", sa.DateTime, nullable=False),
        sa.Column("last_sample_at", sa.DateTime),
    ]

ACTIVE = "active"
STALE = "stale"

clusters = sa.Table(
    "clusters", metadata,
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    *_seen(),
    # which dcgm naming its NVIDIA GPUs send (legacy | dcgm-4.7 | both), since when (0011)
    sa.Column("naming", sa.String(16)),
    sa.Column("naming_since", sa.DateTime),
)

#: What each cluster's GPUs were seen through at the latest sync, besides its GPU series:
#: the planning query's sources (store.SOURCE_LABEL: card info, OpenShift's accelerator
#: series, gpufleet's exporter, ACM's managed-cluster list) with their counts. Replaced whole
#: by every sync (0017): a dark spoke whose cards are known but whose exporter sends nothing
#: is a row here, never a cluster of 0 GPUs.
cluster_sources = sa.Table(
    "cluster_sources", metadata,
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("source", sa.String(32), primary_key=True),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("at", sa.DateTime, nullable=False),
)

nodes = sa.Table(
    "nodes", metadata,
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),
    *_seen(),
)

# A GPU is its identity (uuid + slice), wherever it reports: cluster and node say where it
# reports now, and a change of either is a `moved` event, not a second GPU (migration 0005).
gpus = sa.Table(
    "gpus", metadata,
    sa.Column("uuid", sa.String(128), primary_key=True),
    # '' for the physical GPU, 'profile/instance' for a MIG slice: a primary key cannot be NULL
    sa.Column("slice_key", sa.String(64), primary_key=True),
    sa.Column("cluster", sa.String(253), nullable=False),
    sa.Column("node", sa.String(253), nullable=False),
    sa.Column("mig_profile", sa.String(32)),
    sa.Column("mig_instance", sa.String(16)),
    sa.Column("vendor", sa.String(16), nullable=False),
    sa.Column("gpu_index", sa.Integer),
    sa.Column("model", sa.String(128)),
    sa.Column("driver_version", sa.String(64)),
    sa.Column("pci_bus_id", sa.String(32)),
    sa.Column("serial", sa.String(64)),
    sa.Column("memory_total_mib", sa.Float),
    sa.Column("memory_used_mib", sa.Float),
    sa.Column("utilisation_pct", sa.Float),
    sa.Column("power_w", sa.Float),
    sa.Column("temperature_c", sa.Float),
    sa.Column("health", sa.String(16)),  # ok | degraded | failed; NULL: nothing reported
    sa.Column("health_reasons", sa.Text),  # e.g. "xid 79; row remap failure"
    sa.Column("state", sa.String(16), nullable=False),
    # JSON [[cluster, node], ...]: other places that reported this GPU concurrently in the
    # latest sync (a mislabelled cluster or a cloned node: the duplicate_uuid check)
    sa.Column("also_reporting", sa.Text),
    *_seen(),
    sa.Index("ix_gpus_state", "state"),
    sa.Index("ix_gpus_cluster_node", "cluster", "node"),
)

allocations = sa.Table(
    "allocations", metadata,
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("uuid", sa.String(128), primary_key=True),
    sa.Column("slice_key", sa.String(64), primary_key=True),
    sa.Column("namespace", sa.String(253), primary_key=True),
    sa.Column("pod", sa.String(253), primary_key=True),
    sa.Column("container", sa.String(253), primary_key=True),
    *_seen(),
)

#: What happened to a GPU, written by the sync in its transaction (and by prune): appeared,
#: stale, returned, moved, changed, pruned; health (old, new, reasons) and replaced (slot,
#: old, new: hub/inventory/_life.py). ``details`` is a JSON object (from/to, field/old/new).
events = sa.Table(
    "events", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.DateTime, nullable=False),
    sa.Column("type", sa.String(16), nullable=False),
    sa.Column("cluster", sa.String(253)),
    sa.Column("node", sa.String(253)),
    sa.Column("uuid", sa.String(128)),
    sa.Column("slice", sa.String(64)),
    sa.Column("details", sa.Text),
    sa.Index("ix_events_at", "at"),
    sa.Index("ix_events_uuid_at", "uuid", "at"),
)
EVENT_TYPES = ("appeared", "stale", "returned", "moved", "changed", "pruned", "health",
               "replaced")

sync_runs = sa.Table(
    "sync_runs", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("started_at", sa.DateTime, nullable=False),
    sa.Column("finished_at", sa.DateTime),
    sa.Column("status", sa.String(16), nullable=False),  # ok | failed
    sa.Column("requests", sa.Integer, nullable=False, default=0),
    # shards of clusters the queries were asked for (requests = 1 + shards x the set)
    sa.Column("shards", sa.Integer),
    sa.Column("clusters", sa.Integer),
    sa.Column("nodes", sa.Integer),
    sa.Column("gpus", sa.Integer),
    sa.Column("error", sa.Text),
)

#: What a spoke sent that the hub left out (issue 42), per cluster: series the store's door
#: turned away (kind ``label``) and readings out of their physical range (kind: the field).
#: ``source`` "sync" keeps the latest sync's (``at`` its time); "usage" one set per ledger
#: bucket (``at`` its start), replaced when the bucket is and aged out with it (0017).
refused_inputs = sa.Table(
    "refused_inputs", metadata,
    sa.Column("source", sa.String(16), primary_key=True),  # sync | usage
    sa.Column("at", sa.DateTime, primary_key=True),
    sa.Column("cluster", sa.String(253), primary_key=True),
    sa.Column("kind", sa.String(64), primary_key=True),
    sa.Column("count", sa.Integer, nullable=False),
    sa.Column("example", sa.String(255), nullable=False),  # the first reason, cut
)


# -- engine ---------------------------------------------------------------------------------
def default_db_url() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(base) / 'gpufleet' / 'inventory.db'}"


def safe_url(engine_or_url: Engine | sa.URL | str) -> str:
    url = engine_or_url.url if isinstance(engine_or_url, Engine) else sa.make_url(engine_or_url)
    return url.render_as_string(hide_password=True)


def make_engine(url: str | None, *, create: bool = False) -> Engine:
    """An engine for the inventory; SQLite gets WAL and explicit BEGIN handling.

    With ``create`` false a missing SQLite file is an error instead of a new empty database,
    so a typo in --db never silently shows an empty inventory.
    """
    url = url or default_db_url()
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise InputError(f"invalid database URL {url!r} (expected e.g. sqlite:///path or "
                         "postgresql+psycopg://user@host/db)") from None
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if path and path != ":memory:":
            if create:
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise InputError(f"cannot create the directory of inventory database "
                                     f"{path}: {exc.strerror}") from None
            elif not Path(path).exists():
                raise UnavailableError(
                    f"inventory database {path} does not exist yet: run `gpufleet sync` first"
                )
    try:
        engine = sa.create_engine(parsed)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        raise InputError(f"unsupported database URL {safe_url(parsed)}: {exc}") from None
    if engine.dialect.name == "sqlite":
        _sqlite_setup(engine)
    return engine


@contextmanager
def open_engine(url: str | None, *, create: bool = False) -> Iterator[Engine]:
    """An engine (:func:`make_engine`) whose connection failures become one-line exit-3
    errors, disposed of at the end: what a command or a service worker opens."""
    engine = make_engine(url, create=create)
    try:
        yield engine
    except sa.exc.DatabaseError as exc:
        # OperationalError (unreachable, locked) or a bare DatabaseError (a file that is not
        # a database); integrity or programming errors are bugs and keep their traceback.
        if type(exc) not in (sa.exc.OperationalError, sa.exc.DatabaseError):
            raise
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else "connection failed"
        raise UnavailableError(
            f"inventory database {safe_url(engine)} unavailable: {reason}"
        ) from None
    finally:
        engine.dispose()


def _sqlite_setup(engine: Engine) -> None:
    """SQLite: we emit BEGIN ourselves so a sync can take the write lock up front."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout = 5000")
        if engine.url.database not in (None, "", ":memory:"):
            cur.execute("PRAGMA journal_mode = WAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        opts = conn.get_execution_options()
        busy_ms = opts.get("sqlite_busy_ms")
        if busy_ms is not None:
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(busy_ms)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if opts.get("sqlite_immediate") else "BEGIN")


LOCK_KEY = 0x6770_7566  # "gpuf": the advisory lock id of the sync on PostgreSQL
LEDGER_LOCK_KEY = 0x6770_7567  # the usage ledger's writers (hub/usage/_ledger.py)


class LockHeld(UnavailableError):
    """Another sync holds the inventory lock."""


class LeaseLost(LockHeld):
    """Another process took the schedule's lease over while this one was about to write
    (hub.service._leader): nothing was written, and the run is not a failure."""


@contextmanager
def locked_transaction(engine: Engine, lock_timeout: float, *, key: int = LOCK_KEY,
                       holder: str = "sync") -> Iterator[Connection]:
    """One transaction that no other holder of the same lock (a sync, by default; a usage
    ledger writer with LEDGER_LOCK_KEY) on the same database can run beside.

    SQLite: BEGIN IMMEDIATE takes the database's write lock (readers go on, thanks to WAL),
    waiting up to the timeout. PostgreSQL: a transaction-scoped advisory lock, polled until the
    timeout. Either way the lock ends with the transaction, so a crash cannot leave it held.
    """
    msg = (f"another {holder} holds the inventory lock on {safe_url(engine)} "
           f"(waited {lock_timeout:g}s; raise --lock-timeout to wait longer)")
    if engine.dialect.name == "sqlite":
        conn = engine.connect().execution_options(
            sqlite_immediate=True, sqlite_busy_ms=int(lock_timeout * 1000)
        )
        try:
            try:
                trans = conn.begin()
            except sa.exc.OperationalError as exc:
                if "locked" in str(exc.orig):
                    raise LockHeld(msg) from None
                raise
            with trans:
                conn.exec_driver_sql("PRAGMA busy_timeout = 5000")
                yield conn
        finally:
            conn.close()
        return
    with engine.connect() as conn, conn.begin():
        deadline = time.monotonic() + lock_timeout
        while not conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(key))).scalar():
            if time.monotonic() >= deadline:
                raise LockHeld(msg)
            time.sleep(0.1)
        yield conn


# -- writes ---------------------------------------------------------------------------------
def _insert(conn: Connection, table: sa.Table):  # dialect-specific INSERT ... ON CONFLICT
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table)
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert(table)


_T = TypeVar("_T")

#: rows a statement carries (executemany): bounded, so memory does not grow with the fleet
BATCH = 5000


def _batches(rows: Iterable[_T]) -> Iterator[list[_T]]:
    it = iter(rows)
    while batch := list(itertools.islice(it, BATCH)):
        yield batch


def upsert(conn: Connection, table: sa.Table, rows: Iterable[dict[str, Any]],
           update: Sequence[str], keep_if_null: Sequence[str] = ()) -> int:
    """Bulk INSERT ... ON CONFLICT (the primary key) DO UPDATE of the ``update`` columns
    (first_seen is only ever set on insert): the one upsert of every inventory table, on
    SQLite and PostgreSQL alike.

    ``rows`` may be a generator: it is written BATCH rows at a time, never held whole; every
    row carries the same keys. The statement is compiled once and each batch handed to the
    driver as its parameters: SQLAlchemy's per-row work (a dict of binds and a type
    processor a value) cost more than SQLite's own (0.45 s against 0.19 s for 50,000
    allocations), and a sync upserts every node and allocation it saw.
    Returns how many rows it wrote."""
    written = 0
    driver: _DriverInsert | None = None
    for batch in _batches(rows):
        if driver is None:
            driver = _driver_insert(conn, table, tuple(batch[0]), tuple(update),
                                    tuple(keep_if_null))
        conn.exec_driver_sql(driver.sql, driver.params(batch))
        written += len(batch)
    return written


class _DriverInsert:
    """An upsert compiled for one dialect and set of keys, with the parameters as its driver
    takes them (positional tuples for SQLite, the named dicts for psycopg)."""

    def __init__(self, conn: Connection, table: sa.Table, keys: tuple[str, ...],
                 update: tuple[str, ...], keep_if_null: tuple[str, ...]) -> None:
        stmt = _insert(conn, table)
        set_ = {}
        for col in update:
            new = stmt.excluded[col]
            set_[col] = sa.func.coalesce(new, table.c[col]) if col in keep_if_null else new
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.name for c in table.primary_key.columns], set_=set_)
        compiled = stmt.compile(dialect=conn.dialect, column_keys=list(keys))
        self.sql = compiled.string
        self.positional = bool(compiled.positional)
        self.names: tuple[str, ...] = (tuple(compiled.positiontup or ()) if self.positional
                                       else keys)
        # the columns whose values the dialect converts (SQLite: every datetime to text)
        self.convert = [(i, p) for i, name in enumerate(self.names)
                        if (p := _converter(conn, table.c[name])) is not None]

    def params(self, batch: list[dict[str, Any]]) -> list[Any]:
        if not self.convert:
            if not self.positional:
                return batch
            names = self.names
            return [tuple(row[n] for n in names) for row in batch]
        # a value repeats down a batch (now, a node's sample time): converted once
        memo: list[dict[Any, Any]] = [{} for _ in self.convert]
        out: list[Any] = []
        names = self.names
        for row in batch:
            values = [row[n] for n in names]
            for (i, convert), seen in zip(self.convert, memo, strict=True):
                v = values[i]
                try:
                    values[i] = seen[v]
                except KeyError:
                    values[i] = seen[v] = convert(v)
                except TypeError:  # unhashable (a JSON value)
                    values[i] = convert(v)
            out.append(tuple(values) if self.positional else dict(zip(names, values,
                                                                      strict=True)))
        return out


_DRIVER_INSERTS: dict[tuple[Any, ...], _DriverInsert] = {}


def _driver_insert(conn: Connection, table: sa.Table, keys: tuple[str, ...],
                   update: tuple[str, ...], keep_if_null: tuple[str, ...]) -> _DriverInsert:
    cache_key = (conn.dialect.name, conn.dialect.driver, table, keys, update, keep_if_null)
    found = _DRIVER_INSERTS.get(cache_key)
    if found is None:
        found = _DRIVER_INSERTS[cache_key] = _DriverInsert(conn, table, keys, update,
                                                           keep_if_null)
    return found


def stored(conn: Connection, column: sa.Column) -> Callable[[Any], Any]:
    """What the database stores and hands back (read by :func:`plain_rows`) for a value of
    ``column``: SQLite's text for a datetime, the value itself where the driver converts
    (PostgreSQL). Compared with the table's plain rows, so neither side is parsed."""
    convert = _converter(conn, column)
    return convert if convert is not None else _itself


def _converter(conn: Connection, column: sa.Column) -> Callable[[Any], Any] | None:
    """How the dialect turns a value of ``column`` into what its driver takes (None: as
    it is)."""
    return column.type.dialect_impl(conn.dialect).bind_processor(conn.dialect)


def _itself(value: Any) -> Any:
    return value


def plain_rows(conn: Connection, table: sa.Table, columns: Sequence[str], key: str,
               values: Sequence[str]) -> list[tuple[Any, ...]]:
    """The rows whose ``key`` is one of ``values`` (at most BATCH), as the driver hands them
    back: plain tuples of stored values (see :func:`stored`), without SQLAlchemy's row
    objects and result processing, which were most of the sync's read of its held GPUs."""
    names = ", ".join(table.c[c].name for c in columns)
    where = table.c[key].name
    if conn.dialect.name == "postgresql":
        sql = f"SELECT {names} FROM {table.name} WHERE {where} = ANY(%(keys)s)"
        result = conn.exec_driver_sql(sql, {"keys": list(values)})
    else:
        marks = ", ".join("?" * len(values))
        result = conn.exec_driver_sql(
            f"SELECT {names} FROM {table.name} WHERE {where} IN ({marks})", tuple(values))
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


def insert_rows(conn: Connection, table: sa.Table, rows: Iterable[dict[str, Any]]) -> None:
    """INSERT ``rows`` (a generator is fine) BATCH at a time: memory stays bounded however
    many there are."""
    for batch in _batches(rows):
        conn.execute(table.insert(), batch)


def utc(ts: float | None) -> dt.datetime | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, dt.UTC).replace(tzinfo=None)


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _event(at: dt.datetime, type_: str, cluster: str, node: str, uuid: str, slice_key: str,
           /, **details: Any) -> dict[str, Any]:
    return {"at": at, "type": type_, "cluster": cluster, "node": node, "uuid": uuid,
            "slice": slice_key or None,
            "details": json.dumps(details, sort_keys=True, default=str) if details else None}



def write_namings(conn: Connection, namings: Mapping[str, str], now: dt.datetime) -> None:
    """Each cluster's naming (legacy | dcgm-4.7 | both); naming_since moves only when the
    naming changes, so "both for longer than a day" can be read from the row."""
    held = dict(conn.execute(sa.select(clusters.c.cluster, clusters.c.naming)).all())
    for cluster, naming in namings.items():
        if cluster in held and held[cluster] != naming:
            conn.execute(clusters.update().where(clusters.c.cluster == cluster)
                         .values(naming=naming, naming_since=now))


def write_sources(conn: Connection, sources: Mapping[str, Mapping[str, int]],
                  now: dt.datetime) -> None:
    """Replace every cluster's sources with what this sync's planning query saw."""
    conn.execute(cluster_sources.delete())
    rows = [{"cluster": cluster, "source": source, "count": count, "at": now}
            for cluster, found in sorted(sources.items()) for source, count in found.items()]
    if rows:
        conn.execute(cluster_sources.insert(), rows)


def read_sources(conn: Connection) -> dict[str, dict[str, int]]:
    """cluster -> source -> count, as the latest sync saw them."""
    out: dict[str, dict[str, int]] = {}
    for cluster, source, count in conn.execute(
            sa.select(cluster_sources.c.cluster, cluster_sources.c.source,
                      cluster_sources.c.count)):
        out.setdefault(cluster, {})[source] = count
    return out


def write_refused(conn: Connection, source: str, at: dt.datetime, refused: Refused) -> None:
    """Replace what ``source`` refused at ``at``: the whole latest set for a sync, one
    bucket's for the usage ledger (the caller's transaction writes it with the run)."""
    table = refused_inputs
    if source == "sync":
        conn.execute(table.delete().where(table.c.source == source))
    else:
        conn.execute(table.delete().where(table.c.source == source, table.c.at == at))
    insert_rows(conn, table, [{**row, "source": source, "at": at,
                               "example": shorten(str(row["example"]), 255)}
                              for row in refused.rows()])


def list_refused(conn: Connection, since: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Refused inputs: the latest sync's, and the usage buckets' from ``since`` on."""
    table = refused_inputs
    stmt = sa.select(table).order_by(table.c.source, table.c.cluster, table.c.kind,
                                     table.c.at)
    if since is not None:
        stmt = stmt.where(sa.or_(table.c.source == "sync", table.c.at >= since))
    return [dict(r) for r in conn.execute(stmt).mappings()]


def record_run(conn: Connection, *, started_at: dt.datetime, status: str, requests: int,
               counts: dict[str, int] | None = None, error: str | None = None,
               shards: int | None = None) -> None:
    counts = counts or {}
    conn.execute(sync_runs.insert().values(
        started_at=started_at, finished_at=now_utc(), status=status, requests=requests,
        shards=shards,
        clusters=counts.get("clusters"), nodes=counts.get("nodes"), gpus=counts.get("gpus"),
        error=error,
    ))


# -- reads ----------------------------------------------------------------------------------
GPU_COLUMNS = [
    "cluster", "node", "uuid", "index", "vendor", "model", "memory_total_mib", "mig_profile",
    "mig_instance", "state", "first_seen", "last_seen", "last_sample_at", "utilisation_pct",
    "memory_used_mib", "power_w", "temperature_c", "driver_version", "pci_bus_id", "serial",
    "health", "health_reasons",
]
#: gpus: physical GPUs reporting (active); stale_gpus: known physical GPUs that stopped, so a
#: silent cluster shows what was last known instead of a bare 0
#: gpus_via: how Kubernetes publishes the node's GPUs (dra | device-plugin | dra+device-plugin)
NODE_COLUMNS = ["cluster", "node", "gpus", "stale_gpus", "state", "last_seen", "last_sample_at",
                "gpus_via"]
#: naming: which dcgm naming its NVIDIA GPUs send (legacy | dcgm-4.7 | both), since when
#: seen_through: what its GPUs are seen through (dcgm legacy | dcgm 4.7 | both | amd |
#: gpufleet exporter, joined by " + "; card info only; none); cards: GPU cards node-exporter
#: (or OpenShift's accelerator series) counts there, whatever the exporter sends; acm: how
#: ACM lists the cluster (managed | maintenance; None: not in acm_managed_cluster_labels)
#: nodes: nodes reporting (active); known_nodes: every node it has had, stale ones too, so a
#: silent cluster reads "0 of 4" as the report's "0/4 reporting" does, not a bare 0
CLUSTER_COLUMNS = ["cluster", "nodes", "known_nodes", "gpus", "stale_gpus", "state", "last_seen",
                   "last_sample_at", "naming", "naming_since", "seen_through", "cards",
                   "acm"]
ALLOCATION_COLUMNS = ["cluster", "node", "uuid", "mig_profile", "namespace", "pod", "container",
                      "first_seen", "last_seen"]


def _where_cluster(stmt: sa.Select, table: sa.Table, cluster: str | None) -> sa.Select:
    return stmt.where(table.c.cluster == cluster) if cluster else stmt


def gpu_item(row: Mapping[Any, Any]) -> dict[str, Any]:
    """One gpus row as every consumer shows it (CLI JSON, API): ``index``, not gpu_index."""
    item = {c: (row["gpu_index"] if c == "index" else row[c]) for c in GPU_COLUMNS}
    # one type everywhere (CLI JSON, API): the MIG instance is a number like the index
    instance = item.get("mig_instance")
    if isinstance(instance, str) and instance.isdigit():
        item["mig_instance"] = int(instance)
    return item


def list_gpus(conn: Connection, cluster: str | None = None) -> list[dict[str, Any]]:
    stmt = _where_cluster(sa.select(gpus), gpus, cluster).order_by(
        gpus.c.cluster, gpus.c.node, gpus.c.gpu_index, gpus.c.uuid, gpus.c.slice_key)
    return [gpu_item(row) for row in conn.execute(stmt).mappings()]


def _gpu_counts(*keys: sa.Column, cluster: str | None) -> sa.Subquery:
    """Active and stale physical GPUs per ``keys``, in one grouped pass over gpus (a
    correlated count per row let SQLite pick the state index and scan every active GPU
    once per node: 75 ms for one cluster's nodes at 10,000 GPUs)."""
    physical = gpus.c.slice_key == ""
    stmt = sa.select(
        *keys,
        sa.func.sum(sa.case((sa.and_(physical, gpus.c.state == ACTIVE), 1), else_=0)
                    ).label("gpus"),
        sa.func.sum(sa.case((sa.and_(physical, gpus.c.state != ACTIVE), 1), else_=0)
                    ).label("stale_gpus"),
    ).group_by(*keys)
    return _where_cluster(stmt, gpus, cluster).subquery()


def list_clusters(conn: Connection, cluster: str | None = None) -> list[dict[str, Any]]:
    active_query = sa.select(
        nodes.c.cluster,
        sa.func.sum(sa.case((nodes.c.state == ACTIVE, 1), else_=0)).label("nodes"),
        sa.func.count().label("known_nodes"),
    ).group_by(nodes.c.cluster)
    active_nodes = _where_cluster(active_query, nodes, cluster).subquery()
    counts = _gpu_counts(gpus.c.cluster, cluster=cluster)
    joined = clusters.outerjoin(active_nodes, active_nodes.c.cluster == clusters.c.cluster
                                ).outerjoin(counts, counts.c.cluster == clusters.c.cluster)
    stmt = _where_cluster(
        sa.select(clusters.c.cluster, sa.func.coalesce(active_nodes.c.nodes, 0).label("nodes"),
                  sa.func.coalesce(active_nodes.c.known_nodes, 0).label("known_nodes"),
                  sa.func.coalesce(counts.c.gpus, 0).label("gpus"),
                  sa.func.coalesce(counts.c.stale_gpus, 0).label("stale_gpus"),
                  clusters.c.state, clusters.c.last_seen, clusters.c.last_sample_at,
                  clusters.c.naming, clusters.c.naming_since,
                  ).select_from(joined), clusters, cluster,
    ).order_by(clusters.c.cluster)
    rows = [dict(r) for r in conn.execute(stmt).mappings()]
    return _with_sources(conn, rows, cluster)


def _with_sources(conn: Connection, rows: list[dict[str, Any]],
                  cluster: str | None) -> list[dict[str, Any]]:
    """Each cluster row with what its GPUs are seen through and the cards known from
    node-exporter (store.seen_through), plus a row for each dark cluster: cards known, no
    exporter series ever (it has no row of its own, and must not read as 0 GPUs)."""
    from hub import store

    sources = read_sources(conn)
    vendors: dict[str, set[str]] = {}
    active = sa.select(gpus.c.cluster, gpus.c.vendor).where(
        gpus.c.state == ACTIVE, gpus.c.slice_key == "").group_by(gpus.c.cluster, gpus.c.vendor)
    for name, vendor in conn.execute(_where_cluster(active, gpus, cluster)):
        vendors.setdefault(name, set()).add(vendor)
    known = {r["cluster"] for r in rows}
    for name, found in sources.items():
        if name not in known and store.known_cards(found) and cluster in (None, name):
            rows.append({"cluster": name, "nodes": 0, "known_nodes": 0, "gpus": 0, "stale_gpus": 0,
                         "state": None, "last_seen": None, "last_sample_at": None,
                         "naming": None, "naming_since": None})
    for row in rows:
        found = sources.get(row["cluster"], {})
        row["seen_through"] = store.seen_through(vendors.get(row["cluster"], ()),
                                                 row["naming"], found)
        row["cards"] = store.known_cards(found)
        row["acm"] = store.acm_view(found)
    return sorted(rows, key=lambda r: r["cluster"])


def _allocation_item(row: Mapping[Any, Any]) -> dict[str, Any]:
    item = dict(row)
    item["mig_profile"] = row["slice_key"].split("/")[0] if row["slice_key"] else None
    return {c: item[c] for c in ALLOCATION_COLUMNS}


def list_allocations(conn: Connection, cluster: str | None = None) -> list[dict[str, Any]]:
    stmt = _where_cluster(sa.select(allocations), allocations, cluster).order_by(
        allocations.c.cluster, allocations.c.node, allocations.c.uuid, allocations.c.first_seen)
    return [_allocation_item(row) for row in conn.execute(stmt).mappings()]


def list_sync_runs(conn: Connection, limit: int = 20) -> list[dict[str, Any]]:
    """Latest runs first. Errors are redacted again on the way out: a row written by an older
    gpufleet, before errors were redacted when stored, must not serve a token today."""
    stmt = sa.select(sync_runs).order_by(sync_runs.c.id.desc()).limit(limit)
    return [{**r, "error": redact(r["error"]) if r["error"] else r["error"]}
            for r in conn.execute(stmt).mappings()]


EVENT_COLUMNS = ["at", "type", "cluster", "node", "uuid", "slice", "details"]


def event_item(row: Mapping[Any, Any]) -> dict[str, Any]:
    """One events row as consumers show it: details decoded from its JSON text."""
    item = {c: row[c] for c in EVENT_COLUMNS}
    item["details"] = json.loads(row["details"]) if row["details"] else {}
    return item


def list_events(conn: Connection, *, since: dt.datetime | None = None,
                cluster: str | None = None, uuid: str | None = None,
                type_: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
    """Events, newest first (ties: the order they were written, newest first)."""
    stmt = sa.select(events)
    if since is not None:
        stmt = stmt.where(events.c.at >= since)
    if cluster:
        stmt = stmt.where(events.c.cluster == cluster)
    if uuid:
        stmt = stmt.where(events.c.uuid == uuid)
    if type_:
        stmt = stmt.where(events.c.type == type_)
    stmt = stmt.order_by(events.c.at.desc(), events.c.id.desc())
    if limit:
        stmt = stmt.limit(limit)
    return [event_item(r) for r in conn.execute(stmt).mappings()]


def gpu_rows(conn: Connection, uuid: str) -> list[dict[str, Any]]:
    """The GPU and its MIG slices (physical first), or [] when the uuid is unknown."""
    stmt = sa.select(gpus).where(gpus.c.uuid == uuid).order_by(gpus.c.slice_key)
    return [gpu_item(r) for r in conn.execute(stmt).mappings()]


def gpu_allocations(conn: Connection, uuid: str) -> list[dict[str, Any]]:
    stmt = (sa.select(allocations).where(allocations.c.uuid == uuid)
            .order_by(allocations.c.last_seen.desc(), allocations.c.namespace,
                      allocations.c.pod))
    return [_allocation_item(row) for row in conn.execute(stmt).mappings()]
