"""Whole-inventory answers (capacity, the page's usage sections) are kept until the inventory
changes: a sync, a prune or a usage collect shows at once, and nothing else recomputes them."""

from __future__ import annotations

import datetime as dt

from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.service import build_app, read_only_engine
from hub.service._memo import Memo
from tests.support.asgi import AppClient, no_metrics


def _gpu(uuid: str) -> Observation:
    return Observation("east", "n1", uuid, "nvidia", index=0, model="H100")


def test_capacity_follows_a_sync_at_once_and_is_not_recomputed_in_between(tmp_path):
    url = f"sqlite:///{tmp_path / 'memo.db'}"
    writer = inventory.make_engine(url, create=True)
    migrate.ensure_schema(writer)
    with writer.begin() as conn:
        apply_observations(conn, [_gpu("GPU-1")], inventory.now_utc())
    engine = read_only_engine(url)
    made = build_app(engine, health=lambda: (True, {}), findings=lambda: ([], None),
                     metrics=no_metrics)
    app = AppClient(made)
    try:
        for _ in range(3):
            status, body = app.handle("/api/v1/capacity")
            assert status == 200 and body["items"][0]["total"] == 1.0
        assert made.state.memo.computed == 1
        with writer.begin() as conn:  # a sync: a new GPU appears (an event is written)
            apply_observations(conn, [_gpu("GPU-1"), _gpu("GPU-2")],
                                         inventory.now_utc() + dt.timedelta(minutes=5))
        status, body = app.handle("/api/v1/capacity")
        assert body["items"][0]["total"] == 2.0 and made.state.memo.computed == 2
    finally:
        engine.dispose()
        writer.dispose()


def test_a_kept_answer_ends_after_its_ttl():
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    class Conn:  # the version read, answered the same each time
        def execute(self, *_):
            class Result:
                def scalar(self):
                    return 1

                def one(self):
                    return (None, 0)
            return Result()

    clock = Clock()
    memo = Memo(ttl=30, clock=clock)
    calls: list[int] = []
    assert memo.get(Conn(), "k", lambda: calls.append(1) or len(calls)) == 1
    clock.now = 29
    assert memo.get(Conn(), "k", lambda: calls.append(1) or len(calls)) == 1
    clock.now = 31
    assert memo.get(Conn(), "k", lambda: calls.append(1) or len(calls)) == 2


class _SameVersion:
    """A connection whose inventory version never changes; ``on_read`` is called each time
    a caller reads the version."""

    def __init__(self, on_read=lambda: None) -> None:
        self.on_read = on_read

    def execute(self, *_):
        on_read = self.on_read

        class Result:
            def scalar(self):
                return 1

            def one(self):
                on_read()
                return (None, 0)
        return Result()


def test_many_callers_missing_at_once_compute_the_answer_once():
    """The answer is held back until all twenty callers have read the version (and so
    found it missing): each would compute it without the single flight."""
    import threading

    memo = Memo()
    release = threading.Event()
    lock = threading.Lock()
    reads = [0]

    def on_read() -> None:
        with lock:
            reads[0] += 1
            if reads[0] == 20:
                release.set()

    def compute() -> int:
        release.wait(10)
        return 42

    answers: list[int] = []
    threads = [threading.Thread(target=lambda: answers.append(
        memo.get(_SameVersion(on_read), "capacity", compute))) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert answers == [42] * 20 and memo.computed == 1
