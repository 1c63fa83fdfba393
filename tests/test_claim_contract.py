"""One property test holds every backend's claim to the contract written in
``everystep/store/queue_claim.py``: random queues (limits, pause), runs
(queue, workflow name, priority, concurrency key, due or not, already
running, locked by another transaction), served names, served queues and a
batch size are loaded into SQLite, PostgreSQL and MariaDB alike, each claims
once, and

(a) what each claims obeys the contract, checked against a reference model
    written from the contract alone (``expected_gives``): per queue, a
    prefix of what that queue can give in order and within its limits; at
    least a fair share each; a batch as full as the queues allow;
(b) where the contract fixes the set (one queue can give, or all of them
    together give at most the batch), every backend claims exactly it, so
    on the same data the three claim the same runs.

Runs of names nobody serves (up to six names, so the claim's "more than
four names" path is exercised) must never be claimed, nor runs started
under a code version the claimer does not serve (``--serve-versions``; a
run with no version recorded is served by every claimer); the reads that make
them free are SQLite's and MariaDB's per-name statements, whose plans other
tests pin (test_due_runs, test_queues).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from everystep.queues import Placement, QueueSettings
from everystep.store import Store, connect

pytestmark = pytest.mark.timeout(600)

QUEUES = ("qa", "qb", "qc")
NAMES = ("w1", "w2", "w3", "w4", "w5", "w6")
KEYS = (None, "k1", "k2")
VERSIONS = (None, "v1", "v2")
#: Runs already held by another runner: a workflow the tested claim never serves.
BUSY = "contract.busy"
TABLES = ("everystep_step", "everystep_workflow", "everystep_queue", "everystep_queue_claim")


@dataclass(frozen=True)
class Spec:
    queue: str
    name: str
    priority: int
    key: str | None
    state: str  # due | later | running | locked
    version: str | None = None


@dataclass(frozen=True)
class Case:
    queues: dict[str, QueueSettings]
    runs: list[Spec]
    served: list[str]
    given: list[str] | None
    limit: int
    #: The code versions served (None: every version).
    versions: list[str] | None = None


def queue_settings(name: str) -> st.SearchStrategy[QueueSettings]:
    return st.builds(
        QueueSettings, name=st.just(name), concurrency=st.none() | st.integers(0, 4),
        key_concurrency=st.none() | st.integers(1, 2), rate_limit=st.none() | st.integers(1, 4),
        rate_period=st.just(3600.0), paused=st.sampled_from((False, False, False, True)))


@st.composite
def cases(draw: st.DrawFn) -> Case:
    queues = {name: draw(queue_settings(name)) for name in QUEUES}
    runs = draw(st.lists(st.builds(
        Spec, queue=st.sampled_from(QUEUES), name=st.sampled_from(NAMES), priority=st.integers(0, 2),
        key=st.sampled_from(KEYS), state=st.sampled_from(("due", "due", "due", "later", "running", "locked")),
        version=st.sampled_from(VERSIONS)),
        max_size=24))
    served = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True))
    given = draw(st.none() | st.lists(st.sampled_from((*QUEUES, "qz")), min_size=1, max_size=4, unique=True))
    versions = draw(st.none() | st.lists(st.sampled_from(("v1", "v2", "v3")), min_size=1, max_size=2, unique=True))
    return Case(queues, runs, served, given, draw(st.integers(1, 8)), versions)


# -- the reference model: the contract, read literally --------------------------------------------


def served_queues(case: Case, holding: set[str]) -> list[str]:
    """Rule 1: the queues given (else those holding scheduled runs), minus
    the paused ones and those limited to 0."""
    names = case.given if case.given is not None else sorted(holding)
    return [name for name in names if name not in case.queues
            or (not case.queues[name].paused and case.queues[name].concurrency != 0)]


def expected_gives(case: Case, queue: str, ids: list[str], locked: bool) -> list[str]:
    """Rules 1-4 for one queue: every run it can give, in the order it
    gives them (highest priority, then earliest due; keys at their limit
    stepped over; the queue's concurrency and rate bound the count)."""
    conf = case.queues.get(queue, QueueSettings(queue))
    order = [(spec, run_id) for spec, run_id in zip(case.runs, ids)
             if spec.queue == queue and spec.name in case.served
             and (case.versions is None or spec.version is None or spec.version in case.versions)
             and (spec.state == "due" or (spec.state == "locked" and not locked))]
    order.sort(key=lambda pair: -pair[0].priority)  # stable: due order (list order) within a priority
    running = [spec for spec in case.runs if spec.queue == queue and spec.state == "running"]
    most = math.inf
    if conf.concurrency is not None:
        most = min(most, conf.concurrency - len(running))
    if conf.rate_limit is not None:
        most = min(most, conf.rate_limit)
    per_key = {key: sum(1 for spec in running if spec.key == key) for key in KEYS if key}
    gives: list[str] = []
    for spec, run_id in order:
        if len(gives) >= most:
            break
        if conf.key_concurrency is not None and spec.key is not None:
            if per_key[spec.key] >= conf.key_concurrency:
                continue
            per_key[spec.key] += 1
        gives.append(run_id)
    return gives


def check(case: Case, ids: list[str], claimed: set[str], locked: bool) -> bool:
    """(a): ``claimed`` obeys the contract. Returns whether the contract
    fixes the set (then it is checked to be that set)."""
    holding = {spec.queue for spec in case.runs if spec.state in ("due", "later", "locked")}
    queues = served_queues(case, holding)
    gives = {queue: expected_gives(case, queue, ids, locked) for queue in queues}
    allowed = {run_id for runs in gives.values() for run_id in runs}
    assert claimed <= allowed, f"claimed runs the contract forbids: {claimed - allowed}"
    total = sum(len(runs) for runs in gives.values())
    assert len(claimed) == min(case.limit, total), "the batch is not as full as the queues allow"
    fair = case.limit // len(queues) if queues else 0
    for runs in gives.values():
        taken = [run_id for run_id in runs if run_id in claimed]
        assert taken == runs[:len(taken)], "a queue's claimed runs are not the first it can give"
        assert len(taken) >= min(len(runs), fair), "a queue got less than its fair share"
    fixed = total <= case.limit or sum(1 for runs in gives.values() if runs) <= 1
    if fixed:
        assert claimed == {run_id for runs in gives.values() for run_id in runs[:case.limit]}
    return fixed


# -- loading one case into a store ----------------------------------------------------------------


def empty(store: Store) -> None:
    with store.connection() as conn:
        for table in TABLES:
            conn.execute(f"DELETE FROM {table}")


def load(store: Store, case: Case) -> list[str]:
    """The case's runs, due in list order (a second apart), or an hour from
    now; running ones held by another claimer, limits set afterwards."""
    empty(store)
    start = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    ids = []
    for index, spec in enumerate(case.runs):
        when = start + dt.timedelta(seconds=index)
        if spec.state == "later":
            when += dt.timedelta(hours=2)
        name = BUSY if spec.state == "running" else spec.name
        run = store.schedule(name, "[]", not_before=when,
                             placement=Placement(spec.queue, spec.priority, spec.key), app_version=spec.version)
        ids.append(run.id)
    if any(spec.state == "running" for spec in case.runs):
        assert len(store.claim("other", len(case.runs), [BUSY])) == sum(
            spec.state == "running" for spec in case.runs)
    for name, conf in case.queues.items():
        store.update_queue(name, lambda _current, conf=conf: conf)
    return ids


class Holder:
    """Another transaction holding row locks on some runs (PostgreSQL and
    MariaDB; on SQLite a claim holds the whole database, so none)."""

    def __init__(self, store: Store, ids: list[str]) -> None:
        self.conn: Any = None
        if not ids or store.backend == "sqlite":
            return
        self.conn = store._open()
        if store.backend == "postgres":
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT id FROM everystep_workflow WHERE id = ANY(%(ids)s::uuid[]) FOR UPDATE",
                              {"ids": ids})
        else:
            # READ COMMITTED, as a claimer's: at REPEATABLE READ InnoDB keeps
            # the lock of every row it scanned, matching or not.
            self.conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            self.conn.execute("BEGIN")
            self.conn.execute("SELECT id FROM everystep_workflow FORCE INDEX (PRIMARY) WHERE id IN %(ids)s"
                              " FOR UPDATE", {"ids": tuple(ids)})

    @property
    def locks(self) -> bool:
        return self.conn is not None

    def release(self) -> None:
        if self.conn is not None:
            self.conn.execute("ROLLBACK")
            self.conn.close()


@pytest.fixture(scope="module")
def stores(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Store]]:
    urls = [f"sqlite:///{tmp_path_factory.mktemp('contract') / 'claim.db'}",
            request.getfixturevalue("pg_session_url"), request.getfixturevalue("mariadb_session_url")]
    opened = [connect(url) for url in urls]
    try:
        yield opened
    finally:
        for store in opened:
            empty(store)
            store.close()


def first_claims_recorded(store: Store, case: Case, ids: list[str], claimed: set[str]) -> None:
    """(7): a run taken records its first claim; a run left alone that was
    never claimed still has none."""
    for spec, run_id in zip(case.runs, ids):
        run = store.get_run(run_id)
        if run_id in claimed:
            assert run.first_claimed_at is not None and run.first_claimed_at == run.claimed_at, run
        elif spec.state != "running":
            assert run.first_claimed_at is None, run


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(case=cases())
def test_every_backend_claims_by_the_one_contract(stores: list[Store], case: Case) -> None:
    claimed_by: dict[str, set[str]] = {}
    fixed_by: dict[str, bool] = {}
    for store in stores:
        ids = load(store, case)
        holder = Holder(store, [run_id for spec, run_id in zip(case.runs, ids) if spec.state == "locked"])
        try:
            runs = store.claim("tester", case.limit, case.served, case.given, case.versions)
        finally:
            holder.release()
        by_position = {run_id: index for index, run_id in enumerate(ids)}
        claimed = {run.id for run in runs}
        assert len(claimed) == len(runs), "a run claimed twice"
        first_claims_recorded(store, case, ids, claimed)
        fixed_by[store.backend] = check(case, ids, claimed, holder.locks)
        # Ids differ per database: compare runs by their place in the case.
        claimed_by[store.backend] = {f"{by_position[run_id]}" for run_id in claimed}
    # (b): where the contract fixes the set, the backends agree (SQLite
    # holds no row locks, so it is compared only when none were asked for).
    comparable = [backend for backend, fixed in fixed_by.items() if fixed
                  and (backend != "sqlite" or all(spec.state != "locked" for spec in case.runs))]
    for backend in comparable[1:]:
        assert claimed_by[backend] == claimed_by[comparable[0]], (backend, comparable[0])


def test_served_names_beyond_four_take_the_probe_by_present_names(stores: list[Store]) -> None:
    """A fixed case of the "more than four served names" path on every
    backend: the two names holding runs are found, the others cost nothing."""
    runs = [Spec("qa", name, 0, None, "due") for name in ("w6", "w1", "w6", "w2")]
    case = Case({name: QueueSettings(name) for name in QUEUES}, runs, list(NAMES[1:]), None, 8)
    for store in stores:
        ids = load(store, case)
        claimed = {run.id for run in store.claim("tester", case.limit, case.served, None)}
        assert claimed == {ids[0], ids[2], ids[3]}
        assert check(case, ids, claimed, locked=False)
        first_claims_recorded(store, case, ids, claimed)
