"""Where `gpufleet serve`'s CPU goes under bench/serve_load.py's mix, on the same inventory
(10,000 GPUs by default, built by serve_load's ``fill``).

Two figures, both on SQLite:

* ``--per-endpoint``: the service as its own process (serve_load's ``service``), one
  keep-alive client asking each endpoint of the mix ``--repeat`` times in a row; the
  service's CPU time (from /proc) per answer, endpoint by endpoint. A sequential client
  leaves the service nothing to queue, so this is its cost per answer, not a latency.
* ``--profile`` (default): the same app, built as `serve` builds it (tokens file, browser
  sessions in the database, the usage sections of the page), on uvicorn in this process,
  under one cProfile per server thread timed by that thread's CPU clock
  (``time.thread_time``), with serve_load's clients in threads that are not profiled.
  Prints the functions that cost most, own and cumulative, and the share of a few groups
  (pydantic, SQLAlchemy, starlette/fastapi, uvicorn/h11, json, the confine walk, the memo).
  cProfile inflates Python-heavy code (SQLAlchemy, the walk) against C and Rust (pydantic-
  core, json): read the shares as where to look, and the per-endpoint figures as the cost.

    python bench/serve_profile.py [--gpus 10000] [--seconds 20] [--clients 10]
                                  [--per-endpoint [--repeat 300]] [--top 40]
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import json
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import serve_load  # noqa: E402

#: groups of the profile by the file a function lives in (first match wins)
GROUPS = [("pydantic", ("pydantic",)), ("sqlalchemy", ("sqlalchemy",)),
          ("sqlite3", ("sqlite3",)), ("fastapi", ("fastapi",)),
          ("starlette", ("starlette",)), ("uvicorn+h11", ("uvicorn", "h11")),
          ("asyncio+anyio", ("asyncio", "anyio", "concurrent")), ("json", ("json",)),
          ("confine", ("_confine.py",)), ("memo", ("_memo.py",)),
          ("hub other", ("hub/",)), ("python other", ("",))]


def per_endpoint(gpus: int, repeat: int) -> dict[str, Any]:
    """The service's CPU ms per answer, each endpoint of serve_load's mix asked in a row."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        uuids = serve_load.fill(url, gpus)
        clusters = serve_load.cluster_names(gpus)
        with serve_load.service(url, Path(tmp)) as (port, pid):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            headers = {"Authorization": f"Bearer {serve_load.TOKEN}"}

            def ask(path: str) -> bytes:
                conn.request("GET", path, headers=headers)
                response = conn.getresponse()
                body = response.read()
                if response.status >= 400 and not path.startswith("/healthz"):
                    raise SystemExit(f"{path}: {response.status} {body[:200]!r}")
                return body

            out: dict[str, Any] = {}
            names = [name for name, _ in serve_load.rounds(0, uuids, clusters, None)]
            for name in names:
                token = None
                paths = []
                for n in range(repeat):  # the mix's own variety: other GPUs, clusters, pages
                    path = dict([*serve_load.rounds(n, uuids, clusters, token),
                                 ("page", "/")])[name]
                    paths.append(path)
                    if name == "gpus":
                        token = None if n % 20 == 0 else json.loads(ask(path)).get("continue")
                for path in paths[:5]:
                    ask(path)  # warm: memo, statement cache
                before = serve_load.cpu_s(pid)
                started = time.monotonic()
                for path in paths:
                    ask(path)
                out[name] = {"cpu_ms": round((serve_load.cpu_s(pid) - before) * 1000 / repeat, 2),
                             "wall_ms": round((time.monotonic() - started) * 1000 / repeat, 2)}
            conn.close()
    weights = {name: 1.0 for name in names}
    weights["page"] = 0.1  # every tenth round
    mix = sum(out[n]["cpu_ms"] * w for n, w in weights.items()) / sum(weights.values())
    return {"gpus": gpus, "repeat": repeat, "by_endpoint": out,
            "mix_cpu_ms_per_request": round(mix, 2)}


def profile(gpus: int, seconds: float, clients: int, top: int) -> None:
    import yaml

    from hub.inventory import make_engine
    from hub.service import (
        Authenticator,
        DbSessions,
        TokenFile,
        build_app,
        read_only_engine,
        token_entry,
    )
    from hub.service._page import usage_sections
    from hub.service._serve import Server
    from hub.usage import IdleRule

    profiles: list[cProfile.Profile] = []

    def start_profile(*_: Any) -> None:
        sys.setprofile(None)
        if threading.current_thread().name.startswith("load-client"):
            return
        prof = cProfile.Profile(time.thread_time)
        profiles.append(prof)
        prof.enable()

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        uuids = serve_load.fill(url, gpus)
        clusters = serve_load.cluster_names(gpus)
        tokens = Path(tmp) / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"tokens": [token_entry("bench", serve_load.TOKEN)]}))
        rule = IdleRule()
        writer = make_engine(url, create=True)
        app = build_app(read_only_engine(url), health=lambda: (True, {
            "status": "ok", "interval_seconds": 3600.0, "last_success": None,
            "last_success_age_seconds": None, "last_error": None, "consecutive_failures": 0}),
            findings=lambda: ([], None), metrics=lambda a, e: (b"", {}),
            page_sections=usage_sections(rule), auth=Authenticator(tokens=TokenFile(tokens)),
            sessions=DbSessions(writer), idle_rule=rule)
        threading.setprofile(start_profile)
        server = Server(app).start()
        results: list[tuple[str, float, bool]] = []
        stop = time.monotonic() + seconds
        threads = [threading.Thread(target=serve_load.client, name=f"load-client-{k}",
                                    args=(server.port, uuids, clusters, stop, results, 1000 * k))
                   for k in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        threading.setprofile(None)
        for prof in profiles:
            prof.disable()
        server.stop()
        writer.dispose()
    stats = pstats.Stats(*profiles) if profiles else None
    if stats is None:
        raise SystemExit("nothing profiled")
    total = sum(tt for (_, _, tt, _, _) in stats.stats.values())  # type: ignore[attr-defined]
    groups: dict[str, float] = {}
    for (filename, _, _), (_, _, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        name = next(g for g, marks in GROUPS if any(m in filename for m in marks))
        groups[name] = groups.get(name, 0.0) + tt
    print(json.dumps({"requests": len(results), "profiled_cpu_s": round(total, 2),
                      "profiled_cpu_ms_per_request": round(total * 1000 / max(1, len(results)), 2),
                      "own_time_share": {k: round(v / total, 3) for k, v in
                                         sorted(groups.items(), key=lambda kv: -kv[1])}}))
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--per-endpoint", action="store_true")
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args()
    if args.per_endpoint:
        print(json.dumps(per_endpoint(args.gpus, args.repeat)))
    else:
        profile(args.gpus, args.seconds, args.clients, args.top)


if __name__ == "__main__":
    main()
