"""Fencing tokens: every claim bumps a run's epoch and every executor write
is conditional on (claimer, epoch), on both backends.

In-process tests of the store and the runner; the same guarantees with real
supervisors, workers and signals are in ``test_fencing_processes.py``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule

from everystep import admin, runner, schedule, step, workflow
from everystep.admin import AdminError
from everystep.errors import NameInUse
from everystep.lease import Lease, holder_alive
from everystep.models import COMPLETED, RUNNING, SCHEDULED, STEP_DONE, STEP_STARTED, Claim, Outcome
from everystep.store import NewStep, RunnerInfo, Store, connect
from tests.support.runs import claim_run

# The engine's own statements: also through PgBouncer in transaction mode.
pytestmark = pytest.mark.pooled

EVENTS: list[str] = []


@step
def fence_note(label: str) -> str:
    EVENTS.append(label)
    return label


@step(unsafe_to_repeat=True)
def fence_charge(label: str) -> str:
    EVENTS.append(label)
    return label


@workflow
def fence_flow() -> list[str]:
    return [fence_note("one"), fence_note("two"), fence_charge("charge"), fence_note("three")]


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def entry(step_id: str, status: str = STEP_DONE) -> NewStep:
    return NewStep(step_id, "x.y", "[]", "{}", now(), status, '"v"' if status == STEP_DONE else None)


# -- the epoch ------------------------------------------------------------------------


def test_every_claim_bumps_the_epoch(store: Store) -> None:
    run = schedule(fence_flow, database=store)
    assert store.get_run(run.id).claim_epoch == 0
    first = claim_run(store, run.id, "A")
    assert first.claim_epoch == 1
    assert store.requeue(first.claim)
    second = claim_run(store, run.id, "A")
    assert second.claim_epoch == 2
    # Catch-up re-claims under the same name bump it again.
    (caught,) = store.claim_own("A", 10, [fence_flow.name])
    assert caught.claim_epoch == 3 and store.get_run(run.id).claim_epoch == 3


def test_a_stale_claim_of_the_same_claimer_can_write_nothing(store: Store) -> None:
    run = schedule(fence_flow, database=store)
    stale = claim_run(store, run.id, "A").claim
    (current,) = [run.claim for run in store.claim_own("A", 10, [fence_flow.name])]
    assert (current.claimer, current.epoch) == (stale.claimer, stale.epoch + 1)

    assert store.record_step(stale, entry("1")) is None
    assert store.start_step(stale, entry("2", STEP_STARTED)) is None
    assert not store.finish_run(stale, COMPLETED, '"x"')
    assert not store.requeue(stale)
    assert store.get_steps(run.id) == []
    assert store.get_run(run.id).status == RUNNING

    # The current claim writes as usual.
    started = store.start_step(current, entry("2", STEP_STARTED))
    assert started is not None and started.ours
    assert store.finish_step(stale, started.record, STEP_DONE, '"v"', None) is None
    assert store.finish_step(current, started.record, STEP_DONE, '"v"', None).ours
    assert store.record_step(current, entry("1")).ours
    assert store.finish_run(current, COMPLETED, '"x"')
    assert [s.step_id for s in store.get_steps(run.id)] == ["2", "1"]


def test_lease_recovery_bumps_the_epoch(store: Store) -> None:
    run = schedule(fence_flow, database=store)
    Lease(store, "dead", "worker", lease=5).register()
    claim = claim_run(store, run.id, "dead").claim
    with store.connection() as conn:
        if store.backend == "postgres":
            conn.execute("UPDATE everystep_runner SET heartbeat_at = clock_timestamp() - interval '1 hour'")
        elif store.backend == "mariadb":
            conn.execute("UPDATE everystep_runner SET heartbeat_at = heartbeat_at - INTERVAL 1 HOUR")
        else:
            conn.execute("UPDATE everystep_runner SET heartbeat_epoch = heartbeat_epoch - 3600")
    assert store.recover_expired("alive") == {"dead": [run.id]}
    after = store.get_run(run.id)
    assert (after.status, after.claim_epoch) == (SCHEDULED, claim.epoch + 1)


# -- the runner: a stale execution stops quietly ------------------------------------


def test_a_stale_execution_stops_at_its_first_refused_write(store: Store) -> None:
    """The same runner name re-claims a run its older execution still runs
    (an operator's forced requeue): the older one's next step record is
    refused, it starts no step after that, and the newer one completes."""
    EVENTS.clear()
    run = schedule(fence_flow, database=store)
    stale = claim_run(store, run.id, "A")
    newer: dict[str, Any] = {}

    def fault(ctx: Any, step_id: str) -> None:
        if step_id == "2" and ctx.execution.run.claim_epoch == stale.claim_epoch and "run" not in newer:
            runner.fault = None
            admin.requeue_run(store, run.id, force=True)
            newer["run"] = claim_run(store, run.id, "A")

    runner.fault = fault
    assert runner.execute(store, stale, claimer="A") == Outcome.LOST
    assert EVENTS == ["one", "two"]  # "two" ran, its record was refused, nothing after it
    assert [s.step_id for s in store.get_steps(run.id)] == ["1"]

    assert runner.execute(store, newer["run"], claimer="A") == COMPLETED
    assert EVENTS == ["one", "two", "two", "charge", "three"]
    assert store.get_run(run.id).result == ["one", "two", "charge", "three"]


def test_an_unsafe_started_insert_is_fenced(store: Store) -> None:
    """A stale execution reaching the unsafe step never performs its effect."""
    EVENTS.clear()
    run = schedule(fence_flow, database=store)
    stale = claim_run(store, run.id, "A")

    def fault(ctx: Any, step_id: str) -> None:
        if step_id == "2":
            runner.fault = None
            admin.requeue_run(store, run.id, force=True)
            claim_run(store, run.id, "A")

    runner.fault = fault
    # The refused write is the record of step 2; with no runner row the
    # forced requeue is the plain one.
    assert runner.execute(store, stale, claimer="A") == Outcome.LOST
    assert "charge" not in EVENTS
    assert not any(s.status == STEP_STARTED for s in store.get_steps(run.id))


# -- requeue refuses live runs -------------------------------------------------------


def test_requeue_refuses_a_run_whose_holder_is_alive(store: Store) -> None:
    run = schedule(fence_flow, database=store)
    lease = Lease(store, "busy-sup", "supervisor", lease=60)
    lease.register()
    held = claim_run(store, run.id, "busy-sup")
    with pytest.raises(AdminError) as refused:
        admin.requeue_run(store, run.id)
    message = str(refused.value)
    assert "\n" not in message
    for part in ("busy-sup", "pid", "ctl kill", "--requeue", "--force"):
        assert part in message, message
    assert store.get_run(run.id).claim == held.claim  # untouched

    forced = admin.requeue_run(store, run.id, force=True)
    assert (forced.status, forced.claimed_by, forced.claim_epoch) == (SCHEDULED, None, held.claim_epoch + 1)
    assert not store.finish_run(held.claim, COMPLETED, '"late"')
    lease.release()


def test_requeue_of_a_worker_run_names_the_worker(store: Store) -> None:
    run = schedule(fence_flow, database=store)
    Lease(store, "busy-worker", "worker", lease=60).register()
    claim_run(store, run.id, "busy-worker")
    with pytest.raises(AdminError, match=r"worker 'busy-worker'.*--force"):
        admin.requeue_run(store, run.id)


def test_requeue_of_a_dead_or_unknown_holder_needs_no_force(store: Store) -> None:
    gone = schedule(fence_flow, database=store)
    claim_run(store, gone.id, "never-registered")
    assert admin.requeue_run(store, gone.id).status == SCHEDULED

    silent = schedule(fence_flow, database=store)
    Lease(store, "silent", "worker", lease=5).register()
    claim_run(store, silent.id, "silent")
    with store.connection() as conn:
        if store.backend == "postgres":
            conn.execute("UPDATE everystep_runner SET heartbeat_at = clock_timestamp() - interval '1 minute'")
        elif store.backend == "mariadb":
            conn.execute("UPDATE everystep_runner SET heartbeat_at = heartbeat_at - INTERVAL 1 MINUTE")
        else:
            conn.execute("UPDATE everystep_runner SET heartbeat_epoch = heartbeat_epoch - 60")
    assert admin.requeue_run(store, silent.id).status == SCHEDULED


# -- owned names ---------------------------------------------------------------------


def info(**changes: Any) -> RunnerInfo:
    import os
    import socket

    base = RunnerInfo(name="n", kind="supervisor", host=socket.gethostname(), pid=os.getppid(),
                      lease_seconds=60.0, started_at=None, heartbeat_at=None, silent_seconds=1.0,
                      running=0, instance="other")
    return dataclasses.replace(base, **changes)


def test_holder_alive_decides_from_heartbeat_host_and_pid() -> None:
    import os

    assert holder_alive(info())  # our parent: alive, on this host, started before its heartbeat
    assert not holder_alive(info(silent_seconds=61.0))  # lease expired
    assert holder_alive(info(host="elsewhere", pid=999_999_999))  # another host: trust the heartbeat
    assert not holder_alive(info(pid=os.getpid()))  # a restarted container reusing our pid
    assert not holder_alive(info(pid=999_999_999))  # gone
    # A live pid that started after the holder's last heartbeat is not the holder.
    assert not holder_alive(info(pid=_fresh_process_pid(), silent_seconds=30.0))


def _fresh_process_pid() -> int:
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    _FRESH.append(proc)
    time.sleep(0.05)
    return proc.pid


_FRESH: list[Any] = []


@pytest.fixture(autouse=True)
def _kill_fresh() -> Any:
    yield
    while _FRESH:
        proc = _FRESH.pop()
        proc.kill()
        proc.wait()


def test_a_live_holder_keeps_its_name_and_takeover_fences_its_runs(store: Store) -> None:
    holder = Lease(store, "shared", "supervisor", lease=60)
    holder.register()
    # Make the holder look like a live process on another host.
    with store.connection() as conn:
        param = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_runner SET host = {param}, pid = 4242 WHERE name = {param}",
                     ("other-host", "shared"))
    run = schedule(fence_flow, database=store)
    held = claim_run(store, run.id, "shared")

    with pytest.raises(NameInUse) as refused:
        Lease(store, "shared", "worker", lease=60).register()
    message = str(refused.value)
    assert "\n" not in message and "pid 4242 on other-host" in message and "--takeover" in message

    taker = Lease(store, "shared", "worker", lease=60, takeover=True)
    taker.register()
    assert store.get_run(run.id).claim_epoch == held.claim_epoch + 1
    assert not store.finish_run(held.claim, COMPLETED, '"stale"')
    # The old holder learns at its next heartbeat that the name is gone.
    holder._next_beat = 0.0
    holder.tick(1e12)
    assert holder.lost_name
    [row] = store.list_runners()
    assert row.instance == taker.instance


def test_a_dead_holder_on_this_host_is_replaced_without_a_flag(store: Store) -> None:
    Lease(store, "restarted", "supervisor", lease=60).register()
    with store.connection() as conn:
        param = "?" if store.backend == "sqlite" else "%s"
        conn.execute(f"UPDATE everystep_runner SET pid = 999999999 WHERE name = {param}", ("restarted",))
    again = Lease(store, "restarted", "supervisor", lease=60)
    again.register()
    assert [runner.instance for runner in store.list_runners()] == [again.instance]


STARTER = """
import sys, time
from pathlib import Path
from everystep.errors import NameInUse
from everystep.lease import Lease
from everystep.store import connect
url, gate, out = sys.argv[1:4]
store = connect(url)
lease = Lease(store, "contested", "worker", lease=60)
while not Path(gate).exists():
    time.sleep(0.005)
try:
    lease.register()
except NameInUse as exc:
    Path(out).write_text("refused " + str(exc))
    sys.exit(2)
Path(out).write_text("started")
time.sleep(120)  # stay alive: a live holder
"""


@pytest.mark.timeout(120)
def test_concurrent_starters_under_one_name_admit_exactly_one(db_url: str, tmp_path: Any,
                                                             subprocess_env: dict[str, str]) -> None:
    import subprocess
    import sys

    from tests.support.waiting import wait_until

    gate = tmp_path / "go"
    outs = [tmp_path / f"out-{index}" for index in range(5)]
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, db_url, str(gate), str(out)], env=subprocess_env)
             for out in outs]
    try:
        gate.touch()
        wait_until(lambda: all(out.exists() and out.read_text() for out in outs), "every starter to decide",
                   timeout=60)
        verdicts = [out.read_text() for out in outs]
        assert sorted(verdict.split(" ", 1)[0] for verdict in verdicts) == ["refused"] * 4 + ["started"]
        assert all("--takeover" in verdict for verdict in verdicts if verdict.startswith("refused"))
        [holder] = connect(db_url).list_runners()
        winner = procs[[verdict == "started" for verdict in verdicts].index(True)]
        assert holder.pid == winner.pid
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


# -- randomized interleavings ----------------------------------------------------------


class FencingMachine(RuleBasedStateMachine):
    """Claims, re-claims, requeues (plain and forced) and writes with any
    claim ever handed out, in any order: a write succeeds exactly when its
    claim is the run's current one."""

    store: Store

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self._new_run()
        self.step = 0

    def _new_run(self) -> None:
        # A workflow name of its own, so runs left by earlier examples are
        # never claimed instead (claims take the oldest first).
        self.name = f"fencing.machine.{uuid.uuid4().hex}"
        self.run_id = schedule(self.name, database=self.store).id
        self.status = SCHEDULED
        self.current: Claim | None = None
        self.epoch = 0

    def _holds(self, claim: Claim) -> bool:
        return self.status == RUNNING and claim == self.current

    @rule(target=claims, claimer=st.sampled_from(["A", "B"]))
    def claim(self, claimer: str) -> Claim:
        got = self.store.claim(claimer, 10, [self.name])
        if self.status == SCHEDULED:
            assert len(got) == 1
            self.epoch += 1
            self.status, self.current = RUNNING, got[0].claim
            assert self.current == Claim(self.run_id, claimer, self.epoch)
            return self.current
        assert got == []
        return Claim(self.run_id, claimer, self.epoch)  # a claim that never was

    @rule(target=claims, claimer=st.sampled_from(["A", "B"]))
    def catch_up(self, claimer: str) -> Claim:
        got = self.store.claim_own(claimer, 10, [self.name])
        if self.status == RUNNING and self.current is not None and self.current.claimer == claimer:
            self.epoch += 1
            self.current = Claim(self.run_id, claimer, self.epoch)
            assert [run.claim for run in got] == [self.current]
        else:
            assert got == []
        return self.current or Claim(self.run_id, claimer, self.epoch)

    @rule()
    def forced_requeue(self) -> None:
        if self.status == RUNNING:
            assert admin.requeue_run(self.store, self.run_id, force=True).status == SCHEDULED
            self.epoch += 1
            self.status, self.current = SCHEDULED, None
        else:
            with pytest.raises(AdminError):
                admin.requeue_run(self.store, self.run_id, force=True)

    @rule(claim=claims)
    def requeue_with(self, claim: Claim) -> None:
        expected = self._holds(claim)
        assert self.store.requeue(claim) == expected
        if expected:
            self.status, self.current = SCHEDULED, None

    @rule(claim=claims, unsafe=st.booleans())
    def write_step(self, claim: Claim, unsafe: bool) -> None:
        self.step += 1
        step_id = str(self.step)
        if unsafe:
            write = self.store.start_step(claim, entry(step_id, STEP_STARTED))
        else:
            write = self.store.record_step(claim, entry(step_id))
        assert (write is not None) == self._holds(claim)

    @rule(claim=claims)
    def finish_with(self, claim: Claim) -> None:
        expected = self._holds(claim)
        assert self.store.finish_run(claim, COMPLETED, '"done"') == expected
        if expected:
            self._new_run()  # start over, so the machine keeps exploring

    @invariant()
    def database_agrees(self) -> None:
        run = self.store.get_run(self.run_id)
        assert (run.status, run.claim_epoch) == (self.status, self.epoch)
        if self.current is not None:
            assert run.claim == self.current


@pytest.mark.timeout(600)
def test_random_interleavings_never_let_a_stale_claim_write(store: Store) -> None:
    FencingMachine.store = store
    examples = 40 if store.backend == "sqlite" else 15
    run_machine = FencingMachine.TestCase
    run_machine.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None,
                                    suppress_health_check=list(HealthCheck))
    run_machine().runTest()
