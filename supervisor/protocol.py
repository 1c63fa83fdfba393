"""Every message the supervisor exchanges, and the one codec for all of them.

Three channels carry JSON objects, one per line: parent → child and child →
parent on a socketpair per child, and ``ctl`` client ↔ parent on the control
socket. Each message is a dataclass; ``encode`` writes it with its tag
(``op`` for the parent's orders, ``ev`` for a child's events, ``cmd`` for a
control request; replies carry ``ok``), ``decode`` reads one back and
refuses anything malformed with ``ProtocolError``, and ``LineReader`` cuts a
byte stream into bounded lines.

The life of one run::

    parent (arbiter)                                   child
    ─────────────────                                  ─────
    claim run R at epoch E
    Dispatch(R, trace) ──────────────────────────────▶ execute R from the top
                       ◀──────────────────────────────  StepStarted   timed and bounded steps only;
                       ◀──────────────────────────────  StepEnded     every step in flight is on the
                                                                      step board
                       ◀──────────────────────────────  Finishing(R)  the body returned; terminal write
    the child counts as idle: the next                                 under way
    Dispatch may be sent (it waits in the channel)
                       ◀──────────────────────────────  Bye(reason)   only if it leaves after R
                       ◀──────────────────────────────  Done(R, outcome, owned)
    Exit(reason) ────────────────────────────────────▶ Bye(reason); os._exit(0)

A child announces itself with ``Ready`` after the fork. The parent reads
without blocking and never waits to write: what does not fit in the socket
stays queued (``Channel.pending``), and a child that stops reading is
killed as unresponsive. EOF on the parent's end is how it learns of a
death, in the same ``select`` as everything else.

Control socket: a ``Request`` per line (``{"cmd": "kill", "run": "…",
"requeue": false}``), a ``Reply`` per line (``{"ok": true, …}`` or
``{"ok": false, "error": "one line"}``). ``CONTROL`` pairs each request with
its reply; ``verbs`` says what each one does.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from .states import Command, StepInFlight

MAX_CHANNEL_LINE = 64 * 1024 * 1024
"""A run's arguments may be up to 16 MiB of JSON, escaped once more here."""
MAX_CONTROL_LINE = 64 * 1024


class ProtocolError(ValueError):
    """A line that is not a valid message; the text says why, in one line."""


# -- the line codec ------------------------------------------------------------------


def frame(payload: dict[str, Any]) -> bytes:
    return (_ENCODER.encode(payload) + "\n").encode()


#: One encoder for every frame (``json.dumps`` with options builds one per call).
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=str)


class LineReader:
    """Cut a byte stream into lines of at most ``max_line`` bytes."""

    def __init__(self, max_line: int) -> None:
        self.max_line = max_line
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """Complete lines now available (without their newline). Raises
        ``ProtocolError`` for a line longer than the limit, or a partial
        line that already is; the stream cannot be trusted after that."""
        self._buffer += data
        lines = []
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            if len(line) > self.max_line:
                raise ProtocolError(f"request larger than {self.max_line} bytes")
            lines.append(line)
        if len(self._buffer) > self.max_line:
            self._buffer.clear()
            raise ProtocolError(f"request larger than {self.max_line} bytes")
        return lines


def plain(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, nested dataclasses (alone or in a
    list) as dicts too; every other value as it is. Not
    ``dataclasses.asdict``, which deep-copies every value: the dict is
    serialized at once, and a ``Dispatch`` carries a run's arguments, so
    the copy cost every run (and every step's board update) for nothing."""
    return {name: _plain_value(getattr(obj, name)) for name in _field_names(type(obj))}


def _plain_value(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list:
        return [_plain_value(item) for item in value]
    if hasattr(kind, "__dataclass_fields__"):  # an instance: ``kind`` is never a dataclass's metaclass
        return plain(value)
    return value


#: Types a message's fields hold most: taken as they are at the cost of one lookup.
_SCALARS = frozenset({type(None), str, int, float, bool})


_FIELD_NAMES: dict[type[Any], tuple[str, ...]] = {}


def _field_names(cls: type[Any]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(spec.name for spec in dataclasses.fields(cls))
    return names


# -- messages ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """Base of every message: ``KEY`` names the tag field, ``TAG`` its value."""

    KEY: ClassVar[str] = ""
    TAG: ClassVar[str] = ""

    def wire(self) -> dict[str, Any]:
        return {self.KEY: self.TAG, **plain(self)}


# Parent → child.

@dataclass(frozen=True)
class Dispatch(Message):
    """Execute this run (``run``: ``everystep.models.Run`` fields as JSON)."""

    KEY: ClassVar[str] = "op"
    TAG: ClassVar[str] = "run"
    run: dict[str, Any]
    trace: dict[str, str] | None = None


@dataclass(frozen=True)
class Exit(Message):
    KEY: ClassVar[str] = "op"
    TAG: ClassVar[str] = "exit"
    reason: str


# Child → parent.

@dataclass(frozen=True)
class Ready(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "ready"
    pid: int
    #: The child joined the cgroup the parent made for it.
    cgroup: bool = False
    #: What it owns once booted (USS, else RSS, bytes): its baseline.
    owned: int = 0


@dataclass(frozen=True)
class StepStarted(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "step"
    step: StepInFlight


@dataclass(frozen=True)
class StepEnded(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "step_end"
    run: str
    step: str
    status: str


@dataclass(frozen=True)
class Finishing(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "finishing"
    run: str


@dataclass(frozen=True)
class Done(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "done"
    run: str
    outcome: str
    #: With a memory limit, what it owns after the run (bytes): its USS, or
    #: its RSS where that alone shows it under the limit; else 0.
    owned: int = 0


@dataclass(frozen=True)
class Bye(Message):
    KEY: ClassVar[str] = "ev"
    TAG: ClassVar[str] = "bye"
    reason: str


# Control requests (from ctl clients: untrusted).

@dataclass(frozen=True)
class Request(Message):
    KEY: ClassVar[str] = "cmd"


@dataclass(frozen=True)
class StatusRequest(Request):
    TAG: ClassVar[str] = Command.STATUS


@dataclass(frozen=True)
class KillRequest(Request):
    TAG: ClassVar[str] = Command.KILL
    run: str
    requeue: bool = False


@dataclass(frozen=True)
class ScaleRequest(Request):
    TAG: ClassVar[str] = Command.SCALE
    procs: int


@dataclass(frozen=True)
class ReloadRequest(Request):
    TAG: ClassVar[str] = Command.RELOAD


@dataclass(frozen=True)
class DrainRequest(Request):
    TAG: ClassVar[str] = Command.DRAIN


# Control replies.

@dataclass(frozen=True)
class Reply:
    ok: ClassVar[bool] = True

    def wire(self) -> dict[str, Any]:
        return {"ok": self.ok, **plain(self)}


@dataclass(frozen=True)
class ErrorReply(Reply):
    ok: ClassVar[bool] = False
    error: str


@dataclass(frozen=True)
class ChildStatus:
    slot: int
    pid: int
    state: str
    run_id: str | None
    workflow: str | None
    step_id: str | None
    step_name: str | None
    step_seconds: float | None
    steps_in_flight: int
    run_seconds: float | None
    rss: int
    cpu_percent: float | None
    runs_done: int
    #: What it owns (``supervisor.memory``); None where smaps is unreadable.
    uss: int | None = None
    pss: int | None = None


@dataclass(frozen=True)
class StatusReply(Reply):
    pid: int
    name: str
    procs: int
    draining: bool
    uptime: float
    database: str
    ready: int
    runs: dict[str, int]
    restarts: dict[str, int]
    children: list[ChildStatus] = field(default_factory=list)
    #: Why the supervisor is unhealthy, while its engine statements keep failing.
    engine_errors: str | None = None


@dataclass(frozen=True)
class KillReply(Reply):
    run: str
    pid: int
    slot: int
    action: str


@dataclass(frozen=True)
class ScaleReply(Reply):
    procs: int
    previous: int


@dataclass(frozen=True)
class ReloadReply(Reply):
    """The app modules were re-imported; ``replacing`` children are being
    replaced (idle ones at once, busy ones at their next step boundary)."""

    modules: list[str]
    replacing: int


@dataclass(frozen=True)
class DrainReply(Reply):
    draining: bool = True
    busy: int = 0


#: Every control request with the reply it gets: the one pairing, one per
#: ``Command`` (``tests/test_verbs.py`` holds them to it). What a verb means
#: to an operator (its ``ctl`` arguments, its handler) is in ``verbs``.
CONTROL: tuple[tuple[type[Request], type[Reply]], ...] = (
    (StatusRequest, StatusReply),
    (KillRequest, KillReply),
    (ScaleRequest, ScaleReply),
    (ReloadRequest, ReloadReply),
    (DrainRequest, DrainReply),
)
#: Every request by its command.
REQUESTS: dict[str, type[Request]] = {request.TAG: request for request, _reply in CONTROL}
#: Every reply by the command it answers.
REPLIES: dict[str, type[Reply]] = {request.TAG: reply for request, reply in CONTROL}
COMMANDS: tuple[str, ...] = tuple(Command)

M = TypeVar("M")

_MESSAGES: tuple[type[Message], ...] = (Dispatch, Exit, Ready, StepStarted, StepEnded, Finishing, Done, Bye,
                                        *REQUESTS.values())
_BY_TAG: dict[tuple[str, str], type[Message]] = {(cls.KEY, cls.TAG): cls for cls in _MESSAGES}


def encode(message: Message | Reply) -> bytes:
    return frame(message.wire())


def parse(line: bytes) -> dict[str, Any]:
    """One line as a JSON object, or ``ProtocolError``."""
    try:
        payload = json.loads(line)
    except (ValueError, RecursionError):
        # RecursionError: a line of 50,000 "[" parses into nothing but
        # trouble; it must never escape the loop.
        raise ProtocolError("malformed request: expected one JSON object per line") from None
    if not isinstance(payload, dict):
        raise ProtocolError("malformed request: expected one JSON object per line")
    return payload


def decode(line: bytes, key: str) -> Message:
    """A message of the family tagged by ``key`` (``op``, ``ev`` or ``cmd``)."""
    payload = parse(line)
    tag = payload.pop(key, None)
    if not isinstance(tag, str):
        raise ProtocolError(f'malformed request: expected {{"{key}": ...}}')
    cls = _BY_TAG.get((key, tag))
    if cls is None:
        if key == Request.KEY:
            raise ProtocolError(f"unknown command {tag[:40]!r}; expected one of: {', '.join(COMMANDS)}")
        raise ProtocolError(f"unknown {key} {tag[:40]!r}")
    return build(cls, payload)


def decode_reply(command: str, payload: dict[str, Any]) -> Reply:
    """The reply to ``command`` as its dataclass (for ctl clients)."""
    if not payload.get("ok"):
        return ErrorReply(error=str(payload.get("error") or "request failed"))
    payload = {name: value for name, value in payload.items() if name != "ok"}
    return build(REPLIES[command], payload)


def build(cls: type[M], payload: dict[str, Any]) -> M:
    """Construct dataclass ``cls`` from JSON, checking every field's type
    (nested dataclasses and lists of them included); extra keys are ignored."""
    owner, fields = _plan(cls)
    values = {}
    for name, required, check in fields:
        if name not in payload:
            if required:
                raise ProtocolError(f'{owner} needs "{name}"')
            continue
        values[name] = check(owner, name, payload[name])
    return cls(**values)


Check = Callable[[str, str, Any], Any]
"""Checks one field's JSON value against its type hint: returns the value
(converted where the hint asks, as ints for a float) or raises ``ProtocolError``."""

_PLANS: dict[type[Any], tuple[str, tuple[tuple[str, bool, Check], ...]]] = {}


def _plan(cls: type[Any]) -> tuple[str, tuple[tuple[str, bool, Check], ...]]:
    """How to build ``cls``: its tag and, per field, whether it is required
    and its checker. Worked out once per class: a child decodes a message per
    run and the parent two, so reading type hints per message showed in
    every run's cost."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = typing.get_type_hints(cls)
        plan = _PLANS[cls] = (_tag_of(cls), tuple(
            (spec.name,
             spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING,
             _checker(hints[spec.name]))
            for spec in dataclasses.fields(cls)
        ))
    return plan


def _tag_of(cls: type[Any]) -> str:
    return getattr(cls, "TAG", "") or cls.__name__


def _checker(hint: Any) -> Check:
    """The checker of values declared as ``hint``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, _UnionType):
        options = [_checker(option) for option in typing.get_args(hint)]
        optional = type(None) in typing.get_args(hint)

        def check_union(owner: str, name: str, value: Any) -> Any:
            if value is None and optional:
                return None  # the usual case, without an option failing first
            for option in options:
                try:
                    return option(owner, name, value)
                except ProtocolError:
                    continue
            raise ProtocolError(f'"{name}" of {owner} has the wrong type')
        return check_union
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        nested = hint

        def check_dataclass(owner: str, name: str, value: Any) -> Any:
            if isinstance(value, dict):
                return build(nested, value)
            raise _wrong(owner, name, hint)
        return check_dataclass
    if origin is list:
        (item,) = typing.get_args(hint)
        check_item = _checker(item)

        def check_list(owner: str, name: str, value: Any) -> Any:
            if isinstance(value, list):
                return [check_item(owner, name, element) for element in value]
            raise _wrong(owner, name, hint)
        return check_list
    accepts = _accepts_dict if origin is dict else _SIMPLE.get(hint)
    if accepts is None:
        accepts = _accepts_any if hint is Any else _accepts_nothing

    def check(owner: str, name: str, value: Any) -> Any:
        ok, converted = accepts(value)
        if ok:
            return converted
        raise _wrong(owner, name, hint)
    return check


def _wrong(owner: str, name: str, hint: Any) -> ProtocolError:
    return ProtocolError(f'"{name}" of {owner} must be {_describe(hint)}')


def _accepts_float(value: Any) -> tuple[bool, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
        return True, float(value)
    return False, None


def _accepts_dict(value: Any) -> tuple[bool, Any]:
    return isinstance(value, dict), value


def _accepts_any(value: Any) -> tuple[bool, Any]:
    return True, value


def _accepts_nothing(value: Any) -> tuple[bool, Any]:
    return False, None


_SIMPLE: dict[Any, Callable[[Any], tuple[bool, Any]]] = {
    type(None): lambda value: (value is None, None),
    float: _accepts_float,
    int: lambda value: (isinstance(value, int) and not isinstance(value, bool), value),
    bool: lambda value: (isinstance(value, bool), value),
    str: lambda value: (isinstance(value, str), value),
}


_UnionType = type(int | None)


def _describe(hint: Any) -> str:
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number"}.get(
        hint, getattr(hint, "__name__", str(hint)))


# -- the parent/child channel ----------------------------------------------------------


class ChannelClosed(Exception):
    """The other end is gone."""


class Channel:
    """One end of a parent/child socketpair.

    The parent's end is non-blocking both ways: ``send`` queues what the
    socket does not take at once, ``flush`` pushes more when the selector
    says it is writable, and ``stalled_since`` says for how long output has
    been waiting on a child that does not read. The child's end blocks (for
    at most ``timeout`` seconds), since a child has nothing else to do.
    """

    def __init__(self, sock: socket.socket, incoming: str) -> None:
        self.sock = sock
        self.incoming = incoming  # the tag key of what arrives here: "ev" (parent) or "op" (child)
        self._reader = LineReader(MAX_CHANNEL_LINE)
        self._out = bytearray()
        self._received: list[Message] = []
        self.stalled_since: float | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    @property
    def pending(self) -> bool:
        return bool(self._out)

    def send(self, message: Message) -> None:
        """Parent side: queue ``message`` and send what the socket takes now."""
        if not self._out:
            self.stalled_since = time.monotonic()
        self._out += encode(message)
        self.flush()

    def flush(self) -> None:
        """Send queued output without blocking. Raises ``ChannelClosed``."""
        while self._out:
            try:
                sent = self.sock.send(self._out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            del self._out[:sent]
        self.stalled_since = None

    def send_blocking(self, message: Message, timeout: float = 10.0) -> None:
        """Child side: send ``message``, waiting at most ``timeout`` for room."""
        data = memoryview(encode(message))
        deadline = time.monotonic() + timeout
        while data:
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ChannelClosed("peer is not reading") from None
                select.select([], [self.sock], [], remaining)
                continue
            except OSError as exc:
                raise ChannelClosed(str(exc)) from None
            data = data[sent:]

    def read_available(self) -> tuple[list[Message], bool]:
        """Parent side: read what is waiting without blocking:
        (messages, peer closed). Undecodable lines are dropped."""
        closed = False
        chunks = []
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            chunks.append(chunk)
        try:
            lines = self._reader.feed(b"".join(chunks))
        except ProtocolError:
            return [], True  # a child writing garbage this large is broken
        return self._decode(lines), closed

    def receive(self, timeout: float) -> Message | None:
        """Child side: one message, waiting at most ``timeout``."""
        if not self._received:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ChannelClosed("EOF")
            self._received = self._decode(self._reader.feed(chunk))
        return self._received.pop(0) if self._received else None

    def _decode(self, lines: list[bytes]) -> list[Message]:
        messages = []
        for line in lines:
            try:
                messages.append(decode(line, self.incoming))
            except ProtocolError:
                continue
        return messages

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


__all__ = [
    "COMMANDS", "Bye", "Channel", "ChannelClosed", "ChildStatus", "Dispatch", "Done", "DrainReply",
    "DrainRequest", "ErrorReply", "Exit", "Finishing", "KillReply", "KillRequest", "LineReader",
    "Message", "ProtocolError", "Ready", "ReloadReply", "ReloadRequest", "Reply", "Request",
    "ScaleReply", "ScaleRequest", "StatusReply", "StatusRequest", "StepEnded", "StepInFlight",
    "StepStarted", "build", "decode", "decode_reply", "encode", "frame", "parse",
]
