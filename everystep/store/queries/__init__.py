"""Named SQL, one file per backend.

Each ``<backend>.sql`` holds blocks introduced by ``-- name: NAME``; this
module parses them into a dict so call sites say ``queries["claim"]`` and
every statement a backend runs can be read in one place.

Status sets are never written out in a ``.sql`` file: a statement names
one as a placeholder (``{active_statuses}``) and ``load`` renders it from
``everystep.models``, so a new status changes ``models.py`` and the SQL
follows. ``STATUS_SETS`` lists the placeholders. Wait keys alike: their
prefixes and the kind of a key come from ``everystep.wait_kinds``
(``WAIT_KEYS``). NOTIFY channels are rendered the same way from
``store.channels`` (``{scheduled_channel}``).

A block whose name starts with ``_`` is a fragment, not a statement: text
that several statements of the file share (the claim fence every executor
write carries, the step record's insert), included as ``{_name}``. A
statement that differs from another by one clause says only that clause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources

from ... import models, wait_kinds
from ..channels import PLACEHOLDERS as CHANNELS

RUN_COLUMNS = (
    "id", "name", "args", "status", "idempotency_key", "claimed_by", "claimed_at",
    "result", "error", "created_at", "completed_at", "claim_epoch", "not_before",
    "queue", "priority", "concurrency_key", "first_claimed_at", "app_version", "forked_from",
    "continued_from", "continued_as",
)
STEP_COLUMNS = (
    "workflow_id", "step_id", "name", "status", "result", "error", "args", "kwargs",
    "started_at", "completed_at", "attempt", "wake_at", "cpu_seconds", "peak_rss_bytes",
)

#: Placeholder → the status set of ``everystep.models`` it stands for.
STATUS_SETS: dict[str, tuple[str, ...]] = {
    "active_statuses": models.ACTIVE_STATUSES,
    "step_open_statuses": models.STEP_OPEN_STATUSES,
    "step_waiting_statuses": models.STEP_WAITING_STATUSES,
}


_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _columns(columns: tuple[str, ...], alias: str | None = None) -> str:
    if alias is None:
        return ", ".join(columns)
    return ", ".join(f"{alias}.{column}" for column in columns)


def sql_list(values: Sequence[str]) -> str:
    """``values`` as an SQL list of string literals: ``('a', 'b')``. Only
    for the fixed vocabularies of ``models`` (a quote would be refused, never
    escaped: these are not parameters)."""
    if not values or any("'" in value or "\\" in value for value in values):
        raise ValueError(f"not a status set: {values!r}")
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


def _wait_key_sql() -> dict[str, str]:
    """The wait keys' SQL, from ``everystep.wait_kinds``: each kind's prefix
    (``{wait_prefix_child}``: ``'child:'``) and its length, and
    ``{wait_kind_of}``, the kind of a run's ``wait_key`` (what the waiting
    gauge counts by)."""
    values: dict[str, str] = {}
    cases = []
    for kind in wait_kinds.KINDS:
        prefix = kind.key("")
        values[f"wait_prefix_{kind.name}"] = sql_list([prefix])[1:-1]
        values[f"wait_prefix_{kind.name}_length"] = str(len(prefix))
        cases.append(f"WHEN substr(wait_key, 1, {len(prefix)}) = {values[f'wait_prefix_{kind.name}']} THEN '{kind.name}'")
    values["wait_kind_of"] = (f"CASE {' '.join(cases)} WHEN wait_key = '{wait_kinds.SEVERAL}' THEN 'several' "
                              "ELSE 'time' END")
    return values


WAIT_KEYS = _wait_key_sql()


@cache
def load(backend: str) -> dict[str, str]:
    """Parse ``<backend>.sql`` into ``{name: statement}``."""
    text = resources.files(__package__).joinpath(f"{backend}.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    values = {
        "run_columns": _columns(RUN_COLUMNS),
        "run_columns_w": _columns(RUN_COLUMNS, "w"),
        "step_columns": _columns(STEP_COLUMNS),
        "step_columns_s": _columns(STEP_COLUMNS, "s"),
        **{placeholder: sql_list(statuses) for placeholder, statuses in STATUS_SETS.items()},
        **WAIT_KEYS,
        **CHANNELS,
    }
    blocks = {name: "\n".join(line for line in body.strip().splitlines() if not line.lstrip().startswith("--"))
              for name, body in zip(parts[1::2], parts[2::2])}
    for name, body in blocks.items():  # fragments first, in file order: one may include an earlier one
        if name.startswith("_"):
            values[name] = body.format(**values)
    return {name: body.format(**values) for name, body in blocks.items() if not name.startswith("_")}
