"""Long histories: a run's steps a page at a time, its outline, its length.

A run that lives for months records tens of thousands of steps, and
reading them all (arguments, results, errors decoded) costs about as much
as a replay. What a reader needs costs less:

- ``step_ids``: every step id of a run in the order first recorded (one
  short column): enough to choose a page (``everystep.histories``), whose
  rows ``steps_by_id`` then reads;
- ``step_outline``: every step's id, function and status, in the order
  first recorded (``StepOutline``): what the step graph is drawn from;
- ``run_cost``: what its measured steps cost, summed by the database;
- ``note_history`` / ``largest_history``: a run's length as its last
  execution left it, kept on the run row, so the metrics' largest history
  among unfinished runs reads run rows, never counting steps.

Nothing here changes what a run does: ``note_history`` writes a column
that no execution reads, conditional on the claim that noted it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...models import Claim, StepOutline, StepRecord
from ...resources import RunCost
from .runs import Runs
from .values import checked_run_id

#: Step ids per ``steps_by_id`` statement: a page of any size is read in
#: statements of bounded length.
IDS_PER_STATEMENT = 1000


class Histories(Runs):
    """A run's step ids, steps by id, its outline, and its noted length."""

    def step_ids(self, run_id: str) -> list[str]:
        """Every step id of the run, in the order first recorded."""
        return [row["step_id"] for row in self._fetchall("step_ids", {"id": checked_run_id(run_id)})]

    def steps_by_id(self, run_id: str, step_ids: Sequence[str]) -> list[StepRecord]:
        """The run's steps with these ids (each with its retried attempts),
        in no particular order; an id the run has no step for is left out."""
        run = checked_run_id(run_id)
        with self.connection() as conn:
            steps = self.steps_by_id_on(conn, self.sql, run, step_ids)
        return self._with_attempts(run, steps) if steps else steps

    @classmethod
    def steps_by_id_on(cls, conn: Any, sql: Mapping[str, str], run_id: str,
                       step_ids: Sequence[str]) -> list[StepRecord]:
        """``steps_by_id`` (without the attempts) through ``conn``, a
        connection of this backend or a cursor on a caller's, in statements
        of ``IDS_PER_STATEMENT`` ids."""
        return [cls._step(row) for start in range(0, len(step_ids), IDS_PER_STATEMENT)
                for row in conn.execute(sql["steps_by_id"], {
                    "id": run_id, "step_ids": cls._names(list(step_ids[start:start + IDS_PER_STATEMENT]))}).fetchall()]

    def step_outline(self, run_id: str, results_of: str = "") -> list[StepOutline]:
        """Every step of the run in the order first recorded: its id,
        function and status; its result only for the steps named
        ``results_of`` (the graph: patch markers, whose result is their
        answer)."""
        run = checked_run_id(run_id)
        rows = self._fetchall("step_outline", {"id": run, "results_of": results_of})
        return [StepOutline(run, row["step_id"], row["name"], row["status"],
                            self._json(row["result"]) if row["result"] is not None else None) for row in rows]

    def run_cost(self, run_id: str) -> RunCost | None:
        """What the run's measured steps cost (``resources.run_cost`` of all
        its steps, summed by the database); None if none was measured."""
        row = self._fetchone("run_cost", {"id": checked_run_id(run_id)})
        if row is None or not row["measured"]:
            return None
        return RunCost(cpu_seconds=float(row["cpu_seconds"]), peak_rss_bytes=int(row["peak_rss_bytes"]),
                       measured_steps=int(row["measured"]))

    def note_history(self, claim: Claim, records: int) -> bool:
        """Note how many step records the run holds, as the execution under
        ``claim`` left it; False when a newer claim has taken the run since
        (its execution notes its own)."""
        params = {**self._claim_params(claim), "records": int(records)}
        with self.connection() as conn:
            return int(conn.execute(self.sql["note_history"], params).rowcount) > 0

    def largest_history(self) -> int:
        """The most step records noted for an unfinished run (0: none noted)."""
        row = self._fetchone("largest_history", {})
        return int(row["records"]) if row is not None and row["records"] is not None else 0
