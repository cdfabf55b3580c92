"""A physical GPU's life (issue 38): placements, `replaced` and `health` events, lemons and
the fleet states, written by the sync's writer, against a brute-force model of the fleet
that keeps nothing but each sync's sightings (hypothesis over random moves, swaps, pulls and
health changes); the issue's scenario through real syncs of a real Prometheus on SQLite and
PostgreSQL; bad input; and the schema's upgrade."""

from __future__ import annotations

import datetime as dt
import json
import time

import pytest
import sqlalchemy as sa
from alembic import command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub import inventory as inv
from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import InventoryWriter
from tests.support.clirun import gpufleet, gpufleet_json
from tests.support.promql import wait_for, wait_silent

T0 = dt.datetime(2026, 3, 1, 12, 0)
HOUR = dt.timedelta(hours=1)
SLOTS = [(c, n, f"0000:{b}:00.0") for c in ("east", "west") for n in ("n1", "n2")
         for b in ("18", "2a")]
GPUS = [f"GPU-{i}" for i in range(8)]


def _memory_engine() -> sa.Engine:
    engine = _db.make_engine("sqlite://", create=True)
    migrate.metadata().create_all(engine)
    return engine


def _sync(engine: sa.Engine, now: dt.datetime, placed: dict[tuple, str],
          health: dict[str, str], allocated: set[str], within: float) -> None:
    obs = []
    for (cluster, node, bus), uuid in placed.items():
        obs.append(Observation(cluster, node, uuid, "nvidia", model="NVIDIA H100",
                               pci_bus_id=bus, index=int(bus[5:7], 16) % 8,
                               sample_at=now.replace(tzinfo=dt.UTC).timestamp(),
                               health=health.get(uuid, "ok"),
                               health_reasons=None if health.get(uuid, "ok") == "ok"
                               else "xid 79",
                               allocations=frozenset({("team-a", f"p-{uuid}", "main")})
                               if uuid in allocated else frozenset()))
    with engine.begin() as conn:
        writer = InventoryWriter(conn, now, replaced_within=within)
        writer.add(obs)
        writer.finish()


# -- the brute-force model: each sync's sightings, nothing else ------------------------------
class Model:
    def __init__(self, within: float) -> None:
        self.within = dt.timedelta(seconds=within)
        self.sightings: list[tuple[dt.datetime, dict[tuple, str]]] = []
        self.replaced: list[tuple[tuple, str, str]] = []
        self.stays: dict[str, list[tuple]] = {}
        self.health_changes: dict[str, list[tuple[str | None, str]]] = {}
        self.health: dict[str, str] = {}
        self.stale_allocated: dict[str, int] = {}

    def _last_slot(self, uuid: str) -> tuple[tuple | None, dt.datetime | None]:
        for at, seen in reversed(self.sightings):
            for slot, u in seen.items():
                if u == uuid:
                    return slot, at
        return None, None

    def _holder_end(self, holder: str, slot: tuple, now: dt.datetime) -> dt.datetime | None:
        """When ``holder`` last held ``slot``: open (now) until it is seen elsewhere or
        another identity is seen in the slot."""
        holding, ever, end = False, False, None
        for at, seen in self.sightings:
            where = next((s for s, u in seen.items() if u == holder), None)
            if where == slot:
                holding, ever, end = True, True, None
            elif holding and (where is not None or seen.get(slot) not in (None, holder)):
                holding, end = False, at
        return (now if holding else end) if ever else None

    def sync(self, now: dt.datetime, placed: dict[tuple, str], health: dict[str, str],
             allocated: set[str], before_alloc: set[str]) -> None:
        previous = self.sightings[-1][1] if self.sightings else {}
        for slot, uuid in placed.items():
            last, last_at = self._last_slot(uuid)
            taken = last == slot and any(
                seen.get(slot) not in (None, uuid) for at, seen in self.sightings
                if last_at is not None and at > last_at)
            if last != slot or taken:
                self.stays.setdefault(uuid, []).append(slot)
                others = {u for _, seen in self.sightings for s, u in seen.items()
                          if s == slot and u != uuid}
                ends = sorted(((self._holder_end(h, slot, now), h) for h in others),
                              key=lambda e: (e[0] or dt.datetime.min, e[1]), reverse=True)
                if ends and ends[0][0] is not None and ends[0][0] >= now - self.within:
                    self.replaced.append((slot, ends[0][1], uuid))
            new = health.get(uuid, "ok")
            old = self.health.get(uuid)
            if new != old and not (old is None and new == "ok"):
                self.health_changes.setdefault(uuid, []).append((old, new))
            self.health[uuid] = new
        for uuid in previous.values():
            if uuid not in placed.values() and uuid in before_alloc:
                self.stale_allocated[uuid] = self.stale_allocated.get(uuid, 0) + 1
        self.sightings.append((now, dict(placed)))


step = st.one_of(
    st.tuples(st.just("place"), st.sampled_from(GPUS), st.sampled_from(range(len(SLOTS)))),
    st.tuples(st.just("pull"), st.sampled_from(range(len(SLOTS))), st.just(0)),
    st.tuples(st.just("health"), st.sampled_from(GPUS),
              st.sampled_from(["ok", "degraded", "failed"])),
    st.tuples(st.just("alloc"), st.sampled_from(GPUS), st.booleans()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.lists(step, min_size=1, max_size=3), min_size=1, max_size=7),
       within_h=st.sampled_from([0.5, 2.5, 24 * 7]))
def test_random_lives_match_a_brute_force_model(steps, within_h):
    """Each sync's sightings in, the writer's placements, `replaced`/`health` events,
    lemons and states out: as the model computes them from the sightings alone."""
    within = within_h * 3600
    engine = _memory_engine()
    model = Model(within)
    placed: dict[tuple, str] = {}
    health: dict[str, str] = {}
    allocated: set[str] = set()
    for i, ops in enumerate(steps):
        before_alloc = {u for u in allocated if u in placed.values()}
        for op, a, b in ops:
            if op == "place":  # a move when placed elsewhere, a swap when the slot is full
                placed = {s: u for s, u in placed.items() if u != a}
                placed[SLOTS[b]] = a
            elif op == "pull":
                placed.pop(SLOTS[a], None)
            elif op == "health":
                health[a] = b
            elif b:
                allocated.add(a)
            else:
                allocated.discard(a)
        now = T0 + i * HOUR
        _sync(engine, now, placed, health, allocated, within)
        model.sync(now, placed, health, allocated, before_alloc)
    with engine.connect() as conn:
        events = inv.list_events(conn)
        stays = {u: [(p["cluster"], p["node"], p["slot"]) for p in inv.gpu_placements(conn, u)]
                 for u in GPUS}
        changes = {u: [(h["old"], h["new"]) for h in inv.gpu_health(conn, u)] for u in GPUS}
        lemons = inv.lemons(conn, since=30 * 86400, by="gpu", now=now)
        states = inv.fleet_states(conn, by=("cluster",))
        whole = inv.fleet_states(conn)
    replaced = [((e["cluster"], e["node"], e["details"]["slot"]), e["details"]["old"],
                 e["details"]["new"]) for e in events if e["type"] == "replaced"]
    assert sorted(replaced) == sorted(model.replaced)  # one per swap, none otherwise
    # no history merges: each GPU's placements are its own stays, in order
    assert {u: s for u, s in stays.items() if s} == model.stays
    assert {u: c for u, c in changes.items() if c} == model.health_changes
    failing = {u: sum(new in ("degraded", "failed") for _, new in c)
               for u, c in model.health_changes.items()}
    expected = {}
    for u in GPUS:
        n = (failing.get(u, 0) + sum(old == u for _, old, _ in model.replaced)
             + model.stale_allocated.get(u, 0))
        if n:
            expected[u] = n
    assert {r["uuid"]: r["failures"] for r in lemons} == expected
    known = {u for _, seen in model.sightings for u in seen.values()}
    now_placed = set(placed.values())
    assert whole == [{"delivered": len(known),
                      "healthy": sum(health.get(u, "ok") != "failed" for u in now_placed),
                      "reserved": len(now_placed & allocated),
                      "active": len(now_placed & allocated)}]
    for row in states:
        assert row["healthy"] <= row["delivered"] and row["reserved"] <= row["delivered"]
        assert row["active"] <= row["reserved"]
    engine.dispose()


def test_states_hold_their_invariants_with_idle_gpus_and_kubernetes_counts():
    """Active leaves out the idle; a node's reconcile count above its known GPUs is
    delivered as GPUs of no namespace; every group keeps Healthy, Reserved ⊆ Delivered and
    Active ⊆ Reserved."""
    engine = _memory_engine()
    placed = {SLOTS[0]: "GPU-0", SLOTS[1]: "GPU-1", SLOTS[2]: "GPU-2"}
    _sync(engine, T0, placed, {"GPU-1": "failed"}, {"GPU-0", "GPU-1"}, 86400)
    from hub.inventory._reconcile_runs import reconcile_results, reconcile_runs
    with engine.begin() as conn:
        conn.execute(reconcile_runs.insert().values(
            id=1, started_at=T0, finished_at=T0, source="file", managed_clusters=False,
            clusters=1, nodes=1, problems=0))
        conn.execute(reconcile_results.insert().values(
            run_id=1, cluster="east", node="n1", status="ok", mode="device-plugin",
            k8s_gpus=8, reason=""))
    with engine.connect() as conn:
        rows = inv.fleet_states(conn, by=("cluster", "namespace"), idle={"GPU-0"})
    assert rows == [
        {"cluster": "east", "namespace": None, "delivered": 7, "healthy": 1, "reserved": 0,
         "active": 0},
        {"cluster": "east", "namespace": "team-a", "delivered": 2, "healthy": 1,
         "reserved": 2, "active": 1},
    ]


# -- the scenario, through real syncs of a real Prometheus --------------------------
def gpu_text(uuid: str, node: str, bus: str, xid: int = 0, index: int = 0) -> str:
    labels = (f'gpu="{index}",UUID="{uuid}",device="nvidia{index}",modelName="NVIDIA H100",'
              f'Hostname="{node}",pci_bus_id="{bus}"')
    return (f"DCGM_FI_DEV_GPU_TEMP{{{labels}}} 40\n"
            f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} {xid}\n")


def test_scenario_swap_and_repair_through_real_syncs(hub, fleet, db_url):
    """GPU-A in slot 0000:18:00.0 of east/n1 raises XID 79; it is pulled and GPU-B takes the
    slot; GPU-A comes back repaired in west/w7."""
    east = {"text": gpu_text("GPU-A", "n1", "0000:18:00.0")}
    west = {"text": ""}
    fleet("east", [lambda: east["text"]])
    fleet("west", [lambda: west["text"]])
    env = {"GPUFLEET_HUB_URL": hub.url, "GPUFLEET_DB": db_url, "GPUFLEET_STALE_AFTER": "3s"}
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="east", UUID="GPU-A"} == 0', bool)
    assert gpufleet("sync", env=env).exit_code == 0

    east["text"] = gpu_text("GPU-A", "n1", "0000:18:00.0", xid=79)
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="east", UUID="GPU-A"} == 79', bool)
    assert gpufleet("sync", env=env).exit_code == 0

    east["text"] = gpu_text("GPU-B", "n1", "0000:18:00.0")
    wait_for(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="east", UUID="GPU-B"}', bool)
    wait_silent(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="east", UUID="GPU-A"}', "3s")
    assert gpufleet("sync", env=env).exit_code == 0

    west["text"] = gpu_text("GPU-A", "w7", "0000:3b:00.0")
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="west", UUID="GPU-A"} == 0', bool)
    assert gpufleet("sync", env=env).exit_code == 0

    replaced = gpufleet_json("inventory", "events", "--type", "replaced", env=env)
    assert [(e["cluster"], e["node"], e["details"]) for e in replaced] == [
        ("east", "n1", {"slot": "0000:18:00.0", "old": "GPU-A", "new": "GPU-B"})]
    life = gpufleet_json("inventory", "gpu", "GPU-A", env=env)
    assert [(p["cluster"], p["node"], p["slot"], p["until"] is None)
            for p in life["placements"]] == [("east", "n1", "0000:18:00.0", False),
                                             ("west", "w7", "0000:3b:00.0", True)]
    # the repaired GPU keeps its record: failed, then ok again
    assert [(h["old"], h["new"], h["reasons"]) for h in life["health"]] == [
        ("ok", "failed", "xid 79"), ("failed", "ok", None)]
    assert life["gpu"]["health"] == "ok" and life["gpu"]["cluster"] == "west"
    other = gpufleet_json("inventory", "gpu", "GPU-B", env=env)
    assert [(p["node"], p["slot"]) for p in other["placements"]] == [("n1", "0000:18:00.0")]
    assert other["health"] == []  # no history merged from the part it replaced
    table = gpufleet("inventory", "gpu", "GPU-A", env=env)
    assert table.exit_code == 0 and "placements:" in table.stdout
    assert "health history:" in table.stdout and "xid 79" in table.stdout

    ranked = gpufleet_json("inventory", "lemons", env=env)
    assert [(r["uuid"], r["health"], r["replaced"]) for r in ranked] == [("GPU-A", 1, 1)]
    assert {e["what"] for e in ranked[0]["evidence"]} == {
        "health ok -> failed (xid 79)", "replaced by GPU-B in 0000:18:00.0"}
    slots = gpufleet_json("inventory", "lemons", "--by", "slot", env=env)
    assert [(r["cluster"], r["node"], r["slot"], r["failures"]) for r in slots] == [
        ("east", "n1", "0000:18:00.0", 2)]
    states = gpufleet_json("inventory", "states", "--by", "cluster", env=env)
    assert states == [
        {"cluster": "east", "delivered": 1, "healthy": 1, "reserved": 0, "active": 0},
        {"cluster": "west", "delivered": 1, "healthy": 1, "reserved": 0, "active": 0}]


def test_serve_passes_replaced_within_to_its_sync_and_the_lemon_threshold_to_its_checks(
        hub, fleet, tmp_path):
    """serve's jobs take `--replaced-within` and `--lemon-threshold` as `sync` and `report`
    do: the same swap is a `replaced` event and GPU-A a lemon under the defaults, neither
    with a one-second window and a threshold of 1000 failures a GPU-month."""
    from hub.service import ServeSettings, service_jobs
    from hub.store import HubClient

    east = {"text": gpu_text("GPU-A", "n1", "0000:18:00.0")}
    west = {"text": ""}
    fleet("east", [lambda: east["text"]])
    fleet("west", [lambda: west["text"]])
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="east", UUID="GPU-A"} == 0', bool)
    client = HubClient(hub.url)
    engines = {name: _db.make_engine(f"sqlite:///{tmp_path / name}.db", create=True)
               for name in ("defaults", "strict")}
    jobs = {"defaults": service_jobs(engines["defaults"], client,
                                     ServeSettings(stale_after=3.0)),
            "strict": service_jobs(engines["strict"], client,
                                   ServeSettings(stale_after=3.0, replaced_within=1.0,
                                                 lemon_threshold=1000.0))}
    for engine in engines.values():
        migrate.upgrade(engine)

    def sync_both() -> None:
        for job in jobs.values():
            job.sync()

    sync_both()
    east["text"] = gpu_text("GPU-A", "n1", "0000:18:00.0", xid=79)
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="east", UUID="GPU-A"} == 79', bool)
    sync_both()
    east["text"] = ""  # GPU-A is pulled, repaired and back in west; GPU-B takes its slot later
    west["text"] = gpu_text("GPU-A", "w7", "0000:3b:00.0")
    wait_for(hub.url, 'DCGM_FI_DEV_XID_ERRORS{cluster="west", UUID="GPU-A"} == 0', bool)
    wait_silent(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="east", UUID="GPU-A"}', "3s")
    sync_both()
    time.sleep(1.5)
    east["text"] = gpu_text("GPU-B", "n1", "0000:18:00.0")
    wait_for(hub.url, 'DCGM_FI_DEV_GPU_TEMP{cluster="east", UUID="GPU-B"}', bool)
    sync_both()
    replaced, lemons = {}, {}
    for name, engine in engines.items():
        with engine.connect() as conn:
            replaced[name] = [e["details"]["new"]
                              for e in inv.list_events(conn, type_="replaced")]
        findings = jobs[name].findings()  # type: ignore[misc]
        lemons[name] = sorted(f["check"] for f in findings if f["check"].startswith("lemon"))
        engine.dispose()
    assert replaced == {"defaults": ["GPU-B"], "strict": []}
    assert lemons["defaults"] and lemons["strict"] == []


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("args", [
    ("inventory", "lemons", "--since", "0s"),
    ("inventory", "lemons", "--since", "20000d"),
    ("inventory", "lemons", "--by", "rack"),
    ("inventory", "lemons", "--by", "gpu,node"),
    ("inventory", "states", "--by", "cluster,team"),
    ("inventory", "states", "--by", "cluster,cluster"),
    ("sync", "--replaced-within", "0s"),
    ("sync", "--replaced-within", "400d"),
    ("report", "--lemon-threshold", "0"),
    ("report", "--lemon-threshold", "nan"),
    ("serve", "--replaced-within", "0s"),
    ("serve", "--replaced-within", "400d"),
    ("serve", "--lemon-threshold", "0"),
    ("serve", "--lemon-threshold", "nan"),
])
def test_out_of_range_is_one_line_and_exit_2(args, tmp_path):
    db = f"sqlite:///{tmp_path / 'inventory.db'}"
    engine = _db.make_engine(db, create=True)
    migrate.upgrade(engine)
    engine.dispose()
    result = gpufleet(*args, env={"GPUFLEET_DB": db, "GPUFLEET_HUB_URL": "http://127.0.0.1:9"})
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    flag = next(a for a in args if a.startswith("--"))
    assert flag in result.output


# -- schema and retention -------------------------------------------------------------------
def test_upgrade_gives_every_known_gpu_an_open_placement_and_prune_takes_it(db_url):
    engine = _db.make_engine(db_url, create=True)
    try:
        with engine.begin() as conn:
            command.upgrade(migrate._config(conn), "0020")
            conn.execute(sa.text(
                "INSERT INTO gpus (cluster, node, uuid, slice_key, vendor, state, pci_bus_id, "
                "first_seen, last_seen) VALUES ('c', 'n', 'GPU-old', '', 'nvidia', 'stale', "
                "'0000:18:00.0', '2026-01-01 00:00:00', '2026-01-02 00:00:00'), "
                "('c', 'n', 'AMD-1', '', 'amd', 'stale', NULL, "
                "'2026-01-01 00:00:00', '2026-01-02 00:00:00')"))
            conn.execute(sa.text("UPDATE gpus SET gpu_index = 3 WHERE uuid = 'AMD-1'"))
        assert migrate.upgrade(engine)[1] == migrate.head() == migrate.HEAD
        with engine.begin() as conn:
            assert [(p["slot"], p["until"]) for p in inv.gpu_placements(conn, "GPU-old")] == [
                ("0000:18:00.0", None)]
            assert [p["slot"] for p in inv.gpu_placements(conn, "AMD-1")] == ["index 3"]
            conn.execute(inv.events.insert().values(
                at=T0, type="health", cluster="c", node="n", uuid="GPU-old",
                details=json.dumps({"old": "ok", "new": "failed"})))
        result = inv.prune(engine, stale_for=86400, now=dt.datetime(2026, 3, 1))
        assert result.count("gpu") == 2
        with engine.connect() as conn:
            assert inv.gpu_placements(conn, "GPU-old") == []
            assert inv.gpu_health(conn, "GPU-old") == []
            assert [e["type"] for e in inv.list_events(conn, uuid="GPU-old")] == ["pruned"]
    finally:
        engine.dispose()


# -- the service: its API, its GPU page and a team's scope ------------------------------------
def _life_db(url: str) -> None:
    """team-a holds GPU-0 (east/n1), which failed; team-b held GPU-2 (east/n2), lost while
    allocated and replaced by GPU-3."""
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None) - 3 * HOUR
    allocated = {"GPU-0"}
    _sync(engine, now, {SLOTS[0]: "GPU-0", SLOTS[2]: "GPU-2"}, {}, allocated, 86400)
    with engine.begin() as conn:  # team-b's pod on GPU-2
        conn.execute(inv.allocations.insert().values(
            cluster="east", node="n2", uuid="GPU-2", slice_key="", namespace="team-b",
            pod="train", container="main", first_seen=now, last_seen=now))
    _sync(engine, now + HOUR, {SLOTS[0]: "GPU-0"}, {"GPU-0": "failed"}, allocated, 86400)
    _sync(engine, now + 2 * HOUR, {SLOTS[0]: "GPU-0", SLOTS[2]: "GPU-3"},
          {"GPU-0": "failed"}, allocated, 86400)
    engine.dispose()


def test_api_page_and_scope_show_the_same_life(tmp_path):
    import yaml

    from hub.service import Authenticator, TokenFile, token_entry
    from tests.support.asgi import page_client

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    _life_db(url)
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry("admin", "gpf_admin-token"),
        token_entry("team-a", "gpf_team-a-token", namespaces=["team-a"])]}))
    client = page_client(url, auth=Authenticator(tokens=TokenFile(tokens)))
    admin = {"Authorization": "Bearer gpf_admin-token"}
    team = {"Authorization": "Bearer gpf_team-a-token"}

    ranked = client.get("/api/v1/lemons", headers=admin).json()["items"]
    engine = _db.make_engine(url)
    with engine.connect() as conn:
        cli = inv.lemons(conn, since=inv.LEMON_SINCE_S, by="gpu", now=inv.now_utc())
    engine.dispose()
    assert [(r["uuid"], r["failures"]) for r in ranked] == [
        (r["uuid"], r["failures"]) for r in cli] and {r["uuid"] for r in cli} == {
        "GPU-0", "GPU-2"}
    lost = next(r for r in ranked if r["uuid"] == "GPU-2")
    assert (lost["replaced"], lost["stale_allocated"]) == (1, 1)
    assert any("team-b" in e["what"] for e in lost["evidence"])
    # team-a sees its own GPU's failures, not team-b's lemon by name
    mine = client.get("/api/v1/lemons", headers=team).json()["items"]
    assert [r["uuid"] for r in mine] == ["GPU-0"] and "team-b" not in json.dumps(mine)
    assert client.get("/api/v1/lemons", headers=team,
                      params={"by": "slot"}).json()["items"][0]["slot"] == SLOTS[0][2]
    assert client.get("/api/v1/lemons", headers=admin,
                      params={"by": "rack"}).status_code in (400, 422)

    whole = client.get("/api/v1/states", headers=admin).json()["items"]
    assert whole == [{"delivered": 3, "healthy": 1, "reserved": 1, "active": 1}]
    theirs = client.get("/api/v1/states", headers=team,
                        params={"by": "namespace"}).json()["items"]
    assert theirs == [{"namespace": "team-a", "delivered": 1, "healthy": 0, "reserved": 1,
                       "active": 1}]
    assert client.get("/api/v1/states", headers=admin,
                      params={"by": "team"}).status_code == 400

    history = client.get("/api/v1/gpus/GPU-2/history", headers=admin).json()
    assert [(p["node"], p["slot"]) for p in history["placements"]] == [("n2", SLOTS[2][2])]
    page = client.get("/gpus/GPU-0", headers=admin).text
    assert "Where it sat" in page and "Health history" in page and "failed" in page
    # the live page ranks as the API does; team-a's shows its own GPU only
    from tests.support.browser import Dom

    live = Dom(client.get("/", headers=admin).text)
    assert [r["uuid"] for r in live.table("lemons")] == [r["uuid"] for r in ranked]
    assert [r["delivered"] for r in live.table("states")] == ["3"]
    theirs_page = client.get("/", headers=team).text
    assert [r["uuid"] for r in Dom(theirs_page).table("lemons")] == ["GPU-0"]
    assert "team-b" not in theirs_page and "GPU-2" not in theirs_page


def test_a_finding_names_each_gpu_and_slot_past_the_lemon_threshold():
    from hub.validate._checks import check_lemons

    engine = _memory_engine()
    placed = {SLOTS[0]: "GPU-0"}
    _sync(engine, T0, placed, {}, set(), 86400)
    _sync(engine, T0 + HOUR, placed, {"GPU-0": "failed"}, set(), 86400)
    _sync(engine, T0 + 2 * HOUR, {SLOTS[0]: "GPU-1"}, {}, set(), 86400)
    now = T0 + 3 * HOUR
    with engine.connect() as conn:
        by_gpu = inv.lemons(conn, since=86400, by="gpu", now=now)
        by_slot = inv.lemons(conn, since=86400, by="slot", now=now)
    # two failures of GPU-0 over at least a day's service: 60 a GPU-month
    assert [(r["uuid"], r["failures"], r["per_gpu_month"]) for r in by_gpu] == [
        ("GPU-0", 2, 60.0)]
    found = sorted((f.check, f.gpu, f.node) for f in check_lemons(by_gpu, by_slot, 59))
    assert found == [("lemon_gpu", "GPU-0", "n1"), ("lemon_slot", None, "n1")]
    assert check_lemons(by_gpu, by_slot, 60) == []  # past, not at, the threshold
    engine.dispose()
