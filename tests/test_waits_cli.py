"""The command line's side of waits, in the test process: ``send`` (and
its one-line refusals, exit code 2), ``runs`` and ``show`` saying what a
waiting run waits for, ``runs --parent``, and check-deploy replaying a
waiting run to its wait."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from everystep import dryrun, schedule
from everystep.runner import Outcome
from everystep.store import Store
from tests.apps import waits as apps
from tests.support.cli import run_in_process
from tests.support.runs import execute_run


def everystep(db_url: str, tmp_path: Path, subprocess_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_in_process([*args, "--database", db_url, "--app", "tests.apps.waits"], subprocess_env, tmp_path)


def test_send_runs_and_show(db_url: str, store: Store, tmp_path: Path, subprocess_env: dict[str, str]) -> None:
    run = schedule(apps.checkout, "cli-1", database=store)
    parent = schedule(apps.parent_calls, database=store, timeout=600)
    assert execute_run(store, run.id) == Outcome.RELEASED
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)

    listed = everystep(db_url, tmp_path, subprocess_env, "runs")
    assert listed.returncode == 0, listed.stderr
    assert 'scheduled (waiting for message "paid")' in listed.stdout
    assert f"scheduled (waiting for child {child.id})" in listed.stdout

    children = everystep(db_url, tmp_path, subprocess_env, "runs", "--parent", parent.id)
    assert child.id in children.stdout and run.id not in children.stdout

    shown = everystep(db_url, tmp_path, subprocess_env, "show", parent.id)
    assert "deadline" in shown.stdout and child.id in shown.stdout
    assert f"parent     {parent.id}" in everystep(db_url, tmp_path, subprocess_env, "show", child.id).stdout
    shown = everystep(db_url, tmp_path, subprocess_env, "show", run.id)
    assert "payment_url" in shown.stdout and 'waiting for message "paid"' in shown.stdout

    sent = everystep(db_url, tmp_path, subprocess_env, "send", run.id, "paid", '{"amount": 3}', "--key", "k")
    (message,) = store.messages(run.id)
    assert sent.returncode == 0
    assert sent.stdout == f"message {message.id} sent to run {run.id} on topic 'paid'\n"
    again = everystep(db_url, tmp_path, subprocess_env, "send", run.id, "paid", '{"amount": 4}', "--key", "k")
    assert again.returncode == 0  # the message is there: the key did its job
    assert again.stdout == f"already sent as message {message.id} (same key 'k'); nothing stored\n"
    assert [m.payload for m in store.messages(run.id)] == [{"amount": 3}]


def _waiting_tree(store: Store, top_id: str) -> list[str]:
    """Execute ``top_id`` and every run below it until each waits; their ids."""
    below: list[str] = []
    pending = [top_id]
    while pending:
        run_id = pending.pop()
        assert execute_run(store, run_id) == Outcome.RELEASED
        kids = [kid.id for kid in store.children(run_id)]
        below += kids
        pending += kids
    return below


def test_cancel_counts_the_children_it_cancelled(db_url: str, store: Store, tmp_path: Path,
                                                 subprocess_env: dict[str, str]) -> None:
    parent = schedule(apps.parent_of_waiters, 3, database=store)
    assert len(_waiting_tree(store, parent.id)) == 3
    done = everystep(db_url, tmp_path, subprocess_env, "cancel", parent.id)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"run {parent.id} cancelled (it was scheduled), and its 3 unfinished children\n"

    top = schedule(apps.parent_of_parents, 2, 1, database=store)
    below = _waiting_tree(store, top.id)
    assert len(below) == 4
    everystep(db_url, tmp_path, subprocess_env, "cancel", below[-1])  # one grandchild ended before
    done = everystep(db_url, tmp_path, subprocess_env, "cancel", top.id)
    assert done.stdout == (f"run {top.id} cancelled (it was scheduled), and 3 unfinished runs under it "
                           "(its 2 unfinished children and theirs)\n")
    assert {store.get_run(run_id).status for run_id in below} == {"cancelled"}

    alone = schedule(apps.child_waits, database=store)
    done = everystep(db_url, tmp_path, subprocess_env, "cancel", alone.id)
    assert done.stdout == f"run {alone.id} cancelled (it was scheduled)\n"


def test_refused_sends_exit_2_with_one_line(db_url: str, store: Store, tmp_path: Path,
                                           subprocess_env: dict[str, str]) -> None:
    done = schedule(apps.child_double, 1, database=store)
    assert execute_run(store, done.id) == Outcome.COMPLETED
    for args, fragment in (((done.id, "t", "1"), "is completed"),
                           (("01a2c000-0000-7000-8000-000000000000", "t", "1"), "no run"),
                           ((done.id, "t", "{approved: yes}"), "the message is not valid JSON: ")):
        result = everystep(db_url, tmp_path, subprocess_env, "send", *args)
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1 and fragment in result.stderr
    assert store.messages(done.id) == []


def test_check_deploy_replays_a_waiting_run_to_its_wait(store: Store) -> None:
    run = schedule(apps.approval, "cd", database=store)
    assert execute_run(store, run.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(run.id), store.get_steps(run.id))
    assert verdict.outcome == dryrun.Prediction.RESUMES
    assert 'waits for message "approved"' in verdict.detail
    parent = schedule(apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    verdict = dryrun.replay(store.get_run(parent.id), store.get_steps(parent.id))
    assert f"waits for child {store.children(parent.id)[0].id}" in verdict.detail


def test_show_says_a_cancelled_runs_wait_ended(db_url: str, store: Store, tmp_path: Path,
                                              subprocess_env: dict[str, str]) -> None:
    """A parent cancelled while it waited for its child: its step row is
    still 'waiting', and show says that wait ended with the run."""
    from everystep import admin

    parent = schedule(apps.parent_calls, database=store)
    assert execute_run(store, parent.id) == Outcome.RELEASED
    [child] = store.children(parent.id)
    admin.cancel(store, parent.id)

    shown = everystep(db_url, tmp_path, subprocess_env, "show", parent.id)
    assert shown.returncode == 0, shown.stderr
    (row,) = [line for line in shown.stdout.splitlines() if "everystep.child" in line]
    assert row.split()[1:3] == ["waiting", "(ended)"], row
    assert f"the run ended (cancelled) while waiting for child {child.id}" in row
    assert f"  waiting for child {child.id}" not in shown.stdout
    data = json.loads(everystep(db_url, tmp_path, subprocess_env, "show", parent.id, "--json").stdout)
    (step,) = [s for s in data["steps"] if s["name"] == "everystep.child"]
    assert step["wait_ended"].startswith("the run ended (cancelled) while waiting for child")


def test_runs_lists_only_the_waiting_runs(db_url: str, store: Store, tmp_path: Path,
                                          subprocess_env: dict[str, str]) -> None:
    message = schedule(apps.approval, "w", database=store)
    parent = schedule(apps.parent_calls, database=store)
    due = schedule(apps.approval, "due now, not waiting", database=store)
    done = schedule(apps.child_double, 5, database=store)
    assert execute_run(store, message.id) == execute_run(store, parent.id) == Outcome.RELEASED
    assert execute_run(store, done.id) == Outcome.COMPLETED
    [child] = store.children(parent.id)  # scheduled and due: not waiting

    listed = everystep(db_url, tmp_path, subprocess_env, "runs", "--status", "waiting")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()[1:]
    assert [row.split()[0] for row in rows] == [parent.id, message.id]
    assert f"scheduled (waiting for child {child.id})" in rows[0]
    assert 'scheduled (waiting for message "approved")' in rows[1]
    cut = everystep(db_url, tmp_path, subprocess_env, "runs", "--status", "waiting", "--limit", "1")
    assert cut.stdout.splitlines()[-1] == "showing the newest 1 of 2 runs (--limit N shows more)"
    scheduled = everystep(db_url, tmp_path, subprocess_env, "runs", "--status", "scheduled").stdout
    assert all(run.id in scheduled for run in (message, parent, due, child)) and done.id not in scheduled

    # Among a parent's children too: of two children, the one left waiting.
    waiters = schedule(apps.parent_of_waiters, 2, database=store)
    assert execute_run(store, waiters.id) == Outcome.RELEASED
    first, second = sorted(store.children(waiters.id), key=lambda run: run.id)
    assert execute_run(store, first.id) == Outcome.RELEASED
    kids = everystep(db_url, tmp_path, subprocess_env, "runs", "--parent", waiters.id, "--status", "waiting")
    assert [row.split()[0] for row in kids.stdout.splitlines()[1:]] == [first.id]
    refused = everystep(db_url, tmp_path, subprocess_env, "runs", "--status", "asleep")
    assert refused.returncode == 2 and "'waiting'" in refused.stderr
