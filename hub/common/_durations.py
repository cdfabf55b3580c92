"""Prometheus-style durations (``30s``, ``5m``, ``1h30m``) as used on every flag."""

from __future__ import annotations

import math
import re

import click

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
#: The longest duration any flag takes: past it, dates leave the calendar (year 1 or 9999)
#: and arithmetic on them fails; no retention, window or period needs more.
MAX_DURATION = 100 * _UNITS["y"]


def _bounded(value: float, text: object) -> float:
    if value > MAX_DURATION:
        raise ValueError(f"duration {str(text)[:32]} is too long (at most 100y)")
    return value


def parse_duration(text: str | float | int) -> float:
    """Return seconds; a bare number is seconds. Raises ValueError naming the bad input."""
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise ValueError(f"invalid duration {text!r} (use e.g. 30s, 5m, 1h)")
        if text < 0:
            raise ValueError(f"negative duration: {text}")
        return _bounded(float(text), text)
    s = str(text).strip()
    if not s:
        raise ValueError("empty duration")
    try:
        value = float(s)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise ValueError(f"invalid duration {s!r} (use e.g. 30s, 5m, 1h)")
        if value < 0:
            raise ValueError(f"negative duration: {s}")
        return _bounded(value, s)
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0:
        raise ValueError(f"invalid duration {s!r} (use e.g. 30s, 5m, 1h)")
    return _bounded(total, s)


def human_duration(seconds: float | None) -> str:
    """3h12m, 45s: short ages for people (messages, pages); None is "never"."""
    if seconds is None:
        return "never"
    secs = round(seconds)
    if secs < 60:
        return f"{secs}s"
    days, rest = divmod(secs, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, sec = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m")] + ([(sec, "s")] if not days else [])
    text = "".join(f"{n}{u}" for n, u in parts if n)
    return text or "0s"


def format_duration(seconds: float) -> str:
    """Shortest Prometheus duration (used in PromQL range selectors): whole seconds, or
    milliseconds for a fraction of a second (the scaled-down push intervals of tests)."""
    if seconds <= 0:
        return "0s"
    if abs(seconds - round(seconds)) > 1e-9 or seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    secs = round(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if secs % size == 0:
            return f"{secs // size}{unit}"
    return f"{secs}s"


class Duration(click.ParamType):
    """click type for durations; values are seconds (float)."""

    name = "duration"

    def convert(self, value, param, ctx):
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


DURATION = Duration()
