"""Run a command as an older everystep would: one that shipped only the first
N schema versions (``python -m tests.support.older_schema N -m MODULE ARGS``
or ``... N SCRIPT ARGS``), and only the function files it had. Upgrade tests
use it to leave a database at an old version, then upgrade it with the
current code."""

from __future__ import annotations

import runpy
import sys

from everystep.store import functions, migrations

#: Function files (``store/functions/<backend>/``) that arrived with a later
#: schema version than the first: the version they came with. An older
#: release never applied them.
FUNCTIONS_SINCE = {"statuses": 18}


def main() -> None:
    keep = int(sys.argv[1])
    shipped = migrations.available
    shipped_functions = functions.available

    def available(backend: str) -> list[migrations.Migration]:
        return shipped(backend)[:keep]

    def available_functions(backend: str) -> list[functions.Function]:
        return [function for function in shipped_functions(backend) if FUNCTIONS_SINCE.get(function.name, 1) <= keep]

    migrations.available = available
    functions.available = available_functions
    rest = sys.argv[2:]
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
