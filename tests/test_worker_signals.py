"""``everystep worker`` as a real process, stopped with real signals, on both
backends.

The worker process executes ``tests.apps.workers`` workflows whose middle
step blocks on a gate file, so a test can signal or kill it while a step is
in flight. What ran is read from the effects file the steps append to, what
was recorded from the database. A worker's log goes to a file the test
polls: ``draining N run(s)`` is the proof the stop signal was handled. Every
process is started in its own session and killed (with its group) when the
test ends, whatever happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from everystep import admin, schedule
from everystep.models import BLOCKED, COMPLETED, RUNNING, SCHEDULED, STEP_DONE, STEP_STARTED
from everystep.store import Store
from tests.apps import workers
from tests.apps.workers import effects, open_gate
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.workers"
EXIT_TIMEOUT = 30.0


class WorkerProcess:
    """One ``everystep worker`` process and its log file."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.proc = proc
        self.log = log
        self.name = name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def wait_for_log(self, text: str, timeout: float = EXIT_TIMEOUT) -> None:
        def seen() -> bool:
            if text in self.output():
                return True
            assert self.proc.poll() is None, f"worker {self.name} exited ({self.proc.returncode}):\n{self.output()}"
            return False

        wait_until(seen, f"{text!r} in the log of worker {self.name}", timeout=timeout)

    def send(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {self.name} still running {timeout}s after being stopped:\n{self.output()}"
            ) from None

    def stop(self) -> int:
        """SIGTERM and wait: a clean exit is part of every test."""
        self.send(signal.SIGTERM)
        code = self.wait_exit()
        assert code == 0, f"worker {self.name} exited {code}:\n{self.output()}"
        return code


@pytest.fixture
def start_worker(
    db_url: str, tmp_path: Path, subprocess_env: dict[str, str]
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []

    def start(name: str, *extra: str) -> WorkerProcess:
        log = tmp_path / f"worker-{name}-{len(started)}.log"
        command = [
            sys.executable, "-m", "everystep.cli", "worker", "--app", APP, "--name", name,
            "--pool", "2", "--poll", "0.05", "--database", db_url, *extra,
        ]
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                command, cwd=tmp_path, env=subprocess_env, stdout=handle, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        process = WorkerProcess(proc, log, name)
        started.append(process)
        return process

    try:
        yield start
    finally:
        for process in started:
            if process.proc.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.proc.wait(EXIT_TIMEOUT)


def run_state(store: Store, run_id: str) -> tuple[str, str | None, list[tuple[str, str]]]:
    run = store.get_run(run_id)
    return run.status, run.claimed_by, [(record.step_id, record.status) for record in store.get_steps(run_id)]


def wait_for_status(store: Store, run_id: str, status: str, timeout: float = EXIT_TIMEOUT) -> None:
    wait_until(lambda: store.get_run(run_id).status == status, f"run {run_id} to be {status}", timeout=timeout)


def wait_for_event(directory: Path, run_id: str, event: str, count: int = 1) -> None:
    wait_until(
        lambda: effects(directory, run_id).count(event) >= count,
        f"{count}x {event!r} in the effects of run {run_id}",
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_signal_requeues_at_the_next_step_boundary_and_another_worker_finishes(
    store, tmp_path, start_worker, signum
):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    a = start_worker("A")
    wait_for_event(tmp_path, run.id, "middle:start")
    assert run_state(store, run.id) == (RUNNING, "A", [("1", STEP_DONE)])

    a.send(signum)
    a.wait_for_log("draining 1 run(s)")
    # The step in flight is allowed to finish, and is recorded ...
    open_gate(tmp_path, "release")
    assert a.wait_exit() == 0, a.output()
    # ... but no further step starts: the run is back in the queue.
    assert run_state(store, run.id) == (SCHEDULED, None, [("1", STEP_DONE), ("2", STEP_DONE)])
    assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:end"]

    b = start_worker("B")
    wait_for_status(store, run.id, COMPLETED)
    done = store.get_run(run.id)
    assert (done.claimed_by, done.result) == ("B", ["one", "two", "three"])
    # Each finished step ran exactly once across both workers.
    assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:end", "last"]
    b.stop()


def test_sigkill_leaves_the_run_to_a_restart_under_the_same_name(store, tmp_path, start_worker):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    a = start_worker("A")
    wait_for_event(tmp_path, run.id, "middle:start")

    a.send(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL
    # Nothing recorded the in-flight step; the run is still A's.
    assert run_state(store, run.id) == (RUNNING, "A", [("1", STEP_DONE)])

    # A worker under another name never touches it: once it has claimed and
    # finished a run scheduled now, the parked run is still A's.
    other = start_worker("B")
    probe = schedule(workers.add_one, 1, database=store)
    wait_for_status(store, probe.id, COMPLETED)
    assert store.get_run(probe.id).claimed_by == "B"
    assert run_state(store, run.id) == (RUNNING, "A", [("1", STEP_DONE)])
    other.stop()

    open_gate(tmp_path, "release")
    again = start_worker("A")
    wait_for_status(store, run.id, COMPLETED)
    done = store.get_run(run.id)
    assert (done.claimed_by, done.result) == ("A", ["one", "two", "three"])
    # At-least-once: the killed step ran again; the recorded one did not.
    assert effects(tmp_path, run.id) == ["first", "middle:start", "middle:start", "middle:end", "last"]
    again.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_drain_deadline_requeues_a_step_that_never_ends_and_exits_promptly(
    store, tmp_path, start_worker, signum
):
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    a = start_worker("A", "--drain", "1")
    wait_for_event(tmp_path, run.id, "middle:start")

    a.send(signum)
    a.wait_for_log("draining 1 run(s)")
    # The step never ends: exiting at all proves the worker did not join its
    # thread, and the log says the deadline (not the step) ended the drain.
    assert a.wait_exit() == 0, a.output()
    assert "drain deadline of 1.0s passed with 1 run(s) mid-step; requeued 1" in a.output(), a.output()
    assert run_state(store, run.id) == (SCHEDULED, None, [("1", STEP_DONE)])

    open_gate(tmp_path, "release")
    b = start_worker("B")
    wait_for_status(store, run.id, COMPLETED)
    assert effects(tmp_path, run.id).count("middle:start") == 2
    assert effects(tmp_path, run.id).count("last") == 1
    b.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_repeated_stop_signal_during_the_drain_still_drains(store, tmp_path, start_worker, signum):
    """Operators press Ctrl-C twice and process managers repeat SIGTERM. The
    second signal must neither kill the worker with the run still claimed
    nor leave it hanging on the stuck thread: the drain deadline still
    requeues the run and the process exits 0."""
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    a = start_worker("A", "--drain", "4")
    wait_for_event(tmp_path, run.id, "middle:start")
    a.send(signum)
    a.wait_for_log("draining 1 run(s)")
    a.send(signum)
    assert a.wait_exit() == 0, a.output()
    assert run_state(store, run.id) == (SCHEDULED, None, [("1", STEP_DONE)])


def test_drain_deadline_exits_even_when_someone_else_took_the_run(store, tmp_path, start_worker):
    """The stuck run was requeued by an operator during the drain: the
    worker's own requeue is refused, and it must still exit rather than wait
    forever on the stuck thread at interpreter shutdown."""
    run = schedule(workers.three_steps, {"dir": str(tmp_path), "gate": "release"}, database=store)
    a = start_worker("A", "--drain", "5")
    wait_for_event(tmp_path, run.id, "middle:start")
    a.send(signal.SIGTERM)
    a.wait_for_log("draining 1 run(s)")
    # Succeeds only while the run is still A's, i.e. before the deadline.
    admin.requeue_run(store, run.id, force=True)
    assert a.wait_exit() == 0, a.output()
    assert run_state(store, run.id) == (SCHEDULED, None, [("1", STEP_DONE)])


def test_worker_exits_0_on_sigterm_when_idle(store, start_worker):
    run = schedule(workers.add_one, 41, database=store)
    a = start_worker("A")
    wait_for_status(store, run.id, COMPLETED)
    assert store.get_run(run.id).result == 42
    a.stop()
    assert "stopped" in a.output()


def test_killed_unsafe_step_blocks_on_restart_and_resolves_from_the_cli(
    store, db_url, tmp_path, start_worker, subprocess_env
):
    """SIGKILL inside an unsafe-to-repeat step: the restarted worker does not
    repeat the effect, the run ends blocked, and ``resolve-step`` from the
    command line lets the same worker finish it."""
    spec = {"dir": str(tmp_path), "charge_gate": "release"}
    run = schedule(workers.unsafe_flow, spec, database=store)
    a = start_worker("A")
    wait_for_event(tmp_path, run.id, "charge:start")
    assert run_state(store, run.id) == (RUNNING, "A", [("1", STEP_DONE), ("2", STEP_STARTED)])
    a.send(signal.SIGKILL)
    assert a.wait_exit() == -signal.SIGKILL

    open_gate(tmp_path, "release")
    again = start_worker("A")
    wait_for_status(store, run.id, BLOCKED)
    blocked = store.get_run(run.id)
    assert blocked.error["type"] == "everystep.errors.EffectUncertain"
    assert effects(tmp_path, run.id).count("charge:start") == 1

    resolved = subprocess.run(
        [sys.executable, "-m", "everystep.cli", "resolve-step", run.id, "2", "--result", '{"receipt": "seen"}',
         "--database", db_url],
        env=subprocess_env, cwd=tmp_path, capture_output=True, text=True, timeout=EXIT_TIMEOUT,
    )
    assert resolved.returncode == 0, resolved.stderr
    wait_for_status(store, run.id, COMPLETED)
    assert store.get_run(run.id).result == {"charged": True, "receipt": {"receipt": "seen"}}
    assert effects(tmp_path, run.id).count("charge:start") == 1
    again.stop()
