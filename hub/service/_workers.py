"""Several processes serving one port: `gpufleet serve --workers N`, and what each runs.

One Python process holds the GIL while it serialises an answer, so a single process uses
about one core however many the machine has. The parent binds the listening socket, forks
N workers before any thread or connection exists, and each builds its own service on the
shared socket (the kernel hands each new connection to one worker). Every worker serves;
the leader lock (hub.service._leader) lets exactly one of them, across replicas too, run
the schedule.

:func:`serve` is the whole of `gpufleet serve` once its options are checked: it hands the one
settings value (hub.service._settings.ServeSettings) to every worker, and :func:`worker` builds
that process's own authenticator, hub client, engines, jobs and service from it.

The parent only supervises: SIGTERM and SIGINT go on to every worker, and a worker that
ends on its own ends the others too and the parent with its exit code, so the pod restarts
whole (Kubernetes restarts it; nothing here loops on a worker that fails at start).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from sqlalchemy.engine import Engine

from hub import inventory as inv
from hub.common import InputError, format_duration, on_sigterm
from hub.service._health import describe_error
from hub.service._leader import BEAT, leadership
from hub.service._page import usage_sections
from hub.service._scheduler import Service, build_service
from hub.service._serve import bind
from hub.service._session import DbSessions
from hub.service._settings import ServeSettings
from hub.service.runtime import service_jobs
from hub.store import HubClient

log = logging.getLogger("gpufleet.service")
#: what the parent passes on to its workers
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve(settings: ServeSettings) -> None:
    """Serve until SIGTERM (exit 0) or Ctrl-C (130): in this process with one worker, else
    in ``settings.workers`` forked ones (default: the CPUs available) sharing one socket."""
    count = settings.workers or available_cpus()
    if count == 1:
        worker(settings)
        return
    try:  # one socket, bound here, accepted from by every worker
        sock = bind(settings.host, settings.port, listen=False)
    except OSError as exc:
        raise InputError(f"cannot listen on {settings.listen}: {exc.strerror or exc}") from None
    with inv.open_engine(settings.db, create=True) as engine:  # before the workers race for it
        prepare_schema(engine)
    # The start banner and the shutdown line are the service's, not one per worker: each
    # worker sends its lines to the parent (one write per line on a pipe, atomic under
    # PIPE_BUF), which says each once.
    heard, tell = os.pipe()

    def run() -> None:
        os.close(heard)
        worker(settings, sock, say=lambda line: _tell(tell, line))

    announcer = threading.Thread(target=_say_once, args=(heard,), name="banner", daemon=True)

    def forked() -> None:  # threads only after the last fork
        os.close(tell)
        announcer.start()

    try:
        prefork(count, run, forked=forked)
    finally:
        if announcer.ident is not None:
            announcer.join(timeout=1.0)


def _tell(fd: int, line: str) -> None:
    data = line.replace("\n", " ").encode()[:select.PIPE_BUF - 1] + b"\n"
    with contextlib.suppress(OSError):  # the parent gone: nobody to tell
        os.write(fd, data)


def _say_once(fd: int) -> None:
    """Echo each line the workers send the first time it comes, until every worker has
    closed the pipe."""
    said: set[bytes] = set()
    with os.fdopen(fd, "rb") as lines:
        for line in lines:
            if line not in said:
                said.add(line)
                click.echo(line.decode(errors="replace").rstrip("\n"), err=True)


def _say(line: str) -> None:
    click.echo(line, err=True)


def worker(settings: ServeSettings, sock: Any = None,
           say: Callable[[str], None] = _say) -> None:
    """One serving process: everything live is made here from ``settings`` (no HTTP session
    or database connection is shared over a fork), then it serves until told to stop."""
    auth = settings.authenticator()
    if auth.oidc is not None:
        auth.oidc.jwks.warm()
    stopping = threading.Event()  # SIGTERM: set at once, so long work ends between steps
    with HubClient.from_settings(settings.hub) as client, \
            inv.open_engine(settings.db, create=True) as engine:
        readonly = inv.read_only_engine(settings.db)
        try:
            leader = leadership(engine, beat=min(settings.every, BEAT))
            jobs = service_jobs(engine, client, settings, stopping=stopping.is_set,
                                leader=leader)
            try:  # bind first: a port in use fails before anything touches the database
                service = build_service(
                    jobs, every=settings.every, engine=readonly, host=settings.host,
                    port=settings.port, page_sections=usage_sections(settings.idle_rule),
                    auth=auth, metrics_open=settings.metrics_open, tls=settings.tls(),
                    sessions=DbSessions(engine, ttl=settings.session_ttl),
                    prices=settings.prices, idle_rule=settings.idle_rule,
                    forwarded_allow_ips=settings.forwarded_allow_ips,
                    leader=leader, sock=sock)
            except OSError as exc:
                reason = exc.strerror or str(exc)
                raise InputError(f"cannot listen on {settings.listen}: {reason}") from None
            try:
                prepare_schema(engine)
            except BaseException:
                service.server.close()
                raise
            _run(service, client, engine, settings.every, stopping, say)
        finally:
            readonly.dispose()


def prepare_schema(engine: Engine) -> None:
    """Create the schema now so the API answers before the first sync finishes.

    An old schema is the user's to upgrade (exit 2, as `sync` does); a database that is not
    up yet is the scheduler's business: it retries with backoff and /healthz says why.
    """
    try:
        inv.ensure_schema(engine)
    except InputError:
        raise
    except Exception as exc:
        log.warning("inventory database not ready yet: %s", describe_error(exc))


def _run(service: Service, client: HubClient, engine: Engine, every: float,
         stop: threading.Event, say: Callable[[str], None]) -> None:
    """Serve until ``stop`` (SIGTERM); Ctrl-C stays a KeyboardInterrupt (130)."""
    with on_sigterm(lambda signum, frame: stop.set()):
        service.start()
        say(f"gpufleet serve: {service.url} (sync every {format_duration(every)} from "
            f"{client.safe_url} into {inv.safe_url(engine)})")
        try:
            while not stop.wait(0.5):
                pass
            say("gpufleet serve: terminated, shutting down")
        finally:
            service.stop()


def prefork(workers: int, run: Callable[[], None],
            forked: Callable[[], None] | None = None) -> None:
    """Run ``run`` in ``workers`` forked processes until they end; exits with the first
    one's code that ended on its own (0 when they all stopped on a signal). ``forked`` runs
    in the parent once every worker is forked (where it may start threads)."""
    children: set[int] = set()
    stopping: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        stopping.append(signum)
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in SIGNALS}
    try:
        for _ in range(workers):
            if stopping:  # told to stop while forking: start no more
                break
            if _fork(previous, children) == 0:
                os._exit(_child(run))
        if forked is not None:
            forked()
        code = 0
        while children:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            children.discard(pid)
            ended = os.waitstatus_to_exitcode(status)
            if not stopping:  # a worker ended on its own: end the others, exit with it
                log.warning("worker %d ended (exit %d): stopping the others", pid, ended)
                code = ended if ended > 0 else 1
                forward(signal.SIGTERM, None)
        if stopping and stopping[0] == signal.SIGINT:
            code = 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code:
        raise SystemExit(code)


def _fork(handlers: dict[signal.Signals, Any], children: set[int]) -> int:
    """fork() with SIGTERM and SIGINT held back across it: a signal that arrives meanwhile
    reaches the parent once the child is in ``children`` (so it is passed on to it too), and
    the child once its own handlers are back (the default: it ends at once while it starts
    up). Without this, a child signalled before it reset its handlers ran the parent's,
    passed the signal on to its siblings and went on starting up, never to stop; and one
    forked as the signal came was never told."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        pid = os.fork()
        if pid == 0:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        else:
            children.add(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
    return pid


def _child(run: Callable[[], None]) -> int:
    try:
        return _worker(run)
    finally:  # os._exit skips the interpreter's own flush
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def _worker(run: Callable[[], None]) -> int:
    try:
        run()
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", os.getpid())
        return 1
    return 0


def available_cpus() -> int:
    """CPUs this process may use: its affinity, capped by a cgroup CPU limit (a pod's
    ``resources.limits.cpu``, which sched_getaffinity does not see), at least one."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpus()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_cpus(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """cgroup v2 ``cpu.max`` ("max 100000" or "200000 100000"), else v1's quota/period."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
