"""`query`, config precedence, `db upgrade` and the one-line errors users see."""

from __future__ import annotations

import csv
import io
import json

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from hub.inventory import _db as inventory
from hub.inventory import _migrate as migrate
from hub.inventory._partitions import not_a_partition
from tests.support.clirun import gpufleet
from tests.support.promql import wait_for
from tests.support.samples import sample_text


@pytest.fixture
def loaded_hub(hub, fleet):
    fleet("east", [sample_text("dcgm-h100-8gpu-aicr-eks-156a357e.prom")])
    fleet("west", [sample_text("dcgm-l40s-upcloud-uks.prom")])
    wait_for(hub.url, "count(DCGM_FI_DEV_GPU_TEMP)", lambda r: bool(r) and r[0]["value"][1] == "9")
    return hub


def test_query_instant_formats(loaded_hub):
    env = {"GPUFLEET_HUB_URL": loaded_hub.url}
    expr = "count by (cluster) (DCGM_FI_DEV_GPU_TEMP)"
    data = json.loads(gpufleet("query", expr, "-o", "json", env=env).stdout)
    assert {d["metric"]["cluster"]: d["value"] for d in data} == {"east": 8.0, "west": 1.0}
    assert all(d["time"].endswith("Z") for d in data)
    rows = list(csv.DictReader(io.StringIO(gpufleet("query", expr, "-o", "csv", env=env).stdout)))
    assert {r["cluster"]: r["value"] for r in rows} == {"east": "8.0", "west": "1.0"}
    table = gpufleet("query", expr, env=env).stdout
    # label names as the hub spells them (they go back into PromQL), values rounded
    assert table.splitlines()[0].split() == ["cluster", "time", "value"]
    assert "east" in table and "west" in table and "8.0" not in table


def test_query_range(loaded_hub):
    env = {"GPUFLEET_HUB_URL": loaded_hub.url}
    result = gpufleet("query", 'count(DCGM_FI_DEV_GPU_TEMP{cluster="east"})', "--range", "1m",
                      "--step", "1s", "-o", "json", env=env)
    assert result.exit_code == 0, result.output
    series = json.loads(result.stdout)
    assert len(series) == 1 and len(series[0]["values"]) >= 1
    assert all(p["value"] == 8.0 for p in series[0]["values"])


def test_promql_error_is_the_stores_message_on_one_line(hub):
    result = gpufleet("query", "sum by (", "--hub-url", hub.url)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: PromQL error:") and "parse error" in result.stderr


def test_unreachable_hub_exits_3():
    result = gpufleet("query", "up", "--hub-url", "http://127.0.0.1:1")
    assert result.exit_code == 3
    assert result.stderr == "error: hub http://127.0.0.1:1 unreachable: connection refused\n"


@pytest.mark.parametrize("args, message", [
    (["query", "up"], "no hub URL: pass --hub-url or set GPUFLEET_HUB_URL"),
    (["query", "up", "--hub-url", "ftp://x"], "invalid hub URL 'ftp://x'"),
    (["query", "up", "--hub-url", "http://h", "--range", "soon"], "invalid duration 'soon'"),
    (["sync", "--hub-url", "http://h", "--db", "nonsense"], "invalid database URL 'nonsense'"),
    (["sync", "--hub-url", "http://h", "--once", "--every", "5m"], "exclude each other"),
    (["query", "up", "--hub-url", "http://h", "--token-file", "/nonexistent"],
     "cannot read token file /nonexistent"),
])
def test_bad_input_gets_one_line_and_exit_2(args, message):
    result = gpufleet(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_inventory_without_database_says_run_sync(tmp_path):
    missing = tmp_path / "nothing.db"
    result = gpufleet("inventory", "gpus", "--db", f"sqlite:///{missing}")
    assert result.exit_code == 3
    assert "run `gpufleet sync` first" in result.stderr
    assert not missing.exists()  # a typo in --db never creates an empty database


def test_default_database_follows_xdg(tmp_path, hub):
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "GPUFLEET_HUB_URL": hub.url}
    assert gpufleet("sync", "--once", env=env).exit_code == 0
    assert (tmp_path / "xdg" / "gpufleet" / "inventory.db").is_file()


def test_unreachable_postgres_exits_3(hub):
    result = gpufleet("sync", "--hub-url", hub.url,
                      "--db", "postgresql://gpufleet:pw-secret@127.0.0.1:1/inv")
    assert result.exit_code == 3
    assert "inventory database" in result.stderr and "unavailable" in result.stderr
    assert "pw-secret" not in result.stderr


def test_config_file_precedence_flags_env_file_defaults(tmp_path, hub):
    cfg = tmp_path / "gpufleet.yaml"
    cfg.write_text(f"hub-url: http://127.0.0.1:1\ndb: sqlite:///{tmp_path / 'file.db'}\n"
                   "stale-after: 2m\n")
    # the file alone: its (unreachable) hub is used
    result = gpufleet("query", "vector(1)", "--config", str(cfg))
    assert result.exit_code == 3 and "127.0.0.1:1" in result.stderr
    # the environment beats the file
    env = {"GPUFLEET_HUB_URL": hub.url}
    assert gpufleet("query", "vector(1)", "--config", str(cfg), env=env).exit_code == 0
    # a flag beats the environment
    result = gpufleet("query", "vector(1)", "--config", str(cfg), "--hub-url",
                      "http://127.0.0.1:2", env=env)
    assert result.exit_code == 3 and "127.0.0.1:2" in result.stderr
    # GPUFLEET_CONFIG and the group-level --config work the same way
    assert gpufleet("sync", env={**env, "GPUFLEET_CONFIG": str(cfg)}).exit_code == 0
    assert (tmp_path / "file.db").exists()
    assert gpufleet("--config", str(cfg), "query", "vector(1)").exit_code == 3


@pytest.mark.parametrize("text, message", [
    ("hub-urll: x\n", "unknown option 'hub-urll'"),
    ("- a\n- b\n", "must be a mapping"),
    ("a: [\n", "not valid YAML"),
])
def test_bad_config_file(tmp_path, text, message):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    result = gpufleet("query", "up", "--config", str(cfg))
    assert result.exit_code == 2 and message in result.stderr


def test_db_upgrade_creates_the_schema_the_models_describe(db_url):
    result = gpufleet("db", "upgrade", "--db", db_url)
    head = migrate.head()
    assert head == migrate.HEAD  # what read commands check the schema against, unloaded
    assert result.exit_code == 0 and f"empty -> {head}" in result.stdout
    engine = inventory.make_engine(db_url)
    with engine.connect() as conn:
        # the ledger's monthly partitions are the program's, not the models' (PostgreSQL)
        context = MigrationContext.configure(conn, opts={"include_name": not_a_partition})
        assert compare_metadata(context, migrate.metadata()) == []
    assert migrate.current(engine) == migrate.head()
    assert f"{head} -> {head}" in gpufleet("db", "upgrade", "--db", db_url).stdout
    engine.dispose()


def test_sync_refuses_an_older_schema(tmp_path, hub):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = inventory.make_engine(url, create=True)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num VARCHAR(32))"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('0000')"))
    engine.dispose()
    result = gpufleet("sync", "--hub-url", hub.url, "--db", url)
    assert result.exit_code == 2 and "run `gpufleet db upgrade`" in result.stderr


def test_every_command_has_help():
    from hub.cli import COMMANDS

    for name in COMMANDS:
        result = gpufleet(name, "--help")
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.stdout


def test_inventory_of_a_database_without_schema_says_it_is_empty(tmp_path):
    """A sync that has not finished its first transaction leaves a file with no tables."""
    path = tmp_path / "new.db"
    path.touch()
    for args in (["inventory", "gpus"], ["inventory", "sync-runs"]):
        result = gpufleet(*args, "--db", f"sqlite:///{path}")
        assert result.exit_code == 3
        assert "is empty: run `gpufleet sync` first" in result.stderr


# -- --db-file: the database URL from a mounted Secret ------------------------------------------
def test_db_file_reads_the_url_and_keeps_its_password_out_of_errors(tmp_path):
    db = f"sqlite:///{tmp_path / 'inv.db'}"
    assert gpufleet("db", "upgrade", "--db", db).exit_code == 0
    url_file = tmp_path / "url"
    url_file.write_text(db + "\n")
    ok = gpufleet("inventory", "clusters", "--db-file", str(url_file))
    assert ok.exit_code == 0 and "(none)" in ok.stdout
    ok = gpufleet("inventory", "clusters", env={"GPUFLEET_DB_FILE": str(url_file)})
    assert ok.exit_code == 0, ok.output
    both = gpufleet("inventory", "clusters", "--db-file", str(url_file), "--db", db)
    assert both.exit_code == 2 and "--db and --db-file exclude each other" in both.stderr
    missing = gpufleet("inventory", "clusters", "--db-file", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "cannot read --db-file" in missing.stderr
    # an unreachable PostgreSQL: the password from the file is never shown
    url_file.write_text("postgresql://gpufleet:pw-from-file-123@127.0.0.1:1/inv\n")
    down = gpufleet("inventory", "clusters", "--db-file", str(url_file))
    assert down.exit_code == 3 and "127.0.0.1:1" in down.stderr
    assert "pw-from-file-123" not in down.output
    url_file.write_text(db + "\nsecond-line-secret\n")
    bad = gpufleet("inventory", "clusters", "--db-file", str(url_file))
    assert bad.exit_code == 2 and "one line" in bad.stderr
    assert "second-line-secret" not in bad.output


def test_sync_shows_progress_on_a_terminal_and_nothing_when_piped(tmp_path, hub):
    from tests.support.clirun import on_terminal

    db = f"sqlite:///{tmp_path / 'inv.db'}"
    code, seen, _ = on_terminal("sync", "--hub-url", hub.url, "--db", db)
    assert code == 0, seen
    assert b"sync: reading the hub" in seen
    piped = gpufleet("sync", "--hub-url", hub.url, "--db", db)
    assert piped.exit_code == 0 and "reading the hub" not in piped.stderr
