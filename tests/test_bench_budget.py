"""Case 10's reading of case 2's bar as CPU: the arithmetic that says
whether a machine can meet the bar at all, checked on known inputs."""

from __future__ import annotations

import pytest

from bench.run_profile import budget_table
from bench.fleet import Window


def _window(python_s: float, postgres_s: float, runs: int = 1000) -> Window:
    return Window(runs=runs, seconds=1.0, cpu={"python": python_s, "postgres": postgres_s},
                  counts={}, waits={}, rate={"runs_per_s": 300.0})


def test_budget_is_the_cores_over_the_runs_the_bar_needs() -> None:
    table, ceiling = budget_table([(2800.0, 90.0), (3200.0, 110.0)], _window(2.0, 1.0), 4.0, cores=2)
    rows = {row[0]: row[1] for row in table.rows}
    # 40 % of 3,000 commits/s is 1,200 step commits/s, 400 runs of 3 steps:
    # 2 cores give each of them 5,000 µs; a run took 3,000, so all cores
    # busy would give 666 runs/s, 2,000 step commits/s, 67 % of pgbench.
    assert rows["the bar: 40 % of their mean, step commits/s (runs/s at 3 steps)"] == "1,200 (400)"
    assert rows["CPU per run the 2 cores allow at that rate"] == "5,000 µs"
    assert rows["of which PostgreSQL alone"] == "1,000 µs (20 % of it)"
    assert rows["a run's 4.0 round trips at that price"] == "400 µs"
    assert ceiling == pytest.approx(2 / 3)


def test_a_run_dearer_than_the_budget_puts_the_ceiling_below_the_bar() -> None:
    _table, ceiling = budget_table([(7000.0, 120.0)], _window(3.5, 2.3), 3.9, cores=2)
    assert ceiling < 0.40


def test_each_window_is_read_against_the_pgbench_runs_on_either_side() -> None:
    from bench.run_profile import cpu_ratios, cpu_targets

    # pgbench 100 µs, then 120, then 140: window 1 against 110, window 2 against 130.
    windows = [_window(1.1, 0.55), _window(1.3, 1.3)]
    total, server = cpu_ratios([(5000.0, 100.0), (5000.0, 120.0), (5000.0, 140.0)], windows)
    assert total.values == pytest.approx([15.0, 20.0])
    assert server.values == pytest.approx([5.0, 10.0])
    notes = cpu_targets([(5000.0, 100.0), (5000.0, 120.0), (5000.0, 140.0)], windows)
    assert "**missed** (17.5, 15.0–20.0 over 2 windows)" in notes[0]  # the median decides
    assert "**met** (7.5, 5.0–10.0 over 2 windows)" in notes[1]  # one window over 8: the median is not


def test_windows_read_together_sum_their_work_and_average_their_samples() -> None:
    from bench.run_profile import together

    first = Window(runs=1000, seconds=2.0, cpu={"python": 1.0, "postgres": 0.5}, counts={"completed": 1000},
                   waits={"event:CPU": 0.2}, rate={"runs_per_s": 500.0})
    second = Window(runs=3000, seconds=4.0, cpu={"python": 3.0, "postgres": 2.5}, counts={"completed": 3000},
                    waits={"event:CPU": 0.4}, rate={"runs_per_s": 750.0})
    both = together([first, second])
    assert (both.runs, both.seconds, both.counts) == (4000, 6.0, {"completed": 4000})
    assert both.per_run_us("python") == pytest.approx(1000.0)
    assert both.per_run_us("postgres") == pytest.approx(750.0)
    assert both.waits == pytest.approx({"event:CPU": 0.3})
    assert both.rate == pytest.approx({"runs_per_s": 625.0})
