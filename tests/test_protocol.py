"""The supervisor's one codec: every message round-trips, hostile lines are
refused in one line, lines are bounded, and the parent's end of a child
channel never blocks (real socketpairs)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.protocol import (
    COMMANDS,
    Bye,
    Channel,
    ChildStatus,
    Dispatch,
    Done,
    DrainReply,
    ErrorReply,
    Exit,
    Finishing,
    KillReply,
    KillRequest,
    LineReader,
    Message,
    ProtocolError,
    Ready,
    ReloadReply,
    ScaleReply,
    ScaleRequest,
    StatusReply,
    StatusRequest,
    StepEnded,
    StepInFlight,
    StepStarted,
    decode,
    decode_reply,
    encode,
    parse,
)

STEP = StepInFlight(run="r-1", step="2.0.1", name="app.step", started=1234.5, timeout=30.0, unsafe=True)
MESSAGES: list[Message] = [
    Dispatch(run={"id": "r-1", "name": "app.flow", "args": [1, {"a": None}], "claim_epoch": 4}, trace=None),
    Dispatch(run={"id": "r-1"}, trace={"traceparent": "00-abc-def-01"}),
    Exit("reload"),
    Ready(1234, owned=5 << 20),
    StepStarted(STEP),
    StepStarted(StepInFlight(run="r", step="1", name="n", started=0.0)),
    StepEnded(run="r-1", step="2", status="done"),
    Finishing("r-1"),
    Done(run="r-1", outcome="completed", owned=1 << 30),
    Bye("max-runs"),
    StatusRequest(),
    KillRequest(run="r-1", requeue=True),
    ScaleRequest(procs=4),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(message: Message) -> None:
    line = encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line[:-1], message.KEY) == message


def test_replies_round_trip_for_ctl() -> None:
    child = ChildStatus(slot=1, pid=2, state="busy", run_id="r", workflow="w", step_id="3", step_name="s",
                        step_seconds=1.5, steps_in_flight=1, run_seconds=2.0, rss=10, cpu_percent=None, runs_done=7)
    replies: list[tuple[str, Any]] = [
        ("status", StatusReply(pid=1, name="n", procs=2, draining=False, uptime=3.0, database="db", ready=0,
                               runs={"completed": 3}, restarts={}, children=[child])),
        ("kill", KillReply(run="r", pid=2, slot=1, action="requeued")),
        ("scale", ScaleReply(procs=3, previous=2)),
        ("reload", ReloadReply(modules=["app"], replacing=2)),
        ("drain", DrainReply(busy=1)),
        ("kill", ErrorReply("run r is not executing in this supervisor")),
    ]
    for command, reply in replies:
        wire = parse(encode(reply)[:-1])
        assert wire["ok"] is reply.ok
        assert decode_reply(command, wire) == reply


HOSTILE = [
    (b"", "malformed"),
    (b"not json", "malformed"),
    (b"[1, 2]", "malformed"),
    (b"[" * 50_000, "malformed"),
    (b'{"cmd": 5}', "malformed"),
    (b'{"nocmd": "status"}', "malformed"),
    (b'{"cmd": "explode"}', "unknown command 'explode'; expected one of: " + ", ".join(COMMANDS)),
    (b'{"cmd": "kill"}', 'kill needs "run"'),
    (b'{"cmd": "kill", "run": 7}', '"run" of kill must be a string'),
    (b'{"cmd": "kill", "run": "r", "requeue": "yes"}', '"requeue" of kill must be true or false'),
    (b'{"cmd": "scale", "procs": true}', '"procs" of scale must be an integer'),
    (b'{"cmd": "scale", "procs": 2.5}', '"procs" of scale must be an integer'),
    (b'{"cmd": "scale", "procs": NaN}', '"procs" of scale must be an integer'),
    (b'{"cmd": "scale", "procs": ' + b"9" * 5000 + b"}", "malformed"),
]


@pytest.mark.parametrize("line, message", HOSTILE, ids=[str(i) for i in range(len(HOSTILE))])
def test_hostile_control_lines_are_refused_in_one_line(line: bytes, message: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        decode(line, "cmd")
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_extra_fields_are_ignored() -> None:
    assert decode(b'{"cmd": "status", "pad": "xxxx"}', "cmd") == StatusRequest()


@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)))
def test_no_json_object_escapes_the_decoder_as_anything_but_protocol_error(payload: dict[str, Any]) -> None:
    import json

    for key in ("cmd", "ev", "op"):
        try:
            decode(json.dumps(payload).encode(), key)
        except ProtocolError:
            pass


def test_line_reader_bounds_lines_and_partial_lines() -> None:
    reader = LineReader(10)
    assert reader.feed(b"abc\nde") == [b"abc"]
    assert reader.feed(b"f\n\n") == [b"def", b""]
    with pytest.raises(ProtocolError, match="larger than 10 bytes"):
        reader.feed(b"x" * 11 + b"\n")
    with pytest.raises(ProtocolError, match="larger than 10 bytes"):
        LineReader(10).feed(b"y" * 11)  # no newline yet, already too long


def test_the_parents_end_queues_what_a_child_does_not_read() -> None:
    parent_sock, child_sock = socket.socketpair()
    parent_sock.setblocking(False)
    parent = Channel(parent_sock, incoming="ev")
    child = Channel(child_sock, incoming="op")
    try:
        big = Dispatch(run={"id": "r", "args": ["x" * (4 << 20)]})  # far more than a socket buffer
        parent.send(big)  # returns at once: nothing blocks the parent
        assert parent.pending and parent.stalled_since is not None
        parent.send(Exit("drain"))  # queued behind it, in order
        received: list[Message] = []
        while len(received) < 2:
            parent.flush()
            message = child.receive(timeout=5)
            if message is not None:
                received.append(message)
        assert received == [big, Exit("drain")]
        parent.flush()
        assert not parent.pending and parent.stalled_since is None
        child.send_blocking(Done(run="r", outcome="completed"))
        messages, closed = parent.read_available()
        assert messages == [Done(run="r", outcome="completed")] and not closed
        child.close()
        assert parent.read_available() == ([], True)
    finally:
        parent.close()
        child.close()
