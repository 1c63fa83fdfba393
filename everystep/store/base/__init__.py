"""The Store: every database operation everystep performs, backend-neutral.

A ``Store`` owns a small pool of connections to one database. A connection
is used by one thread at a time and never crosses ``fork()``: the pool
remembers the pid that opened it and refuses to hand out inherited
connections, and ``close()`` before forking leaves nothing for a child to
finalise. A backend is one subclass (how to open a connection, run a write
transaction, serialise migrations, read its column types, recognise a
caller's connection), one ``queries/<backend>.sql`` with every statement it
runs, by name, and one ``migrations/<backend>/`` folder; the logic of each
operation lives here once. Rows are read by column name.

Every state change an executor makes carries its ``Claim`` (claimer name
and claim epoch) and is conditional on it, so a stale writer can never
clobber a run that moved on: the methods return ``False``/``LOST`` instead.

Driver errors leave through one choke point (``connection()``):
``StoreUnavailable`` when the database cannot be reached, ``SchemaMissing``
when everystep's tables do not exist, ``StoreError`` for anything else
it refused, each with the driver's exception chained.

The operations are grouped by concern, one module each, every one a mixin
over ``core.StoreCore``; ``Store`` composes them, so callers see one class
(and one interface: everything a caller uses is declared on it):

=====================  ==========================================================
``core``               the pool, the driver-error choke point, dialect hooks, row mapping
``values``             the values taken and returned (``NewStep``, ``StepWrite``, ``LOST`` …)
``schema``             migrations, through the pool or a host framework's connection
``runs``               scheduling, reading runs and steps, admin commands' row locks
``execution``          the hot path: claims, step records, a run's last write, waits
``runners``            runner names and leases, recovery of dead runners' runs
``queues``             queue settings and the counts of what they hold
``operator_requests``  requests relayed to a runner through the database
``console``            pages, bounded counts and id-prefix lookups for operators
``histories``          long histories: a run's steps by page, its outline, its noted length
``retention``          deleting finished runs in batches
``cron``               periodic workflows' ticks
``step_transactions``  transactional steps: their writes and record in one transaction
``waits``              messages, events, child runs, and releases that wait for them
``continuations``      a run that continues as new: its end and its successor, one write
``debounce``           debounced schedules: a key's window folded into one run
``streams``            values a run writes for readers outside, in order, as rows
=====================  ==========================================================
"""

from __future__ import annotations

from .console import ConsoleReads
from .continuations import Continuations
from .core import MAX_IDLE_CONNECTIONS, Row, StoreCore
from .cron import Cron
from .debounce import DebounceWindow, Debounces
from .execution import Execution
from .histories import Histories
from .operator_requests import OperatorRequests
from .queues import Queues
from .retention import Retention
from .runners import Runners
from .runs import Runs
from .schema import Schema
from .step_transactions import StepTransactions
from .streams import StreamBounds, StreamItem, Streams, StreamSummary
from .waits import Waits
from .values import (
    LOST, MAX_UUID, MIN_UUID, ClaimState, Marker, NewStep, Notifications, RunnerInfo, StepWrite, id_prefix_range,
    new_run_id, utcnow,
)


class Store(Continuations, Streams, Waits, Execution, Debounces, StepTransactions, ConsoleReads, Histories, Runs,
            Runners, Queues, OperatorRequests, Retention, Cron, Schema, StoreCore):
    """Base class; see ``postgres.PostgresStore`` and ``sqlite.SQLiteStore``."""


__all__ = [
    "LOST", "MAX_IDLE_CONNECTIONS", "MAX_UUID", "MIN_UUID", "ClaimState", "DebounceWindow", "Marker", "NewStep",
    "Notifications", "Row", "RunnerInfo", "Store", "StoreCore", "StepWrite", "StreamBounds", "StreamItem",
    "StreamSummary", "id_prefix_range", "new_run_id", "utcnow",
]
