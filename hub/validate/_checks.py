"""Validation rules: plain facts in, findings out (pure; no database, no network).

``gpufleet report`` gathers the facts (the inventory, the latest reconcile run, and a few
fixed PromQL answers from the hub, see :mod:`hub.validate._alerts`) and runs every check
here; the same failure modes are rendered as Prometheus alerting rules by
``gpufleet alerts render``.

Freshness is the age of the newest sample, never the presence of a series: ACM pushes every
300 s by default, so one missed push (twice the interval) is a warning, and the adoption
contract's freshness guarantee (``--max-age``, 1 h) is the error line.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from hub.common import CHECKS, LEDGER, REPORT
from hub.common import human_duration as human
from hub.inventory import NO_GPU_SERIES, UNLABELLED_SERIES

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)
_RANK = {s: i for i, s in enumerate(SEVERITIES)}


@dataclass(frozen=True)
class Finding:
    severity: str
    check: str
    message: str
    cluster: str | None = None
    node: str | None = None
    gpu: str | None = None
    #: the namespace of the pod the message names, if it names one: the service shows such a
    #: finding only to callers who may see that namespace (not part of the report's columns)
    namespace: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        return {k: out[k] for k in ("severity", "check", "cluster", "node", "gpu", "message")}

    def sort_key(self) -> tuple[Any, ...]:
        return (_RANK[self.severity], self.check, self.cluster or "", self.node or "",
                self.gpu or "", self.message)


# -- facts ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterFacts:
    cluster: str
    state: str | None  # None: a dark cluster, cards known and no exporter series ever
    last_sample_at: dt.datetime | None
    nodes_active: int = 0
    nodes_known: int = 0
    gpus_active: int = 0
    gpus_stale: int = 0
    #: which dcgm naming its NVIDIA GPUs send (legacy | dcgm-4.7 | both), since when
    naming: str | None = None
    naming_since: dt.datetime | None = None
    #: what its GPUs are seen through (store.seen_through) and the cards node-exporter counts
    seen_through: str | None = None
    cards: int | None = None
    #: ACM's own view (acm_managed_cluster_labels): "managed", "maintenance" or None
    acm: str | None = None


@dataclass(frozen=True)
class DriverVanished:
    """GPUs of a cluster that stopped reporting soon after their driver changed."""

    cluster: str
    gpus: int
    old: str
    new: str
    changed_at: dt.datetime


@dataclass(frozen=True)
class NodeFacts:
    cluster: str
    node: str
    state: str
    last_sample_at: dt.datetime | None
    gpus_active: int = 0
    gpus_stale: int = 0


@dataclass(frozen=True)
class GpuFacts:
    """A physical GPU of the inventory."""

    cluster: str
    node: str
    uuid: str
    state: str
    last_sample_at: dt.datetime | None = None
    index: int | None = None
    health: str | None = None  # ok | degraded | failed (hub.inventory._health)
    health_reasons: str | None = None


@dataclass(frozen=True)
class SyncFacts:
    started_at: dt.datetime
    status: str  # ok | failed
    error: str | None = None


@dataclass(frozen=True)
class ReconcileFacts:
    """The latest reconcile run: its non-matching nodes and its cluster rows."""

    finished_at: dt.datetime
    source: str
    nodes: Sequence[Mapping[str, Any]]
    clusters: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class ExpectedFacts:
    """The ACM ManagedCluster set of the latest reconcile that read it."""

    listed_at: dt.datetime
    available: Mapping[str, str | None]  # cluster -> ManagedClusterConditionAvailable


@dataclass(frozen=True)
class RefusedFacts:
    """What a cluster sent out of shape and the hub left out (inventory.refused_inputs):
    ``source`` sync (the latest sync) or usage (one ledger bucket, ``at`` its start);
    ``kind`` "label" (series turned away at the store's door) or the field of a reading out
    of its physical range."""

    source: str
    at: dt.datetime
    cluster: str
    kind: str
    count: int
    example: str


@dataclass(frozen=True)
class GpuRef:
    cluster: str
    node: str
    gpu: str
    pod: str | None = None
    #: seconds of the window the hub had samples for (None: the whole window)
    seen: float | None = None


@dataclass(frozen=True)
class NodeRef:
    cluster: str
    node: str


@dataclass
class HubHistory:
    """What the hub's fixed history queries returned (see hub.validate._alerts.read_history)."""

    window: float
    zero_usage: list[GpuRef] = field(default_factory=list)
    stuck: list[NodeRef] = field(default_factory=list)
    exporter_down: list[NodeRef] = field(default_factory=list)
    collect_errors: list[tuple[NodeRef, float]] = field(default_factory=list)
    visible: dict[str, int] = field(default_factory=dict)  # cluster -> GPUs visible


# -- helpers -------------------------------------------------------------------------------------
def age_seconds(ts: dt.datetime | None, now: dt.datetime) -> float | None:
    if ts is None:
        return None
    if ts.tzinfo is not None:
        ts = ts.astimezone(dt.UTC).replace(tzinfo=None)
    return max(0.0, (now - ts).total_seconds())


def _iso(ts: dt.datetime | None) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%SZ") if ts else "never"


def worst(findings: Iterable[Finding]) -> str | None:
    ranks = [_RANK[f.severity] for f in findings]
    return SEVERITIES[min(ranks)] if ranks else None


# -- inventory checks ------------------------------------------------------------------------------
def check_inventory(clusters: Sequence[ClusterFacts],
                    last_sync: SyncFacts | None, last_ok: SyncFacts | None,
                    now: dt.datetime, max_age: float) -> list[Finding]:
    """The inventory itself: empty, never synced, last sync failed or too old."""
    out: list[Finding] = []
    if not clusters:
        out.append(Finding(ERROR, "inventory", "the inventory holds no clusters: run "
                                               "`gpufleet sync` against the hub"))
    if any(c.cluster == "" for c in clusters):
        out.append(Finding(WARNING, "inventory", "the inventory holds GPUs under a cluster with "
                                                 "an empty name (filed without the cluster "
                                                 "label by an earlier release); left alone, "
                                                 "prune them when stale", ""))
    if (last_sync is not None and last_sync.status == "ok" and last_sync.error == NO_GPU_SERIES
            and clusters):
        out.append(Finding(ERROR, "sync", f"the latest sync ({_iso(last_sync.started_at)}) saw "
                                          f"no GPU series at all, yet the inventory knows "
                                          f"{len(clusters)} cluster(s): the hub lost the GPU "
                                          "metrics (allowlist, exporters, --hub-url?)"))
    if (last_sync is not None and last_sync.status == "ok"
            and last_sync.error is not None
            and last_sync.error.startswith(UNLABELLED_SERIES + ": ")):
        # one spoke pushing without the cluster label: the others were synced, its GPUs not
        out.append(Finding(ERROR, UNLABELLED_SERIES, f"the latest sync "
                                                     f"({_iso(last_sync.started_at)}): "
                           + last_sync.error[len(UNLABELLED_SERIES) + 2:]))
    if last_sync is not None and last_sync.status != "ok":
        out.append(Finding(WARNING, "sync", f"the latest sync ({_iso(last_sync.started_at)}) "
                                            f"failed: {last_sync.error or 'no detail'}"))
    if last_ok is not None:
        age = age_seconds(last_ok.started_at, now) or 0.0
        if age > max_age:
            out.append(Finding(ERROR, "sync", f"the latest successful sync was {human(age)} ago "
                                              f"(> max age {human(max_age)}): the inventory "
                                              "itself is out of date"))
    elif clusters:
        out.append(Finding(WARNING, "sync", "no successful sync recorded"))
    return out


#: ACM's own "cluster silent" alert, ManagedClusterMetricsMissing, fires after 15 minutes
#: without metrics from a managed cluster (FIELD_NOTES, fifth round): a cluster ACM lists is
#: called silent (an error) at the same age, so the two never disagree for long.
ACM_SILENT_AFTER: float = REPORT.acm_silent_after


def check_freshness(clusters: Sequence[ClusterFacts], now: dt.datetime, max_age: float,
                    push_interval: float, acm_silent_after: float = ACM_SILENT_AFTER,
                    ) -> list[Finding]:
    """Heartbeat per cluster: the age of its newest sample. A cluster ACM lists in
    maintenance_mode is expected to be silent (info); one ACM manages is silent at the age
    ACM's ManagedClusterMetricsMissing fires; a dark cluster (cards, no exporter series) is
    the exporter check's, not this one's."""
    out: list[Finding] = []
    for c in clusters:
        if c.state is None:
            continue  # no exporter series ever: check_dark_clusters says what is missing
        age = age_seconds(c.last_sample_at, now)
        if c.acm == "maintenance" and (age is None or age > 2 * push_interval):
            out.append(Finding(INFO, "freshness",
                               f"newest GPU sample is {human(age)} old; ACM lists the cluster "
                               "in maintenance_mode, so its silence is expected", c.cluster))
            continue
        if age is None:
            out.append(Finding(ERROR, "freshness", "no sample with a timestamp ever seen",
                               c.cluster))
        elif age > max_age:
            out.append(Finding(ERROR, "freshness",
                               f"newest GPU sample is {human(age)} old (> max age "
                               f"{human(max_age)}; last {_iso(c.last_sample_at)})", c.cluster))
        elif c.acm == "managed" and age > acm_silent_after:
            out.append(Finding(ERROR, "freshness",
                               f"silent: newest GPU sample is {human(age)} old (> "
                               f"{human(acm_silent_after)}, when ACM's "
                               "ManagedClusterMetricsMissing fires for a managed cluster; "
                               f"last {_iso(c.last_sample_at)})", c.cluster))
        elif age > 2 * push_interval:
            out.append(Finding(WARNING, "freshness",
                               f"newest GPU sample is {human(age)} old (> 2 × push interval "
                               f"{human(push_interval)}: at least one push missed)", c.cluster))
    return out


def check_dark_clusters(clusters: Sequence[ClusterFacts]) -> list[Finding]:
    """A cluster whose GPU cards node-exporter (or OpenShift's accelerator series) sees but
    whose GPU exporter sends nothing to the hub: never a cluster of 0 GPUs. ACM's new
    collection path forwards node_accelerator_card_info by default and no exporter series."""
    return [Finding(ERROR, "exporter_missing",
                    f"{c.cards} GPU card(s) known from node_accelerator_card_info, but no GPU "
                    "exporter series reach the hub: is dcgm-exporter (or AMD's "
                    "device-metrics-exporter) running, and does the collection carry its "
                    "series? (ACM's multicluster-observability-addon: `gpufleet spoke render "
                    "--mode acm --acm-collection mcoa`)", c.cluster)
            for c in clusters if c.seen_through == "card info only" and c.gpus_active == 0]


def check_missing_clusters(clusters: Sequence[ClusterFacts],
                           expected: ExpectedFacts | None) -> list[Finding]:
    """ACM ManagedClusters that should report GPU metrics and never did."""
    if expected is None:
        return []
    known = {c.cluster for c in clusters}
    out = []
    for name in sorted(set(expected.available) - known):
        avail = expected.available[name]
        state = f", Available={avail}" if avail else ""
        out.append(Finding(ERROR, "missing_cluster",
                           f"ACM ManagedCluster{state} (listed {_iso(expected.listed_at)}) has "
                           "never sent GPU metrics to the hub", name))
    return out


def check_partial_data(nodes: Sequence[NodeFacts], gpus: Sequence[GpuFacts]) -> list[Finding]:
    """Some nodes of a cluster silent while others report; GPUs gone from reporting nodes."""
    out: list[Finding] = []
    by_cluster: dict[str, list[NodeFacts]] = {}
    for n in nodes:
        by_cluster.setdefault(n.cluster, []).append(n)
    for cluster, members in sorted(by_cluster.items()):
        reporting = [n for n in members if n.state == "active"]
        if not reporting:
            continue  # the whole cluster is silent: the freshness check says so once
        for n in members:
            if n.state != "active":
                out.append(Finding(
                    WARNING, "partial_data",
                    f"node stopped reporting (last sample {_iso(n.last_sample_at)}, "
                    f"{n.gpus_stale} GPUs) while {len(reporting)} of {len(members)} nodes of "
                    "the cluster report", cluster, n.node))
    active_nodes = {(n.cluster, n.node): n for n in nodes if n.state == "active"}
    for g in gpus:
        node = active_nodes.get((g.cluster, g.node))
        if g.state != "active" and node is not None:
            index = f" (index {g.index})" if g.index is not None else ""
            out.append(Finding(
                WARNING, "gpu_dropped",
                f"GPU{index} no longer reported since {_iso(g.last_sample_at)}; the node "
                f"reports {node.gpus_active} of {node.gpus_active + node.gpus_stale} GPUs",
                g.cluster, g.node, g.uuid))
    return out


def check_duplicate_uuids(gpus: Sequence[GpuFacts]) -> list[Finding]:
    """One physical GPU reported from two places: a mislabelled cluster or a cloned node."""
    places: dict[str, set[tuple[str, str]]] = {}
    for g in gpus:
        if g.state == "active":
            places.setdefault(g.uuid, set()).add((g.cluster, g.node))
    out = []
    for uuid, where in sorted(places.items()):
        if len(where) > 1:
            listed = ", ".join(f"{c}/{n}" for c, n in sorted(where))
            first = sorted(where)[0]
            out.append(Finding(ERROR, "duplicate_uuid",
                               f"the same GPU UUID is reported by {len(where)} nodes: {listed}",
                               first[0], first[1], uuid))
    return out


def check_gpu_health(gpus: Sequence[GpuFacts]) -> list[Finding]:
    """GPUs whose exporter reports faults: XID, double-bit ECC, row-remap failure, slowdown.

    Active GPUs only: a stale GPU's last health is history, and its silence is reported by
    the freshness and partial-data checks already.
    """
    out = []
    for g in gpus:
        if g.state != "active" or g.health not in ("failed", "degraded"):
            continue
        index = f"GPU {g.index}" if g.index is not None else "GPU"
        if g.health == "failed":
            message = (f"{index} failed ({g.health_reasons}): drain the node and reset or "
                       "replace the GPU")
        else:
            message = f"{index} degraded ({g.health_reasons}): check the node's kernel log"
        out.append(Finding(ERROR if g.health == "failed" else WARNING, "gpu_unhealthy",
                           message, g.cluster, g.node, g.uuid))
    return out


#: failures per GPU-month in service past which a GPU or slot is a lemon (`--lemon-threshold`)
LEMON_THRESHOLD: float = CHECKS.lemon_threshold


def check_lemons(by_gpu: Sequence[dict[str, Any]], by_slot: Sequence[dict[str, Any]],
                 threshold: float = LEMON_THRESHOLD) -> list[Finding]:
    """GPUs and slots that fail more often than ``threshold`` a GPU-month (the rows of
    hub.inventory.lemons): a part to RMA, or a slot (riser, cable, board) that kills parts."""
    out = []
    for row in by_gpu:
        if row["per_gpu_month"] > threshold:
            out.append(Finding(WARNING, "lemon_gpu", (
                f"{row['failures']} failure(s) ({row['health']} health, {row['replaced']} "
                f"replaced, {row['stale_allocated']} lost while allocated): "
                f"{row['per_gpu_month']:g} a GPU-month, over {threshold:g}"),
                row["cluster"], row["node"], row["uuid"]))
    for row in by_slot:
        if row["per_gpu_month"] > threshold and row["slot"] is not None:
            out.append(Finding(WARNING, "lemon_slot", (
                f"slot {row['slot']}: {row['failures']} failure(s) of {row['gpus']} GPU(s) "
                f"in it: {row['per_gpu_month']:g} a GPU-month, over {threshold:g}"),
                row["cluster"], row["node"]))
    return out


#: severity of each node status of a reconcile run
RECONCILE_SEVERITY = {
    "count_mismatch": ERROR,
    "missing_in_metrics": ERROR,
    "missing_in_kubernetes": WARNING,
    "node_not_reporting": WARNING,
    "device_plugin_and_dra": WARNING,
    # GPUs the node's instance type has that neither Kubernetes nor the exporter shows
    "gpus_missing_by_instance_type": ERROR,
    # more GPUs than the node's instance type has, or another model
    "instance_type_mismatch": ERROR,
    "unknown": INFO,
}


def check_reconcile(run: ReconcileFacts | None, now: dt.datetime,
                    max_age: float) -> list[Finding]:
    """GPU count mismatches of the latest reconcile run."""
    if run is None:
        return [Finding(INFO, "reconcile", "no reconcile run yet: GPU counts were not checked "
                                           "against Kubernetes (run `gpufleet reconcile`)")]
    out: list[Finding] = []
    age = age_seconds(run.finished_at, now) or 0.0
    if age > max_age:
        out.append(Finding(INFO, "reconcile", f"the latest reconcile ({run.source} source) is "
                                              f"{human(age)} old"))
    for row in run.nodes:
        severity = RECONCILE_SEVERITY.get(str(row.get("status")))
        if severity:
            out.append(Finding(severity, str(row["status"]), str(row.get("reason") or ""),
                               row.get("cluster"), row.get("node")))
    for row in run.clusters:
        if row.get("status") == "no_gpu_metrics":
            out.append(Finding(ERROR, "no_gpu_metrics", str(row.get("reason") or ""),
                               row.get("cluster")))
        elif row.get("status") == "no_kubernetes_data":
            out.append(Finding(WARNING, "no_kubernetes_data", str(row.get("reason") or ""),
                               row.get("cluster")))
    return out


# -- hub checks ------------------------------------------------------------------------------------
def hub_skipped(reason: str) -> list[Finding]:
    return [Finding(INFO, "hub_checks", f"{reason}: zero-usage, stuck-exporter, exporter-health "
                                        "and hub-visibility checks skipped")]


#: a GPU seen for this share of the window or more was seen "for the whole" window (the
#: span is measured at the hub's subquery resolution)
WHOLE_WINDOW = 0.95


def check_zero_usage(history: HubHistory) -> list[Finding]:
    """Names the span actually seen: a GPU that reported for 3 minutes of the hour was not
    idle for the whole hour."""
    window = human(history.window)

    def span(g: GpuRef) -> str:
        if g.seen is None or g.seen >= WHOLE_WINDOW * history.window:
            return f"for the whole {window}"
        return (f"in every sample of the {human(max(g.seen, 1.0))} it reported "
                f"(of the {window} window)")

    return [Finding(WARNING, "zero_usage",
                    f"utilisation exactly 0 {span(g)} while pod {g.pod} is allocated to it",
                    g.cluster, g.node, g.gpu, g.pod.partition("/")[0] if g.pod else None)
            for g in history.zero_usage]


def check_stuck_exporters(history: HubHistory) -> list[Finding]:
    window = human(history.window)
    return [Finding(WARNING, "stuck_exporter",
                    f"no value of any GPU on this node changed in {window} although samples "
                    "keep arriving: the collector is stuck", n.cluster, n.node)
            for n in history.stuck]


def check_exporter_health(history: HubHistory) -> list[Finding]:
    out = [Finding(ERROR, "exporter_down", "gpufleet exporter reports up=0: it cannot read "
                                           "its GPUs", n.cluster, n.node)
           for n in history.exporter_down]
    window = human(history.window)
    out += [Finding(WARNING, "collect_errors",
                    f"{value:g} collection errors in the last {window}", n.cluster, n.node)
            for n, value in history.collect_errors]
    return out


def check_visibility(history: HubHistory, expected: Iterable[str], basis: str) -> list[Finding]:
    """The ACM query proxy filters by the token's permissions without saying so: compare the
    clusters the hub returns GPU series for with those that should be there."""
    expected = set(expected)
    hidden = sorted(expected - set(history.visible))
    if not hidden:
        return []
    listed = ", ".join(hidden[:20]) + (f" and {len(hidden) - 20} more" if len(hidden) > 20
                                       else "")
    return [Finding(ERROR, "hub_visibility",
                    f"the hub returns GPU series for {len(expected) - len(hidden)} of "
                    f"{len(expected)} {basis} clusters; not visible: {listed} (a token that "
                    "may not see them, or they send nothing)")]


# -- all of them -----------------------------------------------------------------------------------
@dataclass
class Facts:
    """Everything the report checks, gathered by the report command."""

    now: dt.datetime
    clusters: list[ClusterFacts]
    nodes: list[NodeFacts]
    gpus: list[GpuFacts]
    last_sync: SyncFacts | None = None
    last_ok_sync: SyncFacts | None = None
    reconcile: ReconcileFacts | None = None
    expected: ExpectedFacts | None = None
    history: HubHistory | None = None
    hub_skipped: str | None = None  # why the hub checks did not run
    driver_vanished: list[DriverVanished] = field(default_factory=list)
    refused: list[RefusedFacts] = field(default_factory=list)


#: How long a cluster may send both dcgm namings (a rolling exporter upgrade) before the
#: report says so (`report --naming-mix-for`).
NAMING_MIX_FOR: float = REPORT.naming_mix_for


def check_naming(clusters: Sequence[ClusterFacts], now: dt.datetime,
                 mix_for: float = NAMING_MIX_FOR) -> list[Finding]:
    """A cluster whose GPUs send both dcgm namings for longer than an upgrade takes: two
    exporters, or nodes left behind. The hub counts each GPU once, but the spoke doubles
    its series and the operator's upgrade has stalled."""
    out = []
    for c in clusters:
        if c.naming != "both" or c.naming_since is None or c.state != "active":
            continue
        since = (now - c.naming_since).total_seconds()
        if since > mix_for:
            out.append(Finding(
                WARNING, "naming_mixed",
                f"GPUs of this cluster have sent both dcgm namings (legacy and dcgm-4.7) for "
                f"{human(since)} (more than {human(mix_for)}): an exporter upgrade stalled or "
                "two exporters run; pin one naming with `gpufleet spoke render --dcgm-names`",
                c.cluster))
    return out


def check_driver_vanished(rows: Sequence[DriverVanished]) -> list[Finding]:
    return [Finding(
        WARNING, "vanished_after_driver_change",
        f"{r.gpus} GPU(s) stopped reporting right after their driver changed from {r.old} to "
        f"{r.new}: a driver upgrade often brings a new dcgm-exporter (4.9 needs a DCGM 4.7 "
        "host engine and renames its fields); check the exporter pods, and pin the naming "
        "with `gpufleet spoke render --dcgm-names`", r.cluster) for r in rows]


#: how far back the report reads the usage ledger's refused inputs (its usage section's day)
REFUSED_LOOKBACK = 24 * 3600.0


def check_refused(rows: Sequence[RefusedFacts]) -> list[Finding]:
    """Per cluster and source: series turned away at the store's door (their GPUs missing
    from the inventory or the bill: an error) and readings dropped out of their physical
    range (those figures unknown: a warning). The spoke is named, the fleet went on."""
    groups: dict[tuple[str, str, bool], list[RefusedFacts]] = {}
    for r in rows:
        groups.setdefault((r.cluster, r.source, r.kind == "label"), []).append(r)
    out = []
    for (cluster, source, label), members in sorted(groups.items()):
        count = sum(r.count for r in members)
        kinds = sorted({r.kind for r in members})
        first = min(members, key=lambda r: (r.at, r.kind))
        if source == "sync":
            where = f"the latest sync ({_iso(first.at)})"
        else:
            starts = sorted({r.at for r in members})
            where = (f"the usage ledger ({len(starts)} bucket(s) from {_iso(starts[0])} to "
                     f"{_iso(starts[-1])})")
        if label:
            out.append(Finding(ERROR, "refused_series",
                               f"{where} turned away {count:,} series of this cluster whose "
                               f"labels cannot be stored (e.g. {first.example}): their GPUs "
                               "are left out; fix the spoke's exporter or agent", cluster))
        else:
            out.append(Finding(WARNING, "out_of_range",
                               f"{where} dropped {count:,} readings of this cluster outside "
                               f"their physical range as unknown ({', '.join(kinds)}; e.g. "
                               f"{first.example}): check the exporter's units", cluster))
    return out


def run_checks(facts: Facts, *, max_age: float = CHECKS.max_age,
               push_interval: float = LEDGER.push_interval,
               naming_mix_for: float = NAMING_MIX_FOR,
               acm_silent_after: float = ACM_SILENT_AFTER) -> list[Finding]:
    now = facts.now
    out = check_inventory(facts.clusters, facts.last_sync, facts.last_ok_sync, now, max_age)
    out += check_naming(facts.clusters, now, naming_mix_for)
    out += check_driver_vanished(facts.driver_vanished)
    out += check_refused(facts.refused)
    out += check_freshness(facts.clusters, now, max_age, push_interval, acm_silent_after)
    out += check_dark_clusters(facts.clusters)
    out += check_missing_clusters(facts.clusters, facts.expected)
    out += check_partial_data(facts.nodes, facts.gpus)
    out += check_duplicate_uuids(facts.gpus)
    out += check_gpu_health(facts.gpus)
    out += check_reconcile(facts.reconcile, now, max_age)
    if facts.history is not None:
        out += check_zero_usage(facts.history)
        out += check_stuck_exporters(facts.history)
        out += check_exporter_health(facts.history)
        if facts.expected is not None:
            out += check_visibility(facts.history, facts.expected.available, "expected (ACM)")
        else:
            active = [c.cluster for c in facts.clusters if c.state == "active"]
            out += check_visibility(facts.history, active, "active inventory")
    elif facts.hub_skipped:
        out += hub_skipped(facts.hub_skipped)
    return sorted(set(out), key=Finding.sort_key)


def summarize(facts: Facts, findings: Sequence[Finding]) -> list[dict[str, Any]]:
    """One row per cluster: newest sample and its age, nodes reporting of expected, GPUs."""
    expected_nodes: dict[str, int] = {}
    if facts.reconcile is not None:
        for row in facts.reconcile.clusters:
            if row.get("k8s_gpu_nodes") is not None:
                expected_nodes[str(row["cluster"])] = int(row["k8s_gpu_nodes"])
    by_cluster: dict[str, list[Finding]] = {}
    for f in findings:
        if f.cluster:
            by_cluster.setdefault(f.cluster, []).append(f)
    expected = facts.expected.available if facts.expected else {}
    known = {c.cluster: c for c in facts.clusters}
    rows = []
    for name in sorted(set(known) | set(expected)):
        c = known.get(name)
        age = age_seconds(c.last_sample_at, facts.now) if c else None
        mine = by_cluster.get(name, [])
        status = worst(f for f in mine if f.severity != INFO) or "ok"
        if c is not None and c.state != "active" and status == "ok":
            status = WARNING  # a cluster that stopped reporting is never "ok"
        active, stale = (c.gpus_active, c.gpus_stale) if c else (0, 0)
        rows.append({
            "cluster": name,
            "status": status,
            "state": (c.state or "no exporter series") if c else "absent",
            "last_sample_at": c.last_sample_at if c else None,
            "age_seconds": None if age is None else round(age, 1),
            "age": human(age),
            "nodes_reporting": c.nodes_active if c else 0,
            "nodes_expected": max(expected_nodes.get(name, 0), c.nodes_known if c else 0),
            "gpus": active,
            "stale_gpus": stale,
            # what was last known: "0 of 32 reporting" rather than a bare 0
            "gpus_reporting": f"{active} of {active + stale} reporting" if stale else
            str(active),
            "expected": (name in expected) if facts.expected else None,
            "naming": c.naming if c else None,
            "seen_through": c.seen_through if c else None,
            "cards": c.cards if c else None,
            "findings": len(mine),
        })
    return rows
