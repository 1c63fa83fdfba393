"""A real streaming read replica of a test cluster, and TLS on one.

A replica is what production points its read-only tools at: a hot standby
made by ``pg_basebackup -R`` from a throwaway cluster (``PgServer`` owned
by the test) and started on a free port; it replays the primary's WAL and
refuses every write (``ReadOnlySqlTransaction``). ``enable_tls`` turns TLS
on for a running cluster with a fresh self-signed certificate for
127.0.0.1 (openssl), returning the certificate for ``sslrootcert``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.pgserver import PgServer, _Cluster
from tests.support.scrape import free_port

__all__ = ["enable_tls", "start_replica", "wait_replayed"]


def _owned(server: PgServer) -> _Cluster:
    cluster = server._cluster
    if cluster is None:
        raise RuntimeError(f"{server.admin_url} is not a cluster of the test's own")
    return cluster


def _give(path: Path, run_as: str | None, mode: int | None = None) -> None:
    if run_as is not None:
        entry = pwd.getpwnam(run_as)
        os.chown(path, entry.pw_uid, entry.pw_gid)
    if mode is not None:
        os.chmod(path, mode)


def start_replica(primary: PgServer) -> PgServer:
    """A hot standby of ``primary``, streaming from it, started."""
    source = _owned(primary)
    base = Path(tempfile.mkdtemp(prefix="everystep-pg-replica-"))
    (base / "sock").mkdir()
    for path in (base, base / "sock"):
        _give(path, source.run_as)
    replica = _Cluster(bindir=source.bindir, base=base, port=free_port(), run_as=source.run_as)
    try:
        result = replica.run(str(source.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(source.port),
                             "-U", source.superuser, "-D", str(replica.datadir), "-R", "-X", "stream",
                             "--no-sync", timeout=120)
        if result.returncode != 0:
            raise replica.failure("pg_basebackup failed", result)
        replica.start()
    except BaseException:
        replica.destroy()
        shutil.rmtree(base, ignore_errors=True)
        raise
    return PgServer(replica.url(replica.superuser), replica)


def wait_replayed(primary_url: str, replica_url: str, timeout: float = 60.0) -> None:
    """Until the replica has replayed everything the primary wrote so far.
    The target is the WAL *inserted*, not written: the test clusters commit
    asynchronously, so a commit may still sit in the WAL buffers, past the
    write position, until the WAL writer flushes it."""
    with psycopg.connect(primary_url, autocommit=True) as conn:
        (target,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()  # type: ignore[misc]
    deadline = time.monotonic() + timeout
    with psycopg.connect(replica_url, autocommit=True) as conn:
        while True:
            (caught_up,) = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",  # type: ignore[misc]
                                        (target,)).fetchone()
            if caught_up:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica did not replay up to {target} within {timeout}s")
            time.sleep(0.05)


def enable_tls(server: PgServer) -> Path:
    """Turn TLS on for ``server`` (a new self-signed certificate for
    127.0.0.1, in its data directory); returns the certificate's path, the
    root a client verifies the server by."""
    cluster = _owned(server)
    cert, key = cluster.datadir / "server.crt", cluster.datadir / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    _give(cert, cluster.run_as, 0o644)
    _give(key, cluster.run_as, 0o600)
    with psycopg.connect(server.admin_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET ssl_cert_file = 'server.crt'")
        conn.execute("ALTER SYSTEM SET ssl_key_file = 'server.key'")
        conn.execute("ALTER SYSTEM SET ssl = on")
        conn.execute("SELECT pg_reload_conf()")
    root = Path(tempfile.mkdtemp(prefix="everystep-tls-")) / "root.crt"
    shutil.copy(cert, root)
    return root
