"""The inventory as pandas DataFrames, for analysts and notebooks (docs/usage.md).

The CLI and API read the same rows as lists of dicts; a DataFrame is what an analyst joins,
groups and plots. pandas loads only when a frame is asked for: no command pays for it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from hub.common import InputError
from hub.inventory import _db as db
from hub.inventory._reads import list_nodes

#: what inventory_frame can return, and the columns of each (those of `inventory <what>`)
FRAMES: dict[str, tuple[Any, list[str]]] = {
    "gpus": (db.list_gpus, db.GPU_COLUMNS),
    "nodes": (list_nodes, db.NODE_COLUMNS),
    "clusters": (db.list_clusters, db.CLUSTER_COLUMNS),
    "allocations": (db.list_allocations, db.ALLOCATION_COLUMNS),
}


def inventory_frame(conn: Connection, what: str = "gpus", cluster: str | None = None):
    """One inventory table as a pandas DataFrame (-> pandas.DataFrame), the rows and columns
    `gpufleet inventory <what>` shows, stale rows included (column ``state``); times are
    naive UTC. ``what``: gpus, nodes, clusters or allocations."""
    import pandas as pd

    if what not in FRAMES:
        raise InputError(f"inventory_frame: {what!r} is not one of {', '.join(FRAMES)}")
    rows, columns = FRAMES[what]
    return pd.DataFrame(rows(conn, cluster), columns=columns)
