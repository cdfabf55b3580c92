"""The usage ledger's writers and guard rails, on SQLite and PostgreSQL, against a real hub
Prometheus backfilled with the fleet of tests/test_usage_e2e.py (samples every 30 s).

- two processes collecting the same and adjacent buckets ten times over give, row for row,
  the ledger and rollup one writer gives;
- a period reaching past now writes and marks only buckets that ended a push interval ago;
- one bucket grid: another bucket size is refused, naming both;
- values that would destroy the ledger are one-line errors (exit 2) and change nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub import inventory as inv
from tests.support.backfill import backfilled_hub
from tests.support.clirun import gpufleet, gpufleet_json, on_terminal
from tests.test_usage_e2e import HOUR, fleet_text, iso

REPO = Path(__file__).resolve().parents[1]

WRITER = """
import sys
from hub import inventory as inv, usage
from hub.store import HubClient, HubSettings
url, hub, first, count = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
engine = inv.make_engine(url)
with HubClient.from_settings(HubSettings(url=hub)) as client:
    for _ in range(10):
        result = usage.collect_usage(engine, client, push_interval=30.0,
                                     starts=[first + i * 3600.0 for i in range(count)])
        assert not result.failed, result.failed
"""


def ledger(url: str) -> tuple[list[tuple], list[tuple]]:
    """Every ledger and rollup row, in one order (collected_at is when, not what)."""
    engine = inv.make_engine(url)
    with engine.connect() as conn:
        rows = sorted(tuple(r) for r in conn.execute(sa.select(inv.usage)))
        daily = sorted(tuple("" if v is None else v for v in r) for r in conn.execute(
            sa.select(inv.usage_daily)))
    engine.dispose()
    return rows, daily


def fresh(url: str) -> None:
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    with engine.begin() as conn:
        for table in (inv.usage_rows, inv.usage_places, inv.usage_pods, inv.usage_buckets,
                      inv.usage_daily, inv.usage_ledger):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture
def backfilled(tmp_path: Path):
    t0 = (time.time() // HOUR) * HOUR - 4 * HOUR
    hub = backfilled_hub(tmp_path / "hub", fleet_text(t0)).start(timeout=120)
    try:
        yield hub, t0
    finally:
        hub.stop()


def test_two_writers_at_once_give_the_single_writers_ledger_and_rollup(backfilled, db_url,
                                                                       tmp_path):
    hub, t0 = backfilled
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    fresh(db_url)
    alone = subprocess.run([sys.executable, "-c", WRITER, db_url, hub.url, str(t0), "3"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert alone.returncode == 0, alone.stderr
    single = ledger(db_url)
    assert len(single[0]) == 3 * 9 + 1 and single[1]

    fresh(db_url)
    # A: hours 1-2, B: hours 2-3 -- the same bucket (hour 2) and adjacent ones, ten times each
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, db_url, hub.url, str(first),
                                 "2"], env=env, stderr=subprocess.PIPE, text=True)
               for first in (t0, t0 + HOUR)]
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err
    assert ledger(db_url) == single


def test_a_period_reaching_past_now_writes_only_ended_buckets(backfilled, tmp_path):
    hub, t0 = backfilled
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    now = time.time()
    result = gpufleet("usage", "collect", "--from", iso(t0), "--until", iso(now + 3 * HOUR),
                      env=env)
    assert result.exit_code == 0, result.output
    assert "not ended a push interval (5m) ago were left for a later collect" in result.stdout
    engine = inv.make_engine(db)
    with engine.connect() as conn:
        marked = [r.bucket_end for r in conn.execute(sa.select(inv.usage_buckets))]
        latest_row = conn.execute(sa.select(sa.func.max(inv.usage.c.bucket_end))).scalar()
    engine.dispose()
    # every bucket written ended at least one push interval (300 s) before the collect
    assert marked and max(marked).timestamp() <= now - 300 + 1 - _utc_offset()
    assert latest_row <= max(marked)
    data = gpufleet_json("usage", "collect", "--from", iso(t0), "--until",
                         iso(now + 3 * HOUR), env=env)
    assert data["clipped_not_ended"] >= 3 and data["next_bucket"] is not None


def _utc_offset() -> float:
    """naive UTC datetimes' .timestamp() reads them as local time; correct for it."""
    return time.localtime().tm_gmtoff


def test_one_bucket_grid_another_size_is_refused_naming_both(backfilled, tmp_path):
    hub, t0 = backfilled
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    period = ["--from", iso(t0), "--until", iso(t0 + 2 * HOUR), "--push-interval", "30s"]
    assert gpufleet("usage", "collect", *period, env=env).exit_code == 0
    before = ledger(db)
    other = gpufleet("usage", "collect", *period, "--bucket", "5m", env=env)
    assert other.exit_code == 2
    assert "buckets are 1h, not 5m" in other.stderr and "--replace-grid" in other.stderr
    assert ledger(db) == before
    # the explicit way: start over on the new grid
    assert gpufleet("usage", "collect", *period, "--bucket", "5m", "--replace-grid",
                    env=env).exit_code == 2  # without --yes
    redone = gpufleet("usage", "collect", *period, "--bucket", "5m", "--replace-grid", "--yes",
                      env=env)
    assert redone.exit_code == 0, redone.output
    rows, _ = ledger(db)
    sizes = {(r[7] - r[0]).total_seconds() for r in rows}  # bucket_end - bucket_start
    assert sizes == {300.0}
    hours = sum(r[11] for r in rows if r[3] == "GPU-A")  # gpu_hours of a GPU on all along
    assert hours == pytest.approx(2.0)


@pytest.mark.parametrize("args, message", [
    (["--usage-retention", "0s"], "--usage-retention 0s would delete rows"),
    (["--usage-retention", "12h"], "use at least 48h"),
    (["--from", "0001-01-01T00:00:00Z"], "buckets of 1h (at most 100,000)"),
    (["--since", "100000000d"], "is too long (at most 100y)"),
    (["--max-backfill", "1000000d"], "is too long (at most 100y)"),
    (["--step", "1m", "--push-interval", "5m"], "--step 1m is below the push interval 5m"),
    (["--bucket", "7m"], "--bucket 7m must be a whole number of push intervals (5m)"),
])
def test_values_that_would_destroy_the_ledger_are_one_line_errors(backfilled, tmp_path, args,
                                                                   message):
    hub, t0 = backfilled
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    first = ["--from", iso(t0), "--until", iso(t0 + 2 * HOUR), "--push-interval", "30s"]
    assert gpufleet("usage", "collect", *first, env=env).exit_code == 0
    before = ledger(db)
    result = gpufleet("usage", "collect", *args, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.stderr.strip().splitlines()[-1], result.stderr  # one line
    assert ledger(db) == before


def test_a_long_period_needs_yes_and_says_how_many_buckets(backfilled, tmp_path):
    hub, _ = backfilled
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}"}
    result = gpufleet("usage", "collect", "--since", "60d", env=env)
    assert result.exit_code == 2
    assert "buckets of 1h (more than 1,000); add --yes" in result.stderr
    assert "holds 1,439 buckets" in result.stderr or "holds 1,440 buckets" in result.stderr


def test_a_cluster_label_no_series_carries_is_refused_and_nothing_is_written(backfilled,
                                                                              tmp_path):
    hub, t0 = backfilled
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db}
    period = ["--from", iso(t0), "--until", iso(t0 + 3 * HOUR), "--push-interval", "30s"]
    assert gpufleet("usage", "collect", *period, env=env).exit_code == 0
    before = ledger(db)
    typo = gpufleet("usage", "collect", *period, "--cluster-label", "clustr", env=env)
    assert typo.exit_code == 2
    assert "no GPU series carries the cluster label 'clustr'" in typo.stderr
    after = ledger(db)
    assert after == before and all(r[1] for r in after[0])  # no row under cluster ''


def test_replace_grid_while_the_hub_is_down_leaves_the_ledger_whole(backfilled, db_url):
    """The probe: `--replace-grid --yes` with the hub unreachable emptied the ledger, then
    exited 3; rows came back only within the hub's retention. Now the hub is asked first."""
    hub, t0 = backfilled
    fresh(db_url)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    period = ["--from", iso(t0), "--until", iso(t0 + 2 * HOUR), "--push-interval", "30s"]
    assert gpufleet("usage", "collect", *period, env=env).exit_code == 0
    before = ledger(db_url)
    assert before[0]
    down = gpufleet("usage", "collect", *period, "--bucket", "5m", "--replace-grid", "--yes",
                    env={**env, "GPUFLEET_HUB_URL": "http://127.0.0.1:1"})
    assert down.exit_code == 3
    line = down.stderr.strip().splitlines()[-1]
    assert "the hub does not answer" in line and "the usage ledger is unchanged" in line
    assert ledger(db_url) == before
    # and with the hub up: one swap, the new grid's buckets in place of the old
    swapped = gpufleet("usage", "collect", *period, "--bucket", "5m", "--replace-grid",
                       "--yes", env=env)
    assert swapped.exit_code == 0, swapped.output
    rows, _ = ledger(db_url)
    assert {(r[7] - r[0]).total_seconds() for r in rows} == {300.0}
    assert len({r[0] for r in rows}) == 24  # every 5m bucket of the two hours


@pytest.mark.parametrize("wait", ["default", "0s"])
def test_a_second_collector_waits_for_the_ledger_lock_by_default(backfilled, db_url, wait):
    """The probe: with --lock-timeout 0s a collect of other hours beside a writer exited 3
    and its hours waited for the next run. By default it now waits (a bounded time) and
    collects; 0s still means do not wait."""
    import threading

    hub, t0 = backfilled
    fresh(db_url)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url}
    period = ["--from", iso(t0 + HOUR), "--until", iso(t0 + 2 * HOUR), "--push-interval", "30s"]
    held, release = threading.Event(), threading.Event()
    engine = inv.make_engine(db_url)

    def writer() -> None:  # another ledger writer, mid-bucket for a few seconds
        with inv.locked_transaction(engine, 5, key=inv.LEDGER_LOCK_KEY):
            held.set()
            release.wait(3)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert held.wait(10)
        extra = [] if wait == "default" else ["--lock-timeout", wait]
        result = gpufleet("usage", "collect", *period, *extra, env=env)
    finally:
        release.set()
        thread.join(10)
        engine.dispose()
    if wait == "default":
        assert result.exit_code == 0, result.output
        assert len({r[0] for r in ledger(db_url)[0]}) == 1  # its hour is in
    else:
        assert result.exit_code == 3
        assert "holds the inventory lock" in result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("args", "message"), [
    # 48h of 12s buckets: the 18-minute silent catch-up of the first hour with gpufleet
    (["--bucket", "12s", "--push-interval", "1s"],
     r"catching up --max-backfill 48h means 14,[34]\d\d buckets of 12s not collected yet "
     r"\(more than 1,000\); add --yes"),
    (["--bucket", "1s", "--push-interval", "1s"],
     r"--max-backfill 48h holds 172,800 buckets of 1s \(at most 100,000\); shorten "
     r"--max-backfill"),
])
def test_a_catch_up_has_the_guard_of_an_explicit_period(tmp_path, args, message):
    """No --from/--until: the buckets --max-backfill would catch up are counted before the
    hub is asked (here a closed port: asking it would exit 3, not 2); over 1,000 need --yes,
    over 100,000 are refused; nothing is written."""
    import re

    from hub.devstack import free_port

    db = f"sqlite:///{tmp_path / 'inv.db'}"
    env = {"GPUFLEET_HUB_URL": f"http://127.0.0.1:{free_port()}", "GPUFLEET_DB": db}
    result = gpufleet("usage", "collect", *args, env=env)
    assert result.exit_code == 2, result.output
    assert re.search(message, result.stderr.strip().splitlines()[-1]), result.stderr
    if Path(tmp_path / "inv.db").exists():
        assert ledger(db) == ([], [])


def test_collect_shows_progress_on_a_terminal_and_nothing_when_piped(backfilled, tmp_path):
    """A bar on a terminal (stderr a pty), nothing but the result when piped."""

    hub, t0 = backfilled
    period = ["--from", iso(t0), "--until", iso(t0 + 3 * HOUR), "--push-interval", "30s",
              "--hub-url", hub.url]
    piped = gpufleet("usage", "collect", *period, "--db", f"sqlite:///{tmp_path / 'a.db'}")
    assert piped.exit_code == 0, piped.output
    assert "usage buckets of" not in piped.stderr and "━" not in piped.stderr
    code, seen, out = on_terminal("usage", "collect", *period,
                                  "--db", f"sqlite:///{tmp_path / 'b.db'}")
    assert code == 0, seen
    assert b"usage buckets of 1h" in seen
    assert "3 buckets" in out  # the result itself on stdout, as when piped


def _buckets(url: str) -> dict:
    if not Path(url.removeprefix("sqlite:///")).exists():
        return {}
    engine = inv.make_engine(url)
    try:
        with engine.connect() as conn:
            return {r.bucket_start: r.collected_at for r in conn.execute(
                sa.select(inv.usage_buckets))}
    except sa.exc.OperationalError:  # no schema yet
        return {}
    finally:
        engine.dispose()


def test_sigterm_stops_a_serve_backfill_between_buckets_and_the_next_start_resumes(
        backfilled, tmp_path):
    """`serve` catching up 2 h of 1-minute buckets: SIGTERM ends the catch-up between two
    buckets (each written whole), the service exits 0 and says how many are left; the next
    start collects only those, not again the ones written."""
    from hub.devstack import free_port

    hub, _ = backfilled
    db = f"sqlite:///{tmp_path / 'inv.db'}"

    def serve() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "hub", "serve", "--hub-url", hub.url, "--db", db,
             "--every", "1h", "--listen", f"127.0.0.1:{free_port()}", "--usage-bucket", "1m",
             "--push-interval", "30s", "--usage-max-backfill", "2h"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)})

    first = serve()
    deadline = time.monotonic() + 120
    while len(_buckets(db)) < 3:
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the catch-up never started"
        time.sleep(0.1)
    signalled = time.monotonic()
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    took = time.monotonic() - signalled
    print(f"serve stopped {took:.1f}s after SIGTERM mid-backfill (this machine)")
    assert first.returncode == 0, err
    [line] = [ln for ln in err.splitlines() if "usage: stopped between buckets" in ln]
    left = int(line.split(", ")[-1].split()[0])
    written = _buckets(db)
    assert left > 0 and len(written) < 125
    second = serve()
    try:
        deadline = time.monotonic() + 240
        while len(_buckets(db)) < len(written) + left:
            assert second.poll() is None, second.communicate()
            assert time.monotonic() < deadline, "the next start did not resume"
            time.sleep(0.2)
    finally:
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=60)
    after = _buckets(db)
    # the buckets of the first start kept their collection time: resumed, not redone
    assert {b: after[b] for b in written} == written
