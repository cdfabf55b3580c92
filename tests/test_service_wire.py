"""Answers sent as encoded bytes (hub/service/_wire.py) are still the answers the response
models describe, and answers kept as bytes are kept per scope and follow the inventory.

The hot routes skip FastAPI's check of the answer against its model (that check was most of
a request's CPU): each answer must already be what the model would send, so the walk asks
every JSON route of the scoped-walk inventory, as the whole fleet and as a team, and checks
that the model, reading the answer back, writes exactly the same JSON (a missing default,
an extra field, another time format, a wrong type would each differ or fail).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pydantic
import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute

from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.service import build_app, read_only_engine
from hub.service._deps import CallerScope, ReadEngine
from hub.service._errors import ApiError
from hub.service._memo import LoopVersion, read_version
from hub.service._routing import KEEP, Keep
from hub.service._routing import route as add_route
from tests.support.asgi import AppClient, no_metrics
from tests.test_api_scoped_walk import ADMIN, TEAM, _client, _variants, app  # noqa: F401

JSON_ROUTES_MIN = 13


def _as_model_sends(route: APIRoute, body: Any) -> Any:
    adapter = pydantic.TypeAdapter(route.response_model)
    value = adapter.validate_python(body)
    return adapter.dump_python(value, mode="json",
                               exclude_unset=route.response_model_exclude_unset)


def test_every_json_answer_is_what_its_model_would_send(app):  # noqa: F811
    client = _client(app)
    checked: set[str] = set()
    for token in (ADMIN, TEAM):
        headers = {"Authorization": f"Bearer {token}"}
        for route in app.routes:
            if (not isinstance(route, APIRoute) or "GET" not in route.methods
                    or route.response_model is None or not route.path.startswith("/api/")):
                continue  # /healthz writes its own model's dump, unset fields left out
            for path, query in _variants(route):
                r = client.get(path, params=query, headers=headers)
                if r.status_code != 200 or "json" not in r.headers["content-type"]:
                    continue
                body = r.json()
                assert _as_model_sends(route, body) == body, (path, query)
                checked.add(route.path_format)
    assert len(checked) >= JSON_ROUTES_MIN, checked


def test_a_finding_without_a_namespace_reads_null_as_the_model_says(app):  # noqa: F811
    client = _client(app)
    items = client.get("/api/v1/findings",
                       headers={"Authorization": f"Bearer {ADMIN}"}).json()["items"]
    heartbeat = next(f for f in items if f["check"] == "heartbeat")
    assert "namespace" in heartbeat and heartbeat["namespace"] is None
    assert heartbeat["checked_at"].endswith("Z")


def _gpu(cluster: str, uuid: str) -> Observation:
    return Observation(cluster, f"{cluster}-n1", uuid, "nvidia", index=0, model="H100")


def test_kept_answers_are_kept_per_scope_and_follow_a_good_sync_at_once(tmp_path):
    """The whole fleet's kept page is never a team's, the team's never the fleet's; a good
    sync shows at once; a failed sync (it wrote nothing) keeps what was kept."""
    import yaml

    from hub.service import Authenticator, TokenFile, token_entry

    url = f"sqlite:///{tmp_path / 'kept.db'}"
    writer = inventory.make_engine(url, create=True)
    migrate.ensure_schema(writer)
    now = inventory.now_utc()
    with writer.begin() as conn:
        apply_observations(conn, [_gpu("east", "GPU-e1"), _gpu("west", "GPU-w1")],
                                     now)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry("admin", ADMIN), token_entry("team", TEAM, clusters=["east"])]}))
    engine = read_only_engine(url)
    made = build_app(engine, health=lambda: (True, {}), findings=lambda: ([], None),
                     metrics=no_metrics, auth=Authenticator(tokens=TokenFile(tokens)))
    client = AppClient(made)

    def uuids(token: str) -> list[str]:
        status, body = client.handle("/api/v1/gpus", Authorization=f"Bearer {token}")
        assert status == 200
        return [g["uuid"] for g in body["items"]]

    try:
        assert uuids(ADMIN) == ["GPU-e1", "GPU-w1"]
        assert uuids(TEAM) == ["GPU-e1"]
        assert uuids(ADMIN) == ["GPU-e1", "GPU-w1"] and uuids(TEAM) == ["GPU-e1"]
        kept = made.state.answers.computed
        assert kept == 2  # one per scope, then served as kept
        # looked up on the event loop on a connection of its own: the same version
        assert made.state.loop_version.read() == read_version(engine) is not None

        with writer.begin() as conn:  # a failed sync: a run recorded, nothing else written
            inventory.record_run(conn, started_at=now, status="failed", requests=3,
                                 error="hub unreachable")
        assert uuids(ADMIN) == ["GPU-e1", "GPU-w1"]
        assert made.state.answers.computed == kept

        later = now + dt.timedelta(minutes=5)
        with writer.begin() as conn:  # a good sync: a GPU appears in east
            apply_observations(conn, [_gpu("east", "GPU-e1"), _gpu("east", "GPU-e2"),
                                                _gpu("west", "GPU-w1")], later)
            inventory.record_run(conn, started_at=later, status="ok", requests=3)
        assert uuids(TEAM) == ["GPU-e1", "GPU-e2"]
        assert uuids(ADMIN) == ["GPU-e1", "GPU-e2", "GPU-w1"]
        assert made.state.answers.computed == kept + 2
    finally:
        engine.dispose()
        writer.dispose()


def test_an_inventory_never_synced_answers_503_json_and_the_page_says_so(tmp_path):
    """The kept answers' version read goes to the driver directly: its error is still the
    service's 503 (JSON for the API, the page's own notice for a browser), never a 500."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    inventory.make_engine(url, create=True).dispose()  # the file, no tables
    engine = read_only_engine(url)
    client = AppClient(build_app(engine, health=lambda: (True, {}),
                                 findings=lambda: ([], None), metrics=no_metrics))
    try:
        status, body = client.handle("/api/v1/gpus")
        assert status == 503 and "no sync has completed yet" in body["error"]
        status, page = client.handle("/")
        assert status == 503 and "no sync has completed yet" in page.text
    finally:
        engine.dispose()


def test_the_version_read_on_postgresql_leaves_its_connection_as_sqlalchemy_expects(pg_url):
    """The kept answers' version is read outside a transaction (one round trip, not three);
    the connection goes back to the pool in transactions again, and the version moves with
    a good sync as it does on SQLite."""
    writer = inventory.make_engine(pg_url, create=True)
    migrate.ensure_schema(writer)
    engine = read_only_engine(pg_url)
    try:
        before = read_version(engine)
        raw = engine.raw_connection()  # the pool's one connection: the one just used
        try:
            assert raw.driver_connection.autocommit is False
        finally:
            raw.close()
        with writer.begin() as conn:
            inventory.record_run(conn, started_at=inventory.now_utc(), status="ok",
                                 requests=1)
        assert read_version(engine) != before
        # the event loop's own asynchronous connection reads the same version
        assert asyncio.run(LoopVersion(engine).read_async()) == read_version(engine)
        with engine.connect() as conn:  # and it still refuses to write
            try:
                conn.execute(sa.text("CREATE TABLE nope (x int)"))
            except sa.exc.DBAPIError as exc:
                assert "read-only" in str(exc)
            else:
                raise AssertionError("the read-only engine wrote")
    finally:
        engine.dispose()
        writer.dispose()


def test_the_event_loops_version_read_gives_up_rather_than_fail(tmp_path):
    """No database file (or no SQLite at all): None, and the request goes to the thread
    pool, where the pooled read answers or says why (the 503 test above)."""
    url = f"sqlite:///{tmp_path / 'never.db'}"
    engine = read_only_engine(url)
    try:
        assert LoopVersion(engine).read() is None  # no file yet: read-only open fails
    finally:
        engine.dispose()
    assert LoopVersion(None).read() is None


def test_caching_is_a_route_option_applied_by_the_one_pipeline(tmp_path):
    """A handler says nothing of caching: the route declares ``keep`` where it is added, and
    the pipeline keeps its answer per parameters, scope and inventory version (``vary``
    adding what else it depends on); an answer that is not a 200 is never kept, and a
    route without ``keep`` asks its handler every time."""
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    writer = inventory.make_engine(url, create=True)
    migrate.ensure_schema(writer)
    now = inventory.now_utc()
    with writer.begin() as conn:
        apply_observations(conn, [_gpu("east", "GPU-e1")], now)
        inventory.record_run(conn, started_at=now, status="ok", requests=1)
    engine = read_only_engine(url)
    made = build_app(engine, health=lambda: (True, {}), findings=lambda: ([], None),
                     metrics=no_metrics)
    calls: list[str] = []
    flavour = ["plain"]

    def counted(engine: ReadEngine, scope: CallerScope, n: int = 0) -> dict[str, Any]:
        calls.append(f"counted {n}")
        if n < 0:
            raise ApiError(404, "no such n")
        return {"n": n}

    def varied(engine: ReadEngine, scope: CallerScope) -> dict[str, Any]:
        calls.append(f"varied {flavour[0]}")
        return {"flavour": flavour[0]}

    def uncached(engine: ReadEngine, scope: CallerScope) -> dict[str, Any]:
        calls.append("uncached")
        return {}

    add_route(made, "/t/counted", counted, dict[str, Any], visibility="scoped", keep=KEEP)
    add_route(made, "/t/varied", varied, dict[str, Any], visibility="scoped",
          keep=Keep(vary=lambda request, caller: flavour[0]))
    add_route(made, "/t/uncached", uncached, dict[str, Any], visibility="scoped")
    client = AppClient(made)
    try:
        for _ in range(3):
            assert client.handle("/t/counted", {"n": ["1"]}) == (200, {"n": 1})
            assert client.handle("/t/counted", {"n": ["-1"]})[0] == 404  # never kept
            client.handle("/t/uncached")
        assert client.handle("/t/counted", {"n": ["2"]}) == (200, {"n": 2})
        assert calls.count("counted 1") == 1 and calls.count("counted 2") == 1
        assert calls.count("counted -1") == 3 and calls.count("uncached") == 3
        assert client.handle("/t/varied")[1] == {"flavour": "plain"}
        flavour[0] = "spicy"  # what the route says its answer varies by, beside its query
        assert client.handle("/t/varied")[1] == {"flavour": "spicy"}
        assert client.handle("/t/varied")[1] == {"flavour": "spicy"}
        assert calls.count("varied spicy") == 1
        later = now + dt.timedelta(minutes=5)
        with writer.begin() as conn:  # a good sync: every kept answer is computed again
            inventory.record_run(conn, started_at=later, status="ok", requests=1)
        client.handle("/t/counted", {"n": ["1"]})
        assert calls.count("counted 1") == 2

        async def asynchronous(engine: ReadEngine) -> dict[str, Any]:
            return {}

        with pytest.raises(TypeError, match="keep is for synchronous handlers"):
            add_route(made, "/t/async", asynchronous, dict[str, Any], keep=KEEP)
    finally:
        engine.dispose()
        writer.dispose()
