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
