"""The type checker is part of the suite: ``mypy`` (strict, as configured in
pyproject.toml) over the library and the supervisor reports nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_mypy_strict_reports_no_error() -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "everystep", "supervisor"], cwd=ROOT,
                          capture_output=True, text=True, timeout=590)
    assert done.returncode == 0, done.stdout + done.stderr
