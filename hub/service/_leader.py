"""Which one of the service's processes runs the schedule (sync, reconcile, usage collect,
prune, placement scores) and writes the checks' outcome.

`gpufleet serve --workers N` runs N processes, and a deployment runs replicas of it: every
one of them serves, exactly one runs the schedule. What it finds (the sync's runs, the
checks: hub.service.runtime.checks_recorder) goes into the database, and every process
answers from there (hub/service/_status.py), so no reader needs the leader. The leader holds
a *lease*, a row in the
database (``schedule_lease``, hub/inventory/_lease.py) with an epoch and an expiry that its
heartbeat pushes forward every beat (2 s). Two ways end a term:

* the holder dies: it also holds the database's leader lock, which the server (PostgreSQL:
  a session-level advisory lock on a connection kept for the term) or the kernel (SQLite: an
  ``flock`` on ``inventory.db.leader`` beside the database) drops with the process, so the
  first follower to get the lock takes the lease over at once;
* the holder hangs (SIGSTOP, a frozen host, a dead NFS mount): it keeps its lock but stops
  renewing, and a follower takes the lease over once it has expired (``LEASE_BEATS`` beats).

Each takeover raises the epoch, and the sync and the checks' write check it inside their
own transaction (:meth:`Lease.fence`): a holder that wakes up after losing the lease writes
nothing, and its next turn finds the row taken and steps down. A lock alone could not do
that: a hung process holds it for ever.

The sync's own transaction lock still guards every write (a `gpufleet sync` CronJob beside
the service waits or skips as before); the lease keeps the followers from even asking the
hub.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import inventory as inv

log = logging.getLogger("gpufleet.service")

#: the advisory lock id of the schedule's leader ("gpuL"); the sync's is 0x67707566
LEADER_KEY = 0x6770_754C
#: seconds between two renewals of the lease (and a follower's tries to take it)
BEAT = 2.0
#: beats without a renewal after which the lease is free: a hung leader is replaced within
#: LEASE_BEATS + 1 beats (a slow renewal, a GC pause, is far shorter)
LEASE_BEATS = 5
LEASE = "schedule"


class Leadership(Protocol):
    def acquire(self) -> bool:
        """Whether this process leads now (taking the lead if it is free)."""

    def holds(self) -> bool:
        """Whether this process still leads, as far as it knows (no database read)."""

    def fence(self, conn: Connection) -> None:
        """Raise LeaseLost unless this process still leads (inside a write transaction)."""

    def release(self) -> None:
        """Step down (at exit)."""


class AlwaysLeader:
    """One process alone on its database (an in-memory SQLite): it leads."""

    def acquire(self) -> bool:
        return True

    def holds(self) -> bool:
        return True

    def fence(self, conn: Connection) -> None:
        pass

    def release(self) -> None:
        pass


class Lock(Protocol):
    """A lock its holder's death drops at once."""

    def take(self) -> bool: ...

    def held(self) -> bool: ...

    def drop(self) -> None: ...


class PgLock:
    """A session-level advisory lock on a connection held for the term."""

    def __init__(self, engine: Engine, key: int = LEADER_KEY) -> None:
        self.engine = engine
        self.key = key
        self._conn: Connection | None = None

    def take(self) -> bool:
        if self._conn is not None:
            return True
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

    def held(self) -> bool:
        """Still ours while the session lives."""
        if self._conn is None:
            return False
        try:
            self._conn.execute(sa.text("SELECT 1"))
            return True
        except sa.exc.SQLAlchemyError:
            self._forget()
            return False

    def _forget(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.invalidate()  # never back into the pool with the lock
                self._conn.close()
            self._conn = None

    def drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                self._conn.execute(sa.select(sa.func.pg_advisory_unlock(self.key)))
            self._forget()


class FileLock:
    """An exclusive flock on ``path``, kept for the term."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def take(self) -> bool:
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

    def held(self) -> bool:
        return self._fd is not None

    def drop(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class Lease:
    """The schedule's lease in ``engine``'s database, renewed by a heartbeat thread.

    ``clock`` is wall time in seconds (every process of the deployment compares the expiry
    with its own: keep their clocks in sync, as Kubernetes nodes are); ``beat`` the seconds
    between renewals. All state changes happen under one mutex, so the heartbeat and the
    scheduler's own turn never race.
    """

    def __init__(self, engine: Engine, lock: Lock | None, *, beat: float = BEAT,
                 beats: int = LEASE_BEATS, clock: Callable[[], float] = time.time,
                 name: str = LEASE) -> None:
        self.engine = engine
        self.lock = lock
        self.beat = beat
        self.ttl = beat * beats
        self.clock = clock
        self.name = name
        self.holder = f"{socket.gethostname()[:200]}:{os.getpid()}:{secrets.token_hex(4)}"
        self.epoch: int | None = None
        self._locked = False
        self._renewed_at = 0.0
        self._schema = False
        self._mutex = threading.RLock()
        self._stop = threading.Event()
        self._heart: threading.Thread | None = None

    # -- the scheduler's side ---------------------------------------------------------------
    def acquire(self) -> bool:
        with self._mutex:
            if self.epoch is not None:
                self._keep()
            if self.epoch is None:
                self._take()
            leads = self.epoch is not None
        if leads:
            self._start_heart()
        return leads

    def holds(self) -> bool:
        return self.epoch is not None and self.clock() - self._renewed_at < self.ttl

    def fence(self, conn: Connection) -> None:
        mine = self.epoch
        row = conn.execute(sa.select(inv.schedule_lease.c.epoch, inv.schedule_lease.c.holder)
                           .where(inv.schedule_lease.c.name == self.name)).first()
        if mine is not None and row is not None and row.epoch == mine \
                and row.holder == self.holder:
            return
        now = f"epoch {row.epoch}" if row is not None else "no lease"
        raise inv.LeaseLost(f"this process no longer leads (its lease was epoch {mine}, the "
                            f"database has {now}): nothing written")

    def release(self) -> None:
        self._stop.set()
        with self._mutex:
            if self.epoch is not None:
                # free now, not a lease's time later
                with contextlib.suppress(sa.exc.SQLAlchemyError), self.engine.begin() as conn:
                    conn.execute(self._mine().values(expires_at=0.0))
            self._step_down()
        if self._heart is not None and self._heart is not threading.current_thread():
            self._heart.join(5)

    # -- taking and keeping -----------------------------------------------------------------
    def _take(self) -> None:
        if not self._schema:  # a database that was down when serve started
            inv.ensure_schema(self.engine)
            self._schema = True
        locked = self.lock.take() if self.lock is not None else False
        try:
            epoch = self._claim(locked)
        except BaseException:
            if locked and self.lock is not None:
                self.lock.drop()
            raise
        if epoch is None:
            if locked and self.lock is not None:
                self.lock.drop()  # the lease is someone's, alive: the lock is for its holder
            return
        self.epoch, self._locked, self._renewed_at = epoch, locked, self.clock()

    def _claim(self, locked: bool) -> int | None:
        """The new epoch if the lease was free (expired; or its holder had the lock, which
        is ours now, so it is gone), else None."""
        table = inv.schedule_lease
        now = self.clock()
        values = {"holder": self.holder, "expires_at": now + self.ttl, "renewed_at": now,
                  "locked": locked}
        try:
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(table).where(table.c.name == self.name)).first()
                if row is None:
                    conn.execute(table.insert().values(name=self.name, epoch=1, **values))
                    return 1
                if not (row.expires_at <= now or (locked and row.locked)
                        or row.holder == self.holder):
                    return None
                taken = conn.execute(table.update().where(
                    table.c.name == self.name, table.c.epoch == row.epoch).values(
                    epoch=row.epoch + 1, **values)).rowcount
        except sa.exc.IntegrityError:  # another follower inserted the first row first
            return None
        if not taken:
            return None
        if row.holder != self.holder and row.expires_at > 0:
            log.warning("leader: took the schedule over from %s (%s)", row.holder,
                        "it let go of its lock" if row.expires_at > now
                        else f"its lease expired {now - row.expires_at:.0f}s ago")
        return int(row.epoch) + 1

    def _mine(self) -> sa.Update:
        table = inv.schedule_lease
        return table.update().where(table.c.name == self.name, table.c.epoch == self.epoch,
                                    table.c.holder == self.holder)

    def _keep(self) -> None:
        """Renew; step down when the lease is someone else's, or when it could not be
        renewed for a whole lease (the others may have taken it meanwhile)."""
        try:
            if self._locked and self.lock is not None and not self.lock.held():
                log.warning("leader: lost the leader lock (database connection), stepping "
                            "down")
                self._step_down()
                return
            if not self._locked and self.lock is not None:
                self._locked = self.lock.take()  # the hung holder's lock, once it lets go
            now = self.clock()
            with self.engine.begin() as conn:
                renewed = conn.execute(self._mine().values(
                    expires_at=now + self.ttl, renewed_at=now, locked=self._locked)).rowcount
        except Exception as exc:
            if self.clock() - self._renewed_at < self.ttl:
                log.debug("leader: lease not renewed this beat: %s", type(exc).__name__)
                return
            log.warning("leader: could not renew the lease for %gs, stepping down: %s",
                        self.ttl, type(exc).__name__)
            self._step_down()
            return
        if renewed:
            self._renewed_at = now
            return
        log.warning("leader: another process took the schedule over (this one was not "
                    "renewing its lease: hung or cut off), stepping down")
        self._step_down()

    def _step_down(self) -> None:
        self.epoch = None
        if self._locked and self.lock is not None:
            self.lock.drop()
        self._locked = False

    def _start_heart(self) -> None:
        if self._heart is None and not self._stop.is_set():
            self._heart = threading.Thread(target=self._beat, name="lease-heartbeat",
                                           daemon=True)
            self._heart.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.beat):
            with self._mutex:
                if self.epoch is not None:
                    self._keep()


def leadership(engine: Engine, *, beat: float = BEAT) -> Leadership:
    """The schedule's lease in ``engine``'s database (beside its leader lock)."""
    if engine.dialect.name == "postgresql":
        return Lease(engine, PgLock(engine), beat=beat)
    database = engine.url.database
    if engine.dialect.name == "sqlite" and database and database != ":memory:":
        return Lease(engine, FileLock(Path(f"{database}.leader")), beat=beat)
    return AlwaysLeader()
