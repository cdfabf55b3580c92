"""The schedule's lease: which process of `gpufleet serve` runs the sync, until when.

One row per lease (today one, ``schedule``). ``epoch`` grows by one with every new holder:
a write that checks it (hub.service._leader.Lease.fence, inside the sync's own transaction)
is refused once another process has taken the lease over, however long its writer slept.
``expires_at`` (epoch seconds) is pushed forward by the holder's heartbeat: a holder that
hangs (SIGSTOP, a stuck host) stops renewing and loses the row to a follower a few beats
later. ``locked``: the holder also holds the database's leader lock (advisory lock, flock),
which the server or kernel drops the moment it dies, so a follower that gets the lock may
take over at once rather than wait for the expiry.
"""

from __future__ import annotations

import sqlalchemy as sa

from hub.inventory._db import metadata

schedule_lease = sa.Table(
    "schedule_lease", metadata,
    sa.Column("name", sa.String(32), primary_key=True),
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("renewed_at", sa.Float, nullable=False),
    sa.Column("locked", sa.Boolean, nullable=False),
)
