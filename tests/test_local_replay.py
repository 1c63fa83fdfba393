"""everystep replay: a recorded run replayed in this process against its
records, writing nothing, through a read-only store; each step printed as
it is matched, the divergence named, the debugger at the first one."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from everystep import schedule
from everystep.models import COMPLETED, FAILED
from everystep.store import Store, connect
from tests.apps import patch_bad, patch_v1, repair_v1
from tests.support.cli import run_in_process
from tests.support.deploys import deploy
from tests.support.runs import execute_run

pytestmark = [pytest.mark.timeout(120)]

ORDER = {"sku": "A-1", "amount": 30}



@pytest.fixture(autouse=True)
def _first_release() -> Iterator[None]:
    deploy(patch_v1)
    deploy(repair_v1)
    yield
    deploy(patch_v1)


def completed(store: Store) -> str:
    run = schedule(patch_v1.order, ORDER, database=store)
    assert execute_run(store, run.id) == COMPLETED
    return run.id


def replay(url: str, env: dict[str, str], cwd: Path, *args: str, app: str = "tests.apps.patch_v1") -> tuple[int, str]:
    done = run_in_process(["replay", *args, "--database", url, "--app", app], env, cwd)
    return done.returncode, done.stdout + done.stderr


def test_a_completed_run_replays_step_by_step(store: Store, db_url: str, subprocess_env: dict[str, str],
                                              tmp_path: Path) -> None:
    run_id = completed(store)
    before = [(s.step_id, s.status, s.completed_at) for s in store.get_steps(run_id)]
    code, out = replay(db_url, subprocess_env, tmp_path, run_id)
    assert code == 0, out
    for step_id, name in (("1", "patch.reserve"), ("2", "patch.charge"), ("3", "patch.ship"), ("4", "patch.notify")):
        assert any(line.startswith(f"step {step_id} ") and name in line and "recorded done" in line
                   for line in out.splitlines()), out
    assert "every step it needs is recorded" in out
    assert [(s.step_id, s.status, s.completed_at) for s in store.get_steps(run_id)] == before
    assert store.get_run(run_id).status == COMPLETED


def test_a_diverged_run_names_the_divergence(store: Store, db_url: str, subprocess_env: dict[str, str],
                                             tmp_path: Path) -> None:
    run_id = completed(store)
    deploy(patch_bad)
    code, out = replay(db_url, subprocess_env, tmp_path, run_id, app="tests.apps.patch_bad")
    assert code == 1, out
    (line,) = [line for line in out.splitlines() if "DIVERGES: the run recorded" in line]
    assert line.startswith("step 2 ") and "'patch.charge'" in line and "'patch.tax'" in line


def test_a_failed_run_replays_its_failure(store: Store, db_url: str, subprocess_env: dict[str, str],
                                          tmp_path: Path) -> None:
    run = schedule(repair_v1.order, ORDER, database=store)
    assert execute_run(store, run.id) == FAILED
    code, out = replay(db_url, subprocess_env, tmp_path, run.id, app="tests.apps.repair_v1")
    assert code == 0, out
    assert "replays the failure the run recorded" in out and "recorded failed: builtins.ValueError" in out


def test_until_step_and_the_debugger(store: Store, db_url: str, subprocess_env: dict[str, str], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = completed(store)
    code, out = replay(db_url, subprocess_env, tmp_path, run_id, "--until-step", "3")
    assert code == 0 and "stopped at step 3" in out and "recorded done" in out
    assert not any(line.startswith("step 4 ") for line in out.splitlines())
    deploy(patch_bad)
    monkeypatch.setattr("sys.stdin", io.StringIO("p o['sku']\nc\n"))
    code, out = replay(db_url, subprocess_env, tmp_path, run_id, "--pdb", app="tests.apps.patch_bad")
    assert code == 1
    assert "(Pdb)" in out and "'A-1'" in out  # stopped in the body, its arguments at hand
    assert "patch_bad.py" in out


@pytest.mark.backends("postgres")
def test_replay_under_a_select_only_role(pg_url: str, subprocess_env: dict[str, str], tmp_path: Path) -> None:
    store = connect(pg_url)
    try:
        run_id = completed(store)
    finally:
        store.close()
    role = f"everystep_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'reader'").format(sql.Identifier(role)))
        database = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(database),
                                                                           sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {}").format(sql.Identifier(role)))
    parts = urlsplit(pg_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    reader_url = urlunsplit(parts._replace(netloc=f"{quote(role)}:reader@{host}"))
    try:
        with psycopg.connect(reader_url, autocommit=True) as reader:  # the role really cannot write
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader.execute("UPDATE everystep_workflow SET status = status")
        code, out = replay(reader_url, subprocess_env, tmp_path, run_id)
        assert code == 0, out
        assert "every step it needs is recorded" in out
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_the_engines_own_steps_are_printed_as_they_are_matched(store: Store, db_url: str,
                                                                 subprocess_env: dict[str, str],
                                                                 tmp_path: Path) -> None:
    """set_event, recv (with its payload, or the wait it is in), start and a
    child's result are recorded steps like any other: each gets its line."""
    from everystep import send
    from everystep.models import Outcome
    from tests.apps import waits

    def lines(run_id: str) -> dict[str, str]:
        code, out = replay(db_url, subprocess_env, tmp_path, run_id, app="tests.apps.waits")
        assert code == 0, out
        return {line.split()[1]: line for line in out.splitlines() if line.startswith("step ")}

    run = schedule(waits.checkout, "o-1", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    waiting = lines(run.id)
    assert "everystep.set_event" in waiting["1"] and "recorded done" in waiting["1"]
    assert "everystep.recv" in waiting["2"] and 'recorded waiting for message "paid"' in waiting["2"]
    send(run.id, "paid", {"amount": 7}, database=store)
    assert execute_run(store, run.id) == COMPLETED
    done = lines(run.id)
    assert 'everystep.recv' in done["2"] and 'recorded done -> {"amount": 7}' in done["2"]
    assert "everystep.set_event" in done["3"] and "recorded done" in done["3"]
    code, out = replay(db_url, subprocess_env, tmp_path, run.id, "--until-step", "2", app="tests.apps.waits")
    assert code == 0 and "stopped at step 2 (--until-step)" in out, out
    assert "everystep.recv" in out and "--until-step: the replay stops here" in out and "amount" not in out

    parent = schedule(waits.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    assert execute_run(store, child.id) == COMPLETED
    assert execute_run(store, parent.id) == COMPLETED
    family = lines(parent.id)
    assert "everystep.start" in family["1"] and f'recorded done -> "{child.id}"' in family["1"]
    assert "everystep.child" in family["2"] and "recorded done -> 42" in family["2"]
