"""Periodic runs: a cron workflow's schedule, tickers that enqueue each
tick once however many there are, only the latest missed tick after
downtime, time zones and validation, and the one-line error without the
cron extra.

The ticker runs on a fake wall clock; nothing waits on a clock.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import pytest

from everystep import EverystepError, workflow
from everystep.cron import Ticker, tick_key
from everystep.cron_schedule import CronSchedule
from everystep.store import Store

UTC = dt.timezone.utc



#: Not registered as a workflow (a ticker is handed its schedules): every
#: runner a later test starts in this process would otherwise tick it.
HOURLY = "tests.lifecycle.hourly"
HOURLY_CRON = CronSchedule.parse("0 * * * *", "Europe/Paris")


def test_a_cron_workflow_is_registered_with_its_schedule() -> None:
    from everystep import registry

    @workflow(name="tests.lifecycle.new_year", cron="0 0 1 1 *", timezone="Pacific/Auckland")
    def new_year(tick: dt.datetime) -> str:
        return tick.isoformat()

    try:
        assert new_year.cron == CronSchedule("0 0 1 1 *", "Pacific/Auckland")
        assert registry.schedules()[new_year.name] == new_year.cron
        assert new_year.cron.next_after(dt.datetime(2030, 6, 1, tzinfo=UTC)) == \
            dt.datetime(2030, 12, 31, 11, 0, tzinfo=UTC)  # midnight in Auckland (summer time)
    finally:
        # Registered, it would be ticked by every runner later tests start here.
        with registry._lock:
            registry._workflows.pop(new_year.name, None)


def test_a_cron_workflow_that_cannot_take_its_tick_is_refused_when_declared() -> None:
    """Each tick's run is scheduled with the tick time as its one argument,
    checked like any schedule's: a body without room for it is refused at
    once, not at every tick, and is not registered."""
    from everystep import registry
    from everystep.errors import WorkflowArgumentsError

    with pytest.raises(WorkflowArgumentsError, match="tests.lifecycle.no_tick.*cannot take 1 argument"):
        @workflow(name="tests.lifecycle.no_tick", cron="0 * * * *")
        def no_tick() -> None:
            return None
    assert registry.get_workflow("tests.lifecycle.no_tick") is None


class FakeClock:
    def __init__(self, now: dt.datetime) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now


def ticker(store: Store, clock: FakeClock) -> Ticker:
    import logging

    return Ticker(store, {HOURLY: HOURLY_CRON}, logging.getLogger("test"), "test", clock=clock)


def test_tickers_enqueue_each_tick_once_however_many_there_are(store: Store) -> None:
    clock = FakeClock(dt.datetime(2030, 3, 30, 22, 30, tzinfo=UTC))
    first, second = ticker(store, clock), ticker(store, clock)
    assert first.tick(0.0) == [] and second.tick(0.0) == []  # no history: the first tick after start
    for hour in range(3):
        clock.now = dt.datetime(2030, 3, 30, 23 + hour, 0, 1, tzinfo=UTC) if hour == 0 else \
            dt.datetime(2030, 3, 31, hour - 1, 0, 1, tzinfo=UTC)
        made = first.tick(1.0) + second.tick(1.0)
        assert len(made) == 1
    runs = store.list_runs(name=HOURLY)
    ticks = sorted(run.args[0] for run in runs)
    assert [tick.isoformat() for tick in ticks] == [
        "2030-03-30T23:00:00+00:00", "2030-03-31T00:00:00+00:00", "2030-03-31T01:00:00+00:00"]
    assert {run.idempotency_key for run in runs} == {tick_key(tick) for tick in ticks}
    assert store.cron_ticks([HOURLY])[HOURLY][0] == ticks[-1]


def test_after_downtime_only_the_latest_missed_tick_runs(store: Store) -> None:
    clock = FakeClock(dt.datetime(2030, 1, 1, 9, 59, tzinfo=UTC))
    before = ticker(store, clock)
    before.tick(0.0)
    clock.now = dt.datetime(2030, 1, 1, 10, 0, 0, tzinfo=UTC)
    assert len(before.tick(0.0)) == 1
    clock.now = dt.datetime(2030, 1, 1, 15, 20, tzinfo=UTC)  # down from 10:00 to 15:20
    restarted = ticker(store, clock)
    [missed] = restarted.tick(0.0)
    assert missed.args[0] == dt.datetime(2030, 1, 1, 15, 0, tzinfo=UTC)
    assert restarted.tick(0.0) == []
    assert len(store.list_runs(name=HOURLY)) == 2
    assert restarted.next_due(100.0) == pytest.approx(100.0 + 40 * 60)


def test_cron_schedules_follow_their_time_zone_and_are_validated() -> None:
    paris = CronSchedule.parse("30 2 * * *", "Europe/Paris")
    # 2030-03-31: Paris skips from 02:00 to 03:00; the next 02:30 is on April 1st (00:30 UTC).
    assert paris.next_after(dt.datetime(2030, 3, 30, 12, 0, tzinfo=UTC)) == dt.datetime(2030, 3, 31, 1, 0, tzinfo=UTC) \
        or paris.next_after(dt.datetime(2030, 3, 31, 1, 30, tzinfo=UTC)) == dt.datetime(2030, 4, 1, 0, 30, tzinfo=UTC)
    assert paris.latest_at_or_before(dt.datetime(2030, 6, 1, 0, 30, tzinfo=UTC)) == \
        dt.datetime(2030, 6, 1, 0, 30, tzinfo=UTC)
    with pytest.raises(EverystepError, match="invalid cron expression"):
        CronSchedule.parse("61 * * * *")
    with pytest.raises(EverystepError, match="unknown timezone"):
        CronSchedule.parse("* * * * *", "Mars/Olympus")
    with pytest.raises(EverystepError, match="timezone= applies to a cron schedule"):
        workflow(timezone="UTC")(lambda: None)


def test_cron_without_the_extra_says_which_extra_in_one_line(tmp_path: Path) -> None:
    script = ("import sys; sys.modules['cronsim'] = None\n"
              "from everystep import workflow\n"
              "workflow(cron='* * * * *')(lambda tick: None)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode != 0
    assert "cron schedules need the cron extra: pip install 'everystep[cron]'" in result.stderr
