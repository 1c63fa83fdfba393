"""Streams under a real supervisor: a child SIGKILLed in the middle of a
step that has written to a stream. The step's retry (a new execution)
withdraws the dead attempt's values with its first write, so a reader that
starts afterwards sees each line once, the retry's; a reader that followed
the run live saw the dead attempt's lines and then the retry's under new
positions and a new attempt id, never one position twice."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

import everystep
from everystep import schedule
from everystep.models import COMPLETED
from everystep.store import Store
from tests.apps import streams as app
from tests.support.supervisor import supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres", "mariadb")]

APP = "tests.apps.streams"


def written(directory: Path) -> list[int]:
    return sorted(int(path.name.split(".")[1]) for path in directory.glob("wrote.*"))


def test_a_child_killed_mid_step_leaves_no_duplicate_for_readers(
        db_url: str, store: Store, supervisors: Any, tmp_path: Path) -> None:
    sup = supervisors(db_url, procs=1, app=APP).start()
    run = schedule(app.gated, str(tmp_path), database=store)
    live: list[Any] = []
    follower = threading.Thread(target=lambda: live.extend(
        everystep.read_stream(run.id, "log", timeout=120, items=True, database=store)))
    follower.start()

    wait_until(lambda: written(tmp_path), "the first attempt's three lines")
    wait_until(lambda: len(store.stream_items(run.id, "log")) == 3, "the first attempt's lines committed")
    [first_pid] = written(tmp_path)
    child = sup.busy_child(run.id, step_id="1")
    assert child["pid"] == first_pid
    os.kill(first_pid, signal.SIGKILL)
    wait_for_pids_gone([first_pid])

    wait_until(lambda: len(written(tmp_path)) == 2, "the retry's three lines", timeout=120)
    wait_until(lambda: [item.seq for item in store.stream_items(run.id, "log")] == [4, 5, 6],
               "the retry's lines committed, the first attempt's withdrawn")
    [second_pid] = [pid for pid in written(tmp_path) if pid != first_pid]
    (tmp_path / "gate").touch()
    assert wait_run(store, run.id, (COMPLETED,), timeout=120, supervisor=sup).result == "written"
    follower.join(60)
    assert not follower.is_alive()

    retry_lines = [f"line {n} from {second_pid}" for n in (1, 2, 3)]
    assert list(everystep.read_stream(run.id, "log", timeout=10, database=store)) == retry_lines
    kept = store.stream_items(run.id, "log")
    assert [item.seq for item in kept] == [4, 5, 6] and len({item.attempt for item in kept}) == 1

    # The live reader: the dead attempt's lines, then the retry's, in order,
    # each position once; the retry's carry a later attempt of the same step.
    assert [item.seq for item in live] == [1, 2, 3, 4, 5, 6]
    assert [item.value for item in live] == [f"line {n} from {first_pid}" for n in (1, 2, 3)] + retry_lines
    assert {item.step_id for item in live} == {"1"}
    assert live[0].attempt is not None and live[3].attempt is not None and live[0].attempt < live[3].attempt
