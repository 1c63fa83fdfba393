"""The one PostgreSQL server every case runs against, and the machine facts
the report starts with.

Without ``--database`` a throwaway cluster is started from the local
binaries (``tests/support/pgserver.py``). That helper tunes its clusters for
tests (``fsync=off``, ``synchronous_commit=off``); a benchmark of a durable
engine must pay for a durable commit, so the benchmark cluster is started
with PostgreSQL's production defaults instead: ``fsync=on``,
``synchronous_commit=on``, ``full_page_writes=on``, and pg_stat_statements
loaded but tracking nothing except in the profile case's database. On an
existing server
(``--database URL``) the server's configuration is left alone, and every
benchmark database gets ``ALTER DATABASE … SET synchronous_commit = on``.
Either way the report quotes the settings as a benchmark connection sees
them.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql

from tests.support import pgserver

ENV_VAR = "EVERYSTEP_BENCH_DATABASE_URL"
DURABLE_OPTIONS = ("-c fsync=on", "-c synchronous_commit=on", "-c full_page_writes=on")
REPORTED_SETTINGS = (
    "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "commit_delay",
    "shared_buffers", "max_connections",
)


@dataclass
class BenchServer:
    """One server, and the databases this invocation created on it."""

    server: pgserver.PgServer
    owned: bool
    created: list[str] = field(default_factory=list)

    @property
    def admin_url(self) -> str:
        return self.server.admin_url

    def create_database(self, prefix: str, synchronous_commit: str = "on") -> str:
        url = self.server.create_database(prefix)
        self.created.append(url)
        name = url.rsplit("/", 1)[-1].split("?", 1)[0]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET synchronous_commit = {}").format(
                    sql.Identifier(name), sql.SQL(synchronous_commit)
                )
            )
        return url

    def set_database(self, url: str, setting: str, value: str) -> None:
        """``ALTER DATABASE … SET setting = value`` (for new sessions)."""
        name = url.rsplit("/", 1)[-1].split("?", 1)[0]
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} SET {} = {}").format(
                sql.Identifier(name), sql.Identifier(setting), sql.Literal(value)))

    def enable_statement_stats(self, url: str) -> bool:
        """pg_stat_statements in this database only (top-level statements);
        False when the server does not load it."""
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT count(*) FROM pg_stat_statements").fetchone()
        except psycopg.Error:
            return False
        self.set_database(url, "pg_stat_statements.track", "top")
        return True

    def settings(self, url: str) -> dict[str, str]:
        with psycopg.connect(url, autocommit=True) as conn:
            values = {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in REPORTED_SETTINGS}
            values["version"] = str(conn.execute("SELECT version()").fetchone()[0])
        return values

    def close(self) -> None:
        for url in reversed(self.created):
            with contextlib.suppress(Exception):
                self.server.drop_database(url)
        self.created.clear()
        self.server.close()


def start(database: str | None) -> BenchServer:
    """Use ``database`` (or ``$EVERYSTEP_BENCH_DATABASE_URL``), else start a
    durable throwaway cluster."""
    url = database or os.environ.get(ENV_VAR)
    if url:
        return BenchServer(pgserver.PgServer(url), owned=False)
    return BenchServer(_start_durable(), owned=True)


def _start_durable() -> pgserver.PgServer:
    # pgserver keeps its (test-oriented) server options in a module constant;
    # swap in durable ones for the duration of the start only.
    options = getattr(pgserver, "_SERVER_OPTIONS", None)
    if options is None:
        return pgserver.start_server(env_var=ENV_VAR)
    keep = tuple(
        option for option in options
        if not any(key in option for key in ("fsync", "synchronous_commit", "full_page_writes"))
    )
    pgserver._SERVER_OPTIONS = keep + DURABLE_OPTIONS + _statement_stats_options()
    try:
        return pgserver.start_server(env_var=ENV_VAR)
    finally:
        pgserver._SERVER_OPTIONS = options


def _statement_stats_options() -> tuple[str, ...]:
    """Load pg_stat_statements when the local install has it, tracking
    nothing by default: only the profile case's database turns it on."""
    try:
        libdir = Path(pgserver._find_bindir()).resolve().parent / "lib"
    except Exception:
        return ()
    if not (libdir / "pg_stat_statements.so").exists():
        return ()
    return ("-c shared_preload_libraries=pg_stat_statements", "-c pg_stat_statements.track=none")


def find_tool(name: str) -> str | None:
    """A PostgreSQL client tool from PATH, else from the newest local install."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
                        key=lambda p: [int(n) for n in re.findall(r"\d+", p.parent.parent.name)], reverse=True)
    for path in candidates:
        if os.access(path, os.X_OK):
            return str(path)
    return None


# -- the machine ----------------------------------------------------------------


def machine() -> dict[str, str]:
    facts: dict[str, str] = {}
    facts["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    facts["nproc"] = _run(["nproc"]) or str(os.cpu_count())
    facts["cpu"] = _cpu_model()
    facts["ram"] = _ram()
    facts["kernel"] = f"{platform.system()} {platform.release()}"
    facts["python"] = sys.version.split()[0] + f" ({platform.python_implementation()})"
    facts["load"] = _loadavg()
    facts["commit"] = _git_state()
    facts["packages"] = _packages()
    return facts


def load_average() -> str:
    return _loadavg()


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _loadavg() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def _git_state() -> str:
    root = Path(__file__).resolve().parent.parent
    head = _run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
    if not head:
        return "unknown (not a git checkout)"
    dirty = _run(["git", "-C", str(root), "status", "--porcelain", "--", "everystep", "supervisor"])
    return f"{head}" + (" + uncommitted changes in everystep/ or supervisor/" if dirty else "")


def _packages() -> str:
    from importlib import metadata

    parts = []
    for name in ("psycopg", "dbos", "procrastinate", "matplotlib"):
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} (not installed)")
    return ", ".join(parts)
