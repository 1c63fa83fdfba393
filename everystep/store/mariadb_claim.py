"""What the MariaDB store still asks of ``queue_claim.QueueClaim``: the
served queues, for ``next_due`` (one probe per queue).

The claim itself is one call of a procedure
(``functions/mariadb/claim.sql``), which runs ``QueueClaim``'s steps in the
database: one round trip where the steps run from here took one per probe,
per queue and per priority. List parameters are tuples (``IN %(names)s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .queue_claim import QueueClaim


class MariaDBClaim(QueueClaim):
    """The served queues of one runner: ``next_due()``."""

    def listed(self, values: Sequence[str]) -> Any:
        # An empty IN list is a syntax error; no queue, key or id is "".
        return tuple(values) or ("",)

    def given_queues(self) -> list[str] | None:
        queues = self.params["queues"]
        return None if queues is None else [name for name in queues if name]

    def given_names(self) -> list[str]:
        return [name for name in self.params["names"] if name]

    def all_queues(self) -> list[str]:
        # One index probe per queue, each a round trip: a DISTINCT is a
        # loose index scan only when the server's statistics say so, and
        # otherwise reads every scheduled run.
        names: list[str] = []
        while (row := self.conn.execute(self.sql["claim_next_queue"], {"after": names[-1] if names else ""})
               .fetchone()) is not None:
            names.append(row["queue"])
        return names
