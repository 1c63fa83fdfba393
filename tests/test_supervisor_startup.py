"""A supervisor started while its database is down waits for it.

The shipped unit's restart logic is simulated (``SimulatedUnit``: what
systemd does with its ``Restart=``, ``RestartSec=`` and start limit), the
supervisor talks to a real ``NOTIFY_SOCKET`` datagram socket the test
reads, and the database is a throwaway PostgreSQL cluster this test starts
about 20 s after the supervisor. The supervisor must be started once, say
``STATUS=waiting for the database`` (extending the start timeout), feed the
watchdog, and send ``READY=1`` only once the database answers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from everystep.store import connect
from tests.support.pgserver import PgServer, start_server
from tests.support.supervisor import supervisor_command
from tests.support.waiting import wait_until
from tests.test_systemd_units import PLAIN, parse_unit

pytestmark = [pytest.mark.timeout(300)]

#: How long after the supervisor the database comes up.
DATABASE_LATE_BY = 20.0
#: systemd's defaults when a unit sets no start limit (DefaultStartLimit*).
DEFAULT_START_LIMIT_INTERVAL = 10.0
DEFAULT_START_LIMIT_BURST = 5


class SimulatedUnit:
    """systemd's handling of a unit's process: restart on a failed exit
    (``Restart=on-failure``) after ``RestartSec=``, and give up for good
    after more than ``StartLimitBurst=`` starts within
    ``StartLimitIntervalSec=`` (0: never)."""

    def __init__(self, unit_file: Path, command: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        unit = parse_unit(unit_file)
        service, section = unit["Service"], unit["Unit"]
        self.restart = service["Restart"][-1]
        self.restart_sec = float(service["RestartSec"][-1])
        self.interval = float(section.get("StartLimitIntervalSec", [DEFAULT_START_LIMIT_INTERVAL])[-1])
        self.burst = int(section.get("StartLimitBurst", [DEFAULT_START_LIMIT_BURST])[-1])
        self.command, self.env, self.cwd, self.log = command, env, cwd, log
        self.starts: list[float] = []
        self.exit_codes: list[int] = []
        self.gave_up = False
        self.proc: subprocess.Popen[bytes] | None = None
        self._exited_at: float | None = None

    def start(self) -> None:
        now = time.monotonic()
        recent = [at for at in self.starts if self.interval > 0 and now - at < self.interval]
        if self.interval > 0 and len(recent) >= self.burst:
            self.gave_up = True  # "Start request repeated too quickly"
            return
        self.starts.append(now)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.command, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self._exited_at = None

    def poll(self) -> None:
        """Restart the process if systemd would."""
        if self.proc is None or self.gave_up:
            return
        code = self.proc.poll()
        if code is None:
            return
        if self._exited_at is None:
            self._exited_at = time.monotonic()
            self.exit_codes.append(code)
        if code != 0 and self.restart in ("on-failure", "always") \
                and time.monotonic() - self._exited_at >= self.restart_sec:
            self.start()

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


class NotifyReceiver:
    """The systemd side of ``NOTIFY_SOCKET``: every datagram, parsed."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="es-notify-", dir="/tmp")
        self.path = os.path.join(self.directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.messages: list[dict[str, str]] = []

    def read(self) -> list[dict[str, str]]:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return self.messages
            self.messages.append(dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line))

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)
        os.rmdir(self.directory)


@pytest.fixture
def late_pg() -> Iterator[tuple[PgServer, str]]:
    """A throwaway cluster with a migrated database, stopped."""
    server = start_server(env_var="EVERYSTEP_NO_EXTERNAL_SERVER_FOR_STARTUP")
    try:
        url = server.create_database("everystep_late")
        store = connect(url)
        store.migrate()
        store.close()
        server.stop("fast")
        yield server, url
    finally:
        server.close()


@pytest.fixture
def notify() -> Iterator[NotifyReceiver]:
    receiver = NotifyReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


def test_the_shipped_unit_never_gives_up_restarting() -> None:
    for unit_file in sorted(PLAIN.parent.glob("*.service")):
        assert parse_unit(unit_file)["Unit"]["StartLimitIntervalSec"] == ["0"], unit_file


def test_a_supervisor_started_before_its_database_waits_for_it(
        late_pg: tuple[PgServer, str], notify: NotifyReceiver, subprocess_env: dict[str, str],
        tmp_path: Path) -> None:
    server, url = late_pg
    socket_dir = Path(tempfile.mkdtemp(prefix="es-sup-", dir="/tmp"))
    env = dict(subprocess_env, NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="2000000")
    command = [*supervisor_command(), "--app", "tests.apps.supervised", "--database", url, "--name", "late",
               "--socket", str(socket_dir / "ctl.sock"), "--procs", "1"]
    log = tmp_path / "supervisor.log"
    unit = SimulatedUnit(PLAIN, command, env, tmp_path, log)
    unit.start()
    started = time.monotonic()
    try:
        def waiting() -> bool:
            unit.poll()
            return any(m.get("STATUS", "").startswith("waiting for the database") for m in notify.read())

        wait_until(waiting, "STATUS=waiting for the database", timeout=90, detail=log.read_text)
        while time.monotonic() - started < DATABASE_LATE_BY:
            unit.poll()
            time.sleep(0.2)
        before = notify.read()[:]
        assert not any("READY" in m for m in before), before
        assert all("EXTEND_TIMEOUT_USEC" in m for m in before if m.get("STATUS", "").startswith("waiting")), before
        assert any(m.get("WATCHDOG") == "1" for m in before), before
        server.start()

        def ready() -> bool:
            unit.poll()
            return any(m.get("READY") == "1" for m in notify.read())

        wait_until(ready, "READY=1 once the database is up", timeout=120, detail=log.read_text)
        assert (len(unit.starts), unit.exit_codes, unit.gave_up) == (1, [], False), log.read_text()
        assert unit.stop() == 0, log.read_text()
    finally:
        unit.kill()
        socket_dir.joinpath("ctl.sock").unlink(missing_ok=True)
        socket_dir.rmdir()
    lines = log.read_text().splitlines()
    assert len([line for line in lines if "waiting for it" in line]) == 1, lines
    assert len([line for line in lines if "reachable after" in line]) == 1, lines


def test_wait_for_database_bounds_the_wait(subprocess_env: dict[str, str], tmp_path: Path) -> None:
    unreachable = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
    for limit, waits in (("0", 0), ("1", 1)):
        done = subprocess.run([*supervisor_command(), "--database", unreachable, "--socket",
                               str(tmp_path / "s.sock"), "--wait-for-database", limit],
                              env=subprocess_env, capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, cwd=tmp_path)
        lines = done.stderr.splitlines()
        assert done.returncode == 3, done.stderr
        assert len([line for line in lines if "waiting for it" in line]) == waits, done.stderr
        assert lines[-1].startswith("everystep-supervisor: error: ") and "unavailable" in lines[-1], done.stderr
        assert len(lines) == waits + 1, done.stderr




@pytest.mark.parametrize("phase, sig, code", [
    ("waiting for the database", signal.SIGTERM, 0),
    ("importing the app", signal.SIGTERM, 0),
    ("waiting for the database", signal.SIGINT, 130),
])
def test_a_stop_signal_while_starting_stops_it_with_its_stopped_line(
        phase: str, sig: int, code: int, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    """The signal table's promise holds before the loop runs: TERM drains
    (nothing is claimed yet) and exits 0 with the last ``stopped`` line."""
    gate = tmp_path / "gate"
    env = dict(subprocess_env, EVERYSTEP_TEST_IMPORT_GATE=str(gate))
    unreachable = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
    app = "tests.apps.slow_import" if phase == "importing the app" else "tests.apps.supervised"
    log = tmp_path / "supervisor.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*supervisor_command(), "--app", app, "--database", unreachable, "--name", "early",
                                 "--socket", str(tmp_path / "s.sock")], env=env, cwd=tmp_path,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        if phase == "importing the app":
            wait_until(gate.with_suffix(".importing").exists, "the app's import to start", timeout=60)
        else:
            wait_until(lambda: "waiting for it, as long as it takes" in log.read_text(),
                       "the wait for the database", timeout=60, detail=log.read_text)
        proc.send_signal(sig)
        assert proc.wait(60) == code, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    lines = log.read_text().splitlines()
    assert lines[-1].endswith(f"everystep-supervisor early: stopped (exit code {code})"), lines
    assert f"{signal.Signals(sig).name} received while starting" in lines[-2], lines
