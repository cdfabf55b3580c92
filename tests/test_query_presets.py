"""`gpufleet query --preset gpus-per-cluster`: the one naming-neutral answer to "how many GPUs
report per cluster" the docs and the demo give, against a real Prometheus holding a cluster of
legacy dcgm names, one of dcgm-4.7 names (one GPU mid-upgrade sending both), an AMD cluster
(both spellings), and a cluster silent for longer than the freshness threshold."""

from __future__ import annotations

import json
import time

import requests

from hub.store import gpus_per_cluster_query
from tests.support.backfill import backfilled_hub, openmetrics
from tests.support.clirun import gpufleet


def _series(now: float) -> list:
    def up(t: float) -> float:
        return 40.0

    def until_12m_ago(t: float) -> float | None:
        return 40.0 if t <= now - 720 else None

    legacy = [("DCGM_FI_DEV_GPU_UTIL", 'cluster="legacy",UUID="GPU-A",Hostname="n1"', up),
              # a MIG GPU: two slices of one physical GPU count once
              ("DCGM_FI_DEV_GPU_UTIL", 'cluster="legacy",UUID="GPU-B",Hostname="n1",'
               'GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"', up),
              ("DCGM_FI_DEV_GPU_UTIL", 'cluster="legacy",UUID="GPU-B",Hostname="n1",'
               'GPU_I_PROFILE="3g.40gb",GPU_I_ID="2"', up)]
    new = [("DCGM_FI_DEV_GPU_UTIL_RATIO", 'cluster="dcgm47",UUID="GPU-C",Hostname="n2"', up),
           ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 'cluster="dcgm47",UUID="GPU-D",Hostname="n2"', up),
           # mid-upgrade: GPU-C also sends its legacy name; it is still one GPU
           ("DCGM_FI_DEV_GPU_TEMP", 'cluster="dcgm47",UUID="GPU-C",Hostname="n2"', up)]
    amd = [("gpu_gfx_activity", 'cluster="amd",gpu_id="0",hostname="n3"', up),
           ("amd_gpu_edge_temperature", 'cluster="amd",gpu_id="1",hostname="n3"', up)]
    silent = [("DCGM_FI_DEV_GPU_UTIL", 'cluster="silent",UUID="GPU-S",Hostname="n4"',
               until_12m_ago)]
    return legacy + new + amd + silent


def test_gpus_per_cluster_counts_every_naming_and_drops_a_silent_cluster(tmp_path):
    at = (time.time() // 60) * 60 - 7200  # backfilled blocks, asked at their own time
    hub = backfilled_hub(tmp_path / "hub", openmetrics(
        _series(at), [at - 60 * k for k in range(20, -1, -1)])).start(timeout=120)
    try:
        def ask(promql: str) -> dict[str, float]:
            res = requests.get(f"{hub.url}/api/v1/query",
                               params={"query": promql, "time": at}, timeout=30).json()
            assert res["status"] == "success", res
            return {r["metric"]["cluster"]: float(r["value"][1])
                    for r in res["data"]["result"]}

        assert ask(gpus_per_cluster_query("10m", "cluster")) == {
            "legacy": 2, "dcgm47": 2, "amd": 2}  # "silent" sent its last sample 12m ago
        assert ask(gpus_per_cluster_query("15m", "cluster"))["silent"] == 1
        # what the docs asked before: the 4.7-named and AMD clusters are missing, and the
        # silent cluster would still count within Prometheus' look-back
        assert set(ask("count by (cluster) (DCGM_FI_DEV_GPU_UTIL)")) == {"legacy"}
        cli = gpufleet("query", "--preset", "gpus-per-cluster", "--hub-url", hub.url,
                       "-o", "json")
        assert cli.exit_code == 0, cli.output
        assert json.loads(cli.stdout) == []  # now, two hours after the samples: none report
    finally:
        hub.stop()


def test_a_preset_and_an_expression_exclude_each_other():
    for args in ([], ["up", "--preset", "gpus-per-cluster"]):
        out = gpufleet("query", *args, "--hub-url", "http://127.0.0.1:9")
        assert out.exit_code == 2 and "give a PromQL EXPR or --preset NAME" in out.output
        assert len(out.output.strip().splitlines()) == 1
    out = gpufleet("query", "--preset", "gpus-per-day", "--hub-url", "http://127.0.0.1:9")
    assert out.exit_code == 2 and "gpus-per-day" in out.output


def test_the_docs_and_the_demo_ask_with_the_preset_not_one_naming():
    from pathlib import Path

    from hub.commands.demo import query_lines

    lines = query_lines("gpufleet", "http://127.0.0.1:19090")
    assert all("--preset gpus-per-cluster" in line and "DCGM_" not in line for line in lines)
    repo = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/onboarding.md", "docs/operations.md", "docs/usage.md"):
        text = (repo / doc).read_text()
        assert "count by (cluster) (DCGM_FI_DEV_GPU_UTIL)'" not in text, doc
        assert "gpus-per-cluster" in text, doc
