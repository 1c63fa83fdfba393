"""What a new user and an operator meet: every mistake is one line with the
right exit code, every log record one line, every message true.

Real processes throughout: the ``everystep`` and ``everystep-supervisor``
commands, real supervisors and workers, a real database outage.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import everystep
from everystep import schedule
from everystep.cliutil import EXIT_UNAVAILABLE, EXIT_USAGE
from everystep.errors import SchemaMissing
from everystep.models import COMPLETED, FAILED
from everystep.store import connect
from tests.apps import supervised
from tests.apps.supervised import open_gate
from tests.support.supervisor import supervisor_command, supervisors, wait_for_pids_gone, wait_run  # noqa: F401
from tests.support.waiting import wait_until

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def everystep_cli(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "everystep.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def supervisor_cli(env: dict[str, str], *args: str, timeout: float = 120,
                   cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*supervisor_command(), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)


def one_line(result: subprocess.CompletedProcess[str], code: int, prog: str = "everystep") -> str:
    """Exit ``code`` and exactly one line on stderr, ``PROG: error: …``."""
    lines = result.stderr.splitlines()
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), result.stderr
    return lines[0]


# -- 1. every numeric and path option is checked when parsing -------------------------------


SUPERVISOR_MISTAKES = [
    (["--metrics-port", "99999"], "argument --metrics-port: 99999 is out of range: must be between 0 and 65535"),
    (["--metrics-port", "http"], "argument --metrics-port: 'http' is not a TCP port"),
    (["--procs", "-1"], "argument -c/--procs: -1 is out of range: must be between 0 and 256"),
    (["-c", "1000"], "argument -c/--procs: 1000 is out of range: must be between 0 and 256"),
    (["--poll", "0"], "argument --poll: 0 is out of range"),
    (["--drain", "nan"], "argument --drain: 'nan' is not a number of seconds"),
    (["--lease", "inf"], "argument --lease: 'inf' is not a number of seconds"),
    (["--max-crashes", "0"], "argument --max-crashes: 0 is out of range"),
    (["--socket", "/no/such/dir/x.sock"], "--socket /no/such/dir/x.sock: directory /no/such/dir does not exist"),
    (["--socket", "/tmp/" + "s" * 120], "is too long for a Unix socket"),
    (["--log-level", "loud"], "argument -l/--log-level: invalid choice: 'loud'"),
]


@pytest.mark.parametrize("args, message", SUPERVISOR_MISTAKES, ids=[" ".join(a)[:30] for a, _ in SUPERVISOR_MISTAKES])
def test_supervisor_options_are_checked_in_one_line(args: list[str], message: str,
                                                    subprocess_env: dict[str, str]) -> None:
    line = one_line(supervisor_cli(subprocess_env, *args), EXIT_USAGE, "everystep-supervisor")
    assert message in line, line


WORKER_MISTAKES = [
    (["--metrics-port", "99999"], "argument --metrics-port: 99999 is out of range: must be between 0 and 65535"),
    (["--pool", "0"], "argument -c/--pool: 0 is out of range: must be between 1 and 1024"),
    (["--poll", "-1"], "argument --poll: -1 is out of range"),
    (["--drain", "x"], "argument --drain: 'x' is not a number of seconds"),
]


@pytest.mark.parametrize("args, message", WORKER_MISTAKES, ids=[" ".join(a)[:30] for a, _ in WORKER_MISTAKES])
def test_worker_options_are_checked_in_one_line(args: list[str], message: str,
                                                subprocess_env: dict[str, str]) -> None:
    line = one_line(everystep_cli(subprocess_env, "worker", *args), EXIT_USAGE)
    assert message in line, line


def test_version_on_both_commands(subprocess_env: dict[str, str]) -> None:
    for result in (everystep_cli(subprocess_env, "--version"), supervisor_cli(subprocess_env, "--version")):
        assert result.returncode == 0
        assert result.stdout.strip().endswith(everystep.__version__), result.stdout


def test_every_option_has_help_with_its_default_and_every_command_a_description() -> None:
    import argparse

    from everystep.cli import build_parser
    from supervisor.cli import build_ctl_parser
    from supervisor.cli import build_parser as build_supervisor_parser

    def check(parser: argparse.ArgumentParser, where: str) -> None:
        # One of a required group of alternatives has no default to state.
        alternatives = {id(action) for group in parser._mutually_exclusive_groups if group.required
                        for action in group._group_actions}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    assert sub.description, f"{where} {name} has no description"
                    check(sub, f"{where} {name}")
                continue
            if action.help == argparse.SUPPRESS or isinstance(action, (argparse._HelpAction,
                                                                       argparse._VersionAction)):
                continue
            assert action.help, f"{where} {action.option_strings or action.dest} has no help"
            takes_value = action.nargs != 0 and action.option_strings
            if takes_value and not action.required and id(action) not in alternatives:
                assert "default" in action.help, f"{where} {action.option_strings}: help names no default"

    check(build_parser(), "everystep")
    check(build_supervisor_parser(), "everystep-supervisor")
    check(build_ctl_parser(), "everystep-supervisor ctl")


# -- 2. --procs 0 --burst exits ----------------------------------------------------------------


def test_procs_0_burst_exits_at_once(db_url: str, store: Any, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store)
    done = supervisor_cli(subprocess_env, "--app", supervised.__name__, "--database", db_url, "--procs", "0",
                          "--burst", "--socket", str(tmp_path / "s.sock"), timeout=60)
    assert done.returncode == 0, done.stderr
    assert "runs are scheduled but no child will execute them" in done.stderr
    assert "burst mode: nothing left to run" in done.stderr


# -- 3. an outage: one line when it starts, one when it ends, per process ----------------------


@contextlib.contextmanager
def refusing_connections(admin_url: str, dbname: str) -> Iterator[None]:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (dbname,))
        try:
            yield
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')


def test_an_outage_logs_one_line_at_its_start_and_one_at_its_end(pg_server: Any, supervisors: Any,
                                                               subprocess_env: dict[str, str], tmp_path: Path) -> None:
    url = pg_server.create_database()
    connect(url).migrate()
    dbname = url.rsplit("/", 1)[1].split("?")[0]
    worker_log = tmp_path / "worker.log"
    try:
        # Short leases: heartbeats and sweeps every fraction of a second, so
        # every activity keeps failing (and would keep logging) all along.
        sup = supervisors(url, procs=1, args=["--lease", "2", "--poll", "0.05"]).start()
        with open(worker_log, "wb") as log:
            worker = subprocess.Popen([sys.executable, "-m", "everystep.cli", "worker", "--app", supervised.__name__,
                                       "--database", url, "--name", "outage-worker", "--lease", "2", "--poll", "0.05"],
                                      env=subprocess_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: "started, pool" in worker_log.read_text(), "the worker to start")
            with refusing_connections(pg_server.admin_url, dbname):
                wait_until(lambda: "database unreachable" in sup.log() and
                           "database unreachable" in worker_log.read_text(), "both to notice the outage")
                time.sleep(6)  # the outage goes on: every retry must stay quiet
            wait_until(lambda: "reachable again" in sup.log() and "reachable again" in worker_log.read_text(),
                       "both to notice the end of the outage")
            run = schedule(supervised.tiny, {"dir": str(tmp_path)}, database=url)
            assert wait_run(connect(url), run.id, (COMPLETED,), supervisor=sup).status == COMPLETED
        finally:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        sup.stop()
        for text, pid in ((sup.log(), sup.pid), (worker_log.read_text(), worker.pid)):
            lines = text.splitlines()
            assert all(LINE.match(line) for line in lines), [line for line in lines if not LINE.match(line)][:3]
            mine = [line for line in lines if f"[{pid}]" in line]
            started = [line for line in mine if "database unreachable" in line]
            ended = [line for line in mine if "reachable again after" in line]
            assert len(started) == 1 and len(ended) == 1, "\n".join(started + ended)
            assert re.search(r"reachable again after \d+\.\ds of outage", ended[0])
    finally:
        pg_server.drop_database(url)


# -- 4. kills the supervisor makes say why --------------------------------------------------------


def test_kills_say_why_and_only_unexplained_sigkills_suggest_oom(db_url: str, store: Any, supervisors: Any,
                                                                  tmp_path: Path) -> None:
    sup = supervisors(db_url, procs=2).start()
    killed = schedule(supervised.gated_flow, {"dir": str(tmp_path), "gate": "never"}, database=store)
    victim = sup.busy_child(killed.id, "2")["pid"]
    assert sup.ctl({"cmd": "kill", "run": killed.id})["ok"]
    wait_run(store, killed.id, (FAILED,), supervisor=sup)
    outside = schedule(supervised.gated_flow, {"dir": str(tmp_path), "gate": "never2"}, database=store)
    stranger = sup.busy_child(outside.id, "2")["pid"]
    os.kill(stranger, signal.SIGKILL)  # not the supervisor: the kernel's OOM killer, say
    wait_until(lambda: f"(pid {stranger}) killed by SIGKILL (out of memory?)" in sup.log(), "the crash line")
    assert f"(pid {victim}) killed by SIGKILL (ctl kill)" in sup.log()
    assert f"(pid {victim}) killed by SIGKILL (out of memory?)" not in sup.log()


# -- 5. an unmigrated database says "run: everystep migrate" everywhere ---------------------------


def test_an_unmigrated_database_gives_the_same_hint_everywhere(pg_server: Any, subprocess_env: dict[str, str],
                                                              tmp_path: Path) -> None:
    url = pg_server.create_database()  # no schema
    try:
        hint = "has no everystep schema; run: everystep migrate"
        for args in (["schedule", "--app", supervised.__name__, supervised.tiny.name, "{}"], ["runs"],
                     ["show", "0193a7c4-0000-7000-8000-000000000001"],
                     ["worker", "--app", supervised.__name__, "--name", "w-unmigrated"]):
            line = one_line(everystep_cli(subprocess_env, *args, "--database", url), EXIT_USAGE)
            assert hint in line, (args, line)
        line = one_line(supervisor_cli(subprocess_env, "--app", supervised.__name__, "--database", url,
                                       "--socket", str(tmp_path / "s.sock")), EXIT_USAGE, "everystep-supervisor")
        assert hint in line
        with pytest.raises(SchemaMissing, match=hint):
            schedule(supervised.tiny, {}, database=url)
    finally:
        pg_server.drop_database(url)


# -- 6. errors keep their location ---------------------------------------------------------------


BROKEN_APP = textwrap.dedent("""
    from everystep import workflow

    VALUE = undefined_name  # line 4
""")


def test_an_app_that_fails_to_import_is_named_with_file_and_line(subprocess_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text(BROKEN_APP)
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    where = f"({tmp_path / 'broken_app.py'}:4)"
    line = one_line(everystep_cli(env, "runs", "--app", "broken_app", "--database",
                                  f"sqlite:///{tmp_path / 'x.db'}"), EXIT_USAGE)
    assert "cannot import app module 'broken_app': NameError: name 'undefined_name' is not defined" in line
    assert line.endswith(where), line
    line = one_line(supervisor_cli(env, "--app", "broken_app", "--database", f"sqlite:///{tmp_path / 'x.db'}",
                                   "--socket", str(tmp_path / "s.sock")), EXIT_USAGE, "everystep-supervisor")
    assert line.endswith(where), line


def test_show_prints_the_traceback_of_a_failed_run_and_failures_are_warnings(db_url: str, store: Any,
                                                                             supervisors: Any,
                                                                             subprocess_env: dict[str, str],
                                                                             tmp_path: Path) -> None:
    sup = supervisors(db_url, procs=1).start()
    run = schedule(supervised.broken_flow, {"dir": str(tmp_path)}, database=store)
    assert wait_run(store, run.id, (FAILED,), supervisor=sup).status == FAILED
    shown = everystep_cli(subprocess_env, "show", run.id, "--database", db_url)
    assert shown.returncode == 0, shown.stderr
    assert "error      builtins.KeyError: 'item'" in shown.stdout
    assert "Traceback (most recent call last):" in shown.stdout
    assert 'supervised.py", line' in shown.stdout  # where it happened
    assert re.search(rf"WARNING .*run {run.id} \({supervised.broken_flow.name}\) failed", sup.log())


# -- 7, 8. operator actions are logged with their author; a second Ctrl-C stops at once ----------


def test_drain_is_logged_with_who_asked_and_the_supervisor_says_it_stopped(db_url: str, supervisors: Any) -> None:
    sup = supervisors(db_url, procs=1).start()
    reply = sup.ctl({"cmd": "drain"})
    assert reply == {"ok": True, "draining": True, "busy": 0}
    assert sup.wait() == 0
    log = sup.log()
    assert re.search(r"draining \(ctl pid \d+ uid \d+\)", log), log
    assert log.splitlines()[-1].endswith(f"{sup.name}: stopped (exit code 0)")


def test_a_second_ctrl_c_stops_at_once(db_url: str, store: Any, supervisors: Any, tmp_path: Path) -> None:
    sup = supervisors(db_url, procs=1, args=["--drain", "600"]).start()
    run = schedule(supervised.gated_flow, {"dir": str(tmp_path), "gate": "never"}, database=store)
    child = sup.busy_child(run.id, "2")["pid"]
    sup.send_signal(signal.SIGINT)
    wait_until(lambda: "SIGINT received, draining (Ctrl-C again to stop at once)" in sup.log(), "the first line")
    sup.send_signal(signal.SIGINT)
    assert sup.wait(timeout=60) == 0  # far sooner than --drain 600
    wait_for_pids_gone([child])
    assert "SIGINT again, stopping now" in sup.log()
    assert store.get_run(run.id).status == "scheduled"  # requeued, nothing lost


# -- 9. CLI basics --------------------------------------------------------------------------------


def test_runs_says_when_it_truncated(db_url: str, store: Any, subprocess_env: dict[str, str]) -> None:
    for _ in range(4):
        schedule(supervised.tiny, {}, database=store)
    listed = everystep_cli(subprocess_env, "runs", "--limit", "3", "--database", db_url)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == 1 + 3 + 1 and lines[-1] == "showing the newest 3 of 4 runs (--limit N shows more)"
    whole = everystep_cli(subprocess_env, "runs", "--database", db_url)
    assert "showing" not in whole.stdout and len(whole.stdout.splitlines()) == 1 + 4


def test_show_takes_a_unique_prefix(db_url: str, store: Any, subprocess_env: dict[str, str]) -> None:
    run = schedule(supervised.tiny, {}, database=store)
    shown = everystep_cli(subprocess_env, "show", run.id[:13], "--database", db_url)
    assert shown.returncode == 0 and f"run        {run.id}" in shown.stdout, shown.stderr
    other = schedule(supervised.tiny, {}, database=store)
    common = os.path.commonprefix([run.id, other.id])
    assert common, "UUIDv7 ids made a moment apart share their time prefix"
    line = one_line(everystep_cli(subprocess_env, "show", common, "--database", db_url), EXIT_USAGE)
    assert "is ambiguous" in line and "give more characters" in line
    line = one_line(everystep_cli(subprocess_env, "show", "ffff", "--database", db_url), EXIT_USAGE)
    assert "no run with id ffff" in line


def test_schedule_count_json_prints_every_id(db_url: str, store: Any, subprocess_env: dict[str, str]) -> None:
    import json

    done = everystep_cli(subprocess_env, "schedule", "-A", supervised.__name__, supervised.tiny.name, "{}",
                         "--count", "3", "--json", "--database", db_url)
    assert done.returncode == 0, done.stderr
    ids = json.loads(done.stdout)
    assert len(ids) == 3 and all(store.get_run(run_id).name == supervised.tiny.name for run_id in ids)


def test_an_unreachable_database_has_its_own_exit_code(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    unreachable = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
    one_line(everystep_cli(subprocess_env, "runs", "--database", unreachable), EXIT_UNAVAILABLE)
    one_line(supervisor_cli(subprocess_env, "--database", unreachable, "--socket", str(tmp_path / "s.sock"),
                            "--wait-for-database", "0"),
             EXIT_UNAVAILABLE, "everystep-supervisor")


# -- 10. labelled series exist from the start ------------------------------------------------------


def test_labelled_series_are_zero_before_the_first_event(db_url: str, supervisors: Any) -> None:
    import socket as sockets

    with sockets.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sup = supervisors(db_url, procs=1, args=["--metrics-port", str(port), "--metrics-bind", "127.0.0.1"]).start()
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    runner = f'runner="{sup.name}"'
    for series in (f"everystep_worker_requeued_total{{{runner}}} 0.0",
                   f"everystep_worker_claims_total{{{runner}}} 0.0",
                   f"everystep_worker_empty_claims_total{{{runner}}}",
                   f'everystep_supervisor_child_restarts_total{{reason="fenced",{runner}}} 0.0',
                   f'everystep_supervisor_control_requests_total{{command="drain",{runner}}} 0.0',
                   f"everystep_supervisor_step_timeouts_total{{{runner}}} 0.0",
                   f'everystep_workflow_runs_total{{status="failed",workflow="{supervised.tiny.name}"}} 0.0'):
        assert series in page, series


# -- 11. small things --------------------------------------------------------------------------------


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def test_process_titles_are_as_documented(db_url: str, store: Any, supervisors: Any, tmp_path: Path) -> None:
    sup = supervisors(db_url, procs=1).start()
    assert _title(sup.pid) == f"everystep-supervisor: master {sup.name}"
    [child] = sup.status()["children"]
    assert _title(child["pid"]) == "everystep-supervisor: child 1 idle"
    run = schedule(supervised.gated_flow, {"dir": str(tmp_path), "gate": "go"}, database=store)
    sup.busy_child(run.id, "2")
    assert _title(child["pid"]) == f"everystep-supervisor: child 1 {supervised.gated_flow.name} {run.id} step 2"
    guide = (Path(__file__).resolve().parent.parent / "docs" / "how-to" / "supervisor.md").read_text()
    for documented in ("everystep-supervisor: master NAME", "everystep-supervisor: child N idle",
                       "everystep-supervisor: child N WORKFLOW RUN_ID step STEP_ID"):
        assert documented in guide, documented
    open_gate(tmp_path, "go")


def test_a_burst_logs_failures_not_every_completed_run(db_url: str, store: Any, supervisors: Any,
                                                       tmp_path: Path) -> None:
    for _ in range(20):
        schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store)
    sup = supervisors(db_url, procs=2, args=["--burst"]).spawn()
    assert sup.wait() == 0
    log = sup.log()
    assert "completed in child" not in log  # per-run lines are DEBUG
    assert "done: 20 runs" in log and "1 children" not in log and "1 runs" not in log
