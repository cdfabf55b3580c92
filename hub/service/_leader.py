"""Which one of the service's processes runs the schedule (sync, usage collect, prune).

`gpufleet serve --workers N` runs N processes, and a deployment runs replicas of it: every
one of them serves, exactly one syncs. The leader holds a lock in the database for as long
as it lives, and a process that dies (or loses its database connection) drops it, so
another takes over at its next try:

* PostgreSQL: a session-level advisory lock (``pg_try_advisory_lock``) on a connection kept
  for the term; the server releases it when the connection ends.
* SQLite: an exclusive ``flock`` on a file beside the database (``inventory.db.leader``),
  the kind of lock SQLite itself takes on its files; the kernel releases it with the
  process. Replicas on SQLite share a host and a volume anyway.

The sync's own transaction lock still guards every write (a `gpufleet sync` CronJob beside
the service waits or skips as before); the leader lock keeps the followers from even asking
the hub.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger("gpufleet.service")

#: the advisory lock id of the schedule's leader ("gpuL"); the sync's is 0x67707566
LEADER_KEY = 0x6770_754C


class Leadership(Protocol):
    def acquire(self) -> bool:
        """Whether this process leads now (taking the lock if it is free)."""

    def release(self) -> None:
        """Step down (at exit)."""


class AlwaysLeader:
    """One process alone on its database (an in-memory SQLite): it leads."""

    def acquire(self) -> bool:
        return True

    def release(self) -> None:
        pass


class PgLeader:
    """A session-level advisory lock on a connection held for the term."""

    def __init__(self, engine: Engine, key: int = LEADER_KEY) -> None:
        self.engine = engine
        self.key = key
        self._conn: Connection | None = None

    def acquire(self) -> bool:
        if self._conn is not None:
            try:  # still ours while the session lives
                self._conn.execute(sa.text("SELECT 1"))
                return True
            except sa.exc.SQLAlchemyError:
                log.warning("leader: lost the database connection, stepping down")
                self._drop()
        conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(self.key)))
                       .scalar())
        except BaseException:
            conn.close()
            raise
        if not got:
            conn.close()
            return False
        self._conn = conn
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.invalidate()  # never back into the pool with the lock
                self._conn.close()
            self._conn = None

    def release(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.execute(sa.select(sa.func.pg_advisory_unlock(self.key)))
            self._drop()


class FileLeader:
    """An exclusive flock on ``path``, kept for the term."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def leadership(engine: Engine) -> Leadership:
    """The leader lock of ``engine``'s database."""
    if engine.dialect.name == "postgresql":
        return PgLeader(engine)
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        return FileLeader(Path(f"{database}.leader"))
    return AlwaysLeader()
