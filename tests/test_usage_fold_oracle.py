"""The usage ledger against a brute-force oracle, through a real hub Prometheus.

hypothesis draws fleets of sample patterns: push intervals from 1 s to 300 s, gaps, pods that
change mid-bucket (plain and ``exported_*`` labels, the exporter's own pod = unallocated),
dcgm's ``Hostname`` renamed ``hostname`` mid-run, both AMD spellings (one, the other, or both
at once), both dcgm namings (legacy, dcgm-exporter 4.9's with its units, or both at once, and
a GPU switching between them mid-bucket), MIG slices (their share of the GPU), and a spoke
without the cluster label. The samples are written into a real Prometheus (promtool
backfill), two buckets are collected with the ledger's real queries, and every ledger row is
compared with what the oracle computes straight from the samples:

- coverage = the push-interval slots of the bucket holding a sample of that row's key / slots;
- gpu_hours = share x coverage x bucket hours; energy = avg power x the same;
- averages: per series (full label set), the mean of its samples under the preferred metric
  name present in the bucket, weighted by the series' slots.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub import usage
from hub.common import InputError
from hub.store import HubClient, HubSettings
from tests.support.backfill import backfilled_hub

H100 = "NVIDIA H100 80GB HBM3"
MI300 = "AMD Instinct MI300X OAM"
EXPORTER = 'namespace="gpu-operator",pod="nvidia-dcgm-exporter-7xk2p"'
PODS = {0: ("", ""), 1: ("ml", "train-1"), 2: ("research", "nb-2")}


@dataclass(frozen=True)
class Slot:
    pod: int  # PODS key
    util: int
    renamed: bool  # nvidia: hostname instead of Hostname; amd: see spelling
    #: amd: "plain" | "prefixed" (amd_) | "both"; nvidia: "plain" (legacy names) |
    #: "prefixed" (dcgm-4.7 names, ratios 0-1) | "both" (two exporters at once)
    spelling: str


@dataclass(frozen=True)
class Gpu:
    vendor: str
    index: int
    labelled: bool
    mig: str | None  # nvidia MIG profile of this slice, or None for a whole GPU
    phase: float  # where in its slot the push lands (0-1)
    slots: tuple[Slot | None, ...]


def gpus(slots: int) -> st.SearchStrategy[list[Gpu]]:
    slot = st.one_of(st.none(), st.builds(
        Slot, pod=st.sampled_from([0, 1, 2]), util=st.integers(0, 100), renamed=st.booleans(),
        spelling=st.sampled_from(["plain", "prefixed", "both"])))
    # runs of the same slot (pods stay a while; gaps last) rather than noise only
    pattern = st.lists(st.tuples(slot, st.integers(1, slots)), min_size=1, max_size=5).map(
        lambda runs: (tuple(s for s, n in runs for _ in range(n)) * slots)[:slots])
    gpu = st.builds(Gpu, vendor=st.sampled_from(["nvidia", "amd"]), index=st.just(0),
                    labelled=st.booleans() | st.just(True),
                    mig=st.sampled_from([None, None, "3g.40gb", "1g.10gb"]),
                    phase=st.floats(0.05, 0.95), slots=pattern)
    return st.lists(gpu, min_size=1, max_size=6).map(
        lambda gs: [Gpu(g.vendor, i, g.labelled, g.mig if g.vendor == "nvidia" else None,
                        g.phase, g.slots) for i, g in enumerate(gs)])


def _labels(g: Gpu, s: Slot) -> tuple[str, tuple[str, str, str, str, str, str]]:
    """The label set of one sample, and the ledger key the oracle files it under."""
    ns, pod = PODS[s.pod]
    parts = ['cluster="c1"'] if g.labelled else []
    node = f"node-{g.index % 2}"
    if g.vendor == "nvidia":
        parts += [f'{"hostname" if s.renamed else "Hostname"}="{node}"', f'gpu="{g.index}"',
                  f'UUID="GPU-{g.index}"', f'modelName="{H100}"']
        if g.mig:
            parts += [f'GPU_I_PROFILE="{g.mig}"', f'GPU_I_ID="{g.index + 1}"']
        uuid, slice_key = f"GPU-{g.index}", f"{g.mig}/{g.index + 1}" if g.mig else ""
    else:
        parts += [f'hostname="{node}"', f'gpu_id="{g.index}"', f'gpu_uuid="amd-{g.index}"',
                  f'card_series="{MI300}"']
        uuid, slice_key = f"amd-{g.index}", ""
    if s.pod == 1:
        parts += [f'namespace="{ns}"', f'pod="{pod}"']
    elif s.pod == 2:
        parts += [EXPORTER, f'exported_namespace="{ns}"', f'exported_pod="{pod}"']
    else:
        parts += [EXPORTER]
    return ",".join(parts), ("c1", node, uuid, slice_key, ns, pod)


def _samples(g: Gpu, s: Slot) -> list[tuple[str, float]]:
    """(metric name, value) of one push."""
    power = 100.0 + s.util
    if g.vendor == "nvidia":
        out = []
        if s.spelling in ("plain", "both"):
            out.append(("DCGM_FI_DEV_POWER_USAGE", power))
            # slices: GPU_UTIL is absent, the engine-activity ratio stands for it
            out.append(("DCGM_FI_PROF_GR_ENGINE_ACTIVE", s.util / 100.0) if g.mig
                       else ("DCGM_FI_DEV_GPU_UTIL", float(s.util)))
        if s.spelling in ("prefixed", "both"):  # dcgm-exporter 4.9: utilisation 0-1
            out.append(("DCGM_FI_DEV_BOARD_POWER_WATTS", power))
            out.append(("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", s.util / 100.0) if g.mig
                       else ("DCGM_FI_DEV_GPU_UTIL_RATIO", s.util / 100.0))
        return out
    names = {"plain": [""], "prefixed": ["amd_"], "both": ["", "amd_"]}[s.spelling]
    return [(p + m, v) for p in names
            for m, v in (("gpu_gfx_activity", float(s.util)), ("gpu_power_usage", power))]


def openmetrics(fleet: list[Gpu], t0: float, push: float) -> str:
    lines: dict[str, list[str]] = {}
    for g in fleet:
        for k, s in enumerate(g.slots):
            if s is None:
                continue
            labels, _ = _labels(g, s)
            t = t0 + (k + g.phase) * push
            for name, value in _samples(g, s):
                lines.setdefault(name, []).append((labels, t, value))
    out = []
    for name, rows in lines.items():
        out.append(f"# TYPE {name} gauge")
        for labels, t, value in sorted(rows, key=lambda r: (r[0], r[1])):
            out.append(f"{name}{{{labels}}} {value} {t:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def oracle(fleet: list[Gpu], t0: float, push: float, per_bucket: int) -> dict:
    """Ledger rows by (bucket index, key), straight from the samples."""
    share = {"3g.40gb": 3 / 7, "1g.10gb": 1 / 7, None: 1.0}
    out: dict = {}
    for b in range(2):
        series: dict = {}  # (key, label set) -> [slots, {spelling: [utils]}, {spelling: [power]}]
        for g in fleet:
            if not g.labelled:
                continue  # no cluster label: never in the ledger
            for k in range(b * per_bucket, (b + 1) * per_bucket):
                s = g.slots[k]
                if s is None:
                    continue
                labels, key = _labels(g, s)
                entry = series.setdefault((key, labels), [0, {}, {}, g])
                entry[0] += 1
                # "" is the preferred spelling (the legacy / unprefixed name)
                spellings = {"plain": [""], "prefixed": ["other"], "both": ["", "other"]
                             }[s.spelling]
                for p in spellings:
                    entry[1].setdefault(p, []).append(float(s.util))
                    entry[2].setdefault(p, []).append(100.0 + s.util)
        rows: dict = {}
        for (key, _), (slots, utils, powers, g) in series.items():
            preferred = "" if "" in utils else "other"  # the first name of each pair
            u = sum(utils[preferred]) / len(utils[preferred])
            p = sum(powers[preferred]) / len(powers[preferred])
            row = rows.setdefault(key, {"slots": 0, "u": 0.0, "p": 0.0, "share": share[g.mig]})
            row["slots"] += slots
            row["u"] += u * slots
            row["p"] += p * slots
        hours = per_bucket * push / 3600.0
        for key, row in rows.items():
            coverage = row["slots"] / per_bucket
            power = row["p"] / row["slots"]
            out[(b, key)] = {
                "coverage": coverage, "gpu_hours": row["share"] * coverage * hours,
                "avg_utilisation_pct": row["u"] / row["slots"],
                "energy_wh": power * coverage * hours * row["share"]}
    return out


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_ledger_rows_equal_the_oracle_at_every_push_interval(tmp_path_factory, data):
    push = data.draw(st.sampled_from([1.0, 5.0, 15.0, 60.0, 300.0]), label="push interval")
    per_bucket = data.draw(st.sampled_from([4, 6, 12]), label="slots per bucket")
    fleet = data.draw(gpus(2 * per_bucket), label="fleet")
    bucket = per_bucket * push
    t0 = (time.time() // bucket) * bucket - 4 * bucket - max(3600.0, bucket)
    workdir = tmp_path_factory.mktemp("oracle")
    hub = backfilled_hub(workdir / "hub", openmetrics(fleet, t0, push)).start(timeout=120)
    engine = inv.make_engine(f"sqlite:///{workdir / 'inv.db'}", create=True)
    inv.ensure_schema(engine)
    labelled = any(g.labelled and any(g.slots) for g in fleet)
    unlabelled = any(not g.labelled and any(g.slots) for g in fleet)
    try:
        with HubClient.from_settings(HubSettings(url=hub.url)) as client:
            if unlabelled and not labelled:  # GPU series, none labelled: a typo, refused
                with pytest.raises(InputError, match="no GPU series carries the cluster"):
                    usage.collect_usage(engine, client, bucket=bucket, push_interval=push,
                                        starts=[t0, t0 + bucket])
                return
            result = usage.collect_usage(engine, client, bucket=bucket, push_interval=push,
                                         starts=[t0, t0 + bucket])
        assert result.failed == [] and len(result.collected) == 2
        with engine.connect() as conn:
            rows = conn.execute(sa.select(inv.usage)).mappings().all()
    finally:
        hub.stop()
        engine.dispose()
    got = {}
    for r in rows:
        b = round((r["bucket_start"].replace(tzinfo=dt.UTC).timestamp() - t0) / bucket)
        key = (r["cluster"], r["node"], r["uuid"], r["slice"], r["namespace"], r["pod"])
        got[(b, key)] = r
    want = oracle(fleet, t0, push, per_bucket)
    assert set(got) == set(want)
    for k, figures in want.items():
        for name, value in figures.items():
            assert got[k][name] == pytest.approx(value, rel=1e-9, abs=1e-9), (k, name)
    assert all(r["cluster"] for r in rows)


def test_a_whole_bucket_of_pushes_is_coverage_one_and_a_20_minute_gap_two_thirds(tmp_path: Path):
    """The issue's two sentences, at 1 s and at ACM's 300 s: one hour, one GPU pushing all
    of it, one with a 20-minute gap."""
    for push in (1.0, 300.0):
        n = round(3600 / push)
        gap = range(round(1200 / push), round(2400 / push))
        full = Slot(1, 50, False, "plain")
        fleet = [Gpu("nvidia", 0, True, None, 0.5, (full,) * (2 * n)),
                 Gpu("nvidia", 1, True, None, 0.5,
                     tuple(None if k in gap else full for k in range(2 * n)))]
        t0 = (time.time() // 3600) * 3600 - 5 * 3600
        hub = backfilled_hub(tmp_path / f"hub-{push:g}", openmetrics(fleet, t0, push)).start(
            timeout=120)
        engine = inv.make_engine(f"sqlite:///{tmp_path / f'inv-{push:g}.db'}", create=True)
        inv.ensure_schema(engine)
        try:
            with HubClient.from_settings(HubSettings(url=hub.url)) as client:
                usage.collect_usage(engine, client, bucket=3600, push_interval=push,
                                    starts=[t0])
            with engine.connect() as conn:
                hours = {r.uuid: r.gpu_hours for r in conn.execute(
                    sa.select(inv.usage.c.uuid, inv.usage.c.gpu_hours))}
        finally:
            hub.stop()
            engine.dispose()
        assert hours == pytest.approx({"GPU-0": 1.0, "GPU-1": 2 / 3}), push


def test_efficiency_columns_from_profiling_counters_null_where_not_exported(tmp_path: Path):
    """SM activity from DCGM_FI_PROF_SM_ACTIVE, else GR_ENGINE_ACTIVE; AMD's percent
    counters as they are; a GPU without any profiling counter is null, never 0."""
    from tests.support.backfill import openmetrics as om_text
    from tests.support.clirun import gpufleet_json

    t0 = (time.time() // 3600) * 3600 - 4 * 3600
    base = 'cluster="c1",Hostname="n1",modelName="NVIDIA H100 80GB HBM3",pod="p",namespace='

    def const(v: float):
        return lambda t: v

    series = []
    for uuid, fields in (("GPU-SM", {"DCGM_FI_PROF_SM_ACTIVE": 0.8,
                                     "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.9,
                                     "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.4,
                                     "DCGM_FI_PROF_DRAM_ACTIVE": 0.3}),
                         ("GPU-GR", {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.5}),
                         ("GPU-NONE", {})):
        labels = f'{base}"{uuid.lower()}",gpu="0",UUID="{uuid}"'
        series.append(("DCGM_FI_DEV_GPU_UTIL", labels, const(70)))
        series += [(name, labels, const(v)) for name, v in fields.items()]
    amd = ('cluster="c1",hostname="n2",gpu_id="0",gpu_uuid="amd-0",namespace="amd",pod="q",'
           'card_series="AMD Instinct MI300X OAM"')
    series += [("gpu_gfx_activity", amd, const(90)), ("gpu_prof_sm_active", amd, const(60)),
               ("gpu_prof_tensor_active_percent", amd, const(20))]
    text = om_text(series, [t0 + 30 + 60 * k for k in range(60)])
    hub = backfilled_hub(tmp_path / "hub", text).start(timeout=120)
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}"}
    try:
        gpufleet_json("usage", "collect", "--from", _iso(t0), "--until", _iso(t0 + 3600),
                      "--push-interval", "1m", env=env)
        rows = {r["namespace"]: r for r in gpufleet_json(
            "usage", "--from", _iso(t0), "--until", _iso(t0 + 3600), env=env)}
    finally:
        hub.stop()
    assert rows["gpu-sm"]["avg_sm_active_pct"] == pytest.approx(80.0)
    assert rows["gpu-sm"]["sm_active_gpu_hours"] == pytest.approx(0.8)
    assert rows["gpu-gr"]["avg_sm_active_pct"] == pytest.approx(50.0)
    assert rows["amd"]["avg_sm_active_pct"] == pytest.approx(60.0)
    assert rows["gpu-none"]["avg_sm_active_pct"] is None
    assert rows["gpu-none"]["sm_active_gpu_hours"] is None
    assert rows["gpu-none"]["gpu_hours"] == pytest.approx(1.0)


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
