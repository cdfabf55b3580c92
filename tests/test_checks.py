"""Every validation rule with plain facts: no database, no hub."""

from __future__ import annotations

import datetime as dt

from hub.validate import _checks as checks
from hub.validate._checks import (
    ClusterFacts,
    ExpectedFacts,
    Facts,
    GpuFacts,
    GpuRef,
    HubHistory,
    NodeFacts,
    NodeRef,
    ReconcileFacts,
    SyncFacts,
)

NOW = dt.datetime(2026, 11, 28, 12, 0, 0)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


def keys(findings: list[checks.Finding]) -> list[tuple]:
    return [(f.severity, f.check, f.cluster, f.node, f.gpu) for f in findings]


def test_freshness_is_the_age_of_the_newest_sample():
    clusters = [ClusterFacts("fresh", "active", ago(100)),
                ClusterFacts("one-push-missed", "active", ago(700)),
                ClusterFacts("dead", "stale", ago(7300)),
                ClusterFacts("never", "active", None),
                ClusterFacts("tz-aware", "active", ago(30).replace(tzinfo=dt.UTC))]
    found = checks.check_freshness(clusters, NOW, max_age=3600, push_interval=300)
    assert keys(found) == [
        ("warning", "freshness", "one-push-missed", None, None),
        ("error", "freshness", "dead", None, None),
        ("error", "freshness", "never", None, None)]
    assert found[0].message == ("newest GPU sample is 11m40s old (> 2 × push interval 5m: at "
                                "least one push missed)")
    assert found[1].message == ("newest GPU sample is 2h1m40s old (> max age 1h; last "
                                "2026-11-28T09:58:20Z)")


def test_human_durations():
    assert [checks.human(s) for s in (None, 0, 59.6, 60, 3600, 3725, 90061)] == [
        "never", "0s", "1m", "1m", "1h", "1h2m5s", "1d1h1m"]


def test_missing_clusters_come_from_the_acm_list():
    clusters = [ClusterFacts("east", "active", ago(10))]
    expected = ExpectedFacts(ago(60), {"east": "True", "ghost": "False", "new": None})
    found = checks.check_missing_clusters(clusters, expected)
    assert keys(found) == [("error", "missing_cluster", "ghost", None, None),
                           ("error", "missing_cluster", "new", None, None)]
    assert found[0].message.startswith("ACM ManagedCluster, Available=False (listed ")
    assert checks.check_missing_clusters(clusters, None) == []


def test_partial_data_and_gpus_gone_from_reporting_nodes():
    nodes = [NodeFacts("east", "a", "active", ago(5), 7, 1),
             NodeFacts("east", "b", "stale", ago(900), 0, 8),
             NodeFacts("dead", "c", "stale", ago(900), 0, 4)]
    gpus = [GpuFacts("east", "a", f"GPU-{i}", "active", ago(5), i) for i in range(7)]
    gpus += [GpuFacts("east", "a", "GPU-7", "stale", ago(600), 7),
             GpuFacts("east", "b", "GPU-b0", "stale", ago(900), 0),
             GpuFacts("dead", "c", "GPU-c0", "stale", ago(900), 0)]
    found = checks.check_partial_data(nodes, gpus)
    assert keys(found) == [("warning", "partial_data", "east", "b", None),
                           ("warning", "gpu_dropped", "east", "a", "GPU-7")]
    assert "while 1 of 2 nodes of the cluster report" in found[0].message
    assert found[1].message == ("GPU (index 7) no longer reported since 2026-11-28T11:50:00Z; "
                                "the node reports 7 of 8 GPUs")


def test_duplicate_uuids_across_nodes_and_clusters():
    gpus = [GpuFacts("east", "a", "GPU-1", "active"), GpuFacts("west", "x", "GPU-1", "active"),
            GpuFacts("east", "a", "GPU-2", "active"), GpuFacts("east", "b", "GPU-2", "stale"),
            GpuFacts("east", "c", "GPU-3", "active"), GpuFacts("east", "d", "GPU-3", "active")]
    found = checks.check_duplicate_uuids(gpus)
    assert keys(found) == [("error", "duplicate_uuid", "east", "a", "GPU-1"),
                           ("error", "duplicate_uuid", "east", "c", "GPU-3")]
    assert found[0].message == "the same GPU UUID is reported by 2 nodes: east/a, west/x"


def test_reconcile_findings_and_their_absence():
    assert keys(checks.check_reconcile(None, NOW, 3600)) == [
        ("info", "reconcile", None, None, None)]
    run = ReconcileFacts(ago(7200), "kube", [
        {"cluster": "east", "node": "a", "status": "count_mismatch", "reason": "k8s 8 vs 7"},
        {"cluster": "east", "node": "b", "status": "missing_in_metrics", "reason": "r"},
        {"cluster": "east", "node": "c", "status": "missing_in_kubernetes", "reason": "r"},
        {"cluster": "east", "node": "d", "status": "node_not_reporting", "reason": "r"},
    ], [{"cluster": "quiet", "status": "no_gpu_metrics", "reason": "q"},
        {"cluster": "vks", "status": "no_kubernetes_data", "reason": "v"},
        {"cluster": "ghost", "status": "silent", "reason": "g"},
        {"cluster": "east", "status": "mismatch", "reason": "e"}])
    found = checks.check_reconcile(run, NOW, 3600)
    assert keys(found) == [
        ("info", "reconcile", None, None, None),
        ("error", "count_mismatch", "east", "a", None),
        ("error", "missing_in_metrics", "east", "b", None),
        ("warning", "missing_in_kubernetes", "east", "c", None),
        ("warning", "node_not_reporting", "east", "d", None),
        ("error", "no_gpu_metrics", "quiet", None, None),
        ("warning", "no_kubernetes_data", "vks", None, None)]
    assert found[0].message == "the latest reconcile (kube source) is 2h old"
    assert found[1].message == "k8s 8 vs 7"


def test_hub_history_findings():
    history = HubHistory(
        window=3600,
        zero_usage=[GpuRef("east", "a", "GPU-1", "ml/idle-0")],
        stuck=[NodeRef("west", "x")],
        exporter_down=[NodeRef("east", "b")],
        collect_errors=[(NodeRef("east", "b"), 12.0)],
        visible={"east": 16, "west": 1},
    )
    found = (checks.check_zero_usage(history) + checks.check_stuck_exporters(history)
             + checks.check_exporter_health(history))
    assert keys(found) == [("warning", "zero_usage", "east", "a", "GPU-1"),
                           ("warning", "stuck_exporter", "west", "x", None),
                           ("error", "exporter_down", "east", "b", None),
                           ("warning", "collect_errors", "east", "b", None)]
    assert found[0].message == ("utilisation exactly 0 for the whole 1h while pod ml/idle-0 is "
                                "allocated to it")
    assert found[3].message == "12 collection errors in the last 1h"
    # a GPU the hub had samples for during 3 minutes was not idle "for the whole 1h"
    short = HubHistory(window=3600, zero_usage=[
        GpuRef("east", "a", "GPU-2", "ml/new-0", seen=180.0),
        GpuRef("east", "a", "GPU-3", "ml/old-0", seen=3540.0)])
    assert [f.message for f in checks.check_zero_usage(short)] == [
        "utilisation exactly 0 in every sample of the 3m it reported (of the 1h window) while "
        "pod ml/new-0 is allocated to it",
        "utilisation exactly 0 for the whole 1h while pod ml/old-0 is allocated to it"]
    hidden = checks.check_visibility(history, ["east", "west", "amd", "lab"], "expected (ACM)")
    assert keys(hidden) == [("error", "hub_visibility", None, None, None)]
    assert hidden[0].message.startswith("the hub returns GPU series for 2 of 4 expected (ACM) "
                                        "clusters; not visible: amd, lab")
    assert checks.check_visibility(history, ["east"], "x") == []


def test_inventory_and_sync_state():
    assert keys(checks.check_inventory([], None, None, NOW, 3600)) == [
        ("error", "inventory", None, None, None)]
    clusters = [ClusterFacts("east", "active", ago(10))]
    failed = SyncFacts(ago(30), "failed", "hub unreachable")
    found = checks.check_inventory(clusters, failed, SyncFacts(ago(4000), "ok"), NOW, 3600)
    assert keys(found) == [("warning", "sync", None, None, None),
                           ("error", "sync", None, None, None)]
    assert found[0].message.endswith("failed: hub unreachable")
    assert "the latest successful sync was 1h6m40s ago" in found[1].message


def _facts(**kw) -> Facts:
    base = dict(
        now=NOW,
        clusters=[ClusterFacts("east", "active", ago(20), 2, 2, 15),
                  ClusterFacts("west", "stale", ago(5000), 0, 1, 0)],
        nodes=[NodeFacts("east", "a", "active", ago(20), 8, 0),
               NodeFacts("east", "b", "active", ago(20), 7, 1),
               NodeFacts("west", "x", "stale", ago(5000), 0, 1)],
        gpus=[GpuFacts("east", "b", "GPU-b7", "stale", ago(900), 7)],
        last_sync=SyncFacts(ago(25), "ok"), last_ok_sync=SyncFacts(ago(25), "ok"),
    )
    base.update(kw)
    return Facts(**base)


def test_all_checks_together_sorted_by_severity_and_the_summary():
    facts = _facts(
        reconcile=ReconcileFacts(ago(60), "hub", [], [
            {"cluster": "east", "status": "ok", "k8s_gpu_nodes": 3}]),
        expected=ExpectedFacts(ago(60), {"east": "True", "west": "True", "ghost": None}),
        hub_skipped="no hub URL configured")
    found = checks.run_checks(facts, max_age=3600, push_interval=300)
    assert keys(found) == [
        ("error", "freshness", "west", None, None),
        ("error", "missing_cluster", "ghost", None, None),
        ("warning", "gpu_dropped", "east", "b", "GPU-b7"),
        ("info", "hub_checks", None, None, None)]
    assert found[-1].message.startswith("no hub URL configured: zero-usage, stuck-exporter")
    rows = {r["cluster"]: r for r in checks.summarize(facts, found)}
    assert rows["east"] == {
        "cluster": "east", "status": "warning", "state": "active", "last_sample_at": ago(20),
        "age_seconds": 20.0, "age": "20s", "nodes_reporting": 2, "nodes_expected": 3,
        "gpus": 15, "stale_gpus": 0, "gpus_reporting": "15", "expected": True, "naming": None,
        "seen_through": None, "cards": None, "findings": 1}
    assert (rows["west"]["status"], rows["west"]["age"]) == ("error", "1h23m20s")
    assert rows["ghost"] == {
        "cluster": "ghost", "status": "error", "state": "absent", "last_sample_at": None,
        "age_seconds": None, "age": "never", "nodes_reporting": 0, "nodes_expected": 0,
        "gpus": 0, "stale_gpus": 0, "gpus_reporting": "0", "expected": True, "naming": None,
        "seen_through": None, "cards": None, "findings": 1}


def test_hub_history_replaces_the_skip_notice_and_checks_visibility():
    history = HubHistory(window=600, visible={"east": 15})
    found = checks.run_checks(_facts(history=history, hub_skipped=None))
    # without an ACM list, the inventory's active clusters are the expected set
    assert ("hub_visibility" not in {f.check for f in found}
            and "hub_checks" not in {f.check for f in found})
    found = checks.run_checks(_facts(history=HubHistory(window=600, visible={})))
    [vis] = [f for f in found if f.check == "hub_visibility"]
    assert "0 of 1 active inventory clusters; not visible: east" in vis.message


def test_acm_maintenance_is_expected_silence_and_a_managed_cluster_is_silent_when_acm_says_so():
    """ACM's view of its clusters (acm_managed_cluster_labels): a cluster in maintenance_mode
    may be silent (info); a managed cluster is silent, an error, at 15 minutes, when ACM's own
    ManagedClusterMetricsMissing fires, not at the report's one-hour max age."""
    clusters = [ClusterFacts("resting", "stale", ago(7300), acm="maintenance"),
                ClusterFacts("quiet-managed", "stale", ago(16 * 60), acm="managed"),
                ClusterFacts("late-managed", "active", ago(12 * 60), acm="managed"),
                ClusterFacts("quiet-unmanaged", "stale", ago(16 * 60))]
    found = checks.check_freshness(clusters, NOW, max_age=3600, push_interval=300)
    assert keys(found) == [
        ("info", "freshness", "resting", None, None),
        ("error", "freshness", "quiet-managed", None, None),
        ("warning", "freshness", "late-managed", None, None),
        ("warning", "freshness", "quiet-unmanaged", None, None)]
    assert "maintenance_mode" in found[0].message
    assert found[1].message.startswith("silent: newest GPU sample is 16m old (> 15m, when "
                                       "ACM's ManagedClusterMetricsMissing fires")
    tighter = checks.check_freshness(clusters[1:2], NOW, max_age=3600, push_interval=300,
                                     acm_silent_after=20 * 60)
    assert keys(tighter) == [("warning", "freshness", "quiet-managed", None, None)]


def test_a_dark_cluster_is_an_exporter_missing_error_never_zero_gpus():
    clusters = [ClusterFacts("dark", None, None, seen_through="card info only", cards=8),
                ClusterFacts("lit", "active", ago(10), gpus_active=8,
                             seen_through="dcgm legacy", cards=8)]
    facts = Facts(now=NOW, clusters=clusters, nodes=[], gpus=[])
    found = [f for f in checks.run_checks(facts) if f.cluster]
    assert keys(found) == [("error", "exporter_missing", "dark", None, None)]
    assert found[0].message.startswith("8 GPU card(s) known from node_accelerator_card_info, "
                                       "but no GPU exporter series reach the hub")
    [row] = [r for r in checks.summarize(facts, found) if r["cluster"] == "dark"]
    assert (row["status"], row["state"], row["seen_through"], row["cards"]) == (
        "error", "no exporter series", "card info only", 8)
