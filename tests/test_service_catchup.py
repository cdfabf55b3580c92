"""`gpufleet serve`'s usage catch-up is bounded per round (the `usage collect` --yes guard,
and half an interval of time) so that the sync after it is never late; with a fake clock
and a real, empty hub."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from hub import inventory as inv
from hub.service import ServeSettings, service_jobs
from hub.store import HubClient

T0 = 28_333_333 * 60.0  # the buckets of a minute line up with it


class Clock:
    """Seconds that move by ``step`` each time they are read (a hub that takes its time)."""

    def __init__(self, step: float = 0.0) -> None:
        self.now = T0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_a_long_catch_up_is_cut_into_rounds_oldest_first(db_url, hub, caplog):
    settings = ServeSettings(db=db_url, every=300.0, usage_bucket=60.0, push_interval=60.0,
                             usage_max_backfill=3600.0)
    caplog.set_level(logging.INFO, logger="gpufleet.service")
    with inv.open_engine(db_url, create=True) as engine, HubClient(hub.url) as client:
        inv.ensure_schema(engine)
        clock = Clock()
        usage_job = service_jobs(engine, client, settings, clock=clock,
                                 catch_up=5).after_sync[-1]
        usage_job()
        with engine.connect() as conn:
            starts = conn.execute(sa.select(inv.usage_buckets.c.bucket_start)
                                  .order_by(inv.usage_buckets.c.bucket_start)).scalars().all()
        assert len(starts) == 5
        # the oldest five of the hour (the newest ended a push interval ago)
        first = starts[0].replace(tzinfo=None)
        assert (starts[-1] - first).total_seconds() == 4 * 60
        lines = [r.getMessage() for r in caplog.records if "more than 5 a round" in
                 r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("usage: 59 buckets of 1m ")
        usage_job()  # the next round goes on where this one stopped
        with engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(
                inv.usage_buckets)).scalar()
        assert count == 10


def test_a_slow_catch_up_pauses_after_half_an_interval(db_url, hub, caplog):
    settings = ServeSettings(db=db_url, every=300.0, usage_bucket=60.0, push_interval=60.0,
                             usage_max_backfill=3600.0)
    caplog.set_level(logging.INFO, logger="gpufleet.service")
    with inv.open_engine(db_url, create=True) as engine, HubClient(hub.url) as client:
        inv.ensure_schema(engine)
        clock = Clock(step=40.0)  # every look at the clock: 40 s later
        usage_job = service_jobs(engine, client, settings, clock=clock).after_sync[-1]
        usage_job()
        with engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(
                inv.usage_buckets)).scalar()
        # begun at +40, budget to +190: buckets asked at +80, +120, +160, then +200 stops
        assert count == 3
        paused = [r.getMessage() for r in caplog.records if "paused" in r.getMessage()]
        assert paused == ["usage: catch-up paused after half an interval (150s) so the next "
                          "sync is not late, 55 bucket(s) left for the next rounds"]
