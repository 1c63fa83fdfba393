"""A host-owned resource, and a workflow that tells whether the child that
ran it inherited that resource open: the supervisor's ``before_fork`` hook
test (``python -m tests.apps.forking URL SOCKET LOG [--hook]``).

The entry point plays a host application (Django, say) embedding the
supervisor: it opens its own handle before starting, like a web framework's
database connection, and with ``--hook`` registers a ``before_fork`` hook
that closes it and logs the parent's pid, as ``connections.close_all`` would.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from everystep import step, workflow

HOST: dict[str, IO[str] | None] = {"handle": None}
_LOG: dict[str, str] = {}


@step
def report() -> dict[str, Any]:
    return {"pid": os.getpid(), "ppid": os.getppid(), "inherited_open": HOST["handle"] is not None}


@workflow
def inherited() -> dict[str, Any]:
    return report()


def close_host_handle() -> None:
    handle = HOST["handle"]
    if handle is not None:
        handle.close()
        HOST["handle"] = None
    with open(_LOG["path"], "a", encoding="utf-8") as log:
        log.write(f"{os.getpid()} before_fork\n")


def main(argv: list[str]) -> int:
    from supervisor.cli import run
    from supervisor.config import Config

    url, socket_path, log_path, *flags = argv
    _LOG["path"] = log_path
    HOST["handle"] = open(log_path, "a", encoding="utf-8")
    config = Config(
        app=["tests.apps.forking"], procs=2, database=url, burst=True, max_runs_per_child=1,
        socket=socket_path, before_fork=[close_host_handle] if "--hook" in flags else [],
    )
    return run(config)


if __name__ == "__main__":
    # Run as a script this file is ``__main__``: work with the importable
    # module, whose workflow and HOST the supervisor's children use.
    from tests.apps import forking

    sys.exit(forking.main(sys.argv[1:]))
