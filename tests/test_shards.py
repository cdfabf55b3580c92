"""The one way gpufleet asks a fleet in shards (hub.store.run_shards and Spill), as the sync
and the usage ledger rely on it: a bounded number of requests in flight, each answer handed
over as soon as it is in, a failure that names its shard and starts nothing more, and rows
set aside on disk that come back in order and leave nothing behind.

The jobs are plain functions synchronised with threading primitives: no store, no timing
guesswork (every wait has a timeout, so a broken runner fails here instead of hanging).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from hub.common import InputError, UnavailableError
from hub.store import Shard, Spill, plan_shards, run_shards

WAIT = 10.0  # seconds a job waits for what must happen; only a broken runner reaches it
LEFT = "bucket left for a later collect"


def four_shards() -> list[Shard]:
    shards = plan_shards({"a": 1, "b": 1, "c": 1, "d": 1}, 1, "cluster")
    assert [s.clusters for s in shards] == [("a",), ("b",), ("c",), ("d",)]
    return shards


def test_never_more_than_the_concurrency_in_flight_and_every_shard_finishes_once():
    shards = four_shards()
    width = 3
    lock = threading.Lock()
    in_flight = peak = 0
    together = threading.Barrier(width, timeout=WAIT)  # width at once, or it breaks

    def job(shard: Shard, n: int) -> tuple[str, int]:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        together.wait()
        with lock:
            in_flight -= 1
        return shard.clusters[0], n

    def jobs(shard: Shard) -> list[Callable[[], tuple[str, int]]]:
        return [functools.partial(job, shard, n) for n in range(3)]  # 12: 4 rounds of 3

    folded: list[tuple[str, int]] = []
    finished: list[str] = []

    def done(shard: Shard) -> None:
        assert sum(1 for c, _ in folded if c == shard.clusters[0]) == 3  # all of it in
        finished.append(shard.clusters[0])

    run_shards(shards, jobs, lambda shard, answer: folded.append(answer), done=done,
               concurrency=width, consequence=LEFT)
    assert peak == width
    assert sorted(folded) == [(c, n) for c in "abcd" for n in range(3)]
    assert sorted(finished) == ["a", "b", "c", "d"]


def test_a_fast_shards_answer_reaches_the_caller_before_a_slow_one_finishes():
    """The slow shard finishes only once the caller has folded the fast one's answer: a
    runner that handed answers over in plan order would keep it waiting (and fail here)."""
    slow, fast = plan_shards({"slow": 1, "fast": 1}, 1, "cluster")[::-1]
    assert slow.clusters == ("slow",) and fast.clusters == ("fast",)
    fast_folded = threading.Event()

    def jobs(shard: Shard) -> list[Callable[[], bool]]:
        if shard is slow:
            return [lambda: fast_folded.wait(WAIT)]
        return [lambda: True]

    order: list[tuple[str, bool]] = []

    def fold(shard: Shard, answer: bool) -> None:
        order.append((shard.clusters[0], answer))
        if shard is fast:
            fast_folded.set()

    run_shards([slow, fast], jobs, fold, concurrency=2, consequence=LEFT)
    assert order == [("fast", True), ("slow", True)]


def test_the_failing_shard_is_named_and_later_shards_are_not_started():
    shards = four_shards()
    started: list[str] = []
    finished: list[str] = []

    def job(shard: Shard) -> str:
        started.append(shard.clusters[0])
        if shard.clusters == ("b",):
            raise UnavailableError(f"hub answered 503 (store overloaded); {LEFT}")
        return shard.clusters[0]

    with pytest.raises(UnavailableError) as failed:  # the same error: the same exit code
        run_shards(shards, lambda shard: [lambda: job(shard)], lambda shard, answer: None,
                   done=lambda shard: finished.append(shard.clusters[0]), concurrency=1,
                   consequence=LEFT)
    assert failed.value.format_message() == (
        f"hub answered 503 (store overloaded) (shard of clusters b, 2 of 4); {LEFT}")
    assert started == ["a", "b"] and finished == ["a"]


def test_a_failure_while_the_caller_folds_names_the_shard_too():
    """The sync finds a partial response while folding an answer, not while fetching it."""
    shards = four_shards()

    def fold(shard: Shard, answer: str) -> None:
        if answer == "d":
            raise InputError("no GPU series carries label 'clutser'; inventory left unchanged")

    with pytest.raises(InputError) as failed:
        run_shards(shards, lambda shard: [lambda: shard.clusters[0]], fold, concurrency=2,
                   consequence="inventory left unchanged")
    assert failed.value.format_message() == (
        "no GPU series carries label 'clutser' (shard of clusters d, and any cluster not in "
        "another shard, 4 of 4); inventory left unchanged")


def test_a_fleet_of_one_shard_fails_with_the_error_as_it_came():
    (whole,) = plan_shards({"a": 5, "b": 5}, 100, "cluster")
    assert whole.matcher == ""  # asked without any cluster matcher

    def boom() -> None:
        raise UnavailableError(f"hub down; {LEFT}")

    with pytest.raises(UnavailableError, match=f"^hub down; {LEFT}$"):
        run_shards([whole], lambda shard: [boom], lambda shard, answer: None, concurrency=4,
                   consequence=LEFT)


def _open_files_under(folder: Path) -> int:
    """This process's open file descriptors whose file is (or was) in ``folder``."""
    fds = Path("/proc/self/fd")
    count = 0
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):  # closed while listing (the listing's own)
            count += os.readlink(fd).startswith(str(folder))
    return count


def test_spilled_rows_come_back_in_order_and_leave_no_file_behind(tmp_path: Path):
    batches = [[{"gpu": f"GPU-{s}-{i}", "hours": i / 3} for i in range(n)]
               for s, n in enumerate((3, 0, 5, 1))]
    spill: Spill[dict[str, object]] = Spill("gpufleet-test-", dir=str(tmp_path))
    try:
        for batch in batches:
            spill.add(batch)
        assert list(tmp_path.iterdir()) == []  # no name on disk, even while it is open
        assert _open_files_under(tmp_path) == 1
        assert spill.rows == 9
        assert list(spill.batches()) == batches
        assert list(spill) == [row for batch in batches for row in batch]  # read again
    finally:
        spill.close()
    assert _open_files_under(tmp_path) == 0
    assert list(tmp_path.iterdir()) == []


def test_a_spill_stores_what_encode_makes_and_gives_back_what_decode_makes(tmp_path: Path):
    seen: list[object] = []

    def encode(batch: list[complex]) -> list[tuple[float, float]]:
        seen.append(batch)
        return [(c.real, c.imag) for c in batch]

    spill: Spill[complex] = Spill(dir=str(tmp_path), encode=encode,
                                  decode=lambda pairs: [complex(*p) for p in pairs])
    try:
        spill.add([1 + 2j, 3 - 4j])
        spill.add([5j])
        assert list(spill.batches()) == [[1 + 2j, 3 - 4j], [5j]]
        assert len(seen) == 2
    finally:
        spill.close()


def test_a_spill_kept_in_memory_opens_no_file_and_lets_each_batch_go_as_read(tmp_path: Path):
    spill: Spill[int] = Spill(dir=str(tmp_path), on_disk=False)
    spill.add([1, 2])
    spill.add([3])
    assert _open_files_under(tmp_path) == 0
    assert list(spill.batches()) == [[1, 2], [3]]
    assert list(spill.batches()) == []  # read once: the fleet's one shard is not held twice
    spill.close()
