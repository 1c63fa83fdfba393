"""Bulk loading for the scale cases: finished history and waiting backlogs,
written with COPY so that a million runs take seconds, not an hour.

The rows are what ``noop3`` leaves behind: a completed run with the bench
payload as its arguments and result, claimed by a runner that is gone, and
its three ``done`` steps, each carrying the payload as argument and result.
Timestamps are spread over a window in the past (``age_days``), so a prune
with ``--older-than 30d`` takes all of them. Waiting runs are ``scheduled``
rows of a given workflow name, oldest first, exactly what ``schedule()``
writes minus the NOTIFY (the caller sends one at the end).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid

import psycopg

HISTORY_RUNNER = "bench-history"
CHUNK = 20_000


def _uuid7(millis: int) -> str:
    rand = int.from_bytes(os.urandom(10), "big")
    value = (millis & ((1 << 48) - 1)) << 80 | 0x7 << 76 | ((rand >> 68) << 64 & (0xFFF << 64)) | 0b10 << 62
    return str(uuid.UUID(int=value | (rand & ((1 << 62) - 1))))


def _ts(moment: dt.datetime) -> str:
    return moment.isoformat()


def _payload(i: int) -> str:
    return json.dumps({"i": i, "tag": "bench"}, separators=(", ", ": "))


def load_history(url: str, runs: int, name: str = "bench.workloads.noop3",
                 age_days: tuple[float, float] = (31.0, 90.0)) -> float:
    """COPY ``runs`` completed runs with three steps each; returns seconds
    taken (load only; the caller decides when to VACUUM ANALYZE)."""
    if runs <= 0:
        return 0.0
    started = time.monotonic()
    now = dt.datetime.now(dt.timezone.utc)
    oldest, newest = (now - dt.timedelta(days=age_days[1]), now - dt.timedelta(days=age_days[0]))
    span = (newest - oldest).total_seconds()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = off")
        for first in range(0, runs, CHUNK):
            count = min(CHUNK, runs - first)
            run_lines, step_lines = [], []
            for i in range(first, first + count):
                created = oldest + dt.timedelta(seconds=span * i / runs)
                run_id = _uuid7(int(created.timestamp() * 1000))
                payload = _payload(i)
                claimed = created + dt.timedelta(milliseconds=1)
                done = created + dt.timedelta(milliseconds=3)
                run_lines.append("\t".join((
                    run_id, name, f"[{payload}]", "completed", HISTORY_RUNNER, _ts(claimed), payload,
                    _ts(created), _ts(done))))
                for step in (1, 2, 3):
                    at = _ts(claimed + dt.timedelta(microseconds=500 * step))
                    step_lines.append("\t".join((
                        run_id, str(step), "bench.workloads.noop", f"[{payload}]", "{}", "done", payload, at, at)))
            with conn.transaction():
                with conn.cursor().copy(
                    "COPY everystep_workflow (id, name, args, status, claimed_by, claimed_at, result,"
                    " created_at, completed_at) FROM STDIN"
                ) as copy:
                    copy.write("\n".join(run_lines) + "\n")
                with conn.cursor().copy(
                    "COPY everystep_step (workflow_id, step_id, name, args, kwargs, status, result,"
                    " started_at, completed_at) FROM STDIN"
                ) as copy:
                    copy.write("\n".join(step_lines) + "\n")
    return time.monotonic() - started


def load_scheduled(url: str, runs: int, name: str, first_index: int = 0, notify: bool = False,
                   queue: str = "default", priority: int = 0, keys: int = 0) -> float:
    """COPY ``runs`` scheduled runs of ``name`` (newest last) into ``queue``
    at ``priority``, spread over ``keys`` concurrency keys (0: none);
    returns seconds."""
    if runs <= 0:
        return 0.0
    started = time.monotonic()
    base = dt.datetime.now(dt.timezone.utc)
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(0, runs, CHUNK):
            count = min(CHUNK, runs - first)
            lines = []
            for i in range(first, first + count):
                created = base + dt.timedelta(microseconds=i)
                key = f"key-{i % keys}" if keys else "\\N"
                lines.append("\t".join((_uuid7(int(created.timestamp() * 1000)), name,
                                        f"[{_payload(first_index + i)}]", "scheduled", _ts(created),
                                        queue, str(priority), key)))
            with conn.transaction():
                with conn.cursor().copy(
                    "COPY everystep_workflow (id, name, args, status, created_at, queue, priority, concurrency_key)"
                    " FROM STDIN"
                ) as copy:
                    copy.write("\n".join(lines) + "\n")
        if notify:
            conn.execute("SELECT pg_notify('everystep_scheduled', %s)", (name,))
    return time.monotonic() - started


def vacuum_analyze(url: str) -> float:
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE everystep_workflow")
        conn.execute("VACUUM ANALYZE everystep_step")
    return time.monotonic() - started


def table_facts(url: str) -> dict[str, float]:
    """Sizes, dead tuples and vacuum counts of the two tables and their indexes."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        facts: dict[str, float] = {}
        for table in ("everystep_workflow", "everystep_step"):
            row = conn.execute(
                "SELECT n_live_tup, n_dead_tup, autovacuum_count + vacuum_count, autoanalyze_count + analyze_count,"
                " pg_table_size(relid), pg_indexes_size(relid) FROM pg_stat_user_tables WHERE relname = %s",
                (table,)).fetchone()
            if row:
                for key, value in zip(("live", "dead", "vacuums", "analyzes", "table_bytes", "index_bytes"), row):
                    facts[f"{table}:{key}"] = float(value or 0)
        for name, size in conn.execute(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
            " WHERE relname IN ('everystep_workflow', 'everystep_step')"
        ):
            facts[f"index:{name}"] = float(size)
    return facts
