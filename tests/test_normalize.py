"""The vendor-neutral record, from plain PromQL rows (no network, no database)."""

from __future__ import annotations

from hub.inventory._normalize import FleetBuilder
from hub.store import _vendors as vendors

NV = vendors.profile("nvidia")
AMD = vendors.profile("amd")


def row(value: float, **labels: str) -> dict:
    return {"metric": labels, "value": [1_800_000_000.0, str(value)]}


def field_of(profile, name: str) -> str:
    """The neutral field a metric fills (what the sync's per-field query would return)."""
    bare = name.removeprefix("amd_")
    return next(f for f, names in profile.value_fields.items() if bare in names)


def build(nvidia: dict | None = None, amd: dict | None = None, label: str = "cluster"):
    b = FleetBuilder(label)
    for profile, parts in ((NV, nvidia or {}), (AMD, amd or {})):
        b.add_identity(profile, parts.get("identity", []))
        b.add_timestamps(profile, parts.get("timestamp", []))
        for r in parts.get("values", []):
            labels = dict(r["metric"])
            name = labels.pop("__name__")
            b.add_values(profile, field_of(profile, name), [{**r, "metric": labels}])
    return {(o.uuid, o.mig_profile, o.mig_instance): o for o in b.observations()}


def test_dcgm_gpu_with_both_hostname_spellings_and_memory_sum():
    ids = dict(cluster="c", UUID="GPU-1", gpu="3", modelName="NVIDIA H100 80GB HBM3")
    obs = build(nvidia={
        "identity": [row(1, Hostname="n1", **ids),
                     row(1, hostname="n2", **{**ids, "UUID": "GPU-2"})],
        "timestamp": [row(1_800_000_000.5, cluster="c", Hostname="n1", UUID="GPU-1")],
        "values": [
            row(40, cluster="c", Hostname="n1", UUID="GPU-1", __name__="DCGM_FI_DEV_FB_USED"),
            row(60, cluster="c", Hostname="n1", UUID="GPU-1", __name__="DCGM_FI_DEV_FB_FREE"),
            row(2, cluster="c", Hostname="n1", UUID="GPU-1", __name__="DCGM_FI_DEV_FB_RESERVED"),
            row(250.5, cluster="c", Hostname="n1", UUID="GPU-1",
                __name__="DCGM_FI_DEV_POWER_USAGE"),
        ],
    })
    gpu = obs[("GPU-1", None, None)]
    assert (gpu.cluster, gpu.node, gpu.vendor, gpu.index) == ("c", "n1", "nvidia", 3)
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.memory_total_mib == 102 and gpu.memory_used_mib == 40
    assert gpu.power_w == 250.5 and gpu.sample_at == 1_800_000_000.5
    # a GPU that reports nothing but its identity still exists, with null fields
    other = obs[("GPU-2", None, None)]
    assert other.node == "n2" and other.memory_total_mib is None and other.utilisation_pct is None


def test_mig_slices_keep_parent_uuid_and_parent_is_synthesised():
    base = dict(cluster="c", hostname="n", UUID="GPU-M")
    slices = [("3g.40gb", "1", 10000, 30000, 0.5), ("1g.10gb", "13", 0, 9728, 0.0)]
    obs = build(nvidia={
        "identity": [
            row(1, **base, GPU_I_PROFILE=p, GPU_I_ID=i, gpu="0", modelName="A100",
                exported_pod="trainer-0", exported_namespace="team-a", exported_container="torch")
            for p, i, *_ in slices
        ],
        "values": [
            r for p, i, used, free, active in slices for r in (
                row(used, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_FB_USED"),
                row(free, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_FB_FREE"),
                row(0, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_GPU_UTIL"),
                row(active, **base, GPU_I_PROFILE=p, GPU_I_ID=i,
                    __name__="DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                row(200, **base, GPU_I_PROFILE=p, GPU_I_ID=i, __name__="DCGM_FI_DEV_POWER_USAGE"),
            )
        ],
    })
    big = obs[("GPU-M", "3g.40gb", "1")]
    assert big.utilisation_pct == 50.0  # the profiling ratio, not GPU_UTIL's 0
    assert big.memory_total_mib == 40000
    assert big.allocations == {("team-a", "trainer-0", "torch")}
    parent = obs[("GPU-M", None, None)]
    assert parent.memory_total_mib == 40000 + 9728
    assert parent.power_w == 200 and parent.utilisation_pct is None
    assert parent.model == "A100" and parent.index == 0


def test_amd_uuid_fallbacks_prefix_and_units():
    common = dict(cluster="c", hostname="amd1")
    obs = build(amd={
        "identity": [
            row(1, **common, gpu_id="0", gpu_uuid="u-0", card_series="MI300X", card_model="x"),
            row(1, **common, gpu_id="1", serial_number="S1", card_model="0x74b5"),
            row(1, **common, gpu_id="2"),
        ],
        "values": [
            row(196592, **common, gpu_id="0", gpu_uuid="u-0", __name__="gpu_total_vram"),
            row(1000, **common, gpu_id="0", gpu_uuid="u-0", __name__="gpu_used_vram"),
            row(71, **common, gpu_id="0", gpu_uuid="u-0", __name__="gpu_gfx_activity"),
            row(90, **common, gpu_id="1", serial_number="S1", __name__="amd_gpu_package_power"),
            row(33, **common, gpu_id="2", __name__="amd_gpu_junction_temperature"),
        ],
    })
    mi300 = obs[("u-0", None, None)]
    assert (mi300.vendor, mi300.model, mi300.memory_total_mib, mi300.memory_used_mib) == (
        "amd", "MI300X", 196592, 1000)
    assert mi300.utilisation_pct == 71
    vf = obs[("serial:S1", None, None)]
    assert vf.model == "0x74b5" and vf.power_w == 90  # card_model when card_series is empty
    bare = obs[("amd1/2", None, None)]
    assert bare.temperature_c == 33 and bare.index == 2


def test_series_without_gpu_identity_are_ignored():
    obs = build(
        nvidia={"identity": [row(1, cluster="c", Hostname="n")]},  # e.g. a node-level series
        amd={"identity": [row(2, cluster="c", hostname="n")]},  # gpu_nodes_total
    )
    assert obs == {}


def test_cluster_label_is_configurable():
    obs = build(nvidia={"identity": [row(1, acm_cluster="prod-1", Hostname="n", UUID="G")]},
                label="acm_cluster")
    assert obs[("G", None, None)].cluster == "prod-1"


def test_request_set_is_fixed_and_names_every_vendor():
    queries = vendors.sync_queries("10m", "1m", "cluster")
    assert len(queries) == 23  # 2 + 7 values + 4 health for NVIDIA, 2 + 6 + 2 for AMD
    assert {(q.vendor, q.kind) for q in queries} == {
        (v, k) for v in ("nvidia", "amd") for k in ("identity", "timestamp", "values")}
    assert all("by (cluster," in q.promql for q in queries)
    power = next(q for q in queries if q.vendor == "amd" and q.field == "power_w")
    assert power.promql.index("gpu_power_usage") < power.promql.index("gpu_package_power")


def test_allowlist_covers_what_the_sync_reads():
    names = vendors.allowlist_metrics()
    for needed in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "gpu_gfx_activity",
                   "amd_gpu_used_vram", "gpufleet_exporter_up"):
        assert needed in names
    assert names == sorted(set(names))
