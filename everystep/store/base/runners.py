"""Runners and their leases: the names runs are claimed under.

A runner name is held by one live instance. ``register_runner`` decides a
takeover under the row lock, and fences what the name still holds in the
same transaction (each run's epoch bumped), so the previous holder's
writes are refused from then on. A runner that dies stops heartbeating;
once its lease has run out, ``recover_expired`` forgets it and requeues
its runs in one transaction, so each is requeued exactly once however many
runners sweep at the same time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import serde
from .core import Row, StoreCore
from .values import RunnerInfo


class Runners(StoreCore):
    """Runner rows: registration, heartbeats, recovery of dead runners' runs, published detail."""

    def register_runner(
        self, name: str, instance: str, kind: str, host: str, pid: int, lease: float,
        vet: Callable[[RunnerInfo], None],
    ) -> tuple[RunnerInfo | None, list[str]]:
        """Take the runner name ``name`` for ``instance``.

        If another instance holds the row, ``vet(holder)`` decides inside the
        same transaction (the row is locked, so concurrent starters under one
        name serialise): it raises to refuse, or returns to take the name
        over, in which case the runs still claimed under the name are fenced
        (their epochs bumped). Returns the previous holder and the fenced
        run ids."""
        params = self._params(name=name, instance=instance, kind=kind, host=host, pid=pid, lease=lease)
        with self.connection() as conn, self._transaction(conn):
            holder = self._runner_row(conn.execute(self.sql["lock_runner"], params).fetchone())
            if holder is None:
                if conn.execute(self.sql["insert_runner"], params).fetchone() is not None:
                    return None, []
                # Someone inserted it between our read and our insert.
                holder = self._runner_row(conn.execute(self.sql["lock_runner"], params).fetchone())
                assert holder is not None
            if holder.instance != instance:
                vet(holder)
            conn.execute(self.sql["replace_runner"], params)
            fenced = [str(row["id"]) for row in conn.execute(self.sql["fence_runner_runs"], params).fetchall()]
        return holder, fenced

    def heartbeat(self, name: str, instance: str) -> bool:
        """Refresh our lease; False if the row is gone (expired and recovered
        by another runner) or taken over by another instance."""
        return self._fetchone("heartbeat", self._params(name=name, instance=instance)) is not None

    def unregister_runner(self, name: str, instance: str) -> None:
        with self.connection() as conn:
            conn.execute(self.sql["unregister_runner"], {"name": name, "instance": instance})

    def recover_expired(self, me: str) -> dict[str, list[str]]:
        """Forget runners silent past their lease and requeue their runs,
        atomically: each dead runner's runs are requeued exactly once.
        Returns ``{dead runner: [requeued run ids]}`` (runs only)."""
        with self.connection() as conn, self._transaction(conn):
            pairs = self._recover_locked(conn, self._params(me=me))
        recovered: dict[str, list[str]] = {}
        for run_id, runner in pairs:
            recovered.setdefault(runner, []).append(run_id)
        return recovered

    def _recover_locked(self, conn: Any, params: dict[str, Any]) -> list[tuple[str, str]]:
        """(run id, dead runner) pairs; one statement where the backend has
        one (``recover_expired``). Elsewhere (no DELETE … RETURNING inside a
        CTE) forget each expired runner, its lease checked again under the
        lock, and requeue what it held."""
        if "recover_expired" in self.sql:
            rows = conn.execute(self.sql["recover_expired"], params).fetchall()
            return [(str(row["id"]), row["runner"]) for row in rows]
        pairs = []
        for row in conn.execute(self.sql["expired_runners"], params).fetchall():
            name = row["name"]
            if conn.execute(self.sql["forget_runner"], {**params, "name": name}).fetchone() is None:
                continue
            for requeued in conn.execute(self.sql["requeue_dead_runners_runs"], {"claimer": name}).fetchall():
                pairs.append((str(requeued["id"]), name))
        return pairs

    def list_runners(self) -> list[RunnerInfo]:
        rows = self._fetchall("list_runners", self._params())
        return [info for info in map(self._runner_row, rows) if info is not None]

    def get_runner(self, name: str, conn: Any = None) -> RunnerInfo | None:
        """The runner row holding ``name``, if any (``conn``: inside the
        caller's transaction, where the row stays locked)."""
        return self._runner_row(self._fetchone("lock_runner", self._params(name=name), conn))

    def _runner_row(self, row: Row | None) -> RunnerInfo | None:
        if row is None:
            return None
        return RunnerInfo(
            name=row["name"], kind=row["kind"], host=row["host"], pid=int(row["pid"]),
            lease_seconds=float(row["lease_seconds"]), started_at=self._time(row["started_at"]),
            heartbeat_at=self._time(row["heartbeat_at"]), silent_seconds=max(float(row["silent"]), 0.0),
            running=int(row["running"]), instance=row["instance"],
        )

    def publish_runner_detail(self, name: str, instance: str, detail: dict[str, Any]) -> bool:
        """Store what a runner says about itself (a supervisor's children) on
        its row; False if ``instance`` no longer holds ``name``."""
        params = {"name": name, "instance": instance, "detail": serde.dumps(detail, "runner detail")}
        return self._fetchone("publish_runner_detail", params) is not None

    def runner_details(self) -> dict[str, dict[str, Any]]:
        """``{runner name: published detail}``, only detail published by the
        instance that holds the name now (a restart's predecessor's is stale)."""
        details = {}
        for row in self._fetchall("runner_details", {}):
            detail = self._json(row["detail"])
            if isinstance(detail, dict) and detail.get("instance") == row["instance"]:
                details[row["name"]] = detail
        return details
