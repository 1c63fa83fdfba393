"""A run that continues as new (``everystep.continue_as_new``).

A run whose history would grow for ever (a subscription, a device twin)
ends itself ``continued`` and hands over to a successor: a new run of the
same workflow with new arguments. ``continue_run`` does it in one
transaction fenced by the executor's claim, so either all of it happened or
none did (a crash before the commit replays the body, which continues
again):

- the run ends ``continued`` with ``continued_as`` pointing at the
  successor, and gives up its idempotency key to it (so scheduling the same
  workflow and key again returns the newest run of the chain);
- the successor is inserted due now with ``continued_from`` pointing back,
  in the same queue, priority and concurrency key, with the same parent (a
  child that continues stays its parent's child) and deadline, under the
  code version of the process continuing it;
- the messages nobody received yet move to the successor; the events are
  copied (what the chain published stays readable on its newest run); the
  unfinished children become the successor's (a cancel of it reaches
  them);
- a parent waiting for the run is woken: its wait follows the chain
  (``everystep.waits``) and waits again for the successor.

Row locks: the run's own row first (under its claim), then its parent's in
the wake, as a child's end takes them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...models import Claim
from ...wait_kinds import CHILD
from .values import Marker, new_run_id
from .waits import Waits


class Continuations(Waits):
    """Ending a run ``continued`` and starting its successor, as one write."""

    def continue_run(self, claim: Claim, args_json: str, app_version: str | None,
                     markers: Sequence[Marker] = ()) -> str | None:
        """End the run of ``claim`` ``continued`` and start its successor
        with ``args_json`` (see the module), after the patch ``markers``, in
        one transaction; the successor's id, or None if the claim moved on
        (nothing written)."""
        params = self._params(**self._claim_params(claim))
        with self.connection() as conn, self._transaction(conn):
            self._record_markers(conn, params, markers)
            run = conn.execute(self.sql["lock_continuing"], params).fetchone()
            if run is None:
                return None
            new_id = new_run_id()
            moved = {**params, "new_id": new_id}
            conn.execute(self.sql["end_continued"], moved)
            parent = run["parent_id"]
            conn.execute(self.sql["insert_continuation"], {
                **moved, "name": run["name"], "args": args_json, "idempotency_key": run["idempotency_key"],
                "queue": run["queue"], "priority": run["priority"], "concurrency_key": run["concurrency_key"],
                "app_version": app_version, "parent_id": str(parent) if parent is not None else None,
                "deadline": run["deadline"]}).fetchall()
            conn.execute(self.sql["move_unconsumed_messages"], moved)
            conn.execute(self.sql["copy_events"], moved)
            conn.execute(self.sql["adopt_children"], moved)
            if parent is not None:
                self.wake_waiter(str(parent), CHILD.key(claim.run_id), conn)
        return new_id


__all__ = ["Continuations"]
