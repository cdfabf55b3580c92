"""Answers about how GPUs are used: GPU-hours, idle allocated GPUs, free capacity, and the
history of one GPU. Reads the inventory (tables, events, usage ledger); writes nothing.
"""

from __future__ import annotations

from hub.usage._history import HISTORY_COLUMNS, gpu_history

__all__ = ["HISTORY_COLUMNS", "gpu_history"]
