"""A real PgBouncer in front of the test cluster, for tests and benchmarks.

Most production PostgreSQL sits behind a connection pooler, so the engine
is tested through one: Debian's ``pgbouncer`` (installed by ``.ci/run``),
started on a free port in front of a ``PgServer``, in transaction or
session mode, with its stock settings but for what a throwaway instance
needs (trust authentication, the admin console, generous pool sizes for
concurrency tests). Like the test cluster, it runs as the ``postgres`` OS
user when the tests run as root (PgBouncer refuses root).

The handle can do to PgBouncer what operators and failures do: ``RECONNECT``
(every server connection closed once released), ``KILL db`` (every client
and server connection of a database dropped at once), and a restart of the
process on the same port.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from tests.support.scrape import free_port

__all__ = ["PgBouncer", "find_pgbouncer", "libpq_url", "start_pgbouncer"]

READY_TIMEOUT = 30.0
#: Users the instance knows (trust authentication still wants them listed).
KNOWN_USERS = ("postgres", "root")


def libpq_url(url: str) -> str:
    """``url`` as libpq takes it: without everystep's ``pooler=`` parameter
    (a test's own connection through the same PgBouncer)."""
    from everystep.store import pooling

    return pooling.split(url)[0]


def find_pgbouncer() -> str | None:
    """The pgbouncer binary, or None when it is not installed."""
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


class PgBouncer:
    """One PgBouncer process, in ``mode`` (``transaction`` or ``session``),
    in front of the server at ``server_url``."""

    def __init__(self, binary: str, server_url: str, mode: str) -> None:
        self.binary = binary
        self.mode = mode
        server = urlsplit(server_url)
        self.server_host = server.hostname or "127.0.0.1"
        self.server_port = server.port or 5432
        self.superuser = server.username or "postgres"
        self.base = Path(tempfile.mkdtemp(prefix=f"everystep-pgbouncer-{mode}-"))
        self.run_as = "postgres" if os.geteuid() == 0 else None
        self.port = 0
        self.users = set(KNOWN_USERS) | {self.superuser}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def logfile(self) -> Path:
        return self.base / "pgbouncer.log"

    def url_for(self, server_url: str, pooler: bool = True) -> str:
        """``server_url`` (a database on the server behind) through this
        PgBouncer; ``pooler``: with the ``pooler=`` parameter of its mode."""
        parts = urlsplit(server_url)
        credentials = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        query = [part for part in parts.query.split("&") if part]
        if pooler:
            query.append(f"pooler={self.mode}")
        return urlunsplit(parts._replace(netloc=f"{credentials}127.0.0.1:{self.port}", query="&".join(query)))

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        if not self.port:
            self.port = free_port()
        self._write_config()
        command = [self.binary, str(self.base / "pgbouncer.ini")]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        self.process = subprocess.Popen(command, cwd=self.base, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self._wait_ready()

    def stop(self) -> None:
        """End the process (SIGTERM: PgBouncer's immediate shutdown)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def restart(self) -> None:
        """Stop and start again on the same port: every client connection drops."""
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- the admin console -------------------------------------------------

    def admin(self, command: str) -> None:
        """Run an admin console command (``RECONNECT``, ``KILL db``, ``RESUME db``, ``RELOAD``)."""
        with psycopg.connect(f"postgresql://{quote(self.superuser)}@127.0.0.1:{self.port}/pgbouncer",
                             autocommit=True, connect_timeout=10) as conn:
            # The console speaks the simple query protocol only.
            result = conn.pgconn.exec_(command.encode())
            if result.status not in (psycopg.pq.ExecStatus.COMMAND_OK, psycopg.pq.ExecStatus.TUPLES_OK):
                raise RuntimeError(f"pgbouncer {command}: {result.error_message.decode(errors='replace')}")

    def kill_database(self, dbname: str) -> None:
        """``KILL dbname`` (every connection to it dropped at once), then ``RESUME``."""
        self.admin(f"KILL {dbname}")
        self.admin(f"RESUME {dbname}")

    def add_user(self, name: str) -> None:
        """Let ``name`` log in (trust authentication, as the server behind)."""
        self.users.add(name)
        self._write_config()
        self.admin("RELOAD")

    # -- internals -----------------------------------------------------------

    def _write_config(self) -> None:
        admin = ", ".join(sorted(self.users))
        (self.base / "users.txt").write_text("".join(f'"{user}" ""\n' for user in sorted(self.users)))
        (self.base / "pgbouncer.ini").write_text(f"""\
[databases]
* = host={self.server_host} port={self.server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.base / "users.txt"}
admin_users = {admin}
pool_mode = {self.mode}
max_client_conn = 500
default_pool_size = {40 if self.mode == "transaction" else 150}
logfile = {self.logfile}
pidfile = {self.base / "pgbouncer.pid"}
""")
        if self.run_as is not None:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.base, *self.base.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        url = f"postgresql://{quote(self.superuser)}@127.0.0.1:{self.port}/postgres"
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"pgbouncer exited with {self.process.returncode}:\n{self._tail()}")
            try:
                with psycopg.connect(url, connect_timeout=5, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"pgbouncer not accepting connections: {exc}\n{self._tail()}") from exc
                time.sleep(0.1)

    def _tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"<no log: {exc}>"


def start_pgbouncer(server_url: str, mode: str) -> PgBouncer | None:
    """A started PgBouncer in ``mode`` in front of ``server_url``; None when
    pgbouncer is not installed."""
    binary = find_pgbouncer()
    if binary is None:
        return None
    bouncer = PgBouncer(binary, server_url, mode)
    for attempt in range(3):  # the free port may be taken before PgBouncer binds it
        try:
            bouncer.start()
            return bouncer
        except RuntimeError:
            bouncer.stop()
            if attempt == 2:
                bouncer.close()
                raise
            bouncer.port = 0
    raise AssertionError("unreachable")
