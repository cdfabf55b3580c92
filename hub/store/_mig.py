"""MIG: how much of a GPU a slice is (a share of its compute slices), per model family.
"""

from __future__ import annotations

import re

# -- MIG: how much of a GPU a slice is (issue 12) --------------------------------------------
#: Compute slices of a whole GPU per model family (NVIDIA MIG user guide: A100, H100, H200,
#: B200 and GH200 have 7 GPU instances' worth of compute slices, A30 has 4). Matched as a
#: case-insensitive substring of the model name, first match wins.
MIG_COMPUTE_SLICES: tuple[tuple[str, int], ...] = (
    ("A30", 4),
    ("A100", 7), ("H100", 7), ("H200", 7), ("H800", 7), ("A800", 7), ("GH200", 7),
    ("B200", 7), ("GB200", 7), ("B100", 7), ("RTX PRO 6000", 4),
)
#: ``3g.40gb`` (a GPU instance) or ``1c.3g.40gb`` (a compute instance of 1 slice inside it)
_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.")


def compute_slices(model: str | None) -> int | None:
    """How many compute slices a whole GPU of this model has; None when we do not know."""
    upper = (model or "").upper()
    return next((n for name, n in MIG_COMPUTE_SLICES if name.upper() in upper), None)


def mig_share(model: str | None, profile: str | None, slice_memory_mib: float | None = None,
              gpu_memory_mib: float | None = None) -> float:
    """The fraction of its GPU a MIG slice counts as (a whole GPU is 1.0).

    ``3g.40gb`` on a 7-slice GPU is 3/7. A profile we cannot read, or a model whose slice
    count we do not know, counts as its share of the GPU's memory; with no memory figures
    either it counts as one slice of seven (the common case), never as a whole GPU.
    """
    if profile is None:
        return 1.0
    match = _PROFILE.match(profile)
    total = compute_slices(model)
    if match and total:
        return min(1.0, int(match.group(1) or match.group(2)) / total)
    if slice_memory_mib and gpu_memory_mib and gpu_memory_mib > 0:
        return min(1.0, slice_memory_mib / gpu_memory_mib)
    return 1.0 / 7.0
