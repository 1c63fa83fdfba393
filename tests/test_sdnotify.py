"""supervisor.sdnotify against real AF_UNIX datagram sockets.

Each test binds the receiving end itself (a file in tmp_path or an abstract
name) and hands its address to the Notifier through ``environ``, so nothing
here depends on running under systemd.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.sdnotify import Notifier

pytestmark = pytest.mark.timeout(30)


def _receiver(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    # A missing datagram must fail the test, not hang it.
    sock.settimeout(5)
    return sock


def _recv(sock: socket.socket) -> str:
    return sock.recv(65536).decode("utf-8")


def _nothing_pending(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    sock = _receiver(path)
    try:
        yield sock, path
    finally:
        sock.close()


@pytest.fixture
def notifier(receiver: tuple[socket.socket, str]) -> Iterator[Notifier]:
    _, path = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    try:
        yield n
    finally:
        n.close()


def test_ready_without_status(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    assert notifier.enabled
    assert notifier.ready() is True
    assert _recv(sock) == "READY=1"


def test_ready_with_status(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.ready("8 children idle")
    assert _recv(sock) == "READY=1\nSTATUS=8 children idle"


def test_status(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.status("draining: 3 runs left")
    assert _recv(sock) == "STATUS=draining: 3 runs left"


def test_status_newlines_cannot_inject_fields(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.status("line one\nREADY=1")
    assert _recv(sock) == "STATUS=line one READY=1"


def test_stopping(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.stopping()
    assert _recv(sock) == "STOPPING=1"
    notifier.stopping("draining")
    assert _recv(sock) == "STOPPING=1\nSTATUS=draining"


def test_reloading_carries_monotonic_usec(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = _recv(sock).split("\n")
    assert lines[0] == "RELOADING=1"
    assert len(lines) == 2
    key, _, value = lines[1].partition("=")
    assert key == "MONOTONIC_USEC"
    assert before <= int(value) <= after


def test_reloading_with_status(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.reloading("recycling children")
    lines = _recv(sock).split("\n")
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=")
    assert lines[2] == "STATUS=recycling children"


def test_watchdog(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.watchdog()
    assert _recv(sock) == "WATCHDOG=1"


def test_low_level_notify_and_send(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    assert notifier.notify(EXTEND_TIMEOUT_USEC=5_000_000, STATUS="catching up")
    assert _recv(sock) == "EXTEND_TIMEOUT_USEC=5000000\nSTATUS=catching up"
    assert notifier.send("MAINPID=1\nX=y")
    assert _recv(sock) == "MAINPID=1\nX=y"
    assert notifier.notify() is False  # nothing to say, nothing sent
    assert _nothing_pending(sock)


def test_abstract_namespace() -> None:
    name = f"everystep-test-{uuid.uuid4().hex}"
    sock = _receiver(b"\0" + name.encode())
    try:
        with Notifier.from_env({"NOTIFY_SOCKET": "@" + name}) as n:
            assert n.ready("up")
            assert _recv(sock) == "READY=1\nSTATUS=up"
            n.stopping()
            assert _recv(sock) == "STOPPING=1"
    finally:
        sock.close()


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    n = Notifier.from_env({"WATCHDOG_USEC": "2000000"})
    assert n.watchdog_interval == 1.0
    mine = str(os.getpid())
    n = Notifier.from_env({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": mine})
    assert n.watchdog_interval == 1.0


def test_watchdog_interval_for_another_pid_is_none() -> None:
    other = os.getpid() + 1
    n = Notifier.from_env({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(other)})
    assert n.watchdog_interval is None


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "not-a-pid"},
    ],
)
def test_watchdog_interval_absent_or_invalid_is_none(env: dict[str, str]) -> None:
    assert Notifier.from_env(env).watchdog_interval is None


def test_noop_when_notify_socket_unset() -> None:
    n = Notifier.from_env({"WATCHDOG_USEC": "2000000"})
    assert not n.enabled
    assert n.ready("x") is False
    assert n.status("x") is False
    assert n.stopping() is False
    assert n.reloading() is False
    assert n.watchdog() is False
    assert n.send("READY=1") is False
    assert n.watchdog_due(time.monotonic()) is False
    assert n.maybe_watchdog(time.monotonic()) is False
    assert n.seconds_until_watchdog(time.monotonic()) is None
    n.close()
    n.close()


@pytest.mark.parametrize("value", ["", "relative/path.sock", "vsock:2:1234"])
def test_unusable_notify_socket_is_a_noop(value: str) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": value})
    assert not n.enabled
    assert n.ready() is False


def test_vanished_socket_path_does_not_raise(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "gone.sock"
    sock = _receiver(str(path))
    n = Notifier.from_env({"NOTIFY_SOCKET": str(path)})
    sock.close()
    path.unlink()
    with caplog.at_level(logging.DEBUG, logger="everystep.supervisor"):
        assert n.ready() is False
        assert n.status("still here") is False
        assert n.watchdog() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].name == "everystep.supervisor"
    assert "ENOENT" in warnings[0].getMessage()
    n.close()


def test_dead_receiver_does_not_raise(tmp_path: Path, caplog) -> None:
    # The path still exists but nobody is bound to it any more.
    path = tmp_path / "dead.sock"
    sock = _receiver(str(path))
    sock.close()
    n = Notifier.from_env({"NOTIFY_SOCKET": str(path)})
    with caplog.at_level(logging.WARNING, logger="everystep.supervisor"):
        assert n.ready() is False
    assert "ECONNREFUSED" in caplog.text
    n.close()


def test_failure_warned_again_after_recovery(tmp_path: Path, caplog) -> None:
    path = tmp_path / "flaky.sock"
    n = Notifier.from_env({"NOTIFY_SOCKET": str(path)})
    with caplog.at_level(logging.WARNING, logger="everystep.supervisor"):
        assert n.ready() is False
        assert n.ready() is False
        sock = _receiver(str(path))
        assert n.ready() is True
        assert _recv(sock) == "READY=1"
        sock.close()
        path.unlink()
        assert n.ready() is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    n.close()


def test_stuck_receiver_never_blocks(receiver, caplog) -> None:
    # Nobody reads: the receiver's queue fills up and sendto would block if
    # the socket were blocking.  The timeout mark is the real assertion.
    sock, path = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    with caplog.at_level(logging.WARNING, logger="everystep.supervisor"):
        results = [n.status(f"message {i}") for i in range(2000)]
    assert results[0] is True
    assert False in results
    assert "EAGAIN" in caplog.text
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    n.close()


def test_maybe_watchdog_sends_only_when_due(receiver) -> None:
    sock, path = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    assert n.watchdog_interval == 1.0
    t0 = 1000.0
    assert n.watchdog_due(t0)
    assert n.seconds_until_watchdog(t0) == 0.0
    assert n.maybe_watchdog(t0) is True  # first call pings at once
    assert _recv(sock) == "WATCHDOG=1"
    assert n.maybe_watchdog(t0 + 0.5) is False
    assert n.maybe_watchdog(t0 + 0.999) is False
    assert n.seconds_until_watchdog(t0 + 0.25) == pytest.approx(0.75)
    assert _nothing_pending(sock)
    assert n.maybe_watchdog(t0 + 1.0) is True
    assert _recv(sock) == "WATCHDOG=1"
    assert n.maybe_watchdog(t0 + 1.5) is False
    assert n.maybe_watchdog(t0 + 2.2) is True
    assert _recv(sock) == "WATCHDOG=1"
    assert _nothing_pending(sock)
    n.close()


def test_explicit_watchdog_restarts_the_interval(receiver) -> None:
    sock, path = receiver
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    n.watchdog(now=50.0)
    assert _recv(sock) == "WATCHDOG=1"
    assert n.maybe_watchdog(50.5) is False
    assert n.maybe_watchdog(51.0) is True
    assert _recv(sock) == "WATCHDOG=1"
    n.close()


def test_maybe_watchdog_never_sends_for_another_pid(receiver) -> None:
    sock, path = receiver
    n = Notifier.from_env(
        {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}
    )
    assert n.maybe_watchdog(time.monotonic()) is False
    assert _nothing_pending(sock)
    n.close()


def test_unset_removes_variables_from_os_environ(
    receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    n = Notifier.from_env(unset=True)
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert key not in os.environ
    # The notifier read them first and keeps working.
    assert n.watchdog_interval == 1.0
    assert n.ready()
    assert _recv(sock) == "READY=1"
    n.close()


def test_default_keeps_os_environ(receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    sock, path = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    n = Notifier.from_env()
    assert os.environ["NOTIFY_SOCKET"] == path
    assert n.status("from os.environ")
    assert _recv(sock) == "STATUS=from os.environ"
    n.close()


def test_forked_child_does_not_speak_for_the_parent(
    notifier: Notifier, receiver
) -> None:
    sock, _ = receiver
    pid = os.fork()
    if pid == 0:  # child: leave only through os._exit, whatever happens
        code = 2
        try:
            code = 1 if notifier.ready("from the child") else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert _nothing_pending(sock)
    assert notifier.ready()
    assert _recv(sock) == "READY=1"


def test_socket_is_close_on_exec_and_non_blocking(notifier: Notifier) -> None:
    sock = notifier._sock
    assert sock is not None
    assert not sock.get_inheritable()
    assert sock.getblocking() is False


def test_close_makes_it_a_noop(notifier: Notifier, receiver) -> None:
    sock, _ = receiver
    notifier.close()
    assert not notifier.enabled
    assert notifier.ready() is False
    assert _nothing_pending(sock)
    notifier.close()
