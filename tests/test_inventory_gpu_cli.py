"""`inventory gpu` takes a UUID or a unique prefix of one (as the page's search does), refuses an
ambiguous prefix in one line, and prints its events' details as JSON, not Python dicts."""

from __future__ import annotations

import datetime as dt
import json

from hub.inventory import _db
from hub.inventory import _migrate as migrate
from hub.inventory._normalize import Observation
from hub.inventory._writer import apply_observations
from tests.support.clirun import gpufleet

T0 = dt.datetime(2026, 11, 20, 12, 0, 0)


def _db_with(url: str) -> str:
    engine = _db.make_engine(url, create=True)
    migrate.ensure_schema(engine)
    with engine.begin() as conn:
        apply_observations(conn, [
            Observation("east", "n1", uuid, "nvidia", index=i, driver_version="550.54.15")
            for i, uuid in enumerate(("GPU-5c0f1111", "GPU-77aa0001", "GPU-77aa0002",
                                      "GPU-1_%x"))], T0)
        apply_observations(conn, [
            Observation("east", "n2", "GPU-5c0f1111", "nvidia", index=0,
                        driver_version="550.54.15")], T0 + dt.timedelta(minutes=5))
    engine.dispose()
    return url


def test_a_unique_prefix_finds_the_gpu_an_ambiguous_one_is_refused(db_url):
    url = _db_with(db_url)
    whole = gpufleet("inventory", "gpu", "GPU-5c0f1111", "--db", url, "-o", "json")
    short = gpufleet("inventory", "gpu", "GPU-5c0f", "--db", url, "-o", "json")
    assert whole.exit_code == short.exit_code == 0, short.output
    assert json.loads(short.stdout) == json.loads(whole.stdout)
    assert json.loads(short.stdout)["gpu"]["uuid"] == "GPU-5c0f1111"
    both = gpufleet("inventory", "gpu", "GPU-77aa", "--db", url)
    assert both.exit_code == 2, both.output
    assert both.stderr.strip().splitlines() == [
        "error: 'GPU-77aa' starts more than one GPU's uuid (GPU-77aa0001, GPU-77aa0002, ...):"
        " give more of it"]
    # SQL's wildcards in a prefix are literal characters
    assert gpufleet("inventory", "gpu", "GPU-1_", "--db", url, "-o", "json").exit_code == 0
    assert gpufleet("inventory", "gpu", "GPU-_", "--db", url).exit_code == 1
    unknown = gpufleet("inventory", "gpu", "GPU-ffff", "--db", url)
    assert unknown.exit_code == 1 and "no GPU with uuid GPU-ffff" in unknown.stderr


def test_the_events_table_shows_details_as_json(db_url):
    url = _db_with(db_url)
    table = gpufleet("inventory", "gpu", "GPU-5c0f", "--db", url, env={"COLUMNS": "400"})
    assert table.exit_code == 0, table.output
    events = table.stdout.split("events:")[1].split("allocations:")[0]
    assert "moved" in events
    assert "{'" not in table.stdout and '{"from": {"cluster": "east", "node": "n1"}' in events
