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

The tutorial is followed as its reader follows it: from an empty directory,
with only the installed packages importable, saving the files its pages
say to save and running the commands of their ``sh`` blocks in page order
(``test_the_tutorial_works_from_an_empty_directory``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
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


# -- the tutorial, from an empty directory -------------------------------------------------------

TUTORIAL = ROOT / "docs" / "tutorial"
#: "Save this as `shop.py`": the next Python block is that file.
SAVE_AS = re.compile(r"Save this as\s+`([^`]+)`")
#: "... and run it with `python first.py`".
RUN_IT = re.compile(r"run it with\s+`(python [^`]+)`")
#: What a reader types that the walk cannot, or must not, type for them.
NOT_TYPED = (
    (re.compile(r"^pip install\b"), "installs the package: the walk runs the code under test"),
    (re.compile(r"^kill\b"), "kills the pids of the page's own output"),
    (re.compile(r"^everystep ui\b"), "serves the console on its fixed port (the browser tests cover the console)"),
)
COMMAND_TIMEOUT = 120.0


def _names_a_documented_id(command: str) -> bool:
    """A run id (or a prefix of one) copied from the page's own output."""
    return any(re.fullmatch(r"[0-9a-f]{4,}(-[0-9a-f]+)*", token) and not token.isdigit()
               for token in shlex.split(command, comments=True))


def tutorial_pages() -> list[Path]:
    """The tutorial's pages in reading order: its index, then the pages
    the index lists."""
    index = TUTORIAL / "index.md"
    listed = re.findall(r"^\d+\. \[[^]]+\]\(([\w-]+\.md)\)", index.read_text(), re.MULTILINE)
    return [index, *(TUTORIAL / name for name in listed)]


@dataclass
class Reader:
    """Someone following the tutorial: a working directory, a shell, and
    the supervisor the pages leave running in another terminal."""

    cwd: Path
    env: dict[str, str]
    log: Path
    typed: list[str] = field(default_factory=list)
    supervisor: subprocess.Popen[bytes] | None = None

    def save(self, name: str, source: str) -> None:
        (self.cwd / name).write_text(source)

    def type(self, command: str) -> None:
        done = subprocess.run(["bash", "-c", command], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT)
        assert done.returncode == 0, f"{command!r} in {self.cwd} exited {done.returncode}:\n{done.stderr[-2000:]}"
        self.typed.append(command)
        tokens = shlex.split(command, comments=True)
        if "cd" in tokens:
            self.cwd = self.cwd / tokens[tokens.index("cd") + 1]

    def start_supervisor(self, command: str) -> None:
        """A supervisor left running in its own terminal (one at a time: a
        page that starts one again has had the reader stop the last)."""
        self.stop_supervisor()
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.supervisor = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        from tests.support.waiting import wait_until

        wait_until(lambda: b"master pid" in self.log.read_bytes()[offset:] or self.supervisor.poll() is not None,
                   f"{command!r} to start", timeout=COMMAND_TIMEOUT)
        assert self.supervisor.poll() is None, f"{command!r} exited:\n{self.log.read_text()[offset:]}"
        self.typed.append(command)

    def stop_supervisor(self) -> None:
        """Ctrl-C twice, as the tutorial says: stop at once, requeueing."""
        if self.supervisor is None:
            return
        self.supervisor.send_signal(signal.SIGQUIT)
        try:
            self.supervisor.wait(COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(self.supervisor.pid, signal.SIGKILL)
            self.supervisor.wait()
        self.supervisor = None


@pytest.fixture
def reader() -> Iterator[Reader]:
    """An empty directory and the installed packages only: ``everystep`` and
    ``supervisor`` (this checkout's, linked), never the repository's other
    directories (``examples``, ``tests``), which a reader's interpreter
    cannot import. Under /tmp, short: the supervisor's control socket is
    made in the working directory, and a Unix socket's path is short."""
    with tempfile.TemporaryDirectory(prefix="es-tut-", dir="/tmp") as top:
        yield from _reader(Path(top))


def _reader(tmp_path: Path) -> Iterator[Reader]:
    installed = tmp_path / "site-packages"
    installed.mkdir()
    for package in ("everystep", "supervisor"):
        (installed / package).symlink_to(ROOT / package)
    start = tmp_path / "home"
    start.mkdir()
    env = example_environment(start)
    del env["EVERYSTEP_DATABASE_URL"]  # the tutorial relies on the default, ./everystep.db
    env["PYTHONPATH"] = str(installed)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    person = Reader(start, env, tmp_path / "supervisor.log")
    try:
        yield person
    finally:
        person.stop_supervisor()


@pytest.mark.timeout(600)
def test_the_tutorial_works_from_an_empty_directory(reader: Reader) -> None:
    """Every page, in order: the files it says to save are saved, and each
    command of its ``sh`` blocks is typed and exits 0, except those a walk
    cannot type (``NOT_TYPED``, and those naming a run id of the page's own
    output). A supervisor started without ``--burst`` keeps running in the
    background, as the pages ask, until a page starts one again."""
    skipped: list[str] = []
    for page in tutorial_pages():
        text = page.read_text().splitlines()
        after = 0  # the line after the previous block's closing fence
        for block in blocks(page):
            prose = "\n".join(text[after:block.line - 1])
            after = block.line + block.source.count("\n") + 1
            saved = SAVE_AS.findall(prose)
            if block.language == "python" and saved:
                reader.save(saved[-1], block.source)
                for command in RUN_IT.findall(prose):
                    reader.type(command)
            if block.language != "sh":
                continue
            for command in filter(None, (line.strip() for line in block.source.splitlines())):
                if any(pattern.search(command) for pattern, _why in NOT_TYPED) or _names_a_documented_id(command):
                    skipped.append(command)
                elif command.startswith("everystep-supervisor --app") and "--burst" not in command:
                    reader.start_supervisor(command)
                else:
                    reader.type(command)
    reader.stop_supervisor()
    assert any(command.startswith("everystep-supervisor") and "--burst" in command for command in reader.typed)
    assert len(reader.typed) > len(skipped), (reader.typed, skipped)
    with sqlite3.connect(reader.cwd / "everystep.db") as db:  # where the tutorial says its runs are
        statuses = dict(db.execute("SELECT status, count(*) FROM everystep_workflow GROUP BY status").fetchall())
    assert statuses.get("completed", 0) >= 11 and "failed" not in statuses, statuses
