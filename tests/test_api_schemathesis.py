"""schemathesis against the running service's own OpenAPI description, every check on.

The service runs on PostgreSQL (where a NUL byte once answered 503) with a real inventory
synced from a real hub Prometheus, behind a static token. schemathesis is the client: it
generates valid and invalid requests from /api/v1/openapi.json, tries undeclared methods and
requests without the token, and checks every answer against the description.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from hub.inventory import _db as inventory
from hub.inventory import read_only_engine, run_sync
from hub.service import Authenticator, Jobs, Service, TokenFile, build_service, token_entry
from hub.store import HubClient
from tests.test_api import _database, hub_store, wait_healthy  # noqa: F401  (module fixture)

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).parent / "fixtures" / "schemathesis.toml"
TOKEN = "gpf_schemathesis-test-token"
SCOPED = "gpf_schemathesis-scoped-token"


@pytest.fixture(scope="module")
def service(request: pytest.FixtureRequest, hub_store: str,  # noqa: F811
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    db_url = _database("postgresql", request, tmp_path_factory.mktemp("st-db"))
    write = inventory.make_engine(db_url, create=True)
    client = HubClient(hub_store, timeout=10)
    tokens = tmp_path_factory.mktemp("st") / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        token_entry("schemathesis", TOKEN),
        token_entry("team", SCOPED, clusters=["east"], namespaces=["dynamo-workload"]),
    ]}))

    def sync() -> Any:
        return run_sync(write, client, stale_after=600)

    started = build_service(Jobs(sync=sync), every=3600, engine=read_only_engine(db_url),
                            auth=Authenticator(tokens=TokenFile(tokens)),
                            process_metrics=False).start()
    try:
        wait_healthy(started.url)
        yield started
    finally:
        started.stop()
        started.engine.dispose()
        write.dispose()


@pytest.mark.parametrize("token", [TOKEN, SCOPED], ids=["whole-fleet", "scoped"])
def test_schemathesis_finds_nothing_with_every_check(service, token, tmp_path, capfd):
    """Scoped too: its 403s must be ones the description declares."""
    gpus = requests.get(service.url + "/api/v1/gpus", timeout=10,
                        headers={"Authorization": f"Bearer {TOKEN}"}).json()["items"]
    # A real uuid for /gpus/{uuid}, so the detail endpoint is exercised beyond its 404.
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG.read_text() + "\n[[operations]]\n"
                      'include-path = "/api/v1/gpus/{uuid}"\n'
                      f'parameters = {{ uuid = "{gpus[0]["uuid"]}" }}\n')
    # its CLI through this interpreter: a layered venv need not carry the console script
    cli = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()"]
    proc = subprocess.run(
        [*cli, "--config-file", str(config), "run", service.url + "/api/v1/openapi.json",
         "--checks", "all", "-H", f"Authorization: Bearer {token}", "--max-examples", "40",
         "--seed", "14", "--request-timeout", "20"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    paths = requests.get(service.url + "/api/v1/openapi.json", timeout=10,
                         headers={"Authorization": f"Bearer {TOKEN}"}).json()["paths"]
    # every operation (sign-in and sign-out included) but the description itself, which
    # schemathesis leaves out
    operations = sum(len(methods) for methods in paths.values())
    assert "post" in paths["/login"] and "post" in paths["/logout"]
    assert f"Tested: {operations - 1}" in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in capfd.readouterr().err
