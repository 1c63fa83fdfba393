"""Smoke test of the benchmark harness: ``python -m bench --smoke`` (the
quick mode's cases at the smallest sizes) produces its report and charts
with every case present. It asserts nothing about
speed, and passes without the ``bench`` extra's peers (no DBOS or
Procrastinate: they are then reported as not installed); matplotlib, which
draws the charts, is in the ``test`` extra."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_benchmark_writes_report_and_chart(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "bench", "--smoke", "--out", str(tmp_path)]
    server = os.environ.get("EVERYSTEP_TEST_DATABASE_URL")
    if server:
        cmd += ["--database", server]
    # On a timeout the bench gets SIGTERM, never SIGKILL: it then stops the
    # PostgreSQL cluster it started instead of leaving it running.
    bench = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stdout, _ = bench.communicate(timeout=840)
    except subprocess.TimeoutExpired:
        bench.terminate()
        stdout, _ = bench.communicate(timeout=50)
        pytest.fail(f"the bench smoke run took over 840 s\n{stdout[-4000:]}")
    output = stdout[-4000:]
    assert bench.returncode == 0, output

    report = (tmp_path / "RESULTS.md").read_text()
    for case in [*range(1, 11), 12, 13, 14, 16, 17, 18, 19, 20]:
        match = re.search(rf"^## Case {case} .*?(?=^## |\Z)", report, re.M | re.S)
        assert match, f"case {case} missing from RESULTS.md\n{output}"
        assert re.search(r"^\|---", match.group(0), re.M), f"case {case} has no table"
    assert "nproc" in report and "PostgreSQL" in report
    assert "read as a CPU budget" in report and "could reach at most" in report

    assert "## Scaling" in report and "![scaleout.png](scaleout.png)" in report
    for name in ("throughput.png", "scaleout.png", "history.png"):
        chart = (tmp_path / name).read_bytes()
        assert chart.startswith(b"\x89PNG\r\n\x1a\n") and len(chart) > 1000, name
