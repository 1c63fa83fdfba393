"""The write path of one 3-step run, replayed in the forms the levers of
issue 18 would give it, to ground their estimates in measurements.

This is not the engine: it sends the engine's own named statements
(``record_step``, ``finish_run`` from ``store/queries/postgres.sql``) over
one psycopg connection, run after run, the way a child did before the fold
and the ways it could. Each form is timed per run (three step records and the
terminal status write; the claim is left out, it is the same in all):

- ``3 records, then the status``: the form before the fold (the engine
  now writes the last record and the status in one statement, the last
  form below): four autocommit statements, three durable step commits and
  the asynchronously committed status write (``finish_run``), psycopg's
  automatic server-side preparation as configured (after 5 executions);
- ``never prepared`` / ``always prepared``: the same with ``prepare=False``
  or ``prepare=True`` on every execute;
- ``last step + status in one transaction``: the third step record and the
  status write share one durable commit (it must be durable: it holds a
  step record);
- ``… pipelined``: that transaction sent in psycopg's pipeline mode, the
  two statements and the commit in one network round trip;
- ``… in one statement``: the third step record in a CTE and the status
  write conditional on it, one statement and one commit (``BEGIN`` and
  ``COMMIT`` are round trips of their own in the transaction forms);
- ``always prepared, psycopg's RawCursor``: the first form's statements
  through psycopg's public ``RawCursor`` (server-side ``$n`` parameters, no
  query conversion) with ``prepare=True``, one cursor per connection;
- ``always prepared, past the cursor``: the same statements through
  ``everystep.store.postgres_hot``, the engine's own path to libpq for its
  hot statements, which leans on psycopg internals. These two rows decide
  whether that path earns its keep: their client CPU per run (the thread
  time of the loop, which a wait for the server does not count) is the
  measure, and ``cpu_ratio`` compares them.

The forms take turns run by run so a shared machine's drift hits all alike;
each is measured on a durable database and on one with
``synchronous_commit = off``, which leaves the CPU and round-trip part.
"""

from __future__ import annotations

import datetime as dt
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import set_json_loads

from everystep import serde
from everystep.store import connect, postgres_hot
from everystep.store.queries import load

from .esdb import reset

CLAIMER = "bench-levers"
RUN_NAME = "bench.workloads.noop3"
PAYLOAD = '{"i": 1, "tag": "bench"}'

BEFORE_FOLD = "3 records, then the status"
RAW_CURSOR = "always prepared, psycopg's RawCursor"
HOT_PATH = "always prepared, past the cursor (everystep's postgres_hot)"
FORMS = (BEFORE_FOLD, "never prepared", "always prepared", "last step + status in one transaction",
         "last step + status in one transaction, pipelined", "last step + status in one statement",
         RAW_CURSOR, HOT_PATH)
#: Whether the engine keeps its own path: it goes if the public RawCursor
#: comes within this much of its client CPU per run.
KEEP_PRIVATE_ABOVE = 0.15


def _claimed_runs(url: str, count: int) -> list[str]:
    store = connect(url)
    try:
        for _ in range(count):
            store.schedule(RUN_NAME, f"[{PAYLOAD}]")
        return [run.id for run in store.claim(CLAIMER, count, [RUN_NAME])]
    finally:
        store.close()


def _step(run_id: str, step_id: str) -> dict[str, Any]:
    # Each run is claimed once (by ``_claimed_runs``): its claim epoch is 1.
    return {"run_id": run_id, "claimer": CLAIMER, "claim_epoch": 1, "step_id": step_id, "name": "bench.workloads.noop",
            "args": f"[{PAYLOAD}]", "kwargs": "{}", "status": "done", "result": PAYLOAD, "error": None,
            "started_at": dt.datetime.now(dt.timezone.utc), "attempt": 1, "wake_at": None,
            "cpu_seconds": None, "peak_rss_bytes": None}


def _finish(run_id: str) -> dict[str, Any]:
    return {"run_id": run_id, "claimer": CLAIMER, "claim_epoch": 1, "status": "completed", "result": PAYLOAD,
            "error": None}


def _forms(sql: dict[str, str]) -> dict[str, Callable[[psycopg.Connection[Any], str], None]]:
    record, finish = sql["record_step"], sql["finish_run"]
    # Inside a durable transaction the status write must not switch the
    # commit to asynchronous: drop the CTE that does, keep the guarded UPDATE.
    finish_in_tx = re.sub(r"WITH async_commit AS \(.*?\),\s*(\w+) AS \(", r"WITH \1 AS (", finish, count=1, flags=re.S)
    finish_in_tx = re.sub(r"\n\s*FROM async_commit\n", "\n", finish_in_tx, count=1)
    assert "async_commit" not in finish_in_tx, "finish_run's asynchronous commit is no longer where the lever expects"

    # One statement, one round trip, one durable commit: the engine's own
    # ``finish_run_with_step`` (the run row locked under the claim, the step
    # record, the status write conditional on it).
    combined = sql["finish_run_with_step"]

    def one_statement(conn: psycopg.Connection[Any], run_id: str) -> None:
        for step in ("1", "2"):
            conn.execute(record, _step(run_id, step)).fetchone()
        last = _step(run_id, "3")
        params = {**last, "step_status": last["status"], "step_result": last["result"],
                  "step_error": last["error"], **_finish(run_id)}
        if conn.execute(combined, params).fetchone() is None:
            raise RuntimeError(f"run {run_id}: the combined write changed nothing")

    def separate(conn: psycopg.Connection[Any], run_id: str, prepare: bool | None = None) -> None:
        for step in ("1", "2", "3"):
            conn.execute(record, _step(run_id, step), prepare=prepare).fetchone()
        conn.execute(finish, _finish(run_id), prepare=prepare).fetchone()

    def folded(conn: psycopg.Connection[Any], run_id: str) -> None:
        for step in ("1", "2"):
            conn.execute(record, _step(run_id, step)).fetchone()
        with conn.transaction():
            conn.execute(record, _step(run_id, "3")).fetchone()
            conn.execute(finish_in_tx, _finish(run_id)).fetchone()

    def pipelined(conn: psycopg.Connection[Any], run_id: str) -> None:
        for step in ("1", "2"):
            conn.execute(record, _step(run_id, step)).fetchone()
        with conn.pipeline(), conn.transaction():
            conn.execute(record, _step(run_id, "3"))
            conn.execute(finish_in_tx, _finish(run_id))

    raw_cursors: dict[int, psycopg.RawCursor[Any]] = {}
    numbered = {name: postgres_hot.HotStatement(number, sql[name])
                for number, name in enumerate(("record_step", "finish_run"), 1)}

    def raw(conn: psycopg.Connection[Any], run_id: str) -> None:
        cursor = raw_cursors.get(id(conn))
        if cursor is None:
            cursor = raw_cursors[id(conn)] = psycopg.RawCursor(conn)
        for name, params in _separate_writes(run_id):
            statement = numbered[name]
            cursor.execute(statement.text, [params[key] for key in statement.params], prepare=True)
            cursor.fetchone()

    prepared: dict[int, postgres_hot.Prepared] = {}

    def hot(conn: psycopg.Connection[Any], run_id: str) -> None:
        session = prepared.get(id(conn))
        if session is None:
            session = prepared[id(conn)] = postgres_hot.Prepared(conn)
        for name, params in _separate_writes(run_id):
            if postgres_hot.execute(conn, session, numbered[name], params) is None:
                raise RuntimeError(f"run {run_id}: postgres_hot left {name} to psycopg's cursor")

    return {
        BEFORE_FOLD: separate,
        "never prepared": lambda conn, run_id: separate(conn, run_id, prepare=False),
        "always prepared": lambda conn, run_id: separate(conn, run_id, prepare=True),
        "last step + status in one transaction": folded,
        "last step + status in one transaction, pipelined": pipelined,
        "last step + status in one statement": one_statement,
        RAW_CURSOR: raw,
        HOT_PATH: hot,
    }


def _separate_writes(run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The first form's four statements, by name, with their parameters."""
    return [*(("record_step", _step(run_id, step)) for step in ("1", "2", "3")), ("finish_run", _finish(run_id))]


def measure(url: str, runs_per_form: int) -> dict[str, dict[str, list[float]]]:
    """µs per run for each form, one value per run: ``wall`` (elapsed) and
    ``cpu`` (this thread's CPU time: the client's work alone). The forms
    take turns run by run, each on its own connection (so preparation state
    never mixes), so drift on a shared machine hits them all alike."""
    forms = _forms(load("postgres"))
    reset(url)
    run_ids = _claimed_runs(url, (runs_per_form + 1) * len(FORMS))
    results: dict[str, list[float]] = {form: [] for form in FORMS}
    cpu: dict[str, list[float]] = {form: [] for form in FORMS}
    conns = {form: psycopg.connect(url, autocommit=True) for form in FORMS}
    try:
        for conn in conns.values():
            set_json_loads(serde.loads, conn)
        for index, run_id in enumerate(run_ids):
            form = FORMS[index % len(FORMS)]
            started, started_cpu = time.perf_counter(), time.thread_time()
            forms[form](conns[form], run_id)
            if index >= len(FORMS):  # the first run of each form warms its connection
                results[form].append((time.perf_counter() - started) * 1e6)
                cpu[form].append((time.thread_time() - started_cpu) * 1e6)
    finally:
        for conn in conns.values():
            conn.close()
    with psycopg.connect(url, autocommit=True) as conn:
        done = conn.execute("SELECT count(*) FROM everystep_workflow WHERE status = 'completed'"
                            " AND claimed_by = %s", (CLAIMER,)).fetchone()[0]
    if done != len(run_ids):
        raise RuntimeError(f"levers: {done} of {len(run_ids)} runs completed")
    return {"wall": results, "cpu": cpu}


def cpu_ratio(cpu: dict[str, list[float]]) -> float | None:
    """The RawCursor form's median client CPU per run over the private
    path's, less one (0.12: the public API costs 12 % more); None when
    either was not measured."""
    raw, hot = cpu.get(RAW_CURSOR), cpu.get(HOT_PATH)
    if not raw or not hot:
        return None
    return statistics.median(raw) / statistics.median(hot) - 1


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    return {form: statistics.median(values) for form, values in results.items() if values}


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return q1, q2, q3
