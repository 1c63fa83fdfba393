"""Run a real ``everystep-supervisor`` for a test, and always clean it up.

``Supervisor`` starts the console script as a subprocess in its own session
(the ``subprocess_env`` environment, ``--app tests.apps.supervised``), waits
until its control socket answers ``status`` with every child idle, and
speaks raw JSON lines to that socket (``ctl``). Its log goes to a file so a
chatty supervisor never blocks on a full pipe, and failing assertions quote it.

Cleanup is the point of this module. A child moves to its own process group
(so the parent can kill its grandchildren), so killing the parent's group is
not enough: every pid the tests ever saw (from ``status`` and from psutil)
is remembered as a ``psutil.Process`` (which refuses to signal a recycled
pid) and each one's group is SIGKILLed at the end, along with the parent.

The ``supervisors`` fixture hands out a factory and cleans up whatever it
started; import it into a test module to use it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.cgroups import own_cgroup, remove_stale
from tests.apps.supervised import effect_lines
from tests.support.waiting import wait_until

APP = "tests.apps.supervised"
SCRIPT = str(Path(sys.executable).parent / "everystep-supervisor")
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


def supervisor_command() -> list[str]:
    """The installed console script, or the module if it is not installed."""
    if os.path.exists(SCRIPT):
        return [SCRIPT]
    return [sys.executable, "-m", "supervisor.cli"]


def short_socket_dir() -> Path:
    """A private directory with a short path: pytest's tmp_path can exceed
    the 107-byte limit of a Unix socket address."""
    return Path(tempfile.mkdtemp(prefix="es-sup-", dir="/tmp"))


def raw_exchange(
    path: str, data: bytes, timeout: float = 10.0, replies: int = 1, hang_up: bool = False
) -> list[dict[str, Any]]:
    """Send ``data`` as is and read up to ``replies`` JSON lines (fewer if
    the server closes the connection first). ``hang_up`` closes our sending
    side right after ``data``, as a client that gives up mid-line does."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        if hang_up:
            sock.shutdown(socket.SHUT_WR)
        return read_replies(sock, replies)


def read_replies(sock: socket.socket, replies: int = 1) -> list[dict[str, Any]]:
    buffer = b""
    while buffer.count(b"\n") < replies:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        buffer += chunk
    return [json.loads(line) for line in buffer.splitlines() if line.strip()]


class Supervisor:
    """One ``everystep-supervisor`` process started for a test."""

    def __init__(
        self,
        db_url: str,
        env: dict[str, str],
        workdir: Path,
        *,
        name: str | None = None,
        procs: int = 2,
        args: Sequence[str] = (),
        poll: float = 0.1,
        socket_path: str | None = None,
        app: str = APP,
    ) -> None:
        self.db_url = db_url
        self.env = dict(env)
        self.workdir = workdir
        self.name = name or f"sup-{uuid.uuid4().hex[:8]}"
        self.procs = procs
        self._socket_dir: Path | None = None
        if socket_path is None:
            self._socket_dir = short_socket_dir()
            socket_path = str(self._socket_dir / "ctl.sock")
        self.socket_path = socket_path
        self.log_path = workdir / f"supervisor-{self.name}-{uuid.uuid4().hex[:6]}.log"
        self.command = [
            *supervisor_command(), "--app", app, "--database", db_url, "--name", self.name,
            "--socket", socket_path, "--procs", str(procs), "--poll", str(poll), *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self._known: dict[int, psutil.Process] = {}

    # -- lifecycle ---------------------------------------------------------------

    def spawn(self) -> Supervisor:
        """Start the process without waiting for anything (``--burst`` may
        be gone before its socket could answer)."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._remember(self.proc.pid)
        return self

    def start(self, wait_idle: bool = True, timeout: float = READY_TIMEOUT) -> Supervisor:
        """Start, then wait until ``status`` answers (with every child idle
        unless ``wait_idle`` is False: runs may already be keeping them busy)."""
        self.spawn()
        if wait_idle:
            self.wait_idle(timeout=timeout)
        else:
            self.wait_status(lambda status: True, "the control socket", timeout=timeout)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = STOP_TIMEOUT) -> int:
        """Wait for the parent to exit; returns its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running after {timeout}s\n--- log ---\n{self.log()}") from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT) -> int:
        self.send_signal(sig)
        return self.wait(timeout)

    def cleanup(self) -> None:
        """SIGKILL the parent and every child (and their groups) ever seen."""
        if self.proc is not None:
            try:
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    self._known.setdefault(child.pid, child)
            except psutil.Error:
                pass
        for process in list(self._known.values()):
            _kill_group(process)
        if self.proc is not None:
            try:
                self.proc.kill()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        # Orphans are reaped by pid 1 when it gets to it: a zombie is dead enough.
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline and any(_alive(process) for process in self._known.values()):
            time.sleep(0.02)
        # A SIGKILLed supervisor leaves the cgroups it made for its children.
        own = own_cgroup()
        if not isinstance(own, str):
            remove_stale(own[1])
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    # -- processes ----------------------------------------------------------------

    def _remember(self, pid: int) -> None:
        if pid not in self._known:
            try:
                self._known[pid] = psutil.Process(pid)
            except psutil.Error:
                pass

    def track(self, pids: Sequence[int]) -> None:
        for pid in pids:
            self._remember(pid)

    def live_child_pids(self) -> set[int]:
        """Live (not zombie) children of the parent, according to the kernel."""
        try:
            children = psutil.Process(self.pid).children()
        except psutil.Error:
            return set()
        pids = set()
        for child in children:
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    pids.add(child.pid)
                    self._known.setdefault(child.pid, child)
            except psutil.Error:
                pass
        return pids

    # -- control socket -------------------------------------------------------------

    def ctl(self, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        """One request as a JSON line, one reply."""
        replies = raw_exchange(self.socket_path, (json.dumps(request) + "\n").encode(), timeout=timeout)
        assert replies, f"no reply to {request!r}\n--- log ---\n{self.log()}"
        return replies[0]

    def status(self) -> dict[str, Any]:
        reply = self.ctl({"cmd": "status"})
        assert reply.get("ok"), reply
        self.track([child["pid"] for child in reply["children"]])
        return reply

    def try_status(self) -> dict[str, Any] | None:
        try:
            return self.status()
        except (OSError, ValueError, AssertionError):
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(
                    f"supervisor exited with {self.proc.returncode}\n--- log ---\n{self.log()}"
                ) from None
            return None

    def wait_status(
        self, predicate: Callable[[dict[str, Any]], Any], what: str, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Poll ``status`` until ``predicate(status)`` holds; returns that status."""

        def check() -> dict[str, Any] | None:
            status = self.try_status()
            return status if status is not None and predicate(status) else None

        try:
            return wait_until(check, what, timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nlast status: {self.try_status()}\n--- log ---\n{self.log()}") from None

    def wait_idle(self, procs: int | None = None, timeout: float = READY_TIMEOUT) -> dict[str, Any]:
        expected = self.procs if procs is None else procs
        return self.wait_status(
            lambda s: len(s["children"]) == expected and all(c["state"] == "idle" for c in s["children"]),
            f"{expected} idle children", timeout=timeout,
        )

    def busy_child(self, run_id: str, step_id: str | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """The status row of the child executing ``run_id`` (inside ``step_id``
        when given, else inside any step)."""

        def find(status: dict[str, Any]) -> dict[str, Any] | None:
            for child in status["children"]:
                if child["run_id"] == run_id and child["step_id"] is not None \
                        and (step_id is None or child["step_id"] == step_id):
                    return child
            return None

        return find(self.wait_status(find, f"run {run_id} busy in step {step_id or 'any'}", timeout=timeout))

    def at_gate(self, run_id: str, directory: str | os.PathLike[str], timeout: float = 60.0) -> dict[str, Any]:
        """The status row of the child holding ``run_id`` (a
        ``supervised.gated_flow``) at its gate: inside step 2 with the
        step's body begun, its ``gated:start`` effect written. The step
        board shows a step just before it is called, so a child killed
        right after ``busy_child`` may not have written it yet."""
        child = self.busy_child(run_id, "2", timeout=timeout)
        wait_until(lambda: (child["pid"], "gated:start") in effect_lines(directory, run_id),
                   f"run {run_id}'s child {child['pid']} at its gate", timeout=timeout)
        return child


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_group(process: psutil.Process) -> None:
    try:
        if not process.is_running():
            return
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except (psutil.Error, OSError):
        pass


@pytest.fixture
def supervisors(subprocess_env: dict[str, str], tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    """``supervisors(db_url, **options)`` builds a ``Supervisor`` (not yet
    started); every one built is killed, with its children, at teardown."""
    built: list[Supervisor] = []

    def build(db_url: str, **options: Any) -> Supervisor:
        options.setdefault("env", subprocess_env)
        options.setdefault("workdir", tmp_path)
        supervisor = Supervisor(db_url, options.pop("env"), options.pop("workdir"), **options)
        built.append(supervisor)
        return supervisor

    try:
        yield build
    finally:
        for supervisor in built:
            supervisor.cleanup()


def wait_for_pids_gone(pids: Sequence[int], timeout: float = 60.0) -> None:
    """Wait until none of ``pids`` is a live (non-zombie) process."""

    def gone() -> bool:
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    return False
            except psutil.NoSuchProcess:
                continue
        return True

    wait_until(gone, f"pids {list(pids)} to exit", timeout=timeout)


def wait_run(store: Any, run_id: str, statuses: Sequence[str], timeout: float = 60.0,
             supervisor: Supervisor | None = None) -> Any:
    """Poll the database until run ``run_id`` has one of ``statuses``."""
    try:
        return wait_until(lambda: (lambda run: run if run.status in statuses else None)(store.get_run(run_id)),
                          f"run {run_id} to be {'/'.join(statuses)}", timeout=timeout)
    except AssertionError as exc:
        run = store.get_run(run_id)
        log = f"\n--- log ---\n{supervisor.log()}" if supervisor is not None else ""
        raise AssertionError(f"{exc}; it is {run.status} (error {run.error}){log}") from None


def error_type(error: dict[str, Any] | None) -> str | None:
    """The dotted exception type of an encoded error."""
    return error.get("type") if isinstance(error, dict) else None
