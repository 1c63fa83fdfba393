"""Tagged JSON: how arguments, results and exceptions are stored.

Plain JSON carries ``None``, ``bool``, ``int``, finite ``float``, ``str``,
``list`` and ``dict`` with string keys. A handful of other types round-trip
through a tag object ``{"$es": TAG, "v": ...}``: ``datetime``, ``date``,
``time``, ``timedelta``, ``UUID``, ``bytes``, ``Decimal``, ``tuple``,
``enum.Enum`` members and non-finite floats. Replay must hand the workflow
body exactly what the first execution saw, so a value that cannot come back
as itself (a set, an object, a dict with int keys) is refused with
``EverystepError`` before anything is written, and so are values nested
deeper than ``MAX_DEPTH`` or larger than ``MAX_BYTES`` once encoded.

A user dict that happens to contain the tag key is escaped, so no user value
can be mistaken for a tag.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import importlib
import json
import json.scanner
import math
import sys
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from .errors import ChildFailed, EverystepError, StepFailure

TAG = "$es"
MAX_DEPTH = 200
MAX_BYTES = 16 * 1024 * 1024
MAX_TRACEBACK_CHARS = 4000

_PLAIN = (str, int, bool, type(None))


class _Unserializable(Exception):
    """Internal: carries the path of the offending value while unwinding."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.path: list[str] = []


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _tag(tag: str, value: Any) -> dict[str, Any]:
    return {TAG: tag, "v": value}


def _encode(obj: Any, depth: int) -> Any:
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is float:
        return obj if math.isfinite(obj) else _tag("float", repr(obj))
    if depth > MAX_DEPTH:
        raise _Unserializable(f"nested deeper than {MAX_DEPTH} levels")
    if kind is list:
        return [_encode_item(item, depth, index) for index, item in enumerate(obj)]
    if kind is dict:
        return _encode_dict(obj, depth)
    if isinstance(obj, enum.Enum):
        return {TAG: "enum", "cls": _qualified_name(kind), "v": _encode(obj.value, depth + 1)}
    if isinstance(obj, dt.datetime):
        return _tag("datetime", obj.isoformat())
    if isinstance(obj, dt.date):
        return _tag("date", obj.isoformat())
    if isinstance(obj, dt.time):
        return _tag("time", obj.isoformat())
    if isinstance(obj, dt.timedelta):
        return _tag("timedelta", [obj.days, obj.seconds, obj.microseconds])
    if isinstance(obj, uuid.UUID):
        return _tag("uuid", str(obj))
    if kind is bytes:
        return _tag("bytes", base64.b64encode(obj).decode("ascii"))
    if isinstance(obj, decimal.Decimal):
        return _tag("decimal", str(obj))
    if kind is tuple:
        return _tag("tuple", [_encode_item(item, depth, index) for index, item in enumerate(obj)])
    if isinstance(obj, (str, int)):
        # str/int subclasses that are not enums encode as their base value.
        return str(obj) if isinstance(obj, str) else int(obj)
    raise _Unserializable(f"type {kind.__qualname__} is not serializable")


def _encode_item(item: Any, depth: int, index: int) -> Any:
    try:
        return _encode(item, depth + 1)
    except _Unserializable as exc:
        exc.path.append(f"[{index}]")
        raise


def _encode_dict(obj: dict[Any, Any], depth: int) -> Any:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if type(key) is not str:
            raise _Unserializable(f"dict key {key!r} is not a string")
        try:
            out[key] = _encode(value, depth + 1)
        except _Unserializable as exc:
            exc.path.append(f"[{key!r}]")
            raise
    if TAG in out:
        return _tag("dict", [[key, value] for key, value in out.items()])
    return out


def to_jsonable(obj: Any, what: str = "value") -> Any:
    """Encode ``obj`` into plain JSON types, raising ``EverystepError`` if it
    cannot round-trip. ``what`` names the value in the error message."""
    try:
        return _encode(obj, 0)
    except _Unserializable as exc:
        where = what + "".join(reversed(exc.path))
        raise EverystepError(f"{where} cannot be stored: {exc.reason}") from None
    except RecursionError:
        raise EverystepError(f"{what} cannot be stored: nested too deeply") from None


#: ``json.dumps`` with options builds an encoder per call; a run serializes
#: each step's arguments and result, so one encoder is kept.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any, what: str = "value") -> str:
    """Serialize ``obj`` to tagged JSON text, enforcing depth and size limits."""
    text = _ENCODER.encode(to_jsonable(obj, what))
    try:
        # isascii() is O(1) on CPython: only non-ASCII text pays for encoding.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate: valid in a Python str, not in UTF-8, so no driver
        # can store it. Refuse it here, before a step runs or a row is written.
        raise EverystepError(f"{what} cannot be stored: it contains a lone surrogate (not valid UTF-8)") from None
    if size > MAX_BYTES:
        raise EverystepError(f"{what} cannot be stored: larger than {MAX_BYTES} bytes once encoded")
    return text


def _decode_enum(tagged: dict[str, Any]) -> Any:
    cls = resolve_name(tagged.get("cls", ""))
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return cls(tagged["v"])
    # The enum's class is gone from this codebase: hand back its raw value
    # rather than making a recorded run impossible to replay.
    return tagged["v"]


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "datetime": lambda v: dt.datetime.fromisoformat(v),
    "date": lambda v: dt.date.fromisoformat(v),
    "time": lambda v: dt.time.fromisoformat(v),
    "timedelta": lambda v: dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2]),
    "uuid": lambda v: uuid.UUID(v),
    "bytes": lambda v: base64.b64decode(v),
    "decimal": lambda v: decimal.Decimal(v),
    "tuple": tuple,
    "float": float,
    "dict": lambda v: {key: value for key, value in v},
}


def _object_hook(obj: dict[str, Any]) -> Any:
    tag = obj.get(TAG)
    if tag is None:
        return obj
    if tag == "enum":
        return _decode_enum(obj)
    decoder = _DECODERS.get(tag)
    if decoder is None:
        raise EverystepError(f"stored value has an unknown tag {tag!r}")
    return decoder(obj["v"])


def from_jsonable(obj: Any) -> Any:
    """Decode tags in an already-parsed JSON structure (e.g. a jsonb value)."""
    if isinstance(obj, list):
        return [from_jsonable(item) for item in obj]
    if isinstance(obj, dict):
        return _object_hook({key: from_jsonable(value) for key, value in obj.items()})
    return obj


#: One decoder for every value read back (``json.loads`` with a hook would
#: build a new one per call: most of the cost of a small value), and its
#: scanner, which reads a value with no whitespace around it (all that
#: ``dumps`` writes) without the two regular expressions around it.
_DECODER = json.JSONDecoder(object_hook=_object_hook)
# (typeshed types make_scanner's argument as the scanner class; it takes the decoder)
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]


def loads(text: str | bytes | None) -> Any:
    """Parse tagged JSON text back into Python values."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = text.decode("utf-8")
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):  # whitespace, or not JSON: the full decoder says which
        return _DECODER.decode(text)
    return value


def check(obj: Any, what: str = "value") -> None:
    """Raise ``EverystepError`` unless ``obj`` can be stored."""
    dumps(obj, what)


# -- exceptions -------------------------------------------------------------


def resolve_name(dotted: str) -> Any:
    """Find ``module.Qual.Name`` among importable modules, or return None."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        module = sys.modules.get(module_name)
        if module is None:
            try:
                module = importlib.import_module(module_name)
            except Exception:
                continue
        target: Any = module
        try:
            for attr in parts[cut:]:
                target = getattr(target, attr)
        except AttributeError:
            continue
        return target
    return None


def encode_exception(exc: BaseException) -> dict[str, Any]:
    """Describe ``exc`` as ``{"type", "message", "args"}`` (plus ``exceptions``
    for exception groups and a trimmed ``traceback`` when one exists).

    The result always fits in a stored row: a failure that could not be
    recorded would leave its run ``running`` forever, so an oversized
    description sheds its args and has its text trimmed instead.
    """
    payload = _describe_exception(exc)
    try:
        dumps(payload, "exception")
    except EverystepError:
        payload = _slim_exception(payload, max(MAX_BYTES // 64, 64))
    return payload


def _describe_exception(exc: BaseException) -> dict[str, Any]:
    payload: dict[str, Any] = {"type": _qualified_name(type(exc)), "message": str(exc)}
    if isinstance(exc, BaseExceptionGroup):
        payload["args"] = [exc.message]
        payload["exceptions"] = [_describe_exception(inner) for inner in exc.exceptions]
    else:
        try:
            to_jsonable(list(exc.args))
            payload["args"] = list(exc.args)
        except EverystepError:
            payload["args"] = []
    if exc.__traceback__ is not None:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        payload["traceback"] = text[-MAX_TRACEBACK_CHARS:]
    return payload


def _slim_exception(payload: dict[str, Any], budget: int) -> dict[str, Any]:
    """Type and trimmed text only (``budget`` characters per text field,
    shared among a group's members), which always encodes."""
    slim: dict[str, Any] = {"type": payload["type"], "message": _clip(payload["message"], budget), "args": []}
    if "exceptions" in payload:
        share = max(budget // (len(payload["exceptions"]) + 1), 16)
        slim["args"] = [_clip(payload["args"][0] if payload["args"] else "", budget)]
        slim["exceptions"] = [_slim_exception(inner, share) for inner in payload["exceptions"]]
    if "traceback" in payload:
        slim["traceback"] = _clip(payload["traceback"][-budget:], budget)
    return slim


def _clip(value: Any, limit: int) -> str:
    text = str(value).encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "… (truncated)"


def decode_exception(payload: dict[str, Any] | str | None) -> BaseException | None:
    """Rebuild a stored exception: the original type when it is importable
    and accepts its stored arguments, else ``StepFailure`` with the message."""
    if payload is None:
        return None
    fields: dict[str, Any] = loads(payload) if isinstance(payload, str) else payload
    type_name = str(fields.get("type", ""))
    message = str(fields.get("message", ""))
    args = fields.get("args") or []
    cls = resolve_name(type_name)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return StepFailure(message, type_name)
    if issubclass(cls, BaseExceptionGroup):
        # args[0] is the group's own message; ``message`` is str(group),
        # which appends " (N sub-exceptions)" and would grow on each pass.
        group_message = str(args[0]) if args else message
        inner = [decode_exception(item) for item in fields.get("exceptions", [])]
        try:
            return cls(group_message, inner)
        except Exception:
            return StepFailure(message, type_name)
    # No stored args but a message: the args were not serializable and were
    # dropped, so the message is the best argument left (rather than losing it).
    attempts = [tuple(args), (message,)] if args or not message else [(message,), ()]
    for attempt in attempts:
        try:
            rebuilt = cls(*attempt)
        except Exception:
            continue
        if isinstance(rebuilt, ChildFailed) and rebuilt.error is not None:
            rebuilt.cause = decode_exception(rebuilt.error)
        return rebuilt
    return StepFailure(message, type_name)
