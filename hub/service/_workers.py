"""Several processes serving one port: `gpufleet serve --workers N`.

One Python process holds the GIL while it serialises an answer, so a single process uses
about one core however many the machine has. The parent binds the listening socket, forks
N workers before any thread or connection exists, and each builds its own service on the
shared socket (the kernel hands each new connection to one worker). Every worker serves;
the leader lock (hub.service._leader) lets exactly one of them, across replicas too, run
the schedule.

The parent only supervises: SIGTERM and SIGINT go on to every worker, and a worker that
ends on its own ends the others too and the parent with its exit code, so the pod restarts
whole (Kubernetes restarts it; nothing here loops on a worker that fails at start).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

log = logging.getLogger("gpufleet.service")


def prefork(workers: int, run: Callable[[], None]) -> None:
    """Run ``run`` in ``workers`` forked processes until they end; exits with the first
    one's code that ended on its own (0 when they all stopped on a signal)."""
    children: set[int] = set()
    stopping: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        stopping.append(signum)
        for pid in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for _ in range(workers):
            pid = os.fork()
            if pid == 0:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                os._exit(_child(run))
            children.add(pid)
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
