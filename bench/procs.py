"""Starting and watching the processes under test.

Everything under test runs in its own process, started the way a user would
start it (``python -m supervisor.cli``, ``python -m everystep.cli worker``,
a peer's worker), with the repository root on ``PYTHONPATH`` so that
``--app bench.workloads`` imports. Output goes to a log file per process in
the work directory; a failing process raises ``BenchError`` quoting its tail.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor.ctl import exchange

ROOT = Path(__file__).resolve().parent.parent
_counter = itertools.count(1)


class BenchError(RuntimeError):
    """A process under test failed or a measurement could not be taken."""


def env(**extra: str) -> dict[str, str]:
    environment = dict(os.environ)
    path = environment.get("PYTHONPATH", "")
    environment["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    environment.pop("EVERYSTEP_DATABASE_URL", None)
    environment.update(extra)
    return environment


class Workdir:
    """Where logs, sockets and SQLite files of one invocation live."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def log(self, label: str) -> Path:
        return self.path / f"{next(_counter):03d}-{label}.log"

    def socket(self) -> str:
        # Unix socket paths are limited to ~107 bytes: keep them short.
        return str(self.path / f"s{next(_counter)}.sock")


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class Proc:
    """A started process with its log file."""

    def __init__(self, cmd: Sequence[str], log: Path, extra_env: dict[str, str] | None = None) -> None:
        self.cmd = list(cmd)
        self.log = log
        self._file = open(log, "wb")
        self.started = time.perf_counter()
        self.popen = subprocess.Popen(
            self.cmd, stdout=self._file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env(**(extra_env or {})), cwd=ROOT,
        )
        self.ended: float | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait(self, timeout: float) -> int:
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise BenchError(f"{self.describe()} did not finish within {timeout:.0f}s\n{tail(self.log)}") from None
        self.ended = time.perf_counter()
        self._file.close()
        return code

    def check(self, timeout: float) -> float:
        """Wait for a successful exit; returns the wall time in seconds."""
        code = self.wait(timeout)
        if code != 0:
            raise BenchError(f"{self.describe()} exited with {code}\n{tail(self.log)}")
        assert self.ended is not None
        return self.ended - self.started

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (a drain for our runners), then SIGKILL if it lingers."""
        if self.popen.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._file.close()

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)
        self._file.close()

    def describe(self) -> str:
        shown = " ".join(part if len(part) < 60 else part[:57] + "..." for part in self.cmd[1:6])
        return f"[{shown} …]"


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def run(cmd: Sequence[str], log: Path, timeout: float, extra_env: dict[str, str] | None = None) -> float:
    """Run to completion; returns wall seconds, raises on failure."""
    return Proc(cmd, log, extra_env).check(timeout)


def supervisor_cmd(database: str, procs: int, socket_path: str, *, app: str = "bench.workloads",
                   name: str | None = None, burst: bool = True, extra: Sequence[str] = ()) -> list[str]:
    cmd = python("-m", "supervisor.cli", "--app", app, "--procs", str(procs), "--database", database,
                 "--socket", socket_path, "--name", name or f"bench-{next(_counter)}",
                 "--log-level", "warning", "--no-progress")
    if burst:
        cmd.append("--burst")
    return [*cmd, *extra]


def ctl(socket_path: str, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One request on the supervisor's control socket."""
    return exchange(socket_path, message, timeout)


def wait_children_idle(socket_path: str, procs: int, timeout: float = 30.0,
                       exclude_pids: set[int] | None = None) -> dict[str, Any]:
    """Poll ``status`` until ``procs`` children (none of ``exclude_pids``)
    are idle; returns the status reply."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            last = ctl(socket_path, {"cmd": "status"})
            kids = [kid for kid in last.get("children", [])
                    if kid.get("state") == "idle" and kid.get("pid") not in (exclude_pids or set())]
            if len(kids) >= procs:
                return last
        time.sleep(0.002)
    raise BenchError(f"supervisor children not idle within {timeout:.0f}s (last status: {last})")


@contextlib.contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    try:
        yield proc
    finally:
        proc.stop()
