"""everystep's tables, as the harness needs them: migrate, empty, fill the
queue, and read back when the first run was claimed and the last finished.

Runs are scheduled through the public API (``schedule(..., conn=...)``), all
in one transaction so that filling the queue costs one commit; nothing is
claimable until the runner under test starts, and the measured window (first
``claimed_at`` to last ``completed_at``, both written by the database clock)
contains only execution.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg

from everystep import schedule, serde
from everystep.store import connect, new_run_id

from .procs import BenchError


def migrate(url: str) -> None:
    store = connect(url)
    try:
        store.migrate()
    finally:
        store.close()


def reset(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename IN ('everystep_stream', 'everystep_attempt', 'everystep_step', 'everystep_message', 'everystep_event',"
            " 'everystep_workflow', 'everystep_runner')"
        )]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(tables))
        conn.execute("VACUUM ANALYZE everystep_workflow")


def schedule_many(url: str, workflow: Any, args_list: Iterable[tuple[Any, ...]]) -> int:
    count = 0
    with psycopg.connect(url) as conn:
        for args in args_list:
            schedule(workflow, *args, conn=conn)
            count += 1
        conn.commit()
    return count


def insert_without_notify(conn: psycopg.Connection, name: str, args: list[Any]) -> str:
    """What ``Store.schedule`` writes, minus its ``pg_notify``: a run only a
    poll can find (pickup latency with polling only)."""
    run_id = new_run_id()
    conn.execute(
        "INSERT INTO everystep_workflow (id, name, args, status, created_at)"
        " VALUES (%s, %s, %s::json, 'scheduled', clock_timestamp())",
        (run_id, name, serde.dumps(args, "bench arguments")),
    )
    return run_id


@dataclass
class Span:
    runs: int
    steps: int
    seconds: float
    not_completed: int

    @property
    def runs_per_second(self) -> float:
        return self.runs / self.seconds if self.seconds > 0 else float("nan")

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")


def span(url: str) -> Span:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'completed'),"
            " count(*) FILTER (WHERE status <> 'completed'),"
            " extract(epoch FROM max(completed_at) - min(claimed_at))"
            " FROM everystep_workflow"
        ).fetchone()
        steps = conn.execute("SELECT count(*) FROM everystep_step WHERE status = 'done'").fetchone()[0]
    completed, other, seconds = int(row[0]), int(row[1]), float(row[2] or 0.0)
    return Span(runs=completed, steps=int(steps), seconds=seconds, not_completed=other)


def expect_all_completed(result: Span, expected: int, label: str) -> None:
    if result.runs != expected or result.not_completed:
        raise BenchError(f"{label}: {result.runs} of {expected} runs completed "
                         f"({result.not_completed} in another status)")


def wait_completed(url: str, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            done = conn.execute("SELECT count(*) FROM everystep_workflow WHERE status = 'completed'").fetchone()[0]
            if done >= expected:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"only {done} of {expected} runs completed within {timeout:.0f}s")
            time.sleep(0.02)


TIMELINE_SQL = """
WITH s AS (
    SELECT workflow_id,
           min(started_at) FILTER (WHERE step_id = '1') AS s1,
           min(completed_at) FILTER (WHERE step_id = '1') AS c1,
           min(started_at) FILTER (WHERE step_id = '2') AS s2,
           min(completed_at) FILTER (WHERE step_id = '2') AS c2,
           min(started_at) FILTER (WHERE step_id = '3') AS s3,
           min(completed_at) FILTER (WHERE step_id = '3') AS c3
    FROM everystep_step GROUP BY workflow_id
), per_run AS (
    SELECT extract(epoch FROM s.s1 - w.claimed_at) AS claim_to_first,
           extract(epoch FROM (s.c1 - s.s1) + (s.c2 - s.s2) + (s.c3 - s.s3)) / 3 AS in_step,
           extract(epoch FROM (s.s2 - s.c1) + (s.s3 - s.c2)) / 2 AS between_steps,
           extract(epoch FROM w.completed_at - s.c3) AS last_to_done,
           extract(epoch FROM w.completed_at - w.claimed_at) AS claimed_to_done
    FROM everystep_workflow w JOIN s ON s.workflow_id = w.id
    WHERE w.status = 'completed' AND s.c3 IS NOT NULL
)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY claim_to_first),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY in_step),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY between_steps),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY last_to_done),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY claimed_to_done)
FROM per_run
"""
TIMELINE_PARTS = ("claim_to_first", "in_step", "between_steps", "last_to_done", "claimed_to_done")


def timeline(url: str) -> dict[str, float]:
    """Medians (ms) of where a 3-step run's time goes, from its own rows.

    ``started_at`` of a step is taken by the runner just before it calls the
    step; ``completed_at`` by the database in the statement that records it
    (before that statement's commit). So ``between_steps`` holds the commit
    of the previous step and the runner's work up to the next call, and
    ``last_to_done`` the last step's commit plus the final status write.
    ``claim_gap`` is, for each claim, the time since the latest completion
    before it: how long a freed child waits for its next run.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(TIMELINE_SQL).fetchone()
        gap = conn.execute(
            "WITH c AS (SELECT claimed_at, (SELECT max(completed_at) FROM everystep_workflow d"
            " WHERE d.completed_at <= w.claimed_at) AS prev FROM everystep_workflow w)"
            " SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM claimed_at - prev))"
            " FROM c WHERE prev IS NOT NULL"
        ).fetchone()
    values = {name: float(value) * 1000.0 for name, value in zip(TIMELINE_PARTS, row) if value is not None}
    if gap and gap[0] is not None:
        values["claim_gap"] = float(gap[0]) * 1000.0
    return values
