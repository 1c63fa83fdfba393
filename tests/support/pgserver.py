"""A real PostgreSQL server for tests and benchmarks.

The engine's guarantees (durability, crash recovery, concurrent workers) only
mean something against a real PostgreSQL, so tests run against either an
external server named by an environment variable or a throwaway cluster
started from the local PostgreSQL binaries.  A throwaway cluster can also be
stopped, restarted and hard-killed, which chaos tests use to simulate crashes.

Only the standard library, psycopg 3 and psutil are used, so this module can be
imported by conftest files and benchmark scripts alike.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psutil
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["PgServer", "start_server"]

READY_TIMEOUT = 30.0
"""Seconds to wait for a cluster to accept connections before giving up."""

_SERVER_OPTIONS = (
    "-c listen_addresses=127.0.0.1",
    # Durability of a throwaway cluster is irrelevant; crash tests kill the
    # postmaster, not the machine, so the WAL still makes recovery real.
    "-c fsync=off",
    "-c synchronous_commit=off",
    "-c full_page_writes=off",
    # Concurrency tests open many worker connections at once.
    "-c max_connections=300",
)


class PgServer:
    """Handle on a PostgreSQL server: either one we own or an external one."""

    admin_url: str
    owned: bool

    def __init__(self, admin_url: str, cluster: _Cluster | None = None) -> None:
        self.admin_url = admin_url
        self.owned = cluster is not None
        self._cluster = cluster

    def __repr__(self) -> str:
        return f"PgServer(admin_url={self.admin_url!r}, owned={self.owned})"

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- databases ---------------------------------------------------------

    def url_for(self, dbname: str) -> str:
        """Return a URL for ``dbname`` on the same server with the same credentials."""
        return _replace_dbname(self.admin_url, dbname)

    def create_database(self, prefix: str = "everystep_test") -> str:
        """Create a fresh, uniquely named database so tests never share state."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self._admin_connection() as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url_for(name)

    def drop_database(self, url_or_name: str) -> None:
        """Drop a database even if leaked connections still use it."""
        name = _dbname_of(url_or_name)
        if not name:
            raise ValueError(f"no database name in {url_or_name!r}")
        if name == _dbname_of(self.admin_url):
            raise ValueError(f"refusing to drop the admin database {name!r}")
        with self._admin_connection() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
            drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
            if conn.info.server_version >= 130000:
                # Closes the race with backends that connect after the terminate.
                drop = sql.SQL("{} WITH (FORCE)").format(drop)
            conn.execute(drop)

    def _admin_connection(self) -> psycopg.Connection:
        return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)

    # -- lifecycle (owned clusters only) -------------------------------------

    def stop(self, mode: str = "fast") -> None:
        """Stop the cluster with ``pg_ctl stop -m mode``; a no-op if it is not running."""
        self._require_cluster("stop").stop(mode)

    def start(self) -> None:
        """Start the cluster again on the same port and data directory."""
        self._require_cluster("start").start()

    def restart(self) -> None:
        """Stop and start the cluster, e.g. to drop every connection at once."""
        cluster = self._require_cluster("restart")
        cluster.stop("fast")
        cluster.start()

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends to simulate a crash."""
        self._require_cluster("kill").kill()

    def close(self) -> None:
        """Stop the cluster and delete its files; nothing to do for external servers."""
        if self._cluster is not None:
            self._cluster.destroy()

    def _require_cluster(self, action: str) -> _Cluster:
        if self._cluster is None:
            raise RuntimeError(f"cannot {action} an external server ({self.admin_url})")
        return self._cluster


def start_server(env_var: str = "EVERYSTEP_TEST_DATABASE_URL") -> PgServer:
    """Use the server named by ``env_var`` if set, else start a throwaway cluster."""
    url = os.environ.get(env_var)
    if url:
        return PgServer(url)
    return PgServer(*_start_local_cluster())


# -- local cluster -------------------------------------------------------------


@dataclass
class _Cluster:
    """A cluster in a private temp directory, controlled through pg_ctl."""

    bindir: Path
    base: Path
    port: int
    run_as: str | None  # OS user to run pg tools as, or None for ourselves

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def sockdir(self) -> Path:
        return self.base / "sock"

    @property
    def logfile(self) -> Path:
        return self.base / "postgres.log"

    def run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a PostgreSQL tool, dropping root privileges since they refuse root."""
        cmd = list(args)
        if self.run_as is not None:
            cmd = ["runuser", "-u", self.run_as, "--", *cmd]
        # cwd: the unprivileged user may not be able to read the caller's cwd.
        return subprocess.run(
            cmd,
            cwd=self.base,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def url(self, user: str) -> str:
        return f"postgresql://{quote(user, safe='')}@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        """Start via pg_ctl and wait until a real client can connect."""
        if self.postmaster_pid() is not None:
            return
        options = " ".join(
            [f"-p {self.port}", f"-k {shlex.quote(str(self.sockdir))}", *_SERVER_OPTIONS]
        )
        try:
            result = self.run(
                str(self.bindir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(int(READY_TIMEOUT)),
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                options,
                timeout=READY_TIMEOUT + 15,
            )
        except subprocess.TimeoutExpired:
            raise self.failure("pg_ctl start did not return") from None
        if result.returncode != 0:
            raise self.failure("pg_ctl start failed", result)
        self.wait_ready()

    def wait_ready(self) -> None:
        """pg_ctl -w trusts postmaster.pid; confirm over TCP like the tests will."""
        deadline = time.monotonic() + READY_TIMEOUT
        url = self.url(self.superuser)
        while True:
            try:
                with psycopg.connect(url, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() >= deadline:
                    raise self.failure(f"server not accepting connections: {exc}") from exc
                time.sleep(0.1)

    def stop(self, mode: str) -> None:
        if self.postmaster_pid() is None:
            return
        result = self.run(
            str(self.bindir / "pg_ctl"),
            "stop",
            "-w",
            "-t",
            str(int(READY_TIMEOUT)),
            "-m",
            mode,
            "-D",
            str(self.datadir),
            timeout=READY_TIMEOUT + 15,
        )
        if result.returncode != 0:
            raise self.failure(f"pg_ctl stop -m {mode} failed", result)

    def kill(self) -> None:
        """SIGKILL everything belonging to the cluster and clear stale lock files.

        Surviving backends would keep the shared memory segment attached and
        make the next postmaster refuse to start, so they die too.  The
        postmaster is frozen first so it cannot fork new children while its
        existing ones are collected.
        """
        pid = self.postmaster_pid()
        if pid is not None:
            try:
                postmaster = psutil.Process(pid)
                postmaster.send_signal(signal.SIGSTOP)
                victims = [postmaster, *postmaster.children(recursive=True)]
            except psutil.NoSuchProcess:
                victims = []
            for proc in victims:
                try:
                    proc.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            _wait_gone(victims, timeout=10.0)
            survivors = [p.pid for p in victims if _alive(p)]
            if survivors:
                raise RuntimeError(f"postgres processes survived SIGKILL: {survivors}")
        self.remove_stale_locks()

    def postmaster_pid(self) -> int | None:
        """Pid of the running postmaster, removing postmaster.pid if it is stale."""
        pidfile = self.datadir / "postmaster.pid"
        try:
            first_line = pidfile.read_text().splitlines()[0]
            pid = int(first_line.strip())
        except (FileNotFoundError, IndexError, ValueError):
            return None
        try:
            if _alive(psutil.Process(pid)):
                return pid
        except psutil.NoSuchProcess:
            pass
        self.remove_stale_locks()
        return None

    def remove_stale_locks(self) -> None:
        """Delete lock files of a dead postmaster.

        PostgreSQL itself only discards them when the recorded pid is gone;
        after a crash that pid may linger as an unreaped zombie (or be reused),
        which would block the restart.
        """
        stale = [
            self.datadir / "postmaster.pid",
            self.sockdir / f".s.PGSQL.{self.port}.lock",
            self.sockdir / f".s.PGSQL.{self.port}",
        ]
        for path in stale:
            path.unlink(missing_ok=True)

    def destroy(self) -> None:
        """Stop (or, failing that, kill) the cluster and remove its directory."""
        if not self.base.exists():
            return
        try:
            self.stop("immediate")
        except Exception:
            self.kill()
        shutil.rmtree(self.base, ignore_errors=True)

    @property
    def superuser(self) -> str:
        return self.run_as or _current_user()

    def failure(
        self, message: str, result: subprocess.CompletedProcess[str] | None = None
    ) -> RuntimeError:
        """Build an error carrying tool output and the server log tail for diagnosis."""
        parts = [message]
        if result is not None:
            output = (result.stdout + result.stderr).strip()
            if output:
                parts.append(f"output:\n{output}")
        parts.append(f"log tail ({self.logfile}):\n{_tail(self.logfile)}")
        return RuntimeError("\n".join(parts))


def _start_local_cluster() -> tuple[str, _Cluster]:
    """initdb a fresh cluster in a temp directory and start it on a free port."""
    bindir = _find_bindir()
    run_as = _unprivileged_user()
    superuser = run_as or _current_user()

    base = Path(tempfile.mkdtemp(prefix="everystep-pg-"))
    try:
        (base / "sock").mkdir()
        if run_as is not None:
            entry = pwd.getpwnam(run_as)
            for path in (base, base / "sock"):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        cluster = _Cluster(bindir=bindir, base=base, port=0, run_as=run_as)

        result = cluster.run(
            str(bindir / "initdb"),
            "-D",
            str(cluster.datadir),
            "-A",
            "trust",
            "-U",
            superuser,
            "-E",
            "UTF8",
            # The C locale always exists, unlike whatever LANG names.
            "--locale=C",
            "--no-sync",
        )
        if result.returncode != 0:
            raise cluster.failure("initdb failed", result)

        # The free port can be grabbed by someone else before the postmaster
        # binds it, so retry a few times on a fresh port.
        for attempt in range(3):
            cluster.port = _free_port()
            try:
                cluster.start()
                break
            except RuntimeError:
                cluster.kill()
                if attempt == 2 or "could not bind" not in _tail(cluster.logfile):
                    raise
        return cluster.url(superuser), cluster
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise


def _find_bindir() -> Path:
    """Directory holding initdb, pg_ctl and postgres: from PATH, else the newest install."""
    tools = ("initdb", "pg_ctl", "postgres")
    candidates: list[Path] = []
    found = shutil.which("pg_ctl")
    if found:
        # Resolve symlinks: distributions link pg_ctl into PATH without postgres.
        candidates.append(Path(os.path.realpath(found)).parent)
    installed = glob.glob("/usr/lib/postgresql/*/bin")
    candidates.extend(Path(p) for p in sorted(installed, key=_version_key, reverse=True))
    for bindir in candidates:
        if all(os.access(bindir / tool, os.X_OK) for tool in tools):
            return bindir
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found on PATH"
        " or under /usr/lib/postgresql/*/bin; install them or set"
        " EVERYSTEP_TEST_DATABASE_URL to an existing server"
    )


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(n) for n in re.findall(r"\d+", version))


def _unprivileged_user() -> str | None:
    """The user to run pg tools as: ``postgres`` when root (they refuse root), else us."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise RuntimeError(
            "running as root requires a 'postgres' OS user to own the test cluster"
        ) from None
    if shutil.which("runuser") is None:
        raise RuntimeError("running as root requires runuser to drop privileges")
    return "postgres"


def _current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie; a killed orphan may never be reaped in containers."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"<unavailable: {exc}>"


def _is_url(conninfo: str) -> bool:
    return conninfo.startswith(("postgresql://", "postgres://"))


def _replace_dbname(conninfo: str, dbname: str) -> str:
    if not _is_url(conninfo):
        return make_conninfo(conninfo, dbname=dbname)
    parts = urlsplit(conninfo)
    return urlunsplit(parts._replace(path="/" + quote(dbname, safe="")))


def _dbname_of(url_or_name: str) -> str:
    if _is_url(url_or_name):
        return unquote(urlsplit(url_or_name).path.lstrip("/"))
    if "=" in url_or_name:
        return str(conninfo_to_dict(url_or_name).get("dbname", ""))
    return url_or_name
