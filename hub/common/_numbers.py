"""Numbers for people: one pluralised count line and one rounding rule for every surface.

The console, the HTML report and the live page used to spell the same three counts three
ways ("6 error, 1 info", "6 errors, 0 info"); a reader comparing them should see one line.
Pages and tables show figures rounded for people (two significant decimals at most, counts
as integers); JSON keeps machine precision but not float noise (see :func:`json_number`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: the order every count line uses, worst first
SEVERITY_ORDER = ("error", "warning", "info")
#: words that have no plural a reader expects ("5 info", not "5 infos")
_UNCOUNTED = {"info"}


def counted(n: int, word: str) -> str:
    """``1 error``, ``2 errors``, ``0 warnings``; the number as an integer."""
    n = int(n)
    if word in _UNCOUNTED or n == 1:
        return f"{n:,} {word}"
    return f"{n:,} {word}s"


def counts_line(counts: Mapping[str, int]) -> str:
    """``1 error, 5 warnings, 1 info``: the one spelling of a report's finding counts."""
    return ", ".join(counted(counts.get(s, 0), s) for s in SEVERITY_ORDER)


def for_people(value: Any, places: int = 2) -> str:
    """A figure as a person reads it: integers without decimals (with thousands separators),
    other numbers to at most ``places`` decimals with trailing zeros dropped, tiny non-zero
    values as ``<0.01`` (never a bare ``0`` above a table that holds 0.002), None as ``–``."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    rounded = round(value, places)
    if rounded == 0 and value != 0:
        return ("<" if value > 0 else ">-") + f"{10 ** -places:.{places}f}"
    if rounded == int(rounded) and abs(rounded) < 1e15:
        return f"{int(rounded):,}"
    return f"{rounded:,.{places}f}".rstrip("0").rstrip(".")


def json_number(value: float, places: int = 6) -> float:
    """Sane JSON precision: ``101.85714300000001`` -> ``101.857143``; exact enough for any sum
    a script makes of it (micro-units), free of binary float noise."""
    return round(value, places)
