"""Revision 0002 and the reconcile store, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._partitions import not_a_partition
from hub.inventory._writer import apply_observations
from hub.validate import _reconcile as rc
from hub.validate import _reconcile_store as store
from tests.support.clirun import gpufleet

NOW = dt.datetime(2026, 11, 28, 12, 0, 0)


def test_upgrade_creates_exactly_the_tables_the_models_describe(db_url):
    result = gpufleet("db", "upgrade", "--db", db_url)
    assert result.exit_code == 0 and result.stdout.strip().endswith(f"-> {migrate.head()}"), \
        result.output
    engine = inventory.make_engine(db_url)
    try:
        assert {"reconcile_runs", "reconcile_results", "reconcile_clusters"} <= set(
            migrate.metadata().tables)  # the store's tables share the inventory's metadata
        with engine.connect() as conn:
            # the ledger's monthly partitions are the program's, not the models' (PostgreSQL)
            context = MigrationContext.configure(conn, opts={"include_name": not_a_partition})
            assert compare_metadata(context, migrate.metadata()) == []
        assert migrate.current(engine) == migrate.head()
    finally:
        engine.dispose()


def _observations() -> list[Observation]:
    t = NOW.replace(tzinfo=dt.UTC).timestamp()
    out = [Observation("east", "gpu-a", f"GPU-{i}", "nvidia", index=i, sample_at=t)
           for i in range(4)]
    # one MIG GPU with two slices, one whole GPU, on a node of another cluster
    out += [Observation("west", "mig-1", "GPU-m0", "nvidia", index=0, sample_at=t),
            Observation("west", "mig-1", "GPU-m0", "nvidia", mig_profile="3g.40gb",
                        mig_instance="1", sample_at=t),
            Observation("west", "mig-1", "GPU-m0", "nvidia", mig_profile="3g.40gb",
                        mig_instance="2", sample_at=t),
            Observation("west", "mig-1", "GPU-m1", "nvidia", index=1, sample_at=t)]
    return out


def test_observed_nodes_count_active_gpus_and_slices(db_url):
    engine = inventory.make_engine(db_url, create=True)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            apply_observations(conn, _observations(), NOW)
        later = NOW + dt.timedelta(minutes=5)
        with engine.begin() as conn:  # GPU-3 disappears
            apply_observations(
                conn, [o for o in _observations() if o.uuid != "GPU-3"], later)
        with engine.connect() as conn:
            observed = {o.node: o for o in store.observed_nodes(conn)}
        assert observed["gpu-a"].gpus == 3 and observed["gpu-a"].state == "active"
        mig = observed["mig-1"]
        assert (mig.gpus, mig.slices, mig.mig_gpus, mig.vendor) == (2, 2, 1, "nvidia")
        assert mig.last_sample_at == NOW
    finally:
        engine.dispose()


def _reconciliation(n: int) -> rc.Reconciliation:
    views = [rc.NodeView("east", f"n{i}", {"nvidia.com/gpu": 8}) for i in range(n)]
    observed = [rc.ObservedNode("east", f"n{i}", "active", 8 - (i == 0)) for i in range(n)]
    return rc.compare(views, observed, covered={"east"},
                      managed=[rc.ManagedCluster("east", "True"),
                               rc.ManagedCluster("ghost", "False")])


def test_runs_are_stored_read_back_and_pruned(db_url):
    engine = inventory.make_engine(db_url, create=True)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            first = store.save_run(conn, _reconciliation(3), source="kube", started_at=NOW,
                                   managed_clusters=True)
        with engine.begin() as conn:
            plain = rc.compare([], [], covered=set())
            second = store.save_run(conn, plain, source="file", started_at=NOW,
                                    managed_clusters=False, keep=2)
        with engine.connect() as conn:
            latest = store.latest_run(conn)
            managed = store.latest_managed_run(conn)
        assert latest is not None and latest.id == second and latest.nodes == []
        assert managed is not None and managed.id == first and managed.source == "kube"
        assert [(r["node"], r["status"]) for r in managed.nodes] == [
            ("n0", "count_mismatch"), ("n1", "match"), ("n2", "match")]
        assert managed.nodes[0]["resources"] == {"nvidia.com/gpu": 8}
        assert managed.nodes[0]["reason"] == "k8s 8 vs 7 observed"
        assert store.expected_clusters(managed) == {"east": "True", "ghost": "False"}
        with engine.begin() as conn:
            for _ in range(3):
                store.save_run(conn, _reconciliation(2), source="hub", started_at=NOW,
                               managed_clusters=False, keep=2)
        with engine.connect() as conn:
            ids = [r[0] for r in conn.execute(store.reconcile_runs.select())]
            assert len(ids) == 2 and first not in ids
            kept = {r.run_id for r in conn.execute(store.reconcile_results.select())}
            assert kept <= set(ids)
            assert store.latest_managed_run(conn) is None  # pruned with its rows
    finally:
        engine.dispose()
