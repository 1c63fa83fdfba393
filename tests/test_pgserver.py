"""The test-server helper must be trustworthy before anything is tested with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

try:
    from tests.support.pgserver import PgServer, start_server
except ImportError:  # tests/ itself on sys.path (pytest rootdir insertion)
    from support.pgserver import PgServer, start_server  # type: ignore[no-redef]

# An unset variable, so these tests always exercise a cluster of their own
# even when the suite is pointed at an external server.
NO_ENV = "EVERYSTEP_PGSERVER_TEST_NEVER_SET"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    srv = start_server(env_var=NO_ENV)
    try:
        yield srv
    finally:
        srv.close()


def query_one(url: str, query: str) -> object:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def database_exists(server: PgServer, name: str) -> bool:
    with psycopg.connect(server.admin_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,))
        return row.fetchone() == (1,)


def test_starts_owned_cluster_on_loopback(server: PgServer) -> None:
    assert server.owned
    assert server.admin_url.startswith("postgresql://")
    assert "@127.0.0.1:" in server.admin_url
    assert server.admin_url.endswith("/postgres")
    assert query_one(server.admin_url, "SELECT 1") == 1
    assert query_one(server.admin_url, "SHOW fsync") == "off"
    assert query_one(server.admin_url, "SHOW max_connections") == "300"


def test_create_database_gives_fresh_connectable_database(server: PgServer) -> None:
    first = server.create_database()
    second = server.create_database(prefix="other")
    assert first != second
    name = query_one(first, "SELECT current_database()")
    assert isinstance(name, str) and name.startswith("everystep_test_")
    assert query_one(first, "SELECT 1") == 1
    assert str(query_one(second, "SELECT current_database()")).startswith("other_")
    server.drop_database(first)
    server.drop_database(second)


def test_drop_database_despite_open_connections(server: PgServer) -> None:
    url = server.create_database()
    name = str(query_one(url, "SELECT current_database()"))
    leaked = psycopg.connect(url)
    try:
        server.drop_database(url)
        assert not database_exists(server, name)
        with pytest.raises(psycopg.OperationalError):
            leaked.execute("SELECT 1")
    finally:
        leaked.close()
    server.drop_database(name)  # already gone: no error


def test_drop_database_by_name(server: PgServer) -> None:
    url = server.create_database()
    name = str(query_one(url, "SELECT current_database()"))
    server.drop_database(name)
    assert not database_exists(server, name)


def test_refuses_to_drop_admin_database(server: PgServer) -> None:
    with pytest.raises(ValueError):
        server.drop_database(server.admin_url)


def test_restart_keeps_data_and_port(server: PgServer) -> None:
    url = server.create_database()
    with psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (42)")
    before = query_one(server.admin_url, "SELECT pg_postmaster_start_time()")
    server.restart()
    after = query_one(server.admin_url, "SELECT pg_postmaster_start_time()")
    assert after != before
    assert query_one(url, "SELECT x FROM t") == 42
    server.drop_database(url)


def test_stop_then_start(server: PgServer) -> None:
    server.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.admin_url, connect_timeout=2)
    server.stop()  # already stopped: no error
    server.start()
    server.start()  # already running: no error
    assert query_one(server.admin_url, "SELECT 1") == 1


def test_kill_then_start_recovers(server: PgServer) -> None:
    url = server.create_database()
    with psycopg.connect(url) as conn:
        # The cluster runs with synchronous_commit=off; a commit that must
        # survive a crash has to ask for it.
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE t (x int)")
        conn.execute("INSERT INTO t VALUES (7)")
    victim = psycopg.connect(url)
    victim.execute("SELECT 1")

    server.kill()
    with pytest.raises(psycopg.OperationalError):
        victim.execute("SELECT 1")
    victim.close()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.admin_url, connect_timeout=2)

    server.start()
    assert query_one(url, "SELECT x FROM t") == 7
    server.kill()
    server.kill()  # nothing left to kill: no error
    server.restart()
    assert query_one(server.admin_url, "SELECT 1") == 1
    server.drop_database(url)


def test_external_server_is_used_but_not_controlled(
    server: PgServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(NO_ENV, server.admin_url)
    external = start_server(env_var=NO_ENV)
    assert not external.owned
    assert external.admin_url == server.admin_url
    url = external.create_database()
    assert query_one(url, "SELECT 1") == 1
    external.drop_database(url)
    for action in (external.stop, external.start, external.restart, external.kill):
        with pytest.raises(RuntimeError):
            action()
    external.close()  # no-op
    assert query_one(server.admin_url, "SELECT 1") == 1


def test_url_for_urls_and_keyword_dsns() -> None:
    srv = PgServer("postgresql://bob:s%40cret@db.example:6543/postgres?sslmode=disable")
    assert srv.url_for("x y") == "postgresql://bob:s%40cret@db.example:6543/x%20y?sslmode=disable"
    kv = PgServer("host=127.0.0.1 port=5433 dbname=postgres")
    assert psycopg.conninfo.conninfo_to_dict(kv.url_for("app")) == {
        "host": "127.0.0.1",
        "port": "5433",
        "dbname": "app",
    }


def test_close_removes_data_directory() -> None:
    srv = start_server(env_var=NO_ENV)
    datadir = Path(str(query_one(srv.admin_url, "SHOW data_directory")))
    assert datadir.is_dir()
    srv.close()
    assert not datadir.exists()
    assert not datadir.parent.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(srv.admin_url, connect_timeout=2)
    srv.close()  # idempotent
