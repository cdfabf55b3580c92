"""A flood of idle connections against `gpufleet serve` (the hardening probe of issue 31):
COUNT connections from one address, each opened again a second after the server closes it,
for SECONDS, while /healthz and a token's /api/v1/clusters are asked twice a second.

The service runs in this process (build_service over an empty SQLite inventory, a static
token), the flood in a child process (tests/support/flood.py) so the two do not share a GIL.
Prints one JSON line: connections the server accepted per second, connections open and
closed to make room (ConnectionGuard), the RSS each open connection costs, /healthz and API
latency (max, p50), and the 1-minute load average before and after (the machine may be
shared). Figures, not assertions.

    python bench/connection_flood.py [--count 2500] [--seconds 25] [--per-client 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hub import inventory as inv  # noqa: E402
from hub.service import Authenticator, Jobs, TokenFile, build_service, token_entry  # noqa: E402

TOKEN = "gpf_connection-flood-bench"


def rss_kib() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2500)
    parser.add_argument("--seconds", type=float, default=25)
    parser.add_argument("--per-client", type=int, default=None,
                        help="lower the idle-per-address bound to see shedding")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-flood-"))
    url = f"sqlite:///{work / 'inventory.db'}"
    engine = inv.make_engine(url, create=True)
    inv.ensure_schema(engine)
    engine.dispose()
    tokens = work / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [token_entry("bench", TOKEN)]}))

    def sync() -> None:
        raise RuntimeError("no sync in this bench")

    service = build_service(Jobs(sync=sync), every=3600, engine=inv.read_only_engine(url),
                            auth=Authenticator(tokens=TokenFile(tokens)),
                            process_metrics=False).start()
    guard = service.server.guard
    if args.per_client:
        guard.per_client = args.per_client
    load_before = os.getloadavg()[0]
    requests.get(service.url + "/healthz", timeout=10)
    rss_before = rss_kib()
    flood = subprocess.Popen([sys.executable, "-m", "tests.support.flood",
                              str(service.server.port), str(args.count), str(args.seconds)],
                             stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert flood.stdout is not None
    flood.stdout.readline()  # "ready": every connection opened once
    time.sleep(1)
    open_now = len(guard.open)
    per_conn = (rss_kib() - rss_before) / max(1, open_now)
    started, accepted = time.monotonic(), guard.opened_total
    health, calls = [], []
    while flood.poll() is None and time.monotonic() - started < args.seconds - 3:
        t = time.monotonic()
        requests.get(service.url + "/healthz", timeout=30)
        health.append(time.monotonic() - t)
        t = time.monotonic()
        r = requests.get(service.url + "/api/v1/clusters", timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}"})
        calls.append(time.monotonic() - t if r.status_code == 200 else float("inf"))
        time.sleep(0.5)
    rate = (guard.opened_total - accepted) / (time.monotonic() - started)
    out = flood.communicate(timeout=120)[0].strip().splitlines()
    service.stop()
    print(json.dumps({
        "flood": args.count, "seconds": args.seconds, "per_client_bound": guard.per_client,
        "accepted_per_s": round(rate), "open": open_now, "shed": guard.shed,
        "rss_kib_per_connection": round(per_conn, 1),
        "healthz_s": {"max": round(max(health), 3), "p50": round(statistics.median(health), 3)},
        "api_s": {"max": round(max(calls), 3), "p50": round(statistics.median(calls), 3)},
        "flood_counts": json.loads(out[-1]) if out else None,
        "load_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}))


if __name__ == "__main__":
    main()
