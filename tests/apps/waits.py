"""Workflows that wait on the world: messages, events, child runs and
deadlines (tests/test_waits*.py, the chaos workload)."""

from __future__ import annotations

import os
import time
from typing import Any

import everystep
from everystep import ChildFailed, RecvTimeout, step, versions, workflow


@step
def note(value: Any) -> Any:
    """A step after a wait: what the body got, recorded."""
    return value


@step
def double(x: int) -> int:
    return x * 2


@step
def explode(message: str) -> None:
    raise ValueError(message)


@step
def spin(seconds: float) -> str:
    """Busy in its step (no step boundary) for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.02)
    return "spun"


@step
def append_line(path: str, text: str) -> None:
    """An effect outside the database, to count how often it happened."""
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(text + "\n")


@workflow
def approval(order: str) -> Any:
    decision = everystep.recv("approved")
    return note({"order": order, "decision": decision})


@workflow
def approval_with_timeout(seconds: float) -> Any:
    try:
        return note(everystep.recv("approved", timeout=seconds))
    except RecvTimeout:
        return note("timed out")


@workflow
def two_in_order() -> Any:
    first = everystep.recv("t")
    second = everystep.recv("t")
    return note([first, second])


@workflow
def recv_then_effect(path: str) -> Any:
    """The message, then an effect written to ``path`` once per execution of its step."""
    message = everystep.recv("go")
    append_line(path, f"got {message}")
    return note(message)


@workflow
def checkout(order: str) -> Any:
    everystep.set_event("payment_url", f"https://pay.example/{order}")
    paid = everystep.recv("paid")
    everystep.set_event("state", "paid")
    return note(paid)


@workflow
def child_double(x: int) -> int:
    return double(x)


@workflow
def child_fails(message: str) -> None:
    explode(message)


@workflow
def child_waits() -> Any:
    return note(everystep.recv("release"))


@workflow
def child_spins(seconds: float) -> Any:
    return spin(seconds)


@workflow
def parent_of_three() -> Any:
    handles = [everystep.start(child_double, 1), everystep.start(child_fails, "boom"),
               everystep.start(child_double, 3)]
    results: list[Any] = []
    for handle in handles:
        try:
            results.append(handle.result())
        except ChildFailed as exc:
            results.append({"failed": exc.child_id, "status": exc.status, "cause": str(exc.cause)})
    return note(results)


@workflow
def parent_calls() -> Any:
    return note(everystep.call(child_double, 21))


@workflow
def child_patched_last(x: int) -> int:
    """A child whose last step carries a patch marker: its end, the marker
    and the last record are one write."""
    if everystep.patched("double-it"):
        return double(x)
    return x


@workflow
def parent_calls_patched() -> Any:
    return note(everystep.call(child_patched_last, 21))


@workflow
def parent_of_waiters(children: int) -> Any:
    handles = [everystep.start(child_waits) for _ in range(children)]
    return note([handle.result() for handle in handles])


@workflow
def parent_of_parents(children: int, grandchildren: int) -> Any:
    """Children that each wait for children of their own."""
    handles = [everystep.start(parent_of_waiters, grandchildren) for _ in range(children)]
    return note([handle.result() for handle in handles])


@workflow
def parent_of_spinner(seconds: float) -> Any:
    return note(everystep.call(child_spins, seconds))


@workflow
def parent_of_spinners(children: int, seconds: float) -> Any:
    """``children`` children each busy in one long step, awaited in turn."""
    handles = [everystep.start(child_spins, seconds) for _ in range(children)]
    return note([handle.result() for handle in handles])


@step
def release() -> str | None:
    """The ``--app-version`` of the process that runs this step."""
    return versions.app_version()


@workflow
def child_release() -> Any:
    return release()


@workflow
def parent_of_releases(children: int) -> Any:
    """Children that each say which release ran them."""
    handles = [everystep.start(child_release) for _ in range(children)]
    return note([handle.result() for handle in handles])


@workflow(timeout=3600)
def spins(seconds: float) -> Any:
    return spin(seconds)


@workflow(timeout=2)
def spins_past_its_timeout(seconds: float) -> Any:
    """Declares a 2 s timeout whoever schedules it."""
    return spin(seconds)


@workflow
def pid_recv() -> Any:
    """The message, and the pid of the process that got it."""
    message = everystep.recv("go")
    return note([message, os.getpid()])


@workflow
def recv_then_kill(spec: dict[str, Any]) -> Any:
    """``recv_then_effect`` whose process is SIGKILLed once at step
    ``spec["kill_at"]`` by the fault hook below (``kill_once``)."""
    message = everystep.recv("go")
    append_line(os.path.join(spec["dir"], "effects.txt"), f"got {message}")
    return note(message)


def kill_once(ctx: Any, step_id: str) -> None:
    """The fault hook of supervised crash tests: SIGKILL this process at
    the fault point of step ``kill_at`` of a ``recv_then_kill`` run, once
    per run (a marker file remembers it)."""
    import signal
    from pathlib import Path

    run = ctx.execution.run
    if run.name != recv_then_kill.name or step_id != run.args[0]["kill_at"]:
        return
    marker = Path(run.args[0]["dir"]) / f"killed-{run.id}"
    if marker.exists():
        return
    marker.write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)


def hold_forks_while_cancelling() -> None:
    """Before each fork of the supervisor parent (``EVERYSTEP_TEST_FORK_GATE=DIR``):
    a fork begun while ``DIR/cancelling`` exists waits for ``DIR/cancelled``.
    The parent closes its LISTEN connection around every fork, so the
    cancels committed meanwhile (the rest of a cascade, once the first
    child killed is respawned) notify nobody, as under a big app whose
    fork takes long."""
    from pathlib import Path

    from tests.support.waiting import wait_for_file

    gate = Path(os.environ["EVERYSTEP_TEST_FORK_GATE"])
    if (gate / "cancelling").exists():
        wait_for_file(gate / "cancelled", timeout=120)


if os.environ.get("EVERYSTEP_TEST_FORK_GATE"):
    os.register_at_fork(before=hold_forks_while_cancelling)

if os.environ.get("EVERYSTEP_TEST_KILL_ONCE"):
    from everystep import runner as _runner

    _runner.fault = kill_once
