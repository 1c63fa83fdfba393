"""The ``everystep`` command on both backends.

Every command is driven the way an operator drives it: arguments on the
command line, the database named by ``--database``, the environment or the
default, in a working directory of its own. Commands run in the test
process (``tests/support/cli.py``) with their own environment, output and
exit code; the installed console script runs as a real process. Success is
checked in the database, not only in the output; every refusal must exit 2
with exactly one line on stderr and leave the database exactly as it was.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from everystep import SimulatedCrash, runner, schedule
from everystep.models import BLOCKED, COMPLETED, RUNNING, SCHEDULED, STEP_DONE, STEP_FAILED, STEP_STARTED
from everystep.store import Store, connect, migrations
from tests.apps import workers
from tests.apps.workers import effects
from tests.support.cli import run_in_process
from tests.support.runs import crash_at, execute_run

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(120), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.workers"
UNREACHABLE_PG = "postgresql://everystep@127.0.0.1:1/nowhere"
CLI_TIMEOUT = 90


def console_script(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the installed ``everystep`` console script in a fresh process."""
    command = [str(Path(sys.executable).parent / "everystep"), *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT)


@pytest.fixture
def cli(subprocess_env: dict[str, str], tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``everystep ARGS`` in this process, in a working directory of its own."""
    workdir = tmp_path / "cwd"
    workdir.mkdir()

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
        return run_in_process(args, env=subprocess_env if env is None else env, cwd=cwd or workdir)

    return run


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """Assert success and return stdout."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], *fragments: str, code: int = 2) -> str:
    """Assert a refusal: exit ``code`` (2: bad input; 3: database
    unreachable), nothing on stdout, exactly one line on stderr naming the
    problem. Returns that line."""
    lines = result.stderr.splitlines()
    assert result.returncode == code, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert result.stdout == ""
    assert len(lines) == 1, f"expected one line on stderr, got:\n{result.stderr}"
    assert lines[0].startswith("everystep: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


def snapshot(store: Store) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Everything in the database, for before/after comparisons."""
    runs = store.list_runs(limit=1_000_000)
    return [(run.to_dict(), [record.to_dict() for record in store.get_steps(run.id)]) for run in runs]


def make_blocked(store: Store, directory: Path) -> str:
    """A run genuinely blocked: its unsafe step (``2``, charge) crashed in the
    effect window, the run was put back in the queue and its replay found
    the ``started`` row without outcome."""
    run = schedule(workers.unsafe_flow, {"dir": str(directory)}, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    runner.fault = None
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    return run.id


# -- migrate --------------------------------------------------------------------


def test_migrate_is_idempotent_and_says_so(cli, db_url, store):
    first = ok(cli("migrate", "--database", db_url))
    second = ok(cli("migrate", "--database", db_url))
    # The fixture's database is migrated already.
    latest = migrations.latest(store.backend)
    assert first == second == f"schema is up to date (version {latest})\n"
    assert store.list_runs() == []


def applied_line(backend: str) -> str:
    names = [f"{migration.version:04d}_{migration.name}" for migration in migrations.available(backend)]
    return f"applied {', '.join(names)}; schema at version {migrations.latest(backend)}"


def test_migrate_creates_the_schema_of_a_fresh_postgres_database(cli, pg_server, subprocess_env, tmp_path):
    url = pg_server.create_database(prefix="everystep_cli_migrate")
    try:
        assert ok(cli("migrate", "--database", url)).strip() == applied_line("postgres")
        assert ok(console_script("migrate", "--database", url, env=subprocess_env, cwd=tmp_path)).strip() == \
            f"schema is up to date (version {migrations.latest('postgres')})"
        fresh = connect(url)
        try:
            assert fresh.schema_version() == migrations.latest("postgres")
            assert fresh.list_runs() == []
        finally:
            fresh.close()
    finally:
        pg_server.drop_database(url)


def test_migrate_creates_a_fresh_sqlite_file(cli, tmp_path):
    path = tmp_path / "fresh.db"
    output = ok(cli("migrate", "--database", f"sqlite:///{path}"))
    # A SQLite store migrates itself when opened, so by the time the command
    # asks, the schema is there: it says at which version.
    assert output == f"schema is up to date (version {migrations.latest('sqlite')})\n"
    fresh = connect(f"sqlite:///{path}")
    try:
        assert fresh.schema_version() == migrations.latest("sqlite")
    finally:
        fresh.close()


# -- where the database is ------------------------------------------------------


def test_default_database_is_everystep_db_in_the_working_directory(cli, subprocess_env, tmp_path):
    assert "EVERYSTEP_DATABASE_URL" not in subprocess_env
    workdir = tmp_path / "project"
    workdir.mkdir()
    run_id = ok(cli("schedule", f"{APP}.add_one", "41", "--app", APP, cwd=workdir)).strip()
    assert (workdir / "everystep.db").is_file()
    default = connect(f"sqlite:///{workdir / 'everystep.db'}")
    try:
        assert default.get_run(run_id).args == [41]
    finally:
        default.close()
    listed = json.loads(ok(cli("runs", "--json", cwd=workdir)))
    assert [run["id"] for run in listed] == [run_id]


def test_environment_variable_names_the_database(cli, subprocess_env, db_url, store):
    env = dict(subprocess_env, EVERYSTEP_DATABASE_URL=db_url)
    run_id = ok(cli("schedule", f"{APP}.add_one", "1", "--app", APP, env=env)).strip()
    assert store.get_run(run_id).status == SCHEDULED
    shown = json.loads(ok(cli("show", run_id, "--json", env=env)))
    assert shown["run"]["id"] == run_id


def test_database_option_beats_the_environment(cli, subprocess_env, db_url, store, tmp_path):
    decoy = tmp_path / "decoy.db"
    env = dict(subprocess_env, EVERYSTEP_DATABASE_URL=f"sqlite:///{decoy}")
    run_id = ok(cli("schedule", f"{APP}.add_one", "1", "--app", APP, "--database", db_url, env=env)).strip()
    assert store.get_run(run_id).args == [1]
    assert not decoy.exists()


# -- schedule -------------------------------------------------------------------

ARGS_CASES = [
    (None, []),
    ("[]", []),
    ('[1, "a", null, true]', [1, "a", None, True]),
    ("[[1, 2]]", [[1, 2]]),
    ('{"name": "web-1", "size": "m"}', [{"name": "web-1", "size": "m"}]),
    ('"text"', ["text"]),
    ("42", [42]),
    ("null", [None]),
]


def test_schedule_maps_args_json_to_positional_arguments(cli, db_url, store):
    """A JSON array is the positional arguments; any other JSON value is the
    single argument. The run replays them verbatim."""
    for text, expected in ARGS_CASES:
        extra = [] if text is None else [text]
        output = ok(cli("schedule", f"{APP}.echo", *extra, "--app", APP, "--database", db_url))
        run_id = output.strip()
        run = store.get_run(run_id)
        assert (run.name, run.status, run.args) == (f"{APP}.echo", SCHEDULED, expected), text
        assert execute_run(store, run_id) == COMPLETED
        assert store.get_run(run_id).result == expected, text


def test_schedule_decodes_tagged_values(cli, db_url, store):
    text = json.dumps([{"$es": "uuid", "v": "12345678-1234-5678-1234-567812345678"}])
    run_id = ok(cli("schedule", f"{APP}.echo", text, "--app", APP, "--database", db_url)).strip()
    assert store.get_run(run_id).args == [uuid.UUID("12345678-1234-5678-1234-567812345678")]


def test_schedule_with_idempotency_key_returns_the_existing_run(cli, db_url, store):
    common = ("--app", APP, "--database", db_url)
    first = ok(cli("schedule", f"{APP}.add_one", "1", "--idempotency-key", "order-42", *common)).strip()
    again = ok(cli("schedule", f"{APP}.add_one", "1", "--idempotency-key", "order-42", *common)).strip()
    other = ok(cli("schedule", f"{APP}.add_one", "1", "--idempotency-key", "order-43", *common)).strip()
    assert first == again != other
    runs = store.list_runs()
    assert sorted(run.id for run in runs) == sorted([first, other])
    assert store.get_run(first).idempotency_key == "order-42"


def test_schedule_count_schedules_that_many_runs(cli, db_url, store):
    output = ok(cli("schedule", f"{APP}.add_one", "7", "--count", "3", "--app", APP, "--database", db_url))
    assert len(output.splitlines()) == 1
    assert "3" in output
    runs = store.list_runs()
    assert len(runs) == 3
    assert len({run.id for run in runs}) == 3
    assert all(run.args == [7] and run.status == SCHEDULED for run in runs)


# -- runs and show --------------------------------------------------------------


def test_runs_lists_newest_first_and_filters_by_status(cli, db_url, store):
    older = schedule(workers.add_one, 1, database=store)
    newer = schedule(workers.add_one, 2, database=store)
    assert execute_run(store, older.id) == COMPLETED

    listed = json.loads(ok(cli("runs", "--json", "--database", db_url)))
    assert [(run["id"], run["status"]) for run in listed] == [(newer.id, SCHEDULED), (older.id, COMPLETED)]
    assert listed[1]["result"] == 2

    done = json.loads(ok(cli("runs", "--status", "completed", "--json", "--database", db_url)))
    assert [run["id"] for run in done] == [older.id]

    table = ok(cli("runs", "--status", "scheduled", "--database", db_url)).splitlines()
    assert table[0].split()[:3] == ["RUN", "STATUS", "WORKFLOW"]
    assert len(table) == 2
    assert table[1].split()[:3] == [newer.id, SCHEDULED, f"{APP}.add_one"]


def test_show_prints_a_run_and_its_steps(cli, db_url, store, tmp_path):
    run = schedule(workers.three_steps, {"dir": str(tmp_path)}, database=store)
    assert execute_run(store, run.id) == COMPLETED

    shown = json.loads(ok(cli("show", run.id, "--json", "--database", db_url)))
    assert shown["run"]["id"] == run.id
    assert shown["run"]["status"] == COMPLETED
    assert shown["run"]["result"] == ["one", "two", "three"]
    assert [(s["step_id"], s["status"], s["result"]) for s in shown["steps"]] == [
        ("1", STEP_DONE, "one"),
        ("2", STEP_DONE, "two"),
        ("3", STEP_DONE, "three"),
    ]
    assert shown["steps"][1]["name"] == f"{APP}.middle"

    text = ok(cli("show", run.id, "--database", db_url))
    assert re.search(rf"^run\s+{run.id}$", text, re.M)
    assert re.search(r"^status\s+completed$", text, re.M)
    assert re.search(rf"^2\s+done\s+{re.escape(APP)}\.middle\s+\"two\"$", text, re.M)


# -- requeue and resolve-step on a genuinely blocked run ------------------------------


def test_requeue_puts_a_run_parked_by_a_dead_runner_back_and_replay_blocks(cli, db_url, store, tmp_path):
    run = schedule(workers.unsafe_flow, {"dir": str(tmp_path)}, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id, claimer="dead-runner")
    runner.fault = None
    parked = store.get_run(run.id)
    assert (parked.status, parked.claimed_by) == (RUNNING, "dead-runner")
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_STARTED)]

    output = ok(cli("requeue", run.id, "--database", db_url))
    assert output.strip() == f"run {run.id} is scheduled"
    requeued = store.get_run(run.id)
    assert (requeued.status, requeued.claimed_by) == (SCHEDULED, None)
    assert [(s.step_id, s.status) for s in store.get_steps(run.id)] == [("1", STEP_DONE), ("2", STEP_STARTED)]

    assert execute_run(store, run.id) == BLOCKED
    blocked = store.get_run(run.id)
    assert blocked.error["type"] == "everystep.errors.EffectUncertain"
    assert f"everystep resolve-step {run.id} 2" in blocked.error["message"]
    assert effects(tmp_path, run.id).count("charge") == 1

    text = ok(cli("show", run.id, "--database", db_url))
    assert re.search(r"^status\s+blocked$", text, re.M)
    assert re.search(r"^error\s+everystep\.errors\.EffectUncertain: ", text, re.M)
    assert re.search(rf"^2\s+started \(effect uncertain\)\s+{re.escape(APP)}\.charge", text, re.M)


def test_resolve_step_result_records_the_value_and_reschedules(cli, db_url, store, tmp_path):
    run_id = make_blocked(store, tmp_path)
    output = ok(cli("resolve-step", run_id, "2", "--result", '{"receipt": "manual-7"}', "--database", db_url))
    assert run_id in output and "scheduled" in output
    run = store.get_run(run_id)
    assert (run.status, run.error, run.completed_at, run.claimed_by) == (SCHEDULED, None, None, None)
    recorded = {s.step_id: s for s in store.get_steps(run_id)}
    assert (recorded["2"].status, recorded["2"].result) == (STEP_DONE, {"receipt": "manual-7"})

    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result == {"charged": True, "receipt": {"receipt": "manual-7"}}
    assert effects(tmp_path, run_id).count("charge") == 1


def test_resolve_step_error_records_a_failure_that_durable_cleanup_sees(cli, db_url, store, tmp_path):
    run_id = make_blocked(store, tmp_path)
    ok(cli("resolve-step", run_id, "2", "--error", "card declined", "--database", db_url))
    run = store.get_run(run_id)
    assert (run.status, run.error) == (SCHEDULED, None)
    recorded = {s.step_id: s for s in store.get_steps(run_id)}
    assert recorded["2"].status == STEP_FAILED
    assert recorded["2"].error["type"] == "everystep.errors.StepFailure"
    assert recorded["2"].error["message"] == "card declined"

    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result == {"charged": False, "reason": "card declined"}
    events = effects(tmp_path, run_id)
    assert events.count("charge") == 1
    assert events.count("refund:card declined") == 1


def test_resolve_step_discard_runs_the_step_again(cli, db_url, store, tmp_path):
    run_id = make_blocked(store, tmp_path)
    ok(cli("resolve-step", run_id, "2", "--discard", "--database", db_url))
    assert store.get_run(run_id).status == SCHEDULED
    assert [s.step_id for s in store.get_steps(run_id)] == ["1"]

    assert execute_run(store, run_id) == COMPLETED
    assert store.get_run(run_id).result == {"charged": True, "receipt": {"receipt": "r-1"}}
    assert effects(tmp_path, run_id).count("charge") == 2


# -- refusals ---------------------------------------------------------------------


@dataclass
class Scene:
    db_url: str
    scheduled: str
    completed: str
    blocked: str


@pytest.fixture
def scene(db_url: str, store: Store, tmp_path: Path) -> Scene:
    """A database with one run in each state an operator might mistype."""
    scheduled = schedule(workers.add_one, 1, database=store).id
    completed = schedule(workers.add_one, 2, database=store).id
    assert execute_run(store, completed) == COMPLETED
    blocked = make_blocked(store, tmp_path)
    return Scene(db_url, scheduled, completed, blocked)


UNKNOWN_ID = "01900000-0000-7000-8000-000000000000"

REFUSALS: dict[str, tuple[Callable[[Scene], list[str]], tuple[str, ...]]] = {
    "show-unknown-run": (lambda s: ["show", UNKNOWN_ID], ("no run with id",)),
    "show-malformed-run-id": (lambda s: ["show", "not-a-run"], ("no run with id", "not-a-run")),
    "requeue-unknown-run": (lambda s: ["requeue", UNKNOWN_ID], ("no run with id",)),
    "requeue-malformed-run-id": (lambda s: ["requeue", "12;drop table"], ("no run with id",)),
    "requeue-completed-run": (lambda s: ["requeue", s.completed], ("completed", "not running")),
    "requeue-scheduled-run": (lambda s: ["requeue", s.scheduled], ("scheduled", "not running")),
    "requeue-blocked-run": (lambda s: ["requeue", s.blocked], ("blocked", "not running")),
    "resolve-unknown-run": (lambda s: ["resolve-step", UNKNOWN_ID, "2", "--discard"], ("no run with id",)),
    "resolve-malformed-run-id": (lambda s: ["resolve-step", "xyz", "2", "--discard"], ("no run with id",)),
    "resolve-scheduled-run": (
        lambda s: ["resolve-step", s.scheduled, "1", "--discard"], ("scheduled", "not blocked"),
    ),
    "resolve-completed-run": (
        lambda s: ["resolve-step", s.completed, "1", "--result", "2"], ("completed", "not blocked"),
    ),
    "resolve-done-step": (lambda s: ["resolve-step", s.blocked, "1", "--discard"], ("done", "not started")),
    "resolve-missing-step": (lambda s: ["resolve-step", s.blocked, "9", "--discard"], ("no step '9'",)),
    "resolve-bad-result-json": (
        lambda s: ["resolve-step", s.blocked, "2", "--result", "{receipt"], ("--result", "not valid JSON"),
    ),
    "resolve-conflicting-options": (
        lambda s: ["resolve-step", s.blocked, "2", "--result", "1", "--discard"], ("not allowed with",),
    ),
    "resolve-no-option": (lambda s: ["resolve-step", s.blocked, "2"], ("one of the arguments",)),
    "schedule-unknown-workflow": (
        lambda s: ["schedule", f"{APP}.nope", "1", "--app", APP], ("unknown workflow", f"{APP}.nope"),
    ),
    "schedule-missing-app-module": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--app", "tests.apps.no_such_module"],
        ("cannot import", "tests.apps.no_such_module"),
    ),
    "schedule-bad-json": (
        lambda s: ["schedule", f"{APP}.add_one", "[1,", "--app", APP], ("ARGS_JSON", "not valid JSON"),
    ),
    "schedule-unknown-tag": (
        lambda s: ["schedule", f"{APP}.add_one", '[{"$es": "nope", "v": 1}]', "--app", APP],
        ("ARGS_JSON", "not valid JSON"),
    ),
    "schedule-count-zero": (lambda s: ["schedule", f"{APP}.add_one", "1", "--count", "0", "--app", APP], ("--count",)),
    "schedule-count-negative": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--count", "-3", "--app", APP], ("--count",),
    ),
    "schedule-count-not-a-number": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--count", "many", "--app", APP], ("--count",),
    ),
    "schedule-count-with-idempotency-key": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--count", "2", "--idempotency-key", "k", "--app", APP],
        ("--idempotency-key", "--count"),
    ),
    "schedule-empty-idempotency-key": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--idempotency-key", "", "--app", APP],
        ("--idempotency-key", "empty"),
    ),
    "schedule-count-with-empty-idempotency-key": (
        lambda s: ["schedule", f"{APP}.add_one", "1", "--count", "3", "--idempotency-key", "", "--app", APP],
        ("--idempotency-key",),
    ),
    "runs-unknown-status": (lambda s: ["runs", "--status", "done"], ("invalid choice",)),
    "runs-zero-limit": (lambda s: ["runs", "--limit", "0"], ("--limit",)),
    "worker-zero-pool": (lambda s: ["worker", "--pool", "0", "--app", APP], ("pool",)),
    "worker-zero-poll": (lambda s: ["worker", "--poll", "0", "--app", APP], ("poll",)),
    "unknown-command": (lambda s: ["destroy"], ("invalid choice",)),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_input_exits_2_with_one_line_and_leaves_the_database_untouched(cli, scene, store, case):
    build, fragments = REFUSALS[case]
    before = snapshot(store)
    refused(cli(*build(scene), "--database", scene.db_url), *fragments)
    assert snapshot(store) == before


def test_schedule_without_app_is_refused_by_a_fresh_process(scene, store, subprocess_env, tmp_path):
    """Only a process that never imported the app shows what ``--app`` is for."""
    before = snapshot(store)
    refused(console_script("schedule", f"{APP}.add_one", "1", "--database", scene.db_url, env=subprocess_env,
                           cwd=tmp_path), "unknown workflow", "--app")
    assert snapshot(store) == before


UNREACHABLE_COMMANDS = {
    "migrate": ["migrate"],
    "schedule": ["schedule", f"{APP}.add_one", "1", "--app", APP],
    "runs": ["runs"],
    "show": ["show", UNKNOWN_ID],
    "requeue": ["requeue", UNKNOWN_ID],
    "resolve-step": ["resolve-step", UNKNOWN_ID, "1", "--discard"],
    "worker": ["worker", "--app", APP, "--poll", "0.05", "--name", "w"],
}


@pytest.mark.parametrize("command", list(UNREACHABLE_COMMANDS))
def test_unreachable_database_exits_3_with_one_line(cli, command):
    line = refused(cli(*UNREACHABLE_COMMANDS[command], "--database", UNREACHABLE_PG), code=3)
    assert "unavailable" in line
    assert "127.0.0.1" in line


def test_unreachable_database_from_the_environment_exits_3(cli, subprocess_env):
    env = dict(subprocess_env, EVERYSTEP_DATABASE_URL=UNREACHABLE_PG)
    refused(cli("runs", env=env), "unavailable", code=3)


def test_sqlite_path_in_a_missing_directory_is_refused_and_nothing_is_created(cli, tmp_path):
    missing = tmp_path / "no" / "such" / "dir"
    refused(cli("runs", "--database", f"sqlite:///{missing / 'x.db'}"), "directory does not exist")
    assert not (tmp_path / "no").exists()


def test_sqlite_path_that_is_a_directory_is_refused(cli, tmp_path):
    refused(cli("migrate", "--database", f"sqlite:///{tmp_path}"), "is a directory")


def test_sqlite_file_that_is_not_a_database_is_refused_and_left_alone(cli, tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    before = path.read_bytes()
    refused(cli("runs", "--database", f"sqlite:///{path}"), "not a database")
    assert path.read_bytes() == before


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("sqlite://relative.db", "bad SQLite URL"),
        ("sqlite:///:memory:", "in-memory"),
        ("oracle://localhost/db", "unsupported database URL"),
        ("mysql://localhost", "name one database"),
    ],
)
def test_malformed_database_url_is_refused(cli, url, fragment):
    refused(cli("runs", "--database", url), fragment)
