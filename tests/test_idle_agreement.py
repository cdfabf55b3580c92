"""One idle answer: `usage`'s idle GPU-hours, the `idle` list, the report's
idle_allocated_gpu findings and usage section (through the CLI) and the live page (through the
real service) all read hub.usage.idle_runs over the same period, so on one ledger they agree.

The ledger holds the cases that made them disagree: an idle run long enough to list, one too
short (counted nowhere), a pod whose first bucket had no samples (its run starts at the first
bucket with samples), an unknown utilisation (not idle), a MIG slice at its share, and GPU
time before a pod held the GPU (unallocated, never idle).
"""

from __future__ import annotations

import datetime as dt
import json

import requests

from hub import usage
from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._sync import SyncResult
from hub.inventory._writer import apply_observations
from hub.service import USAGE_SECTIONS, Jobs, build_service, read_only_engine
from hub.usage import write_bucket
from tests.support.browser import Dom
from tests.support.clirun import gpufleet, gpufleet_json

HOUR = dt.timedelta(hours=1)
MIG_SHARE = 3 / 7

#: (uuid, slice, namespace, pod, share, [(hours ago, gpu_hours per share, utilisation)])
LEDGER = [
    ("GPU-busy", "", "team-a", "train-0", 1.0, [(h, 1.0, 90.0) for h in (6, 5, 4, 3, 2, 1)]),
    # idle 3 h in a row, then busy: one run of 3 h
    ("GPU-idle", "", "team-b", "notebook", 1.0,
     [(6, 1.0, 0.0), (5, 1.0, 1.0), (4, 1.0, 4.0), (3, 1.0, 50.0), (2, 1.0, 0.0)]),
    # idle 1 h only: not a run of 2 h, so idle nowhere
    ("GPU-short", "", "team-c", "blip", 1.0, [(3, 1.0, 0.0), (2, 1.0, 70.0)]),
    # the pod's first bucket had no samples (coverage 0): the run starts an hour later
    ("GPU-late", "", "team-d", "late", 1.0,
     [(4, 0.0, None), (3, 0.5, 0.0), (2, 1.0, 0.0), (1, 1.0, 2.0)]),
    # utilisation unknown: not evidence of idleness
    ("GPU-unknown", "", "team-e", "mystery", 1.0, [(h, 1.0, None) for h in (4, 3, 2, 1)]),
    # a MIG slice idle 3 h at its share of the GPU
    ("GPU-mig", "MIG-3g.40gb-1", "team-b", "small", MIG_SHARE,
     [(h, 1.0, 0.0) for h in (3, 2, 1)]),
    # unallocated and idle: no pod, so not allocated idle time
    ("GPU-free", "", "", "", 1.0, [(h, 1.0, 0.0) for h in (6, 5, 4, 3, 2, 1)]),
]
#: what the rule (under 5 % for 2 h or more) must find: namespace -> wasted GPU-hours
EXPECTED = {"team-b": 3.0 + 3 * MIG_SHARE, "team-d": 2.5}


def _ledger(url: str, now: dt.datetime) -> None:
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    buckets: dict[int, list[dict]] = {}
    for uuid, slice_, ns, pod, share, hours in LEDGER:
        for ago, covered, util in hours:
            start = now - ago * HOUR
            buckets.setdefault(ago, []).append({
                "cluster": "c1", "node": "n1", "uuid": uuid, "slice": slice_, "namespace": ns,
                "pod": pod, "bucket_start": start, "bucket_end": start + HOUR,
                "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "gpu_share": share,
                "gpu_hours": share * covered, "avg_utilisation_pct": util,
                "max_utilisation_pct": util, "avg_memory_used_mib": 1000.0,
                "max_memory_used_mib": 1000.0, "avg_power_w": 300.0,
                "energy_wh": 300.0 * share * covered, "coverage": covered})
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("c1", "n1", uuid, "nvidia", index=i, model="NVIDIA H100 80GB HBM3",
                        allocations={(ns, pod, "main")} if pod else set())
            for i, (uuid, _s, ns, pod, _sh, _h) in enumerate(LEDGER) if not _s], now)
        for ago, rows in buckets.items():
            start = now - ago * HOUR
            write_bucket(conn, start.replace(tzinfo=dt.UTC).timestamp(), 3600.0, rows, 14)
    engine.dispose()


def _page_rows(html: str, table_id: str) -> list[dict[str, str]]:
    return Dom(html).table(table_id)


def _by_namespace(rows: list[dict], figure: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        if r[figure]:
            out[r["namespace"]] = round(out.get(r["namespace"], 0.0) + r[figure], 6)
    return out


def test_every_idle_answer_is_the_same(tmp_path):
    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    _ledger(url, now)
    expected = {ns: round(v, 6) for ns, v in EXPECTED.items()}

    # the one function
    engine = _db.make_engine(url)
    with engine.connect() as conn:
        runs = usage.idle_runs(conn, now - 24 * HOUR, now)
    engine.dispose()
    assert _by_namespace(runs, "wasted_gpu_hours") == expected
    late = next(r for r in runs if r["pod"] == "late")
    assert late["idle_since"] == now - 3 * HOUR  # the first bucket with the pod's samples
    assert late["idle_hours"] == 3.0

    # `gpufleet usage` and `gpufleet idle`
    used = gpufleet_json("usage", "--since", "24h", "--by", "namespace", "--db", url)
    assert _by_namespace(used, "idle_allocated_gpu_hours") == expected
    listed = gpufleet_json("idle", "--since", "24h", "--db", url)
    assert _by_namespace(listed, "wasted_gpu_hours") == expected
    assert {r["pod"] for r in listed} == {"notebook", "small", "late"}
    late_cli = next(r for r in listed if r["pod"] == "late")
    assert late_cli["idle_since"].startswith((now - 3 * HOUR).isoformat())

    # `gpufleet report`: the findings and its usage section
    result = gpufleet("report", "--db", url, "-o", "json")
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout)
    found = sorted(f["gpu"] for f in report["findings"] if f["check"] == "idle_allocated_gpu")
    assert found == sorted(r["uuid"] + (f" {r['slice']}" if r["slice"] else "")
                           for r in listed)
    assert _by_namespace(report["usage"]["idle"], "wasted_gpu_hours") == expected
    assert _by_namespace(report["usage"]["by_namespace"],
                         "idle_allocated_gpu_hours") == expected

    # the live page, through the real service
    def no_sync() -> SyncResult:  # the ledger is already written; nothing to ask a hub
        return SyncResult(now, now, 0, 1, 1, len(LEDGER))

    service = build_service(Jobs(sync=no_sync), every=3600.0,
                            engine=read_only_engine(url), process_metrics=False,
                            page_sections=USAGE_SECTIONS).start()
    try:
        page = requests.get(service.url + "/", timeout=10)
        assert page.status_code == 200
        idle_rows = _page_rows(page.text, "idle")
        assert sorted(r["pod"] for r in idle_rows) == sorted(r["pod"] for r in listed)
        total = round(sum(expected.values()), 2)
        assert f"{total:g} idle GPU-hours" in page.text
        page_usage = {r["namespace"]: float(r["idle_allocated_gpu_hours"])
                      for r in _page_rows(page.text, "usage")
                      if float(r["idle_allocated_gpu_hours"])}
        assert page_usage == {ns: round(v, 2) for ns, v in expected.items()}
        api = requests.get(service.url + "/api/v1/usage?by=namespace&since=24h",
                           timeout=10).json()["items"]
        assert _by_namespace(api, "idle_allocated_gpu_hours") == expected
    finally:
        service.stop()


def test_serve_takes_the_idle_rule_and_every_surface_answers_with_it(tmp_path):
    """GPUFLEET_IDLE_FOR reaches `serve` as it reaches the CLI: its page, /api/v1/usage and
    /api/v1/idle answer with the rule `usage` and `idle` use, and /api/v1/usage takes
    idle_for as /api/v1/idle takes for (a 1 h rule lists the 1 h blip the 2 h default
    does not)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from hub.devstack import free_port

    url = f"sqlite:///{tmp_path / 'inv.db'}"
    now = _db.now_utc().replace(minute=0, second=0, microsecond=0)
    _ledger(url, now)
    env = {**os.environ, "GPUFLEET_IDLE_FOR": "1h", "GPUFLEET_IDLE_THRESHOLD": "5"}
    listed = gpufleet_json("idle", "--since", "24h", "--db", url, env=env)
    assert "blip" in {r["pod"] for r in listed}  # the rule changed the answer
    used = _by_namespace(gpufleet_json("usage", "--since", "24h", "--db", url, env=env),
                         "idle_allocated_gpu_hours")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hub", "serve", "--db", url, "--every", "1h",
         "--hub-url", f"http://127.0.0.1:{free_port()}", "--listen", f"127.0.0.1:{port}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                page = requests.get(base + "/", timeout=5)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert page.status_code == 200
        assert sorted(r["pod"] for r in _page_rows(page.text, "idle")) == sorted(
            r["pod"] for r in listed)
        assert "for 1h or more" in page.text
        api_usage = requests.get(base + "/api/v1/usage?since=24h", timeout=10).json()["items"]
        assert _by_namespace(api_usage, "idle_allocated_gpu_hours") == used
        api_idle = requests.get(base + "/api/v1/idle?since=24h", timeout=10).json()["items"]
        assert sorted(r["pod"] for r in api_idle) == sorted(r["pod"] for r in listed)
        # the same parameters on both: usage?idle_for= agrees with idle?for=
        two_h_usage = requests.get(base + "/api/v1/usage?since=24h&idle_for=2h&"
                                   "idle_threshold=5", timeout=10)
        assert two_h_usage.status_code == 200, two_h_usage.text
        two_h_idle = requests.get(base + "/api/v1/idle?since=24h&for=2h&threshold=5",
                                  timeout=10).json()["items"]
        assert _by_namespace(two_h_usage.json()["items"], "idle_allocated_gpu_hours") == \
            _by_namespace(two_h_idle, "wasted_gpu_hours") == {
                ns: round(v, 6) for ns, v in EXPECTED.items()}
        assert requests.get(base + "/api/v1/usage?idle_for=soon", timeout=10
                            ).status_code == 400
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
