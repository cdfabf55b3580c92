"""Capacity on DRA nodes: GPUs held through ResourceClaims, against a brute-force oracle.

The rows are the inventory's tables on SQLite; the oracle counts, per GPU, what pod labels
hold plus what claims add: a claimed whole GPU once, a claimed MIG device one more slice of
its profile while an unlabelled one is left.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub.inventory._migrate import metadata
from hub.usage import capacity
from hub.usage._dra import claim_held

T0 = dt.datetime(2026, 11, 24, 12, 0)
PROFILES = ("1g.10gb", "3g.40gb")


@pytest.fixture(scope="module")
def engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    metadata().create_all(engine)
    return engine


def _gpu(cluster: str, node: str, uuid: str, slice_key: str = "", profile: str | None = None,
         state: str = "active") -> dict:
    return {"uuid": uuid, "slice_key": slice_key, "cluster": cluster, "node": node,
            "mig_profile": profile, "mig_instance": slice_key.split("/")[-1] or None,
            "vendor": "nvidia", "model": "NVIDIA A100-SXM4-80GB", "state": state,
            "memory_total_mib": 81920.0 if not slice_key else None,
            "first_seen": T0, "last_seen": T0, "last_sample_at": T0}


@st.composite
def fleets(draw):
    """GPUs on two nodes (whole, or MIG with slices), pod-labelled rows, claims, and whether
    each claim was read by the latest claims-reading run (older runs must not count)."""
    gpus, labelled, claims, old_claims = [], set(), [], []
    for n in range(2):
        node = f"n{n}"
        for g in range(draw(st.integers(0, 3))):
            uuid = f"GPU-{n}-{g}"
            slices = draw(st.lists(st.sampled_from(PROFILES), max_size=3))
            gpus.append(_gpu("c", node, uuid))
            if not slices:
                if draw(st.booleans()):
                    labelled.add((uuid, ""))
                claims += [(node, uuid, "", None)] * draw(st.integers(0, 2))
                old_claims += [(node, uuid, "", None)] * draw(st.integers(0, 1))
            for i, profile in enumerate(slices):
                key = f"{profile}/{i + 1}"
                gpus.append(_gpu("c", node, uuid, key, profile))
                if draw(st.booleans()):
                    labelled.add((uuid, key))
            for profile in PROFILES:
                for p in range(draw(st.integers(0, 2))):
                    claims.append((node, uuid, f"gpu-{g}-mig-{profile}-{p}", profile))
    return gpus, labelled, claims, old_claims


def _oracle(gpus: list[dict], labelled: set, claims: list) -> set:
    held = set(labelled)
    for _node, uuid, device, profile in sorted(set(claims)):
        if not device:
            held.add((uuid, ""))
            continue
        free = sorted(g["slice_key"] for g in gpus if g["uuid"] == uuid
                      and g["mig_profile"] == profile and (uuid, g["slice_key"]) not in held)
        if free:
            held.add((uuid, free[0]))
    return held - set(labelled)


def _store(conn: sa.Connection, gpus, labelled, claims, old_claims) -> None:
    for table in (inv.gpus, inv.allocations, inv.reconcile_claims, inv.reconcile_clusters,
                  inv.reconcile_runs):
        conn.execute(table.delete())
    if gpus:
        conn.execute(inv.gpus.insert(), gpus)
    for run_id, rows in ((1, old_claims), (2, claims), (3, None)):
        conn.execute(inv.reconcile_runs.insert().values(
            id=run_id, started_at=T0, finished_at=T0, source="kube", managed_clusters=False,
            clusters=1, nodes=0, problems=0))
        conn.execute(inv.reconcile_clusters.insert().values(
            run_id=run_id, cluster="c", status="ok", observed_nodes=0, observed_gpus=0,
            reason="", claims_read=True if rows is not None else None))
        for node, uuid, device, profile in set(rows or []):
            conn.execute(inv.reconcile_claims.insert().values(
                run_id=run_id, cluster="c", node=node, gpu=uuid, device=device,
                namespace="ns", pod="p", claim=f"claim-{device or uuid}", profile=profile))
    for uuid, key in labelled:
        g = next(g for g in gpus if (g["uuid"], g["slice_key"]) == (uuid, key))
        conn.execute(inv.allocations.insert().values(
            cluster="c", node=g["node"], uuid=uuid, slice_key=key, namespace="ns", pod="l",
            container="c", first_seen=T0, last_seen=T0))


@settings(max_examples=80, deadline=None)
@given(fleets())
def test_claims_add_what_labels_do_not_hold(engine, fleet):
    gpus, labelled, claims, old_claims = fleet
    with engine.begin() as conn:
        _store(conn, gpus, labelled, claims, old_claims)
        got = claim_held(conn, None, labelled)
        assert got - labelled == _oracle(gpus, labelled, claims)  # run 1's claims ignored
        rows = capacity(conn, ["node"])
    for row in rows:
        assert row["allocated"] + row["free"] == pytest.approx(row["active"], abs=1e-5)
        assert row["allocated"] <= row["active"] + 1e-9


def test_a_cluster_whose_latest_run_read_no_claims_keeps_the_previous_reading(engine):
    """Only runs that read claims speak for them (a hub-source run reads none)."""
    gpus = [_gpu("c", "n0", "GPU-a")]
    with engine.begin() as conn:
        _store(conn, gpus, set(), [("n0", "GPU-a", "", None)], [])
        assert claim_held(conn) == {("GPU-a", "")}
        assert claim_held(conn, ["other"]) == set()
        conn.execute(inv.gpus.update().values(state="stale"))
        assert claim_held(conn) == set()  # a stale GPU is not held
