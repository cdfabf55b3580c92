"""dcgm-exporter's two namings as the hub reads them: unit conversions in PromQL, the
per-naming spellings, and the collectors CSV a spoke pins (from the one rename table in
hub/common/_dcgm_names.py that the spoke exporter reads too).
"""

from __future__ import annotations

from hub.common import DCGM_RENAMES

# -- dcgm-exporter's two namings (issue 26) --------------------------------------------------
MIB = 2.0 ** 20

#: Old name -> new name with units: the one table hub and spoke share
#: (hub/common/_dcgm_names.py). Legacy names stay resolvable in DCGM 4.7, so a spoke pinning
#: a collectors CSV (``spoke render --dcgm-names``) keeps either naming across an upgrade;
#: the hub reads both everywhere. ``factor`` turns a value under the new name into the legacy
#: name's unit (the one the rest of the hub was written for).

#: One name, two units: DCGM 4.6 maps ``DCGM_FI_DEV_GPU_UTIL_RATIO`` to the old integer
#: field (0-100), so a custom CSV sends percent under it; DCGM 4.7's own field is 0-1. The
#: rule, per series and per query window: a value above 1 in the window proves percent (read
#: as it is); otherwise it is read as a ratio (x 100). What it cannot tell: a percent series
#: that stayed at 0 or 1 % for the whole window reads as 0 or 100 % (an idle GPU at 1 % would
#: look busy until it sends a value above 1). docs/adoption-contract.md says so.
PERCENT_OR_RATIO = frozenset({"DCGM_FI_DEV_GPU_UTIL_RATIO"})


def braced(matcher: str, template: bool = False) -> str:
    """``matcher`` as a selector's braces (``{...}``, to follow a metric name); nothing for
    no matcher. ``template``: as a str.format template spells them (``{{...}}``; a matcher
    holds no brace of its own, see shard_matcher)."""
    if not matcher:
        return ""
    return f"{{{{{matcher}}}}}" if template else f"{{{matcher}}}"


def convert_arm(name: str, factor: float, expr: str, matcher: str, window: str) -> str:
    """``expr`` (a per-series PromQL term reading ``name``) in the unit of its field.

    A name of two possible units (PERCENT_OR_RATIO) is decided per series over ``window``:
    ``max_over_time`` above 1 proves percent; ``and`` keeps those series as they are,
    ``or`` scales the rest. The decision needs no subquery and no second request.
    """
    if name in PERCENT_OR_RATIO:
        proof = f"max_over_time({name}{braced(matcher)}[{window}]) > 1"
        return f"({expr} and {proof}) or ({expr}) * {factor:g}"
    if factor == 1.0:
        return expr
    if factor < 1.0:  # bytes -> MiB, Hz -> MHz: dividing by the exact integer loses nothing
        return f"({expr}) / {round(1 / factor)}"
    return f"({expr}) * {factor:g}"


#: the namings a cluster's NVIDIA GPUs may send (the sync and the report say which)
LEGACY, DCGM47, BOTH = "legacy", "dcgm-4.7", "both"



def dcgm_names(naming: str) -> dict[str, str]:
    """legacy name -> its spelling in ``naming`` (legacy or dcgm-4.7)."""
    if naming not in (LEGACY, DCGM47):
        raise ValueError(f"unknown dcgm naming {naming!r} (legacy or {DCGM47})")
    return {r.legacy: r.legacy if naming == LEGACY else r.dcgm47 for r in DCGM_RENAMES}
