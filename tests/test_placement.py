"""Where an N-GPU job fits, against a brute-force packer; what free means; the ACM scores.

The layouts are inventory rows on SQLite (GPUs with health, state, pod-label allocations,
reconcile cordons, stale clusters), read by the same function `capacity`, the API and the
placement scores read; the oracle decides from the drawn facts alone, trying every set of N
healthy free GPUs for one that lies on one node.
"""

from __future__ import annotations

import datetime as dt
import itertools

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub import usage
from hub.inventory._migrate import metadata
from hub.usage._placement import (
    FREE,
    Fleet,
    Unit,
    cluster_scores,
    family,
    model_matches,
    scale,
    score_objects,
)
from tests.support.clirun import gpufleet

T0 = dt.datetime(2026, 11, 24, 12, 0)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


@pytest.fixture(scope="module")
def engine() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    metadata().create_all(engine)
    return engine


gpu_facts = st.fixed_dictionaries({
    "model": st.sampled_from([H100, A100]),
    "health": st.sampled_from([None, "ok", "degraded", "failed"]),
    "stale": st.booleans(), "held": st.booleans()})


@st.composite
def layouts(draw):
    """Clusters of nodes of GPUs, each with its facts; cordoned nodes; stale clusters."""
    clusters = {}
    for c in range(draw(st.integers(1, 3))):
        nodes = {}
        for n in range(draw(st.integers(0, 3))):
            nodes[f"n{n}"] = draw(st.lists(gpu_facts, max_size=5))
        clusters[f"c{c}"] = nodes
    cordoned = draw(st.sets(st.tuples(st.sampled_from(sorted(clusters)),
                                      st.sampled_from(["n0", "n1", "n2"]))))
    stale = draw(st.sets(st.sampled_from(sorted(clusters))))
    return clusters, cordoned, stale


def _load(conn: sa.Connection, clusters: dict, cordoned: set, stale: set) -> None:
    for table in (inv.gpus, inv.allocations, inv.clusters_table, inv.reconcile_results,
                  inv.reconcile_runs):
        conn.execute(table.delete())
    gpus, held = [], []
    for c, nodes in clusters.items():
        conn.execute(inv.clusters_table.insert().values(
            cluster=c, state=inv.STALE if c in stale else inv.ACTIVE, first_seen=T0,
            last_seen=T0, last_sample_at=T0))
        for n, facts in nodes.items():
            for i, f in enumerate(facts):
                uuid = f"GPU-{c}-{n}-{i}"
                gpus.append({"uuid": uuid, "slice_key": "", "cluster": c, "node": n,
                             "vendor": "nvidia", "model": f["model"], "health": f["health"],
                             "state": inv.STALE if f["stale"] else inv.ACTIVE,
                             "memory_total_mib": 81920.0, "first_seen": T0, "last_seen": T0})
                if f["held"]:
                    held.append({"cluster": c, "node": n, "uuid": uuid, "slice_key": "",
                                 "namespace": "ml", "pod": f"p-{uuid}", "container": "main",
                                 "first_seen": T0, "last_seen": T0})
    if gpus:
        conn.execute(inv.gpus.insert(), gpus)
    if held:
        conn.execute(inv.allocations.insert(), held)
    run = conn.execute(inv.reconcile_runs.insert().values(
        started_at=T0, finished_at=T0, source="hub", managed_clusters=False, clusters=0,
        nodes=0, problems=0)).inserted_primary_key[0]
    rows = [{"run_id": run, "cluster": c, "node": n, "status": "match", "mode": "whole",
             "reason": "", "unschedulable": (c, n) in cordoned}
            for c, nodes in clusters.items() for n in nodes]
    if rows:
        conn.execute(inv.reconcile_results.insert(), rows)


def _healthy_free(f: dict, cluster: str, node: str, cordoned: set, stale: set) -> bool:
    return (not f["stale"] and cluster not in stale and f["health"] != "failed"
            and not f["held"] and (cluster, node) not in cordoned)


def _packer(clusters: dict, cordoned: set, stale: set, n: int, model: str | None) -> dict:
    """Brute force: a cluster fits when some n of its healthy free GPUs of the model lie on
    one node (every n-subset tried), fragmented when n exist at all, else short."""
    out = {}
    for c, nodes in clusters.items():
        free = [node for node, facts in nodes.items() for f in facts
                if _healthy_free(f, c, node, cordoned, stale)
                and (model is None or model in f["model"])]
        if c in stale:
            out[c] = ("stale", [])
            continue
        together = sorted({combo[0] for combo in itertools.combinations(free, n)
                           if len(set(combo)) == 1}) if len(free) <= 12 else None
        if together is None:  # too many to enumerate: count per node
            together = sorted({x for x in free if free.count(x) >= n})
        out[c] = (("fits", together) if together
                  else ("fragmented", []) if len(free) >= n else ("short", []))
    return out


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts(), n=st.integers(1, 6), model=st.sampled_from([None, "H100", "A100"]))
def test_fits_agrees_with_a_brute_force_packer(engine, layout, n, model):
    clusters, cordoned, stale = layout
    with engine.begin() as conn:
        _load(conn, clusters, cordoned, stale)
        fleet = usage.read_fleet(conn)
    got = {r["cluster"]: (r["status"], sorted(r["nodes"]))
           for r in usage.fits(fleet, n, model=model)}
    assert got == _packer(clusters, cordoned, stale, n, model)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts())
def test_capacity_free_is_healthy_reporting_unheld_uncordoned(engine, layout):
    """`capacity` (and so the API, the page and its chart) never counts a failed, stale or
    cordoned GPU as free, and its parts add up to the total."""
    clusters, cordoned, stale = layout
    with engine.begin() as conn:
        _load(conn, clusters, cordoned, stale)
        rows = usage.capacity(conn, ["cluster"])
    got = {r["cluster"]: r for r in rows}
    for c, nodes in clusters.items():
        facts = [(node, f) for node, fs in nodes.items() for f in fs]
        if not facts:
            continue
        row = got[c]
        assert row["free"] == sum(_healthy_free(f, c, node, cordoned, stale)
                                  for node, f in facts)
        assert row["failed"] == sum(not f["stale"] and c not in stale
                                    and f["health"] == "failed" for _, f in facts)
        assert row["total"] == len(facts) == sum(
            row[k] for k in ("stale", "failed", "allocated", "cordoned", "free"))


def _unit(cluster: str, node: str, status: str = FREE, *, model: str = H100,
          share: float = 1.0, slice_key: str = "", reclaimable: bool = False) -> Unit:
    return Unit(cluster, node, f"GPU-{cluster}-{node}", slice_key, model,
                "3g.40gb" if slice_key else None, share, status, reclaimable)


def test_scores_are_integers_in_range_with_the_families():
    units = ([_unit("frag", f"n{i}") for i in range(2) for _ in range(4)]
             + [_unit("whole", "n0") for _ in range(8)]
             + [_unit("whole", "n1", model=A100, slice_key="3g.40gb/1", share=3 / 7)]
             + [_unit("sick", "n0") for _ in range(6)]
             + [_unit("sick", "n0", "failed") for _ in range(2)]
             + [_unit("busy", "n0", "allocated", reclaimable=True) for _ in range(3)])
    fleet = Fleet(units, ["busy", "empty", "frag", "sick", "whole"], frozenset())
    got = cluster_scores(fleet, full_at=64)
    assert got["frag"]["gpuFreeNode"] == 0 and got["whole"]["gpuFreeNode"] == 100
    assert got["sick"]["gpuFreeNode"] == 50  # 6 of 8 healthy: the failed two are not free
    assert got["frag"]["gpuFree"] == got["whole"]["gpuFree"] - 1 == scale(8, 64)
    assert got["whole"]["gpuFree-a100"] == scale(3 / 7, 64) and "gpuFree-h100" in got["whole"]
    assert got["busy"]["gpuReclaimable"] == scale(3, 64) and got["busy"]["gpuFree"] == -100
    assert got["empty"] == {"gpuFree": -100, "gpuFreeNode": -100, "gpuReclaimable": -100}
    for values in got.values():
        assert all(isinstance(v, int) and -100 <= v <= 100 for v in values.values())
    [obj, *_] = score_objects(got, T0 + dt.timedelta(minutes=15))
    assert obj["apiVersion"] == "cluster.open-cluster-management.io/v1alpha1"
    assert obj["kind"] == "AddOnPlacementScore" and obj["metadata"]["namespace"] == "busy"
    assert obj["status"]["validUntil"] == "2026-11-24T12:15:00Z"


@given(st.floats(0, 1000), st.floats(1, 512))
def test_scale_is_monotone_and_bounded(value, full):
    got = scale(value, full)
    assert -100 <= got <= 100 and scale(value + 1, full) >= got
    assert scale(0, full) == -100 and scale(full, full) == 100


@pytest.mark.parametrize(("model", "fam"), [
    (H100, "h100"), (A100, "a100"), ("AMD Instinct MI300X", "mi300x"), ("Tesla T4", "t4"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA GH200 480GB", "gh200"), (None, "unknown")])
def test_family(model, fam):
    assert family(model) == fam


def test_model_matches_between_word_boundaries():
    assert model_matches("H100", H100) and model_matches("h100", H100)
    assert not model_matches("A100", "NVIDIA RTX A1000") and not model_matches("H100", None)


@pytest.mark.parametrize("args", [
    ["capacity", "--fits", "0"], ["capacity", "--fits", "1001"],
    ["capacity", "--fits", "2", "--mig", "7x.big"], ["capacity", "--mig", "3g.40gb"],
    ["placement", "scores", "--full-at", "0"]])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args):
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    engine = inv.make_engine(db, create=True)
    inv.ensure_schema(engine)
    engine.dispose()
    result = gpufleet(*args, "--db", db)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_the_cordon_is_read_from_both_kubernetes_sources():
    from hub.validate import _reconcile as rc

    node = {"metadata": {"name": "n1"}, "spec": {"unschedulable": True},
            "status": {"capacity": {"nvidia.com/gpu": "8"}}}
    assert rc.node_from_object("east", node).unschedulable is True
    assert rc.node_from_object("east", {**node, "spec": {}}).unschedulable is False

    def row(kind: str, node: str, value: str, resource: str = "") -> dict:
        return {"metric": {"cluster": "east", "node": node, "kind": kind,
                           **({"resource": resource} if resource else {})},
                "value": [0, value]}

    views, covered = rc.nodes_from_ksm(
        [row("capacity", "n1", "8", "nvidia_com_gpu"), row("capacity", "n2", "8",
                                                           "nvidia_com_gpu"),
         row("unschedulable", "n1", "1"), row("unschedulable", "n2", "0")], [], "cluster")
    assert {v.node: v.unschedulable for v in views} == {"n1": True, "n2": False}
    assert covered == {"east"}
