"""`inventory clusters` and the report agree on a silent cluster's nodes: the report says
"0/4 reporting" and the table said NODES 0, as if the cluster never had any. The table shows
the nodes reporting beside the nodes known, in the CLI, its JSON and the API's model."""

from __future__ import annotations

import datetime as dt

from hub.inventory import _db as inv
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import InventoryWriter
from hub.service._models import Cluster
from hub.validate import summarize
from hub.validate._reconcile_store import report_facts
from tests.support.clirun import gpufleet, gpufleet_json

T0 = dt.datetime(2026, 3, 1, 12, 0)
T1 = T0 + dt.timedelta(minutes=5)


def _gpu(cluster: str, node: str, uuid: str) -> Observation:
    return Observation(cluster, node, uuid, "nvidia", model="NVIDIA H100 80GB HBM3",
                       memory_total_mib=81559.0, sample_at=1.0e9)


def test_a_silent_cluster_shows_its_known_nodes_as_the_report_does(db_url):
    engine = inv.make_engine(db_url, create=True)
    migrate.ensure_schema(engine)
    east = [_gpu("east", f"e{i}", f"GPU-e{i}") for i in range(4)]
    west = [_gpu("west", "w1", "GPU-w1"), _gpu("west", "w2", "GPU-w2")]
    for now, seen in ((T0, east + west), (T1, west[:1])):  # east goes silent, w2 too
        with engine.begin() as conn:
            writer = InventoryWriter(conn, now)
            writer.add(seen)
            writer.finish()
    with engine.connect() as conn:
        rows = {r["cluster"]: r for r in inv.list_clusters(conn)}
        report = {r["cluster"]: r for r in summarize(report_facts(conn, T1), [])}
    engine.dispose()
    assert {c: (r["state"], r["nodes"], r["known_nodes"]) for c, r in rows.items()} == {
        "east": ("stale", 0, 4), "west": ("active", 1, 2)}
    for name, row in rows.items():  # the report's "0/4 reporting" is the same two numbers
        assert (report[name]["nodes_reporting"], report[name]["nodes_expected"]) == (
            row["nodes"], row["known_nodes"])
        assert Cluster(**row).known_nodes == row["known_nodes"]  # the API carries it too

    env = {"GPUFLEET_DB": db_url}
    assert [(r["cluster"], r["nodes"], r["known_nodes"])
            for r in gpufleet_json("inventory", "clusters", env=env)] == [
        ("east", 0, 4), ("west", 1, 2)]
    # wide enough that the table is a table, not a record per row (as on a narrow terminal)
    table = gpufleet("inventory", "clusters", env={**env, "COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    header, east_line = table.output.splitlines()[:2]
    assert header.split()[:3] == ["CLUSTER", "NODES", "KNOWN_NODES"]
    assert east_line.split()[:3] == ["east", "0", "4"]
