"""The chaos suite's looping runs: runs that live for ever, fed messages
while the faults land, continuing as new every ``every`` messages.

Each looping run adds up the numbers 1..N sent to its first id (a send to
a run that continued reaches the newest run of its chain), then -1 to end
it. Afterwards the chain is checked: every run but the last ended
``continued``, one more run than continuations were due, the last
completed with the sum of 1..N and N messages handled; every message
exists once (its idempotency key) and was consumed exactly once, by a
``recv`` step of the run that holds it whose recorded result is its
payload; no recv step consumed two.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from everystep import schedule, send
from everystep.models import COMPLETED, CONTINUED
from everystep.store import connect
from tests.chaos import app


class LoopFeeder:
    """Schedules the looping runs, then sends each its numbers spread over
    ``spread`` seconds, a share at each tick; a send that fails (the
    database restarting, the pooler killed) is sent again on the next tick
    under the same idempotency key, so an ambiguous failure stores nothing
    twice."""

    def __init__(self, url: str, loops: int, messages: int, every: int, spread: float) -> None:
        self.url = url
        self.messages = messages
        self.every = every
        self.spread = spread
        self.keys = [f"loop{index}" for index in range(loops)]
        #: The first run of each loop's chain: its key.
        self.firsts: dict[str, str] = {}
        #: Numbers sent so far, per key (the end marker is number messages + 1).
        self.sent: Counter[str] = Counter()
        self.started = time.monotonic()

    @property
    def done(self) -> bool:
        return len(self.firsts) == len(self.keys) and all(self.sent[key] > self.messages for key in self.keys)

    def feed(self, everything: bool = False) -> None:
        elapsed = time.monotonic() - self.started
        share = 1.0 if everything or self.spread <= 0 else min(1.0, elapsed / self.spread)
        due = int(self.messages * share)
        try:
            store = connect(self.url)
        except Exception:
            return
        try:
            for key in self.keys:
                if key not in self.firsts:
                    run = schedule(app.chaos_loop, key, 0, 0, self.every, idempotency_key=key, database=store)
                    self.firsts[key] = run.id
                while self.sent[key] < due:
                    number = self.sent[key] + 1
                    send(self.firsts[key], "n", number, idempotency_key=f"{key}:n{number}", database=store)
                    self.sent[key] = number
                if due == self.messages and self.sent[key] == self.messages:
                    send(self.firsts[key], "n", -1, idempotency_key=f"{key}:end", database=store)
                    self.sent[key] = self.messages + 1
        except Exception:
            return  # the database is restarting: the rest on the next tick
        finally:
            try:
                store.close()
            except Exception:
                pass


def verify_loops(url: str, feeder: LoopFeeder, counts: Counter[str], violations: list[str]) -> None:
    """The checks of the module's docstring, counted in ``counts``
    (``loops``, ``loop_continuations``, ``loop_messages``)."""
    store = connect(url)
    try:
        for key, first in feeder.firsts.items():
            counts["loops"] += 1
            chain = [store.get_run(first)]
            while chain[-1].continued_as:
                chain.append(store.get_run(chain[-1].continued_as))
            counts["loop_continuations"] += len(chain) - 1
            _check_chain(key, chain, feeder, violations)
            _check_messages(store, key, chain, feeder, counts, violations)
    finally:
        store.close()


def _check_chain(key: str, chain: list[Any], feeder: LoopFeeder, violations: list[str]) -> None:
    expected = feeder.messages // feeder.every + 1
    if len(chain) != expected:
        violations.append(f"loop {key}: {len(chain)} run(s) in its chain, {expected} expected")
    if any(run.status != CONTINUED for run in chain[:-1]):
        violations.append(f"loop {key}: a run before the last did not end continued: "
                          f"{[run.status for run in chain]}")
    last = chain[-1]
    total = feeder.messages * (feeder.messages + 1) // 2
    if last.status != COMPLETED or last.result != {"key": key, "total": total, "handled": feeder.messages}:
        violations.append(f"loop {key}: its last run {last.id} ended {last.status} with {last.result!r} "
                          f"({last.error!r}), not the total {total} of {feeder.messages} messages")


def _check_messages(store: Any, key: str, chain: list[Any], feeder: LoopFeeder, counts: Counter[str],
                    violations: list[str]) -> None:
    payloads: Counter[Any] = Counter()
    for run in chain:
        recorded = {step.step_id: step for step in store.get_steps(run.id)}
        consumers = []
        for message in store.messages(run.id):
            payloads[message.payload] += 1
            if message.consumed_step is None:
                violations.append(f"loop {key}: message {message.payload} to run {run.id} was never consumed")
                continue
            counts["loop_messages"] += 1
            consumers.append(message.consumed_step)
            step = recorded.get(message.consumed_step)
            if step is None or step.name != "everystep.recv" or step.result != message.payload:
                violations.append(f"loop {key}: message {message.payload} to run {run.id} consumed by step "
                                  f"{message.consumed_step}, which recorded {step!r}")
        if len(consumers) != len(set(consumers)):
            violations.append(f"loop {key}: run {run.id}: one recv step consumed several messages")
    expected = Counter({number: 1 for number in (*range(1, feeder.messages + 1), -1)})
    if payloads != expected:
        missing = sorted(set(expected) - set(payloads))[:10]
        twice = sorted(number for number, count in payloads.items() if count > 1)[:10]
        violations.append(f"loop {key}: messages missing {missing}, held twice {twice}")
