"""No dead code in the packages: vulture, configured in pyproject.toml
(``[tool.vulture]``: what it reads, its confidence and why), reports
nothing. What it cannot see being used (Django's hooks, names loaded from a
string) is in ``tests/vulture_whitelist.py`` with its reason; these tests
also keep that list honest, so a name stays there only while vulture would
report it without the list."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import vulture

ROOT = Path(__file__).resolve().parent.parent
WHITELIST = ROOT / "tests" / "vulture_whitelist.py"


def _settings() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as config:
        settings: dict[str, Any] = tomllib.load(config)["tool"]["vulture"]
    return settings


def _unused(paths: list[str]) -> list[Any]:
    settings = _settings()
    finder = vulture.Vulture(ignore_decorators=settings.get("ignore_decorators"))
    finder.scavenge([str(ROOT / path) for path in paths])
    return finder.get_unused_code(min_confidence=settings["min_confidence"])


def test_vulture_finds_no_dead_code() -> None:
    found = [item.get_report() for item in _unused(_settings()["paths"])]
    assert found == [], "dead code (delete it, or whitelist a name used from outside with its reason):\n" + \
        "\n".join(found)


def test_every_whitelisted_name_would_be_reported_without_the_whitelist() -> None:
    packages = [path for path in _settings()["paths"] if (ROOT / path) != WHITELIST]
    reported = {item.name for item in _unused(packages)}
    listed = {line.split("#")[0].strip()[2:] for line in WHITELIST.read_text(encoding="utf-8").splitlines()
              if line.startswith("_.")}
    assert listed, "the whitelist lists names as `_.name` lines"
    assert sorted(listed - reported) == [], "whitelisted but used in the packages (or gone): remove these lines"
