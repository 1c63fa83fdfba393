"""Supervisor settings, as parsed from the command line."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

SOCKET_NAME = "everystep-supervisor.sock"
MAX_PROCS = 256


def default_socket_path() -> str:
    """``$RUNTIME_DIRECTORY`` (systemd's RuntimeDirectory=) or the working directory."""
    directory = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or os.getcwd()
    return os.path.join(directory, SOCKET_NAME)


@dataclass
class Config:
    app: list[str] = field(default_factory=list)
    procs: int = field(default_factory=lambda: os.cpu_count() or 1)
    database: str | None = None
    name: str = field(default_factory=socket.gethostname)
    poll: float = 0.5
    #: Runs claimed ahead, in one claim and at most four per child, while every
    #: child is busy with short runs, for the next children to free
    #: (``claim_ahead.py``; 0: never).
    claim_ahead: int = 8
    drain: float = 30.0
    step_timeout: float | None = None
    max_runs_per_child: int = 0
    max_memory_per_child: int = 0  # MB
    max_crashes: int = 3
    #: Budgets of steps that declare none: bytes a step may add to its
    #: process, CPU seconds it may use (None: unbounded).
    step_memory_limit: int | None = None
    step_cpu_limit: float | None = None
    #: Give each child a cgroup where the host allows it (``supervisor/cgroups.py``).
    cgroups: bool = True
    socket: str = field(default_factory=default_socket_path)
    burst: bool = False
    progress: bool | None = None  # None: on in burst mode
    lease: float = 60.0
    takeover: bool = False
    metrics_port: int = 0
    metrics_bind: str = "0.0.0.0"
    #: Every database statement the parent makes (and connecting) is
    #: bounded by this, so its loop never waits long on the database.
    db_timeout: float = 5.0
    #: Control-socket clients silent this long are dropped.
    control_timeout: float = 10.0
    #: A child that has not read a run handed to it for this long is killed.
    stall_timeout: float = 10.0
    #: Called in the parent right before each batch of forks, after it closed
    #: its own connections: a host closes whatever a child must not inherit
    #: (Django's ``connections.close_all``). A failing hook is logged.
    before_fork: list[Callable[[], None]] = field(default_factory=list)
    #: Claim only from these queues (None: every queue).
    queues: list[str] | None = None
    #: At start, seconds to wait for an unreachable database (None: as long
    #: as it takes; 0: exit 3 at once).
    wait_for_database: float | None = None
    #: Where the parent LISTENs (None: ``$EVERYSTEP_LISTEN_DATABASE_URL``,
    #: else ``database``; behind a transaction pooler, nowhere: it polls).
    listen_database: str | None = None
    #: The code version runs scheduled here record (None: each workflow's code hash).
    app_version: str | None = None
    #: The code versions whose runs it claims: ``all``, ``current`` or a list
    #: (``everystep.versions.served``).
    serve_versions: str = "all"
    #: A run whose history passes this many step records is said once
    #: (``everystep.history_bound``; None: ``$EVERYSTEP_HISTORY_WARNING``,
    #: else 10,000; 0: never).
    history_warning: int | None = None

    @property
    def show_progress(self) -> bool:
        return self.burst if self.progress is None else self.progress
