"""Status sets are said once, in ``everystep.models``, and the SQL follows.

The named statements of every backend name a set by placeholder
(``{active_statuses}``) and ``store.queries.load`` renders it from the
models; the database's own check of each status column
(``store/functions/<backend>/statuses.sql``) names whole vocabularies the
same way (``{run_statuses}``) and is re-applied when they change. So a new
status changes ``models.py``, not a dozen statements nor a migration per
backend. These tests fail if a set is written out again, if what the
statements run differs from the models' sets, or if a statement compares a
status with a word that is no status at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from everystep import models
from everystep.store import functions, queries

ROOT = Path(__file__).resolve().parent.parent
QUERY_FILES = sorted((ROOT / "everystep" / "store" / "queries").glob("*.sql"))
BACKENDS = [path.stem for path in QUERY_FILES]

#: Every word a status column holds: runs, steps, operator requests.
VOCABULARY = {*models.RunStatus, *models.StepStatus, *models.RequestStatus}

#: A parenthesized or bracketed list of two or more quoted words.
_LITERAL_LIST = re.compile(r"[(\[]\s*'\w+'(?:\s*,\s*'\w+')+\s*[)\]]")
_COMPARED = re.compile(r"status\s*(?:=|<>|!=)\s*'(\w*)'", re.IGNORECASE)


def _status_lists(text: str) -> list[str]:
    """The written-out lists in ``text`` whose every word is a status."""
    return [match.group(0) for match in _LITERAL_LIST.finditer(text)
            if set(re.findall(r"'(\w+)'", match.group(0))) <= VOCABULARY]


def _blocks(path: Path) -> dict[str, str]:
    """The file's named blocks, without their comment lines."""
    parts = re.split(r"^-- name: (\w+)\s*$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {name: "\n".join(line for line in body.splitlines() if not line.lstrip().startswith("--"))
            for name, body in zip(parts[1::2], parts[2::2])}


def _uses(blocks: dict[str, str], placeholder: str) -> int:
    """How often ``{placeholder}`` ends up in the statements: a fragment's
    (a block named ``_…``) counts once per statement that includes it."""
    def count(body: str) -> int:
        own = body.count("{" + placeholder + "}")
        return own + sum(body.count("{" + name + "}") * count(text) for name, text in blocks.items()
                         if name.startswith("_") and "{" + name + "}" in body)

    return sum(count(body) for name, body in blocks.items() if not name.startswith("_"))


def _code(path: Path) -> str:
    """The file without its comment lines (SQL ``--``, Python ``#``)."""
    return "\n".join(line for line in path.read_text(encoding="utf-8").splitlines()
                     if not line.lstrip().startswith(("--", "#")))


def test_the_fixtures_find_every_backends_queries() -> None:
    assert {"postgres", "sqlite", "mariadb"} <= set(BACKENDS)


@pytest.mark.parametrize("path", QUERY_FILES, ids=lambda path: path.name)
def test_no_queries_file_writes_a_status_set_out(path: Path) -> None:
    written = _status_lists(_code(path))
    assert not written, (f"{path.name} writes status sets out: {written}; name the set in everystep/models.py "
                         f"and use its placeholder ({', '.join('{' + name + '}' for name in queries.STATUS_SETS)})")


def test_no_python_sql_writes_a_status_set_out() -> None:
    """SQL kept in Python (the step-by-step claims, the console) included;
    migrations are history and keep what they said."""
    found = {}
    for package in ("everystep", "supervisor"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            written = _status_lists(_code(path))
            if written:
                found[str(path.relative_to(ROOT))] = written
    assert not found


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_rendered_sets_are_the_models_sets(backend: str) -> None:
    """Every placeholder in the file became exactly the models' set, and no
    other list of statuses is in what the backend runs."""
    raw = _code(ROOT / "everystep" / "store" / "queries" / f"{backend}.sql")
    rendered = "\n".join(queries.load(backend).values())
    blocks = _blocks(ROOT / "everystep" / "store" / "queries" / f"{backend}.sql")
    expected = {name: queries.sql_list(statuses) for name, statuses in queries.STATUS_SETS.items()}
    assert expected == {
        "active_statuses": "('scheduled', 'running', 'blocked')",
        "step_open_statuses": "('started', 'retrying', 'sleeping', 'waiting')",
        "step_waiting_statuses": "('retrying', 'sleeping', 'waiting')",
    }
    for name, literal in expected.items():
        assert rendered.count(literal) == _uses(blocks, name), name
    assert raw.count("{") >= len(expected)  # the placeholders are there to be counted
    assert not re.search(r"\{\w+_statuses\}", rendered)
    assert set(_status_lists(rendered)) <= set(expected.values())


def test_the_sets_say_what_the_statements_rely_on() -> None:
    """Every run status is either active (claims, queue counts and
    cancels see it; retention never deletes it) or prunable, never both;
    the open step statuses are those whose outcome is not final."""
    active, prunable = set(models.ACTIVE_STATUSES), set(models.PRUNABLE_STATUSES)
    assert active.isdisjoint(prunable) and active | prunable == set(models.RunStatus)
    assert set(models.CANCELLABLE_STATUSES) == active
    assert set(models.STEP_OPEN_STATUSES) == set(models.StepStatus) - {models.STEP_DONE, models.STEP_FAILED}


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_status_a_statement_compares_with_is_a_status(backend: str) -> None:
    """A typo (``'runing'``) in a single comparison would match no row and
    say nothing: each word compared with a status column is one the models know."""
    rendered = "\n".join(queries.load(backend).values())
    words = set(_COMPARED.findall(rendered))
    assert words and words <= VOCABULARY, words - VOCABULARY


def test_a_set_is_rendered_as_literals_and_nothing_else() -> None:
    assert queries.sql_list(("a", "b")) == "('a', 'b')"
    with pytest.raises(ValueError):
        queries.sql_list(("it's",))
    with pytest.raises(ValueError):
        queries.sql_list(())


@pytest.mark.parametrize("backend", BACKENDS)
def test_fragments_are_included_never_run(backend: str) -> None:
    """A block named ``_…`` is shared text: no statement is called by such
    a name, every fragment is included somewhere, and nothing is left
    unrendered."""
    blocks = _blocks(ROOT / "everystep" / "store" / "queries" / f"{backend}.sql")
    statements = queries.load(backend)
    assert not [name for name in statements if name.startswith("_")]
    for name in (name for name in blocks if name.startswith("_")):
        assert any("{" + name + "}" in body for other, body in blocks.items() if other != name), name
    assert not [name for name, body in statements.items() if re.search(r"\{_\w+\}", body)]


# -- the database's own check of a status column ---------------------------------------------------

FUNCTION_FILES = sorted((ROOT / "everystep" / "store" / "functions").glob("*/*.sql"))


@pytest.mark.parametrize("path", FUNCTION_FILES, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_function_file_writes_a_status_set_out(path: Path) -> None:
    """Function files name sets by placeholder too: a status list frozen
    into one would need a migration-like edit per new status."""
    written = _status_lists(_code(path))
    assert not written, f"{path.parent.name}/{path.name} writes status sets out: {written}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_backend_checks_every_status_column_against_its_whole_enum(backend: str) -> None:
    """``statuses.sql`` renders each vocabulary in full, once per check it
    makes, and nothing else: what the database accepts is what the models
    declare."""
    [statuses] = [function for function in functions.available(backend) if function.name == "statuses"]
    expected = {queries.sql_list(tuple(enum)) for enum in (models.RunStatus, models.StepStatus,
                                                           models.RequestStatus)}
    assert set(_status_lists(statuses.sql)) == expected
    assert "_statuses}" not in statuses.sql
    per_column = {literal: statuses.sql.count(literal) for literal in expected}
    assert len(set(per_column.values())) == 1, per_column  # the same number of checks for each column


def test_a_new_status_changes_what_the_migrator_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The file's hash is the rendered text's: a status added to an enum
    makes the migrator re-apply it (``functions.apply``)."""
    before = {backend: {function.name: function.sha256 for function in functions.available(backend)}
              for backend in BACKENDS}
    monkeypatch.setitem(functions.STATUS_DOMAINS, "run_statuses", (*models.RunStatus, "new_in_test"))
    for backend in BACKENDS:
        after = {function.name: function.sha256 for function in functions.available(backend)}
        assert {name for name in after if after[name] != before[backend][name]} == {"statuses"}, backend


def test_an_unknown_placeholder_in_a_function_file_is_an_error() -> None:
    assert functions.render("x IN {run_statuses} AND y = '{}'") == (
        f"x IN {queries.sql_list(tuple(models.RunStatus))} AND y = '{{}}'")
    with pytest.raises(LookupError, match="run_statusess"):
        functions.render("x IN {run_statusess}")


# -- where one execution leaves a run ---------------------------------------------------------------

def test_the_outcomes_that_are_statuses_are_where_an_execution_ends_a_run() -> None:
    """``Outcome`` takes its statuses from ``RunStatus``: the ends an
    execution writes and the cancel it may find, with their log levels."""
    statuses = {outcome: outcome.status for outcome in models.Outcome if outcome.status is not None}
    assert set(statuses.values()) == {*models.EXECUTION_ENDS, models.CANCELLED}
    for outcome, status in statuses.items():
        assert outcome.value == status.value and outcome.log_level == status.log_level
    assert {outcome for outcome in models.Outcome if outcome.status is None} == {
        models.Outcome.REQUEUED, models.Outcome.RELEASED, models.Outcome.LOST, models.Outcome.UNFINISHED,
        models.Outcome.DEFERRED}
