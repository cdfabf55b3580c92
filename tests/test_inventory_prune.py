"""Inventory retention: `gpufleet inventory prune` and `serve --prune-stale-after`.

A decommissioned cluster is the case: its GPUs, nodes and the cluster itself go once they
have been stale for longer than asked, with their MIG slices and allocations; what is still
reporting, or stale for a shorter time, stays. Runs on SQLite and PostgreSQL.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest

from hub import inventory as inv
from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.service import ServeSettings, service_jobs
from hub.store import HubClient
from tests.support.clirun import gpufleet

NOW = _db.now_utc().replace(microsecond=0)
LONG_AGO = NOW - dt.timedelta(days=120)
RECENTLY = NOW - dt.timedelta(days=10)


def _obs(cluster: str, node: str, uuid: str, **kw) -> Observation:
    return Observation(cluster, node, uuid, "nvidia", index=0, **kw)


@pytest.fixture
def fleet_db(db_url: str) -> str:
    """east: decommissioned 120 days ago (a MIG GPU with an allocation, a plain GPU);
    west: reporting now, with one node gone 120 days ago and one gone 10 days ago."""
    engine = _db.make_engine(db_url, create=True)
    migrate.ensure_schema(engine)
    with engine.begin() as conn:
        apply_observations(conn, [
            _obs("east", "e1", "GPU-e1", allocations={("team-a", "train-0", "main")}),
            _obs("east", "e1", "GPU-e1", mig_profile="3g.40gb", mig_instance="1",
                 allocations={("team-a", "train-0", "main")}),
            _obs("east", "e2", "GPU-e2"),
            _obs("west", "w-old", "GPU-wold"),
            _obs("west", "w1", "GPU-w1"),
            _obs("west", "w-recent", "GPU-wrecent"),
        ], LONG_AGO)
        apply_observations(conn, [_obs("west", "w1", "GPU-w1"),
                                      _obs("west", "w-recent", "GPU-wrecent")], RECENTLY)
        apply_observations(conn, [_obs("west", "w1", "GPU-w1")], NOW)
    engine.dispose()
    return db_url


def _inventory(db: str) -> dict[str, list]:
    engine = _db.make_engine(db)
    with engine.connect() as conn:
        out = {"clusters": [c["cluster"] for c in inv.list_clusters(conn)],
               "nodes": [(n["cluster"], n["node"]) for n in inv.list_nodes(conn)],
               "gpus": [(g["uuid"], g["mig_profile"]) for g in inv.list_gpus(conn)],
               "allocations": inv.list_allocations(conn)}
    engine.dispose()
    return out


def test_dry_run_prints_what_would_go_and_changes_nothing(fleet_db):
    before = _inventory(fleet_db)
    result = gpufleet("inventory", "prune", "--stale-for", "90d", "--dry-run", "--db",
                      fleet_db, "-o", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert {(r["kind"], r["cluster"], r["node"], r["uuid"], r["slice"]) for r in rows} == {
        ("gpu", "east", "e1", "GPU-e1", None), ("slice", "east", "e1", "GPU-e1", "3g.40gb/1"),
        ("gpu", "east", "e2", "GPU-e2", None), ("gpu", "west", "w-old", "GPU-wold", None),
        ("node", "east", "e1", None, None), ("node", "east", "e2", None, None),
        ("node", "west", "w-old", None, None), ("cluster", "east", None, None, None)}
    assert "would remove 1 clusters, 3 nodes, 3 GPUs and 1 MIG slices" in result.stderr
    assert _inventory(fleet_db) == before


def test_prune_removes_the_decommissioned_and_keeps_the_rest(fleet_db):
    result = gpufleet("inventory", "prune", "--stale-for", "90d", "--db", fleet_db)
    assert result.exit_code == 0, result.output
    assert "GPU-e1" in result.stdout and "removed 1 clusters" in result.stderr
    after = _inventory(fleet_db)
    assert after["clusters"] == ["west"]
    assert after["nodes"] == [("west", "w-recent"), ("west", "w1")]
    assert sorted(after["gpus"]) == [("GPU-w1", None), ("GPU-wrecent", None)]
    assert after["allocations"] == []
    again = gpufleet("inventory", "prune", "--stale-for", "90d", "--db", fleet_db)
    assert again.exit_code == 0 and "(none)" in again.stdout


def test_pruned_gpus_keep_their_history_with_a_pruned_event(fleet_db):
    """Events are never pruned; each removed GPU or slice gains a `pruned` event."""
    dry = gpufleet("inventory", "prune", "--stale-for", "90d", "--dry-run", "--db", fleet_db)
    assert dry.exit_code == 0
    listed = gpufleet("inventory", "events", "--type", "pruned", "--db", fleet_db, "-o", "json")
    assert json.loads(listed.stdout) == [], "a dry run writes no event"
    assert gpufleet("inventory", "prune", "--stale-for", "90d", "--db", fleet_db).exit_code == 0
    listed = gpufleet("inventory", "events", "--type", "pruned", "--db", fleet_db, "-o", "json")
    pruned = {(e["cluster"], e["node"], e["uuid"], e["slice"]) for e in json.loads(listed.stdout)}
    assert pruned == {("east", "e1", "GPU-e1", None), ("east", "e1", "GPU-e1", "3g.40gb/1"),
                      ("east", "e2", "GPU-e2", None), ("west", "w-old", "GPU-wold", None)}
    history = gpufleet("inventory", "events", "--uuid", "GPU-e2", "--db", fleet_db, "-o", "json")
    assert [e["type"] for e in json.loads(history.stdout)] == ["pruned", "stale", "appeared"]


def test_prune_one_cluster_only(fleet_db):
    result = gpufleet("inventory", "prune", "--stale-for", "90d", "--cluster", "west",
                      "--db", fleet_db, "-o", "json")
    assert result.exit_code == 0, result.output
    assert {(r["kind"], r["node"]) for r in json.loads(result.stdout)} == {
        ("gpu", "w-old"), ("node", "w-old")}
    assert "east" in _inventory(fleet_db)["clusters"]


def test_shorter_age_removes_more(fleet_db):
    result = gpufleet("inventory", "prune", "--stale-for", "7d", "--db", fleet_db,
                      "-o", "json")
    assert result.exit_code == 0, result.output
    assert ("node", "w-recent") in {(r["kind"], r["node"]) for r in json.loads(result.stdout)}


@pytest.mark.parametrize("value, message", [("0s", "--stale-for must be greater than 0"),
                                            ("ninety", "invalid duration")])
def test_bad_stale_for_is_a_one_line_error(fleet_db, value, message):
    result = gpufleet("inventory", "prune", "--stale-for", value, "--db", fleet_db)
    assert result.exit_code == 2 and message in result.output


def test_serve_prunes_after_each_sync_when_asked(fleet_db):
    """The job serve schedules after a successful sync (the same prune as the command)."""
    engine = _db.make_engine(fleet_db)
    client = HubClient("http://127.0.0.1:1")
    plain = service_jobs(engine, client, ServeSettings())
    assert "prune_job" not in [j.__name__ for j in plain.after_sync]  # off by default
    jobs = service_jobs(engine, client, ServeSettings(prune_stale_after=90 * 86400))
    prune_jobs = [j for j in jobs.after_sync if j.__name__ == "prune_job"]
    assert len(prune_jobs) == 1
    prune_jobs[0]()
    engine.dispose()
    assert _inventory(fleet_db)["clusters"] == ["west"]


def test_serve_refuses_a_prune_age_shorter_than_stale_after():
    result = gpufleet("serve", "--hub-url", "http://127.0.0.1:1", "--stale-after", "1h",
                      "--prune-stale-after", "30m", "--listen", "127.0.0.1:0")
    assert result.exit_code == 2
    assert "--prune-stale-after must be longer than --stale-after" in result.output


def test_a_dry_run_needs_no_sync_lock_and_plans_exactly_what_prune_removes(fleet_db):
    """A dry run only reads: it answers while a sync holds the lock, and its rows are the
    rows the real prune removes, for every age and cluster filter."""
    engine = _db.make_engine(fleet_db)
    try:
        with _db.locked_transaction(engine, 0.0):  # a sync in progress
            dry = gpufleet("inventory", "prune", "--stale-for", "90d", "--dry-run", "--db",
                           fleet_db, "-o", "json")
            assert dry.exit_code == 0, dry.output
            held = gpufleet("inventory", "prune", "--stale-for", "90d", "--db", fleet_db)
            assert held.exit_code != 0 and "holds the inventory lock" in held.output
        assert len(json.loads(dry.stdout)) == 8
        for age, cluster in (("7d", None), ("90d", "west"), ("90d", None), ("365d", None)):
            kw = {"stale_for": _db_seconds(age), "cluster": cluster, "now": NOW}
            plan = inv.prune(engine, dry_run=True, **kw)
            done = inv.prune(engine, **kw)
            assert sorted(map(_key, plan.rows)) == sorted(map(_key, done.rows)), (age, cluster)
            assert plan.dry_run and not done.dry_run
    finally:
        engine.dispose()


def _db_seconds(text: str) -> float:
    return float(text[:-1]) * 86400


def _key(row: dict) -> tuple:
    return (row["kind"], row["cluster"], row["node"] or "", row["uuid"] or "",
            row["slice"] or "")
