"""Render lists of plain dicts as a table, JSON or CSV: every listing command goes through here.

Commands build plain data; this module is the only place that knows about terminals.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from collections.abc import Iterable, Sequence
from typing import Any

import click

FORMATS = ("table", "json", "csv")


def output_option(*formats: str, default: str = "table"):
    """The ``-o/--output`` option, with the formats a command supports."""
    choices = formats or FORMATS
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(choices),
        default=default,
        show_default=True,
        help="Output format. json is a list of objects for scripts.",
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


def to_csv(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else _plain(row.get(k))) for k in columns})
    return buf.getvalue()


def to_table(rows: Sequence[dict[str, Any]], columns: Sequence[str],
             title: str | None = None) -> str:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, box=None, header_style="bold", pad_edge=False)
    for col in columns:
        table.add_column(col.upper(), overflow="fold")
    for row in rows:
        table.add_row(*("-" if row.get(c) is None else str(_plain(row.get(c))) for c in columns))
    console = Console(file=io.StringIO(), width=220, color_system=None, force_terminal=False)
    console.print(table)
    return console.file.getvalue()  # type: ignore[attr-defined]


def emit(rows: Iterable[dict[str, Any]], columns: Sequence[str], fmt: str,
         table_columns: Sequence[str] | None = None) -> None:
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
        click.echo(to_table(rows, table_columns or columns), nl=False)
