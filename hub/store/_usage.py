"""The usage ledger's PromQL: per-bucket aggregates of each neutral field per GPU, slice and
pod, with every spelling's unit converted in the query.
"""

from __future__ import annotations

from collections.abc import Container

from hub.store._fields import ENGINE_ACTIVE, MEMORY_USED, POWER, UTILISATION, Query
from hub.store._profiles import PROFILES, VendorProfile, _by, labelled_matcher, profile

# -- usage ledger queries (issue 12, 19) -----------------------------------------------------
#: Neutral profiling fields the ledger averages for efficiency (percent). SM activity falls
#: back to the graphics-engine activity where DCGM_FI_PROF_SM_ACTIVE is not exported.
SM_ACTIVE = "sm_active_pct"
TENSOR_ACTIVE = "tensor_active_pct"
DRAM_ACTIVE = "dram_active_pct"
#: Neutral fields of the usage ledger, and the aggregation each query applies over a bucket.
USAGE_FIELDS: tuple[tuple[str, str], ...] = (
    (UTILISATION, "avg"), (UTILISATION, "max"), (ENGINE_ACTIVE, "avg"), (ENGINE_ACTIVE, "max"),
    (MEMORY_USED, "avg"), (MEMORY_USED, "max"), (POWER, "avg"),
    (SM_ACTIVE, "avg"), (TENSOR_ACTIVE, "avg"), (DRAM_ACTIVE, "avg"),
)
#: Profiling metrics per vendor (not read by the sync). dcgm-exporter's are ratios 0-1;
#: device-metrics-exporter's GPU_PROF_SM_ACTIVE (VALUBusy) and GPU_PROF_TENSOR_ACTIVE_PERCENT
#: (MfmaUtil) are percent; it has no DRAM-active counter.
USAGE_PROFILING_FIELDS: dict[str, dict[str, list[str]]] = {
    "nvidia": {SM_ACTIVE: ["DCGM_FI_PROF_SM_ACTIVE"],
               TENSOR_ACTIVE: ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"],
               DRAM_ACTIVE: ["DCGM_FI_PROF_DRAM_ACTIVE"]},
    "amd": {SM_ACTIVE: ["gpu_prof_sm_active"],
            TENSOR_ACTIVE: ["gpu_prof_tensor_active_percent"]},
}
_RATIO_FIELDS = {"nvidia": {ENGINE_ACTIVE, SM_ACTIVE, TENSOR_ACTIVE, DRAM_ACTIVE}}
#: the model label(s) of each vendor, kept in usage queries (a MIG slice's share needs it)
MODEL_LABELS = {"nvidia": ["modelName"], "amd": ["card_series", "card_model"]}
USAGE_POD_LABELS = ["namespace", "pod", "exported_namespace", "exported_pod"]




def usage_group(p: VendorProfile, cluster_label: str) -> str:
    return _by([cluster_label, *p.id_labels, *MODEL_LABELS[p.vendor], *USAGE_POD_LABELS])



def _usage_fields(p: VendorProfile, fld: str) -> list[str]:
    return p.value_fields.get(fld) or USAGE_PROFILING_FIELDS.get(p.vendor, {}).get(fld, [])


def usage_convert(vendor: str, fld: str, value: float) -> float:
    """Into the ledger's units: percent for every activity field."""
    if fld in _RATIO_FIELDS.get(vendor, ()):
        return value * 100.0
    return profile(vendor).convert(fld, value)


def usage_queries(bucket: str, resolution: str, cluster_label: str,
                  shard: str = "", held: Container[str] | None = None) -> list[Query]:
    """The fixed request set of one usage bucket, whatever the fleet size.

    Per vendor and field: ``avg by (identity, allocation) (avg_over_time(name[bucket]))``
    (``max`` likewise) evaluated at the bucket's end, one term per exact name joined with
    ``or``: a GPU sending a field under two names (both AMD spellings) is read once, from
    the preferred name, where a ``__name__`` regex inside the range function would make
    Prometheus refuse the whole query ("vector cannot contain metrics with the same
    labelset").

    Coverage counts the push-interval-long slots (``resolution``) of the bucket that hold
    a sample: ``count_over_time((presence)[bucket:resolution])`` where presence is
    ``max by (...) (last_over_time(name[resolution] offset 1ms))`` over each clock name,
    evaluated one slot after the bucket's end so its points are the ends of the slots. The
    look-back is exactly one slot: the slots partition time, so a GPU whose pod or node
    changes mid-bucket never has one slot counted twice (a wider look-back would give the
    old series the new one's first slot). Prometheus stamps scrapes on their schedule, so a
    steady push stays in its slot. A Query's ``kind`` is ``usage:<agg>`` or ``coverage``.

    Series without the cluster label never reach the ledger (``{cluster}!=""``). ``shard``
    (a shard_matcher) is added to every selector: the set of one shard of clusters.
    ``held`` (the metric names the store holds, HubClient.metric_names; None: any) leaves
    out the arms of the others, and a query with none left.
    """
    out: list[Query] = []
    labelled = labelled_matcher(cluster_label)
    for p in PROFILES:
        group = usage_group(p, cluster_label)
        match = f"{p.matcher(shard)}, {labelled}"
        for fld, agg in USAGE_FIELDS:
            arms = [arm for m in _usage_fields(p, fld)
                     for arm in p.arms(m, f"{agg}_over_time({{}}{{{{{match}}}}}[{bucket}])",
                                       bucket, match, held)]
            if not arms:
                continue
            promql = " or ".join(f"{agg} by ({group}) ({arm})" for arm in arms)
            out.append(Query(p.vendor, f"usage:{agg}", promql, fld))
        presence = " or ".join(
            f"max by ({group}) (last_over_time({name}{{{match}}}[{resolution}] offset 1ms))"
            for m in p.timestamp_metrics for name in p.names(m, held))
        if presence:
            out.append(Query(p.vendor, "coverage",
                             f"count_over_time(({presence})[{bucket}:{resolution}])"))
    return out



def labelled_probe(window: str, cluster_label: str | None = None) -> str:
    """How many GPU series of any vendor the store holds in the window (only those carrying
    ``cluster_label`` when given): asked only when a bucket came back empty, to tell a typo'd
    --cluster-label (GPU series exist, none carries it) from a quiet fleet."""
    extra = f", {labelled_matcher(cluster_label)}" if cluster_label else ""
    return " or ".join(
        f"count(last_over_time({name}{{{p.device_matcher}{extra}}}[{window}]))"
        for p in PROFILES for m in p.timestamp_metrics for name in p.names(m))
