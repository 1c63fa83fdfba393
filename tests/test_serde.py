"""Tagged JSON: every tagged type round-trips, everything else is refused
before anything is written, and stored exceptions come back as themselves.

Pure round-trips run without a database; ``test_tagged_values_survive_the_database``
pushes every tagged type through run args, step args/kwargs/results and the
run result on both backends.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from everystep import schedule, serde, step, workflow
from everystep.errors import (
    EffectUncertain,
    EverystepError,
    StepFailure,
    Terminal,
    WorkflowCodeError,
)
from everystep.models import COMPLETED, FAILED
from tests.support.runs import execute_run

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow])


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mode(enum.StrEnum):
    FAST = "fast"
    SAFE = "safe"


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


class Shape(enum.Enum):
    """An enum whose values are themselves tagged types."""

    POINT = (0, 0)
    WHEN = dt.date(2024, 2, 29)


class CustomError(Exception):
    """Importable, with several constructor arguments."""

    def __init__(self, code: int, detail: dict[str, Any]) -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


class Unconstructible(Exception):
    """Importable, but its stored args do not fit its constructor."""

    def __init__(self, a: int, b: int) -> None:
        super().__init__(f"{a}/{b}")


def same(a: Any, b: Any) -> bool:
    """Strict equality: same types all the way down (``1 == 1.0 == True``
    is not enough), dict key order kept, nan equal to nan, -0.0 not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, (dt.datetime, dt.time)):
        return a == b and a.utcoffset() == b.utcoffset() and (a.tzinfo is None) == (b.tzinfo is None)
    return a == b


def roundtrip(value: Any) -> Any:
    return serde.loads(serde.dumps(value))


UTC = dt.timezone.utc
PLUS_0530 = dt.timezone(dt.timedelta(hours=5, minutes=30))

TAGGED_SAMPLES = {
    "naive datetime": dt.datetime(2024, 5, 17, 13, 45, 7, 123456),
    "aware datetime utc": dt.datetime(2024, 5, 17, 13, 45, 7, tzinfo=UTC),
    "aware datetime +05:30": dt.datetime(1999, 12, 31, 23, 59, 59, 1, tzinfo=PLUS_0530),
    "datetime at whole second": dt.datetime(2024, 1, 1),
    "date": dt.date(2024, 2, 29),
    "time": dt.time(8, 30, 0, 250),
    "aware time": dt.time(23, 59, tzinfo=PLUS_0530),
    "timedelta": dt.timedelta(days=-3, seconds=17, microseconds=9),
    "uuid": uuid.UUID("0190a6f4-3f1e-7c3a-9e5b-1234567890ab"),
    "bytes": b"\x00\xffbinary\n",
    "empty bytes": b"",
    "decimal": decimal.Decimal("12345678901234567890.000000001"),
    "negative decimal": decimal.Decimal("-0.10"),
    "tuple": (1, "a", None),
    "empty tuple": (),
    "nested tuple": ((1, 2), [3, (4,)]),
    "enum": Color.GREEN,
    "int enum": Level.HIGH,
    "str enum": Mode.SAFE,
    "flag combination": Perm.R | Perm.W,
    "enum with tagged value": Shape.WHEN,
    "enum with tuple value": Shape.POINT,
    "nan": float("nan"),
    "inf": float("inf"),
    "-inf": float("-inf"),
    "dict with the tag key": {"$es": "datetime", "v": "2024-01-01"},
    "dict with only the tag key": {"$es": None},
    "nested dict with tag keys": {"outer": {"$es": {"$es": 1}}, "t": (Color.RED,)},
}


@pytest.mark.parametrize("value", list(TAGGED_SAMPLES.values()), ids=list(TAGGED_SAMPLES))
def test_tagged_values_round_trip_to_their_original_types(value: Any) -> None:
    back = roundtrip(value)
    assert same(back, value), (value, back)


@pytest.mark.parametrize("value", list(TAGGED_SAMPLES.values()), ids=list(TAGGED_SAMPLES))
def test_tagged_values_round_trip_inside_containers(value: Any) -> None:
    tree = {"list": [value, {"k": value}], "tuple": (value,), "$es": [value]}
    assert same(roundtrip(tree), tree)


def test_plain_json_is_stored_as_plain_json() -> None:
    value = {"a": [1, 2.5, "x", None, True, False], "b": {}}
    assert json.loads(serde.dumps(value)) == value
    assert same(roundtrip(value), value)


def test_bool_and_int_keep_their_types() -> None:
    assert same(roundtrip([True, 1, 1.0, False, 0]), [True, 1, 1.0, False, 0])


def test_negative_zero_and_big_ints() -> None:
    value = [-0.0, 10**40, -(10**40)]
    assert same(roundtrip(value), value)


def test_decimal_nan_and_infinity() -> None:
    for text in ("NaN", "Infinity", "-Infinity", "-0"):
        back = roundtrip(decimal.Decimal(text))
        assert type(back) is decimal.Decimal and str(back) == text


def test_non_ascii_text_is_kept() -> None:
    value = {"clé": "naïve – 日本語 🎉", "nul": "a\x00b"}
    assert same(roundtrip(value), value)


def test_tag_key_dict_is_never_mistaken_for_a_tag() -> None:
    user = {"$es": "bytes", "v": "AAAA"}
    back = roundtrip(user)
    assert back == user and type(back) is dict


def test_from_jsonable_decodes_an_already_parsed_structure() -> None:
    value = [dt.date(2024, 1, 2), {"$es": 1}, (b"x",)]
    parsed = json.loads(serde.dumps(value))
    assert same(serde.from_jsonable(parsed), value)


def test_loads_of_none_is_none() -> None:
    assert serde.loads(None) is None


def test_unknown_tag_is_refused_on_load() -> None:
    with pytest.raises(EverystepError, match="unknown tag"):
        serde.loads('{"$es": "martian", "v": 1}')


def test_enum_whose_class_is_gone_decodes_to_its_value() -> None:
    text = '{"$es": "enum", "cls": "tests.test_serde.NoSuchEnum", "v": "red"}'
    assert serde.loads(text) == "red"


# -- refusals ------------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    "value, reason",
    [
        ({1, 2}, "type set is not serializable"),
        (frozenset(), "type frozenset is not serializable"),
        (Opaque(), "type Opaque is not serializable"),
        (object(), "type object is not serializable"),
        (bytearray(b"x"), "type bytearray is not serializable"),
        (lambda: 1, "is not serializable"),
        ({1: "a"}, "dict key 1 is not a string"),
        ({("a",): 1}, "is not a string"),
        ({True: 1}, "dict key True is not a string"),
    ],
    ids=["set", "frozenset", "object", "plain-object", "bytearray", "function", "int-key", "tuple-key", "bool-key"],
)
def test_values_that_cannot_come_back_as_themselves_are_refused(value: Any, reason: str) -> None:
    with pytest.raises(EverystepError, match=reason):
        serde.dumps(value)


def test_refusal_names_the_path_of_the_offending_value() -> None:
    with pytest.raises(EverystepError) as info:
        serde.dumps({"a": [1, {"b": ({3},)}]}, "arguments of step 4")
    assert str(info.value).startswith("arguments of step 4['a'][1]['b'][0] cannot be stored")


@pytest.mark.parametrize("kind", [list, tuple, dict])
def test_nesting_10000_deep_is_refused_cleanly(kind: type) -> None:
    value: Any = 1
    for _ in range(10_000):
        value = {"k": value} if kind is dict else kind([value])
    with pytest.raises(EverystepError, match=f"nested deeper than {serde.MAX_DEPTH}"):
        serde.dumps(value)


def test_depth_limit_boundary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serde, "MAX_DEPTH", 5)

    def nested(levels: int) -> Any:
        value: Any = "leaf"
        for _ in range(levels):
            value = [value]
        return value

    assert roundtrip(nested(5)) == nested(5)
    with pytest.raises(EverystepError, match="nested deeper than 5"):
        serde.dumps(nested(7))


def test_size_limit_counts_utf8_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serde, "MAX_BYTES", 100)
    assert roundtrip("x" * 90) == "x" * 90
    with pytest.raises(EverystepError, match="larger than 100 bytes"):
        serde.dumps("x" * 200, "result of step 1")
    # 60 characters, 120 bytes once encoded.
    with pytest.raises(EverystepError, match="larger than 100 bytes"):
        serde.dumps("é" * 60)


def test_lone_surrogate_is_refused_before_anything_is_written() -> None:
    with pytest.raises(EverystepError, match="cannot be stored"):
        serde.dumps({"s": "\ud800"})


def test_check_raises_like_dumps() -> None:
    serde.check([1, (2,)])
    with pytest.raises(EverystepError):
        serde.check({3})


# -- exceptions ----------------------------------------------------------------


def decode_roundtrip(exc: BaseException) -> BaseException | None:
    """Encode, store as JSON text and decode, as a step row does."""
    return serde.decode_exception(serde.dumps(serde.encode_exception(exc)))


def test_encoded_exception_shape() -> None:
    payload = serde.encode_exception(ValueError("bad", 3))
    assert payload["type"] == "builtins.ValueError"
    assert payload["message"] == "('bad', 3)"
    assert payload["args"] == ["bad", 3]


def test_importable_exception_comes_back_with_its_args() -> None:
    back = decode_roundtrip(CustomError(7, {"when": dt.date(2024, 1, 1), "ids": (1, 2)}))
    assert type(back) is CustomError
    assert back.code == 7
    assert same(back.detail, {"when": dt.date(2024, 1, 1), "ids": (1, 2)})


@pytest.mark.parametrize("exc", [KeyError("k"), ValueError("v"), RuntimeError(), OSError(2, "missing")])
def test_builtin_exceptions_round_trip(exc: Exception) -> None:
    back = decode_roundtrip(exc)
    assert type(back) is type(exc)
    assert back.args == exc.args


def test_exception_with_unserializable_args_keeps_type_and_message() -> None:
    back = decode_roundtrip(ValueError({1, 2}))
    assert type(back) is ValueError
    assert str(back) == str(ValueError({1, 2}))


def test_unimportable_exception_becomes_step_failure() -> None:
    class LocalError(Exception):
        pass

    back = decode_roundtrip(LocalError("gone with the code"))
    assert type(back) is StepFailure
    assert str(back) == "gone with the code"
    assert back.type_name == f"{__name__}.test_unimportable_exception_becomes_step_failure.<locals>.LocalError"


def test_unknown_module_becomes_step_failure() -> None:
    back = serde.decode_exception({"type": "no_such_module_xyz.Boom", "message": "boom", "args": ["boom"]})
    assert type(back) is StepFailure and str(back) == "boom" and back.type_name == "no_such_module_xyz.Boom"


def test_non_exception_type_becomes_step_failure() -> None:
    back = serde.decode_exception({"type": "builtins.dict", "message": "not an error", "args": []})
    assert type(back) is StepFailure and back.type_name == "builtins.dict"


def test_constructor_mismatch_becomes_step_failure() -> None:
    back = decode_roundtrip(Unconstructible(1, 2))
    assert type(back) is StepFailure
    assert str(back) == "1/2"
    assert back.type_name == "tests.test_serde.Unconstructible"


def test_terminal_keeps_reason_and_payload() -> None:
    payload = {"node_id": 7, "at": dt.datetime(2024, 1, 1, tzinfo=UTC), "tags": ("a", "b")}
    back = decode_roundtrip(Terminal("node-full", payload))
    assert type(back) is Terminal
    assert back.reason == "node-full"
    assert same(back.payload, payload)
    assert str(back) == "node-full"


def test_terminal_without_payload() -> None:
    back = decode_roundtrip(Terminal("quota"))
    assert type(back) is Terminal and back.reason == "quota" and back.payload is None


@pytest.mark.parametrize("cls", [EverystepError, WorkflowCodeError, EffectUncertain])
def test_everystep_errors_round_trip(cls: type[Exception]) -> None:
    back = decode_roundtrip(cls("explained"))
    assert type(back) is cls and str(back) == "explained"


def test_error_classes_are_exported_and_share_a_base() -> None:
    import everystep

    for name in ("WorkflowCodeError", "EffectUncertain", "StepFailure", "SimulatedCrash", "DrainOrphan", "Terminal"):
        cls = getattr(everystep, name)
        assert issubclass(cls, everystep.EverystepError), name
        back = decode_roundtrip(cls("why") if name != "Terminal" else cls("why", 1))
        assert type(back) is cls and str(back) == "why"


def test_step_failure_round_trips() -> None:
    back = decode_roundtrip(StepFailure("recorded by hand"))
    assert type(back) is StepFailure and str(back) == "recorded by hand"


def test_exception_group_round_trips_with_its_members() -> None:
    group = ExceptionGroup("2 parallel branches failed", [ValueError("a"), CustomError(1, {})])
    back = decode_roundtrip(group)
    assert type(back) is ExceptionGroup
    assert back.message == "2 parallel branches failed"
    assert str(back) == str(group)
    assert [type(inner) for inner in back.exceptions] == [ValueError, CustomError]
    assert str(back.exceptions[0]) == "a"


def test_nested_exception_group_round_trips() -> None:
    group = ExceptionGroup("outer", [ExceptionGroup("inner", [KeyError("k")]), Terminal("stop")])
    back = decode_roundtrip(group)
    assert back.message == "outer"
    inner = back.exceptions[0]
    assert type(inner) is ExceptionGroup and inner.message == "inner"
    assert type(inner.exceptions[0]) is KeyError
    assert type(back.exceptions[1]) is Terminal


def test_traceback_is_stored_and_trimmed() -> None:
    try:
        raise ValueError("short")
    except ValueError as exc:
        payload = serde.encode_exception(exc)
    assert payload["traceback"].startswith("Traceback")
    assert "ValueError: short" in payload["traceback"]
    try:
        raise ValueError("x" * (serde.MAX_TRACEBACK_CHARS * 2))
    except ValueError as exc:
        payload = serde.encode_exception(exc)
    assert len(payload["traceback"]) == serde.MAX_TRACEBACK_CHARS


def test_exception_without_traceback_has_no_traceback_field() -> None:
    assert "traceback" not in serde.encode_exception(ValueError("never raised"))


def test_decode_accepts_text_and_none() -> None:
    assert serde.decode_exception(None) is None
    back = serde.decode_exception(json.dumps({"type": "builtins.KeyError", "message": "'k'", "args": ["k"]}))
    assert type(back) is KeyError and back.args == ("k",)


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("m" * 200_000, {"blob": "b" * 200_000}),
        Terminal("m" * 200_000, {"blob": "b" * 200_000}),
        ExceptionGroup("m" * 200_000, [ValueError("m" * 100_000), KeyError("k" * 100_000)]),
        ValueError("m\ud800" * 100_000),
    ],
    ids=["plain", "terminal", "group", "surrogates"],
)
def test_oversized_exception_is_still_encodable(monkeypatch: pytest.MonkeyPatch, exc: Exception) -> None:
    """A failure must always be recordable, however big its message or args."""
    monkeypatch.setattr(serde, "MAX_BYTES", 64 * 1024)
    text = serde.dumps(serde.encode_exception(exc), "exception")
    back = serde.decode_exception(text)
    assert type(back) is type(exc)
    assert str(back).lstrip("('").startswith("mm") or str(back).startswith("m\\ud800")
    assert "(truncated)" in str(back)
    assert len(text) < serde.MAX_BYTES


def test_exception_with_a_lone_surrogate_in_its_message_is_encodable() -> None:
    back = serde.decode_exception(serde.dumps(serde.encode_exception(ValueError("bad \ud800 text"))))
    assert type(back) is ValueError
    assert "bad" in str(back)


# -- through the database --------------------------------------------------------


@step
def echo(*args: Any, **kwargs: Any) -> Any:
    return [list(args), kwargs]


@workflow
def echo_everything(samples: dict[str, Any]) -> Any:
    out = echo(*samples.values(), **{f"k{index}": value for index, value in enumerate(samples.values())})
    return {"samples": samples, "echoed": out}


@workflow
def return_unstorable() -> Any:
    return {1, 2}


DB_SAMPLES = {key: value for key, value in TAGGED_SAMPLES.items()}
DB_SAMPLES["nul and unicode"] = "a\x00b – 日本"


def test_tagged_values_survive_the_database(store: Any) -> None:
    run = schedule(echo_everything, DB_SAMPLES, database=store)
    assert same(run.args, [DB_SAMPLES])
    assert same(store.get_run(run.id).args, [DB_SAMPLES])
    assert execute_run(store, run.id) == COMPLETED
    done = store.get_run(run.id)
    values = list(DB_SAMPLES.values())
    kwargs = {f"k{index}": value for index, value in enumerate(values)}
    assert same(done.result, {"samples": DB_SAMPLES, "echoed": [values, kwargs]})
    (record,) = store.get_steps(run.id)
    assert same(record.args, values)
    assert same(record.kwargs, kwargs)
    assert same(record.result, [values, kwargs])


def test_unstorable_run_result_fails_the_run(store: Any) -> None:
    run = schedule(return_unstorable, database=store)
    assert execute_run(store, run.id) == FAILED
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.EverystepError"
    assert "result of run" in error["message"] and "set" in error["message"]


# -- properties ------------------------------------------------------------------

offsets = st.builds(
    lambda minutes, seconds: dt.timezone(dt.timedelta(minutes=minutes, seconds=seconds)),
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
    st.sampled_from([0, 0, 0, 30]),
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(),
    st.binary(),
    st.uuids(),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=offsets),
    st.times(),
    st.times(timezones=offsets),
    st.timedeltas(),
    st.sampled_from(list(Color) + list(Level) + list(Mode) + list(Shape) + [Perm.R | Perm.X]),
)

keys = st.one_of(st.sampled_from(["$es", "v", "cls", ""]), st.text(max_size=8))

trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=5).map(tuple),
        st.dictionaries(keys, children, max_size=5),
    ),
    max_leaves=30,
)


@settings(DETERMINISTIC, max_examples=300)
@given(trees)
def test_property_trees_with_tagged_leaves_round_trip(tree: Any) -> None:
    assert same(roundtrip(tree), tree)


@settings(DETERMINISTIC, max_examples=200)
@given(trees)
def test_property_encoded_form_is_plain_json(tree: Any) -> None:
    text = serde.dumps(tree)
    plain = json.loads(text)
    assert json.loads(json.dumps(plain)) == plain
    assert same(serde.from_jsonable(plain), tree)


@settings(DETERMINISTIC, max_examples=100)
@given(trees, st.sampled_from([set(), frozenset({1}), Opaque(), {1: 2}]))
def test_property_an_unstorable_value_anywhere_is_refused(tree: Any, bad: Any) -> None:
    with pytest.raises(EverystepError, match="cannot be stored"):
        serde.dumps([tree, {"deep": [(bad,)]}])
