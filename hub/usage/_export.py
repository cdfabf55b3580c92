"""`usage export`: the ledger's rows of a period as a file, Parquet (zstd) or CSV, in the
ledger's own columns or in the FinOps FOCUS 1.x shape.

A month of a large fleet is tens of millions of rows, so nothing holds the period: the
database hands the rows over in chunks (a server-side cursor on PostgreSQL), each chunk
becomes a run of CSV lines or Arrow columns, and every ROW_GROUP rows of those columns one
Parquet row group. The file is written beside its target
under a temporary name and renamed at the end: an error (or a kill) leaves the old file or
none, never half of one.

The rows are the buckets starting in [start, end), exactly what `usage --from --until` sums:
an export's GPU-hours per group are that answer's.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_text  # json.dumps' escaping
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv
from hub.common import InputError, format_duration, iso
from hub.usage._bills import cloud_nodes, needs_nodes, node_prices
from hub.usage._ledger import MAX_BUCKETS, ledger_bucket
from hub.usage._prices import Prices

FORMATS = ("parquet", "csv")
#: rows per database fetch: as Python objects (the driver's result, the rows, the columns
#: made of them) a row takes over 1 KB, and a fetch of 20,000 rows held about 40 MB more
#: at an export's peak than one of 5,000 (no measurable CPU either way)
CHUNK = 5_000
#: rows per Parquet row group (what readers skip by; the file's layout since the first
#: export): a group's columns wait as Arrow arrays, a few hundred bytes a row
ROW_GROUP = 20_000
U = inv.usage

#: The FOCUS 1.x columns (FinOps Open Cost and Usage Specification) and gpufleet's own
#: figures beside them, x_-prefixed as FOCUS asks of provider-specific columns.
FOCUS_COLUMNS = [
    "BilledCost", "EffectiveCost", "BillingCurrency", "ChargeCategory", "ChargePeriodStart",
    "ChargePeriodEnd", "ConsumedQuantity", "ConsumedUnit", "ResourceId", "ResourceType",
    "SkuId", "Tags", "x_GpuHours", "x_AllocatedGpuHours", "x_BusyGpuHours",
    "x_SmActiveGpuHours", "x_EnergyKwh", "x_AvgUtilisationPct", "x_AllocationBasis",
]
_TIMES = {"bucket_start", "bucket_end", "ChargePeriodStart", "ChargePeriodEnd"}
_TEXT = {"cluster", "node", "uuid", "slice", "namespace", "pod", "vendor", "model",
         "allocation_basis", "BillingCurrency", "ChargeCategory", "ConsumedUnit", "ResourceId",
         "ResourceType", "SkuId", "Tags", "x_AllocationBasis"}


@dataclass
class ExportResult:
    rows: int
    gpu_hours: float
    path: Path


def columns(focus: bool) -> list[str]:
    return list(FOCUS_COLUMNS if focus else inv.USAGE_COLUMNS)


def check_period(conn: Connection, start: dt.datetime, end: dt.datetime) -> None:
    """At most MAX_BUCKETS of the ledger's buckets (an hour where it has none yet), the
    limit a collect has: a typo'd year is refused, not streamed."""
    bucket = ledger_bucket(conn) or 3600.0
    span = (min(end, dt.datetime(9999, 1, 1)) - max(start, dt.datetime(1970, 1, 1)))
    count = math.ceil(span.total_seconds() / bucket)
    if count > MAX_BUCKETS:
        raise InputError(f"the period holds {count:,} buckets of {format_duration(bucket)} "
                         f"(at most {MAX_BUCKETS:,}); narrow --from/--until")


def ledger_chunks(conn: Connection, start: dt.datetime, end: dt.datetime,
                  chunk: int = CHUNK) -> Iterator[Sequence[sa.Row]]:
    """The rows of buckets starting in [start, end), in the ledger's key order, ``chunk`` at
    a time (PostgreSQL: a server-side cursor; SQLite reads as it is asked)."""
    stmt = (sa.select(*[U.c[c] for c in inv.USAGE_COLUMNS])
            .where(U.c.bucket_start >= start, U.c.bucket_start < end)
            .order_by(U.c.bucket_start, U.c.cluster, U.c.node, U.c.uuid, U.c.slice,
                      U.c.namespace, U.c.pod))
    result = conn.execution_options(yield_per=chunk).execute(stmt)
    yield from result.partitions(chunk)


def focus_columns(part: Sequence[sa.Row], prices: Sequence[float | None],
                  currency: str | None) -> dict[str, list[Any]]:
    """Ledger rows as FOCUS charges, column by column (no dict per row: a chunk's columns
    are all that exists of it). The GPU (or MIG slice) is the resource, its model the SKU,
    the GPU-hours the consumed quantity; cluster, node, namespace and pod are tags. Cost is
    empty where no price applies (never 0: unbilled is not free)."""
    hours = [r.gpu_hours for r in part]
    held = [r.pod != "" for r in part]
    return {
        "BilledCost": (cost := [None if p is None else h * p
                                for h, p in zip(hours, prices, strict=True)]),
        "EffectiveCost": cost, "BillingCurrency": [currency] * len(part),
        "ChargeCategory": ["Usage"] * len(part),
        "ChargePeriodStart": [r.bucket_start for r in part],
        "ChargePeriodEnd": [r.bucket_end for r in part], "ConsumedQuantity": hours,
        "ConsumedUnit": ["GPU-Hours"] * len(part),
        "ResourceId": [f"{r.uuid}/{r.slice}" if r.slice else r.uuid for r in part],
        "ResourceType": ["MIG slice" if r.slice else "GPU" for r in part],
        "SkuId": [r.model for r in part], "Tags": [_tags(r) for r in part],
        "x_GpuHours": hours,
        "x_AllocatedGpuHours": [h if a else 0.0 for h, a in zip(hours, held, strict=True)],
        "x_BusyGpuHours": [r.gpu_hours * (r.avg_utilisation_pct or 0.0) / 100.0
                           for r in part],
        "x_SmActiveGpuHours": [None if r.avg_sm_active_pct is None
                               else r.gpu_hours * r.avg_sm_active_pct / 100.0 for r in part],
        "x_EnergyKwh": [None if r.energy_wh is None else r.energy_wh / 1000.0 for r in part],
        "x_AvgUtilisationPct": [r.avg_utilisation_pct for r in part],
        "x_AllocationBasis": [r.allocation_basis if a else None
                              for r, a in zip(part, held, strict=True)],
    }


def _tags(r: sa.Row) -> str:
    return _tags_of(r.cluster, r.node, r.namespace, r.pod)


def _tags_of(cluster: str, node: str, namespace: str, pod: str) -> str:
    """``json.dumps`` of the non-empty tags (keys in this order, no spaces), made by hand
    with json's own escaping: a row's worth of work instead of a dict and an encoder. Not
    cached: every GPU's placement is a distinct key, and a cache of a fleet's worth of them
    (100,000 strings and their keys' tuples) was tens of MB of an export's peak."""
    return "{" + ",".join(f'"{k}":{_json_text(v)}' for k, v in (
        ("cluster", cluster), ("namespace", namespace), ("node", node), ("pod", pod))
        if v) + "}"


class _Pricer:
    """A ledger row's price per GPU-hour: its node's (instance type) before its model's."""

    def __init__(self, conn: Connection, prices: Prices | None, start: dt.datetime,
                 end: dt.datetime) -> None:
        self.prices = prices
        self.nodes: Mapping[tuple[str, str], float] = (
            node_prices(cloud_nodes(conn), prices, None, start, end)
            if needs_nodes(prices, None) else {})

    def __call__(self, r: sa.Row) -> float | None:
        if self.prices is None:
            return None
        node = self.nodes.get((r.cluster, r.node))
        return node if node is not None else self.prices.price(r.cluster, r.model)


# -- writers ----------------------------------------------------------------------------------
def _arrow_schema(cols: Sequence[str]):  # -> pyarrow.Schema
    import pyarrow as pa

    def kind(c: str) -> Any:
        if c in _TIMES:
            return pa.timestamp("us", tz="UTC")
        return pa.string() if c in _TEXT else pa.float64()

    return pa.schema([(c, kind(c)) for c in cols])


_EPOCH = dt.datetime(1970, 1, 1)
_MICROSECOND = dt.timedelta(microseconds=1)


def arrow_array(values: Sequence[Any], kind: Any) -> Any:  # -> pyarrow.Array
    """A column of Python values (float, str, datetime or None) as an Arrow array of ``kind``,
    built from its buffers. ``pa.array`` on a Python list (or a numpy array) first asks
    whether it is a pandas object, and that question imports pandas: 46 MB that an export,
    which never uses pandas, would carry to its end. The values are those pa.array would
    make: None is null, NaN stays NaN, naive datetimes are UTC (the database's convention)."""
    import numpy as np
    import pyarrow as pa

    n = len(values)
    nulls = values.count(None)
    valid = (None if not nulls else pa.py_buffer(np.packbits(
        np.fromiter((v is not None for v in values), dtype=bool, count=n),
        bitorder="little")))
    if pa.types.is_floating(kind):
        data = np.array(values, dtype=np.float64)  # None becomes NaN under a null bit
        return pa.Array.from_buffers(kind, n, [valid, pa.py_buffer(data)], null_count=nulls)
    if pa.types.is_timestamp(kind):
        micros: dict[dt.datetime, int] = {}  # a chunk holds a few buckets' times
        for v in values:
            if v is not None and v not in micros:
                utc = v if v.tzinfo is None else v.astimezone(dt.UTC).replace(tzinfo=None)
                micros[v] = (utc - _EPOCH) // _MICROSECOND
        data = np.array([0 if v is None else micros[v] for v in values], dtype=np.int64)
        return pa.Array.from_buffers(kind, n, [valid, pa.py_buffer(data)], null_count=nulls)
    if pa.types.is_string(kind):
        encoded = [b"" if v is None else v.encode() for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
        if offsets[-1] >= 2**31:  # a string array's offsets are 32-bit
            raise ValueError(f"{offsets[-1]:,} bytes of text in one chunk: export fewer rows "
                             "at a time")
        return pa.Array.from_buffers(
            kind, n, [valid, pa.py_buffer(offsets.astype(np.int32)),
                      pa.py_buffer(b"".join(encoded))], null_count=nulls)
    raise TypeError(f"no Arrow column of {kind} here")


class _ParquetSink:
    """Chunks in, row groups of ``row_group`` rows out: the chunks' columns wait as Arrow
    arrays (compact) and each group is written from contiguous arrays, so the file is the
    one a single chunk of the group's size made."""

    def __init__(self, fh: IO[bytes], cols: Sequence[str], row_group: int) -> None:
        import pyarrow.parquet as pq

        self.cols, self.schema = list(cols), _arrow_schema(cols)
        self.writer = pq.ParquetWriter(fh, self.schema, compression="zstd")
        self.row_group = row_group
        self.pending: list[Any] = []  # pyarrow.RecordBatch
        self.rows = 0

    def write(self, data: dict[str, list[Any]]) -> None:
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(
            [arrow_array(data[f.name], f.type) for f in self.schema], schema=self.schema)
        self.pending.append(batch)
        self.rows += batch.num_rows
        while self.rows >= self.row_group:
            self._flush(self.row_group)

    def _flush(self, rows: int) -> None:
        import pyarrow as pa

        table = pa.Table.from_batches(self.pending, self.schema)
        self.pending = []
        table = table.combine_chunks()  # the chunks' own buffers go as it is made
        self.writer.write_table(table.slice(0, rows), row_group_size=rows)
        rest = table.slice(rows)
        self.pending, self.rows = rest.to_batches(), rest.num_rows

    def finish(self) -> None:
        if self.rows:
            self._flush(self.rows)

    def close(self) -> None:
        self.writer.close()


#: a cell a spreadsheet would run as a formula (CSV injection): = + - @, tab, carriage return
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value: Any) -> Any:
    """Text that a spreadsheet would take for a formula gets a leading quote (OWASP's advice);
    numbers are left as numbers (a negative number is not text)."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


class _CsvSink:
    def __init__(self, fh: IO[bytes], cols: Sequence[str]) -> None:
        self.text = io.TextIOWrapper(fh, encoding="utf-8", newline="")
        self.cols = list(cols)
        self.out = csv.writer(self.text, lineterminator="\n")
        self.out.writerow(self.cols)

    def write(self, data: dict[str, list[Any]]) -> None:
        self.out.writerows(zip(*[[_csv(v) for v in data[c]] for c in self.cols],
                               strict=True))

    def finish(self) -> None:
        pass

    def close(self) -> None:
        self.text.detach()  # flushed; the file itself is the caller's to close


def _csv(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dt.datetime):
        return iso(value)
    if isinstance(value, float):
        return repr(value)  # every digit: an export sums to the answer exactly
    return safe_cell(value)


# -- the file ---------------------------------------------------------------------------------
def check_target(path: str, force: bool) -> Path:
    target = Path(os.path.abspath(path))
    if target.is_dir():
        raise InputError(f"--out {path} is a directory")
    if target.exists() and not force:
        raise InputError(f"--out {path} exists; add --force to replace it")
    if not target.parent.is_dir():
        raise InputError(f"--out {path}: directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise InputError(f"--out {path}: directory {target.parent} is not writable")
    return target


@contextlib.contextmanager
def atomic_file(target: Path, force: bool) -> Iterator[IO[bytes]]:
    """A temporary file beside ``target``, renamed onto it once the block ends; removed on
    any error. Without ``force`` a file that appeared meanwhile is not replaced."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp",
                                   dir=target.parent)
    except OSError as exc:
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        if force:
            os.replace(tmp, target)
        else:
            os.link(tmp, target)  # fails, rather than replaces, if it exists by now
            os.unlink(tmp)
    except FileExistsError:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"--out {target} appeared while exporting; add --force to replace "
                         "it") from None
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {target}: {exc.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_usage(conn: Connection, start: dt.datetime, end: dt.datetime, out: str, *,
                 fmt: str, focus: bool = False, force: bool = False,
                 prices: Prices | None = None, chunk: int = CHUNK, row_group: int = ROW_GROUP,
                 on_chunk: Callable[[int], None] | None = None) -> ExportResult:
    """Write the ledger's rows of buckets starting in [start, end) to ``out``, ``chunk``
    rows read at a time, in Parquet row groups of ``row_group`` rows."""
    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    if end <= start:
        raise InputError("--until must be after --from")
    target = check_target(out, force)
    check_period(conn, start, end)
    cols = columns(focus)
    pricer = _Pricer(conn, prices, start, end) if focus else None
    currency = prices.currency if prices is not None else None
    rows = 0
    hours = 0.0
    with atomic_file(target, force) as fh:
        sink: _ParquetSink | _CsvSink = (_ParquetSink(fh, cols, row_group)
                                         if fmt == "parquet" else _CsvSink(fh, cols))
        try:
            for part in ledger_chunks(conn, start, end, chunk):
                if pricer is not None:
                    data = focus_columns(part, [pricer(r) for r in part], currency)
                else:
                    data = dict(zip(cols, map(list, zip(*part, strict=True)), strict=True))
                sink.write(data)
                rows += len(part)
                hours += sum(r.gpu_hours for r in part)
                if on_chunk:
                    on_chunk(len(part))
            sink.finish()
        finally:
            sink.close()
    return ExportResult(rows, hours, target)
