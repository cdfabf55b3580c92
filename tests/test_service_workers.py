"""`gpufleet serve --workers N` as replicas on one PostgreSQL: every process serves, exactly
one runs the schedule, and another takes it over when that one goes."""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests
import sqlalchemy as sa

from hub.devstack import free_port
from hub.inventory import _db as inventory
from hub.service._workers import _cgroup_cpus, available_cpus
from tests.support.promql import wait_for
from tests.support.samples import EAST, WEST, sample_text, series_count

EVERY = 2.0
#: fields that move with every sync (and the data's own newest sample)
MOVING = re.compile(r"(_seen|_at|^at)$")


def replica(hub_url: str, db: str, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", hub_url, "--db", db,
         "--listen", f"127.0.0.1:{port}", "--workers", "2", "--every", f"{EVERY:g}s",
         "--stale-after", "30s"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


def runs(db: str) -> list[dict]:
    engine = inventory.make_engine(db)
    try:
        with engine.connect() as conn:
            return [dict(r) for r in conn.execute(
                sa.select(inventory.sync_runs).order_by(inventory.sync_runs.c.id)).mappings()]
    except sa.exc.ProgrammingError:  # no schema yet: the replicas are starting
        return []
    finally:
        engine.dispose()


def wait_runs(db: str, n: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = runs(db)
        if len(done) >= n:
            return done
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} sync runs after {timeout}s: {runs(db)}")


def steady(item: object) -> object:
    """An answer without what moves from one sync to the next."""
    if isinstance(item, dict):
        return {k: steady(v) for k, v in item.items() if not MOVING.search(k)}
    if isinstance(item, list):
        return [steady(v) for v in item]
    return item


def leads(url: str) -> bool:
    """Whether any worker behind ``url`` says it runs the schedule (new connections: the
    kernel hands each to one worker)."""
    for _ in range(12):
        text = requests.get(url + "/metrics", timeout=5,
                            headers={"Connection": "close"}).text
        if "gpufleet_schedule_leader 1.0" in text:
            return True
    return False


def test_two_replicas_of_two_workers_sync_one_at_a_time_and_serve_alike(hub, fleet, pg_url,
                                                                       tmp_path):
    fleet("east", [sample_text(f) for f in EAST])
    fleet("west", [sample_text(f) for f in WEST])
    expected = series_count(EAST) + series_count(WEST)
    wait_for(hub.url, 'count({__name__=~"DCGM_.+"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [replica(hub.url, pg_url, p, log) for p, log in zip(ports, logs, strict=True)]
    try:
        done = wait_runs(pg_url, 5)
        assert all(r["status"] == "ok" for r in done), done
        # one after the other, never two at once
        for before, after in itertools.pairwise(done):
            assert after["started_at"] >= before["finished_at"], (before, after)
        # every worker of both replicas serves the same inventory
        for path in ("/api/v1/clusters", "/api/v1/nodes", "/api/v1/gpus"):
            answers = []
            for url in urls:
                for _ in range(4):
                    r = requests.get(url + path, timeout=5, headers={"Connection": "close"})
                    assert r.status_code == 200, r.text
                    answers.append(steady(r.json()))
            assert all(a == answers[0] for a in answers), path
            assert answers[0]["items"]
        for url in urls:  # followers too: healthy from the leader's syncs
            assert requests.get(url + "/healthz", timeout=5).status_code == 200
        leader = [i for i, url in enumerate(urls) if leads(url)]
        assert len(leader) == 1, leader
        # the leading replica goes: the other takes the schedule over
        procs[leader[0]].send_signal(signal.SIGTERM)
        assert procs[leader[0]].wait(timeout=30) == 0
        gone = time.time()
        before = len(runs(pg_url))
        later = wait_runs(pg_url, before + 2, timeout=30)
        assert all(r["status"] == "ok" for r in later)
        other = urls[1 - leader[0]]
        assert leads(other)
        assert requests.get(other + "/healthz", timeout=5).status_code == 200
        assert time.time() - gone < 30
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    text = [log.read_text() for log in logs]
    # exactly one process led at a time: the first, then one of the other replica's workers
    assert [len(re.findall(r"leader: this process runs the schedule", t)) for t in text] \
        in ([1, 1],)
    assert sum(len(re.findall(r"follower: another process", t)) for t in text) >= 3
    assert "Traceback" not in "".join(text)


def test_workers_default_to_the_cpus_a_container_may_use(tmp_path):
    cpus = available_cpus()
    assert 1 <= cpus <= len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert _cgroup_cpus(tmp_path) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert _cgroup_cpus(tmp_path) is None
