"""Output for people: rounded numbers, one JSON type per field, tables that fit or change
layout, label names as the hub spells them, errors never cut mid-word."""

from __future__ import annotations

import json

from hub.common._output import cell, to_table
from hub.inventory import _db
from hub.store._client import HubClient
from tests.support.clirun import gpufleet
from tests.support.httpstub import StubServer, json_response

UUID = "GPU-2a1f7c44-6b0e-4d8e-9c53-3f1d2b9a7e10"


def test_numbers_are_rounded_to_their_meaning():
    assert cell("utilisation_pct", 2.9000000000000004) == "2.9"
    assert cell("power_w", 71.234) == "71.2"
    assert cell("temperature_c", 40.0) == "40.0"
    assert cell("memory_total_mib", 81559.0000001) == "81559"
    assert cell("memory_used_mib", 0.6) == "1"
    assert cell("value", 0.30000000000000004) == "0.3"
    assert cell("value", 12.0) == "12"
    assert cell("index", 3) == "3" and cell("model", None) == "-"


def test_a_table_that_does_not_fit_becomes_records_and_never_splits_a_uuid():
    rows = [{"cluster": "east", "node": "node-" + "a" * 30, "uuid": UUID, "model": "H100 80GB",
             "utilisation_pct": 2.9000000000000004}]
    cols = list(rows[0])
    wide = to_table(rows, cols, width=200)
    assert UUID in wide and "2.9 " in wide + " " and "UTILISATION_PCT" in wide
    narrow = to_table(rows, cols, width=60)
    assert all(len(line) <= 60 for line in narrow.splitlines())
    assert f"uuid             {UUID}" in narrow.replace("UUID", "uuid")
    assert "2.9000000000000004" not in narrow


def test_query_table_keeps_label_names_and_whole_uuids():
    answer = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "node-a", "UUID": UUID,
                    "cluster": "east", "modelName": "NVIDIA H100 80GB HBM3"},
         "value": [1700000000, "2.9000000000000004"]}]}}
    server = StubServer(lambda req: json_response(200, answer))
    try:
        result = gpufleet("query", "DCGM_FI_DEV_GPU_UTIL", "--hub-url", server.url,
                          env={"COLUMNS": "80"})
    finally:
        server.stop()
    assert result.exit_code == 0
    assert "Hostname" in result.stdout and "HOSTNAME" not in result.stdout
    assert "modelName" in result.stdout
    assert UUID in result.stdout  # whole, on one line
    assert all(len(line) <= 80 for line in result.stdout.splitlines())


def test_mig_instance_and_index_are_integers_in_json():
    item = _db.gpu_item({**dict.fromkeys(_db.GPU_COLUMNS), "gpu_index": 0,
                         "mig_instance": "7", "mig_profile": "1g.10gb"})
    assert item["index"] == 0 and item["mig_instance"] == 7
    assert json.loads(json.dumps(item))["mig_instance"] == 7


def test_a_tls_error_is_named_whole(tmp_path):
    server = StubServer(lambda req: json_response(200, {}))
    try:
        client = HubClient(server.url.replace("http:", "https:"), timeout=5)
        try:
            client.query("up")
        except Exception as exc:
            message = str(exc)
        else:
            raise AssertionError("a TLS hello to a plain HTTP server cannot succeed")
    finally:
        server.stop()
    assert message.endswith(": wrong version number"), message
    assert "[SSL" not in message and "SSLError(" not in message


def test_long_error_details_are_cut_at_a_word_never_inside_one():
    from hub.common import shorten

    text = "upstream said: " + " ".join(f"word{i}" for i in range(100))
    short = shorten(text, 60)
    assert len(short) <= 60 and short.endswith("…")
    assert short[:-1].split()[-1] in text.split()  # the last word is whole
    assert shorten("a\nb   c") == "a b c"
    html = "<html>" + "x" * 400 + "</html>"
    assert len(shorten(html)) == 200  # one unbroken token: cut, but marked as cut


def test_json_help_says_one_object_where_a_command_answers_with_one():
    from tests.support.clirun import gpufleet as run

    def said(*command: str) -> str:
        out = run(*command, "--help", env={"COLUMNS": "400"})
        assert out.exit_code == 0, out.output
        return " ".join(out.stdout.split())

    for command in (("report",), ("sync",), ("inventory", "gpu"), ("usage", "collect"),
                    ("serve", "token", "create")):
        assert "json is one object for scripts" in said(*command), command
    for command in (("inventory", "gpus"), ("usage",), ("capacity",)):
        assert "json is a list of objects for scripts" in said(*command), command
