"""Where a sync's store cost goes: each request of its plan asked alone, one real Prometheus.

Builds the fleet of ``bench/sync_bench.py`` (same shapes), then, on the one store:

- raw: one instant selector per family the inventory reads, one after the other (the
  goal's yardstick), its store CPU the best of ``--repeat`` runs;
- the steady sync's plan (the planning request, which asks the sources alone, then every
  shard's query set, exactly as ``gpufleet sync`` builds them with its default shard
  size and the metric names the store holds), every request asked alone
  ``--repeat`` times: one JSON line per query kind (vendor, kind, field), its store CPU
  and wall seconds summed over the shards (the best run of each request), split into the
  named shards' and the complement's; a first sync's planning request (it counts the
  GPUs per cluster) on a line of its own;
- the same plan with ``--query-concurrency`` requests in flight, as the sync asks it (its
  store CPU, best of ``--repeat``);
- a last line with the totals and ``plan_vs_raw``, the issue's ratio.

Store CPU is utime + stime of the Prometheus process from /proc. ``--hold SECONDS`` keeps the
store up afterwards (its URL and pid in ``--hold-file``) for experiments by hand.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import tempfile
import threading
import time
from pathlib import Path

import requests
from sync_bench import (  # type: ignore[import-not-found]
    ACM_SAMPLES,
    SAMPLES,
    STALE_AFTER,
    fleet_store,
    hub_cpu,
    read_families,
)

from hub import store
from hub.common import format_duration
from hub.inventory import _sync


def ask(session: requests.Session, url: str, promql: str, at: float) -> int:
    """One request, its answer decoded (as the sync decodes it: gzip, JSON); rows returned."""
    r = session.post(f"{url}/api/v1/query", data={"query": promql, "time": f"{at:.3f}"},
                     timeout=600)
    body = json.loads(r.content)
    if body.get("status") != "success":
        raise SystemExit(f"query failed: {body.get('error')}: {promql[:200]}")
    return len(body["data"]["result"])


def alone(session: requests.Session, url: str, pid: int, promql: str, at: float,
          repeat: int) -> tuple[float, float, int]:
    """(store CPU s, wall s, rows): the best of ``repeat`` runs of one request."""
    best: tuple[float, float, int] | None = None
    for _ in range(repeat):
        cpu, started = hub_cpu(pid), time.perf_counter()
        rows = ask(session, url, promql, at)
        run = (hub_cpu(pid) - cpu, time.perf_counter() - started, rows)
        best = run if best is None or run < best else best
    assert best is not None
    return best


def in_flight(url: str, pid: int, queries: list[str], at: float, concurrency: int
              ) -> tuple[float, float]:
    """(store CPU s, wall s) of every request with ``concurrency`` in flight."""
    local = threading.local()

    def one(promql: str) -> int:
        if not hasattr(local, "session"):
            local.session = requests.Session()
        return ask(local.session, url, promql, at)

    cpu, started = hub_cpu(pid), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=concurrency) as pool:
        for done in pool.map(one, queries):
            del done
    return hub_cpu(pid) - cpu, time.perf_counter() - started


def profile(url: str, pid: int, window: float, repeat: int, concurrency: int,
            shard_size: int) -> list[dict]:
    at = time.time()
    span, step = format_duration(window), format_duration(_sync.subquery_step(window))
    lines: list[dict] = []
    with requests.Session() as session:
        raw = [name for _, name in read_families()]
        for q in raw:  # warm the store's caches for every side
            ask(session, url, q, at)
        raw_cpu = min(sum(alone(session, url, pid, q, at, 1)[0] for q in raw)
                      for _ in range(repeat))
        client = store.HubClient(url)
        counts, _ = _sync.cluster_counts(client, span, "cluster", at)
        shards = store.plan_shards(counts, shard_size, "cluster")
        # a steady sync plans from the inventory and asks the sources alone; the count is
        # a first sync's (shown apart, not in the plan's totals)
        counted = alone(session, url, pid, store.planning_query(span, "cluster"), at, repeat)
        lines.append({"vendor": "planning", "kind": "first sync's count", "field": "",
                      "cpu_s": round(counted[0], 3), "wall_s": round(counted[1], 3)})
        plan = [("planning", "", "", False,
                 store.planning_query(span, "cluster", count=False))]
        # the names the store holds leave out the queries of the others, as the sync's do
        held = client.metric_names(at - window - _sync.subquery_step(window), at)
        plan += [(q.vendor, q.kind, q.field or "", shard.rest, q.promql)
                 for shard in shards
                 for q in store.sync_queries(span, step, "cluster", shard.matcher, at=at,
                                             held=held)]
        by_kind: dict[tuple[str, str, str], collections.Counter[str]] = {}
        for vendor, kind, fld, rest, promql in plan:
            cpu, wall, rows = alone(session, url, pid, promql, at, repeat)
            c = by_kind.setdefault((vendor, kind, fld), collections.Counter())
            c["requests"] += 1
            c["cpu_s"] += cpu
            c["wall_s"] += wall
            c["rows"] += rows
            c["rest_cpu_s" if rest else "named_cpu_s"] += cpu
    total = collections.Counter[str]()
    for (vendor, kind, fld), c in sorted(by_kind.items(), key=lambda kv: -kv[1]["cpu_s"]):
        total.update(c)
        lines.append({"vendor": vendor, "kind": kind, "field": fld,
                      **{k: round(v, 3) if isinstance(v, float) else v for k, v in c.items()}})
    runs = [in_flight(url, pid, [p[-1] for p in plan], at, concurrency) for _ in range(repeat)]
    flight_cpu, flight_wall = min(runs)
    lines.append({
        "total": True, "shards": len(shards), "requests": len(plan),
        "plan_alone_cpu_s": round(total["cpu_s"], 2),
        "plan_alone_wall_s": round(total["wall_s"], 2),
        "plan_in_flight_cpu_s": round(flight_cpu, 2),
        "plan_in_flight_wall_s": round(flight_wall, 2),
        "raw_cpu_s": round(raw_cpu, 2),
        "plan_vs_raw": round(flight_cpu / raw_cpu, 2) if raw_cpu else None,
        "load_avg": round(os.getloadavg()[0], 2),
    })
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--shape", choices=["dcgm", "acm"], default="acm")
    parser.add_argument("--window", type=float, default=STALE_AFTER)
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each request; the best is kept")
    parser.add_argument("--query-concurrency", type=int, default=_sync.DEFAULT_QUERY_CONCURRENCY)
    parser.add_argument("--shard-size", type=int, default=_sync.DEFAULT_SHARD_SIZE)
    parser.add_argument("--hold", type=float, default=0.0,
                        help="seconds to keep the store up afterwards")
    parser.add_argument("--hold-file", type=Path, default=Path("/tmp/gpufleet-store.json"))
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    acm = args.shape == "acm"
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp, \
            fleet_store(args.gpus, Path(tmp), ACM_SAMPLES if acm else SAMPLES, acm,
                        args.window) as (hub, pid, _):
        for line in profile(hub.url, pid, args.window, args.repeat, args.query_concurrency,
                            args.shard_size):
            print(json.dumps(line), flush=True)
        if args.hold:
            args.hold_file.write_text(json.dumps({"url": hub.url, "pid": pid}))
            time.sleep(args.hold)


if __name__ == "__main__":
    main()
