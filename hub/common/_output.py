"""Render lists of plain dicts as a table, JSON or CSV: every listing command goes through here.

Commands build plain data; this module is the only place that knows about terminals.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import io
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import click

FORMATS = ("table", "json", "csv")


def output_option(*formats: str, default: str = "table", json_is: str = "a list of objects"):
    """The ``-o/--output`` option, with the formats a command supports; ``json_is`` says
    what its json is ("one object" where a command answers with one)."""
    choices = formats or FORMATS
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        help=f"Output format. json is {json_is} for scripts.",
    )


def iso(ts: dt.datetime | None) -> str | None:
    """ISO-8601 UTC with a Z; naive datetimes (SQLite) are UTC by convention here."""
    if ts is None:
        return None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.UTC)
    return ts.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return iso(value)
    return value


def to_json(rows: Any) -> str:
    return json.dumps(rows, indent=2, default=_plain, sort_keys=False)


#: what a spreadsheet reads as the start of a formula (OWASP's CSV-injection list): a pod,
#: namespace or label a spoke names ``=HYPERLINK(...)`` would run when the export is opened
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A cell that a spreadsheet shows as text, never runs: a string that would start a
    formula gets OWASP's leading single quote. Only strings: a number (-1.5) stays a number a
    spreadsheet can add up; what a spoke controls (names, labels) always arrives as text."""
    value = _plain(value)
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Every ``-o csv`` goes through here, so every cell is escaped (csv_cell) in one place.

    The rows end in ``\n`` as before, but the writer is told ``\r\n``: Python's writer quotes
    only the characters of its line terminator, and a bare ``\r`` left unquoted in a cell
    splits the row for every reader."""
    buf = io.StringIO()
    line = io.StringIO()
    writer = csv.writer(line, lineterminator="\r\n")
    lines: list[list[Any]] = [list(columns)]
    lines += ([csv_cell(row.get(k)) for k in columns] for row in rows)
    for values in lines:
        line.seek(0)
        line.truncate()
        writer.writerow(values)
        buf.write(line.getvalue()[:-2] + "\n")
    return buf.getvalue()


def frame_to_csv(frame: Any) -> str:
    """A pandas DataFrame (query --range's MetricRangeDataFrame) through to_csv: its label
    values come from spokes too. A missing value is an empty cell, as pandas writes it."""
    cells = frame.astype(object).where(frame.notna(), None)
    return to_csv(cells.to_dict("records"), [str(c) for c in frame.columns])


def cell(column: str, value: Any) -> str:
    """A value as a person reads it: MiB whole, percent/watts/degrees to one decimal, other
    floats without binary noise (``2.9000000000000004`` never appears)."""
    if value is None:
        return "-"
    if isinstance(value, float) and not isinstance(value, bool):
        if column.endswith("_mib") or column.endswith("_mb"):
            return str(round(value))
        if column.endswith(("_pct", "_w", "_c", "_percent", "_watts")):
            return f"{value:.1f}"
        if value.is_integer():
            return str(int(value))
        return f"{value:.6g}"
    return str(_plain(value))


#: the width of output that is not a terminal (a pipe, a file, a CI log): no line is ever
#: wrapped or a table turned into records for want of room; `less -S`, a log viewer or the
#: next program decides how to show long lines
NO_WRAP = 1 << 16


def terminal_width(stream: Any = None) -> int:
    """The width to lay out for: $COLUMNS first; the terminal's when ``stream`` (stdout by
    default) is one; NO_WRAP when it is not, so piped output keeps whole lines."""
    import os
    import shutil
    import sys

    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    stream = sys.stdout if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return NO_WRAP
    return shutil.get_terminal_size((220, 24)).columns


def console(*, stderr: bool = False):  # -> rich.console.Console
    """A rich Console for progress and messages that never hard-wraps: rich's own default
    is 80 columns on anything that is not a terminal, which cut the demo's lines in a log."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, highlight=False, soft_wrap=True,
                   width=min(terminal_width(stream), NO_WRAP))


@contextlib.contextmanager
def progress(description: str, total: int | None = None, *,
             stream: Any = None) -> Iterator[Callable[[int], None]]:
    """A progress bar on standard error while long work runs (collect, sync, the demo's
    set-up): yields ``advance(n=1)``. Only on a terminal: piped or in a log it is silent, so
    a cron job's output holds results, not bars; the bar goes away when the work is done."""
    import sys

    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        def silent(n: int = 1) -> None:
            pass

        yield silent
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn()] + ([TimeRemainingColumn()] if total else [])
    bar = Progress(*columns, console=Console(file=stream, highlight=False),
                   transient=True)
    with bar:
        task = bar.add_task(description, total=total)

        def advance(n: int = 1) -> None:
            bar.advance(task, n)

        yield advance


def to_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
             title: str | None = None, *, upper: bool = True,
             width: int | None = None) -> str:
    """A table that fits ``width``; one too wide becomes one block per row (``name: value``
    lines) instead of wrapping values mid-word (a UUID split over lines cannot be copied)."""
    from rich.console import Console
    from rich.table import Table

    width = width or terminal_width()
    headers = [c.upper() if upper else c for c in columns]
    cells = [[cell(c, row.get(c)) for c in columns] for row in rows]
    natural = sum(max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers))
    if natural + 2 * (len(columns) - 1) > width:
        return _records(headers, cells, title)
    table = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True)
    for values in cells:
        table.add_row(*values)
    text = io.StringIO()
    Console(file=text, width=width, color_system=None, force_terminal=False).print(table)
    return text.getvalue()


def _records(headers: Sequence[str], cells: Sequence[Sequence[str]], title: str | None) -> str:
    pad = max(len(h) for h in headers)
    out = [f"{title}\n"] if title else []
    for n, values in enumerate(cells):
        if n:
            out.append("\n")
        out += [f"{h.ljust(pad)}  {v}\n" for h, v in zip(headers, values, strict=True)]
    return "".join(out)


def emit(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str,
         table_columns: Sequence[str] | None = None, *, upper: bool = True) -> None:
    """Print rows in the chosen format to stdout.

    JSON and CSV carry every column (scripts want them all); a table may show fewer so that
    it fits a terminal.
    """
    rows = list(rows)
    if fmt == "json":
        click.echo(to_json(rows))
    elif fmt == "csv":
        click.echo(to_csv(rows, columns), nl=False)
    else:
        if not rows:
            click.echo("(none)")
            return
        click.echo(to_table(rows, table_columns or columns, upper=upper), nl=False)
