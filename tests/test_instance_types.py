"""Expected GPUs from a node's instance type: the shipped catalog, a user's file, and reconcile's
`gpus_missing_by_instance_type` from node objects (plain data, kubectl files, the fake
Kubernetes API through the official client, kube-state-metrics rows), stored on SQLite and
PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from hub.common import InputError
from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.kube import INSTANCE_TYPE_LABELS, load_catalog, parse_catalog, shipped_catalog
from hub.service import ServeSettings, service_jobs
from hub.store import HubClient
from hub.validate import _checks as checks
from hub.validate import _reconcile as rc
from hub.validate import _reconcile_store as store
from hub.validate._reconcile import NodeView, ObservedNode
from tests.support import dra
from tests.support.clirun import gpufleet
from tests.support.kubeapi import kube_api as kube_api
from tests.support.nodes import ksm_text, node_object, nvidia_labels
from tests.support.promql import wait_for

T0 = dt.datetime(2026, 11, 28, 12, 0, 0)
CATALOG = shipped_catalog()
LOST = rc.GPUS_MISSING_BY_INSTANCE_TYPE


# -- the shipped catalog -------------------------------------------------------------------------
@pytest.mark.parametrize("name, gpus, model", [
    ("p4d.24xlarge", 8, "A100"), ("p4de.24xlarge", 8, "A100"), ("p5.48xlarge", 8, "H100"),
    ("p5e.48xlarge", 8, "H200"), ("p5en.48xlarge", 8, "H200"), ("p6-b200.48xlarge", 8, "B200"),
    ("g4dn.xlarge", 1, "T4"), ("g4dn.12xlarge", 4, "T4"), ("g5.48xlarge", 8, "A10G"),
    ("g6.12xlarge", 4, "L4"), ("g6e.48xlarge", 8, "L40S"),
    ("a2-highgpu-8g", 8, "A100"), ("a2-megagpu-16g", 16, "A100"), ("a2-ultragpu-8g", 8, "80GB"),
    ("a3-highgpu-8g", 8, "H100"), ("a3-megagpu-8g", 8, "H100"), ("a3-edgegpu-8g", 8, "H100"),
    ("a3-ultragpu-8g", 8, "H200"), ("a4-highgpu-8g", 8, "B200"), ("g2-standard-96", 8, "L4"),
    ("Standard_NC4as_T4_v3", 1, "T4"), ("Standard_NC96ads_A100_v4", 4, "A100"),
    ("Standard_NC40ads_H100_v5", 1, "H100"), ("Standard_ND96amsr_A100_v4", 8, "A100"),
    ("Standard_ND96isr_H100_v5", 8, "H100"), ("Standard_ND96isr_H200_v5", 8, "H200"),
    ("Standard_ND96isr_MI300X_v5", 8, "MI300X"), ("Standard_NV36ads_A10_v5", 1, "A10"),
    ("BM.GPU.H100.8", 8, "H100"), ("BM.GPU.A100-v2.8", 8, "A100"), ("BM.GPU.MI300X.8", 8,
                                                                       "MI300X"),
])
def test_the_shipped_catalog_knows_each_cloud_gpu_family(name, gpus, model):
    entry = CATALOG.lookup(name)
    assert entry is not None and entry.gpus == gpus and model in (entry.model or "")
    assert entry.memory_gib and entry.url and entry.url.startswith("https://")
    assert entry.source and entry.date


def test_every_shipped_entry_names_its_source_and_date():
    assert len(CATALOG.types) >= 90
    for entry in CATALOG.types.values():
        assert entry.gpus > 0 and entry.source and entry.url and entry.date, entry
    hosts = {s["url"].split("/")[2] for s in CATALOG.sources()}  # type: ignore[union-attr]
    assert hosts == {"docs.aws.amazon.com", "aws.amazon.com", "cloud.google.com",
                     "learn.microsoft.com", "docs.oracle.com"}


def test_instance_types_are_matched_case_insensitively():
    assert CATALOG.lookup("standard_nd96isr_h100_v5") == CATALOG.lookup("Standard_ND96isr_H100_v5")
    assert CATALOG.lookup("m7i.48xlarge") is None and CATALOG.lookup(None) is None


def test_a_user_file_adds_overrides_and_selects_by_label(tmp_path):
    path = tmp_path / "types.yaml"
    path.write_text("""
instance_types:
  p5.48xlarge: {gpus: 4, model: NVIDIA H100 80GB HBM3, source: our contract, date: 2026-11-01}
  cpu.big: {gpus: 0}
selectors:
  "example.com/server-model=dgx-h100": {gpus: 8, model: NVIDIA H100 80GB HBM3, name: DGX H100}
""")
    catalog = load_catalog(path)
    assert catalog.lookup("p5.48xlarge").gpus == 4  # type: ignore[union-attr]
    assert catalog.lookup("p5.48xlarge").source == "our contract"  # type: ignore[union-attr]
    assert catalog.lookup("a3-highgpu-8g").gpus == 8  # type: ignore[union-attr]  # shipped
    assert catalog.label_keys == ("example.com/server-model",)
    dgx = catalog.lookup(None, {"example.com/server-model": "dgx-h100"})
    assert dgx is not None and (dgx.name, dgx.gpus) == ("DGX H100", 8)


@pytest.mark.parametrize("text, message", [
    ("instance_types: {x1: {model: A100}}", "instance type x1: no 'gpus' count"),
    ("instance_types: {x1: {gpus: -2}}", "instance type x1: gpus -2 is negative"),
    ("instance_types: {x1: {gpus: eight}}", "gpus 'eight' is not a whole number"),
    ("instance_types: {x1: {gpus: 1.5}}", "gpus 1.5 is not a whole number"),
    # past 2^63 the database's integer failed with an OverflowError traceback
    ("instance_types: {x1: {gpus: 9223372036854775808}}",
     "gpus 9223372036854775808 is more than the 4,096 GPUs a node may have"),
    ("instance_types: {x1: {gpus: 4097}}", "is more than the 4,096 GPUs"),
    ("instance_types: {x1: {gpus: 1.0e+19}}", "is more than the 4,096 GPUs"),
    ("instance_types: {x1: {gpus: 1, colour: red}}", "unknown key 'colour'"),
    ("instance_types: {x1: 8}", "expected a mapping with gpus"),
    ("selectors: {dgx: {gpus: 8}}", "selector 'dgx' is not key=value"),
    ("machines: {}", "unknown key 'machines'"),
    ("[1, 2]", "expected a mapping"),
])
def test_bad_catalog_input_is_one_line(text, message):
    with pytest.raises(InputError, match=message) as err:
        parse_catalog(__import__("yaml").safe_load(text), "f")
    assert "\n" not in err.value.format_message()


# -- the compare ---------------------------------------------------------------------------------
def view(name: str, instance: str, gpus: str | None = None, labels: dict | None = None,
         cluster: str = "c1") -> NodeView:
    return rc.node_from_object(cluster, node_object(name, {"nvidia.com/gpu": gpus} if gpus
                                                    else None, labels, instance=instance))


def seen(node: str, gpus: int, state: str = "active") -> ObservedNode:
    return ObservedNode("c1", node, state, gpus, 0, 0, "nvidia", T0)


def results(views: list[NodeView], observed: list[ObservedNode], catalog=CATALOG,
            **kw: Any) -> dict[str, rc.NodeResult]:
    rec = rc.compare(views, observed, covered={"c1"}, catalog=catalog, **kw)
    return {r.node: r for r in rec.nodes}


def test_a_gpu_instance_advertising_nothing_and_unseen_gets_its_own_row():
    out = results([view("p5-dead", "p5.48xlarge"), view("cpu", "m7i.48xlarge")], [])
    assert set(out) == {"p5-dead"}  # the CPU node of an unknown type stays quiet
    r = out["p5-dead"]
    assert (r.status, r.instance_type, r.expected_gpus, r.k8s_gpus, r.observed_gpus) == \
        (LOST, "p5.48xlarge", 8, 0, None)
    assert "8 GPUs lost" in r.reason and "NVIDIA H100 80GB HBM3" in r.reason
    assert r.provider_id and r.provider_id.startswith("aws:///us-east-1a/i-")
    # without a catalog the node is as quiet as before
    assert rc.compare([view("p5-dead", "p5.48xlarge")], [], covered={"c1"}).nodes == []


def test_half_of_an_a3_advertised_and_unseen_is_four_gpus_lost_not_only_missing_in_metrics():
    r = results([view("a3", "a3-highgpu-8g", "4")], [])["a3"]
    assert (r.status, r.expected_gpus, r.k8s_gpus) == (LOST, 8, 4)
    assert "Kubernetes shows 4, the exporter none: 4 GPUs lost" in r.reason
    assert "the hub has never seen the node" in r.reason  # what was found besides


def test_gpus_the_exporter_shows_are_not_lost():
    out = results([view("a3", "a3-highgpu-8g", "4"), view("p5", "p5.48xlarge", "8"),
                   view("half", "p5.48xlarge", "4")],
                  [seen("a3", 8), seen("p5", 8), seen("half", 6)])
    assert out["a3"].status == "count_mismatch"  # Kubernetes lacks 4 the exporter sees
    assert (out["p5"].status, out["p5"].expected_gpus) == ("match", 8)
    assert out["half"].status == LOST and "2 GPUs lost" in out["half"].reason


def test_stale_metrics_do_not_hide_gpus_kubernetes_shows():
    r = results([view("p5", "p5.48xlarge", "8")], [seen("p5", 0, state="stale")])["p5"]
    assert r.status == "node_not_reporting" and r.expected_gpus == 8


def test_time_sliced_and_mig_single_nodes_count_physical_gpus():
    sliced = nvidia_labels("NVIDIA-H100-80GB-HBM3", 8, **{"nvidia.com/gpu.replicas": "10",
                                                          "nvidia.com/gpu.sharing-strategy":
                                                          "time-slicing"})
    mig = nvidia_labels("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", 8)
    out = results([view("ts", "p5.48xlarge", "80", sliced), view("ts4", "p5.48xlarge", "40",
                                                                   sliced),
                   view("mig", "p5.48xlarge", "56", mig)], [])
    assert out["ts"].status == "missing_in_metrics"  # 80 = 8 × 10: all 8 advertised
    assert out["ts4"].status == LOST and "4 GPUs lost" in out["ts4"].reason  # 40 = 4 × 10
    assert out["mig"].status == "missing_in_metrics"  # MIG devices: physical unknown, quiet


def test_a_dra_node_publishing_six_of_a_p5s_eight_gpus_loses_two():
    node = "dra-p5"
    slices = [dra.resource_slice(f"{name}-gpu", "gpu.nvidia.com", name,
                                 [dra.nvidia_gpu(name, i) for i in range(count)])
              for name, count in ((node, 6), ("dra-ok", 8))]
    views = rc.with_dra([view(node, "p5.48xlarge"), view("dra-ok", "p5.48xlarge")], "c1",
                        slices)
    obs = ObservedNode("c1", node, "active", 6, uuids=frozenset(
        dra.gpu_uuid(node, i) for i in range(6)))
    ok = ObservedNode("c1", "dra-ok", "active", 8, uuids=frozenset(
        dra.gpu_uuid("dra-ok", i) for i in range(8)))
    out = results(views, [obs, ok])
    assert (out[node].status, out[node].mode, out[node].expected_gpus) == (LOST, "dra", 8)
    assert "Kubernetes shows 6, the exporter 6: 2 GPUs lost" in out[node].reason
    assert out["dra-ok"].status == "match"


MISMATCH = rc.INSTANCE_TYPE_MISMATCH
H100, L40S = "NVIDIA H100 80GB HBM3", "NVIDIA L40S"


def seen_as(node: str, gpus: int, *models: str) -> ObservedNode:
    return ObservedNode("c1", node, "active", gpus, 0, 0, "nvidia", T0,
                        models=frozenset(models))


def test_more_gpus_or_another_model_than_the_instance_type_has_is_a_finding():
    h100 = nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)
    out = results([view("g6e", "g6e.12xlarge", "8", h100), view("p5-a100", "p5.48xlarge", "8"),
                   view("p5", "p5.48xlarge", "8"), view("g6-l40s", "g6.12xlarge", "4")],
                  [seen_as("g6e", 8, H100), seen_as("p5-a100", 8, "NVIDIA A100-SXM4-80GB"),
                   seen_as("p5", 8, H100), seen_as("g6-l40s", 4, L40S)])
    # a g6e.12xlarge is 4 × L40S: 8 × H100 is not what its label says, though both sides agree
    g6e = out["g6e"]
    assert (g6e.status, g6e.instance_type, g6e.expected_gpus) == (MISMATCH, "g6e.12xlarge", 4)
    assert "instance type g6e.12xlarge has 4 GPUs (NVIDIA L40S, 48 GiB)" in g6e.reason
    assert "the exporter reports 8; Kubernetes advertises 8" in g6e.reason
    assert f"its GPUs report {H100}" in g6e.reason
    # the right count of the wrong model; the catalog's L4 is not an L40S
    assert out["p5-a100"].status == MISMATCH
    assert "its GPUs report NVIDIA A100-SXM4-80GB" in out["p5-a100"].reason
    assert out["g6-l40s"].status == MISMATCH and "NVIDIA L4," in out["g6-l40s"].reason
    assert (out["p5"].status, out["p5"].expected_gpus) == ("match", 8)


def test_model_families_compare_across_spellings():
    assert rc.model_family("NVIDIA H100 80GB HBM3") == rc.model_family("NVIDIA H100 NVL")
    assert rc.model_family("AMD Instinct MI300X") == rc.model_family("AMD Instinct MI300X OAM")
    assert rc.model_family("Tesla T4") == "t4"
    assert rc.model_family("NVIDIA L4") != rc.model_family("NVIDIA L40S")
    assert rc.model_family("NVIDIA A10") != rc.model_family("NVIDIA A10G")
    assert rc.model_family(None) is None


def test_more_gpus_than_the_type_fails_the_run_as_an_error_finding():
    rec = rc.compare([view("g6e", "g6e.12xlarge", "8")], [seen_as("g6e", 8, H100)],
                     covered={"c1"}, catalog=CATALOG)
    assert rec.failed
    finding = checks.check_reconcile(checks.ReconcileFacts(T0, "kube", [
        r.as_dict() for r in rec.nodes], []), T0, 3600)
    assert [(f.severity, f.check) for f in finding] == [("error", MISMATCH)]


def test_reconcile_table_shows_instance_type_and_expected_gpus(tmp_path):
    h100 = nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "List", "items": [
        node_object("g6e-1", {"nvidia.com/gpu": "8"}, h100, instance="g6e.12xlarge"),
        node_object("p5-ok", {"nvidia.com/gpu": "8"}, h100, instance="p5.48xlarge")]}))
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    t = T0.replace(tzinfo=dt.UTC).timestamp()
    engine = inventory.make_engine(db, create=True)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("east", node, f"GPU-{node}-{i}", "nvidia", index=i, model=H100,
                        sample_at=t) for node in ("g6e-1", "p5-ok") for i in range(8)], T0)
    with engine.connect() as conn:
        models = {o.node: o.models for o in store.observed_nodes(conn)}
    engine.dispose()
    assert models == {"g6e-1": frozenset({H100}), "p5-ok": frozenset({H100})}
    table = gpufleet("reconcile", "--nodes-json", f"east={nodes}", "--db", db,
                     env={"COLUMNS": "400"})  # one line per row, not a record per row
    assert table.exit_code == 1, table.output
    header, *lines = [line.split() for line in table.stdout.splitlines() if line.strip()]
    assert header[:8] == ["CLUSTER", "NODE", "STATUS", "MODE", "INSTANCE_TYPE",
                          "EXPECTED_GPUS", "K8S_GPUS", "OBSERVED_GPUS"]
    rows = {line[1]: line[2:6] for line in lines if len(line) > 5}
    assert rows["g6e-1"] == [MISMATCH, "whole", "g6e.12xlarge", "4"]
    assert rows["p5-ok"] == ["match", "whole", "p5.48xlarge", "8"]


def test_the_beta_label_and_types_without_gpus():
    obj = node_object("old", instance="x")
    del obj["metadata"]["labels"]["node.kubernetes.io/instance-type"]
    obj["metadata"]["labels"]["beta.kubernetes.io/instance-type"] = "g5.12xlarge"
    beta = rc.node_from_object("c1", obj)
    assert beta.instance_type == "g5.12xlarge"
    assert results([beta], [])["old"].expected_gpus == 4
    zero = parse_catalog({"instance_types": {"cpu.big": {"gpus": 0}}})
    assert results([view("c", "cpu.big")], [], catalog=CATALOG.merged(zero)) == {}


def test_an_on_premises_server_is_matched_by_its_label():
    catalog = CATALOG.merged(parse_catalog(
        {"selectors": {"example.com/server-model=dgx-h100": {"gpus": 8, "name": "DGX H100"}}}))
    obj = node_object("dgx-01", None, {"example.com/server-model": "dgx-h100"}, instance="x")
    del obj["metadata"]["labels"]["node.kubernetes.io/instance-type"]
    plain = rc.node_from_object("c1", obj)
    assert "example.com/server-model" not in plain.labels  # only kept when asked
    node = rc.node_from_object("c1", obj, catalog.label_keys)
    r = results([node], [seen("dgx-01", 7)], catalog=catalog)["dgx-01"]
    assert (r.status, r.instance_type, r.expected_gpus) == (LOST, "DGX H100", 8)
    assert r.reason.startswith("server model (label selector) DGX H100 has 8 GPUs")
    typed = rc.node_from_object("c1", node_object("dgx-02", None, {
        "example.com/server-model": "dgx-h100"}, instance="p4d.24xlarge"), catalog.label_keys)
    r = results([typed], [], catalog=catalog)["dgx-02"]  # the selector wins over the type
    assert (r.instance_type, r.reason.split(" has")[0]) == (
        "DGX H100", "server model (label selector) DGX H100")


def test_the_cluster_and_the_run_fail_on_lost_gpus():
    rec = rc.compare([view("p5-dead", "p5.48xlarge")], [], covered={"c1"}, catalog=CATALOG)
    assert rec.failed
    [cluster] = rec.clusters
    assert cluster.status == "mismatch" and cluster.reason == "1 of 1 GPU node differ"
    finding = checks.check_reconcile(checks.ReconcileFacts(T0, "kube", [
        r.as_dict() for r in rec.nodes], []), T0, 3600)
    assert [(f.severity, f.check) for f in finding] == [("error", LOST)]


def test_kube_state_metrics_labels_carry_the_instance_type():
    resources = [{"metric": {"cluster": "c1", "node": n, "resource": "cpu", "kind": "capacity"},
                  "value": [1.0, "96"]} for n in ("p5-dead", "cpu")]
    labels = [{"metric": {"cluster": "c1", "node": "p5-dead",
                          rc.ksm_label(INSTANCE_TYPE_LABELS[0]): "p5.48xlarge"},
               "value": [1.0, "1"]}]
    assert "label_node_kubernetes_io_instance_type" in rc.ksm_queries("5m", "cluster")[1]
    views, _ = rc.nodes_from_ksm(resources, labels, "cluster")
    out = results(views, [], fleet_wide=True)
    assert set(out) == {"p5-dead"} and out["p5-dead"].status == LOST
    assert "kube-state-metrics cannot show GPUs published through DRA" in out["p5-dead"].reason


# -- the command, from a file and from the Kubernetes API ---------------------------------
def _seed(db: str, gpus: dict[str, int]) -> None:
    """An inventory whose exporter reports ``gpus`` per node of cluster east."""
    t = T0.replace(tzinfo=dt.UTC).timestamp()
    engine = inventory.make_engine(db, create=True)
    try:
        migrate.upgrade(engine)
        with engine.begin() as conn:
            apply_observations(conn, [
                Observation("east", node, f"GPU-{node}-{i}", "nvidia", index=i, sample_at=t)
                for node, n in gpus.items() for i in range(n)], T0)
    finally:
        engine.dispose()


def _fleet_nodes() -> list[dict[str, Any]]:
    h100 = nvidia_labels("NVIDIA-H100-80GB-HBM3", 8)
    return [node_object("p5-dead", instance="p5.48xlarge"),
            node_object("a3-half", {"nvidia.com/gpu": "4"}, h100, instance="a3-highgpu-8g"),
            node_object("p5-ok", {"nvidia.com/gpu": "8"}, h100, instance="p5.48xlarge"),
            node_object("cpu-1", instance="m7i.48xlarge")]


def test_reconcile_from_the_kubernetes_api_stores_instance_type_and_provider_id(
        kube_api, tmp_path, pg_url):
    for obj in _fleet_nodes():
        kube_api.put_object(obj)
    config = kube_api.kubeconfig_path("east")
    for db in (f"sqlite:///{tmp_path / 'inv.db'}", pg_url):
        _seed(db, {"a3-half": 4, "p5-ok": 8})
        result = gpufleet("reconcile", "--context", "east", "--kubeconfig", str(config),
                          "--db", db, "-o", "json")
        assert result.exit_code == 1, result.output
        rows = {r["node"]: r for r in json.loads(result.stdout) if r["scope"] == "node"}
        assert {n: (r["status"], r["instance_type"], r["expected_gpus"])
                for n, r in rows.items()} == {
            "p5-dead": (LOST, "p5.48xlarge", 8), "a3-half": (LOST, "a3-highgpu-8g", 8),
            "p5-ok": ("match", "p5.48xlarge", 8)}
        engine = inventory.make_engine(db)
        try:
            with engine.connect() as conn:
                stored = {r.node: (r.status, r.instance_type, r.provider_id, r.expected_gpus)
                          for r in conn.execute(sa.select(inventory.metadata.tables[
                              "reconcile_results"]))}
        finally:
            engine.dispose()
        assert stored["p5-dead"][:2] == (LOST, "p5.48xlarge")
        assert stored["p5-dead"][2] == _fleet_nodes()[0]["spec"]["providerID"]
        assert stored["a3-half"][3] == 8
        report = gpufleet("report", "--db", db, "-o", "json")
        findings = json.loads(report.stdout)["findings"]
        assert sum(1 for f in findings if f["check"] == LOST) == 2


def test_reconcile_from_a_file_with_a_user_catalog_and_bad_catalogs(tmp_path):
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "List", "items": _fleet_nodes()}))
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    _seed(db, {"a3-half": 4, "p5-ok": 8})
    types = tmp_path / "types.yaml"
    types.write_text("instance_types:\n  a3-highgpu-8g: {gpus: 4, source: we cut it}\n")
    result = gpufleet("reconcile", "--nodes-json", f"east={nodes}", "--instance-types",
                      str(types), "--db", db, "-o", "json")
    assert result.exit_code == 1, result.output
    rows = {r["node"]: r["status"] for r in json.loads(result.stdout) if r["scope"] == "node"}
    assert rows == {"p5-dead": LOST, "a3-half": "match", "p5-ok": "match"}
    for text, message in (("instance_types: {x: {model: A100}}", "no 'gpus' count"),
                          ("instance_types: {x: {gpus: -1}}", "is negative"),
                          ("instance_types: {a3-highgpu-8g: {gpus: 9223372036854775808}}",
                           "is more than the 4,096 GPUs a node may have"),
                          (": [", "not valid YAML")):
        types.write_text(text)
        bad = gpufleet("reconcile", "--nodes-json", f"east={nodes}", "--instance-types",
                       str(types), "--db", db)
        assert bad.exit_code == 2 and message in bad.output, bad.output
        assert len(bad.output.strip().splitlines()) == 1
    missing = gpufleet("reconcile", "--nodes-json", f"east={nodes}", "--instance-types",
                       str(Path(tmp_path / "none.yaml")), "--db", db)
    assert missing.exit_code == 2 and "cannot read instance-type file" in missing.output


def test_reconcile_through_the_hub_reads_instance_types_and_provider_ids(hub, fleet, tmp_path):
    """kube-state-metrics pushed by a real agent into a real Prometheus: the node labels'
    instance type and kube_node_info's provider id reach the rows (still two queries)."""
    aws = "aws:///us-east-1a/i-0a1b2c3d4e5f60001"
    fleet("east", [ksm_text(
        {"p5-dead": {}, "a3-half": {"nvidia_com_gpu": 4}, "cpu-1": {}},
        {"p5-dead": {"node.kubernetes.io/instance-type": "p5.48xlarge"},
         "a3-half": {"beta.kubernetes.io/instance-type": "a3-highgpu-8g"},
         "cpu-1": {"node.kubernetes.io/instance-type": "m7i.48xlarge"}},
        providers={"p5-dead": aws, "cpu-1": "aws:///us-east-1a/i-0cpu"})])
    wait_for(hub.url, "count(kube_node_info)", lambda r: bool(r) and r[0]["value"][1] == "2")
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}"}
    _seed(env["GPUFLEET_DB"], {})
    result = gpufleet("reconcile", "-o", "json", env=env)
    assert result.exit_code == 1, result.output
    rows = {r["node"]: r for r in json.loads(result.stdout) if r["scope"] == "node"}
    assert {n: (r["status"], r["instance_type"], r["provider_id"], r["expected_gpus"])
            for n, r in rows.items()} == {
        "p5-dead": (LOST, "p5.48xlarge", aws, 8),
        "a3-half": (LOST, "a3-highgpu-8g", None, 8)}
    assert "kube-state-metrics cannot show GPUs published through DRA" in \
        rows["p5-dead"]["reason"]
    # `serve --reconcile --instance-types FILE` runs the same reconcile with the user's entries
    types = tmp_path / "types.yaml"
    types.write_text("instance_types:\n  m7i.48xlarge: {gpus: 2, source: a test}\n")
    engine = inventory.make_engine(env["GPUFLEET_DB"])
    try:
        with HubClient(hub.url) as client:
            jobs = service_jobs(engine, client, ServeSettings(reconcile=True,
                                                              instance_types=str(types)))
            jobs.after_sync[0]()
        with engine.connect() as conn:
            stored = {r["node"]: r["status"] for r in store.latest_run(conn).nodes}
    finally:
        engine.dispose()
    assert stored == {"p5-dead": LOST, "a3-half": LOST, "cpu-1": LOST}
