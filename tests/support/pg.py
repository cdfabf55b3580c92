"""PostgreSQL helpers: a throwaway server (the `postgres_server` fixture, and the usage
bench), and fresh databases for tests that need more than the one `pg_url` gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import sqlalchemy as sa

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def _raise(message: str) -> NoReturn:
    raise RuntimeError(message)


@contextmanager
def throwaway_server(fail: Callable[[str], object] = _raise) -> Iterator[str]:
    """A PostgreSQL 15 on a free loopback port for the duration; yields its URL (no database
    part). As root it runs as 'postgres'. It lives in its own /tmp directory because
    pytest's temp tree is private to root and PostgreSQL refuses to run as root. ``fail``
    reports a missing binary or a failed start (pytest.fail in tests) and must not return.
    """
    def tool(name: str) -> str:
        path = shutil.which(name) or (str(PG_BIN / name) if (PG_BIN / name).exists() else None)
        if path is None:
            fail(f"{name} not found: install PostgreSQL 15 (Debian postgresql-15)")
        return str(path)

    def run(args: list[str]) -> None:
        proc = subprocess.run(args, capture_output=True, text=True)
        if proc.returncode != 0:
            fail(f"{' '.join(args)} failed: {proc.stderr.strip() or proc.stdout.strip()}")

    base = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
    data, sock = base / "data", base / "sock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        for path in (base, sock):
            shutil.chown(path, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    try:
        run([*as_user, tool("initdb"), "-D", str(data), "-U", "gpufleet", "--auth=trust",
             "-E", "UTF8"])
        port = _start(as_user, tool("pg_ctl"), data, sock, base / "pg.log", fail)
        yield f"postgresql+psycopg://gpufleet@127.0.0.1:{port}"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run([*as_user, tool("pg_ctl"), "-D", str(data), "-m", "immediate",
                            "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _start(as_user: list[str], pg_ctl: str, data: Path, sock: Path, log: Path,
           fail: Callable[[str], object], attempts: int = 3) -> int:
    """Start the server on a free port, on another when the start fails (a port another
    program took after all); the last failure is reported with the server's own log."""
    from hub.devstack import free_port

    for attempt in range(attempts):
        port = free_port()
        proc = subprocess.run(
            [*as_user, pg_ctl, "-D", str(data), "-l", str(log), "-w", "start", "-o",
             f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"],
            capture_output=True, text=True)
        if proc.returncode == 0:
            return port
        if attempt + 1 == attempts:
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            fail(f"pg_ctl start failed {attempts} times: "
                 f"{proc.stderr.strip() or proc.stdout.strip()}; server log: {tail}")
    raise AssertionError("unreachable")


def create_database(server: str, prefix: str = "t_") -> str:
    """A fresh, empty database on ``server`` (a URL without a database); its URL."""
    name = prefix + uuid.uuid4().hex[:12]
    engine = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()
    return f"{server}/{name}"
