"""The whole story of one GPU: where it is, its slices, events, allocations, recent usage."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from hub import inventory as inv


def gpu_history(conn: Connection, uuid: str, *, events: int = 100,
                usage_rows: int = 48) -> dict[str, Any] | None:
    """None for an unknown uuid; otherwise the GPU, slices, events, allocations, usage."""
    rows = inv.gpu_rows(conn, uuid)
    if not rows:
        return None
    physical = next((r for r in rows if r["mig_profile"] is None), rows[0])
    return {
        "gpu": physical,
        "slices": [r for r in rows if r["mig_profile"] is not None],
        "events": inv.list_events(conn, uuid=uuid, limit=events),
        "allocations": inv.gpu_allocations(conn, uuid),
        "usage": inv.recent_usage(conn, uuid, limit=usage_rows),
    }
