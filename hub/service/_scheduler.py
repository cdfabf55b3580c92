"""``gpufleet serve``'s schedule (sync, the jobs after it, the checks, health) and the service
that puts it beside the HTTP side.

The schedule is a plain object, :class:`Scheduler`, over plain callables (:class:`Jobs`): the
sync, the jobs that follow a successful sync (reconcile, prune, usage collect), the
findings provider (report checks) and where their outcome is written (``record_checks``:
the database, hub/service/runtime). Time comes in as ``clock`` and ``sleep`` so tests drive
hours of schedule in microseconds. The scheduler knows nothing about HTTP. The HTTP side
reads what the schedule wrote, from the database (hub.service._status.SharedStatus), never
this process's memory: every worker and replica answers alike. The two meet at the end of
this module: :class:`ServiceMetrics` is the registry ``/metrics`` serves (with its content
negotiation and the API's refusal counter), and :func:`build_service` builds the app
(hub.service._app) over the shared status and the server (hub.service._serve);
:class:`Service` runs the scheduler, the status's refresh and the server on threads for the
command.

Retries are deterministic on purpose: a failed sync is retried after 5 s, 10 s, 20 s ...
capped at the interval, with no jitter. However many processes serve one database (workers,
replicas), one leads (hub.service._leader) and runs the schedule, checks included; the
others only serve what it wrote, and never ask the hub. There is no herd to spread out, and
a fixed sequence is what an operator reading the log and the tests expect.
"""

from __future__ import annotations

import gzip
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.engine import Engine

from hub import __version__
from hub import inventory as inv
from hub.common import InputError
from hub.inventory import LeaseLost, LockHeld, SyncResult
from hub.service._app import build_app
from hub.service._auth import Authenticator
from hub.service._health import Finding, SyncState, describe_error, health
from hub.service._leader import Leadership
from hub.service._models import SEVERITIES
from hub.service._page import SectionSource
from hub.service._serve import Server, ServerCollector
from hub.service._session import DbSessions, Sessions
from hub.service._status import SharedStatus
from hub.service._tls import TlsFiles

log = logging.getLogger("gpufleet.service")

DEFAULT_BACKOFF = 5.0
#: seconds between a follower's tries to lead (and looks for the leader's new syncs)
FOLLOW_EVERY = 2.0


@dataclass
class Jobs:
    """What the scheduler runs. Only ``sync`` is required.

    ``after_sync`` run in order after each successful sync (reconcile goes here); one failing
    is logged and counted, and the others still run. ``findings`` is called after them and
    its answer is kept until the next one: /api/v1/findings and the gpufleet_findings metric
    serve that copy, so a scrape or an API call never runs the checks. ``record_checks``
    writes the checks' outcome where every process reads it (the database), with the
    keywords of hub.inventory.write_checks: ``findings`` and ``checked_at`` after a run,
    ``failed_at`` and ``error`` when the checks could not run.
    """

    sync: Callable[[], SyncResult]
    after_sync: list[Callable[[], None]] = field(default_factory=list)
    findings: Callable[[], list[Finding]] | None = None
    record_checks: Callable[..., None] | None = None


def _job_name(job: Callable[..., Any]) -> str:
    return getattr(job, "__name__", None) or type(job).__name__


class _InventoryCollector(Collector):
    """gpufleet_gpus from the database at scrape time, gpufleet_findings from the last run.

    Reading at scrape time means a sync by another process (a `gpufleet sync` CronJob, a
    second replica) shows too. A failed read drops gpufleet_gpus from that scrape rather than
    failing it, and says so in gpufleet_inventory_read_ok.
    """

    def __init__(self, gpu_counts: Callable[[], list[tuple[str, str, int]]] | None,
                 findings: Callable[[], Iterable[Finding]]) -> None:
        self.gpu_counts = gpu_counts
        self.findings = findings

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # unchecked collector: no database read at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.gpu_counts is not None:
            ok = GaugeMetricFamily("gpufleet_inventory_read_ok",
                                   "1 if this scrape could read the inventory database.")
            try:
                counts = self.gpu_counts()
            except Exception as exc:
                log.warning("metrics: cannot read the inventory: %s", describe_error(exc))
                ok.add_metric([], 0)
            else:
                ok.add_metric([], 1)
                gpus = GaugeMetricFamily(
                    "gpufleet_gpus", "Physical GPUs by cluster and state: delivered, healthy, "
                    "reserved, active (reserved and not idle), and stale (known, not "
                    "reporting); MIG slices not counted.", labels=["cluster", "state"])
                for cluster, state, count in counts:
                    gpus.add_metric([cluster, state], count)
                yield gpus
            yield ok
        by_severity = dict.fromkeys(SEVERITIES, 0)
        for finding in self.findings():
            severity = str(finding.get("severity", "error"))
            by_severity[severity] = by_severity.get(severity, 0) + 1
        family = GaugeMetricFamily("gpufleet_findings",
                                   "Findings of the latest checks by severity.",
                                   labels=["severity"])
        for severity, count in sorted(by_severity.items()):
            family.add_metric([severity], count)
        yield family


class ServiceMetrics:
    """The service's metrics in a registry of its own (no global state between tests)."""

    def __init__(self, *, process: bool = True) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=self.registry)
        self.sync_duration = Histogram(
            "gpufleet_sync_duration_seconds", "Duration of sync attempts (failed ones too).",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=self.registry)
        self.last_success = Gauge(
            "gpufleet_sync_last_success_timestamp_seconds",
            "Unix time of the last successful sync (0 before the first).",
            registry=self.registry)
        self.failures = Counter("gpufleet_sync_failures", "Failed sync attempts.",
                                registry=self.registry)
        self.lock_held = Counter(
            "gpufleet_sync_lock_held", "Sync attempts skipped because another sync held the "
            "inventory lock.", registry=self.registry)
        self.job_failures = Counter(
            "gpufleet_job_failures", "Failures of the jobs run after a sync (reconcile, "
            "findings).", ["job"], registry=self.registry)
        self.refused = Counter(
            "gpufleet_api_refused_requests", "API requests refused: 'unauthenticated' (no or "
            "a bad token, 401) or 'forbidden' (outside the caller's scope, 403).", ["reason"],
            registry=self.registry)
        for reason in ("unauthenticated", "forbidden"):
            self.refused.labels(reason)
        self.leader = Gauge(
            "gpufleet_schedule_leader", "1 if this process runs the schedule (sync, usage "
            "collect), 0 if it only serves: one process across workers and replicas.",
            registry=self.registry)
        info = Gauge("gpufleet_build_info", "gpufleet version.", ["version"],
                     registry=self.registry)
        info.labels(__version__).set(1)

    def watch(self, gpu_counts: Callable[[], list[tuple[str, str, int]]] | None,
              findings: Callable[[], Iterable[Finding]]) -> None:
        self.registry.register(_InventoryCollector(gpu_counts, findings))

    def exposition(self) -> bytes:
        """Prometheus text format 0.0.4."""
        return self.negotiate()[0]

    def negotiate(self, accept: str | None = None, accept_encoding: str | None = None
                  ) -> tuple[bytes, dict[str, str]]:
        """The registry in the format the scraper asks for (Prometheus text 0.0.4 unless it
        asks for OpenMetrics), gzipped when it accepts gzip; and the headers to send."""
        encoder, content_type = choose_encoder(accept or "")
        output = encoder(self.registry)
        headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
        if gzip_accepted(accept_encoding or ""):
            output = gzip.compress(output, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return output, headers


# -- scheduler --------------------------------------------------------------------------------
class Scheduler:
    """Runs the jobs every ``every`` seconds and retries a failed sync with backoff.

    ``clock()`` gives seconds (wall time: they also feed a timestamp metric) and
    ``sleep(seconds)`` waits; by default it waits on the stop event so :meth:`stop` ends a
    wait at once. A sync that succeeds is followed by the next one ``every`` after it started
    (no drift); one that fails is retried after ``backoff * 2**(n-1)`` capped at ``every``;
    one that finds the lock held (another sync is writing the same inventory) is not a
    failure and simply waits for its next turn.
    """

    def __init__(self, jobs: Jobs, every: float, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Any] | None = None,
                 backoff: float = DEFAULT_BACKOFF, metrics: ServiceMetrics | None = None,
                 leader: Leadership | None = None,
                 on_change: Callable[[], Any] = lambda: None) -> None:
        if every <= 0:
            raise InputError("--every must be greater than 0")
        self.jobs = jobs
        self.every = float(every)
        self.backoff = float(backoff)
        self.clock = clock
        self._stop = threading.Event()
        self.sleep = sleep or self._stop.wait
        self.metrics = metrics
        self._lock = threading.Lock()
        self._state = SyncState(started_at=clock())
        #: None: this process always leads (one alone on its database, tests)
        self.leader = leader
        #: called once a sync's outcome or the checks' are written (the readers' refresh)
        self.on_change = on_change
        #: how often a follower tries to lead and looks for a new sync: the longest a dead
        #: leader's schedule waits for another process to take it over
        self.follow_every = min(self.every, FOLLOW_EVERY)

    # state ----------------------------------------------------------------------------------
    @property
    def state(self) -> SyncState:
        with self._lock:
            return self._state

    def _update(self, **changes: Any) -> None:
        with self._lock:
            self._state = replace(self._state, **changes)

    def health(self) -> tuple[bool, dict[str, Any]]:
        state = self.state
        slack = self.follow_every if self.leader is not None and not state.leader else 0.0
        return health(state, self.every, self.clock(), slack)

    def findings(self) -> tuple[list[Finding], float | None]:
        state = self.state
        return list(state.findings), state.findings_at

    def check_failure(self) -> tuple[float, str] | None:
        """When and why the latest checks could not run, if they did not since."""
        state = self.state
        if state.checks_failed_at is None or state.checks_error is None:
            return None
        if state.findings_at is not None and state.findings_at >= state.checks_failed_at:
            return None
        return state.checks_failed_at, state.checks_error

    def retry_delay(self, failures: int) -> float:
        return min(self.every, self.backoff * 2 ** max(0, failures - 1))

    # running --------------------------------------------------------------------------------
    def tick(self) -> float:
        """One attempt (sync, then the follow-up jobs if it worked); returns the delay until
        the next one."""
        started = self.clock()
        self._update(last_attempt_at=started)
        try:
            result = self.jobs.sync()
        except LeaseLost as exc:  # hung or cut off past the lease: another process leads
            log.warning("sync not written: %s", describe_error(exc))
            return self._next(self.follow_every)
        except LockHeld as exc:
            message = describe_error(exc)
            log.info("sync skipped: %s; next try in %gs", message, self.every)
            self._update(lock_held=True)
            if self.metrics:
                self.metrics.lock_held.inc()
            return self._next(self.every)
        except Exception as exc:
            message = describe_error(exc)
            failures = self.state.consecutive_failures + 1
            delay = self.retry_delay(failures)
            failed_at = self.clock()
            self._update(last_error=message, consecutive_failures=failures, lock_held=False,
                         checks_failed_at=failed_at,
                         checks_error=f"sync failed, no checks ran: {message}")
            if self.metrics:
                self.metrics.failures.inc()
                self.metrics.sync_duration.observe(max(0.0, self.clock() - started))
            log.warning("sync failed (%d in a row), retrying in %gs: %s", failures, delay,
                        message)
            self._record(failed_at=failed_at, error=f"sync failed, no checks ran: {message}")
            self.on_change()
            return self._next(delay)
        finished = self.clock()
        self._update(last_success_at=finished, last_result=result, last_error=None,
                     consecutive_failures=0, lock_held=False)
        if self.metrics:
            self.metrics.sync_duration.observe(max(0.0, finished - started))
            self.metrics.last_success.set(finished)
        took = (result.finished_at - result.started_at).total_seconds()
        log.info("sync ok: %d clusters, %d nodes, %d GPUs (%d requests, %.1fs)%s",
                 result.clusters, result.nodes, result.gpus, result.requests, took,
                 f"; {result.note}" if getattr(result, "note", None) else "")
        self.on_change()
        self._after_sync()
        return self._next(max(0.0, started + self.every - self.clock()))

    def _next(self, delay: float) -> float:
        self._update(next_run_at=self.clock() + delay)
        return delay

    def _after_sync(self) -> None:
        for job in self.jobs.after_sync:
            if self._stop.is_set():
                return  # stopping: the next start runs them (a SIGTERM answers in seconds)
            if self.leader is not None and not self.leader.holds():
                log.warning("leader: lease lost after the sync; %s and the rest are left to "
                            "the new leader", _job_name(job))
                return
            self._guarded(_job_name(job), job)
        if self.jobs.findings is not None and not self._stop.is_set():
            provider = self.jobs.findings
            found = self._guarded("findings", lambda: list(provider()))
            at = self.clock()
            if found is not None:
                self._update(findings=tuple(found), findings_at=at)
                self._record(findings=found, checked_at=at)
            else:
                error = "the checks failed after a successful sync (see the service log)"
                self._update(checks_failed_at=at, checks_error=error)
                self._record(failed_at=at, error=error)
            self.on_change()

    def _record(self, **outcome: Any) -> None:
        """The checks' outcome where every process reads it; a failed write is logged and
        counted (the readers keep the previous outcome, and the next run writes again)."""
        if self.jobs.record_checks is not None:
            record = self.jobs.record_checks
            self._guarded("record_checks", lambda: record(**outcome))

    def _guarded(self, name: str, job: Callable[[], Any]) -> Any:
        try:
            return job()
        except Exception as exc:
            if self.metrics:
                self.metrics.job_failures.labels(name).inc()
            log.warning("%s failed after a successful sync: %s", name, describe_error(exc))
            return None

    def run(self) -> None:
        """Tick until :meth:`stop`; the first sync starts at once (in the leader)."""
        try:
            while not self._stop.is_set():
                if not self._leads():  # a follower serves what the leader wrote, no more
                    if not self._stop.is_set():
                        self.sleep(self.follow_every)
                    continue
                delay = self.tick()
                if self._stop.is_set():
                    break
                self.sleep(delay)
        finally:
            if self.leader is not None:
                self.leader.release()

    def _leads(self) -> bool:
        if self.leader is None:
            return True
        try:
            leads = self.leader.acquire()
        except Exception as exc:  # the database is down: nobody can sync into it anyway
            log.warning("leader: cannot reach the database: %s", describe_error(exc))
            leads = False
        if leads != self.state.leader:
            log.info("%s (pid %d)", "leader: this process runs the schedule" if leads
                     else "follower: another process runs the schedule; this one serves",
                     os.getpid())
            self._update(leader=leads, unreadable=None)
            if self.metrics:
                self.metrics.leader.set(1 if leads else 0)
        return leads

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()


# -- the service ------------------------------------------------------------------------------
class Service:
    """A scheduler, the shared status's refresh and the API server on their own threads."""

    def __init__(self, scheduler: Scheduler, server: Server, engine: Engine,
                 status: Any = None) -> None:
        self.scheduler = scheduler
        self.server = server
        self.engine = engine
        #: hub.service._status.SharedStatus: what the HTTP side serves
        self.status = status
        self._thread = threading.Thread(target=self._run_scheduler, name="scheduler",
                                        daemon=True)
        self._refreshing = threading.Event()
        self._refresh = threading.Thread(target=self._run_refresh, name="status",
                                         daemon=True)

    def _run_refresh(self) -> None:
        if self.status is not None:
            self.status.run(self._refreshing)

    def _run_scheduler(self) -> None:
        try:
            self.scheduler.run()
        except BaseException:  # the loop catches job errors; this is a bug, keep serving
            log.exception("the scheduler stopped unexpectedly")
            raise

    @property
    def app(self) -> Any:
        return self.server.app

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> Service:
        if self.status is not None:
            self.status.refresh()  # the first answers already from the database
        self.server.start()
        self._refresh.start()
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop scheduling, wait a little for a sync in flight, stop serving (answers in
        flight finish first).

        A sync still running after ``timeout`` dies with the process: it is one transaction,
        so the database rolls it back and nothing is half-written.
        """
        self.scheduler.stop()
        self._refreshing.set()
        self._thread.join(timeout)
        self.server.stop()


def build_service(jobs: Jobs, *, every: float, engine: Engine, host: str = "127.0.0.1",
                  port: int = 0, clock: Callable[[], float] = time.time,
                  backoff: float = DEFAULT_BACKOFF, process_metrics: bool = True,
                  page_sections: Sequence[SectionSource] = (),
                  auth: Authenticator | None = None, metrics_open: bool = True,
                  tls: TlsFiles | None = None,
                  sessions: Sessions | DbSessions | None = None,
                  prices: Any = None, forwarded_allow_ips: Sequence[str] = (),
                  idle_rule: Any = None, leader: Leadership | None = None,
                  sock: Any = None) -> Service:
    """Wire jobs, metrics and the API over a read-only ``engine``; binds the port now
    (OSError when it cannot; ``sock``: a socket bound already, shared by workers) but starts
    nothing. ``sessions``: where browser sign-ins live (a default store when None; used only
    with ``auth`` configured). ``forwarded_allow_ips``: the proxies whose X-Forwarded-For is
    believed (none: the connection's own address is the client's). ``leader``: the lock that
    decides whether this process runs the schedule (None: it always does)."""
    metrics = ServiceMetrics(process=process_metrics)
    follow = min(float(every), FOLLOW_EVERY)
    # several processes on one database: each may be a refresh behind it
    status = SharedStatus(engine, every, clock=clock, refresh=follow,
                          slack=follow if leader is not None else 0.0)
    scheduler = Scheduler(jobs, every, clock=clock, backoff=backoff, metrics=metrics,
                          leader=leader, on_change=status.refresh)
    metrics.last_success.set_function(status.last_success)

    def counts() -> list[tuple[str, str, int]]:
        """Per cluster the fleet states (delivered, healthy, reserved, active: issue 38) by
        the service's idle rule, and the stale GPUs."""
        from hub import usage

        with engine.connect() as conn:
            stale = [row for row in inv.gpu_counts(conn) if row[1] == inv.STALE]
            rule = idle_rule or usage.IdleRule()
            idle = usage.idle_now(conn, inv.now_utc(), threshold=rule.threshold,
                                  for_seconds=rule.for_seconds)
            states = inv.fleet_states(conn, by=("cluster",), idle=idle)
        return sorted([*stale, *((r["cluster"], state, r[state]) for r in states
                                 for state in inv.STATES)])

    metrics.watch(counts, lambda: status.findings()[0])
    app = build_app(engine, health=status.health, findings=status.findings,
                    metrics=metrics.negotiate, check_failure=status.check_failure,
                    page_sections=page_sections, auth=auth, metrics_open=metrics_open,
                    on_refused=lambda reason: metrics.refused.labels(reason).inc(),
                    sessions=sessions, secure_cookies=tls is not None, prices=prices,
                    idle_rule=idle_rule)
    server = Server(app, host, port, tls=tls, forwarded_allow_ips=forwarded_allow_ips,
                    sock=sock)
    metrics.registry.register(ServerCollector(server.guard, tls))
    return Service(scheduler, server, engine, status)
