"""The supervisor's control socket and ``everystep-supervisor ctl``, for real.

Requests that mean something (``status``, ``kill``, ``scale``, ``reload``,
``drain``) must act exactly as documented; everything else a client can
throw at the socket (garbage, non-objects, oversized lines, hundreds of
connections, clients that never finish a line, absurd values, another uid)
gets an error reply or is dropped, and the supervisor keeps answering and
keeps running runs afterwards. Tests run as root, so "another uid" is a
forked child that switched to ``nobody``.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from everystep import schedule
from everystep.models import COMPLETED, FAILED, STEP_DONE, STEP_FAILED
from everystep.store import Store, utcnow
from tests.apps import supervised
from tests.apps.supervised import effect_lines, effects, open_gate
from tests.support.waiting import wait_until
from tests.support.supervisor import (  # noqa: F401
    Supervisor,
    error_type,
    raw_exchange,
    read_replies,
    supervisor_command,
    supervisors,
    wait_for_pids_gone,
    wait_run,
)

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(180), pytest.mark.backends("sqlite", "postgres")]

NOBODY = 65534
STEP_KILLED = "everystep.errors.StepKilled"


def spec(directory: Path, **extra: Any) -> dict[str, Any]:
    return {"dir": str(directory), **extra}


def steps_by_id(store: Store, run_id: str) -> dict[str, Any]:
    return {record.step_id: record for record in store.get_steps(run_id)}


def assert_still_serving(sup: Supervisor, store: Store, directory: Path, procs: int = 2) -> None:
    """The supervisor answers ``status`` (at once, or as soon as it has seen
    the previous clients hang up) and still executes runs."""
    status = sup.wait_status(lambda s: True, "a status reply", timeout=30)
    assert status["procs"] == procs and not status["draining"]
    run = schedule(supervised.tiny, spec(directory), database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    assert sup.alive()


# -- status and kill --------------------------------------------------------------------


def test_status_shows_the_step_each_child_is_running(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.at_gate(run.id, tmp_path)

    assert busy["state"] == "busy"
    assert busy["workflow"] == "tests.apps.supervised.gated_flow"
    assert busy["step_name"] == "tests.apps.supervised.gated"
    assert busy["step_seconds"] >= 0 and busy["run_seconds"] >= busy["step_seconds"]
    assert busy["rss"] > 0
    assert effect_lines(tmp_path, run.id)[-1] == (busy["pid"], "gated:start")
    later = sup.wait_status(
        lambda s: any(c["run_id"] == run.id and c["step_seconds"] > busy["step_seconds"] + 0.2
                      for c in s["children"]),
        "the step's running time to grow",
    )
    status = sup.status()
    assert status["pid"] == sup.pid and status["name"] == sup.name and status["procs"] == 2
    assert status["draining"] is False and status["uptime"] > 0
    others = [c for c in later["children"] if c["pid"] != busy["pid"]]
    assert [(c["state"], c["run_id"], c["step_id"]) for c in others] == [("idle", None, None)]

    open_gate(tmp_path, "go")
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    idle = sup.wait_idle()
    assert next(c for c in idle["children"] if c["pid"] == busy["pid"])["runs_done"] == 1


def test_status_counts_claims_that_came_back_empty(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=1).start()
    idle = sup.wait_status(lambda s: s["runs"].get("empty_claims", 0) >= 3, "three polls that found nothing")
    assert idle["runs"].get("claimed", 0) == 0
    assert idle["runs"]["claims"] >= idle["runs"]["empty_claims"]  # an empty claim is a claim statement too
    run = schedule(supervised.tiny, spec(tmp_path), database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    after = sup.wait_status(lambda s: s["runs"].get("claimed") == 1, "the run counted as claimed")
    assert after["runs"]["empty_claims"] >= idle["runs"]["empty_claims"]
    assert after["runs"]["claims"] - after["runs"]["empty_claims"] == 1  # one claim statement took the run


@pytest.mark.parametrize("catch", [False, True], ids=["body-fails", "body-catches"])
def test_kill_records_the_step_in_flight_as_step_killed(db_url, store, supervisors, tmp_path, catch):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="never", catch=catch), database=store)
    busy = sup.at_gate(run.id, tmp_path)
    asked = utcnow()

    reply = sup.ctl({"cmd": "kill", "run": run.id})

    assert reply["ok"] is True and reply["run"] == run.id and reply["pid"] == busy["pid"], reply
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)
    steps = steps_by_id(store, run.id)
    assert steps["2"].status == STEP_FAILED and error_type(steps["2"].error) == STEP_KILLED
    # Recorded with its real start (it was running before the kill was asked), not the kill's time.
    assert steps["2"].started_at < asked < steps["2"].completed_at
    if catch:
        assert finished.status == COMPLETED and finished.result == {"caught": "StepKilled"}
        assert steps["3"].name == "tests.apps.supervised.cleanup" and steps["3"].status == STEP_DONE
        assert effects(tmp_path, run.id) == ["first", "gated:start", "cleanup:StepKilled"]
    else:
        assert finished.status == FAILED and error_type(finished.error) == STEP_KILLED
        assert set(steps) == {"1", "2"}
        assert effects(tmp_path, run.id) == ["first", "gated:start"]
    wait_for_pids_gone([busy["pid"]])
    status = sup.wait_idle()
    assert busy["pid"] not in {c["pid"] for c in status["children"]}
    assert status["restarts"].get("kill") == 1


def test_kill_with_requeue_gives_the_run_back_without_recording_its_step(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.at_gate(run.id, tmp_path)
    claimed_at = store.get_run(run.id).claimed_at

    reply = sup.ctl({"cmd": "kill", "run": run.id, "requeue": True})

    assert reply["ok"] is True and reply["pid"] == busy["pid"] and "requeued" in reply["action"], reply
    # Requeued, then claimed again by this supervisor: the step runs again.
    again = wait_until(
        lambda: (lambda c: c if c["pid"] != busy["pid"] else None)(sup.busy_child(run.id, "2")),
        "the run to be picked up again by another child",
    )
    assert "2" not in steps_by_id(store, run.id), "the killed step was not recorded"
    assert store.get_run(run.id).claimed_at > claimed_at, "it went back to the queue and was claimed anew"
    open_gate(tmp_path, "go")
    finished = wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup)
    assert finished.status == COMPLETED, finished.error
    assert steps_by_id(store, run.id)["2"].status == STEP_DONE
    assert finished.result["gated"] == again["pid"]
    assert effects(tmp_path, run.id) == ["first", "gated:start", "gated:start", "gated:end", "last"]
    wait_for_pids_gone([busy["pid"]])


def test_kill_of_a_run_that_is_not_executing_is_an_error_and_harmless(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    finished = schedule(supervised.tiny, spec(tmp_path), database=store)
    wait_run(store, finished.id, (COMPLETED,), supervisor=sup)
    before = {c["pid"] for c in sup.status()["children"]}

    for run_id in (str(uuid.uuid4()), finished.id, "not-a-run-id"):
        reply = sup.ctl({"cmd": "kill", "run": run_id})
        assert reply["ok"] is False and "not executing" in reply["error"], reply

    assert {c["pid"] for c in sup.wait_idle()["children"]} == before
    assert_still_serving(sup, store, tmp_path)


# -- scale -----------------------------------------------------------------------------


def test_scale_changes_the_number_of_children(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()

    for procs in (3, 1, 0, 2):
        previous = sup.status()["procs"]
        reply = sup.ctl({"cmd": "scale", "procs": procs})
        assert reply == {"ok": True, "procs": procs, "previous": previous}
        status = sup.wait_idle(procs=procs)
        wait_until(lambda: len(sup.live_child_pids()) == procs,
                   f"{procs} live child processes, have {sup.live_child_pids()}")
        assert sup.live_child_pids() == {c["pid"] for c in status["children"]}
    assert_still_serving(sup, store, tmp_path)


# -- hostile clients ------------------------------------------------------------------------


def test_the_socket_file_is_private(db_url, supervisors):
    sup = supervisors(db_url, procs=1).start()
    mode = os.stat(sup.socket_path).st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


GARBAGE = [
    b"\xff\xfe\x00\x01garbage\n",
    os.urandom(2048).replace(b"\n", b"") + b"\n",
    b"not json at all\n",
    b"{'cmd': 'status'}\n",
    b"[1, 2, 3]\n",
    b'"status"\n',
    b"42\n",
    b"null\n",
    b"{}\n",
    b'{"cmd": 5}\n',
    b'{"cmd": null}\n',
    b'{"cmd": "explode"}\n',
    b'{"cmd": "' + b"x" * 5000 + b'"}\n',
    b"[" * 50_000 + b"\n",                      # nested past the parser's recursion limit
    b'{"a":' * 20_000 + b"1" + b"}" * 20_000 + b"\n",
    b'{"cmd": "scale", "procs": ' + b"9" * 5000 + b"}\n",   # past int()'s digit limit
    b'{"cmd": "scale", "procs": NaN}\n',
    b'{"cmd": "\\udcff"}\n',
]


def test_garbage_gets_an_error_reply_and_the_supervisor_carries_on(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()

    for payload in GARBAGE:
        replies = raw_exchange(sup.socket_path, payload)
        assert len(replies) <= 1, (payload[:40], replies)
        for reply in replies:
            assert reply["ok"] is False and reply["error"], (payload[:40], reply)
        assert sup.status()["procs"] == 2, f"supervisor stopped answering after {payload[:40]!r}"

    unknown = raw_exchange(sup.socket_path, b'{"cmd": "explode"}\n')
    assert unknown == [{"ok": False, "error": unknown[0]["error"]}] and "unknown command" in unknown[0]["error"]
    # A bad line does not poison the connection: later lines are answered.
    replies = raw_exchange(sup.socket_path, b'nonsense\n\n{"cmd": "status"}\n', replies=2)
    assert [reply["ok"] for reply in replies] == [False, True]
    # Half a line, then the client hangs up: nothing to answer, nothing breaks.
    assert raw_exchange(sup.socket_path, b'{"cmd": "sta', hang_up=True) == []
    assert_still_serving(sup, store, tmp_path)


@pytest.mark.parametrize("newline", [True, False], ids=["with-newline", "without-newline"])
def test_a_line_over_64_kib_is_refused_and_the_connection_closed(db_url, store, supervisors, tmp_path, newline):
    sup = supervisors(db_url, procs=2).start()
    line = b'{"cmd": "status", "pad": "' + b"x" * (70 * 1024) + b'"}' + (b"\n" if newline else b"")

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(sup.socket_path)
        try:
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed on us mid-send: also a refusal
        replies = read_replies(sock, replies=2)  # reads to EOF: the server closes
    assert len(replies) <= 1
    for reply in replies:
        assert reply["ok"] is False and "larger than" in reply["error"], reply
    assert_still_serving(sup, store, tmp_path)


def test_200_concurrent_connections_are_answered_or_refused(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    clients = []
    try:
        for _ in range(200):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            clients.append(sock)
            # Blocking: with the listen backlog full, connect() waits for the
            # supervisor to accept instead of failing with EAGAIN.
            sock.connect(sup.socket_path)
            sock.settimeout(30)
        for sock in clients:
            try:
                sock.sendall(b'{"cmd": "status"}\n')
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused and closed before we spoke: its reply is still readable
        replies = [read_replies(sock) for sock in clients]
    finally:
        for sock in clients:
            sock.close()

    answered = [r[0] for r in replies if r and r[0]["ok"]]
    refused = [r[0] for r in replies if r and not r[0]["ok"]]
    assert len(answered) + len(refused) == 200, "every client gets a reply"
    assert answered, "connections within the limit are served"
    assert all(reply["name"] == sup.name for reply in answered)
    assert all("too many" in reply["error"] for reply in refused), refused[:3]
    assert_still_serving(sup, store, tmp_path)


def test_a_half_open_client_never_stalls_the_loop_and_is_dropped(db_url, store, supervisors, tmp_path):
    # A shorter idle limit than the default 10 s: the same rule, less waiting.
    sup = supervisors(db_url, procs=2, args=["--control-timeout", "4"]).start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as half:
        silent.connect(sup.socket_path)
        half.connect(sup.socket_path)
        half.sendall(b'{"cmd": "status", "never": "ends')

        # While both hang on, everyone else is served and runs run.
        started = time.monotonic()
        assert_still_serving(sup, store, tmp_path)
        assert time.monotonic() - started < 30

        for sock in (silent, half):
            sock.settimeout(60)
            assert sock.recv(65536) == b"", "an idle client is disconnected"
    assert_still_serving(sup, store, tmp_path)


def test_absurd_requests_get_error_replies(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    absurd = [
        {"cmd": "scale", "procs": 10_000},
        {"cmd": "scale", "procs": -1},
        {"cmd": "scale", "procs": "x"},
        {"cmd": "scale", "procs": True},
        {"cmd": "scale", "procs": 2.5},
        {"cmd": "scale", "procs": None},
        {"cmd": "scale"},
        {"cmd": "kill"},
        {"cmd": "kill", "run": ""},
        {"cmd": "kill", "run": 123},
        {"cmd": "kill", "run": ["a"]},
        {"cmd": "kill", "run": str(uuid.uuid4()), "requeue": "yes"},
        {"cmd": "STATUS"},
    ]
    for request in absurd:
        reply = sup.ctl(request)
        assert reply["ok"] is False and isinstance(reply["error"], str) and reply["error"], (request, reply)

    status = sup.wait_idle()
    assert status["procs"] == 2 and len(sup.live_child_pids()) == 2
    assert_still_serving(sup, store, tmp_path)


# -- another uid ----------------------------------------------------------------------------


def connect_as(uid: int, path: str) -> dict[str, Any]:
    """From a forked child running as ``uid``: connect, ask for status and
    report what happened: ``{"errno": N}``, or ``{"data": "..."}`` with the
    first reply line (empty if the server hung up without one)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        result: dict[str, Any]
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(10)
            try:
                sock.connect(path)
                try:
                    sock.sendall(b'{"cmd": "status"}\n')
                except OSError:
                    pass
                data = b""
                while b"\n" not in data:
                    try:
                        chunk = sock.recv(65536)
                    except ConnectionResetError:
                        break
                    if not chunk:
                        break
                    data += chunk
                result = {"data": data.decode(errors="replace")}
            except OSError as exc:
                result = {"errno": exc.errno}
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        output = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(output)


def test_another_uid_is_refused_even_if_the_socket_mode_lets_it_connect(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    os.chmod(os.path.dirname(sup.socket_path), 0o755)
    os.chmod(sup.socket_path, 0o666)

    outcome = connect_as(NOBODY, sup.socket_path)

    assert "data" in outcome, outcome
    replies = [json.loads(line) for line in outcome["data"].splitlines() if line.strip()]
    assert replies in ([], [{"ok": False, "error": "permission denied"}]), replies
    # Logged right after the refusal is sent, so possibly after we read it.
    wait_until(lambda: "refused control connection from uid 65534" in sup.log(), "the refusal in the log")
    assert_still_serving(sup, store, tmp_path)


def test_another_uid_cannot_even_connect_to_the_default_0600_socket(db_url, store, supervisors, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    os.chmod(os.path.dirname(sup.socket_path), 0o755)  # only the socket's own mode keeps it out
    assert stat.S_IMODE(os.stat(sup.socket_path).st_mode) == 0o600

    assert connect_as(NOBODY, sup.socket_path) == {"errno": errno.EACCES}
    assert json.loads(connect_as(os.getuid(), sup.socket_path)["data"])["ok"] is True
    assert_still_serving(sup, store, tmp_path)


# -- the ctl command --------------------------------------------------------------------------


def ctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*supervisor_command(), "ctl", *args], env=env, capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


def refused(result: subprocess.CompletedProcess[str], fragment: str) -> None:
    """Exit 2 with exactly one line on stderr naming the problem."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("everystep-supervisor"), result.stderr
    assert "error" in lines[0] and fragment in lines[0], lines[0]


def test_ctl_status_prints_a_table_or_json(db_url, store, supervisors, subprocess_env, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    run = schedule(supervised.gated_flow, spec(tmp_path, gate="go"), database=store)
    busy = sup.busy_child(run.id, "2")

    table = ctl(subprocess_env, "status", "--socket", sup.socket_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"supervisor {sup.name} pid {sup.pid}")
    assert lines[1].split()[:3] == ["SLOT", "PID", "STATE"]
    row = next(line for line in lines if str(busy["pid"]) in line.split())
    assert run.id in row and "tests.apps.supervised.gated_flow" in row and " 2 gated " in row and "busy" in row
    assert len(lines) == 2 + 2

    for args in (("--json", "--socket", sup.socket_path, "status"), ("status", "--json", "--socket", sup.socket_path)):
        raw = ctl(subprocess_env, *args)
        assert raw.returncode == 0, raw.stderr
        reply = json.loads(raw.stdout)
        assert reply["ok"] is True and reply["pid"] == sup.pid
        assert any(c["run_id"] == run.id and c["step_id"] == "2" for c in reply["children"])
    open_gate(tmp_path, "go")
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED


def test_ctl_errors_are_one_line_and_exit_2(db_url, supervisors, subprocess_env, tmp_path):
    missing = ctl(subprocess_env, "status", "--socket", str(tmp_path / "nobody-here.sock"))
    refused(missing, "no supervisor control socket")

    sup = supervisors(db_url, procs=1).start()
    refused(ctl(subprocess_env, "kill", str(uuid.uuid4()), "--socket", sup.socket_path), "not executing")
    refused(ctl(subprocess_env, "scale", "10000", "--socket", sup.socket_path), "scale needs")
    as_json = ctl(subprocess_env, "kill", str(uuid.uuid4()), "--socket", sup.socket_path, "--json")
    assert as_json.returncode == 2 and json.loads(as_json.stdout)["ok"] is False
    assert sup.status()["procs"] == 1


def test_ctl_kill_scale_reload_and_drain(db_url, store, supervisors, subprocess_env, tmp_path):
    sup = supervisors(db_url, procs=2).start()
    path = sup.socket_path

    scaled = ctl(subprocess_env, "scale", "3", "--socket", path)
    assert scaled.returncode == 0 and scaled.stdout.strip() == "scaled from 2 to 3 children", scaled
    before = {c["pid"] for c in sup.wait_idle(procs=3)["children"]}

    reload = ctl(subprocess_env, "reload", "--socket", path)
    assert reload.returncode == 0 and "reloaded" in reload.stdout, reload
    status = sup.wait_status(
        lambda s: len(s["children"]) == 3 and all(c["state"] == "idle" and c["pid"] not in before
                                                  for c in s["children"]),
        "three new children",
    )
    wait_for_pids_gone(list(before))

    run = schedule(supervised.gated_flow, spec(tmp_path, gate="never"), database=store)
    busy = sup.busy_child(run.id, "2")
    killed = ctl(subprocess_env, "kill", run.id, "--socket", path)
    assert killed.returncode == 0 and f"(pid {busy['pid']})" in killed.stdout and run.id in killed.stdout, killed
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == FAILED

    drained = ctl(subprocess_env, "drain", "--socket", path)
    assert drained.returncode == 0 and "draining" in drained.stdout, drained
    assert sup.wait() == 0, sup.log()
    wait_for_pids_gone([c["pid"] for c in status["children"]])
    assert not os.path.exists(path)


RELOADABLE = '''
from everystep import step, workflow


@step
def version_step() -> int:
    return {version}


@workflow
def versioned() -> int:
    return version_step()
'''


def test_ctl_reload_reports_its_outcome(db_url, store, supervisors, subprocess_env, tmp_path):
    """The reply says what happened: a module that fails to import is named
    with its file and line (exit 2) and the running code stays; a good one
    is re-imported and the children replaced, before the reply."""
    package = tmp_path / "reloadable_app"
    package.mkdir()
    module = package / "app_v.py"
    (package / "__init__.py").write_text("")
    module.write_text(RELOADABLE.format(version=1))
    env = {**subprocess_env, "PYTHONPATH": f"{tmp_path}:{subprocess_env['PYTHONPATH']}"}
    sup = supervisors(db_url, procs=2, env=env, app="reloadable_app.app_v").start()
    before = {child["pid"] for child in sup.status()["children"]}

    module.write_text(RELOADABLE.format(version="2 +"))  # a syntax error on line 7
    broken = ctl(env, "reload", "--socket", sup.socket_path)
    refused(broken, "reload of reloadable_app.app_v failed: SyntaxError")
    assert f"({module}:7)" in broken.stderr and "keeping the running code" in broken.stderr
    assert {child["pid"] for child in sup.wait_idle()["children"]} == before
    assert "reload of reloadable_app.app_v failed" in sup.log()

    module.write_text(RELOADABLE.format(version=2))
    reloaded = ctl(env, "reload", "--socket", sup.socket_path)
    assert reloaded.returncode == 0, reloaded.stderr
    assert reloaded.stdout.strip() == "reloaded reloadable_app.app_v; replacing 2 children"
    sup.wait_status(lambda s: len(s["children"]) == 2 and all(c["state"] == "idle" and c["pid"] not in before
                                                              for c in s["children"]), "two new children")
    run = schedule("reloadable_app.app_v.versioned", database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).result == 2
    assert "(ctl pid" in sup.log()  # who asked is logged
