"""Workflows whose bodies call the client functions (send, schedule, reads,
waits on other runs), for tests/test_body_calls.py."""

from __future__ import annotations

from typing import Any

import everystep
from everystep import step, workflow
from everystep.context import current


@step
def twice(x: int) -> int:
    return x * 2


@workflow
def leaf(n: int) -> int:
    return n


@workflow
def inbox() -> Any:
    """A run that takes messages for as long as it lives."""
    return everystep.recv("never")


@workflow
def publisher(value: Any) -> str:
    everystep.set_event("status", value)
    return "published"


@workflow
def sends_then_sleeps(target: str) -> str:
    everystep.send(target, "t", {"n": 1})
    everystep.sleep(1)
    return "sent"


@workflow
def schedules_then_sleeps() -> str:
    run = everystep.schedule(leaf, 7)
    everystep.sleep(1)
    return run.id


@workflow
def reads_twice(target: str) -> list[Any]:
    first = everystep.get_event(target, "status")
    everystep.sleep(1)
    return [first, everystep.get_event(target, "status")]


@workflow
def reads_run_and_steps(target: str) -> list[Any]:
    run = everystep.get_run(target)
    steps = everystep.get_steps(target)
    everystep.sleep(1)
    return [run.status, [(s.step_id, s.name, s.status) for s in steps]]


@workflow
def waits_for_event(target: str, timeout: float) -> Any:
    try:
        return everystep.get_event(target, "status", timeout=timeout)
    except TimeoutError as exc:
        return f"no event: {type(exc).__name__}"


@workflow
def waits_for_run(target: str, timeout: float | None) -> Any:
    try:
        run = everystep.wait(target, timeout=timeout)
    except TimeoutError:
        return "timed out"
    return [run.status, run.result]


@workflow
def handles_a_stranger(other: str) -> Any:
    return everystep.ChildHandle(other).result()


@workflow
def asks_for_step_connection() -> Any:
    return everystep.step_connection()


@workflow
def sets_a_provider() -> Any:
    return everystep.set_connection_provider(None)


@workflow
def sends_with_a_connection(target: str) -> Any:
    return everystep.send(target, "t", 1, conn=object())


@workflow
async def async_calls(target: str, publisher: str) -> list[Any]:
    sent = await everystep.send_async(target, "t", "async")
    run = await everystep.schedule_async(leaf, 3)
    seen = await everystep.get_run_async(target)
    steps = await everystep.get_steps_async(target)
    event = await everystep.get_event_async(publisher, "status")
    await everystep.sleep_async(1)
    return [isinstance(sent, int), run.name, seen.status, len(steps), event]


@workflow
def patched_then_calls(target: str, call: str) -> list[Any]:
    """A patch point, then one engine call, then a step: the call's write
    must carry the patch's marker."""
    took = everystep.patched("new-path")
    if call == "send":
        everystep.send(target, "t", "patched")
    elif call == "schedule":
        everystep.schedule(leaf, 1)
    elif call == "set_event":
        everystep.set_event("k", 1)
    elif call == "start":
        everystep.start(leaf, 2)
    elif call == "get_run":
        everystep.get_run(target)
    elif call == "recv":
        everystep.recv("t")
    return [took, twice(1)]


@workflow
def script(ops: list[str], target: str) -> list[Any]:
    """A body made of the calls ``ops`` names, in order: what each returns
    that does not depend on ids the database chose."""
    out: list[Any] = []
    me = current()
    assert me is not None
    for index, op in enumerate(ops):
        if op == "step":
            out.append(twice(index))
        elif op == "send":
            everystep.send(target, "t", index)
            out.append("sent")
        elif op == "schedule":
            out.append(everystep.schedule(leaf, index).name)
        elif op == "set_event":
            everystep.set_event("k", index)
            out.append("set")
        elif op == "get_event":
            try:
                out.append(everystep.get_event(me.workflow_id, "k"))
            except TimeoutError:
                out.append(None)
        elif op == "get_run":
            out.append(everystep.get_run(target).status)
        elif op == "get_steps":
            out.append(len(everystep.get_steps(me.workflow_id)))
        elif op == "parallel":
            out.append(list(everystep.parallel(lambda: everystep.send(target, "p", index) > 0,
                                               lambda: everystep.schedule(leaf, -index).name)))
        else:
            raise ValueError(op)
    return out
