"""One writer, many stateless readers: 2 replicas of `gpufleet serve --workers 2` and a
`gpufleet sync` CronJob-like run on one PostgreSQL answer every question alike, and nothing
unchecked looks green.

The leader runs the schedule and the checks and writes their outcome to the database; every
worker of every replica answers from there (hub/service/_status.py), so the same findings,
/healthz, badge and last-success metric come from whichever process a connection reaches.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from hub.devstack import free_port
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.service import DbSessions, DbSignInLimit, SignInLimit
from hub.service._auth import Authenticator
from hub.service._session import Login, guessed
from tests.support.httpstub import Response, StubServer, forward
from tests.support.promql import wait_for
from tests.support.samples import EAST, WEST, sample_text, series_count

EVERY = 20.0
#: keep-alive connections per replica: each stays with the worker that accepted it, and 8
#: reach both workers but for a 1 in 128 chance
SESSIONS = 8
#: what moves from one sync to the next (times, ages)
MOVING = re.compile(r"(_seen|_at|^at|_age_seconds|_until)$")
QUESTIONS = ("/healthz", "/api/v1/findings", "/api/v1/findings?severity=error",
             "/api/v1/clusters", "/api/v1/nodes", "/api/v1/gpus", "/api/v1/gpus?cluster=east",
             "/api/v1/gpus?state=stale", "/api/v1/allocations", "/api/v1/sync-runs?limit=3",
             "/api/v1/events?limit=50", "/api/v1/capacity", "/api/v1/usage", "/api/v1/idle",
             "/api/v1/placement-scores")
BADGE = re.compile(r'<span class="badge ([a-z]+)" data-checks="([^"]+)">([^<]*)</span>')
CHECKED = re.compile(r'id="generated">As of [^;]+; ([^.]+)\.')


def steady(item: Any) -> Any:
    if isinstance(item, dict):
        return {k: steady(v) for k, v in item.items() if not MOVING.search(k)}
    if isinstance(item, list):
        return [steady(v) for v in item]
    return item


def replica(hub_url: str, db: str, port: int, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--hub-url", hub_url, "--db", db,
         "--listen", f"127.0.0.1:{port}", "--workers", "2", "--every", f"{EVERY:g}s",
         "--stale-after", "30s", "--shard-size", "100", "--query-concurrency", "2"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)


def cronjob(hub_url: str, db: str) -> None:
    # it waits for the lock, as a CronJob beside a service should: the leader syncs every
    # few seconds here, and without a wait a CronJob that lands mid-sync exits 3 (next run)
    done = subprocess.run([sys.executable, "-m", "hub", "sync", "--once", "--hub-url", hub_url,
                           "--db", db, "--stale-after", "30s", "--lock-timeout", "60s"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def metrics(text: str) -> dict[str, float]:
    return {s.name + "".join(f"{{{v}}}" for v in s.labels.values()): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def ask(session: requests.Session, url: str) -> dict[str, Any]:
    """The 20 questions, asked over one connection (so of one process)."""
    answers: dict[str, Any] = {}
    for path in QUESTIONS:
        r = session.get(url + path, timeout=10)
        answers[path] = (r.status_code, steady(r.json()))
    scraped = metrics(session.get(url + "/metrics", timeout=10).text)
    answers["last success"] = scraped["gpufleet_sync_last_success_timestamp_seconds"]
    answers["findings metric"] = sorted((k, v) for k, v in scraped.items()
                                        if k.startswith("gpufleet_findings"))
    page = session.get(url + "/", timeout=10).text
    answers["badge"] = BADGE.findall(page)
    answers["checked"] = CHECKED.findall(page)
    answers["page findings"] = re.findall(r'data-count="findings">\((\d+)\)', page)
    answers["leads"] = scraped["gpufleet_schedule_leader"]  # not compared: who leads
    return answers


def everyone(urls: list[str], sessions: list[list[requests.Session]], *, tries: int = 15
             ) -> list[dict[str, Any]]:
    """Every connection's answers, once a round of them agrees (a sync that lands in the
    middle of a round moves the sync runs and times: that round is asked again)."""
    for _ in range(tries):
        rounds = [ask(s, url) for url, group in zip(urls, sessions, strict=True)
                  for s in group]
        compared = [{k: v for k, v in a.items() if k != "leads"} for a in rounds]
        if all(a == compared[0] for a in compared):
            return rounds
        time.sleep(1.0)
    diff = {k for a in compared for k in a if a[k] != compared[0][k]}
    seen = {k: sorted({repr(a[k])[:300] for a in compared}) for k in sorted(diff)}
    raise AssertionError(f"the processes disagree on {seen}")


def leaders(urls: list[str], answered: list[dict[str, Any]], tries: int = 40) -> list[float]:
    """gpufleet_schedule_leader as the processes say it: the answers' own, then over new
    connections until a leader and a follower were heard (the kernel hands a replica's
    connections to whichever worker accepts first: under load one worker may take a whole
    round of them)."""
    seen = {a["leads"] for a in answered}
    for _ in range(tries):
        if seen >= {0.0, 1.0}:
            break
        for url in urls:
            with requests.Session() as fresh:
                seen.add(metrics(fresh.get(url + "/metrics", timeout=10).text)[
                    "gpufleet_schedule_leader"])
    return sorted(seen)


def latest_ok(db: str) -> float:
    engine = inventory.make_engine(db)
    try:
        with engine.connect() as conn:
            at = conn.execute(sa.select(sa.func.max(inventory.sync_runs.c.finished_at))
                              .where(inventory.sync_runs.c.status == "ok")).scalar()
        return at.replace(tzinfo=dt.UTC).timestamp()
    finally:
        engine.dispose()


def until(what, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.3)
    raise AssertionError(f"not within {timeout}s")


def test_every_worker_of_every_replica_answers_alike_and_unchecked_is_never_green(
        hub, fleet, pg_url, tmp_path):
    fleet("east", [sample_text(f) for f in EAST])
    fleet("west", [sample_text(f) for f in WEST])
    expected = series_count(EAST) + series_count(WEST)
    wait_for(hub.url, 'count({__name__=~"DCGM_.+"})',
             lambda r: bool(r) and int(float(r[0]["value"][1])) == expected)
    down = [True]  # the service's way to the hub: refused until the checks may run
    seen: list[float] = []

    def door(req: Any) -> Response:
        seen.append(time.monotonic())
        return Response(503, b"hub down", "text/plain") if down[0] else forward(hub.url, req)

    stub = StubServer(door)
    cronjob(hub.url, pg_url)  # the CronJob synced first: an inventory, and no checks yet
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [replica(stub.url, pg_url, p, log) for p, log in zip(ports, logs, strict=True)]
    sessions = [[requests.Session() for _ in range(SESSIONS)] for _ in urls]
    try:
        for url in urls:
            until(lambda url=url: _answers(url), 60)
        until(lambda: "sync failed" in "".join(log.read_text() for log in logs), 30)
        time.sleep(2.5)  # a refresh: every process has read the failure
        before = everyone(urls, sessions)
        first = before[0]
        findings = first["/api/v1/findings"][1]
        # no check has run: nobody says "all well"
        assert findings["checks"] == "not checked yet" and findings["items"] == []
        assert findings["last_check_failed"]["error"].startswith("sync failed, no checks ran")
        assert first["badge"] == [("unchecked", "not checked yet", "not checked yet")]
        assert first["checked"] == ["not checked yet"]
        # the CronJob's sync is the last success of every process (the alert stays quiet)
        assert first["last success"] == pytest.approx(latest_ok(pg_url), abs=0.01)
        assert all(time.time() - a["last success"] <= 900 for a in before)
        healthz = first["/healthz"]
        assert healthz[0] == 200 and healthz[1]["consecutive_failures"] >= 1
        # one process leads, the others follow (heard over new connections if need be)
        assert leaders(urls, before) == [0.0, 1.0]

        down[0] = False  # the hub is back: the leader's retry syncs and checks
        opened = len(seen)
        until(lambda: all(a["/api/v1/findings"][1]["checks"] == "checked"
                          for a in [ask(s, u) for u, g in zip(urls, sessions, strict=True)
                                    for s in g[:2]]), EVERY + 30)
        time.sleep(2.5)
        after = everyone(urls, sessions)
        first = after[0]
        assert first["/api/v1/findings"][1]["checks"] == "checked"
        assert first["/api/v1/findings"][1]["last_check_failed"] is None
        colour, checked, _text = first["badge"][0]
        assert checked == "checked" and colour in ("ok", "warning", "error")
        assert first["checked"][0].startswith("checks of ")
        assert first["page findings"] == [str(len(first["/api/v1/findings"][1]["items"]))]
        assert first["/healthz"][0] == 200
        runs = first["/api/v1/sync-runs?limit=3"][1]["items"]
        assert runs[0]["status"] == "ok" and runs[0]["shards"] >= 1
        assert len(seen) > opened  # the leader asked the hub through the door

        cronjob(hub.url, pg_url)  # a CronJob's sync beside the service: everyone's too
        time.sleep(2.5)
        last = everyone(urls, sessions)
        assert last[0]["last success"] == pytest.approx(latest_ok(pg_url), abs=0.01)
        assert last[0]["last success"] > first["last success"]
        assert all(time.time() - a["last success"] <= 900 for a in last)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)
        stub.stop()
    assert "Traceback" not in "".join(log.read_text() for log in logs)


def _answers(url: str) -> bool:
    try:
        return requests.get(url + "/livez", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_failed_sign_ins_are_counted_across_processes(db_url):
    """Two limits on one database stand for two processes: the documented 5 failures per
    token lock it in both, however they are spread, with SignInLimit's own backoff."""
    engine = inventory.make_engine(db_url, create=True)
    migrate.ensure_schema(engine)
    now = [1_700_000_000.0]
    a, b = (DbSignInLimit(engine, clock=lambda: now[0]) for _ in range(2))
    oracle = SignInLimit(clock=lambda: now[0])
    key = guessed("gpf_wrong")
    for limit in (a, b, a, b):
        limit.failed(key)
        oracle.failed(key)
    assert a.allow(key) and b.allow(key)
    b.failed(key)
    oracle.failed(key)
    assert a.wait(key) == b.wait(key) == oracle.wait(key) == 60
    now[0] += 60
    for limit in (b, a, b, a, b):  # the next lockout doubles, as in one process
        limit.failed(key)
        oracle.failed(key)
    assert a.wait(key) == oracle.wait(key) == 120
    assert a.allow(guessed("gpf_other"))
    a.succeeded(key)
    assert b.allow(key)
    # serve's sign-in form counts there whenever its sessions are in the database
    login = Login(Authenticator(), DbSessions(engine))
    assert isinstance(login.limit, DbSignInLimit)
    engine.dispose()
