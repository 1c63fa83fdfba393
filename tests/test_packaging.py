"""What a user's ``pip install everystep`` gets: the wheel built from this
tree (as pip builds it, in an isolated build environment) ships the
``py.typed`` markers, so type checkers read everystep's annotations, and
declares the Pythons CI tests (``.ci/run``: the whole suite on its default
python, the fast lane on each other declared one, ``.ci/other-pythons``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
PYTHON = "Programming Language :: Python :: "


def declared_pythons() -> list[str]:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        classifiers = tomllib.load(handle)["project"]["classifiers"]
    return [c.removeprefix(PYTHON) for c in classifiers if c.startswith(PYTHON + "3.")]


def test_the_wheel_ships_py_typed_and_declares_the_pythons_tested(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("everystep", "supervisor"):
        shutil.copytree(ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=280)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "dist").glob("everystep-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [name for name in names if name.endswith(".dist-info/METADATA")]
        classifiers = [line.removeprefix("Classifier: ") for line in archive.read(metadata).decode().splitlines()
                       if line.startswith("Classifier: ")]
    assert {"everystep/py.typed", "supervisor/py.typed"} <= names
    assert "Typing :: Typed" in classifiers
    assert [c.removeprefix(PYTHON) for c in classifiers if c.startswith(PYTHON + "3.")] == ["3.11", "3.12", "3.13"]


def test_the_declared_pythons_start_at_the_required_one() -> None:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        required = tomllib.load(handle)["project"]["requires-python"]
    assert required == f">={declared_pythons()[0]}"
