"""The chaos suite in its short form (the long one: ``python -m tests.chaos``)."""

from __future__ import annotations

import pytest

from tests.chaos.harness import ChaosConfig, run_chaos
from tests.support.pgbouncer import find_pgbouncer


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_short(tmp_path, capsys):
    report = run_chaos(ChaosConfig(runs=60, duration=30.0, fault_every=2.0, seed=20261130, loops=2), tmp_path)
    with capsys.disabled():
        print("\n" + report.line())
    assert report.violations == [], "\n".join(report.violations[:20])
    assert report.counts["completed"] + report.counts["stopped"] == report.counts["runs"]
    assert report.counts["duplicated_unsafe_effects"] == 0
    # Talking runs exchanged their three messages (one sent from the body
    # itself) and started their child once each.
    assert report.counts["talking"] > 0
    assert report.counts["children"] == report.counts["talking"]
    assert report.counts["messages_consumed"] == 3 * report.counts["talking"]
    faults = sum(report.counts[k] for k in ("child_kills", "supervisor_kills", "rollouts", "pg_restarts"))
    assert faults >= 5
    # Two runs that live for ever, 1,200 numbers each, continued as new
    # every 500 messages: every message consumed once across their chains.
    assert report.counts["loops"] == 2 and report.counts["loop_continuations"] == 2 * 2
    assert report.counts["loop_messages"] == 2 * (1200 + 1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_through_pgbouncer(tmp_path, capsys):
    """PgBouncer in transaction mode between the runners and PostgreSQL,
    itself reconnected, killed and restarted while runs are in flight."""
    if find_pgbouncer() is None:
        pytest.skip("PgBouncer unavailable: pgbouncer is not installed (apt-get install pgbouncer)")
    report = run_chaos(ChaosConfig(runs=60, duration=30.0, fault_every=1.5, seed=20261206, pooler=True, loops=1),
                       tmp_path)
    with capsys.disabled():
        print("\n" + report.line())
    assert report.violations == [], "\n".join(report.violations[:20])
    assert report.counts["completed"] + report.counts["stopped"] == report.counts["runs"]
    assert report.counts["duplicated_unsafe_effects"] == 0
    assert all(report.counts[k] >= 1 for k in ("pooler_reconnects", "pooler_kills", "pooler_restarts")), report.line()
    assert report.counts["loop_continuations"] == 2 and report.counts["loop_messages"] == 1200 + 1
