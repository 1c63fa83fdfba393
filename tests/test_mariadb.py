"""What is specific to the MariaDB backend: its URLs, migrations serialised
by GET_LOCK, claims that skip locked rows instead of waiting on them, the
caller's own PyMySQL transaction, errors, and a supervisor executing runs
end to end on it as real processes. (The engine modules run on MariaDB
through the ``db_url`` fixture.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pymysql = pytest.importorskip("pymysql", reason="the MariaDB backend's driver (pip install -e '.[test]')")

from everystep import schedule  # noqa: E402
from everystep.errors import EverystepError, SchemaMissing, StoreUnavailable  # noqa: E402
from everystep.models import COMPLETED  # noqa: E402
from everystep.store import connect, migrations  # noqa: E402
from everystep.store.mariadb import MariaDBStore, connect_args  # noqa: E402
from tests.apps import supervised  # noqa: E402
from tests.apps.supervised import effect_lines  # noqa: E402
from tests.support.mariadbserver import MariaDBServer  # noqa: E402
from tests.support.supervisor import supervisors  # noqa: E402,F401

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def fresh_url(mariadb_server: MariaDBServer) -> Iterator[str]:
    """A database of its own, without everystep's tables."""
    url = mariadb_server.create_database("everystep_fresh")
    try:
        yield url
    finally:
        mariadb_server.drop_database(url)


def raw(url: str, autocommit: bool = False) -> pymysql.connections.Connection[Any]:
    return pymysql.connect(**connect_args(url), autocommit=autocommit)


# -- URLs ------------------------------------------------------------------------------------


def test_mariadb_and_mysql_urls_open_the_same_backend() -> None:
    for url in ("mariadb://u:p%40ss@db.example:3307/prod", "mysql://u:p%40ss@db.example:3307/prod",
                "mysql+pymysql://u:p%40ss@db.example:3307/prod"):
        store = connect(url)
        assert isinstance(store, MariaDBStore)
        assert store.connect_args == {"host": "db.example", "port": 3307, "user": "u", "password": "p@ss",
                                      "database": "prod"}
        assert "p%40ss" not in store.describe() and store.describe().endswith("@db.example:3307/prod")
    assert connect_args("mariadb://localhost/db?unix_socket=/run/mysqld/mysqld.sock")["unix_socket"] == (
        "/run/mysqld/mysqld.sock")


@pytest.mark.parametrize("url, why", [
    ("mariadb://root@127.0.0.1:3306", "name one database"),
    ("mariadb://root@127.0.0.1:3306/", "name one database"),
    ("mariadb://root@127.0.0.1:port/db", "the port is not a number"),
])
def test_a_bad_url_is_one_line_naming_the_fix(url: str, why: str) -> None:
    with pytest.raises(EverystepError, match=why) as refused:
        connect(url)
    assert "\n" not in str(refused.value)


def test_an_unreachable_server_is_unavailable_not_a_crash() -> None:
    store = connect("mariadb://root@127.0.0.1:1/nothing", statement_timeout=2)
    with pytest.raises(StoreUnavailable, match="unavailable"):
        store.ping()


def test_a_database_without_the_schema_says_to_migrate(fresh_url: str) -> None:
    with pytest.raises(SchemaMissing, match="everystep migrate"):
        connect(fresh_url).get_run("01a23004-f17d-760a-9e48-bf56963a8fa2")


# -- migrations --------------------------------------------------------------------------------


def test_concurrent_migrators_apply_each_version_once(fresh_url: str) -> None:
    """DDL commits at once on MariaDB: only GET_LOCK keeps two migrators
    from applying a version twice (the second CREATE TABLE or ADD COLUMN
    would not fail: the files are written to be re-run)."""
    stores = [MariaDBStore(fresh_url) for _ in range(4)]
    applied: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def migrate(store: MariaDBStore) -> None:
        barrier.wait()
        try:
            applied.append(store.migrate())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    everything = [name for names in applied for name in names]
    expected = [f"{m.version:04d}_{m.name}" for m in migrations.available("mariadb")]
    assert sorted(everything) == expected, applied
    with raw(fresh_url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT version FROM everystep_migration ORDER BY version")
        assert [row[0] for row in cursor.fetchall()] == [m.version for m in migrations.available("mariadb")]
    assert stores[0].schema_version() == migrations.latest("mariadb")


def test_every_backend_numbers_its_migrations_alike() -> None:
    def numbered(backend: str) -> list[int]:
        return [migration.version for migration in migrations.available(backend)]

    assert numbered("mariadb") == numbered("postgres") == numbered("sqlite")


# -- claims --------------------------------------------------------------------------------------


def test_concurrent_claimers_never_claim_a_run_twice(mariadb_url: str) -> None:
    store = connect(mariadb_url)
    scheduled = {schedule(supervised.tiny, {"dir": "/nowhere"}, database=store).id for _ in range(120)}
    claimed: dict[str, list[str]] = {}
    barrier = threading.Barrier(4)

    def claimer(name: str) -> None:
        own = MariaDBStore(mariadb_url)
        mine = claimed.setdefault(name, [])
        barrier.wait()
        while batch := own.claim(name, 3, [supervised.tiny.name]):
            mine.extend(run.id for run in batch)
        own.close()

    threads = [threading.Thread(target=claimer, args=(f"claimer-{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    everything = [run_id for ids in claimed.values() for run_id in ids]
    assert sorted(everything) == sorted(scheduled)  # every run once: none twice, none left
    assert {run.claimed_by for run in store.list_runs(limit=200)} == set(claimed) - {
        name for name, ids in claimed.items() if not ids}


def test_a_claim_skips_runs_locked_by_another_transaction_instead_of_waiting(mariadb_url: str) -> None:
    """Two runs held under operator commands' row locks: with a one-second
    lock wait, a claim that waited on them would fail; SKIP LOCKED takes
    the others at once, and the held ones once they are released."""
    store = connect(mariadb_url)
    runs = [schedule(supervised.tiny, {"dir": "/nowhere"}, database=store) for _ in range(4)]
    impatient = MariaDBStore(mariadb_url, statement_timeout=1)
    with store.locked_run(runs[0].id), store.locked_run(runs[1].id):
        taken = {run.id for run in impatient.claim("impatient", 10, [supervised.tiny.name])}
    assert taken == {runs[2].id, runs[3].id}
    assert {run.id for run in impatient.claim("later", 10, [supervised.tiny.name])} == {runs[0].id, runs[1].id}


# -- the caller's transaction ------------------------------------------------------------------


def test_schedule_joins_the_callers_pymysql_transaction(mariadb_url: str) -> None:
    store = connect(mariadb_url)
    conn = raw(mariadb_url)
    try:
        gone = schedule(supervised.tiny, {"dir": "/x"}, conn=conn, idempotency_key="rolled-back")
        conn.rollback()
        assert store.list_runs() == []
        kept = schedule(supervised.tiny, {"dir": "/x"}, conn=conn, idempotency_key="committed")
        assert store.list_runs() == []  # not visible before the caller commits
        again = schedule(supervised.tiny, {"dir": "/x"}, conn=conn, idempotency_key="committed")
        conn.commit()
    finally:
        conn.close()
    assert again.id == kept.id != gone.id
    assert [run.id for run in store.list_runs()] == [kept.id]


# -- a supervisor on MariaDB ---------------------------------------------------------------------


def test_a_burst_supervisor_executes_runs_end_to_end(mariadb_url: str, supervisors: Any, tmp_path: Path) -> None:
    store = connect(mariadb_url)
    runs = [schedule(supervised.tiny, {"dir": str(tmp_path)}, database=store) for _ in range(6)]
    sup = supervisors(mariadb_url, procs=2, args=["--burst", "--poll", "0.05"]).spawn()
    code = sup.wait(timeout=120)
    output = sup.log()
    assert code == 0, output
    assert all(store.get_run(run.id).status == COMPLETED for run in runs), output
    assert "done: 6 runs" in output, output
    pids = {store.get_run(run.id).result for run in runs}
    assert sup.pid not in pids  # executed by its children, not by the parent
    assert len(effect_lines(tmp_path)) == 6


# -- values the schema must keep whole ---------------------------------------------------------


def test_long_idempotency_keys_are_kept_whole(mariadb_url: str) -> None:
    """Uniqueness is on a digest of (name, key): two keys that share a long
    prefix are two runs, and the same long key is one."""
    store = connect(mariadb_url)
    prefix = "k" * 1000
    first = schedule(supervised.tiny, {"dir": "/x"}, database=store, idempotency_key=prefix + "1")
    second = schedule(supervised.tiny, {"dir": "/x"}, database=store, idempotency_key=prefix + "2")
    again = schedule(supervised.tiny, {"dir": "/x"}, database=store, idempotency_key=prefix + "1")
    assert first.id != second.id and again.id == first.id
    assert store.get_run(first.id).idempotency_key == prefix + "1"
    other = schedule(supervised.gated_flow, {"dir": "/x"}, database=store, idempotency_key=prefix + "1")
    assert other.id != first.id  # keys are per workflow


def test_a_name_too_long_to_store_is_refused_not_cut(mariadb_url: str) -> None:
    store = connect(mariadb_url)
    with pytest.raises(EverystepError, match="MariaDB stores at most 255") as refused:
        store.schedule("w" * 300, "[]")
    assert "\n" not in str(refused.value)
    assert store.list_runs() == []


def test_a_migration_cut_off_half_way_is_finished_by_the_next(fresh_url: str) -> None:
    """DDL commits at once: a migrator that died after a migration's
    statements and before its version row leaves them applied. Every file
    is written to be re-run, so the next migrate applies them again without
    error and records them."""
    store = MariaDBStore(fresh_url)
    store.migrate()
    run = store.schedule("kept.across", "[1]", "key")
    with raw(fresh_url, autocommit=True) as conn, conn.cursor() as cursor:
        cursor.execute("DELETE FROM everystep_migration WHERE version >= 2")
    assert store.schema_version() == 1
    again = store.migrate()
    assert again == [f"{m.version:04d}_{m.name}" for m in migrations.available("mariadb") if m.version >= 2]
    assert store.schema_version() == migrations.latest("mariadb")
    assert store.get_run(run.id).idempotency_key == "key"
    assert store.schedule("kept.across", "[1]", "key").id == run.id


def test_every_statement_the_other_backends_name_exists_here() -> None:
    """The base Store calls statements by name: MariaDB's file answers every
    name PostgreSQL's does, save PostgreSQL's own (LISTEN for runners and for
    stream readers, NOTIFY, its
    advisory lock, its expired-runner CTE, its one-statement recv and the
    asynchronous commit of a recv's transaction: here the transaction does
    both; and its statements carrying a patch marker: here a marker is
    record_marker in the transaction of the write it goes with)."""
    from everystep.store import queries

    own = {"listen", "listen_streams", "notify_fenced", "recover_expired", "take_message", "async_commit",
           "finish_run_with_step_marked", "record_step_marked"}
    missing = set(queries.load("postgres")) - set(queries.load("mariadb")) - own
    assert not missing


def test_a_hosts_own_pymysql_connection_migrates_and_reads(fresh_url: str) -> None:
    """What a host framework does through its own connection (the connection
    provider): migrate, schedule, read back; the connection is left open."""
    from everystep.store import borrowed

    conn = raw(fresh_url, autocommit=True)
    try:
        applied = borrowed.migrate(conn)
        assert applied == [f"{m.version:04d}_{m.name}" for m in migrations.available("mariadb")]
        assert borrowed.migrate(conn) == []
        run = borrowed.schedule(conn, supervised.tiny.name, '[{"dir": "/x"}]', None)
        assert borrowed.get_run(conn, run.id).status == "scheduled"
        assert borrowed.get_steps(conn, run.id) == []
        assert conn.open
    finally:
        conn.close()


def test_a_throwaway_server_starts_serves_and_leaves_nothing(tmp_path: Path) -> None:
    """Where no server answers, the suite starts its own from the local
    mariadbd (CI installs mariadb-server when it has neither)."""
    import shutil

    from tests.support.mariadbserver import _start_throwaway

    binary = shutil.which("mariadbd") or ("/usr/sbin/mariadbd" if Path("/usr/sbin/mariadbd").exists() else None)
    if binary is None:
        pytest.skip("no mariadbd binary here")
    server, why = _start_throwaway(binary)
    assert server is not None, why
    base = server._base
    try:
        url = server.create_database()
        store = connect(url)
        store.migrate()
        run = store.schedule("throwaway.flow", "[]")
        assert store.get_run(run.id).status == "scheduled"
        store.close()
        server.drop_database(url)
    finally:
        server.close()
    assert base is not None and not base.exists()
