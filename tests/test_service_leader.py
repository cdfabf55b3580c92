"""The schedule's lease (hub/service/_leader.py) on both databases, with a fake clock: who
leads, when a hung leader is replaced, and that the replaced one writes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub import inventory as inv
from hub.inventory import LeaseLost
from hub.service._leader import FileLock, Lease, PgLock
from hub.store import HubClient

T0 = 1_700_000_000.0
#: beats never come from the heartbeat thread here: the test turns the clock itself
NEVER = 10_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    with inv.open_engine(db_url, create=True) as engine:
        inv.ensure_schema(engine)
        yield engine


def lease(engine: sa.Engine, clock: Clock, beats: int = 5) -> Lease:
    """A process's lease: its own lock object (a flock on its own descriptor conflicts with
    another's in one process too), a beat of 1 s of the fake clock."""
    if engine.dialect.name == "postgresql":
        lock: FileLock | PgLock = PgLock(engine)
    else:
        lock = FileLock(Path(f"{engine.url.database}.leader"))
    made = Lease(engine, lock, beat=1.0, beats=beats, clock=clock)
    made.beat = NEVER  # the heartbeat thread sleeps through the test
    return made


def row(engine: sa.Engine) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(inv.schedule_lease)).mappings().one())


def test_one_leads_and_a_hung_one_is_replaced_after_its_lease(engine):
    clock = Clock()
    a, b = lease(engine, clock), lease(engine, clock)
    try:
        assert a.acquire() and not b.acquire()
        assert row(engine)["epoch"] == 1 and row(engine)["locked"]
        clock.now += 3
        assert a.acquire() and not b.acquire()  # renewed: still a's
        # a hangs (no renewal) but keeps its lock: b waits for the lease to run out ...
        clock.now += 4.9
        assert not b.acquire()
        clock.now += 0.2
        assert b.acquire()
        assert row(engine)["epoch"] == 2 and row(engine)["holder"] == b.holder
        assert not row(engine)["locked"]  # a still holds the lock
        # ... and a, woken up, finds out before it writes, then steps down
        with engine.begin() as conn, pytest.raises(LeaseLost, match=r"epoch 1.*epoch 2"):
            a.fence(conn)
        assert not a.acquire()
        assert a.epoch is None
        with engine.begin() as conn:
            b.fence(conn)
        # a let go of its lock stepping down: b's next renewal takes it
        assert b.acquire() and row(engine)["locked"]
    finally:
        a.release()
        b.release()


def test_a_dead_leader_is_replaced_at_once_through_its_lock(engine):
    clock = Clock()
    a, b = lease(engine, clock), lease(engine, clock)
    try:
        assert a.acquire() and not b.acquire()
        assert a.lock is not None
        a.lock.drop()  # what the kernel or the server does when a's process dies
        assert b.acquire()  # no wait for the expiry: the lease was a's with its lock
        assert row(engine)["epoch"] == 2
    finally:
        a.release()
        b.release()


def test_a_leader_that_stops_frees_the_lease_for_the_next(engine):
    clock = Clock()
    a, b = lease(engine, clock), lease(engine, clock)
    c = lease(engine, clock)
    try:
        assert a.acquire()
        clock.now += 6
        assert b.acquire()  # a hung: b took the lease without the lock (a holds it)
        b.release()  # b stops: the lease is free at once, lock or no lock
        assert c.acquire() and row(engine)["holder"] == c.holder
    finally:
        for each in (a, b, c):
            each.release()


def test_a_replaced_leader_writes_no_sync(engine, hub):
    clock = Clock()
    a, b = lease(engine, clock), lease(engine, clock)
    try:
        with HubClient(hub.url) as client:
            assert a.acquire()
            inv.run_sync(engine, client, fence=a.fence)
            clock.now += 6
            assert b.acquire()
            with pytest.raises(LeaseLost):
                inv.run_sync(engine, client, fence=a.fence)
            inv.run_sync(engine, client, fence=b.fence)
        with engine.connect() as conn:
            runs = conn.execute(sa.select(inv.sync_runs.c.status)).scalars().all()
        assert runs == ["ok", "ok"]  # a's second sync: not even a failed run
    finally:
        a.release()
        b.release()
