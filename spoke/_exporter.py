"""The collection loop and the snapshot that scrapes read.

A background thread asks the backend every ``interval`` and builds a complete, immutable
``Snapshot``: the metric families and their text exposition, rendered once (the families
the private registry yields, written the way dcgm-exporter writes them). One attribute
assignment publishes it. A scrape only sends the current snapshot's bytes, so it never
waits on the GPU library or the kubelet (a hung NVML call makes the data age, visible in
``gpufleet_exporter_last_collect_timestamp_seconds`` and /healthz; it does not make
Prometheus time out), and its cost does not grow with the number of GPUs: rendering 64
GPUs' series per scrape took most of a 10 ms budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from hub import __version__
from spoke import _naming
from spoke._edges import Edges
from spoke._model import Backend, Collection, Failure
from spoke._naming import Field, Pods


class PodSource(Protocol):
    """Where pod attribution comes from (the kubelet's pod-resources API in production).

    ``devices`` returns device id -> pods now; it must return within its own bounded timeout
    and raise on failure (the pass then publishes its series without pod labels).
    """

    def devices(self) -> Pods: ...

log = logging.getLogger("spoke.exporter")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scrape returns, fixed at the end of a collection pass."""

    families: tuple[Metric, ...]
    #: Prometheus text format (0.0.4) of ``families``
    text: bytes = b""
    #: monotonic time the pass finished; None before the first pass
    finished_at: float | None = None
    ok: bool = False
    gpus: int = 0
    failures: tuple[Failure, ...] = ()


class _SnapshotCollector(Collector):
    """Yields the families of whatever snapshot is current when the scrape starts."""

    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterator[Metric]:
        return iter(self._exporter.snapshot.families)


class Exporter:
    """Runs a backend on an interval and serves its last result as Prometheus text.

    The registry is private (no process/platform collectors, no ``_created`` series), so the
    output holds exactly the vendor series and our own health series.
    """

    def __init__(self, backend: Backend, *, hostname: str, interval: float = 30.0,
                 version: str = __version__, stall_after: float | None = None,
                 fields: Sequence[Field] | None = None, pods: PodSource | None = None,
                 edges: Edges | None = None,
                 naming: str = _naming.LEGACY,
                 clock: Callable[[], float] = time.time,
                 timer: Callable[[], float] = time.perf_counter,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self.backend = backend
        self.hostname = hostname
        self.interval = interval
        self.version = version
        #: /healthz fails when no pass has finished for this long (a hung library call)
        self.stall_after = stall_after if stall_after is not None else 3 * interval + 10
        self._clock, self._timer, self._monotonic = clock, timer, monotonic
        #: the published subset of the vendor's fields (None: the default set)
        self.fields = tuple(fields) if fields is not None else None
        _naming.check_naming(backend.vendor, naming)
        #: NVIDIA series under dcgm-exporter's legacy names or DCGM 4.7's (``--sim-naming``)
        self.naming = naming
        self.pods = pods
        #: allocation edges from the pods' devices (spoke/_edges.py); None: not published
        self.edges = edges
        self._pods_ok: bool | None = None
        self._errors_total = 0
        self._last_success: float | None = None
        self._failing: set[int] = set()
        self._snapshot = self._build(tuple(self._health(up=False, duration=None)))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_SnapshotCollector(self))

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- collection ---------------------------------------------------------------------
    def collect_once(self) -> Snapshot:
        """One pass: ask the backend, build the snapshot, publish it. Never raises."""
        started = self._timer()
        ok = True
        try:
            result = self.backend.collect()
        except Exception as exc:  # the library's failure is data for /metrics, not a crash
            ok = False
            result = Collection()
            self._errors_total += 1
            log.warning("collection failed: %s", " ".join(str(exc).split()) or type(exc).__name__)
        self._errors_total += len(result.failures)
        self._log_changes(result.failures)
        if ok:
            self._last_success = self._clock()
        duration = self._timer() - started
        pods = self._pod_devices() if ok else None
        families = _naming.gpu_families(
            self.backend.vendor, result.readings, self.hostname, result.device_count,
            fields=self.fields, pods=pods, naming=self.naming,
        ) if ok else []
        if self.edges is not None:
            families.extend(self.edges.update(self.backend.vendor, result.readings,
                                              self.hostname, pods, self._clock()))
        families.extend(self._health(up=ok, duration=duration))
        snapshot = self._build(tuple(families), self._monotonic(), ok,
                               len({r.index for r in result.readings}), result.failures)
        self._snapshot = snapshot  # one reference swap: a scrape sees the old or the new
        return snapshot

    @staticmethod
    def _build(families: tuple[Metric, ...], finished_at: float | None = None,
               ok: bool = False, gpus: int = 0, failures: tuple[Failure, ...] = ()) -> Snapshot:
        text = _naming.render(families)
        return Snapshot(families, text, finished_at, ok, gpus, failures)

    def _health(self, *, up: bool, duration: float | None) -> list[Metric]:
        return list(_naming.health_families(
            up=up, errors_total=self._errors_total, last_success=self._last_success,
            duration=duration, version=self.version, backend=self.backend.name,
            hostname=self.hostname,
        ))

    def _pod_devices(self) -> Pods | None:
        """This pass's pod attribution; a kubelet that fails costs labels, never the pass."""
        if self.pods is None:
            return None
        try:
            found = self.pods.devices()
        except Exception as exc:
            if self._pods_ok is not False:
                log.warning("pod attribution unavailable, series go out without pod labels: "
                            "%s", " ".join(str(exc).split()) or type(exc).__name__)
            self._pods_ok = False
            return None
        if self._pods_ok is False:
            log.info("pod attribution available again")
        self._pods_ok = True
        return found

    def _log_changes(self, failures: tuple[Failure, ...]) -> None:
        failing = {f.index for f in failures}
        for f in failures:
            if f.index not in self._failing:
                log.warning("cannot read %s; its series are withdrawn", f.message)
        for index in sorted(self._failing - failing):
            log.info("GPU %d readable again", index)
        self._failing = failing

    # -- loop ---------------------------------------------------------------------------
    def start(self) -> Exporter:
        """First pass now (so the first scrape has data), then every interval in a thread."""
        self.collect_once()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-collector", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at = self._monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - self._monotonic())):
            try:
                self.collect_once()
            except Exception:  # a bug in rendering must not end collection for good
                log.exception("unexpected error in collection")
            now = self._monotonic()
            next_at = max(next_at + self.interval, now)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop; a pass stuck in the library is abandoned (the thread is a daemon)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- serving ------------------------------------------------------------------------
    def exposition(self) -> bytes:
        """Prometheus text format of the current snapshot; never touches the backend.

        The families ``self.registry`` yields, rendered once per collection by
        ``_naming.render`` (dcgm-exporter's counter spelling, see there).
        """
        return self._snapshot.text

    def health(self) -> tuple[bool, str]:
        """Liveness: is the collection loop still finishing passes?"""
        finished = self._snapshot.finished_at
        if finished is None:
            return False, "no collection has finished yet"
        age = self._monotonic() - finished
        if age > self.stall_after:
            return False, f"collection stalled: last pass finished {age:.0f}s ago"
        return True, "ok"
