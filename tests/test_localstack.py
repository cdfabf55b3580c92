from hub.devstack._prometheus import StaticServer
from tests.support.promql import wait_for
from tests.support.samples import sample_text


def test_agent_pushes_sample_with_cluster_label(hub, fleet):
    fleet("east", [sample_text("dcgm-l40s-upcloud-uks.prom")])
    result = wait_for(hub.url, 'count by (cluster) (DCGM_FI_DEV_GPU_TEMP)', lambda r: len(r) == 1)
    assert result[0]["metric"] == {"cluster": "east"}


def test_static_server_serves_only_metrics():
    import requests

    server = StaticServer("x 1\n").start()
    try:
        assert requests.get(f"http://{server.target}/metrics", timeout=2).text == "x 1\n"
        assert requests.get(f"http://{server.target}/other", timeout=2).status_code == 404
    finally:
        server.stop()
