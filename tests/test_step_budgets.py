"""Step budgets and costs under a real ``everystep-supervisor``.

Each test starts the real console script with ``--app tests.apps.resources``
and schedules its workflows by name (this process never imports that module:
it declares bounded steps, and the threaded worker tests share this
interpreter). What the tests assert is what a user reads back: the step rows,
their errors and costs, ``everystep show``, ``/metrics``, ``ctl status``.
Budgets are in CPU seconds and bytes, so the assertions on them do not
depend on how busy the machine is.

Whether the supervisor bounds memory with a cgroup per child or with
``RLIMIT_DATA`` depends on the host; ``tests/support/cgroups.probe`` says
which to expect, and the memory test runs both ways where both exist.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from everystep import schedule
from everystep.models import COMPLETED, FAILED, STEP_DONE, STEP_FAILED
from everystep.store import Store, connect
from supervisor.cgroups import own_cgroup
from tests.support import cgroups
from tests.support.supervisor import error_type, supervisors, wait_run  # noqa: F401

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.resources"
EXCEEDED = "everystep.errors.StepResourceExceeded"
MIB = 1 << 20


def steps_by_id(store: Store, run_id: str) -> dict[str, Any]:
    return {record.step_id: record for record in store.get_steps(run_id)}


def finished(store: Store, sup: Any, run_id: str) -> Any:
    run = wait_run(store, run_id, (COMPLETED, FAILED), timeout=120, supervisor=sup)
    assert run.status == COMPLETED, f"{run.error}\n--- log ---\n{sup.log()}"
    return run


def uses_cgroups(sup: Any) -> bool:
    log = sup.log()
    assert "step budgets: memory by" in log, log
    return "memory by a cgroup per child" in log


# -- memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "off"], ids=["cgroups-auto", "cgroups-off"])
@pytest.mark.parametrize(
    ("workflow", "flags"),
    [("memory_flow", []), ("greedy_flow", ["--step-memory-limit", "256M"])],
    ids=["step-memory-limit", "supervisor-default"],
)
def test_a_step_allocating_1gib_under_256m_fails_and_the_next_step_still_runs(
        pg_url, supervisors, mode, workflow, flags):
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=1, app=APP, args=["--cgroups", mode, *flags]).start()
    run = schedule(f"{APP}.{workflow}", {"mb": 1024}, database=store)

    done = finished(store, sup, run.id)

    bounded = done.result["hog" if workflow == "memory_flow" else "grab"]
    assert bounded["type"] == "StepResourceExceeded", bounded
    assert bounded["resource"] == "memory" and bounded["limit"] == 256 * MIB
    steps = steps_by_id(store, run.id)
    assert steps["2"].status == STEP_FAILED
    assert error_type(steps["2"].error) == EXCEEDED
    message = steps["2"].error["message"]
    assert message.startswith(f"step 2 ({APP}.{'hog' if workflow == 'memory_flow' else 'grab'}) exceeded its "
                              "memory limit of 256 MiB"), message
    # The run went on: the body caught it and its next step ran.
    assert steps["3"].status == STEP_DONE and done.result["after"]["label"] == "after"

    expect_cgroup = mode == "auto" and cgroups.probe() is None
    assert uses_cgroups(sup) == expect_cgroup, cgroups.probe()
    status = sup.wait_idle()
    if expect_cgroup:
        # The kernel killed the child at the limit; the parent said why, and
        # the run went on in a fresh child.
        assert "killed by the kernel's out-of-memory killer" in message, message
        assert bounded["peak"] is not None and bounded["peak"] >= 200 * MIB, bounded
        assert done.result["after"]["pid"] != done.result["before"]["pid"]
        assert status["restarts"] == {"resource": 1}, status["restarts"]
        # The dead child's cgroup was removed when it was reaped, the
        # replacement's when the supervisor stopped, then the supervisor's own.
        own = own_cgroup()
        assert not isinstance(own, str)
        base = Path(own[1]) / f"everystep-{sup.pid}"
        assert sorted(entry.name for entry in base.iterdir() if entry.is_dir()) == ["child-1-2"]
        assert sup.stop() == 0
        assert not base.exists()
    else:
        # The allocation was refused in the child, which carried on.
        assert "an allocation past it was refused (RLIMIT_DATA)" in message, message
        assert done.result["after"]["pid"] == done.result["before"]["pid"]
        assert status["restarts"] == {}, status["restarts"]


# -- CPU ------------------------------------------------------------------------------


def test_a_cpu_limited_busy_loop_is_stopped_close_to_its_limit(pg_url, supervisors):
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=1, app=APP).start()
    run = schedule(f"{APP}.cpu_flow", {"seconds": 60}, database=store)

    done = finished(store, sup, run.id)

    spin = done.result["spin"]
    assert spin["type"] == "StepResourceExceeded" and spin["resource"] == "cpu" and spin["limit"] == 2.0, spin
    # The soft RLIMIT_CPU counts whole seconds: stopped within the second past 2s.
    assert 2.0 <= spin["peak"] < 3.2, spin
    assert "stopped at its limit (SIGXCPU)" in spin["message"]
    steps = steps_by_id(store, run.id)
    assert error_type(steps["1"].error) == EXCEEDED
    assert steps["1"].cpu_seconds is not None and 2.0 <= steps["1"].cpu_seconds < 3.2
    # Interrupted in place: the same child ran the next step.
    assert done.result["after"]["pid"] == spin["pid"]
    assert steps["2"].status == STEP_DONE
    assert sup.wait_idle()["restarts"] == {}


def test_a_busy_loop_the_child_cannot_interrupt_is_killed_by_the_parent(pg_url, supervisors):
    """In a parallel branch, SIGXCPU cannot raise in the step (handlers run
    on the main thread): the parent polls the child's CPU and kills it one
    second past the budget; the run goes on in a fresh child."""
    store = connect(pg_url)
    sup = supervisors(pg_url, procs=1, app=APP).start()
    victim = sup.status()["children"][0]["pid"]
    run = schedule(f"{APP}.cpu_flow", {"seconds": 60, "branch": True}, database=store)

    done = finished(store, sup, run.id)

    spin = done.result["spin"]
    assert spin["type"] == "StepResourceExceeded" and spin["resource"] == "cpu", spin
    assert f"its process (pid {victim}) was killed by the supervisor" in spin["message"], spin
    assert 3.0 < spin["peak"] < 6.0, spin
    steps = steps_by_id(store, run.id)
    assert error_type(steps["1.0.1"].error) == EXCEEDED
    assert steps["1.1.1"].status == STEP_DONE  # the sibling branch finished before
    assert done.result["after"]["pid"] != victim
    assert sup.wait_idle()["restarts"] == {"resource": 1}


# -- costs ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=15) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def everystep(db_url: str, env: dict[str, str], *args: str) -> str:
    result = subprocess.run([sys.executable, "-m", "everystep.cli", *args, "--database", db_url],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_every_step_a_supervisor_runs_records_its_cost(db_url, supervisors, subprocess_env):
    store = connect(db_url)
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP,
                      args=["--metrics-port", str(port), "--metrics-bind", "127.0.0.1"]).start()
    run = schedule(f"{APP}.costs_flow", {"cpu": 0.5, "sleep": 0.3, "mb": 64}, database=store)

    finished(store, sup, run.id)

    steps = steps_by_id(store, run.id)
    burn, nap, touch, again = steps["1"], steps["2"], steps["3"], steps["4"]
    assert 0.3 <= burn.cpu_seconds <= 1.0, burn.cpu_seconds      # 0.5 s of CPU
    assert nap.cpu_seconds < 0.1, nap.cpu_seconds                # asleep
    assert burn.peak_rss_bytes < 8 * MIB and nap.peak_rss_bytes < 8 * MIB
    # 64 MiB touched, twice in the same child: the high-water mark is reset
    # for each step, so the second shows it as well as the first.
    for step in (touch, again):
        assert 56 * MIB <= step.peak_rss_bytes <= 96 * MIB, step.peak_rss_bytes

    shown = json.loads(everystep(db_url, subprocess_env, "show", run.id, "--json"))
    assert [step["cpu_seconds"] for step in shown["steps"]] == [step.cpu_seconds for step in steps.values()]
    assert shown["cost"]["measured_steps"] == 5
    assert shown["cost"]["cpu_seconds"] == pytest.approx(sum(step.cpu_seconds for step in steps.values()))
    assert shown["cost"]["peak_rss_bytes"] == max(touch.peak_rss_bytes, again.peak_rss_bytes)
    text = everystep(db_url, subprocess_env, "show", run.id)
    assert "CPU in 5 measured step(s); largest peak RSS growth" in text, text
    header = next(line for line in text.splitlines() if line.startswith("STEP"))
    assert header.split() == ["STEP", "STATUS", "FUNCTION", "CPU", "PEAK", "RSS", "OUTCOME"]

    samples = scrape(port)
    labels = (("step", f"{APP}.burn"), ("workflow", f"{APP}.costs_flow"))
    assert samples[("everystep_step_cpu_seconds_count", labels)] == 1
    assert 0.3 <= samples[("everystep_step_cpu_seconds_sum", labels)] <= 1.0
    touched = (("step", f"{APP}.touch"), ("workflow", f"{APP}.costs_flow"))
    assert samples[("everystep_step_peak_rss_bytes_count", touched)] == 2
    assert samples[("everystep_step_peak_rss_bytes_sum", touched)] >= 112 * MIB


# -- the kernel's out-of-memory killer ---------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "off"], ids=["cgroups-auto", "cgroups-off"])
def test_a_kernel_oom_kill_in_a_small_cgroup_is_blamed_on_the_step_in_flight(pg_url, supervisors, mode):
    """No limit anywhere but the cgroup the whole supervisor runs in: the
    kernel's out-of-memory killer ends the child mid-step. The step fails
    with StepResourceExceeded ("exceeded memory"), not a crash, and the run
    goes on in a fresh child. With its own cgroups the supervisor reads the
    child's ``oom_kill`` count; without, the host's (/proc/vmstat)."""
    store = connect(pg_url)
    with cgroups.small_cgroup(384 * MIB) as path:
        sup = supervisors(pg_url, procs=1, app=APP, args=["--cgroups", mode])
        sup.command = cgroups.run_inside(path, sup.command)
        try:
            sup.start()
            victim = sup.status()["children"][0]["pid"]
            run = schedule(f"{APP}.greedy_flow", {"mb": 1024}, database=store)

            done = finished(store, sup, run.id)
            status = sup.wait_idle()
            assert sup.stop() == 0
        finally:
            sup.cleanup()  # nothing may be left in the cgroup when it is removed

    grab = done.result["grab"]
    assert grab["type"] == "StepResourceExceeded" and grab["resource"] == "memory" and grab["limit"] is None
    assert grab["message"].startswith(f"step 2 ({APP}.grab) exceeded memory: its process (pid {victim}) was killed"), grab
    assert "out-of-memory killer" in grab["message"]
    steps = steps_by_id(store, run.id)
    assert error_type(steps["2"].error) == EXCEEDED and steps["3"].status == STEP_DONE
    assert done.result["after"]["pid"] != victim
    assert status["restarts"] == {"resource": 1}, status["restarts"]
    assert "killed by SIGKILL (the kernel's out-of-memory killer)" in sup.log()


# -- the threaded worker ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [([f"--app={APP}"], f"cannot enforce step resource limits (its runs share one process): {APP}.hog "
                        "(memory_limit=256 MiB)"),
     (["--step-cpu-limit", "5"], "--step-cpu-limit cannot be enforced by the threaded worker")],
    ids=["declared-limits", "supervisor-option"],
)
def test_the_threaded_worker_refuses_step_limits_at_start(tmp_path: Path, subprocess_env, args, expected):
    result = subprocess.run(
        [sys.executable, "-m", "everystep.cli", "worker", *args, "--database", f"sqlite:///{tmp_path / 'w.db'}"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("everystep: error: "), result.stderr
    assert expected in lines[0], lines[0]


def test_no_test_module_imports_the_bounded_app() -> None:
    """The threaded worker refuses to start in a process that imported
    bounded steps, and the worker tests run in this very interpreter."""
    assert APP not in sys.modules
