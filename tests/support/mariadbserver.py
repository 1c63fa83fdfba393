"""A real MariaDB server for tests and benchmarks.

Either the server named by ``EVERYSTEP_TEST_MARIADB_URL``, or the local one
(``mariadb://root@127.0.0.1:3306/``, where this project's machines run one),
or a throwaway server started from a local ``mariadbd`` binary in a private
temp directory. Each caller creates and drops its own databases.
``start_server`` returns None, with the reason, when none of these exists:
MariaDB tests then skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pymysql

__all__ = ["MariaDBServer", "start_server"]

ENV_VAR = "EVERYSTEP_TEST_MARIADB_URL"
LOCAL_URL = "mariadb://root@127.0.0.1:3306/"
READY_TIMEOUT = 60.0


class MariaDBServer:
    """A server we may create databases on (and stop, if we started it)."""

    def __init__(self, admin_url: str, process: subprocess.Popen[bytes] | None = None,
                 base: Path | None = None) -> None:
        self.admin_url = admin_url.rstrip("/") + "/"
        self._process = process
        self._base = base

    def _admin(self) -> pymysql.connections.Connection[pymysql.cursors.Cursor]:
        parts = urlsplit(self.admin_url)
        return pymysql.connect(host=parts.hostname or "127.0.0.1", port=parts.port or 3306,
                               user=parts.username or "root", password=parts.password or "",
                               autocommit=True, connect_timeout=5)

    def url_for(self, name: str) -> str:
        parts = urlsplit(self.admin_url)
        return urlunsplit((parts.scheme, parts.netloc, "/" + name, "", ""))

    def create_database(self, prefix: str = "everystep_test") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with self._admin() as conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        name = urlsplit(url).path.lstrip("/")
        with self._admin() as conn, conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")

    def close(self) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None


def _reachable(url: str) -> bool:
    try:
        MariaDBServer(url)._admin().close()
    except pymysql.err.Error:
        return False
    return True


def start_server() -> tuple[MariaDBServer | None, str]:
    """A server to test against, or None and why there is none."""
    url = os.environ.get(ENV_VAR)
    if url:
        if not _reachable(url):
            return None, f"{ENV_VAR}={url} is not reachable"
        return MariaDBServer(url), ""
    if _reachable(LOCAL_URL):
        return MariaDBServer(LOCAL_URL), ""
    binary = shutil.which("mariadbd") or next(
        (path for path in ("/usr/sbin/mariadbd", "/usr/sbin/mysqld") if os.path.exists(path)), None)
    if binary is None:
        return None, "no MariaDB server at 127.0.0.1:3306 and no mariadbd binary to start one"
    return _start_throwaway(binary)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_throwaway(binary: str) -> tuple[MariaDBServer | None, str]:
    base = Path(tempfile.mkdtemp(prefix="everystep-mariadb-"))
    datadir = base / "data"
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if install is None:
        shutil.rmtree(base, ignore_errors=True)
        return None, "mariadbd exists but mariadb-install-db does not"
    user = ["--user=root"] if os.geteuid() == 0 else []
    done = subprocess.run([install, "--no-defaults", f"--datadir={datadir}", "--auth-root-authentication-method=normal",
                           "--skip-test-db", *user], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        return None, f"mariadb-install-db failed: {(done.stderr or done.stdout).strip()[-300:]}"
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--no-defaults", f"--datadir={datadir}", f"--socket={base / 'sock'}", f"--port={port}",
         "--bind-address=127.0.0.1", "--skip-grant-tables", "--innodb-flush-log-at-trx-commit=2",
         "--max-connections=300", f"--log-error={base / 'error.log'}", *user],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"mariadb://root@127.0.0.1:{port}/"
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if _reachable(url):
            return MariaDBServer(url, process, base), ""
        if process.poll() is not None:
            break
        time.sleep(0.2)
    MariaDBServer(url, process, base).close()
    return None, f"a throwaway mariadbd ({binary}) did not start within {READY_TIMEOUT:.0f} s"
