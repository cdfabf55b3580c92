"""The Scheduler with a fake clock, a fake sleep and fake jobs: no threads, no waiting."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hub.common import InputError, iso
from hub.inventory import LockHeld, SyncResult
from hub.service._health import SyncState, describe_error, health
from hub.service._scheduler import Jobs, Scheduler, ServiceMetrics
from hub.store._client import HubUnavailable

T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def result(gpus: int = 8) -> SyncResult:
    at = dt.datetime(2024, 1, 1)
    return SyncResult(at, at + dt.timedelta(seconds=1), 17, 1, 1, gpus)


class FakeSync:
    """Plays a script: a SyncResult is returned, an exception raised; each call takes
    ``duration`` seconds of the fake clock."""

    def __init__(self, clock: Clock, script: list[Any], duration: float = 0.0) -> None:
        self.clock = clock
        self.script = list(script)
        self.duration = duration
        self.calls: list[float] = []

    def __call__(self) -> SyncResult:
        self.calls.append(self.clock.now)
        self.clock.now += self.duration
        outcome = self.script.pop(0) if self.script else result()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def drive(scheduler: Scheduler, clock: Clock, ticks: int) -> list[float]:
    """Run the real loop until ``ticks`` sleeps happened; return the delays asked for."""
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        clock.now += seconds
        if len(delays) >= ticks:
            scheduler.stop()

    scheduler.sleep = sleep
    scheduler.run()
    return delays


def scheduler_for(script: list[Any], *, every: float = 60.0, duration: float = 0.0,
                  **jobs: Any) -> tuple[Scheduler, Clock, FakeSync, ServiceMetrics]:
    clock = Clock()
    sync = FakeSync(clock, script, duration)
    metrics = ServiceMetrics(process=False)
    scheduler = Scheduler(Jobs(sync=sync, **jobs), every, clock=clock, metrics=metrics)
    return scheduler, clock, sync, metrics


def down() -> HubUnavailable:
    return HubUnavailable("hub http://hub:9090 unreachable: connection refused")


def samples(metrics: ServiceMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# -- timing ---------------------------------------------------------------------------------


def test_failed_syncs_back_off_exponentially_capped_at_the_interval():
    scheduler, clock, _sync, metrics = scheduler_for([down()] * 6 + [result()])
    delays = drive(scheduler, clock, 8)
    assert delays == [5, 10, 20, 40, 60, 60, 60, 60]
    assert scheduler.state.consecutive_failures == 0  # the 7th attempt worked
    assert samples(metrics)[("gpufleet_sync_failures_total", ())] == 6


def test_backoff_starts_again_after_a_success():
    scheduler, clock, _, _ = scheduler_for([down(), down(), result(), down(), down()])
    assert drive(scheduler, clock, 6) == [5, 10, 60, 5, 10, 60]


def test_short_interval_caps_every_retry():
    scheduler, clock, _, _ = scheduler_for([down()] * 3, every=1.0)
    assert drive(scheduler, clock, 4) == [1, 1, 1, 1]


def test_schedule_does_not_drift_by_the_sync_duration():
    scheduler, clock, sync, _ = scheduler_for([], duration=7.0)
    assert drive(scheduler, clock, 3) == [53, 53, 53]
    assert sync.calls == [T0, T0 + 60, T0 + 120]


def test_a_sync_longer_than_the_interval_is_followed_at_once():
    scheduler, clock, _, _ = scheduler_for([], every=10.0, duration=25.0)
    assert drive(scheduler, clock, 2) == [0, 0]


def test_lock_held_is_not_a_failure_and_waits_a_whole_interval():
    held = LockHeld("another sync holds the inventory lock on sqlite:///x.db")
    scheduler, clock, _sync, metrics = scheduler_for([down(), held, result()])
    delays = drive(scheduler, clock, 3)
    assert delays == [5, 60, 60]
    values = samples(metrics)
    assert values[("gpufleet_sync_failures_total", ())] == 1
    assert values[("gpufleet_sync_lock_held_total", ())] == 1
    assert values[("gpufleet_sync_duration_seconds_count", ())] == 2  # the skip is no attempt


def test_stop_ends_the_loop_before_the_next_sync():
    scheduler, _clock, sync, _ = scheduler_for([])
    scheduler.stop()
    scheduler.run()
    assert sync.calls == []


def test_interval_must_be_positive():
    with pytest.raises(InputError):
        Scheduler(Jobs(sync=result), 0)


# -- health ----------------------------------------------------------------------------------


def test_health_moves_from_never_synced_to_ok_to_too_old():
    scheduler, clock, _, _ = scheduler_for([result(), down(), down(), down(), down()],
                                           every=10.0)
    ok, body = scheduler.health()
    assert not ok and body["reason"] == "never synced yet" and body["status"] == "unavailable"

    scheduler.tick()
    ok, body = scheduler.health()
    assert ok and body["status"] == "ok" and body["last_sync"]["gpus"] == 8
    assert body["last_success"] == dt.datetime.fromtimestamp(T0, dt.UTC)

    clock.now += 10
    scheduler.tick()  # fails, but the last success is one interval old: still healthy
    ok, body = scheduler.health()
    assert ok and body["consecutive_failures"] == 1 and "unreachable" in body["last_error"]

    clock.now += 10.5  # 20.5 s > two intervals
    scheduler.tick()
    ok, body = scheduler.health()
    assert not ok
    assert body["reason"].startswith("last successful sync 20s ago, more than two intervals")
    assert "last error: hub <url> unreachable" in body["reason"]  # no address to callers
    assert scheduler.state.last_error.startswith("hub http://hub:9090 unreachable")  # the log
    assert body["consecutive_failures"] == 2

    scheduler.jobs.sync = lambda: result(9)
    scheduler.tick()
    ok, body = scheduler.health()
    assert ok and body["last_error"] is None and body["consecutive_failures"] == 0


def test_health_names_the_lock_when_another_sync_keeps_it():
    state = SyncState(started_at=T0, last_success_at=T0, lock_held=True)
    ok, body = health(state, 10.0, T0 + 30)
    assert not ok and body["reason"].endswith("another sync holds the inventory lock")


def test_never_synced_reports_the_last_error():
    scheduler, _clock, _, _ = scheduler_for([down()])
    scheduler.tick()
    ok, body = scheduler.health()
    assert not ok
    assert body["reason"] == ("never synced yet; last error: hub <url> unreachable: "
                              "connection refused")


def test_metrics_follow_the_sync():
    scheduler, _clock, _, metrics = scheduler_for([result()], duration=2.0)
    assert samples(metrics)[("gpufleet_sync_last_success_timestamp_seconds", ())] == 0
    scheduler.tick()
    values = samples(metrics)
    assert values[("gpufleet_sync_last_success_timestamp_seconds", ())] == T0 + 2
    assert values[("gpufleet_sync_duration_seconds_sum", ())] == 2.0
    assert values[("gpufleet_sync_failures_total", ())] == 0


# -- after-sync jobs and findings ------------------------------------------------------------


def test_after_sync_jobs_run_in_order_only_after_a_success_and_survive_failures():
    calls: list[str] = []

    def reconcile() -> None:
        calls.append("reconcile")
        raise RuntimeError("kube API down")

    def second() -> None:
        calls.append("second")

    scheduler, _clock, _, metrics = scheduler_for([down(), result()],
                                                 after_sync=[reconcile, second])
    scheduler.tick()
    assert calls == []
    scheduler.tick()
    assert calls == ["reconcile", "second"]
    assert samples(metrics)[("gpufleet_job_failures_total", (("job", "reconcile"),))] == 1
    assert scheduler.health()[0]  # a failing follow-up job does not fail the sync


def finding(severity: str, cluster: str = "east") -> dict[str, Any]:
    return {"severity": severity, "check": "stale-node", "cluster": cluster, "node": "n1",
            "gpu": None, "message": "no sample for 12m"}


def test_findings_are_kept_from_the_last_run_and_counted_by_severity():
    answers: list[Callable[[], list[dict[str, Any]]]] = [
        lambda: [finding("error"), finding("warning"), finding("warning")],
        lambda: (_ for _ in ()).throw(RuntimeError("report broke")),
        lambda: [finding("info")],
    ]
    scheduler, clock, _, metrics = scheduler_for([], findings=lambda: answers.pop(0)())
    metrics.watch(None, lambda: scheduler.state.findings)
    assert scheduler.findings() == ([], None)
    assert samples(metrics)[("gpufleet_findings", (("severity", "error"),))] == 0

    scheduler.tick()
    items, at = scheduler.findings()
    assert [f["severity"] for f in items] == ["error", "warning", "warning"] and at == T0
    values = samples(metrics)
    assert values[("gpufleet_findings", (("severity", "warning"),))] == 2
    assert values[("gpufleet_findings", (("severity", "info"),))] == 0

    clock.now += 60
    scheduler.tick()  # the provider fails: the previous findings stay, the failure is counted
    assert len(scheduler.findings()[0]) == 3 and scheduler.findings()[1] == T0
    assert samples(metrics)[("gpufleet_job_failures_total", (("job", "findings"),))] == 1

    clock.now += 60
    scheduler.tick()
    assert scheduler.findings() == ([finding("info")], T0 + 120)


def test_error_descriptions_are_one_line_and_carry_no_statement():
    import sqlalchemy as sa

    exc = sa.exc.OperationalError("SELECT secret FROM t WHERE pw = ?", ("hunter2",),
                                  Exception("connection refused\nIs the server running?"))
    text = describe_error(exc)
    assert text == "inventory database unavailable: connection refused"
    assert describe_error(ValueError("bad\nthing")) == "ValueError: bad"
    assert describe_error(down()) == "hub http://hub:9090 unreachable: connection refused"


def test_findings_api_says_when_the_last_check_failed_and_when_findings_were_made():
    """An unreachable hub must not read as "no findings": the API carries the failure."""
    import json

    from hub.service import build_app
    from tests.support.asgi import AppClient

    scheduler, clock, _, metrics = scheduler_for(
        [result(), down()], findings=lambda: [finding("warning")])
    router = AppClient(build_app(None, health=scheduler.health,  # type: ignore[arg-type]
                                 findings=scheduler.findings, metrics=metrics.negotiate,
                                 check_failure=scheduler.check_failure))

    def answer() -> dict[str, Any]:
        status, body = router.handle("/api/v1/findings", {})
        assert status == 200
        return json.loads(json.dumps(body, default=str))

    assert answer()["last_check_failed"] is None
    scheduler.tick()  # a good sync: findings with the time of their check
    body = answer()
    assert body["last_check_failed"] is None
    assert body["items"][0]["checked_at"] == iso(dt.datetime.fromtimestamp(T0, dt.UTC))
    clock.now += 60
    scheduler.tick()  # the hub is down: the old findings stay, and the API says why
    body = answer()
    assert body["items"][0]["checked_at"] == iso(dt.datetime.fromtimestamp(T0, dt.UTC))
    failed = body["last_check_failed"]
    assert failed["at"] == iso(dt.datetime.fromtimestamp(T0 + 60, dt.UTC))
    # no hub address to callers (the log has it)
    assert failed["error"].startswith("sync failed, no checks ran: hub <url> unreachable")
    clock.now += 60
    scheduler.tick()  # back: the failure is history
    assert answer()["last_check_failed"] is None


class Follower:
    """A leadership this process never gets (another process leads)."""

    def acquire(self) -> bool:
        return False

    def holds(self) -> bool:
        return False

    def fence(self, conn: Any) -> None:
        raise AssertionError("a follower writes nothing")

    def release(self) -> None:
        pass


def test_a_follower_never_runs_the_checks_nor_the_sync():
    """Followers serve what the leader wrote; they never ask the hub (the checks were 7
    PromQL queries per new sync in every follower)."""
    asked: list[str] = []
    clock = Clock()
    jobs = Jobs(sync=lambda: asked.append("sync") or result(),  # type: ignore[func-returns-value]
                findings=lambda: asked.append("findings") or [],  # type: ignore[func-returns-value]
                record_checks=lambda **outcome: asked.append("record"))
    scheduler = Scheduler(jobs, 60.0, clock=clock, leader=Follower())
    delays = drive(scheduler, clock, 10)
    assert asked == [] and delays == [2.0] * 10
    assert scheduler.state.leader is False


def test_the_leader_writes_the_checks_outcome_where_every_process_reads_it():
    written: list[dict[str, Any]] = []
    scheduler, clock, _, _ = scheduler_for(
        [result(), down()], findings=lambda: [finding("warning")],
        record_checks=lambda **outcome: written.append(outcome))
    scheduler.tick()
    assert written == [{"findings": [finding("warning")], "checked_at": T0}]
    clock.now += 60
    scheduler.tick()
    assert written[1]["failed_at"] == T0 + 60
    assert written[1]["error"].startswith("sync failed, no checks ran: hub http://hub:9090")
