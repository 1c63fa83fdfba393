"""PostgreSQL as production runs it, beyond a superuser's direct connection
(docs/how-to/databases.md, "Production shapes"): a role that owns its
database and nothing more, TLS, a read replica for the console and
``everystep replay``, and statement timeouts through every kind of
connection. Real servers throughout: a private cluster with TLS turned on,
a streaming hot standby, PgBouncer.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from everystep import runner, schedule
from everystep.errors import StoreUnavailable
from everystep.models import CANCELLED, COMPLETED, SCHEDULED
from everystep.store import connect
from tests.apps.pooled import hops
from tests.support.cli import run_in_process
from tests.support.console import serve
from tests.support.pgbouncer import PgBouncer
from tests.support.pgreplica import enable_tls, start_replica, wait_replayed
from tests.support.pgserver import PgServer, start_server
from tests.support.runs import claim_run
from tests.support.supervisor import Supervisor, supervisors  # noqa: F401
from tests.support.waiting import wait_until

pytestmark = pytest.mark.timeout(300)

APP = "tests.apps.pooled"


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{quote(user)}@{parts.netloc.rsplit('@', 1)[-1]}"))


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{quote(name)}"))


def run_to_completion(store: Any, run_id: str) -> None:
    run = claim_run(store, run_id)
    assert runner.execute_guarded(store, run, claimer="tester") == COMPLETED


# -- a role that owns its database ---------------------------------------------------------


@pytest.fixture
def owned_database(pg_server: PgServer) -> Iterator[tuple[str, str]]:
    """A login role with no privilege beyond owning a fresh database: (its
    name, the database's URL as that role)."""
    role = f"everystep_app_{uuid.uuid4().hex[:8]}"
    database = f"everystep_owned_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE").format(
            sql.Identifier(role)))
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(role)))
    try:
        yield role, with_user(with_database(pg_server.admin_url, database), role)
    finally:
        pg_server.drop_database(database)
        with psycopg.connect(pg_server.admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.mark.parametrize("through", ["direct", "pgbouncer"])
def test_a_role_that_owns_its_database_migrates_and_runs(owned_database: tuple[str, str], through: str,
                                                         request: pytest.FixtureRequest, supervisors: Any,
                                                         subprocess_env: dict[str, str], tmp_path: Path) -> None:
    role, url = owned_database
    if through == "pgbouncer":
        bouncer: PgBouncer = request.getfixturevalue("pgbouncer_transaction")
        bouncer.add_user(role)
        url = bouncer.url_for(url)
    migrated = run_in_process(["migrate", "--database", url], subprocess_env, tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    store = connect(url)
    runs = [schedule(hops, 3, database=store) for _ in range(20)]
    supervisor: Supervisor = supervisors(url, app=APP, procs=2, args=["--burst"])
    supervisor.spawn()
    assert supervisor.wait(timeout=180) == 0, supervisor.log()
    assert {store.get_run(run.id).status for run in runs} == {COMPLETED}


# -- TLS --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[PgServer, Path]]:
    server = start_server(env_var="EVERYSTEP_NO_EXTERNAL_SERVER_FOR_TLS")
    try:
        yield server, enable_tls(server)
    finally:
        server.close()


def test_tls_parameters_in_the_url_reach_libpq(tls_server: tuple[PgServer, Path], subprocess_env: dict[str, str],
                                               tmp_path: Path) -> None:
    server, root = tls_server
    url = server.create_database("everystep_tls")
    verified = f"{url}?sslmode=verify-full&sslrootcert={quote(str(root))}"
    wait_until(lambda: _ssl_works(verified), "TLS after the reload", timeout=30)
    migrated = run_in_process(["migrate", "--database", verified], subprocess_env, tmp_path)
    assert migrated.returncode == 0, migrated.stderr
    store = connect(verified)
    try:
        with store.connection() as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()["ssl"]
        run = schedule(hops, 2, database=store)
        run_to_completion(store, run.id)
        assert store.get_run(run.id).result == 2
    finally:
        store.close()
    # A certificate the server's is not signed by: refused, in one line, exit 2 (no waiting fixes it).
    other = enable_tls_root_elsewhere(tmp_path)
    refused = run_in_process(["runs", "--database", f"{url}?sslmode=verify-full&sslrootcert={quote(str(other))}"],
                             subprocess_env, tmp_path)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert "certificate verify failed" in line


def _ssl_works(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=5) as conn:
            return bool(conn.pgconn.ssl_in_use)
    except psycopg.OperationalError:
        return False


def enable_tls_root_elsewhere(tmp_path: Path) -> Path:
    """A self-signed certificate nobody's server uses."""
    import subprocess

    cert = tmp_path / "other.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(tmp_path / "other.key"), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert


# -- a read replica ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replicated() -> Iterator[tuple[PgServer, PgServer]]:
    primary = start_server(env_var="EVERYSTEP_NO_EXTERNAL_SERVER_FOR_REPLICAS")
    try:
        replica = start_replica(primary)
        try:
            yield primary, replica
        finally:
            replica.close()
    finally:
        primary.close()


@pytest.fixture
def replica_urls(replicated: tuple[PgServer, PgServer]) -> Iterator[tuple[str, str]]:
    primary, replica = replicated
    url = primary.create_database("everystep_replicated")
    connect(url).migrate()
    replica_url = replica.url_for(url.rsplit("/", 1)[-1])
    wait_replayed(primary.admin_url, replica.admin_url)
    try:
        yield url, replica_url
    finally:
        primary.drop_database(url)


def test_everystep_replay_reads_a_run_from_a_read_replica(replica_urls: tuple[str, str],
                                                           subprocess_env: dict[str, str], tmp_path: Path) -> None:
    url, replica_url = replica_urls
    store = connect(url)
    run = schedule(hops, 3, database=store)
    run_to_completion(store, run.id)
    wait_replayed(url, replica_url)
    with psycopg.connect(replica_url, autocommit=True) as standby:  # really a replica: writes are refused
        assert standby.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            standby.execute("DELETE FROM everystep_workflow")
    ro = connect(replica_url, read_only=True)
    replayed = run_in_process(["--app", APP, "replay", run.id, "--database", replica_url], subprocess_env, tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert "every step it needs is recorded" in replayed.stdout


def test_the_console_reads_its_pages_from_a_replica_and_acts_on_the_primary(replica_urls: tuple[str, str]) -> None:
    url, replica_url = replica_urls
    store = connect(url)
    shown = schedule(hops, 1, database=store)
    wait_replayed(url, replica_url)
    with psycopg.connect(replica_url, autocommit=True) as standby:
        standby.execute("SELECT pg_wal_replay_pause()")
        try:
            hidden = schedule(hops, 2, database=store)  # on the primary only while replay is paused
            for server in serve(url, read_database_url=replica_url):
                session = server.client()
                ids = {row["id"] for row in session.get("/api/runs").json()["runs"]}
                assert shown.id in ids and hidden.id not in ids  # the pages read the replica
                cancelled = session.act(f"/api/runs/{hidden.id}/cancel", {"reason": "from the console"})
                assert cancelled.status_code == 200, cancelled.text  # the action wrote to the primary
                assert store.get_run(hidden.id).status == CANCELLED
        finally:
            standby.execute("SELECT pg_wal_replay_resume()")
    wait_replayed(url, replica_url)
    assert connect(replica_url, read_only=True).get_run(hidden.id).status == CANCELLED


# -- statement timeouts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("through", ["direct", "pgbouncer session", "pgbouncer transaction"])
def test_a_statement_timeout_bounds_statements_through_every_connection(pg_url: str, through: str,
                                                                        request: pytest.FixtureRequest) -> None:
    """Direct: the ``options`` startup parameter; a session pooler: one SET
    per session; a transaction pooler: inside each transaction."""
    url = pg_url
    if through != "direct":
        bouncer: PgBouncer = request.getfixturevalue(f"pgbouncer_{through.split()[1]}")
        url = bouncer.url_for(pg_url)
    store = connect(url, statement_timeout=0.25)
    try:
        with store.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()["statement_timeout"] == "250ms"
        with pytest.raises(StoreUnavailable, match="canceling statement due to statement timeout"):
            with store.connection() as conn:
                conn.execute("SELECT pg_sleep(2)")
        run = schedule(hops, 1, database=store)
        assert store.get_run(run.id).status == SCHEDULED
    finally:
        store.close()
