"""`gpufleet demo`: the layout as plain data, and the real run as a user starts it."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub import inventory as inv
from hub.devstack import _demo as demo
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from tests.support.clirun import gpufleet, gpufleet_json

ROOT = Path(__file__).resolve().parents[1]


def test_plan_mixes_vendors_has_one_mig_node_and_one_mismatch():
    p = demo.plan(3, 4, 8)
    assert len(p.nodes) == 14 and p.silent == "research"
    assert p.shared is not None and (p.shared.name, p.shared.gpus, p.shared.replicas) == (
        "prod-east-ts-01", 1, 2)  # one GPU, time-sliced into two replicas
    assert [(n.name, n.vendor) for n in p.nodes if n.dra] == [("prod-east-dra-01", "nvidia")]
    assert {n.vendor for n in p.nodes} == {"nvidia", "amd"}
    assert [n.name for n in p.nodes if n.mig] == ["prod-east-gpu-01"]
    off = [n for n in p.nodes if n.gpus != n.advertised]
    assert len(off) == 1 and off[0].advertised - off[0].gpus == 1
    faulty = [n for n in p.nodes if n.faults]
    assert len(faulty) == 1 and faulty[0].faults == ("6:xid=79",)  # its last GPU
    assert faulty[0].vendor == "nvidia" and faulty[0].cluster != p.silent


def test_node_list_is_what_kubectl_get_nodes_prints():
    p = demo.plan(2, 3, 4)
    listing = demo.node_list(p, "prod-east")
    assert listing["kind"] == "List" and len(listing["items"]) == 5  # DRA, time-sliced too
    by_name = {n["metadata"]["name"]: n for n in listing["items"]}
    sliced = by_name["prod-east-ts-01"]  # as the device plugin's time-slicing advertises it
    assert sliced["status"]["capacity"]["nvidia.com/gpu"] == "2"
    assert sliced["metadata"]["labels"]["nvidia.com/gpu.replicas"] == "2"
    assert sliced["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    mig = by_name["prod-east-gpu-01"]
    assert mig["metadata"]["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert mig["status"]["capacity"]["nvidia.com/mig-3g.40gb"] == "8"  # 4 GPUs × 2 slices
    amd = next(n for n in p.nodes if n.cluster == "prod-east" and n.vendor == "amd")
    assert by_name[amd.name]["status"]["capacity"]["amd.com/gpu"] == "4"
    dra = by_name["prod-east-dra-01"]["status"]["capacity"]
    assert not any(k.startswith("nvidia.com/") for k in dra)  # its GPUs are in a slice
    [published] = demo.resource_slices(p, "prod-east")["items"]
    assert published["spec"]["nodeName"] == "prod-east-dra-01"
    assert len(published["spec"]["devices"]) == 4
    assert demo.resource_slices(p, "prod-west")["items"] == []


def test_workdir_that_the_demo_did_not_make_is_never_emptied(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(demo.InputError, match="not made by the demo"):
        demo.prepare_workdir(tmp_path)
    assert (tmp_path / "precious.txt").exists()


def leftovers(workdir: Path) -> list[str]:
    """Processes whose command line mentions the workdir (Prometheus hub and agents)."""
    out = subprocess.run(["pgrep", "-af", str(workdir)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def run_demo(workdir: Path, *args: str, **kwargs) -> subprocess.Popen[str]:
    if "--hub-port" not in args:  # tests run side by side: never the fixed default port
        args = (*args, "--hub-port", "0")
    return subprocess.Popen(
        [sys.executable, "-m", "hub", "demo", "--clusters", "2", "--nodes", "2",
         "--gpus-per-node", "2", "--workdir", str(workdir), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"}, **kwargs)


def test_demo_runs_end_to_end_twice_and_leaves_nothing_running(tmp_path):
    from hub.devstack import free_port

    workdir = tmp_path / "demo"
    port = free_port()
    for _ in range(2):  # a second run in the same workdir works, on the same hub port
        proc = run_demo(workdir, "--hub-port", str(port))
        out, err = proc.communicate(timeout=150)
        assert proc.returncode == 0, err
        assert leftovers(workdir) == []
    # the report tells the demo's story: only the silenced cluster is past its max age (the
    # report runs right after a sync, with a max age that fits the demo's cadence)
    html = (workdir / "report.html").read_text()
    red = re.findall(r'<g class="row" data-cluster="([^"]+)">\s*<text[^>]*>[^<]*<title>[^<]*'
                     r'</title></text>\s*<rect class="bar error"', html)
    assert red == ["prod-west"], html
    # one count line: the console's is the page's, pluralised alike
    [said] = re.findall(r"> report: (.*)", err)
    assert re.fullmatch(r"\d+ errors?, \d+ warnings?, \d+ info", said), said
    assert f"<span>{said}</span>" in html
    # "try next" names the hub that `demo --keep-running --hub-port` serves next, and says
    # this run's hub stopped
    assert f"http://127.0.0.1:{port}) stopped with it" in out
    assert f"demo --keep-running --hub-port {port}" in out
    assert f"--hub-url http://127.0.0.1:{port}" in out
    # progress bars are for terminals: piped, the output holds the story only
    assert "starting the fleet" not in err and "━" not in err and not err.startswith("\n")
    assert f"HTML report         {workdir / 'report.html'}" in out
    assert "End-to-end freshness" in out
    assert "prod-west goes silent" in err
    assert "XID 79 on GPU" not in err  # the exporters' log is exporters.log, not the story
    assert "XID 79 on GPU" in (workdir / "exporters.log").read_text()
    assert "count_mismatch" in err  # the deliberate mismatch is found
    assert "prod-east/prod-east-ts-01: time-sliced node matched (k8s 2 = 1 × 2 replicas " \
        "(time-slicing))" in err
    assert "prod-east/prod-east-dra-01: DRA node matched (k8s publishes 2 GPUs through DRA" \
        in err
    assert "<html" in html.lower() and "prod-west" in html
    db = f"sqlite:///{workdir / 'inventory.db'}"
    clusters = {c["cluster"]: c for c in gpufleet_json("inventory", "clusters", "--db", db)}
    assert clusters["prod-west"]["state"] == "stale"
    assert clusters["prod-east"]["state"] == "active" and clusters["prod-east"]["gpus"] == 6
    failed = [g for g in gpufleet_json("inventory", "gpus", "--db", db)
              if g["health"] == "failed"]
    assert [(g["health_reasons"], g["node"]) for g in failed] == [("xid 79", "prod-east-gpu-02")]
    # the usage ledger: the simulated notebook holds a GPU and does nothing
    assert "GPU-hours over the last hour, by namespace:" in err
    assert "capacity --by model:" in err
    idle = gpufleet_json("idle", "--since", "1h", "--for", "12s", "--db", db)
    assert [(i["namespace"], i["pod"]) for i in idle] == [("research", "notebook-idle")]
    assert "research" in html and 'id="gpu-hours-by-day"' in html
    # one idle answer: the console's idle list is the HTML report's, and the suggested
    # command (printed with its flags) lists the same GPU
    assert "notebook-idle" in err.split("idle (allocated")[1].split("capacity --by")[0]
    assert "notebook-idle" in html and "No idle allocated" not in html
    # metered allocation: kube-state-metrics gives the training pod's own edges, so its
    # namespace's hours are measured by interval, not by the samples that carried its labels
    by_ns = {r["namespace"]: r for r in gpufleet_json("usage", "--since", "1h", "--by",
                                                      "namespace", "--db", db)}
    assert by_ns["ml-team"]["allocation_basis"] == "interval", by_ns
    assert by_ns["research"]["allocation_basis"] == "sampled", by_ns
    # the time-sliced GPU: two teams' pods at once, each charged half of its hours, said in
    # the story and in "try next" (`inventory gpu UUID` lists both pods and their usage)
    [shared] = re.findall(r"> time-sliced GPU (GPU-\S+) on prod-east-ts-01 \(2 replicas\): "
                          r"inference-a/chat-0 \S+ \((\d+)%\), inference-b/embed-0 \S+ "
                          r"\((\d+)%\)", err)
    assert 45 <= int(shared[1]) <= 50 and 45 <= int(shared[2]) <= 50, shared
    assert f"inventory gpu {shared[0]} --db {db}" in out
    assert by_ns["inference-a"]["gpu_hours"] == by_ns["inference-b"]["gpu_hours"] > 0
    gpu = gpufleet_json("inventory", "gpu", shared[0], "--db", db)
    assert sorted((a["namespace"], a["pod"]) for a in gpu["allocations"]) == [
        ("inference-a", "chat-0"), ("inference-b", "embed-0")]
    [suggested] = [line for line in out.splitlines() if " idle --since 1h" in line]
    assert "--for 12s" in suggested
    # one bucket grid end to end
    engine = sa.create_engine(db)
    with engine.connect() as conn:
        sizes = conn.execute(sa.text("SELECT DISTINCT bucket_start, bucket_end FROM usage"
                                     )).all()
    engine.dispose()
    assert sizes and {(dt.datetime.fromisoformat(str(e)) - dt.datetime.fromisoformat(str(b))
                       ).total_seconds() for b, e in sizes} == {12.0}


def test_demo_with_the_acm_hub_profile(tmp_path):
    """Sparse pushes without staleness markers and a long look-back: the silent cluster still
    turns stale, the reporting one stays active."""
    workdir = tmp_path / "demo"
    proc = run_demo(workdir, "--acm-profile")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert leftovers(workdir) == []
    assert "ACM-like collector pushing every" in err and "look-back" in err
    assert "prod-west goes silent (its collector stopped)" in err
    db = f"sqlite:///{workdir / 'inventory.db'}"
    clusters = {c["cluster"]: c for c in gpufleet_json("inventory", "clusters", "--db", db)}
    assert clusters["prod-west"]["state"] == "stale"
    assert clusters["prod-east"]["state"] == "active" and clusters["prod-east"]["gpus"] == 6


def test_ctrl_c_stops_every_process(tmp_path):
    from hub.devstack import free_port

    workdir = tmp_path / "demo"
    port = free_port()
    proc = run_demo(workdir, "--keep-running", "--hub-port", str(port))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(leftovers(workdir)) < 3:
        time.sleep(0.2)  # hub + two agents are up
    assert len(leftovers(workdir)) >= 3
    # --keep-running serves its hub on the port the previous run's "try next" named
    assert any(f"--web.listen-address=127.0.0.1:{port}" in line
               for line in leftovers(workdir))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert leftovers(workdir) == []


def test_suggested_commands_work_in_a_new_shell(tmp_path):
    """`make demo` runs .venv/bin/gpufleet without activating: the printed commands must not
    assume gpufleet is on PATH."""
    from hub.devstack import gpufleet_command

    g = gpufleet_command()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PATH"] = "/usr/bin:/bin"  # a new shell without the virtual environment
    proc = subprocess.run(f"{g} --version", shell=True, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "gpufleet" in proc.stdout, proc.stderr


def test_keep_running_keeps_syncing(hub, fleet, tmp_path):
    from hub.devstack import DEMO_BUCKET, keep_syncing
    from hub.store import HubClient
    from tests.support.promql import wait_for
    from tests.support.samples import sample_text

    fleet("east", [sample_text("dcgm-t4-loaded-ericsson-ccd.prom")])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_UTIL)", lambda r: bool(r))
    db = f"sqlite:///{tmp_path / 'inventory.db'}"
    assert gpufleet("sync", "--hub-url", hub.url, "--db", db).exit_code == 0
    said: list[str] = []
    with HubClient(hub.url) as client:
        assert keep_syncing(db, client, said.append, every=0.0, rounds=2) == 2
        assert len(said) == 2 and all(s.startswith("sync: 1 clusters reporting")
                                      for s in said)
        runs = gpufleet_json("inventory", "sync-runs", "--db", db)
        assert [r["status"] for r in runs] == ["ok", "ok", "ok"]
        # and, as serve does, each round collects the usage buckets that ended: wait (one
        # round a second) until a bucket of the demo's grid has ended and been collected
        deadline = time.monotonic() + 3 * DEMO_BUCKET + 10
        while (not gpufleet_json("usage", "--since", "1h", "--db", db)
               and time.monotonic() < deadline):
            keep_syncing(db, client, said.append, every=1.0, rounds=1)
    used = gpufleet_json("usage", "--since", "1h", "--by", "cluster", "--db", db)
    assert [r["cluster"] for r in used] == ["east"] and used[0]["gpu_hours"] > 0
    assert any(re.search(r"; usage: [1-9]\d* buckets of 12s collected", s) for s in said), said


def test_one_reporting_cluster_sends_dcgm_47_names_beside_legacy_ones():
    """The mixed fleet of an upgrade in progress: prod-west's NVIDIA exporters speak
    dcgm-exporter 4.9 (DCGM 4.7 names and units), the rest the legacy names."""
    p = demo.plan(3, 4, 8, dcgm_47=True)
    modern = [n for n in p.nodes if n.naming == "dcgm-4.7"]
    assert {n.cluster for n in modern} == {"prod-west"} and p.silent != "prod-west"
    assert all(n.vendor == "nvidia" for n in modern)
    assert any(n.naming == "legacy" and n.vendor == "nvidia" for n in p.nodes)
    text = demo.node_exporter(modern[0]).collect_once().text.decode()
    assert text.count("DCGM_FI_DEV_GPU_UTIL_RATIO{") == 8
    assert "DCGM_FI_DEV_FB_CAPACITY_BYTES{" in text and 'DCGM_FI_SYSTEM_DRIVER_VERSION="' in text
    assert "DCGM_FI_DEV_GPU_UTIL{" not in text and "DCGM_FI_DRIVER_VERSION" not in text
    legacy = next(n for n in p.nodes if n.naming == "legacy" and n.vendor == "nvidia")
    assert "DCGM_FI_DEV_GPU_TEMP{" in demo.node_exporter(legacy).collect_once().text.decode()
    # by default the demo runs that cluster once the hub reads 4.7 names (issue 26, hub side)
    assert any(n.naming == "dcgm-4.7" for n in demo.plan(3, 4, 8).nodes) == (
        demo.hub_reads_dcgm_47())


def test_the_idle_notebook_gpu_looks_idle_to_a_gpu_engineer():
    """Issue 30: the demo's idle notebook drew 627 W at 99 °C with its SMs 47-82 % active."""
    p = demo.plan(3, 4, 8, dcgm_47=False)
    assert p.attributed is not None
    exporter = demo.node_exporter(p.attributed, attributed=True)
    exporter.collect_once()  # GPM needs two samples
    for marked in (False, True):  # the freshness probe's mark keeps it plausible
        if marked:
            exporter.backend.mark()
        samples = {s.name: s.value for f in exporter.collect_once().families for s in f.samples
                   if s.labels.get("gpu") == "0"}
        assert samples["DCGM_FI_DEV_GPU_UTIL"] == 0
        assert 60 <= samples["DCGM_FI_DEV_POWER_USAGE"] <= 90
        assert 30 <= samples["DCGM_FI_DEV_GPU_TEMP"] <= 40
        assert samples["DCGM_FI_PROF_SM_ACTIVE"] == samples["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == 0


def test_the_time_sliced_gpu_is_busy_whenever_its_two_pods_are_looked_at():
    """Its two services keep it in use: the idle list is the notebook's alone, whenever the
    demo runs (the simulator's load is a slow wave; this GPU's never falls under 40 %)."""
    p = demo.plan(2, 2, 2, dcgm_47=False)
    assert p.shared is not None
    backend = demo.node_backend(p.shared, clock=iter(range(0, 600, 5)).__next__)  # 2 waves
    backend.open()
    utils = [backend.collect().readings[0].util_pct for _ in range(120)]
    assert min(utils) >= 40 and max(utils) > 90


def test_the_demo_waits_for_a_ledger_row_of_every_active_gpu(tmp_path):
    """The demo's usage step collects until every GPU the inventory has active is metered:
    the first bucket with rows alone once missed the idle notebook's spoke under load, and the
    idle list the demo shows came out empty."""
    engine = inv.make_engine(f"sqlite:///{tmp_path / 'inventory.db'}", create=True)
    migrate.ensure_schema(engine)
    t0 = dt.datetime(2026, 3, 1, 12, 0)
    with engine.begin() as conn:
        apply_observations(conn, [Observation("east", "e1", u, "nvidia", sample_at=1e9)
                                      for u in ("GPU-a", "GPU-b", "GPU-gone")], t0)
        apply_observations(conn, [Observation("east", "e1", u, "nvidia", sample_at=1e9)
                                      for u in ("GPU-a", "GPU-b")], t0 + dt.timedelta(minutes=5))
    assert demo._unmetered(engine) == 2  # the stale GPU-gone is not waited for

    def metered(uuid: str) -> None:
        with engine.begin() as conn:
            inv.write_usage_rows(conn, [dict(
                bucket_start=t0, cluster="east", node="e1", uuid=uuid, slice="", namespace="",
                pod="", vendor="nvidia", model=None, gpu_share=1.0, gpu_hours=12 / 3600,
                coverage=1.0)])
            inv.upsert(conn, inv.usage_buckets, [dict(
                bucket_start=t0, bucket_end=t0 + dt.timedelta(seconds=12), collected_at=t0,
                rows=1, requests=0)], update=("rows",))

    metered("GPU-a")
    assert demo._unmetered(engine) == 1
    metered("GPU-b")
    assert demo._unmetered(engine) == 0
    engine.dispose()


def test_a_gpus_xid_is_logged_to_a_file_not_the_demos_story(tmp_path, capfd):
    """Issue 37: the failed GPU's exporter printed a stray `XID 79 on GPU ...` mid-story;
    the report tells it (health failed, replace the GPU), the line goes to exporters.log."""
    p = demo.plan(3, 4, 8, dcgm_47=False)
    [faulty] = [n for n in p.nodes if n.faults]
    log = tmp_path / "exporters.log"
    with demo.exporter_log(log):
        exporter = demo.node_exporter(faulty)
        for _ in range(3):
            exporter.collect_once()
    assert "XID" not in capfd.readouterr().err
    assert re.search(r"WARNING spoke\.\S+: XID 79 on GPU GPU-", log.read_text())


def test_sigterm_while_the_fleet_starts_leaves_no_prometheus(tmp_path):
    """Issue 37: SIGTERM just after the first cluster's agent started left another agent
    Prometheus running (a signal between its fork and the demo holding it), 2 tries in 6."""
    for attempt in range(3):
        workdir = tmp_path / f"demo-{attempt}"
        proc = run_demo(workdir, "--clusters", "3")
        assert proc.stderr is not None
        for line in proc.stderr:
            if re.match(r"> cluster \S+: \d+ nodes", line):
                time.sleep(0.01 * attempt)  # just after, at a few points of the next start
                proc.send_signal(signal.SIGTERM)
                break
        else:
            pytest.fail(f"the demo never started a cluster: {proc.communicate()}")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert leftovers(workdir) == []
