"""A failed sync leaves the inventory exactly as it was, records the run, and exits 2 or 3.

The store's failures (5xx, timeouts, partial answers, warnings, rejected PromQL) are played by
an in-memory store (``mock_client``: a plain function from request to answer, in front of the
real Prometheus where a healthy answer is wanted); a hub that stops mid-sync and a second
sync behind the lock stay on real sockets, and tests/test_hub_timeouts.py keeps the genuine
connect and read timeouts.
"""

from __future__ import annotations

import json
import re
import time
from urllib.parse import parse_qs

import pytest
import requests

from hub.common import GpufleetError
from hub.inventory import _db as inventory
from hub.inventory import run_sync
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.httpstub import (
    Request,
    Response,
    StubServer,
    forward,
    json_response,
    mock_client,
)
from tests.support.promql import wait_for
from tests.support.samples import sample_text

T4 = "dcgm-t4-loaded-ericsson-ccd.prom"


@pytest.fixture
def front():
    """Start a StubServer in front of the hub with a plain handler function."""
    started: list[StubServer] = []

    def start(handler) -> StubServer:
        server = StubServer(handler)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def synced(hub, fleet, db_url):
    """One healthy sync, so there is an inventory to protect."""
    fleet("east", [sample_text(T4), sample_text("amd-mi300x.prom")])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_UTIL) + count(gpu_gfx_activity)",
             lambda r: bool(r) and r[0]["value"][1] == "3")
    env = {"GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "30s"}
    assert gpufleet("sync", "--hub-url", hub.url, env=env).exit_code == 0
    before = gpufleet_json("inventory", "gpus", env=env)
    time.sleep(1.1)  # a later sync would move last_seen / last_sample_at if it committed
    return env, before


def assert_unchanged_with_failed_run(env, before, needle: str) -> None:
    assert gpufleet_json("inventory", "gpus", env=env) == before
    runs = gpufleet_json("inventory", "sync-runs", env=env)
    assert runs[0]["status"] == "failed" and needle in runs[0]["error"]
    assert runs[1]["status"] == "ok"


def sync_through(handler, env, **client_options) -> GpufleetError:
    """One sync against the in-memory store ``handler``, as ``gpufleet sync`` runs it; the
    error it fails with (its message is the CLI's one line, its exit code the CLI's)."""
    engine = inventory.make_engine(env["GPUFLEET_DB"])
    try:
        with pytest.raises(GpufleetError) as failed:
            run_sync(engine, mock_client(handler, **client_options), stale_after=30.0)
    finally:
        engine.dispose()
    return failed.value


def one_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output
    return lines[0]


def test_hub_stopped_during_a_sync(hub, synced, front):
    env, before = synced
    calls = {"n": 0}

    def stop_after_two(req: Request) -> Response:
        calls["n"] += 1
        if calls["n"] == 3:
            hub.stop()
        return forward(hub.url, req)

    result = gpufleet("sync", "--hub-url", front(stop_after_two).url, env=env)
    assert result.exit_code == 3, result.stderr
    # 502 from the front, or 503 from the hub shutting down under a concurrent request
    assert re.search("answered 50[23]", one_line(result.stderr))
    assert_unchanged_with_failed_run(env, before, "answered 50")
    # with the hub gone altogether: unreachable, same guarantees
    result = gpufleet("sync", "--hub-url", hub.url, env=env)
    assert result.exit_code == 3
    assert "unreachable: connection refused" in one_line(result.stderr)
    assert gpufleet_json("inventory", "gpus", env=env) == before


def with_warnings(hub_url: str):
    """A store that ignores partial_response=false and answers partial results anyway."""

    def handle(req: Request) -> Response:
        upstream = forward(hub_url, req)
        data = json.loads(upstream.body)
        data["warnings"] = ["receive-2: store unavailable"]
        return json_response(200, data)

    return handle


def test_partial_response_is_a_failure(hub, synced):
    env, before = synced
    error = sync_through(with_warnings(hub.url), env)
    assert error.exit_code == 3
    assert "partial response (receive-2: store unavailable)" in error.format_message()
    assert_unchanged_with_failed_run(env, before, "partial response")


def thanos_like(hub_url: str):
    """A Thanos Query whose receive-2 is down: partial answers unless partial_response=false."""

    def handle(req: Request) -> Response:
        form = parse_qs(req.body.decode())
        if form.get("partial_response") == ["false"]:
            return json_response(422, {
                "status": "error", "errorType": "execution",
                "error": "expanding series: proxy Series(): rpc error: code = Unavailable "
                         "desc = receive-2: store unavailable"})
        return partial(req)

    partial = with_warnings(hub_url)
    return handle


def test_every_query_refuses_partial_responses(hub, synced, front):
    """Thanos answers partial results unless asked not to: every query asks (sync and query)."""
    env, _ = synced
    proxy = front(lambda req: forward(hub.url, req))
    assert gpufleet("sync", "--hub-url", proxy.url, env=env).exit_code == 0
    assert gpufleet("query", "--hub-url", proxy.url, "up").exit_code == 0
    queries = [parse_qs(r.body.decode()) for r in proxy.seen if "/api/v1/query" in r.path]
    assert len(queries) >= 2
    assert all(q.get("partial_response") == ["false"] for q in queries), queries


def test_thanos_refusing_a_partial_answer_is_unavailable_not_a_promql_error(hub, synced, front):
    env, before = synced
    error = sync_through(thanos_like(hub.url), env)
    assert error.exit_code == 3
    line = one_line(error.format_message())
    assert "could not read all its stores" in line and "receive-2" in line
    assert "PromQL error" not in line
    assert_unchanged_with_failed_run(env, before, "could not read all its stores")
    # a genuine evaluation error (also 422 "execution") is still the user's PromQL: exit 2
    bad = front(lambda req: json_response(422, {
        "status": "error", "errorType": "execution",
        "error": "found duplicate series for the match group"}))
    result = gpufleet("query", "--hub-url", bad.url, "a / on() b")
    assert result.exit_code == 2
    assert "PromQL error" in one_line(result.stderr)


@pytest.mark.parametrize("command", [["report", "-o", "json"], ["reconcile", "--source", "hub"]])
def test_every_command_reading_the_hub_fails_on_a_partial_answer(hub, synced, front, command):
    """Not only sync: a report or reconcile from a partial answer would look healthy."""
    env, _ = synced
    for handler, needle in ((with_warnings(hub.url), "partial response"),
                            (thanos_like(hub.url), "could not read all its stores")):
        result = gpufleet(*command, "--hub-url", front(handler).url, env=env)
        assert result.exit_code == 3, result.output
        assert needle in one_line(result.stderr)


@pytest.mark.parametrize("status", [500, 503])
def test_server_error_exits_3(synced, status):
    env, before = synced
    error = sync_through(lambda req: json_response(status, {"status": "error", "error": "boom"}),
                         env)
    assert error.exit_code == 3
    assert f"answered {status}" in one_line(error.format_message())
    assert_unchanged_with_failed_run(env, before, str(status))


def test_timeout_exits_3(hub, synced):
    """The client's handling of a read timeout (the genuine one, on a socket that never
    answers: tests/test_hub_timeouts.py)."""
    env, before = synced
    calls = {"n": 0}

    def slow_after_one(req: Request) -> Response:
        calls["n"] += 1
        if calls["n"] > 1:
            raise requests.ReadTimeout("read timed out")
        return forward(hub.url, req)

    error = sync_through(slow_after_one, env, timeout=0.5)
    assert error.exit_code == 3
    assert "did not answer within 0.5s (--read-timeout)" in one_line(error.format_message())
    assert_unchanged_with_failed_run(env, before, "did not answer")


def test_a_truncated_answer_exits_3(hub, synced):
    """A store (or proxy) that breaks off mid-answer: a malformed answer, never a short one."""
    env, before = synced

    def cut(req: Request) -> Response:
        whole = forward(hub.url, req)
        return Response(whole.status, whole.body[: len(whole.body) // 2], whole.content_type)

    error = sync_through(cut, env)
    assert error.exit_code == 3
    # streamed: cut among the rows; read whole (a small answer): not JSON at all
    message = error.format_message()
    assert ("sent a malformed or incomplete answer" in message
            or "answered 200 OK: {" in message), message
    assert_unchanged_with_failed_run(env, before, message[-40:])


def test_promql_rejected_by_store_exits_2(synced):
    env, before = synced
    error = sync_through(lambda req: json_response(
        422, {"status": "error", "errorType": "execution", "error": "query too expensive"}), env)
    assert error.exit_code == 2
    assert error.format_message() == "PromQL error: query too expensive"
    assert_unchanged_with_failed_run(env, before, "query too expensive")


def test_second_sync_waits_for_the_lock_then_exits_3(hub, synced, db_url):
    env, _ = synced
    engine = inventory.make_engine(db_url)
    try:
        with inventory.locked_transaction(engine, 0):
            started = time.monotonic()
            result = gpufleet("sync", "--hub-url", hub.url, "--lock-timeout", "1s", env=env)
            waited = time.monotonic() - started
    finally:
        engine.dispose()
    assert result.exit_code == 3
    assert "another sync holds the inventory lock" in one_line(result.stderr)
    assert waited >= 0.9
    # the lock is released with the transaction: the next sync runs
    assert gpufleet("sync", "--hub-url", hub.url, env=env).exit_code == 0
