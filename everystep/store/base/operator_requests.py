"""Operator requests relayed to a runner through the database (migration 0005).

Each transition of a request (pending, taken, answered or expired) is a
compare-and-set on its status, so it is acted on at most once: a runner
that dies after taking one leaves it ``taken`` with no reply, and the
requester says so (see ``everystep.relay``). Old requests are pruned in the
transaction that submits a new one.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ... import serde
from ...models import REQUEST_KEEP_SECONDS, OperatorRequest
from .core import Row, StoreCore
from .values import utcnow


class OperatorRequests(StoreCore):
    """The request rows a console or CLI submits and a supervisor takes and answers."""

    def submit_request(self, runner: str, command: str, args: dict[str, Any], requested_by: str) -> OperatorRequest:
        """Insert a pending request for ``runner`` (see ``everystep.relay``);
        on PostgreSQL its NOTIFY reaches the runner on commit. Requests older
        than ``models.REQUEST_KEEP_SECONDS`` are pruned in the same transaction."""
        params = self._params(
            runner=runner, command=command, args=serde.dumps(args, "request arguments"),
            requested_by=requested_by, keep=REQUEST_KEEP_SECONDS,
            cutoff=self._time_param(utcnow() - dt.timedelta(seconds=REQUEST_KEEP_SECONDS)),
        )
        with self.connection() as conn, self._transaction(conn):
            conn.execute(self.sql["prune_requests"], params)
            row = conn.execute(self.sql["submit_request"], params).fetchone()
        return self._request(row)

    def take_requests(self, runner: str, limit: int = 10) -> list[OperatorRequest]:
        """Move ``runner``'s pending requests to ``taken`` and return them,
        oldest first; each request is taken once."""
        params = self._params(runner=runner, limit=limit)
        with self.connection() as conn, self._claim_transaction(conn):
            rows = conn.execute(self.sql["take_requests"], params).fetchall()
        return sorted((self._request(row) for row in rows), key=lambda request: request.id)

    def answer_request(self, request_id: int, reply: dict[str, Any]) -> bool:
        """Store the reply of a taken request; False if it was not ``taken``."""
        params = self._params(id=int(request_id), reply=serde.dumps(reply, "request reply"))
        return self._fetchone("answer_request", params) is not None

    def expire_request(self, request_id: int) -> bool:
        """Give up on a request nobody took yet; False if it was taken."""
        return self._fetchone("expire_request", self._params(id=int(request_id))) is not None

    def get_request(self, request_id: int) -> OperatorRequest | None:
        row = self._fetchone("get_request", {"id": int(request_id)})
        return self._request(row) if row is not None else None

    @classmethod
    def _request(cls, row: Row) -> OperatorRequest:
        created_at = cls._time(row["created_at"])
        age = row["age"] if "age" in row.keys() else None
        if age is None and created_at is not None:
            age = (utcnow() - created_at).total_seconds()
        return OperatorRequest(
            id=int(row["id"]), runner=row["runner"], command=row["command"], args=cls._json(row["args"]) or {},
            status=row["status"], reply=cls._json(row["reply"]), requested_by=row["requested_by"],
            created_at=created_at, taken_at=cls._time(row["taken_at"]), answered_at=cls._time(row["answered_at"]),
            age_seconds=float(age) if age is not None else None,
        )
