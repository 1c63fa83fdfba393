"""Mistakes a new user makes with the ``everystep`` command, and what it
answers: exactly one line on stderr and the exit code that tells a script
what happened (2: fix the command line or the configuration; 3: the
database is away, try again later)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.cli import run_in_process
from tests.support.supervisor import supervisor_command, supervisors  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.timeout(120)]

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(subprocess_env: dict[str, str], tmp_path: Path) -> Cli:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return run_in_process(args, env=subprocess_env, cwd=tmp_path)

    return run


def refused(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """Exit ``code``, nothing on stdout, one line on stderr holding every fragment."""
    lines = result.stderr.splitlines()
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert len(lines) == 1 and lines[0].startswith("everystep: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


def _with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


# -- exit codes: a configuration the database refuses is not an outage ------------------------


def test_a_missing_database_is_a_configuration_error(cli: Cli, pg_server) -> None:
    url = pg_server.url_for("everystep_no_such_database")
    refused(cli("runs", "--database", url), 2, 'database "everystep_no_such_database" does not exist')


def test_a_missing_role_is_a_configuration_error(cli: Cli, pg_server) -> None:
    url = _with_user(pg_server.admin_url, "everystep_no_such_role")
    refused(cli("runs", "--database", url), 2, 'role "everystep_no_such_role" does not exist')


def test_an_invalid_connection_option_is_a_configuration_error(cli: Cli, pg_server) -> None:
    refused(cli("runs", "--database", pg_server.admin_url + "?sslmode=bogus"), 2, 'invalid sslmode value: "bogus"')


def test_a_server_that_does_not_answer_is_still_unreachable(cli: Cli) -> None:
    refused(cli("runs", "--database", "postgresql://everystep@127.0.0.1:1/nowhere?connect_timeout=2"), 3,
            "unavailable")


def test_check_deploy_help_lists_every_verdict_that_exits_1(cli: Cli) -> None:
    result = cli("check-deploy", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for verdict in ("code_error", "missing", "fails", "timeout"):
        assert verdict in text, text


def test_a_supervisor_refused_by_the_database_stops_with_exit_2(pg_server, subprocess_env, tmp_path: Path) -> None:
    url = pg_server.url_for("everystep_no_such_database")
    result = subprocess.run([*supervisor_command(), "--database", url, "--socket", str(tmp_path / "s.sock"),
                             "--procs", "1"], env=subprocess_env, capture_output=True, text=True, timeout=90,
                            stdin=subprocess.DEVNULL, cwd=tmp_path)
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("everystep-supervisor: error: "), result.stderr
    assert 'database "everystep_no_such_database" does not exist' in lines[0]


# -- the global options go before the command as well as after it -------------------------------


def test_global_options_before_the_command(cli: Cli, db_url: str) -> None:
    scheduled = cli("-A", "tests.apps.workers", "--database", db_url, "schedule", "tests.apps.workers.add_one", "1",
                    "--queue", "later")
    assert scheduled.returncode == 0, scheduled.stderr
    run_id = scheduled.stdout.strip()
    listed = cli("-A", "tests.apps.workers", "--database", db_url, "-l", "debug", "runs")
    assert listed.returncode == 0 and run_id in listed.stdout, listed.stderr
    paused = cli("--database", db_url, "queue", "pause", "later")
    assert (paused.returncode, paused.stdout.strip()) == (0, "queue later paused: nothing is claimed from it")


def test_an_option_after_the_command_wins_over_one_before(cli: Cli, db_url: str, tmp_path: Path) -> None:
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    scheduled = cli("--database", elsewhere, "schedule", "tests.apps.workers.add_one", "1",
                    "--database", db_url, "--app", "tests.apps.workers")
    assert scheduled.returncode == 0, scheduled.stderr
    assert scheduled.stdout.strip() in cli("runs", "--database", db_url).stdout
    assert scheduled.stdout.strip() not in cli("runs", "--database", elsewhere).stdout


# -- schedule checks the arguments against the workflow's signature -----------------------------


def test_schedule_refuses_arguments_the_workflow_cannot_take(cli: Cli, db_url: str) -> None:
    line = refused(cli("schedule", "--app", "tests.apps.workers", "tests.apps.workers.add_one", "[1,2,3,4,5]",
                       "--database", db_url), 2, "tests.apps.workers.add_one(n)", "too many positional arguments")
    assert "ARGS_JSON" in line
    assert cli("runs", "--database", db_url).stdout.count("add_one") == 0
    refused(cli("schedule", "--app", "tests.apps.workers", "tests.apps.workers.add_one", "[]",
                "--database", db_url), 2, "missing a required argument: 'n'")


def test_schedule_in_python_refuses_arguments_the_workflow_cannot_take(store) -> None:
    from everystep import WorkflowArgumentsError, schedule
    from tests.apps.workers import add_one

    with pytest.raises(WorkflowArgumentsError, match=r"add_one\(n\) cannot take 2 argument\(s\)") as caught:
        schedule(add_one, 1, 2, database=store)
    assert isinstance(caught.value, TypeError)
    assert store.list_runs() == []
    assert schedule(add_one, 1, database=store).args == [1]


# -- typos in names: refused at once ------------------------------------------------------------


def test_an_unknown_queue_is_refused_unless_created(cli: Cli, db_url: str) -> None:
    line = refused(cli("queue", "pause", "nosuchqueue", "--database", db_url), 2, "no queue named 'nosuchqueue'",
                   "--create")
    assert "default" in line  # the known queues are listed
    refused(cli("queue", "set", "nosuchqueue", "--concurrency", "2", "--database", db_url), 2,
            "no queue named 'nosuchqueue'")
    assert cli("queues", "--json", "--database", db_url).stdout.strip() == "[]"  # nothing was written
    created = cli("queue", "pause", "nosuchqueue", "--create", "--database", db_url)
    assert (created.returncode, created.stdout.strip()) == (0, "queue nosuchqueue paused: nothing is claimed from it")
    assert cli("queue", "resume", "nosuchqueue", "--database", db_url).returncode == 0  # a setting names it now


def test_a_queue_named_only_by_finished_runs_or_the_app_is_known(cli: Cli, db_url: str, store) -> None:
    from everystep import schedule
    from everystep.models import CANCELLED
    from tests.apps.workers import add_one

    run = schedule(add_one, 1, database=store, queue="nightly")
    assert cli("cancel", run.id, "--database", db_url).returncode == 0
    assert store.get_run(run.id).status == CANCELLED
    assert cli("queue", "pause", "nightly", "--database", db_url).returncode == 0
    # a queue the app's workflows declare
    assert cli("queue", "pause", "reports", "--app", "tests.apps.queued", "--database", db_url).returncode == 0


def test_remote_to_a_runner_that_is_not_live_is_refused_at_once(cli: Cli, db_url: str) -> None:
    # the default --timeout is long: a refusal that waited it out would fail the test's own timeout
    refused(cli("remote", "nosuchrunner", "status", "--database", db_url), 2,
            "no live supervisor is named 'nosuchrunner'", "live supervisors: none")


# -- small things: what the messages and tables print --------------------------------------------


def test_an_unknown_status_lists_the_plain_values(cli: Cli, tmp_path: Path) -> None:
    line = refused(cli("runs", "--status", "runing", "--database", f"sqlite:///{tmp_path / 'x.db'}"), 2,
                   "invalid choice: 'runing' (choose from 'scheduled', 'waiting', 'running',")
    assert "RunStatus" not in line


def test_a_bound_is_printed_as_a_plain_number(cli: Cli) -> None:
    refused(cli("schedule", "x", "--count", "0"), 2, "must be between 1 and 1000000")


def test_a_missing_app_module_is_named(cli: Cli, tmp_path: Path) -> None:
    line = refused(cli("--app", "ncap", "runs", "--database", f"sqlite:///{tmp_path / 'x.db'}"), 2,
                   "cannot import app module 'ncap': no module named 'ncap'")
    assert "frozen" not in line


def test_a_missing_dependency_of_the_app_names_the_line_that_imports_it(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "needs_a_dependency.py").write_text("import os\nimport everystep_no_such_dependency\n")
    line = refused(cli("--app", "needs_a_dependency", "runs", "--database", f"sqlite:///{tmp_path / 'x.db'}"), 2,
                   "No module named 'everystep_no_such_dependency'", "needs_a_dependency.py:2)")
    assert "frozen" not in line


@pytest.mark.parametrize("seconds, shown", [
    (0.0, "0s"), (9e-05, "0.09 ms"), (0.0005, "0.5 ms"), (0.0123, "12.3 ms"), (0.25, "250 ms"),
    (2.92, "2.92s"), (30.0, "30s"), (123.45, "123.5s"),
])
def test_cpu_time_is_printed_for_people(seconds: float, shown: str) -> None:
    from everystep.resources import format_cpu

    assert format_cpu(seconds) == shown


@pytest.mark.backends("sqlite", "postgres")  # processes: MariaDB runs the engine modules only
def test_a_queue_a_supervisor_claims_from_is_known(cli: Cli, db_url: str, supervisors) -> None:
    sup = supervisors(db_url, procs=1, args=["--queues", "overnight"]).start()

    def known() -> bool:
        return cli("queue", "pause", "overnight", "--database", db_url).returncode == 0

    wait_until(known, "the supervisor's --queues to be published", timeout=60, detail=sup.log)


# -- one resolver for the run a command names ----------------------------------------------------


def test_every_command_that_names_a_run_takes_a_unique_prefix_of_its_id(cli: Cli, db_url: str, store) -> None:
    """``show`` took a unique prefix where ``cancel`` said "no run with id"
    for a run that exists: every command naming one run resolves it alike.
    The commands are read from the parser, so a new one is held to it too."""
    from everystep import docgen, schedule
    from everystep.cli import build_parser
    from everystep.errors import SimulatedCrash
    from tests.apps import shapes
    from tests.support.runs import claim_run, crash_at, execute_run

    def prefix(run_id: str) -> str:
        return run_id[:23]  # past the timestamp, into the random bits: unique here

    finished = schedule(shapes.linear, "k", database=store)
    assert execute_run(store, finished.id) == "completed"
    waiting = schedule(shapes.linear, "w", database=store)
    held = claim_run(store, schedule(shapes.linear, "h", database=store).id)  # by "tester": no live runner
    blocked = schedule(shapes.payment, 5, database=store)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, blocked.id)
    assert store.requeue(store.get_run(blocked.id).claim_as("tester"))
    assert execute_run(store, blocked.id) == "blocked"
    app = ("--app", "tests.apps.shapes", "--database", db_url)

    done = {
        "show": cli("show", prefix(finished.id), *app),
        "stream": cli("stream", prefix(finished.id), *app),
        "replay": cli("replay", prefix(finished.id), *app),
        "send": cli("send", prefix(waiting.id), "go", "1", *app),
        "fork": cli("fork", prefix(finished.id), "--from-step", "2", *app),
        "cancel": cli("cancel", prefix(waiting.id), *app),
        "requeue": cli("requeue", prefix(held.id), *app),
        "resolve-step": cli("resolve-step", prefix(blocked.id), "1", "--discard", *app),
    }
    for command, result in done.items():
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert store.get_run(waiting.id).status == "cancelled"
    assert store.get_run(held.id).status == "scheduled" and store.get_run(blocked.id).status == "scheduled"
    assert [fork.forked_from for fork in store.forks_of(finished.id)] == [finished.id]
    assert f"run {finished.id} forked from {finished.id}" not in done["fork"].stdout
    assert f"forked from {finished.id} at step 2" in done["fork"].stdout  # the full id, not the prefix

    naming_a_run = {" ".join(path) for path, parser in docgen.walk(build_parser())
                    if any(action.dest == "run_id" for action in parser._actions)}
    assert naming_a_run == set(done)
