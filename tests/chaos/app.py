"""Workflows for the chaos suite. Every effect is logged to its own table
(``chaos_effect``) through a connection of the executing process, committed
before the step returns, so the harness can count how often each effect
really happened, whatever was recorded."""

from __future__ import annotations

import os
import threading
import time
import zlib

import psycopg

import everystep
from everystep import Terminal, parallel, step, workflow

EFFECTS_ENV = "CHAOS_EFFECTS_URL"

_local = threading.local()


def _effects() -> psycopg.Connection:
    conn = getattr(_local, "conn", None)
    if conn is None or getattr(_local, "pid", None) != os.getpid() or conn.closed or conn.broken:
        conn = psycopg.connect(os.environ[EFFECTS_ENV], autocommit=True, connect_timeout=5)
        _local.conn, _local.pid = conn, os.getpid()
    return conn


def _log_effect(key: str, effect: str, kind: str) -> None:
    for attempt in range(100):  # the database may be restarting
        try:
            _effects().execute(
                "INSERT INTO chaos_effect (run_key, effect, kind, pid) VALUES (%s, %s, %s, %s)",
                (key, effect, kind, os.getpid()),
            )
            return
        except psycopg.OperationalError:
            _local.conn = None
            time.sleep(0.1)
    raise RuntimeError("effects database unreachable")


def _pause(key: str, effect: str, max_ms: int) -> None:
    """A deterministic pause per (run, step), so kills land mid-step."""
    time.sleep((zlib.crc32(f"{key}/{effect}".encode()) % max(max_ms, 1)) / 1000)


@step
def safe_effect(key: str, effect: str, max_ms: int) -> str:
    _pause(key, effect, max_ms)
    _log_effect(key, effect, "safe")
    _pause(key, effect + "-after", max_ms // 3)  # widens the at-least-once window
    return f"{key}:{effect}"


@step(unsafe_to_repeat=True)
def unsafe_effect(key: str, effect: str, max_ms: int) -> str:
    _pause(key, effect, max_ms)
    _log_effect(key, effect, "unsafe")
    _pause(key, effect + "-after", max_ms)
    return f"{key}:{effect}"


@step
def halt(key: str) -> None:
    raise Terminal("chaos-stop", {"key": key})


@step
def ping(child_id: str, key: str) -> None:
    """Send the child its message: a step is at-least-once, the idempotency
    key makes the message exactly one."""
    everystep.send(child_id, "ping", f"{key}:ping", idempotency_key=f"{key}:ping")


@workflow
def chaos_child(args: dict) -> str:
    key, ms = args["key"], args["ms"]
    safe_effect(key, "child", ms)
    ping = everystep.recv("ping")
    everystep.recv("extra")
    return f"{ping}:pong"


@workflow
def chaos_note(key: str) -> str:
    """A detached run a talking run's body schedules: one per talking run."""
    return key


@workflow
def chaos_flow(args: dict) -> dict:
    key, ms = args["key"], args["ms"]
    first = safe_effect(key, "a", ms)
    talk = None
    if args.get("talk"):
        # A run that talks: waits for the harness's message, starts a child,
        # sends it a message and waits for its answer.
        go = everystep.recv("go")
        child = everystep.start(chaos_child, {"key": key, "ms": ms})
        ping(child.run_id, key)
        # From the body itself, with no idempotency key: recorded, so a
        # replay sends and schedules nothing again.
        everystep.send(child.run_id, "extra", f"{key}:extra")
        everystep.schedule(chaos_note, key)
        talk = [go, child.result()]
    forked = parallel(
        lambda: safe_effect(key, "b", ms),
        [lambda: safe_effect(key, "c", ms), lambda: safe_effect(key, "d", ms)],
        everystep_id="fork",
    )
    charged = unsafe_effect(key, "u", ms, everystep_id="charge") if args["unsafe"] else None
    if args["stop"]:
        halt(key)
    last = safe_effect(key, "e", ms)
    result = {"key": key, "values": [first, forked[0], *forked[1], last], "charged": charged}
    if talk is not None:
        result["talk"] = talk
    return result


@step
def fold(total: int, payload: int) -> int:
    return total + payload


@workflow
def chaos_loop(key: str, total: int, handled: int, every: int) -> dict:
    """A run that lives for ever: adds up the numbers sent to it on "n",
    continuing as new after every ``every`` of them (its history bounded),
    until a negative number ends it."""
    while True:
        payload = everystep.recv("n")
        if payload < 0:
            return {"key": key, "total": total, "handled": handled}
        total = fold(total, payload)
        handled += 1
        if handled % every == 0:
            everystep.continue_as_new(key, total, handled, every)


def expected_result(args: dict) -> dict:
    key = args["key"]
    result = {
        "key": key,
        "values": [f"{key}:{effect}" for effect in "abcde"],
        "charged": f"{key}:u" if args["unsafe"] else None,
    }
    if args.get("talk"):
        result["talk"] = [f"{key}:go", f"{key}:ping:pong"]
    return result


def safe_effects(args: dict) -> list[str]:
    return ["a", "b", "c", "d"] + (["child"] if args.get("talk") else []) + ([] if args["stop"] else ["e"])
