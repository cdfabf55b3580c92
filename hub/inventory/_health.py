"""GPU health from the exporters' health fields (pure): ok, degraded or failed, with reasons.

The inputs are vendor-neutral (``hub.store._profiles`` maps dcgm's XID_ERRORS, ECC and
remapped-row fields and AMD's gpu_health/ECC onto them). The verdict follows what NVIDIA's
XID catalogue and DCGM's health checks treat as needing a drain and reset versus a look:

- failed: XID 48 (double-bit ECC), 79 (fallen off the bus), 95 (uncontained ECC), 119/120
  (GSP RPC timeout / error); a row-remap failure; any volatile double-bit / uncorrectable ECC
  error; the exporter's own "unhealthy" verdict (AMD gpu_health 0);
- degraded: any other non-zero XID (application faults, NVLink errors, ... worth a look,
  often caused by a workload) and hardware slowdown of the clocks (thermal, power brake).

A GPU for which no health field arrived at all has health None: not "ok", because nothing was
said (dcgm-exporter without the ECC fields still sends XID_ERRORS, so this is rare).
"""

from __future__ import annotations

from collections.abc import Mapping

from hub import store

OK = "ok"
DEGRADED = "degraded"
FAILED = "failed"
LEVELS = (OK, DEGRADED, FAILED)

#: XIDs after which the GPU needs a drain and a reset
FATAL_XIDS = frozenset({48, 79, 95, 119, 120})
#: nvmlClocksEventReason* bits that mean the hardware slowed the clocks down
HW_SLOWDOWN = {0x8: "hw slowdown", 0x40: "hw thermal slowdown",
               0x80: "hw power brake slowdown"}


def assess(values: Mapping[str, float]) -> tuple[str | None, str | None]:
    """(health, reasons joined by "; ") of one GPU's health fields; (None, None) when none."""
    fields = (store.LAST_XID, store.ECC_DBE, store.ROW_REMAP_FAILURE,
              store.CLOCKS_EVENT_REASONS, store.DEVICE_HEALTH)
    if not any(values.get(f) is not None for f in fields):
        return None, None
    failed: list[str] = []
    degraded: list[str] = []
    xid = values.get(store.LAST_XID)
    if xid:
        (failed if int(xid) in FATAL_XIDS else degraded).append(f"xid {int(xid)}")
    dbe = values.get(store.ECC_DBE)
    if dbe:
        failed.append(f"ecc dbe {dbe:g}")
    if values.get(store.ROW_REMAP_FAILURE):
        failed.append("row remap failure")
    if values.get(store.DEVICE_HEALTH) == 0:
        failed.append("exporter reports unhealthy")
    reasons = values.get(store.CLOCKS_EVENT_REASONS)
    if reasons:
        degraded += [text for bit, text in HW_SLOWDOWN.items() if int(reasons) & bit]
    if failed:
        return FAILED, "; ".join(failed + degraded)
    if degraded:
        return DEGRADED, "; ".join(degraded)
    return OK, None


def merge(parts: list[Mapping[str, float]]) -> dict[str, float]:
    """Health fields of a GPU reported only through its MIG slices: the worst of each."""
    out: dict[str, float] = {}
    for values in parts:
        for key, value in values.items():
            if key == store.DEVICE_HEALTH:
                out[key] = min(out.get(key, value), value)
            elif key == store.CLOCKS_EVENT_REASONS:
                out[key] = float(int(out.get(key, 0)) | int(value))
            elif key == store.LAST_XID:
                # the fatal XID wins over a later benign one on another slice
                old = out.get(key)
                if old is None or int(value) in FATAL_XIDS or not old:
                    out[key] = value
            else:
                out[key] = max(out.get(key, value), value)
    return out
