"""The example Django project's own README works as written: every
``python manage.py`` command it gives exists, ``createsuperuser``
included; its settings give SQLite the lock timeout the Django guide
(docs/how-to/django.md) recommends; and git ignores the database with the
files WAL mode keeps beside it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120)]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "django_app"


def test_every_command_in_the_readme_exists(subprocess_env: dict[str, str]) -> None:
    readme = (EXAMPLE / "README.md").read_text()
    commands = set(re.findall(r"^python manage\.py (\w+)", readme, flags=re.MULTILINE))
    assert {"migrate", "createsuperuser", "runserver", "everystep_supervisor", "test"} <= commands, commands
    listed = subprocess.run([sys.executable, "manage.py", "help", "--commands"], cwd=EXAMPLE, env=subprocess_env,
                            capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    assert listed.returncode == 0, listed.stderr
    assert commands <= set(listed.stdout.split()), sorted(commands - set(listed.stdout.split()))


def test_sqlite_waits_for_locks() -> None:
    tree = ast.parse((EXAMPLE / "shopsite" / "settings.py").read_text())
    [databases] = [node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                   and any(isinstance(target, ast.Name) and target.id == "DATABASES" for target in node.targets)]
    default = ast.literal_eval(ast.unparse(databases).replace("BASE_DIR / 'db.sqlite3'", "'db.sqlite3'"))["default"]
    assert default["ENGINE"] == "django.db.backends.sqlite3"
    assert default["OPTIONS"]["timeout"] >= 5


@pytest.mark.parametrize("name", ["db.sqlite3", "db.sqlite3-wal", "db.sqlite3-shm"])
def test_git_ignores_the_database_files(name: str) -> None:
    if not (EXAMPLE.parent.parent / ".git").exists():
        pytest.skip("not a git checkout")
    done = subprocess.run(["git", "check-ignore", "--no-index", "-q", str(EXAMPLE / name)], cwd=EXAMPLE,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{name} is not ignored"
