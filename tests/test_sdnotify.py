"""supervisor.sdnotify against real AF_UNIX datagram sockets.

Each test binds the receiving end itself, as systemd would, and hands its
address to the Notifier through ``environ``: nothing here needs systemd.
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


def bind(address: str | bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(5)  # a missing datagram fails the test instead of hanging it
    return sock


def recv(sock: socket.socket) -> str:
    return sock.recv(65536).decode("utf-8")


def nothing_pending(sock: socket.socket) -> bool:
    return not select.select([sock], [], [], 0)[0]


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and r.name == "everystep.supervisor"]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "notify.sock")


@pytest.fixture
def receiver(path: str) -> Iterator[socket.socket]:
    sock = bind(path)
    yield sock
    sock.close()


def test_messages_the_arbiter_sends(receiver: socket.socket, path: str) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert n.ready("8 children idle")
    assert recv(receiver) == "READY=1\nSTATUS=8 children idle"
    assert n.status("draining: 3 runs left")
    assert recv(receiver) == "STATUS=draining: 3 runs left"
    # A newline in a status must not smuggle in another assignment.
    n.status("line one\nREADY=1")
    assert recv(receiver) == "STATUS=line one READY=1"
    assert n.stopping()
    assert recv(receiver) == "STOPPING=1"

    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert n.reloading()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    reloading, stamp = recv(receiver).split("\n")
    assert reloading == "RELOADING=1"
    key, _, value = stamp.partition("=")
    assert key == "MONOTONIC_USEC" and before <= int(value) <= after


def test_abstract_namespace() -> None:
    name = f"everystep-test-{uuid.uuid4().hex}"
    sock = bind(b"\0" + name.encode())
    try:
        n = Notifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert n.ready("up")
        assert recv(sock) == "READY=1\nSTATUS=up"
    finally:
        sock.close()


@pytest.mark.parametrize("value", [None, "", "relative/path.sock", "vsock:2:1234"])
def test_without_a_usable_socket_everything_is_a_noop(value: str | None) -> None:
    env = {"WATCHDOG_USEC": "2000000"}
    if value is not None:
        env["NOTIFY_SOCKET"] = value
    for n in (Notifier.from_env(env), Notifier(None)):
        assert n.fileno() == -1
        assert not (n.ready("x") or n.status("x") or n.stopping() or n.reloading())
        assert n.seconds_until_watchdog(time.monotonic()) is None
        assert n.maybe_watchdog(time.monotonic()) is False


def test_watchdog_pings_at_half_of_watchdog_usec(receiver: socket.socket, path: str) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    t0 = 1000.0
    assert n.seconds_until_watchdog(t0) == 0.0
    assert n.maybe_watchdog(t0)  # the first call pings at once
    assert recv(receiver) == "WATCHDOG=1"
    assert n.seconds_until_watchdog(t0 + 0.25) == pytest.approx(0.75)
    assert not n.maybe_watchdog(t0 + 0.999)
    assert nothing_pending(receiver)
    assert n.maybe_watchdog(t0 + 1.0)
    assert recv(receiver) == "WATCHDOG=1"
    assert not n.maybe_watchdog(t0 + 1.5)
    assert n.maybe_watchdog(t0 + 2.2)
    assert recv(receiver) == "WATCHDOG=1"
    assert n.seconds_until_watchdog(t0 + 2.5) == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("env", "ours"),
    [
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "<mine>"}, True),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "<other>"}, False),
        ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "not-a-pid"}, False),
        ({"WATCHDOG_USEC": "0"}, False),
        ({"WATCHDOG_USEC": "soon"}, False),
        ({}, False),
    ],
)
def test_watchdog_only_when_configured_for_this_process(
    receiver: socket.socket, path: str, env: dict[str, str], ours: bool
) -> None:
    pids = {"<mine>": str(os.getpid()), "<other>": str(os.getpid() + 1)}
    env = {key: pids.get(value, value) for key, value in env.items()}
    n = Notifier.from_env({"NOTIFY_SOCKET": path, **env})
    assert (n.seconds_until_watchdog(time.monotonic()) is not None) is ours
    assert n.maybe_watchdog(time.monotonic()) is ours
    if ours:
        assert recv(receiver) == "WATCHDOG=1"
    assert nothing_pending(receiver)
    assert n.ready("still speaks")  # the watchdog setting never silences the rest


def test_send_failures_never_raise_and_warn_once_per_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "flaky.sock"
    n = Notifier.from_env({"NOTIFY_SOCKET": str(path)})
    with caplog.at_level(logging.DEBUG, logger="everystep.supervisor"):
        assert not n.ready("nobody bound yet")
        assert not n.status("still nobody")
        assert len(warnings(caplog)) == 1 and "ENOENT" in warnings(caplog)[0]

        sock = bind(str(path))
        assert n.status("back")
        assert recv(sock) == "STATUS=back"
        sock.close()  # the path stays, but nobody is bound to it any more
        assert not n.stopping()
        assert not n.stopping()
    assert len(warnings(caplog)) == 2 and "ECONNREFUSED" in warnings(caplog)[1]


def test_a_receiver_that_never_reads_never_blocks(
    receiver: socket.socket, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Its queue fills up: a blocking sendto would hang here until the timeout mark.
    n = Notifier.from_env({"NOTIFY_SOCKET": path})
    assert not os.get_inheritable(n.fileno())
    with caplog.at_level(logging.WARNING, logger="everystep.supervisor"):
        results = [n.status(f"message {i}") for i in range(2000)]
    assert results[0] and not all(results)
    assert len(warnings(caplog)) == 1 and "EAGAIN" in warnings(caplog)[0]


def test_unset_hides_the_variables_but_keeps_the_notifier_working(
    receiver: socket.socket, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "2000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    kept = Notifier.from_env()
    assert os.environ["NOTIFY_SOCKET"] == path
    n = Notifier.from_env(unset=True)
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert key not in os.environ
    assert n.maybe_watchdog(time.monotonic())
    assert recv(receiver) == "WATCHDOG=1"
    assert kept.ready("up")
    assert recv(receiver) == "READY=1\nSTATUS=up"


def test_a_forked_child_does_not_speak_for_the_parent(receiver: socket.socket, path: str) -> None:
    n = Notifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
    pid = os.fork()
    if pid == 0:  # child: leave only through os._exit, whatever happens
        code = 2
        try:
            code = 1 if (n.ready("from the child") or n.maybe_watchdog(time.monotonic())) else 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert nothing_pending(receiver)
    assert n.ready("parent")
    assert recv(receiver) == "READY=1\nSTATUS=parent"
