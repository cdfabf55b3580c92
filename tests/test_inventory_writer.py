"""The sync's write, group by group: each group reads the table's rows of its own GPUs only,
and only their hashes are kept across groups. What a user relies on is that this gives the
events and states one whole-fleet write would: a GPU that moved into another shard's cluster
is `moved` (never `appeared`), a GPU an earlier group saw unchanged is not `stale`, and every
GPU no group saw turns stale with one event, however many rows the table holds."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from hub.inventory import _db as inv
from hub.inventory import _migrate as migrate
from hub.inventory._db import BATCH
from hub.inventory._normalize import Observation
from hub.inventory._writer import InventoryWriter

T0 = dt.datetime(2026, 3, 1, 12, 0)
T1 = T0 + dt.timedelta(minutes=5)


def _engine(url: str) -> sa.Engine:
    engine = inv.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    return engine


def _write(engine: sa.Engine, groups: list[list[Observation]], now: dt.datetime) -> dict:
    with engine.begin() as conn:
        writer = InventoryWriter(conn, now)
        for group in groups:
            writer.add(group)
        return writer.finish()


def _gpu(cluster: str, node: str, uuid: str, **kw) -> Observation:
    return Observation(cluster, node, uuid, "nvidia", model="NVIDIA H100 80GB HBM3",
                       memory_total_mib=81559.0, sample_at=1.0e9, **kw)


def test_groups_give_the_events_of_one_whole_write(db_url):
    engine = _engine(db_url)
    mig = dict(model="NVIDIA H100 80GB HBM3")
    _write(engine, [[
        _gpu("east", "e1", "GPU-mover"), _gpu("east", "e1", "GPU-still"),
        _gpu("west", "w1", "GPU-gone"),
        _gpu("west", "w1", "GPU-mig"),
        Observation("west", "w1", "GPU-mig", "nvidia", mig_profile="1g.10gb", mig_instance="1",
                    **mig),
        Observation("west", "w1", "GPU-mig", "nvidia", mig_profile="1g.10gb", mig_instance="2",
                    **mig),
    ]], T0)

    # east's group first, then west's: the mover's row (east) is in the other group's cluster
    counts = _write(engine, [
        [_gpu("east", "e1", "GPU-still")],
        [_gpu("west", "w2", "GPU-mover"), _gpu("west", "w1", "GPU-mig"),
         Observation("west", "w1", "GPU-mig", "nvidia", mig_profile="1g.10gb",
                     mig_instance="1", **mig)],
    ], T1)

    assert counts["gpus"] == 3
    with engine.connect() as conn:
        events = conn.execute(
            sa.select(inv.events.c.type, inv.events.c.uuid, inv.events.c.slice,
                      inv.events.c.cluster, inv.events.c.details)
            .where(inv.events.c.at == T1)).all()
        rows = {(r.uuid, r.slice_key): (r.state, r.cluster, r.node)
                for r in conn.execute(sa.select(inv.gpus))}
    engine.dispose()
    got = sorted((e.type, e.uuid, e.slice or "") for e in events)
    assert got == [
        ("changed", "GPU-mig", ""),  # its layout lost slice 2
        ("moved", "GPU-mover", ""),
        ("stale", "GPU-gone", ""),
        ("stale", "GPU-mig", "1g.10gb/2"),
    ]
    moved = next(e for e in events if e.type == "moved")
    assert '"from": {"cluster": "east", "node": "e1"}' in moved.details
    assert rows[("GPU-mover", "")] == ("active", "west", "w2")
    assert rows[("GPU-still", "")] == ("active", "east", "e1")
    assert rows[("GPU-gone", "")] == ("stale", "west", "w1")


def test_every_gpu_no_group_saw_turns_stale_past_one_batch_of_rows(db_url):
    engine = _engine(db_url)
    n = 2 * BATCH + 1  # the end's scan of unwritten rows pages BATCH at a time
    fleet = [_gpu(f"c{i % 7}", f"n{i // 8}", f"GPU-{i:06d}") for i in range(n)]
    _write(engine, [fleet], T0)

    kept = fleet[::2]  # every other GPU reports again, unchanged, over three groups
    _write(engine, [kept[0::3], kept[1::3], kept[2::3]], T1)

    with engine.connect() as conn:
        states = dict(conn.execute(sa.select(inv.gpus.c.uuid, inv.gpus.c.state)).all())
        stale_events = conn.execute(
            sa.select(inv.events.c.uuid)
            .where(inv.events.c.at == T1, inv.events.c.type == "stale")).scalars().all()
        touched = conn.execute(sa.select(sa.func.count()).where(
            inv.gpus.c.state == "active", inv.gpus.c.last_seen == T1)).scalar_one()
    engine.dispose()
    gone = {o.uuid for o in fleet[1::2]}
    assert {u for u, s in states.items() if s == "stale"} == gone
    assert sorted(stale_events) == sorted(gone)  # one event each, none twice
    assert touched == len(kept)  # the unchanged ones are stamped as seen by this sync


def test_a_gpu_seen_as_the_table_holds_it_is_not_rewritten_and_a_changed_one_is(db_url):
    """The write compares each GPU with its row as stored (SQLite keeps a time as text,
    PostgreSQL as a timestamp): a steady sync rewrites nothing and says nothing, while any
    one changed reading, place, health or sample time is written with its event."""
    engine = _engine(db_url)
    at = 1_764_930_000.123456  # a sample time with microseconds
    full = dict(model="NVIDIA H100 80GB HBM3", memory_total_mib=81559.0,
                pci_bus_id="00000000:1A:00.0", index=3, driver_version="580.65.06",
                serial="1650924060017", utilisation_pct=37.5, power_w=311.25,
                temperature_c=61.0, memory_used_mib=40960.0, health="ok", sample_at=at)

    def _gpu(cluster: str, node: str, uuid: str, **kw) -> Observation:
        return Observation(cluster, node, uuid, "nvidia", **kw)

    fleet = [_gpu("east", "e1", f"GPU-{i}", **full) for i in range(6)]
    fleet.append(_gpu("east", "e2", "GPU-bare"))  # no optional field at all
    _write(engine, [fleet], T0)

    def write(groups: list[list[Observation]], now: dt.datetime) -> int:
        with engine.begin() as conn:
            writer = InventoryWriter(conn, now)
            for group in groups:
                writer.add(group)
            rewritten = writer.rewritten
            writer.finish()
        return rewritten

    assert write([fleet[:4], fleet[4:]], T1) == 0
    changed = [
        _gpu("east", "e1", "GPU-0", **{**full, "temperature_c": 62.0}),
        _gpu("east", "e9", "GPU-1", **full),  # moved
        _gpu("east", "e1", "GPU-2", **{**full, "health": "degraded",
                                       "health_reasons": "xid 79"}),
        _gpu("east", "e1", "GPU-3", **{**full, "sample_at": at + 0.000001}),
    ]
    T2 = T1 + dt.timedelta(minutes=5)
    assert write([changed + fleet[4:]], T2) == 4
    with engine.connect() as conn:
        events = sorted(tuple(e) for e in conn.execute(
            sa.select(inv.events.c.type, inv.events.c.uuid)
            .where(inv.events.c.at > T0)).all())
        rows = {r.uuid: r for r in conn.execute(sa.select(inv.gpus))}
    engine.dispose()
    assert events == [("health", "GPU-2"), ("moved", "GPU-1")]
    assert rows["GPU-0"].temperature_c == 62.0
    assert rows["GPU-3"].last_sample_at == inv.utc(at + 0.000001)
    assert all(r.state == "active" and r.last_seen == T2 for r in rows.values())
