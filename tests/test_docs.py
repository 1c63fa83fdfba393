"""The documentation site: it builds under ``--strict``, its reference says
what the code does, and the code gives the reference something to say.

The site is built once per module (per xdist worker), by MkDocs itself: a
broken link, a page missing from the nav, or a mkdocstrings directive naming
something removed fails ``test_site_builds_strict``. The reference tests
read the built HTML, so they check what a reader sees; the parsers and the
metrics registry they compare it with are the live ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import everystep
from everystep import cli as everystep_cli
from everystep import docgen, metrics
from supervisor import cli as supervisor_cli
from supervisor import docgen as supervisor_docgen
from supervisor import protocol

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"
README_LIMIT = 200
BUILD_TIMEOUT = 120
README_COMMANDS = (
    "pip install -e . && everystep schedule --app examples.app examples.app.crunch '{\"n\": 200000}' --count 100 "
    "&& everystep-supervisor --app examples.app --procs 2 --burst",
    "pip install -e '.[test]' && python -m pytest -n auto",
)


class Site:
    def __init__(self, directory: Path, failure: str | None, warnings: list[str]) -> None:
        self.directory = directory
        self.failure = failure
        self.warnings = warnings

    def text(self, page: str) -> str:
        """The article of ``page`` (``reference/metrics``) as plain text."""
        path = self.directory / page / "index.html"
        assert path.exists(), f"{page} was not built ({self.failure or 'no failure reported'})"
        body = path.read_text()
        start, end = body.find("<article"), body.find("</article>")
        return html.unescape(re.sub(r"<[^>]+>", "", body[start:end] if start >= 0 else body))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site as ``mkdocs build --strict`` builds it, in a process of its
    own (griffe runs git; the hook imports the whole code base). A strict
    failure is kept, not raised: MkDocs writes the pages before it counts
    the warnings, and the reference tests still read them."""
    directory = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    env.pop(metrics.MULTIPROC_ENV, None)
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(directory)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    output = (done.stdout + done.stderr).splitlines()
    warnings = [line for line in output if line.startswith(("WARNING", "ERROR"))]
    verdict = [line for line in output if line.startswith("Aborted")] or output[-1:] or ["(no output)"]
    failure = None if done.returncode == 0 else f"mkdocs exited {done.returncode}: {verdict[-1]}"
    return Site(directory, failure, warnings)


def test_site_builds_strict(site: Site) -> None:
    assert site.failure is None and not site.warnings, "\n".join([site.failure or "", *site.warnings])


# -- the command-line references -------------------------------------------------------------------

PARSERS = {
    "everystep": (everystep_cli.build_parser, "reference/everystep-cli"),
    "everystep-supervisor": (supervisor_cli.build_parser, "reference/supervisor-cli"),
    "everystep-supervisor ctl": (supervisor_cli.build_ctl_parser, "reference/supervisor-cli"),
}


def _commands() -> Iterator[tuple[str, tuple[str, ...]]]:
    for prog, (build, _page) in PARSERS.items():
        for path, _parser in docgen.walk(build()):
            yield prog, path


def _parser_at(prog: str, path: tuple[str, ...]) -> argparse.ArgumentParser:
    return dict(docgen.walk(PARSERS[prog][0]()))[path]


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize(("prog", "path"), list(_commands()),
                         ids=[":".join((prog, *path)) for prog, path in _commands()])
def test_cli_reference_lists_every_option(site: Site, prog: str, path: tuple[str, ...]) -> None:
    """Every subcommand of both commands has its heading, and each of its
    arguments (every flag, every positional's metavar) is on the page."""
    text = site.text(PARSERS[prog][1])
    parser = _parser_at(prog, path)
    if path:
        assert re.search(rf"^{re.escape(' '.join(path))}¶?$", text, re.MULTILINE), f"no heading for {prog} {path}"
    missing = [word for action in docgen.documented_actions(parser)
               for word in (action.option_strings or [str(action.metavar or action.dest)])
               if not _mentions(text, word)]
    assert not missing, f"{prog} {' '.join(path)}: {missing} missing from {PARSERS[prog][1]}"


@pytest.mark.parametrize("prog", list(PARSERS))
def test_every_option_has_help(prog: str) -> None:
    """An option without help text would be a blank line in the reference
    (hidden ones, ``help=argparse.SUPPRESS``, are meant to be hidden)."""
    assert docgen.undocumented_options(PARSERS[prog][0]()) == []


@pytest.mark.parametrize("prog", list(PARSERS))
def test_no_option_is_described_with_the_same_note_twice(prog: str) -> None:
    """An option whose help says "(required)" was given a second one by the
    generator: ``prune --older-than … (required) (required)``."""
    markdown = docgen.cli_markdown(PARSERS[prog][0]())
    doubled = [line for line in markdown.splitlines()
               if re.search(r"\(([^()]+)\)\s*\(\1\)", line) or line.count("required") > 1]
    assert doubled == []
    if prog == "everystep":
        assert "- `--older-than DURATION`: runs finished longer ago than this: 90s, 10m, 2h, 30d (required)" in markdown


def test_undocumented_option_is_caught() -> None:
    parser = argparse.ArgumentParser(prog="demo")
    commands = parser.add_subparsers(dest="command")
    sub = commands.add_parser("go", help="go somewhere")
    sub.add_argument("--far")
    sub.add_argument("--hidden", help=argparse.SUPPRESS)
    commands.add_parser("stay")
    assert sorted(docgen.undocumented_options(parser)) == ["demo go --far", "demo stay (no summary)"]


# -- metrics, control socket, statuses, environment, tables, API -----------------------------------


def test_metrics_reference_lists_every_metric(site: Site) -> None:
    text = site.text("reference/metrics")
    infos = docgen.metric_infos()
    assert infos
    missing = [info.name for info in infos if not _mentions(text, info.name)]
    assert not missing, f"metrics missing from the reference: {missing}"
    for info in infos:
        for label in info.labels:
            assert _mentions(text, label)


def test_every_metric_has_help() -> None:
    assert [info.name for info in docgen.metric_infos() if not info.help.strip()] == []


def test_control_socket_reference_lists_every_command(site: Site) -> None:
    text = site.text("reference/control-socket")
    for command, request in protocol.REQUESTS.items():
        assert re.search(rf"^{command}¶?$", text, re.MULTILINE), f"no section for {command}"
        for name in (field.name for cls in (request, protocol.REPLIES[command]) for field in dataclasses.fields(cls)):
            assert _mentions(text, name), f"{command}: field {name} missing"


def test_statuses_reference_lists_every_status(site: Site) -> None:
    text = site.text("reference/statuses")
    for enum in (everystep.models.RunStatus, everystep.models.StepStatus, everystep.models.RequestStatus):
        for member in enum:
            assert _mentions(text, member.value), f"{enum.__name__}.{member.name}"


def test_every_status_has_a_meaning() -> None:
    """A status is declared with its meaning (a member without one does not
    import), and the reference prints it."""
    markdown = docgen.statuses_markdown()
    models = everystep.models
    for enum in (models.RunStatus, models.StepStatus, models.RequestStatus):
        for member in enum:
            assert member.meaning.strip() and member.meaning in markdown, member


def test_exit_codes_reference(site: Site) -> None:
    text = site.text("reference/exit-codes")
    for codes in (everystep.cliutil.EXIT_CODES, supervisor_cli.EXIT_CODES):
        for meaning in codes.values():
            assert meaning in text


_ENV_NAME = re.compile(r"\bEVERYSTEP_[A-Z0-9_]+\b")
_ENV_READ = re.compile(r"""(?:environ|env)(?:\.get|\.pop)?\(\s*["']([A-Z][A-Z0-9_]+)["']|environ\[\s*["']([A-Z][A-Z0-9_]+)["']""")


_TEST_ENV_NAME = re.compile(r"\bEVERYSTEP_TEST_[A-Z0-9_]+\b")


def _names_read(paths: list[Path], only_ours: bool = False) -> dict[str, str]:
    """Variable names in ``paths``: every ``EVERYSTEP_…`` one and every one
    read by a literal name; with ``only_ours``, the ``EVERYSTEP_TEST_…`` ones."""
    found: dict[str, str] = {}
    for path in paths:
        source = path.read_text()
        for match in (_TEST_ENV_NAME if only_ours else _ENV_NAME).finditer(source):
            found.setdefault(match.group(0), str(path.relative_to(ROOT)))
        for match in () if only_ours else _ENV_READ.finditer(source):
            found.setdefault(match.group(1) or match.group(2), str(path.relative_to(ROOT)))
    return found


def test_environment_reference_lists_every_variable_the_code_reads(site: Site) -> None:
    """Every ``EVERYSTEP_…`` name in the library and the supervisor, and
    every variable they read by a literal name, is in the documented list
    (``docgen.ENVIRONMENT``, ``supervisor.docgen.ENVIRONMENT``); the test
    suite's own are on the page too."""
    documented = {var.name for var in (*docgen.ENVIRONMENT, *supervisor_docgen.ENVIRONMENT)}
    code = sorted((ROOT / "everystep").rglob("*.py")) + sorted((ROOT / "supervisor").rglob("*.py"))
    read = _names_read(code)
    assert "EVERYSTEP_DATABASE_URL" in read  # the scan finds what it should
    missing = {name: where for name, where in read.items() if name not in documented}
    assert not missing, f"environment variables read but not documented: {missing}"
    text = site.text("reference/environment")
    # The suite's own settings (it passes PYTHONPATH and the like to its children: not settings).
    suite = _names_read([ROOT / "tests" / "conftest.py", *sorted((ROOT / "tests" / "support").glob("*.py"))],
                        only_ours=True)
    for name in (*documented, *suite):
        assert _mentions(text, name), f"{name} missing from reference/environment"


def test_tables_reference_lists_every_table_and_column(site: Site) -> None:
    text = site.text("reference/tables")
    tables = docgen.schema()
    assert "everystep_workflow" in tables and "everystep_step" in tables
    for name, spec in tables.items():
        assert _mentions(text, name)
        for column in spec["columns"]:
            assert _mentions(text, column[0]), f"{name}.{column[0]}"


def test_python_api_reference_covers_all(site: Site) -> None:
    """Every name ``everystep`` exports has its mkdocstrings directive (and
    the strict build fails on one naming something that is gone)."""
    source = (REFERENCE / "python-api.md").read_text()
    directives = set(re.findall(r"^::: everystep\.(\w+)\s*$", source, re.MULTILINE))
    assert set(everystep.__all__) - directives == set()
    assert directives - set(everystep.__all__) == set(), "directives for names everystep does not export"
    text = site.text("reference/python-api")
    for name in everystep.__all__:
        assert f"everystep.{name}" in text


def test_the_api_reference_names_the_fields_of_small_records() -> None:
    """The reference renders a class's docstring under its signature: a
    record of a field or two names each field as the signature spells it
    (``ChildHandle``'s said "its id" beside ``run_id``)."""
    import dataclasses
    import inspect

    small = [getattr(everystep, name) for name in everystep.__all__
             if dataclasses.is_dataclass(getattr(everystep, name))
             and len(dataclasses.fields(getattr(everystep, name))) <= 2]
    assert small, "no small record exported: the check would check nothing"
    unnamed = [f"{record.__name__}.{field.name}" for record in small for field in dataclasses.fields(record)
               if f"``{field.name}``" not in (inspect.getdoc(record) or "")]
    assert unnamed == []


def test_every_placeholder_is_known_and_used() -> None:
    """Each generator has a page, and each page's placeholders a generator."""
    used = set()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for name in re.findall(r"^<!-- generated: ([a-z0-9-]+) -->$", page.read_text(), re.MULTILINE):
            assert name in supervisor_docgen.GENERATED, f"{page}: unknown placeholder {name}"
            used.add(name)
    assert set(supervisor_docgen.GENERATED) - used == set()


# -- README --------------------------------------------------------------------------------------


def test_readme_is_short_and_starts_people_off() -> None:
    """The README is the front door: at most 200 lines, with the two
    commands that try everystep and run its tests, verbatim; the rest lives
    on the site."""
    text = (ROOT / "README.md").read_text()
    missing = [command for command in README_COMMANDS if command not in text]
    assert not missing, f"README.md lacks {missing}"
    # The test command is what CI runs for the whole suite.
    assert README_COMMANDS[1] in (ROOT / ".ci" / "run").read_text()
    count = len(text.splitlines())
    assert count <= README_LIMIT, f"README.md has {count} lines; at most {README_LIMIT}"
