"""Schedulers hammering one debounce key, for tests/test_debounce.py and
bench/debounce_rate.py: in threads of the test's process, or as a process
of its own (``python -m tests.support.debounce_hammer URL KEY WORKER CALLS
PERIOD MAX_WAIT``, one JSON list of what each call returned on stdout)."""

from __future__ import annotations

import json
import random
import sys
import time
from typing import Any

from everystep import Debounce, schedule, workflow
from everystep.store import Store, connect


@workflow
def debounced(worker: str, call: int) -> list[Any]:
    return [worker, call]


NAME = debounced.name


def hammer(store: Store, key: str, worker: str, calls: int, period: float, max_wait: float,
           pause: float = 0.004) -> list[tuple[str, int, list[Any]]]:
    """``calls`` debounced schedules of ``key``, a random pause of up to
    ``pause`` seconds between them; what each returned: (run id, calls
    folded into that run by then, the run's arguments)."""
    seen = []
    for call in range(calls):
        run = schedule(debounced, worker, call, database=store, debounce=Debounce(key, period, max_wait))
        assert run.debounce_calls is not None
        seen.append((run.id, run.debounce_calls, run.args))
        time.sleep(random.uniform(0, pause))
    return seen


def main(argv: list[str]) -> None:
    url, key, worker, calls, period, max_wait = argv
    store = connect(url)
    try:
        print(json.dumps(hammer(store, key, worker, int(calls), float(period), float(max_wait))))
    finally:
        store.close()


if __name__ == "__main__":
    # Run as a script, this file is __main__: its workflow is registered
    # under the module's own name only when imported as that module.
    from tests.support import debounce_hammer

    debounce_hammer.main(sys.argv[1:])
