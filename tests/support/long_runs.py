"""Long histories for tests, written straight into the step table.

A run of 100,000 steps would take minutes to execute step by step; what
the readers of a long history (``get_steps`` pages, ``everystep show``, the
console, the history bound) are tested against is its rows, so these
helpers write the rows a real execution would have left: ``done`` steps
with their arguments and results, in the order of their ids. PostgreSQL
gets them by COPY, SQLite and MariaDB by one batched insert, all in one
transaction: 100,000 rows in seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from everystep import waits
from everystep.store import Store, utcnow
from tests.apps import long_runs
from tests.support.rawdb import reader

#: A step row: (step id, function, result); its argument is its result.
Row = tuple[str, str, Any]

COLUMNS = ("workflow_id", "step_id", "name", "status", "args", "kwargs", "result", "started_at", "completed_at")


def ticks(count: int, first: int = 1) -> Iterator[Row]:
    """The records of ``long_runs.ticker``'s iterations ``first`` on."""
    for position in range(first, first + count):
        yield str(position), long_runs.tick.name, position - 1


def messages(count: int) -> Iterator[Row]:
    """The records of ``long_runs.subscription`` having handled ``count``
    messages: each a ``recv`` and a ``handle``."""
    for index in range(count):
        yield str(2 * index + 1), waits.RECV_STEP, {"n": index}
        yield str(2 * index + 2), long_runs.handle.name, {"n": index}


def write_history(store: Store, run_id: str, rows: Iterable[Row]) -> int:
    """Write ``rows`` as ``done`` steps of ``run_id``, in one transaction;
    returns how many."""
    stamp = store._time_param(utcnow())
    values = [(run_id, step_id, name, "done", json.dumps([result]), "{}", json.dumps(result), stamp, stamp)
              for step_id, name, result in rows]
    with reader(store.url) as conn:
        if store.backend == "postgres":
            with conn.transaction(), conn.cursor() as cur, \
                    cur.copy(f"COPY everystep_step ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for value in values:
                    copy.write_row(value)
        elif store.backend == "sqlite":
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(f"INSERT INTO everystep_step ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * 9)})",
                             values)
            conn.execute("COMMIT")
        else:
            with conn.cursor() as cur:
                cur.execute("START TRANSACTION")
                cur.executemany(f"INSERT INTO everystep_step ({', '.join(COLUMNS)}) "
                                f"VALUES ({', '.join(['%s'] * 9)})", values)
                cur.execute("COMMIT")
    return len(values)
