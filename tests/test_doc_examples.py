"""Every Python example in the README and the documentation runs.

Each ```python block of ``README.md`` and ``docs/**/*.md`` is run on its own
in a fresh interpreter: working directory a temporary one, the repository on
``PYTHONPATH``, the embedded SQLite database there (``EVERYSTEP_DATABASE_URL``
points at a file in it), ``HOME`` there too, and connections to PostgreSQL
or MariaDB refused, so no example touches a real server or the developer's
files. A block right after a line that is exactly ``<!-- fragment -->`` is
a piece of a larger program (a settings file, a handler) and is not run on
purpose; it must still parse, and import only names that exist. A block labelled otherwise as
Python (```py, ```python3) or not labelled at all would dodge the runner:
``test_every_block_is_labelled`` refuses both.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAGMENT = "<!-- fragment -->"
EXAMPLE_TIMEOUT = 60.0
#: Labels that mean Python but that the runner does not take: say ```python.
PYTHON_ALIASES = {"py", "python3", "py3", "pycon", "python2"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")

#: Run before each example: refuse the client libraries' connections, so an
#: example naming a server URL fails rather than reaching one.
GUARD = """\
import runpy, sys

def _refuse(*args, **kwargs):
    raise RuntimeError("documentation examples run on the embedded SQLite database only")

try:
    import psycopg
except ImportError:
    pass
else:
    psycopg.connect = _refuse
    psycopg.Connection.connect = classmethod(_refuse)
    psycopg.AsyncConnection.connect = classmethod(_refuse)
try:
    import pymysql
except ImportError:
    pass
else:
    pymysql.connect = pymysql.Connect = _refuse
    pymysql.connections.Connection.connect = _refuse

sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # of the opening fence, 1-based
    info: str  # the fence's info string
    fragment: bool
    source: str

    @property
    def language(self) -> str:
        return self.info.strip().split(" ", 1)[0].strip("{}.").lower() if self.info.strip() else ""

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return files + sorted((ROOT / "docs").rglob("*.md"))


def blocks(path: Path, name: str | None = None) -> list[Block]:
    """The fenced code blocks of ``path``, indented ones (in lists,
    admonitions) included, their text dedented by the fence's indent."""
    found = []
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
            index += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        previous = lines[index - 1].strip() if index else ""
        body = []
        end = index + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if closing and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) \
                    and not closing["info"].strip():
                break
            body.append(lines[end][indent:] if lines[end][:indent].strip() == "" else lines[end].lstrip())
            end += 1
        found.append(Block(name or str(path.relative_to(ROOT)), index + 1, match["info"], previous == FRAGMENT,
                           "\n".join(body) + "\n"))
        index = end + 1
    return found


ALL_BLOCKS = [block for path in markdown_files() for block in blocks(path)]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.language == "python"]
RUNNABLE = [block for block in PYTHON_BLOCKS if not block.fragment]
FRAGMENTS = [block for block in PYTHON_BLOCKS if block.fragment]
#: The packages a fragment's imports are checked against.
OUR_PACKAGES = {"everystep", "supervisor"}


def example_environment(directory: Path) -> dict[str, str]:
    """The environment an example runs in: nothing of the developer's
    database settings, everything of its own in ``directory``."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("EVERYSTEP_", "PG", "MYSQL", "MARIADB", "DATABASE_", "PROMETHEUS_", "DJANGO_"))
           and name not in ("NOTIFY_SOCKET", "RUNTIME_DIRECTORY", "PYTHONSTARTUP")}
    env.update({
        "PYTHONPATH": str(ROOT),
        "HOME": str(directory),
        "TMPDIR": str(directory),
        "EVERYSTEP_DATABASE_URL": f"sqlite:///{directory / 'everystep.db'}",
        "PYTHONDONTWRITEBYTECODE": "1",
    })
    return env


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_example_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.source)
    try:
        done = subprocess.run([sys.executable, "-c", GUARD, str(script)], cwd=tmp_path,
                              env=example_environment(tmp_path), capture_output=True, text=True,
                              timeout=EXAMPLE_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{block.id}: still running after {EXAMPLE_TIMEOUT:g} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"{block.id} exited {done.returncode} (mark it {FRAGMENT} if it is not meant to run "
                    f"alone)\n{done.stderr[-3000:]}", pytrace=False)


def missing_imports(source: str) -> list[str]:
    """The names ``source`` imports from this project that do not exist."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in OUR_PACKAGES:
            module = importlib.import_module(node.module or "")
            missing += [f"{node.module}.{alias.name}" for alias in node.names
                        if alias.name != "*" and not hasattr(module, alias.name)
                        and importlib.util.find_spec(f"{node.module}.{alias.name}") is None]
        elif isinstance(node, ast.Import):
            missing += [alias.name for alias in node.names if alias.name.split(".")[0] in OUR_PACKAGES
                        and importlib.util.find_spec(alias.name) is None]
    return missing


def test_missing_imports_are_found() -> None:
    assert missing_imports("from everystep import step, no_such_name\nimport everystep.nope\nimport json") == [
        "everystep.no_such_name", "everystep.nope"]


@pytest.mark.parametrize("block", FRAGMENTS, ids=[block.id for block in FRAGMENTS])
def test_fragment_is_python_of_this_api(block: Block) -> None:
    """A block not run on purpose is still checked: it parses, and every
    name it imports from everystep (or the supervisor) exists, so a renamed
    function breaks the page that shows it."""
    try:
        missing = missing_imports(block.source)
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: not Python: {exc}", pytrace=False)
    assert not missing, f"{block.id} imports names that do not exist: {', '.join(missing)}"


def test_every_block_is_labelled() -> None:
    """No block hides from the runner: every fence names its language, and
    Python is always ```python."""
    dodging = [f"{block.id} ({block.info.strip() or 'no language'})" for block in ALL_BLOCKS
               if not block.language or block.language in PYTHON_ALIASES]
    assert not dodging, "label these blocks (```python to run one, ```text or ```console otherwise): " + \
        ", ".join(dodging)


def test_block_parser(tmp_path: Path) -> None:
    """Fences in lists and admonitions are found; the fragment marker is the
    line right before the fence, exactly."""
    sample = tmp_path / "sample.md"
    text = ("intro\n\n```python\nprint(1)\n```\n\n<!-- fragment -->\n```python\nsettings = 1\n```\n\n"
            "- a list item:\n\n    ```python\n    x = 1\n    if x:\n        print(x)\n    ```\n\n"
            "````text\n```python\nnot a block\n```\n````\n\n```\nbare\n```\n")
    sample.write_text(text)
    found = blocks(sample, "sample.md")
    assert [(b.line, b.language, b.fragment) for b in found] == [
        (3, "python", False), (8, "python", True), (14, "python", False), (20, "text", False), (26, "", False)]
    assert found[2].source == "x = 1\nif x:\n    print(x)\n"
