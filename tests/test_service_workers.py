"""`gpufleet serve --workers N` as replicas on one PostgreSQL: every process serves, exactly
one runs the schedule, and another takes it over when that one goes."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
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
    kernel hands each to whichever worker accepts first, and a busy leader in the middle of
    a sync accepts last: under load a dozen tries all reached the follower)."""
    for _ in range(100):
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


#: `gpufleet serve`'s options as click hands them over (every one named: no hidden default)
SERVE_OPTIONS = dict(
    every=60.0, listen="127.0.0.1:0", reconcile=True, workers=2, tokens_file=None,
    oidc_issuer=None, oidc_audience=None, oidc_scope_claim="groups", scopes_file=None,
    allow_unauthenticated=False, metrics_open=False, session_ttl=3600.0,
    forwarded_allow_ips="10.128.0.0/14, 127.0.0.1", tls_cert_file=None, tls_key_file=None,
    usage_bucket=3600.0, usage_retention=30 * 86400.0, usage_max_backfill=7200.0,
    prices=None, prune_stale_after=86400.0, instance_types=None, max_age=1800.0,
    push_interval=60.0, min_charge=0.0, window=3600.0, stale_after=600.0, lock_timeout=5.0,
    cluster_label="cluster", idle_threshold=7.5, idle_for=3600.0)


def _jobs_in_a_fresh_process(settings) -> list[str]:
    """What a worker started by pickling (a spawn, as uvicorn's own workers start) builds
    from the settings it was handed."""
    from hub.service import service_jobs
    from hub.store import HubClient

    with HubClient.from_settings(settings.hub) as client:
        jobs = service_jobs(inventory.make_engine(settings.db, create=True), client, settings)
        return [job.__name__ for job in jobs.after_sync]


def test_serve_options_become_one_settings_value_a_worker_process_can_take(tmp_path):
    """`serve`'s options are checked once, into one frozen value of plain parts, and that
    value is all a worker needs: handed to a new process by pickling, it builds the same
    schedule there."""
    import multiprocessing
    import pickle

    import pydantic
    import pytest

    from hub.common import InputError
    from hub.service import serve_settings
    from hub.store import HubSettings

    prices = tmp_path / "prices.yaml"
    prices.write_text("H100: 2.5\n")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens: []\n")
    settings = serve_settings(**{**SERVE_OPTIONS, "prices": str(prices),
                                 "tokens_file": str(tokens)},
                              db=f"sqlite:///{tmp_path / 'inv.db'}",
                              hub=HubSettings(url="http://127.0.0.1:1"))
    assert (settings.host, settings.port) == ("127.0.0.1", 0)
    assert settings.forwarded_allow_ips == ("10.128.0.0/14", "127.0.0.1")
    assert settings.idle_rule == (7.5, 3600.0) and settings.prices.price(None, "H100") == 2.5
    assert settings.authenticator().enabled  # built again from the path, in any process
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        settings.every = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(settings)) == settings
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        built = pool.apply(_jobs_in_a_fresh_process, (settings,))
    assert built == ["reconcile_job", "prune_job", "usage_job"]
    with pytest.raises(InputError, match="--prune-stale-after must be longer"):
        serve_settings(**{**SERVE_OPTIONS, "prune_stale_after": 60.0}, db=None,
                       hub=HubSettings(url="http://127.0.0.1:1"))


def server(hub_url: str, db: str, port: int, log: Path) -> subprocess.Popen:
    """One `gpufleet serve` process (one worker: SIGSTOP stops the whole of it). Its usage
    catch-up reaches back one hour, not the default 48: on SQLite a process stopped inside
    a write transaction holds the file's write lock, and nobody (the next leader's lease
    included) can write until it goes; the 48 buckets of a first start, each its own write,
    kept the leader inside one for most of the test under load."""
    return subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", hub_url, "--db", db,
         "--listen", f"127.0.0.1:{port}", "--workers", "1", "--every", "1s",
         "--stale-after", "30s", "--usage-max-backfill", "1h"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


def leading(url: str) -> bool:
    try:
        return "gpufleet_schedule_leader 1.0" in requests.get(url + "/metrics", timeout=2).text
    except requests.RequestException:
        return False


def answers(url: str) -> bool:
    try:
        return requests.get(url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def wait_until(what, timeout: float) -> float:
    """Seconds until ``what()`` held (AssertionError past ``timeout``)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if what():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s")


def test_a_hung_leader_is_replaced_and_writes_nothing_when_it_wakes(hub, db_url, tmp_path):
    """SIGSTOP keeps the leader's lock held (its connection, its flock): the lease runs out
    (5 beats of 1 s) and the other process leads; SIGCONT'd, the old one steps down without
    a sync; a SIGKILL'd leader is replaced at once through its lock."""
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = server(hub.url, db_url, ports[0], logs[0])
    procs = [a]
    try:
        wait_until(lambda: leading(urls[0]), 60)
        b = server(hub.url, db_url, ports[1], logs[1])
        procs.append(b)
        wait_until(lambda: answers(urls[1]) and not leading(urls[1]), 60)
        wait_runs(db_url, 2)
        a.send_signal(signal.SIGSTOP)
        # the rendered liveness probe sees it hung; a TCP probe (the kernel's backlog) would not
        with socket.create_connection(("127.0.0.1", ports[0]), timeout=2):
            pass
        with pytest.raises(requests.Timeout):
            requests.get(urls[0] + "/livez", timeout=1)
        took = wait_until(lambda: leading(urls[1]), 20)
        assert took < 10, took  # 5 s of lease and a beat or two, not "never"
        before = len(runs(db_url))
        wait_runs(db_url, before + 2, timeout=20)  # b syncs
        assert requests.get(urls[1] + "/healthz", timeout=5).status_code == 200
        woke = logs[0].stat().st_size
        a.send_signal(signal.SIGCONT)
        wait_until(lambda: "stepping down" in logs[0].read_text()[woke:]
                   or "sync not written" in logs[0].read_text()[woke:], 20)
        wait_runs(db_url, len(runs(db_url)) + 2, timeout=20)
        assert "sync ok" not in logs[0].read_text()[woke:]
        assert not leading(urls[0]) and leading(urls[1])
        # b dies: its lock goes with it, and a takes over without waiting out a lease
        b.send_signal(signal.SIGKILL)
        b.wait(timeout=10)
        assert wait_until(lambda: leading(urls[0]), 10) < 3
        wait_runs(db_url, len(runs(db_url)) + 1, timeout=20)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
    done = runs(db_url)
    assert all(r["status"] == "ok" for r in done), done
    for earlier, later in itertools.pairwise(done):  # one at a time, never two at once
        assert later["started_at"] >= earlier["finished_at"], (earlier, later)
    assert "Traceback" not in "".join(log.read_text() for log in logs)


def children_of(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            found += [int(p) for p in task.read_text().split()]
    return found


@pytest.mark.parametrize("after", [0, 1, 3])
def test_sigterm_while_workers_start_ends_serve_within_seconds(hub, tmp_path, after):
    """SIGTERM as soon as the ``after``-th worker is forked (the parent still forking, the
    workers still importing and connecting): every process ends within a few seconds."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", hub.url, "--db",
         f"sqlite:///{tmp_path / 'inventory.db'}", "--listen", f"127.0.0.1:{port}",
         "--workers", "8", "--every", "1s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(children_of(proc.pid)) <= after and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.001)
        workers = children_of(proc.pid)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"serve still running 15 s after SIGTERM "
                                 f"({len(children_of(proc.pid))} workers)") from None
        took = time.monotonic() - sent
        assert code == 0, proc.communicate()
        assert took < 8, took
        for pid in workers:  # none left behind
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in proc.communicate()[1]
