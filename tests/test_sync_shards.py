"""A sharded sync is the unsharded sync, row for row, on a real Prometheus; a shard that
fails leaves the last good inventory and names its clusters."""

from __future__ import annotations

import datetime as dt
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from hub import store
from hub.common import UnavailableError, format_duration
from hub.inventory import _db as inventory
from hub.inventory import cluster_sizes, run_sync
from hub.inventory import usage as usage_view
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from hub.store import HubClient, plan_shards
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.httpstub import Request, Response, StubServer, forward, json_response
from tests.support.samples import names_in, sync_requests

#: cluster names that are RE2 syntax, PromQL string escapes or both: a shard's matcher
#: must select each exactly
NAMES = ["east", "eu.west-1", "a+b", "x|y", "q(1)", "s*t", "c^$", "br[a]{1}", 'say"hi',
         "back\\slash", "ea"]
WINDOW = 3600.0
T_END = (time.time() // 60) * 60 - 1800  # backfilled, so well behind the head block
TIMES = [T_END - 60 * k for k in reversed(range(10))]
H100 = 'modelName="NVIDIA H100 80GB HBM3",DCGM_FI_DRIVER_VERSION="580.105.08"'


def esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class Gpu:
    cluster: str | None  # None: pushed without the cluster label
    node: str
    index: int
    vendor: str  # nvidia | amd
    mig: bool = False
    trimmed: bool = False  # sends only a field the value queries do not read
    pod: str | None = None
    until: float = T_END  # its newest sample
    uuid: str = ""

    def series(self) -> list[tuple[str, str, object]]:
        cluster = f'cluster="{esc(self.cluster)}",' if self.cluster is not None else ""
        pod = f',namespace="team",pod="{self.pod}"' if self.pod else ""

        def value(v: float):
            return lambda t: v if t <= self.until else None

        if self.vendor == "amd":
            labels = (f'{cluster}hostname="{esc(self.node)}",gpu_id="{self.index}",'
                      f'gpu_uuid="{self.uuid}",card_series="MI300X"{pod}')
            return [(n, labels, value(v)) for n, v in (
                ("gpu_edge_temperature", 40), ("gpu_gfx_activity", 12 + self.index),
                ("gpu_used_vram", 2048), ("gpu_total_vram", 196592))]
        base = (f'{cluster}Hostname="{esc(self.node)}",gpu="{self.index}",'
                f'UUID="{self.uuid}",{H100}{pod}')
        if self.trimmed:
            return [("DCGM_FI_DEV_SM_CLOCK", base, value(1980))]
        if self.mig:
            out = []
            for gid in (1, 2):
                labels = f'{base},GPU_I_PROFILE="3g.40gb",GPU_I_ID="{gid}"'
                out += [("DCGM_FI_DEV_GPU_TEMP", labels, value(45)),
                        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, value(0.25 * gid)),
                        ("DCGM_FI_DEV_FB_USED", labels, value(1000.0 * gid)),
                        ("DCGM_FI_DEV_FB_FREE", labels, value(39000.0))]
            return out
        return [(n, base, value(v)) for n, v in (
            ("DCGM_FI_DEV_GPU_TEMP", 45 + self.index), ("DCGM_FI_DEV_GPU_UTIL", 37),
            ("DCGM_FI_DEV_FB_USED", 20480), ("DCGM_FI_DEV_FB_FREE", 60000),
            ("DCGM_FI_DEV_POWER_USAGE", 312.5))]


@st.composite
def fleets(draw) -> list[Gpu]:
    """Clusters of 1-3 nodes of 1-3 GPUs (NVIDIA, MIG, trimmed field sets, AMD, pods), and
    now and then series without the cluster label and a GPU reporting from two clusters
    (moved inside the window, or concurrently)."""
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    gpus: list[Gpu] = []
    for c, cluster in enumerate(names):
        for n in range(draw(st.integers(1, 3))):
            for i in range(draw(st.integers(1, 3))):
                kind = draw(st.sampled_from(["nvidia", "nvidia", "mig", "trimmed", "amd"]))
                gpus.append(Gpu(
                    cluster, f"{cluster}-n{n}", i, "amd" if kind == "amd" else "nvidia",
                    mig=kind == "mig", trimmed=kind == "trimmed",
                    pod=draw(st.sampled_from([None, f"job-{c}-{n}"])),
                    uuid=f"GPU-{c}-{n}-{i}"))
    if draw(st.booleans()):
        gpus.append(Gpu(None, "lost-node", 0, "nvidia", uuid="GPU-unlabelled"))
    if len(names) > 1 and draw(st.booleans()):
        # the same GPU from the first and the last cluster: moved, or both at once
        concurrent = draw(st.booleans())
        gpus.append(Gpu(names[0], "mover-old", 7, "nvidia", uuid="GPU-twin",
                        until=T_END if concurrent else T_END - 420))
        gpus.append(Gpu(names[-1], "mover-new", 7, "nvidia", uuid="GPU-twin"))
    return gpus


def seed(db: str) -> None:
    """What an earlier sync knew: a cluster that is gone now, and the twin GPU elsewhere."""
    engine = inventory.make_engine(db, create=True)
    from hub.inventory import _migrate as migrate

    migrate.ensure_schema(engine)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("gone", "g1", "GPU-gone", "nvidia", sample_at=T_END - 7200),
            Observation("gone", "g2", "GPU-twin", "nvidia", sample_at=T_END - 7200),
        ], dt.datetime(2026, 1, 1))
    engine.dispose()


TABLES = {
    "clusters": ("first_seen", "last_seen", "naming_since"),
    "nodes": ("first_seen", "last_seen"),
    "gpus": ("first_seen", "last_seen"),
    "allocations": ("first_seen", "last_seen"),
    "events": ("id", "at"),
}


def contents(db: str) -> dict[str, list[tuple]]:
    """Every table a sync writes, less the sync's own times (two syncs, two clocks)."""
    engine = inventory.make_engine(db)
    out = {}
    with engine.connect() as conn:
        for name, skip in TABLES.items():
            table = inventory.metadata.tables[name]
            cols = [c for c in table.c if c.name not in skip]
            out[name] = sorted((tuple(row) for row in conn.execute(sa.select(*cols))), key=repr)
    engine.dispose()
    return out


def cluster_sizes_of(db: str) -> dict[str, int]:
    engine = inventory.make_engine(db)
    with engine.connect() as conn:
        sizes = cluster_sizes(conn)
    engine.dispose()
    return sizes


def sync(hub_url: str, db: str, shard_size: int):
    engine = inventory.make_engine(db, create=True)
    try:
        return run_sync(engine, HubClient(hub_url, timeout=30), stale_after=WINDOW,
                        shard_size=shard_size, query_concurrency=3)
    finally:
        engine.dispose()


def fleet_text(fleet: list[Gpu]) -> str:
    return openmetrics([s for g in fleet for s in g.series()], TIMES)


#: each example backfills and starts its own Prometheus (~2 s): few examples, no shrinking
#: (minutes of restarts); a failure prints its fleet and shard size whole
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(fleet=fleets(), size=st.integers(1, 12))
@example(fleet=[  # one cluster a shard: a GPU in two of them, trimmed, MIG, unlabelled
    Gpu("east", "e1", 0, "nvidia", uuid="GPU-e0", pod="p"),
    Gpu("br[a]{1}", "b1", 0, "nvidia", mig=True, uuid="GPU-b0"),
    Gpu("say\"hi", "s1", 0, "nvidia", trimmed=True, uuid="GPU-s0"),
    Gpu("x|y", "x1", 1, "amd", uuid="amd-x1"),
    Gpu(None, "lost", 0, "nvidia", uuid="GPU-unlabelled"),
    Gpu("east", "mover-old", 7, "nvidia", uuid="GPU-twin"),
    Gpu("x|y", "mover-new", 7, "nvidia", uuid="GPU-twin")], size=1)
def test_a_sharded_sync_writes_what_one_unsharded_sync_writes(fleet, size):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hub = backfilled_hub(work / "hub", fleet_text(fleet)).start(timeout=120)
        try:
            whole, sharded = f"sqlite:///{work / 'whole.db'}", f"sqlite:///{work / 'shards.db'}"
            seed(whole)
            seed(sharded)
            sync(hub.url, whole, 10**9)
            # the first plan is the seeded inventory's: every reporting cluster is new to it
            # and falls to the rest, so all of them are read; the second plan is by the
            # sizes the first sync wrote
            first = sync(hub.url, sharded, size)
            assert first.shards == len(plan_shards({"gone": 2}, size, "cluster")) == 1
            sizes = cluster_sizes_of(sharded)
            one = sync(hub.url, whole, 10**9)
            many = sync(hub.url, sharded, size)
        finally:
            hub.stop()
        clusters = {g.cluster for g in fleet if g.cluster is not None}
        assert one.shards == 1
        assert set(sizes) == clusters | {"gone"}
        assert many.shards == len(plan_shards(sizes, size, "cluster"))
        assert many.requests == sync_requests(fleet_text(fleet), many.shards)
        assert (many.clusters, many.nodes, many.gpus, many.note) == (
            one.clusters, one.nodes, one.gpus, one.note)
        got, want = contents(sharded), contents(whole)
        for table in TABLES:  # the rows that differ, not two whole tables
            assert ([r for r in got[table] if r not in want[table]],
                    [r for r in want[table] if r not in got[table]]) == ([], []), table
        # the silent cluster is stale, not deleted; every reporting one is active
        states = {r[0]: r[1] for r in contents(sharded)["clusters"]}
        assert states.pop("gone") == "stale"
        assert set(states) == clusters and set(states.values()) == {"active"}


@settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(st.sampled_from([*NAMES, ""]), st.integers(0, 50), max_size=11),
       size=st.integers(1, 60))
def test_a_plan_puts_every_cluster_in_exactly_one_shard_of_bounded_size(counts, size):
    shards = plan_shards(counts, size, "cluster")
    named = sorted(c for c in counts if c)
    assert sorted(c for s in shards for c in s.clusters) == named
    assert [s.rest for s in shards] == [False] * (len(shards) - 1) + [True]
    for shard in shards:
        assert shard.gpus == sum(counts[c] for c in shard.clusters)
        assert shard.gpus <= size or len(shard.clusters) == 1
    if len(shards) == 1:
        assert shards[0].matcher == ""  # one shard: no matcher at all
    else:
        others = [c for s in shards[:-1] for c in s.clusters]
        assert shards[-1].matcher == store.shard_matcher("cluster", others, exclude=True)


def test_a_sync_plans_from_the_inventory_and_asks_the_store_to_count_only_when_it_is_empty(
        tmp_path):
    """Counting GPUs per cluster reads every GPU's sample-time series over the window (as
    much of the store's work as a field's query): a sync whose inventory knows the clusters
    plans by its sizes and asks the sources alone; a cluster the inventory does not know
    yet is read all the same, in the last shard."""
    known = ["a.one", "b.two", "c.three"]
    fleet = [Gpu(c, f"{c}-n", i, "nvidia", uuid=f"GPU-{c}-{i}") for c in known
             for i in range(2)]
    hub = backfilled_hub(tmp_path / "hub", fleet_text(
        [*fleet, Gpu("d.new", "d-n", 0, "amd", uuid="amd-d0")])).start(timeout=120)
    planning: list[str] = []

    def handle(req: Request) -> Response:
        query = parse_qs(req.body.decode()).get("query", [""])[0]
        if "gpufleet_source" in query:
            planning.append(query)
        return forward(hub.url, req)

    front = StubServer(handle)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    seed(db)  # knows only the cluster "gone"
    engine = inventory.make_engine(db)
    with engine.begin() as conn:  # and the three of the fleet, as a sync wrote them
        apply_observations(conn, [Observation(g.cluster or "", g.node, g.uuid, "nvidia",
                                              sample_at=T_END) for g in fleet],
                           dt.datetime(2026, 1, 1))
    engine.dispose()
    count = store.cluster_count_query("1h", "cluster")
    try:
        planned = sync(front.url, db, 4)
        empty = f"sqlite:///{tmp_path / 'empty.db'}"
        counted = sync(front.url, empty, 4)
    finally:
        front.stop()
        hub.stop()
    assert len(planning) == 2
    assert count not in planning[0]  # planned by the inventory's sizes: no count asked
    assert count in planning[1]  # an empty inventory: the store counts
    # a.one, b.two | the rest: c.three, gone and d.new, which the inventory did not know
    assert planned.shards == len(plan_shards(
        {"gone": 2, "a.one": 2, "b.two": 2, "c.three": 2}, 4, "cluster")) == 2
    assert planned.gpus == counted.gpus == 7
    assert "d.new" in {r[2] for r in contents(db)["gpus"]}


def test_every_selector_of_every_query_carries_the_shard_matcher():
    """Including each `or` arm and the presence query's `unless` side: a selector without
    it would fetch the whole fleet once per shard."""
    matcher = store.shard_matcher("cluster", ["a.b", 'q"x', "br{1}"])
    for query in store.sync_queries("10m", "1m", "cluster", matcher):
        selectors = re.findall(r"\{[^{}]*\}", query.promql)
        assert selectors, query.promql
        for sel in selectors:
            assert matcher in sel, (query.kind, sel)


#: series of the exporters' families without a GPU id (a node-level reading, an exporter
#: that lost its id label), some beside a GPU's own: the sync's selectors carry no device
#: matcher (the store's cost of one grew with the fleet), so these reach the client
NODE_LEVEL = [
    ("DCGM_FI_DEV_GPU_TEMP", 'cluster="east",Hostname="e1"', 99.0),
    ("DCGM_FI_DEV_FB_USED", 'cluster="east",Hostname="e1"', 1.0),
    ("DCGM_FI_DEV_GPU_UTIL", 'cluster="east",Hostname="e1",pod="p"', 99.0),
    ("DCGM_FI_DEV_SM_CLOCK", 'cluster="east",Hostname="e9"', 1.0),
    ("DCGM_FI_DEV_GPU_TEMP", 'Hostname="lost"', 99.0),  # without the cluster label too
    ("gpu_gfx_activity", 'cluster="x|y",hostname="x1"', 99.0),
    ("gpu_edge_temperature", 'cluster="x|y",hostname="x1"', 99.0),
    ("gpu_ecc_uncorrect_mpio", 'cluster="x|y",hostname="x9"', 0.0),
]


def test_series_without_a_gpu_id_change_nothing_sharded_or_not(tmp_path):
    """The client drops them as the store's device matcher did: no GPU, node, value, naming
    or unlabelled note comes of them, in one shard or in several."""
    fleet = [Gpu("east", "e1", 0, "nvidia", uuid="GPU-e0", pod="p"),
             Gpu("east", "e1", 1, "nvidia", mig=True, uuid="GPU-e1"),
             Gpu("x|y", "x1", 0, "amd", uuid="amd-x0"),
             Gpu("x|y", "x1", 1, "amd")]  # no uuid: known by node and gpu_id
    series = [s for g in fleet for s in g.series()]
    extra = [(name, labels, lambda t, v=v: v) for name, labels, v in NODE_LEVEL]
    got = {}
    for name, text in (("clean", openmetrics(series, TIMES)),
                       ("noisy", openmetrics(series + extra, TIMES))):
        hub = backfilled_hub(tmp_path / name, text).start(timeout=120)
        try:
            for size in (10**9, 1):
                db = f"sqlite:///{tmp_path / f'{name}-{size}.db'}"
                result = sync(hub.url, db, size)
                assert (result.gpus, result.note) == (4, None), (name, size)
                got[name, size] = contents(db)
        finally:
            hub.stop()
    want = got["clean", 10**9]
    assert {(r[0], r[1]) for r in want["nodes"]} == {("east", "e1"), ("x|y", "x1")}
    for key, tables in got.items():
        for table in TABLES:
            assert ([r for r in tables[table] if r not in want[table]],
                    [r for r in want[table] if r not in tables[table]]) == ([], []), (key, table)


def test_a_failed_shard_leaves_the_last_good_inventory_and_names_its_clusters(tmp_path):
    names = ["a.one", "b.two", "c.three", "d.four"]
    fleet = [Gpu(c, f"{c}-n", i, "nvidia", uuid=f"GPU-{c}-{i}") for c in names
             for i in range(2)]
    hub = backfilled_hub(tmp_path / "hub", fleet_text(fleet)).start(timeout=120)
    # two shards of two clusters: the second is every cluster but the first shard's
    failing = store.shard_matcher("cluster", ["a.one", "b.two"], exclude=True)

    def handle(req: Request) -> Response:
        form = parse_qs(req.body.decode())
        if failing in form.get("query", [""])[0] and "GPU_UTIL" in form["query"][0]:
            return json_response(503, {"status": "error", "error": "store overloaded"})
        return forward(hub.url, req)

    front = StubServer(handle)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    try:
        good = sync(hub.url, db, 4)
        assert good.shards == 2 and good.gpus == 8
        before = contents(db)
        time.sleep(1.1)
        with pytest.raises(UnavailableError) as failed:
            sync(front.url, db, 4)
    finally:
        front.stop()
        hub.stop()
    message = failed.value.format_message()
    assert "answered 503" in message and "store overloaded" in message
    assert "clusters c.three, d.four" in message and "2 of 2" in message
    assert "!~" not in message  # names, not PromQL
    assert message.endswith("inventory left unchanged")
    assert contents(db) == before
    engine = inventory.make_engine(db)
    with engine.connect() as conn:
        runs = inventory.list_sync_runs(conn)
    engine.dispose()
    assert runs[0]["status"] == "failed" and "c.three" in runs[0]["error"]
    assert runs[1]["status"] == "ok" and runs[1]["shards"] == 2


def test_a_sharded_usage_collect_writes_what_an_unsharded_one_writes(tmp_path):
    """The ledger's per-bucket queries asked per shard of clusters (planned from the
    inventory), shards at once, rows set aside and written in one transaction."""
    from hub import usage
    from hub.inventory import _migrate as migrate
    from hub.usage._ledger import bucket_queries
    from tests.test_usage_e2e import HOUR, fleet_text

    t0 = (time.time() // HOUR) * HOUR - 4 * HOUR
    hub = backfilled_hub(tmp_path / "hub", fleet_text(t0)).start(timeout=120)
    ledgers = {}
    try:
        for name, size in (("whole", 10**9), ("shards", 1)):
            engine = inventory.make_engine(f"sqlite:///{tmp_path / name}.db", create=True)
            migrate.ensure_schema(engine)
            client = HubClient(hub.url, timeout=30)
            assert run_sync(engine, client, stale_after=4 * HOUR).clusters == 2
            result = usage.collect_usage(engine, client, starts=[t0, t0 + HOUR],
                                         now=t0 + 4 * HOUR, shard_size=size, concurrency=2)
            assert result.failed == [] and len(result.collected) == 2
            # the bucket's set once per shard (no allocation series in this fleet; the
            # fields whose names the store holds), one look a collect for allocation series
            # and one for the store's names
            held = names_in(fleet_text(t0))
            per_bucket = len(bucket_queries(HOUR, 300.0, 300.0, "cluster", allocations=False,
                                            held=held))
            assert per_bucket < len(bucket_queries(HOUR, 300.0, 300.0, "cluster",
                                                   allocations=False))
            assert result.requests == 2 + 2 * per_bucket * (1 if name == "whole" else 2)
            with engine.connect() as conn:
                table = usage_view
                ledgers[name] = sorted((tuple(r) for r in conn.execute(sa.select(table))),
                                       key=repr)
            if name == "shards":
                # --replace-grid's first bucket is asked in shards too (with the allocations'
                # queries: it does not look first), the rest as any collect
                removed, again = usage.collect_on_new_grid(
                    engine, client, bucket=HOUR, starts=[t0, t0 + HOUR], now=t0 + 4 * HOUR,
                    shard_size=size, concurrency=2)
                assert removed == len(ledgers["shards"]) and again.failed == []
                first = len(bucket_queries(HOUR, 300.0, 300.0, "cluster", held=held))
                assert again.requests == 1 + 2 * first + 2 + 2 * per_bucket
                with engine.connect() as conn:
                    ledgers["new grid"] = sorted(
                        (tuple(r) for r in conn.execute(sa.select(usage_view))), key=repr)
            engine.dispose()
    finally:
        hub.stop()
    assert ledgers["whole"] and ledgers["shards"] == ledgers["whole"]
    assert ledgers["new grid"] == ledgers["whole"]


def test_a_trimmed_gpu_whose_newest_sample_follows_the_last_subquery_step_is_found(tmp_path):
    """The presence query's subquery sees samples only at its steps, multiples of the step
    (a minute for this window): pinned ``@`` the first step at or after the sync's time, it
    sees a GPU whose only sample came after the last step before that time, with the
    sample's own time. The same subquery unpinned misses it: this is what the instant form
    beside it used to catch."""
    from hub.inventory._sync import collect, subquery_step

    step = subquery_step(WINDOW)
    assert T_END % step == 0
    at, sample = T_END + 45.0, T_END + 30.0  # the last step before `at` is T_END
    trimmed = Gpu("east", "e2", 0, "nvidia", trimmed=True, uuid="GPU-late")
    (name, labels, _), = trimmed.series()
    hub = backfilled_hub(tmp_path / "hub", openmetrics(
        [*Gpu("east", "e1", 0, "nvidia", uuid="GPU-e0").series(),
         (name, labels, lambda t: 1980 if t == sample else None)],
        [*TIMES, sample])).start(timeout=120)
    try:
        client = HubClient(hub.url, timeout=30)
        fetched = collect(client, stale_after=WINDOW, cluster_label="cluster", at=at)
        unpinned = store.profile("nvidia").presence_query(
            format_duration(WINDOW), format_duration(step), "cluster").promql
        missed = client.query(unpinned, time=at).result
    finally:
        hub.stop()
    try:
        seen = {obs.uuid: obs for group in fetched.groups() for obs in group}
    finally:
        fetched.close()
    assert set(seen) == {"GPU-e0", "GPU-late"}
    assert seen["GPU-late"].sample_at == sample
    assert missed == []
