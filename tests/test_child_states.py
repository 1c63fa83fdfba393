"""The parent's record of a child: ``supervisor.children.Child`` and its
transitions, the only writers of its state, its run, the run it finishes
and whether that run reached it. In-process, no fork: each row starts a
child in one state (reached through the transitions themselves) and says
what one transition makes of it, or that the parent must never order it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from everystep.models import RUNNING, Run
from supervisor import children
from supervisor.children import Child, IllegalTransition
from supervisor.protocol import COMMANDS, REPLIES, REQUESTS
from supervisor.states import ByeReason, ChildState, Command, KillReason, StepInFlight


def run(n: int) -> Run:
    return Run(id=f"0193a7c4-0000-7000-8000-00000000000{n}", name="app.flow", args=[], status=RUNNING,
               claimed_by="sup", claim_epoch=1)


R1, R2 = run(1), run(2)
SIGNALS: list[tuple[str, int]] = []


@pytest.fixture(autouse=True)
def _no_signals(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``kill`` and ``terminate`` signal the pid: record instead."""
    SIGNALS.clear()
    monkeypatch.setattr(children.os, "killpg", lambda pid, sig: SIGNALS.append(("killpg", sig)))
    monkeypatch.setattr(children.os, "kill", lambda pid, sig: SIGNALS.append(("kill", sig)))
    yield


def child_in(state: str) -> Child:
    """A child brought to ``state`` by transitions alone."""
    kid = Child(slot=1, pid=999_999, channel=None)  # type: ignore[arg-type]  # never used here
    steps: dict[str, list[Callable[[Child], Any]]] = {
        "booting": [],
        "idle": [Child.ready],
        "busy": [Child.ready, lambda k: k.hand(R1, 1.0)],
        "busy-undelivered": [Child.ready, lambda k: k.hand(R1, 1.0)],
        "busy-delivered": [Child.ready, lambda k: k.hand(R1, 1.0), Child.flushed],
        "finishing": [Child.ready, lambda k: k.hand(R1, 1.0), lambda k: k.finishing(R1.id)],
        "finishing+next": [Child.ready, lambda k: k.hand(R1, 1.0), lambda k: k.finishing(R1.id),
                           lambda k: k.hand(R2, 2.0)],
        "retiring": [Child.ready, Child.retire],
        "retiring-busy": [Child.ready, lambda k: k.hand(R1, 1.0), Child.retire],
        "stopping": [Child.ready, Child.terminate],
        "killed": [Child.ready, lambda k: k.kill(KillReason.QUIT)],
    }
    for step in steps[state]:
        step(kid)
    return kid


def snapshot(kid: Child) -> tuple[str, str | None, str | None, bool]:
    return (kid.state.value, kid.run.id[-1] if kid.run else None,
            kid.finishing_run.id[-1] if kid.finishing_run else None, kid.delivered)


ILLEGAL = "illegal"

CASES: list[tuple[str, str, Callable[[Child], Any], Any, tuple[str, str | None, str | None, bool] | None]] = [
    # (id, from, transition, what it returns (or ILLEGAL), (state, run, finishing run, delivered) after)
    ("boot", "booting", Child.ready, True, ("idle", None, None, True)),
    ("ready-after-retire-changes-nothing", "retiring", Child.ready, False, ("retiring", None, None, True)),
    ("hand-idle", "idle", lambda k: k.hand(R1, 5.0), None, ("busy", "1", None, False)),
    ("hand-finishing-queues-behind", "finishing", lambda k: k.hand(R2, 5.0), None, ("busy", "2", "1", False)),
    ("hand-booting", "booting", lambda k: k.hand(R1, 5.0), ILLEGAL, None),
    ("hand-busy", "busy", lambda k: k.hand(R2, 5.0), ILLEGAL, None),
    ("hand-twice-while-finishing", "finishing+next", lambda k: k.hand(run(3), 5.0), ILLEGAL, None),
    ("hand-retiring", "retiring", lambda k: k.hand(R1, 5.0), ILLEGAL, None),
    ("hand-stopping", "stopping", lambda k: k.hand(R1, 5.0), ILLEGAL, None),
    ("hand-killed", "killed", lambda k: k.hand(R1, 5.0), ILLEGAL, None),
    ("flushed", "busy-undelivered", Child.flushed, None, ("busy", "1", None, True)),
    ("finishing", "busy", lambda k: k.finishing(R1.id), True, ("finishing", "1", None, False)),
    ("finishing-another-run-is-stale", "busy", lambda k: k.finishing(R2.id), False, ("busy", "1", None, False)),
    ("finishing-when-idle-is-stale", "idle", lambda k: k.finishing(R1.id), False, ("idle", None, None, True)),
    ("finishing-when-killed-is-stale", "killed", lambda k: k.finishing(R1.id), False, ("killed", None, None, True)),
    ("done-busy", "busy-delivered", lambda k: k.done(R1.id, 10), R1, ("idle", None, None, True)),
    ("done-finishing", "finishing", lambda k: k.done(R1.id, 10), R1, ("idle", None, None, False)),
    ("done-settled-run-keeps-next", "finishing+next", lambda k: k.done(R1.id, 10), R1, ("busy", "2", None, False)),
    ("done-other-run-is-stale", "busy", lambda k: k.done(R2.id, 10), None, ("busy", "1", None, False)),
    ("done-retiring-stays-retiring", "retiring-busy", lambda k: k.done(R1.id, 10), R1,
     ("retiring", None, None, False)),
    ("retire-idle", "idle", Child.retire, None, ("retiring", None, None, True)),
    ("retire-booting", "booting", Child.retire, None, ("retiring", None, None, True)),
    ("retire-busy", "busy", Child.retire, None, ("retiring", "1", None, False)),
    ("retire-finishing", "finishing", Child.retire, None, ("retiring", "1", None, False)),
    ("retire-again", "retiring", Child.retire, None, ("retiring", None, None, True)),
    ("retire-stopping", "stopping", Child.retire, ILLEGAL, None),
    ("retire-killed", "killed", Child.retire, ILLEGAL, None),
    ("bye-busy", "busy", lambda k: k.said_bye(ByeReason.MAX_RUNS), None, ("retiring", "1", None, False)),
    ("bye-stopping-stays", "stopping", lambda k: k.said_bye(ByeReason.DRAIN), None, ("stopping", None, None, True)),
    ("terminate-busy", "busy", Child.terminate, None, ("stopping", "1", None, False)),
    ("terminate-killed-stays-killed", "killed", Child.terminate, None, ("killed", None, None, True)),
    ("kill-finishing", "finishing", lambda k: k.kill(KillReason.TIMEOUT), None, ("killed", "1", None, False)),
    ("reaped-idle", "idle", Child.reaped, None, ("idle", None, None, True)),
    ("reaped-busy", "busy-delivered", Child.reaped, None, ("busy", "1", None, True)),
    ("reaped-undelivered-hands-it-on", "busy-undelivered", Child.reaped, R1, ("busy", None, None, False)),
    ("reaped-finishing-next-hands-next-on", "finishing+next", Child.reaped, R2, ("busy", "1", None, False)),
]


@pytest.mark.parametrize("start, transition, returns, after", [case[1:] for case in CASES],
                         ids=[case[0] for case in CASES])
def test_transition(start: str, transition: Callable[[Child], Any], returns: Any,
                    after: tuple[str, str | None, str | None, bool] | None) -> None:
    kid = child_in(start)
    if returns == ILLEGAL:
        before = snapshot(kid)
        with pytest.raises(IllegalTransition):
            transition(kid)
        assert snapshot(kid) == before  # a refused order changes nothing
        return
    assert transition(kid) == returns
    assert snapshot(kid) == after


def test_a_handed_run_clears_the_timed_steps_and_stamps_its_start() -> None:
    kid = child_in("finishing")
    kid.timed_steps["9"] = StepInFlight(run=R1.id, step="9", name="app.slow", started=0.0, timeout=1.0)
    kid.hand(R2, 7.5)
    assert kid.timed_steps == {} and kid.run_started == 7.5


def test_timed_steps_of_another_run_are_ignored() -> None:
    kid = child_in("busy")
    kid.step_timed(StepInFlight(run=R2.id, step="1", name="app.slow", started=0.0, timeout=1.0))
    kid.step_timed(StepInFlight(run=R1.id, step="2", name="app.slow", started=0.0, timeout=1.0))
    assert list(kid.timed_steps) == ["2"]
    kid.step_ended("2")
    assert kid.timed_steps == {}


def test_the_first_kill_reason_and_bye_reason_stand() -> None:
    kid = child_in("busy")
    kid.said_bye(ByeReason.MAX_RUNS)
    kid.leaving(ByeReason.RELOAD)
    kid.kill(KillReason.TIMEOUT)
    kid.kill(KillReason.SHUTDOWN)
    assert (kid.bye_reason, kid.kill_reason) == (ByeReason.MAX_RUNS, KillReason.TIMEOUT)
    assert [name for name, _ in SIGNALS] == ["killpg", "killpg"]


def test_done_counts_runs_and_keeps_what_the_child_last_said_it_owns() -> None:
    kid = child_in("busy")
    kid.done(R1.id, 0)
    assert (kid.runs_done, kid.owned, kid.run_started) == (1, 0, None)
    kid.hand(R2, 3.0)
    kid.done(R2.id, 4096)
    assert (kid.runs_done, kid.owned) == (2, 4096)


def test_an_unknown_bye_reason_reads_as_exit() -> None:
    assert ByeReason.parse("max-runs") == ByeReason.MAX_RUNS
    assert ByeReason.parse("from-a-newer-version") == ByeReason.EXIT


def test_every_command_has_one_request_and_one_reply() -> None:
    assert set(REQUESTS) == set(REPLIES) == set(Command) == set(COMMANDS)
