"""Workflows of every shape the step graph reads: straight lines, forks
(lambdas, sequences, named, dynamic), loops, if/else, try/except, named
steps, helpers and sub-workflows called in place. Steps are cheap and pure;
``fail_on`` makes one fail so error paths can be exercised."""

from __future__ import annotations

import functools
from typing import Any

import everystep
from everystep import Terminal, parallel, step, workflow


@step
def fetch(key: str) -> str:
    return f"fetched:{key}"


@step
def transform(value: Any) -> str:
    return f"t({value})"


@step
def store_it(value: Any) -> str:
    return f"stored:{value}"


@step
def flaky(spec: dict[str, Any], label: str) -> str:
    if label in spec.get("fail_on", ()):
        raise ValueError(f"{label} failed")
    return label


@step
def cleanup(label: str) -> str:
    return f"cleaned:{label}"


@step(unsafe_to_repeat=True)
def charge(amount: int) -> dict[str, int]:
    return {"charged": amount}


@step
def stop_here(reason: str) -> None:
    raise Terminal(reason)


@workflow
def linear(key: str) -> str:
    raw = fetch(key)
    shaped = transform(raw)
    return store_it(shaped)


@workflow
def fanout(spec: dict[str, Any]) -> list[Any]:
    raw = fetch("root")
    left, right, both = parallel(
        lambda: transform(raw),
        lambda: flaky(spec, "right"),
        [lambda: fetch("a"), lambda: store_it("a")],
    )
    named = parallel(lambda: cleanup("x"), functools.partial(cleanup, "y"), everystep_id="tidy")
    return [store_it([left, right, list(both), list(named)])]


@workflow
def looping(spec: dict[str, Any]) -> str:
    for item in spec["items"]:
        fetch(item)
        transform(item)
    return store_it("done")


@workflow
def branching(spec: dict[str, Any]) -> str:
    if spec.get("fast"):
        value = fetch("fast")
    elif spec.get("medium"):
        value = transform("medium")
    else:
        value = transform(fetch("slow"))
    return store_it(value)


@workflow
def guarded(spec: dict[str, Any]) -> str:
    try:
        first = flaky(spec, "one")
        second = flaky(spec, "two")
    except ValueError as exc:
        return cleanup(str(exc))
    return store_it(first + second)


@workflow
def napping(spec: dict[str, Any]) -> str:
    fetch("before")
    everystep.sleep(spec.get("seconds", 300))
    return store_it("after")


class Handle:
    """Stands for a handle whose method waits (the graph's wait table is
    patched in the test that reads it)."""

    def result(self) -> Any:
        return None


def start_something(key: str) -> Handle:
    return Handle()


@workflow
def awaiting_a_handle(key: str) -> str:
    fetch(key)
    handle = start_something(key)
    value = handle.result()
    again = start_something(key).result()
    return store_it([value, again])


@workflow
def named_steps(key: str) -> str:
    raw = fetch(key, everystep_id="get")
    return store_it(transform(raw), everystep_id="put")


def _prepare(key: str) -> str:
    """A plain helper: its steps are recorded in the caller's scope."""
    return transform(fetch(key))


@workflow
def sub_flow(key: str) -> str:
    return store_it(key)


@workflow
def with_helpers(key: str) -> str:
    prepared = _prepare(key)
    return sub_flow(prepared)


@workflow
def dynamic_fanout(spec: dict[str, Any]) -> list[Any]:
    jobs = [functools.partial(fetch, key) for key in spec["keys"]]
    results = parallel(*jobs)
    return [store_it(list(results))]


@workflow
def payment(amount: int) -> str:
    receipt = charge(amount)
    return store_it(receipt)


@workflow
def stopping(reason: str) -> str:
    fetch("before")
    stop_here(reason)
    return store_it("never")


@workflow
def nested_fork(spec: dict[str, Any]) -> Any:
    def lane(label: str) -> Any:
        first = fetch(label)
        return parallel(lambda: transform(first), lambda: store_it(first))

    return parallel(lambda: lane("a"), lambda: lane("b"))


# Built without a def: there is no body to read.
lambda_flow = workflow(name="tests.apps.shapes.lambda_flow")(lambda key: fetch(key))


@step
def explode(message: str) -> None:
    raise ValueError(message)


@workflow
def exploding(message: str) -> None:
    explode(message)


@workflow
def fan_in_shapes(keys: list[str]) -> Any:
    """Children started and awaited in the ways a fan-in is written: the
    graph reads every ``.result()`` here as a child wait."""
    handles = [everystep.start(linear, key) for key in keys]
    firsts = [handle.result() for handle in handles]
    for index, handle in enumerate(handles):
        firsts.append((index, handle.result()))
    for key, handle in zip(keys, handles):
        firsts.append((key, handle.result()))
    pair = [everystep.start(linear, "a"), everystep.start(linear, "b")]
    again = [handle.result() for handle in sorted(pair, key=str)]
    return store_it([firsts, again])


@workflow
def patched_order(key: str) -> str:
    """A patch asked twice (the same answer, one marker) around a step."""
    fetch(key)
    if everystep.patched("tax"):
        transform(key)
    for _ in range(2):
        everystep.patched("tax")
    return store_it(key)
