"""Step identity: dotpath ids, positions, names, branch prefixes and limits."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from everystep import parallel, schedule, step, workflow
from everystep.context import MAX_STEP_ID_LENGTH, Context, validate_name
from everystep.errors import EverystepError
from everystep.models import COMPLETED, FAILED
from tests.support.runs import execute_run

DETERMINISTIC = settings(derandomize=True, database=None, deadline=None)

CALLS: list[str] = []
_calls_lock = threading.Lock()


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()


@step
def mark(label: str) -> str:
    with _calls_lock:
        CALLS.append(label)
    return label


@step
def other(label: str) -> str:
    return label


def ids_of(store: Any, run_id: str) -> list[str]:
    return [record.step_id for record in store.get_steps(run_id)]


# -- pure rules ------------------------------------------------------------------


def scope(prefix: str = "") -> Context:
    # Allocating ids touches no execution state.
    return Context(None, prefix)  # type: ignore[arg-type]


def test_unnamed_steps_take_successive_positions() -> None:
    ctx = scope()
    assert [ctx.next_id() for _ in range(4)] == ["1", "2", "3", "4"]


def test_named_step_consumes_a_position() -> None:
    ctx = scope()
    assert [ctx.next_id(), ctx.next_id("charge"), ctx.next_id()] == ["1", "charge", "3"]


def test_branch_scope_prefixes_fork_id_and_index() -> None:
    parent = scope()
    parent.next_id()
    parent.next_id()
    fork = parent.next_id()
    branch = parent.branch(fork, 0)
    assert [branch.next_id(), branch.next_id("attach-ip")] == ["3.0.1", "3.0.attach-ip"]
    assert parent.branch("fanout", 1).next_id("attach-ip") == "fanout.1.attach-ip"


@pytest.mark.parametrize(
    "name", ["a", "A1", "_", "charge-card", "v2:step", "user@host", "a+b", "1a", "0_", "x" * 300]
)
def test_valid_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "a.b", ".a", "a.", "12", "007", "has space", "slash/x", "-lead", ":lead", "tab\t", "é", "a\n", None, 3, b"a"],
)
def test_invalid_names_are_rejected(name: Any) -> None:
    with pytest.raises(EverystepError, match="invalid everystep_id"):
        validate_name(name)


def test_names_are_unique_per_scope() -> None:
    ctx = scope()
    ctx.next_id("same")
    with pytest.raises(EverystepError, match="already used in this scope"):
        ctx.next_id("same")


def test_same_name_in_different_scopes_is_fine() -> None:
    parent = scope()
    assert parent.next_id("same") == "same"
    assert parent.branch("f", 0).next_id("same") == "f.0.same"
    assert parent.branch("f", 1).next_id("same") == "f.1.same"


def test_full_id_length_limit() -> None:
    prefix = "p" * 10 + "."
    assert len(scope(prefix).next_id("n" * (MAX_STEP_ID_LENGTH - len(prefix)))) == MAX_STEP_ID_LENGTH
    with pytest.raises(EverystepError, match=f"the limit is {MAX_STEP_ID_LENGTH}"):
        scope(prefix).next_id("n" * (MAX_STEP_ID_LENGTH - len(prefix) + 1))


# -- properties --------------------------------------------------------------------

name_chars = st.sampled_from("abcXYZ019_:@+-")
valid_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abzAZ09_"),
    st.text(alphabet=name_chars, max_size=20),
).filter(lambda name: not name.isdigit())


@settings(DETERMINISTIC, max_examples=300)
@given(valid_names)
def test_property_valid_names_are_accepted(name: str) -> None:
    assert validate_name(name) == name


@settings(DETERMINISTIC, max_examples=200)
@given(valid_names, valid_names)
def test_property_dotted_names_are_rejected(left: str, right: str) -> None:
    with pytest.raises(EverystepError):
        validate_name(f"{left}.{right}")


ALLOWED = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:@+-")


@settings(DETERMINISTIC, max_examples=300)
@given(valid_names, st.characters().filter(lambda char: char not in ALLOWED), st.integers(min_value=0))
def test_property_any_character_outside_the_charset_is_rejected(name: str, bad: str, where: int) -> None:
    cut = where % (len(name) + 1)
    with pytest.raises(EverystepError):
        validate_name(name[:cut] + bad + name[cut:])


@settings(DETERMINISTIC, max_examples=200)
@given(st.text(alphabet="0123456789", min_size=1, max_size=12))
def test_property_all_digit_names_are_rejected(name: str) -> None:
    with pytest.raises(EverystepError):
        validate_name(name)


@settings(DETERMINISTIC, max_examples=300)
@given(st.lists(st.one_of(st.none(), valid_names), max_size=30, unique_by=lambda n: n or object()))
def test_property_positions_never_shift_when_a_step_is_named(names: list[str | None]) -> None:
    """Whatever subset of steps is named, every unnamed step keeps the id of
    its position, exactly as if nothing were named."""
    ctx = scope()
    ids = [ctx.next_id(name) for name in names]
    for position, (name, step_id) in enumerate(zip(names, ids), start=1):
        assert step_id == (str(position) if name is None else name)


@settings(DETERMINISTIC, max_examples=100)
@given(
    st.lists(st.one_of(st.none(), valid_names), min_size=1, max_size=10, unique_by=lambda n: n or object()),
    st.integers(min_value=0, max_value=9),
    st.integers(min_value=0, max_value=5),
)
def test_property_branch_ids_live_under_fork_and_index(names: list[str | None], fork_pos: int, index: int) -> None:
    fork = str(fork_pos + 1)
    branch = scope().branch(fork, index)
    for step_id in (branch.next_id(name) for name in names):
        assert step_id.startswith(f"{fork}.{index}.")
        assert "." not in step_id[len(f"{fork}.{index}."):]


# -- in a real run ------------------------------------------------------------------

VERSION = {"name_second": False}


@workflow
def naming_is_stable() -> list[str]:
    first = mark("a")
    if VERSION["name_second"]:
        second = mark("b", everystep_id="charge")
    else:
        second = mark("b")
    third = mark("c")
    return [first, second, third]


def test_recorded_ids_follow_positions_and_names(store: Any) -> None:
    run = schedule(naming_is_stable, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert ids_of(store, run.id) == ["1", "2", "3"]

    VERSION["name_second"] = True
    try:
        run = schedule(naming_is_stable, database=store)
        assert execute_run(store, run.id) == COMPLETED
        assert ids_of(store, run.id) == ["1", "charge", "3"]
    finally:
        VERSION["name_second"] = False


@workflow
def fan_out() -> Any:
    mark("before")
    mark("named", everystep_id="setup")
    unnamed = parallel(lambda: mark("p0"), [lambda: mark("p1a"), lambda: mark("p1b")])
    named = parallel(
        lambda: mark("f0"),
        lambda: mark("f1", everystep_id="attach-ip"),
        everystep_id="fanout",
    )
    mark("after")
    return [unnamed, named]


def test_branch_steps_live_under_the_fork_id(store: Any) -> None:
    run = schedule(fan_out, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert sorted(ids_of(store, run.id)) == sorted(
        ["1", "setup", "3.0.1", "3.1.1", "3.1.2", "fanout.0.1", "fanout.1.attach-ip", "5"]
    )
    assert store.get_run(run.id).result == [("p0", ("p1a", "p1b")), ("f0", "f1")]


@workflow
def nested_forks() -> Any:
    return parallel(
        lambda: parallel(lambda: mark("x"), lambda: mark("y", everystep_id="why")),
        lambda: mark("z"),
        everystep_id="outer",
    )


def test_nested_fork_ids(store: Any) -> None:
    run = schedule(nested_forks, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert sorted(ids_of(store, run.id)) == ["outer.0.1.0.1", "outer.0.1.1.why", "outer.1.1"]
    assert store.get_run(run.id).result == (("x", "y"), "z")


@workflow
def same_name_in_branches() -> Any:
    return parallel(lambda: mark("l", everystep_id="same"), lambda: mark("r", everystep_id="same"))


def test_same_name_in_sibling_branches_is_allowed(store: Any) -> None:
    run = schedule(same_name_in_branches, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert sorted(ids_of(store, run.id)) == ["1.0.same", "1.1.same"]


CAUGHT: list[BaseException] = []


@workflow
def duplicate_name() -> Any:
    mark("one", everystep_id="dup")
    try:
        mark("two", everystep_id="dup")
    except EverystepError as exc:
        # The body cannot talk its way out of a bad name: the run still fails.
        CAUGHT.append(exc)
    return "carried on"


def test_duplicate_name_fails_the_run_before_the_step_runs(store: Any) -> None:
    CAUGHT.clear()
    run = schedule(duplicate_name, database=store)
    assert execute_run(store, run.id) == FAILED
    assert CALLS == ["one"]
    assert ids_of(store, run.id) == ["dup"]
    done = store.get_run(run.id)
    assert done.error["type"] == "everystep.errors.EverystepError"
    assert "already used in this scope" in done.error["message"]
    assert done.result is None
    assert len(CAUGHT) == 1


@workflow
def bad_names(kind: str) -> Any:
    mark("first")
    if kind == "dotted":
        mark("x", everystep_id="a.b")
    elif kind == "digits":
        mark("x", everystep_id="42")
    elif kind == "empty":
        mark("x", everystep_id="")
    elif kind == "too-long":
        mark("x", everystep_id="n" * (MAX_STEP_ID_LENGTH + 1))
    elif kind == "fork":
        parallel(lambda: mark("x"), everystep_id="no.dots")
    elif kind == "too-long-in-branch":
        parallel(lambda: mark("x", everystep_id="n" * (MAX_STEP_ID_LENGTH - 5)), everystep_id="fork")
    mark("never")
    return "unreachable"


@pytest.mark.parametrize(
    "kind, message",
    [
        ("dotted", "invalid everystep_id"),
        ("digits", "invalid everystep_id"),
        ("empty", "invalid everystep_id"),
        ("too-long", "characters long"),
        ("fork", "invalid everystep_id"),
        ("too-long-in-branch", "characters long"),
    ],
)
def test_bad_ids_fail_the_run_before_the_step_runs(store: Any, kind: str, message: str) -> None:
    run = schedule(bad_names, kind, database=store)
    assert execute_run(store, run.id) == FAILED
    assert CALLS == ["first"]
    assert ids_of(store, run.id) == ["1"]
    error = store.get_run(run.id).error
    assert error["type"] == "everystep.errors.EverystepError"
    assert message in error["message"]


@workflow
def longest_allowed_id() -> Any:
    return mark("x", everystep_id="n" * MAX_STEP_ID_LENGTH)


def test_an_id_of_exactly_the_limit_is_recorded(store: Any) -> None:
    run = schedule(longest_allowed_id, database=store)
    assert execute_run(store, run.id) == COMPLETED
    assert ids_of(store, run.id) == ["n" * MAX_STEP_ID_LENGTH]
