"""What every process of `gpufleet serve` answers about the schedule, read from the database.

However many processes serve one database (workers, replicas, a `gpufleet sync` CronJob
beside them), the answers about the sync and the checks come from what was written there,
never from one process's memory: the sync's outcome from ``sync_runs`` (whoever synced), the
findings and the latest failure to check from ``service_checks`` (the leader writes it after
each run of the checks, hub/service/runtime). So every worker and replica gives the same
/healthz verdict, the same findings, the same badge and the same
``gpufleet_sync_last_success_timestamp_seconds``; a process that has no check result says so
("not checked yet") rather than showing an empty, green list.

:class:`SharedStatus` keeps the latest read as one immutable snapshot, refreshed every
``every`` seconds on a thread of its own (:meth:`SharedStatus.run`) and at once after the
leader wrote: the HTTP side reads the snapshot, so a probe or the page never waits for the
database on the event loop, and an answer is at most one refresh (2 s) behind the database.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from hub import inventory as inv
from hub.inventory import SyncResult
from hub.service._health import Finding, SyncState, describe_error, health

log = logging.getLogger("gpufleet.service")

#: seconds between two reads of the shared state (and the longest an answer lags behind it)
REFRESH = 2.0
NOT_CHECKED = "not checked yet"


@dataclass(frozen=True)
class Snapshot:
    """The latest read: the sync's outcome and the checks (None: never checked)."""

    sync: SyncState
    checks: inv.Checks | None = None


def _epoch(value: dt.datetime | None) -> float | None:
    return None if value is None else value.replace(tzinfo=dt.UTC).timestamp()


def read_sync_state(conn: Connection, started_at: float) -> SyncState:
    """The sync's outcome as ``sync_runs`` has it, whoever synced: the latest successful run,
    and the failed runs since (how many, the newest's error)."""
    runs = inv.sync_runs
    ok = conn.execute(sa.select(runs).where(runs.c.status == "ok")
                      .order_by(runs.c.id.desc()).limit(1)).first()
    since = runs.c.id > ok.id if ok is not None else sa.true()
    failed = conn.execute(sa.select(runs.c.error, runs.c.finished_at).where(
        runs.c.status != "ok", since).order_by(runs.c.id.desc()).limit(1)).first()
    failures = int(conn.execute(sa.select(sa.func.count()).select_from(runs).where(
        runs.c.status != "ok", since)).scalar_one()) if failed is not None else 0
    result = None
    if ok is not None and ok.finished_at is not None:
        result = SyncResult(ok.started_at, ok.finished_at, ok.requests, ok.clusters or 0,
                            ok.nodes or 0, ok.gpus or 0, ok.error, ok.shards or 1)
    return SyncState(started_at=started_at,
                     last_success_at=_epoch(ok.finished_at) if ok is not None else None,
                     last_result=result, consecutive_failures=failures,
                     last_error=failed.error if failed is not None else None,
                     last_attempt_at=_epoch(failed.finished_at) if failed is not None else None)


class SharedStatus:
    """The schedule's outcome as every process serves it (see the module's docstring).

    ``engine``: read-only is enough. ``every``: the sync interval (/healthz's two
    intervals); ``slack``: how far behind the database a snapshot may be (the refresh), so
    a process that last read just before a sync's end does not turn unhealthy for it.
    """

    def __init__(self, engine: Engine | None, every: float, *, slack: float = 0.0,
                 clock: Callable[[], float] = time.time, refresh: float = REFRESH) -> None:
        self.engine = engine
        self.every = every
        self.slack = slack
        self.clock = clock
        self.refresh_every = refresh
        self._started = clock()
        self._snapshot = Snapshot(SyncState(started_at=self._started))
        self._lock = threading.Lock()

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def refresh(self) -> Snapshot:
        """Read the database now; a failed read keeps the checks and says the database
        cannot be read (/healthz answers 503 with why)."""
        if self.engine is None:
            return self._snapshot
        with self._lock:
            before = self._snapshot
            try:
                with self.engine.connect() as conn:
                    sync = read_sync_state(conn, self._started)
                    checks = before.checks
                    version = inv.checks_version(conn)
                    if version is None:
                        checks = None
                    elif checks is None or checks.version != version:
                        checks = inv.read_checks(conn)
            except Exception as exc:
                message = describe_error(exc)
                if before.sync.unreadable is None:
                    log.warning("cannot read the service's state: %s", message)
                sync = SyncState(started_at=self._started, unreadable=message)
                self._snapshot = Snapshot(sync, before.checks)
                return self._snapshot
            self._snapshot = Snapshot(sync, checks)
            return self._snapshot

    def run(self, stop: threading.Event) -> None:
        """Refresh until ``stop``."""
        while not stop.is_set():
            self.refresh()
            stop.wait(self.refresh_every)

    # -- what the HTTP side reads -------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]:
        return health(self._snapshot.sync, self.every, self.clock(), self.slack)

    def findings(self) -> tuple[list[Finding], float | None]:
        checks = self._snapshot.checks
        if checks is None or checks.checked_at is None:
            return [], None
        return list(checks.findings), checks.checked_at

    def check_failure(self) -> tuple[float, str] | None:
        """When and why the latest checks could not run, if none ran since."""
        checks = self._snapshot.checks
        if checks is None or checks.failed_at is None or checks.error is None:
            return None
        if checks.checked_at is not None and checks.checked_at >= checks.failed_at:
            return None
        return checks.failed_at, checks.error

    def last_success(self) -> float:
        """Epoch seconds of the latest successful sync in the database (0: none yet)."""
        return self._snapshot.sync.last_success_at or 0.0
