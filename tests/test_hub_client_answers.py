"""How the hub client reads every answer a store can give, on an in-memory store.

Each store here is a plain function from request to answer (``mock_client``), so a 5xx, a
timeout, a partial answer, warnings or an answer cut short cost no socket and no sleep. What
a user relies on: a one-line error with the CLI's exit code (3: the hub, 2: the PromQL),
warnings never dropped, streamed or not.
"""

from __future__ import annotations

import pytest
import requests

from hub.store._client import HubUnavailable, PartialResponse, PromQLError
from tests.support.httpstub import Request, Response, json_response, mock_client

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "cluster": "east", "gpu": "0"},
     "value": [1700000000, "42"]},
    {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "cluster": "east", "gpu": "1"},
     "value": [1700000000, "7"]}]}}
MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": [
    {"metric": {"cluster": "east", "gpu": "0"}, "values": [[1, "1"], [2, "2"], [3, "3"]]}]}}


def answering(answer: Response):
    return lambda req: answer


@pytest.mark.parametrize("stream", [False, True])
def test_warnings_are_kept_streamed_or_not(stream):
    client = mock_client(answering(json_response(200, {**VECTOR, "warnings": ["receive-2 down"]})))
    answer = client.query("DCGM_FI_DEV_GPU_UTIL", stream=stream)
    rows = list(answer.result)
    assert [r["metric"]["gpu"] for r in rows] == ["0", "1"]
    warnings = answer.result.warnings if stream else answer.warnings
    assert warnings == ["receive-2 down"]


def test_every_query_asks_for_no_partial_response():
    client = mock_client(answering(json_response(200, VECTOR)))
    client.query("up")
    client.query_newest("up[5m]")
    client.query_range("up", 0, 60, 15)
    assert all(b"partial_response=false" in r.body for r in client.transport.seen)
    assert client.requests == 3


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_server_error_is_the_hub_unavailable(status):
    client = mock_client(answering(json_response(status, {"status": "error", "error": "boom"})))
    with pytest.raises(HubUnavailable, match=rf"answered {status} .*: boom$") as failed:
        client.query("up")
    assert failed.value.exit_code == 3


def test_a_refused_token_says_to_check_it():
    client = mock_client(answering(Response(401, b"Unauthorized", "text/plain")))
    with pytest.raises(HubUnavailable, match=r"refused the request .401 Unauthorized.: "
                                             "check the token"):
        client.query("up")


def test_thanos_refusing_a_partial_answer_is_unavailable_not_the_users_promql():
    refusal = json_response(422, {"status": "error", "errorType": "execution",
                                  "error": "expanding series: rpc error: receive-2"})
    with pytest.raises(PartialResponse, match="could not read all its stores"):
        mock_client(answering(refusal)).query("up")
    evaluation = json_response(422, {"status": "error", "errorType": "execution",
                                     "error": "found duplicate series for the match group"})
    with pytest.raises(PromQLError, match=r"^PromQL error: found duplicate series") as failed:
        mock_client(answering(evaluation)).query("a / on() b")
    assert failed.value.exit_code == 2


def test_a_store_closing_under_the_query_is_unavailable_not_the_users_promql():
    """A Prometheus shut down mid-sync answers 422 "execution" about its own storage: the
    hub failing (exit 3), as CI saw it under load, never a query to fix (exit 2)."""
    closing = json_response(422, {"status": "error", "errorType": "execution", "error":
                                  "open block querier for head range head (mint: 1, maxt: 2): "
                                  "open chunk reader: can't read from a closed head"})
    with pytest.raises(PartialResponse) as failed:
        mock_client(answering(closing)).query("up")
    assert failed.value.exit_code == 3


@pytest.mark.parametrize("failure, message", [
    (requests.ReadTimeout("read timed out"), "did not answer within 0.5s (--read-timeout)"),
    (requests.ConnectTimeout("connect timed out"),
     "did not accept a connection within 5s (--connect-timeout)"),
    (requests.ConnectionError("[Errno 111] Connection refused"),
     "unreachable: connection refused"),
])
def test_transport_failures_are_one_line_and_exit_3(failure, message):
    def fail(req: Request) -> Response:
        raise failure

    with pytest.raises(HubUnavailable) as failed:
        mock_client(fail, timeout=0.5).query("up")
    assert message in failed.value.format_message()
    assert "\n" not in failed.value.format_message()


@pytest.mark.parametrize("keep", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("how", ["query", "stream", "newest"])
def test_an_answer_cut_short_is_unavailable_never_a_crash_or_a_short_list(keep, how):
    """A proxy that breaks off mid-answer: streamed, it was a RuntimeError traceback when the
    cut came before the rows (the body was read, then quoted)."""
    body = json_response(200, MATRIX if how == "newest" else VECTOR).body
    client = mock_client(answering(Response(200, body[:int(len(body) * keep)])))
    with pytest.raises(HubUnavailable) as failed:
        if how == "query":
            client.query("up")
        elif how == "stream":
            list(client.query("up", stream=True).result)
        else:
            list(client.query_newest("up[5m]", stream=True).result)
    assert failed.value.exit_code == 3


def test_bytes_that_are_not_utf8_are_unavailable():
    client = mock_client(answering(Response(200, b'{"status":"success","data":\xff}')))
    with pytest.raises(HubUnavailable):
        client.query("up")
    with pytest.raises(HubUnavailable, match=r"not UTF-8|malformed"):
        list(client.query("up", stream=True).result)


def test_newest_sample_is_the_last_of_each_series():
    client = mock_client(answering(json_response(200, MATRIX)))
    assert client.query_newest("up[5m]").result[0]["value"] == [3, "3"]


def test_a_sample_time_answer_says_which_names_each_clusters_devices_send():
    """The sync takes each cluster's dcgm naming off the sample-time rows' metric names (no
    request of its own): only series with the device label and the cluster label count,
    cluster names with quotes and backslashes are read exactly, and the rows are as ever."""
    def series(name: str, cluster: str | None, uuid: str) -> dict:
        labels = {"__name__": name, "UUID": uuid, "gpu": "0"}
        if cluster is not None:
            labels["cluster"] = cluster
        return {"metric": labels, "values": [[1, "40"], [2, "41"]]}

    matrix = {"status": "success", "data": {"resultType": "matrix", "result": [
        series("DCGM_FI_DEV_GPU_TEMP", "east", "GPU-1"),
        series("DCGM_FI_DEV_GPU_TEMPERATURE", 'say"hi\\there', "GPU-2"),
        series("DCGM_FI_DEV_GPU_TEMPERATURE", "east", ""),  # no device: not a GPU's series
        series("DCGM_FI_DEV_GPU_TEMP", None, "GPU-3"),  # no cluster: left out by the sync
    ]}}
    client = mock_client(answering(json_response(200, matrix)))
    answer = client.query_newest("x[5m]", stream=True).result
    rows = list(answer.keyed(names_of="UUID"))
    assert len(rows) == 4 and all("__name__" not in labels for labels, _, _ in rows)
    assert [value for _, _, value in rows] == ["41"] * 4
    assert answer.names == {("east", "DCGM_FI_DEV_GPU_TEMP"),
                            ('say"hi\\there', "DCGM_FI_DEV_GPU_TEMPERATURE")}


def test_the_store_s_metric_names_come_from_its_index_for_the_period_without_partial_answers():
    names = {"status": "success", "data": ["DCGM_FI_DEV_GPU_UTIL", "up"]}
    client = mock_client(answering(json_response(200, names)))
    assert client.metric_names(1000, 1600) == {"DCGM_FI_DEV_GPU_UTIL", "up"}
    (req,) = client.transport.seen
    assert req.method == "GET" and req.path.startswith("/api/v1/label/__name__/values?")
    assert all(p in req.path for p in ("start=1000.000", "end=1600.000",
                                       "partial_response=false"))


@pytest.mark.parametrize("status", [403, 404, 405, 501])
def test_a_store_without_the_names_api_means_every_name_is_asked(status):
    client = mock_client(answering(Response(status, b"404 page not found", "text/plain")))
    assert client.metric_names(0, 60) is None


def test_a_store_failing_to_list_its_names_is_the_hub_unavailable():
    client = mock_client(answering(json_response(503, {"status": "error", "error": "boom"})))
    with pytest.raises(HubUnavailable, match=r"answered 503 .*: boom$"):
        client.metric_names(0, 60)
    partial = {"status": "error", "errorType": "execution", "error": "rpc error: store down"}
    client = mock_client(answering(json_response(422, partial)))
    with pytest.raises(PartialResponse):
        client.metric_names(0, 60)
