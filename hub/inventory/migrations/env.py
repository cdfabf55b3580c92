"""Alembic environment: gpufleet always hands in an open connection
(see hub/inventory/_migrate.py)."""

from __future__ import annotations

from alembic import context

from hub.inventory._migrate import metadata
from hub.inventory._partitions import not_a_partition

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata(), render_as_batch=True,
                  include_name=not_a_partition)
with context.begin_transaction():
    context.run_migrations()
