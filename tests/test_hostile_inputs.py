"""A hostile user's inputs: each ends in one line on stderr and the documented exit code.

Exit codes (docs/operations.md): 2 for the user's own input (flags, files, names, PromQL),
3 for a dependency that is there but unusable (a corrupt database file).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.clirun import gpufleet

CLOSED = "http://127.0.0.1:1"  # a closed loopback port: never reached by these inputs


def last_line(output: str) -> str:
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, output
    return lines[-1]


@pytest.fixture
def corrupt_db(tmp_path: Path) -> str:
    path = tmp_path / "inventory.db"
    path.write_bytes(b"SQLite format 3\x00" + b"garbage" * 600)
    return f"sqlite:///{path}"


@pytest.mark.parametrize("args", [["inventory", "clusters"], ["inventory", "sync-runs"],
                                  ["sync", "--hub-url", CLOSED], ["db", "upgrade"],
                                  ["report"]])
def test_a_corrupt_sqlite_file_is_a_one_line_exit_3(corrupt_db, args):
    result = gpufleet(*args, "--db", corrupt_db)
    assert result.exit_code == 3
    line = last_line(result.stderr)
    assert line.startswith("error: inventory database") and "file is not a database" in line
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize(("args", "env", "needle"), [
    (["sync", "--stale-after", "inf"], {}, "invalid duration 'inf'"),
    (["sync"], {"GPUFLEET_STALE_AFTER": "nan"}, "invalid duration 'nan'"),
    (["report", "--max-age", "Infinity"], {}, "invalid duration 'Infinity'"),
    (["sync", "--timeout", "0s"], {}, "--read-timeout must be greater than 0"),
    (["query", "up", "--timeout", "0"], {}, "--read-timeout must be greater than 0"),
    (["query", "up", "--hub-url", "http://[::1"], {}, "invalid hub URL (--hub-url): Invalid IPv6"),
    (["sync", "--hub-url", "http://h:99999"], {}, "invalid hub URL (--hub-url): Port out of range"),
    (["inventory", "sync-runs", "--limit", "99999999999999999999"], {}, "not in the range"),
    (["sync", "--every", "0s"], {}, "--every must be greater than 0"),
    (["query", "up", "--range", "1h", "--step", "0s"], {}, "must be greater than 0"),
    (["query", "up", "--range", "0s"], {}, "must be greater than 0"),
    (["query", 'up{a="\udcff"}'], {}, "bytes that are not valid UTF-8"),
])
def test_bad_values_are_input_errors(tmp_path, args, env, needle):
    env = {"GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}", "GPUFLEET_HUB_URL": CLOSED, **env}
    result = gpufleet(*args, env=env)
    assert result.exit_code == 2, result.output
    assert needle in last_line(result.stderr)


def test_a_binary_config_file_is_an_input_error(tmp_path):
    config = tmp_path / "gpufleet.yaml"
    config.write_bytes(bytes(range(256)))
    result = gpufleet("sync", "--config", str(config))
    assert result.exit_code == 2
    assert last_line(result.stderr) == f"error: config file {config} is not a text (UTF-8) file"


def test_an_sqlite_path_whose_directory_cannot_be_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    url = f"sqlite:///{blocker / 'sub' / 'inventory.db'}"
    for args in (["sync", "--hub-url", CLOSED], ["db", "upgrade"]):
        result = gpufleet(*args, "--db", url)
        assert result.exit_code == 2
        assert "cannot create the directory of inventory database" in last_line(result.stderr)
    assert blocker.read_text() == "not a directory"



def test_tls_files_that_are_not_what_their_flag_says_are_input_errors(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    result = gpufleet("query", "up", "--hub-url", "https://127.0.0.1:1", "--ca-file", str(junk))
    assert result.exit_code == 2
    assert last_line(result.stderr) == f"error: --ca-file {junk} holds no PEM CA certificate"
    result = gpufleet("sync", "--hub-url", "https://127.0.0.1:1", "--cert-file", str(junk),
                      "--key-file", str(junk), "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert result.exit_code == 2
    assert "are not a matching PEM certificate and key" in last_line(result.stderr)


# -- round 4: what a bounded probe still broke ----------------------------------------------------
def _inventory_db(url: str) -> str:
    assert gpufleet("db", "upgrade", "--db", url).exit_code == 0
    return url


@pytest.mark.parametrize("args", [["inventory", "gpus"], ["inventory", "events"],
                                  ["inventory", "allocations"],
                                  ["inventory", "prune", "--stale-for", "1d", "--dry-run"]])
def test_a_nul_from_a_config_file_is_refused_on_either_database(db_url, tmp_path, args):
    """A NUL cannot come from argv or the environment, only from a file: refused when the file
    is read, so SQLite and PostgreSQL (which would print the SQL) answer alike."""
    config = tmp_path / "gpufleet.yaml"
    config.write_text('cluster: "east\\0west"\n')
    result = gpufleet(*args, "--config", str(config), "--db", _inventory_db(db_url))
    assert result.exit_code == 2, result.output
    line = last_line(result.stderr)
    assert line.startswith(f"error: config file {config}: cluster") and "NUL" in line
    assert "SELECT" not in result.output


@pytest.mark.parametrize(("name", "content", "needle"), [
    ("tokens", bytes(range(256)), ".yaml is not a text (UTF-8) file"),
    ("prices", bytes(range(256)), "is not a text (UTF-8) file"),
    ("prices", b'"NVIDIA H100 80GB HBM3": 2.5\n"NVIDIA H100 80GB HBM3": 1.0\n',
     "(duplicate key 'NVIDIA H100 80GB HBM3')"),
    ("prices", b'clusters:\n  "east\\0": {"NVIDIA H100 80GB HBM3": 2.5}\n',
     "under clusters is not a cluster name"),
])
def test_binary_or_ambiguous_files_for_serve_and_usage_are_one_line_errors(tmp_path, name,
                                                                           content, needle):
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    commands = ([["usage", "--prices", str(path), "--db", db]] if name == "prices" else [])
    option = "--prices" if name == "prices" else "--tokens-file"
    commands.append(["serve", option, str(path), "--hub-url", CLOSED, "--db", db])
    for args in commands:
        result = gpufleet(*args)
        assert result.exit_code == 2, result.output
        assert needle in last_line(result.stderr)
        assert f"{name if name == 'tokens' else 'price'} file {path}" in last_line(result.stderr)


def _alias_bomb(levels: int = 9) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """9 levels of 9 aliases: 9^9 strings once expanded, from about 400 bytes. Refused while
    composing (a walk or a repr of it would never end), by every reader of YAML."""
    import tracemalloc

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    assert bomb.stat().st_size < 500
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    tracemalloc.start()
    try:
        for args in (["usage", "--prices", str(bomb), "--db", db],
                     ["serve", "--prices", str(bomb), "--hub-url", CLOSED, "--db", db],
                     ["serve", "--tokens-file", str(bomb), "--hub-url", CLOSED, "--db", db],
                     ["sync", "--config", str(bomb)]):
            result = gpufleet(*args)
            assert result.exit_code == 2, (args, result.output)
            assert "aliases expand to more than 100,000 nodes" in last_line(result.stderr)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100 * 1024 * 1024  # the probe saw 1.29 GB and rising


def test_a_huge_price_file_is_refused_by_its_size(tmp_path):
    big = tmp_path / "prices.yaml"
    with big.open("wb") as f:  # 40 MB, sparse: refused by its size before a byte is read
        f.truncate(40 * 1024 * 1024)
    result = gpufleet("usage", "--prices", str(big), "--db", f"sqlite:///{tmp_path / 'i.db'}")
    assert result.exit_code == 2
    assert last_line(result.stderr) == (f"error: price file {big} is 41,943,040 bytes, more "
                                        "than the 2,097,152 a file of this kind may have")


def _reconcile_files(tmp_path: Path, slices: object, claims: object | None = None) -> list[str]:
    import json

    from tests.support import dra as fx
    from tests.support.nodes import node_object

    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"kind": "List", "items": [node_object(fx.DRA_H100)]}))
    path = tmp_path / "slices.json"
    path.write_text(slices if isinstance(slices, str) else json.dumps(slices))
    args = ["--nodes-json", f"c={nodes}", "--resourceslices-json", f"c={path}"]
    if claims is not None:
        claim_path = tmp_path / "claims.json"
        claim_path.write_text(json.dumps(claims))
        args += ["--resourceclaims-json", f"c={claim_path}"]
    return args


def _slice_list(**change: object) -> dict:
    from tests.support import dra as fx

    item = next(s for s in fx.dra_slices() if s["spec"].get("nodeName") == fx.DRA_H100)
    item = {**item, "spec": {**item["spec"], **change}}
    return {"kind": "List", "items": [item]}


@pytest.mark.parametrize("case", ["deep", "generation", "big-int", "nul-node", "nul-claim"])
def test_hostile_kubernetes_json_is_a_one_line_error_on_either_database(db_url, tmp_path,
                                                                        case):
    from tests.support import dra as fx

    if case == "deep":
        args = _reconcile_files(tmp_path, "[" * 200_000 + "]" * 200_000)
        needle = "not valid JSON (nested more than 100 deep)"
    elif case == "generation":
        pool = {**_slice_list()["items"][0]["spec"]["pool"]}
        text = json_text(_slice_list(pool={**pool, "generation": 0})).replace(
            '"generation": 0', '"generation": 1e400')
        args = _reconcile_files(tmp_path, text)
        needle = "not valid JSON (the number 1e400 is out of range)"
    elif case == "big-int":
        pool = {**_slice_list()["items"][0]["spec"]["pool"], "generation": 2 ** 70}
        args = _reconcile_files(tmp_path, _slice_list(pool=pool))
        needle = "is out of range (64 bits)"
    elif case == "nul-node":
        args = _reconcile_files(tmp_path, _slice_list(nodeName=fx.DRA_H100 + "\x00"))
        needle = "a string holds a NUL character"
    else:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "c", "namespace": "team\x00a"}}
        args = _reconcile_files(tmp_path, _slice_list(), {"kind": "List", "items": [claim]})
        needle = "a string holds a NUL character"
    result = gpufleet("reconcile", "--db", _inventory_db(db_url), *args)
    assert result.exit_code == 2, result.output
    assert needle in last_line(result.stderr) and result.stderr.count("\n") == 1


def json_text(doc: object) -> str:
    import json

    return json.dumps(doc)


@pytest.mark.parametrize(("args", "needle"), [
    (["inventory", "events", "--limit", "99999999999999999999"], "not in the range"),
    (["usage", "--idle-threshold", "nan"], "'nan' is not a number"),
    (["idle", "--threshold", "nan"], "'nan' is not a number"),
    (["serve", "--oidc-scope-claim", "", "--hub-url", CLOSED], "is not a claim name"),
    (["spoke", "render", "--cluster", "east", "--vendor", "nvidia", "--remote-write-url",
      "https://receive.example.com/api/v1/receive", "--agent-image", "quay.io/a:1\nevil: x"],
     "is not an image reference"),
    (["hub", "render", "--out", "OUT", "--tokens-secret", "t", "--hub-url",
      "https://thanos.example.com", "--image", "quay.io/a:1\nevil: x"],
     "is not an image reference"),
])
def test_values_a_command_used_to_take_are_refused(tmp_path, args, needle):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    if args[:2] == ["spoke", "render"]:
        args += ["--out", str(tmp_path / "spoke")]
    result = gpufleet(*args, env={"GPUFLEET_DB": f"sqlite:///{tmp_path / 'inv.db'}"})
    assert result.exit_code == 2, result.output
    assert needle in last_line(result.stderr)
    assert not (tmp_path / "out").exists() and not (tmp_path / "spoke").exists()


def test_usage_takes_config_files_like_every_other_command(tmp_path):
    """`gpufleet usage --config F` and `gpufleet --config F usage` both read F: its keys
    apply, an unknown key or a binary file is refused as for any other command."""
    db = tmp_path / "inv.db"
    assert gpufleet("db", "upgrade", "--db", f"sqlite:///{db}").exit_code == 0
    config = tmp_path / "gpufleet.yaml"
    config.write_text(f"db: sqlite:///{db}\nby: [cluster, model]\noutput: json\n")
    for args in (["usage", "--config", str(config)], ["--config", str(config), "usage"]):
        result = gpufleet(*args)
        assert result.exit_code == 0, result.output
        assert result.stdout.strip() == "[]"  # json: the file's output key was read
    config.write_text(f"db: sqlite:///{db}\nno-such-option: 1\n")
    for args in (["usage", "--config", str(config)], ["--config", str(config), "usage"]):
        result = gpufleet(*args)
        assert result.exit_code == 2
        assert last_line(result.stderr) == (f"error: config file {config}: unknown option "
                                            "'no-such-option'")
    config.write_bytes(bytes(range(256)))
    result = gpufleet("--config", str(config), "usage")
    assert result.exit_code == 2 and "is not a text (UTF-8) file" in result.stderr


def test_a_continue_token_holding_a_nul_is_a_400_on_either_database(db_url):
    """SQLite compared the NUL and answered 200; PostgreSQL refused it and the client saw
    a 503, although the mistake is the client's."""
    from hub import inventory as inv
    from hub.service import build_app
    from hub.service._api import encode_token
    from tests.support.asgi import AppClient, no_metrics

    engine = inv.make_engine(db_url, create=True)
    try:
        inv.ensure_schema(engine)
        app = build_app(engine, health=lambda: (True, {}), findings=lambda: ([], None),
                        metrics=no_metrics)
        client = AppClient(app)
        fine = client.handle("/api/v1/gpus", {"continue": [encode_token(["a", "b", "c", ""])]})
        assert fine[0] == 200, fine
        status, body = client.handle("/api/v1/gpus",
                                     {"continue": [encode_token(["a\x00", "b", "c", ""])]})
        assert status == 400 and "invalid continue token" in body["error"], body
    finally:
        engine.dispose()


def test_a_scope_flag_must_be_a_boolean(tmp_path):
    from hub.common import InputError
    from hub.service import token_entry
    from hub.service._auth import load_tokens

    entry = token_entry("team", "gpf_x")
    entry["scope"]["fleet_counts"] = "no"
    path = tmp_path / "tokens.yaml"
    import yaml

    path.write_text(yaml.safe_dump({"tokens": [entry]}))
    with pytest.raises(InputError, match="fleet_counts of 'team' must be true or false, not "
                                         "'no'"):
        load_tokens(path)
    entry["scope"]["fleet_counts"] = False
    path.write_text(yaml.safe_dump({"tokens": [entry]}))
    assert next(iter(load_tokens(path).values())).fleet_counts is False


def test_a_tokens_file_that_turns_binary_keeps_the_last_good_one(tmp_path, caplog):
    """As with invalid YAML or a deleted file: the running service logs why and keeps
    answering with the tokens it had, instead of a 500 on every request."""
    import hashlib
    import os

    import yaml

    from hub.service import TokenFile, token_entry

    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [token_entry("team", "gpf_team")]}))
    tokens = TokenFile(path)
    digest = hashlib.sha256(b"gpf_team").hexdigest()
    assert tokens.lookup_sha256(digest) is not None
    path.write_bytes(b"tokens:\n- name: \xff\xfe\n")
    os.utime(path, (1, 1))  # a new stamp even within the same clock tick
    assert tokens.lookup_sha256(digest) is not None
    assert "tokens file not reloaded" in caplog.text and "not a text (UTF-8) file" in caplog.text


@pytest.mark.parametrize("when", ["expired", "not yet valid"])
def test_a_certificate_outside_its_validity_is_refused_at_start(tmp_path, when):
    import time

    from hub.common import InputError
    from hub.service import TlsFiles
    from tests.test_api_access import make_cert

    make_cert(tmp_path, "svc")  # valid from a minute ago for a day
    now = time.time()
    clock = (lambda: now + 2 * 86400) if when == "expired" else (lambda: now - 3600)
    with pytest.raises(InputError, match="expired on" if when == "expired"
                       else "not valid before"):
        TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key", clock=clock)
    assert TlsFiles(tmp_path / "tls.crt", tmp_path / "tls.key").not_after is not None
    if when == "expired":  # and by the command, in one line
        result = gpufleet("serve", "--hub-url", CLOSED, "--tls-cert-file",
                          str(tmp_path / "tls.crt"), "--tls-key-file", str(tmp_path / "tls.key"),
                          "--db", f"sqlite:///{tmp_path / 'i.db'}", "--listen", "127.0.0.1:0",
                          "--session-ttl", "0s")
        assert result.exit_code == 2  # (a valid certificate: the next check speaks)


@pytest.mark.parametrize("flag", ["--db-file", "--token-file"])
def test_a_binary_secret_file_is_one_line_and_shows_nothing_of_it(tmp_path, flag):
    path = tmp_path / "secret"
    path.write_bytes(b"\xd0\xff" + bytes(range(256)))
    args = (["inventory", "clusters", flag, str(path)] if flag == "--db-file" else
            ["query", "up", "--hub-url", CLOSED, flag, str(path)])
    result = gpufleet(*args)
    assert result.exit_code == 2
    assert last_line(result.stderr) == (f"error: {flag.lstrip('-').replace('-file', '')} "
                                        f"file {path} is not a text (UTF-8) file"
                                        if flag == "--token-file" else
                                        f"error: --db-file {path} is not a text (UTF-8) file")


# -- issue 42: input files ------------------------------------------------------------------------
NUL_YAML = b'cluster: east\nnote: "a\x00b"\n'


@pytest.mark.parametrize("name", ["config", "prices", "tokens", "instance-types"])
def test_a_raw_nul_byte_in_a_yaml_file_is_one_line(tmp_path, name):
    """PyYAML refuses a NUL (or another control character) before it parses, as a
    ReaderError nothing caught: a traceback, where any other bad YAML is one line."""
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(NUL_YAML)
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    args = {"config": ["sync", "--config", str(path)],
            "prices": ["usage", "--prices", str(path), "--db", db],
            "tokens": ["serve", "--tokens-file", str(path), "--hub-url", CLOSED, "--db", db],
            "instance-types": ["reconcile", "--nodes-json", f"c={path}",
                               "--instance-types", str(path), "--db", db]}[name]
    result = gpufleet(*args, env={"GPUFLEET_HUB_URL": CLOSED})
    assert result.exit_code == 2, result.output
    line = last_line(result.stderr)
    assert line.endswith("is not valid YAML at line 2 (a NUL byte)"), line
    assert str(path) in line and result.stderr.count("\n") == 1


def test_a_tokens_file_that_gains_a_nul_keeps_the_last_good_one(tmp_path, caplog):
    """Reloaded while serving, the NUL was a ReaderError out of every authenticated request
    (a 500 each); now it is logged once per change and the tokens the file had still work."""
    import hashlib
    import logging
    import os

    import yaml

    from hub.service import TokenFile, token_entry

    path = tmp_path / "tokens.yaml"
    path.write_text(yaml.safe_dump({"tokens": [token_entry("team", "gpf_team")]}))
    tokens = TokenFile(path)
    digest = hashlib.sha256(b"gpf_team").hexdigest()
    assert tokens.lookup_sha256(digest) is not None
    path.write_bytes(path.read_bytes().replace(b"team", b"te\x00m", 1))
    os.utime(path, (1, 1))
    with caplog.at_level(logging.WARNING):
        assert tokens.lookup_sha256(digest) is not None
    [record] = [r for r in caplog.records if "tokens file not reloaded" in r.getMessage()]
    assert "is not valid YAML at line 2 (a NUL byte)" in record.getMessage()
    assert "\n" not in record.getMessage()
