"""The whole story of one GPU: where it is, its slices, events, allocations, recent usage."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hub import inventory as inv


def gpu_history(conn: Connection, uuid: str, *, events: int = 100,
                usage_rows: int = 48) -> dict[str, Any] | None:
    """None for an unknown uuid; otherwise the GPU, slices, where it sat (placements), its
    health history, events, allocations, usage."""
    rows = inv.gpu_rows(conn, uuid)
    if not rows:  # a serial (AMD's, or NVIDIA's where the exporter sends it) names it too
        found = conn.execute(sa.select(inv.gpus.c.uuid).where(
            inv.gpus.c.serial == uuid, inv.gpus.c.slice_key == "")
            .order_by(inv.gpus.c.last_seen.desc()).limit(1)).scalar()
        if found is None:
            return None
        uuid, rows = found, inv.gpu_rows(conn, found)
    physical = next((r for r in rows if r["mig_profile"] is None), rows[0])
    return {
        "gpu": physical,
        "slices": [r for r in rows if r["mig_profile"] is not None],
        "placements": inv.gpu_placements(conn, uuid),
        "health": inv.gpu_health(conn, uuid),
        "events": inv.list_events(conn, uuid=uuid, limit=events),
        "allocations": inv.gpu_allocations(conn, uuid),
        "usage": inv.recent_usage(conn, uuid, limit=usage_rows),
    }
