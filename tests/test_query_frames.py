"""prometheus-api-client where it fits: `gpufleet query --range -o csv` writes its
MetricRangeDataFrame, and `hub.store.prometheus_connect()` gives a notebook a
PrometheusConnect that carries gpufleet's hub auth. Against the real test hub, behind a
token-checking front like ACM's rbac-query-proxy."""

from __future__ import annotations

import csv
import datetime as dt
import io
import time

import pytest

from hub.common import InputError
from hub.store import prometheus_connect, range_frame
from tests.support.clirun import gpufleet
from tests.support.httpstub import Request, Response, StubServer, forward
from tests.support.promql import wait_for
from tests.support.samples import sample_text

TOKEN = "sha256~n0tebook-t0ken"


@pytest.fixture
def guarded_hub(hub, fleet):
    """The hub with two clusters' GPUs, reachable only with the bearer token."""
    fleet("east", [sample_text("dcgm-h100-8gpu-aicr-eks-156a357e.prom")])
    fleet("west", [sample_text("dcgm-l40s-upcloud-uks.prom")])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_TEMP)",
             lambda r: bool(r) and r[0]["value"][1] == "9")

    def check(req: Request) -> Response:
        if req.headers.get("Authorization") != f"Bearer {TOKEN}":
            return Response(401, b'{"status":"error","error":"unauthorized"}')
        return forward(hub.url, req)

    front = StubServer(check)
    yield front
    front.stop()


def test_query_range_csv_is_the_metric_range_dataframe(guarded_hub, tmp_path):
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {"GPUFLEET_HUB_URL": guarded_hub.url, "GPUFLEET_TOKEN_FILE": str(token)}
    result = gpufleet("query", "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)", "--range", "1m",
                      "--step", "1s", "-o", "csv", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "cluster,time,value"
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert {r["cluster"] for r in rows} == {"east", "west"}
    assert {float(r["value"]) for r in rows if r["cluster"] == "east"} == {8.0}
    assert all(r["time"].endswith("Z") and "T" in r["time"] for r in rows)
    assert TOKEN not in result.output


def test_prometheus_connect_carries_the_hub_auth_from_the_environment(
        guarded_hub, tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    monkeypatch.setenv("GPUFLEET_HUB_URL", guarded_hub.url)
    monkeypatch.setenv("GPUFLEET_TOKEN_FILE", str(token))
    prom = prometheus_connect()
    # Counted over last_over_time, which passes over staleness markers: under a full run's load
    # a scrape can miss its 1 s timeout, and the agent then marks that exporter's series stale
    # until its next scrape (CI once saw 8 of the 9 here). What is checked is the client's
    # auth and answer shape, not the agents' scrape timing.
    answer = prom.custom_query("count by (cluster) (last_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))")
    assert {r["metric"]["cluster"]: r["value"][1] for r in answer} == {"east": "8",
                                                                        "west": "1"}
    assert guarded_hub.seen[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    # the DataFrame a notebook wants, from the same answer shape the CLI writes
    # The client rounds both ends to whole seconds, which can put `end` up to half a second
    # before the newest first sample seen above; a second ahead keeps it after all of them.
    end = time.time() + 1
    matrix = prom.custom_query_range("count(last_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))",
                                     start_time=_dt(end - 30), end_time=_dt(end), step="5")
    frame = range_frame(matrix)
    # The agents started moments ago, so the range may hold a single point; its newest one,
    # at `end`, is after the nine were all seen above.
    assert list(frame.columns) == ["time", "value"] and frame["value"].iloc[-1] == 9.0
    assert frame["time"].is_monotonic_increasing and frame["time"].iloc[-1].endswith("Z")


def test_prometheus_connect_without_the_token_is_refused(guarded_hub):
    from prometheus_api_client import PrometheusApiClientException

    prom = prometheus_connect(guarded_hub.url, token_file=None)
    with pytest.raises(PrometheusApiClientException, match="401"):
        prom.custom_query("up")


def test_prometheus_connect_refuses_bad_settings_in_one_line(monkeypatch):
    monkeypatch.delenv("GPUFLEET_HUB_URL", raising=False)
    with pytest.raises(InputError, match="no hub URL"):
        prometheus_connect()
    with pytest.raises(InputError, match="--cert-file and --key-file must be given together"):
        prometheus_connect("https://127.0.0.1:1", cert_file="/etc/hostname")


def _dt(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)
