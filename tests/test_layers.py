"""The engine's layers hold: no module imports from a layer above its own,
and the library never imports the supervisor (the contracts are in
pyproject.toml's ``[tool.importlinter]``; import-linter reads the import
graph, direct and indirect, without running the code)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept() -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                           "sys.exit(lint_imports_command())"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "Contracts: 2 kept, 0 broken." in done.stdout, done.stdout[-2000:]


#: Imports inside a function body, each with why it is not at the top of its
#: module. Anything else is a cycle being dodged: move it up, and let the
#: contracts above say whether the layers allow it.
DEFERRED = {
    ("everystep/cli/serve.py", "everystep.web.serve"): "the console needs the [ui] extra",
    ("everystep/web/__init__.py", "everystep.web.app"): "the console needs the [ui] extra",
    ("everystep/cron_schedule.py", "cronsim"): "cron needs the [cron] extra",
    ("everystep/web/serve.py", "uvicorn"): "the console needs the [ui] extra",
    ("everystep/cliutil.py", "importlib.metadata"): "only --version reads the installed version",
    ("everystep/cliutil.py", "everystep"): "--version from a checkout that is not installed",
    ("everystep/metrics.py", "prometheus_client"): "its multiprocess directory is read when it is first imported",
    ("everystep/store/borrowed.py", "psycopg"): "an async caller's connection; psycopg is the only one",
}


def _deferred_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((ROOT / "everystep").rglob("*.py")):
        if "contrib" in path.parts:  # Django loads its apps' modules in its own order
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):
                    module = _absolute(path, inner)
                    found.add((str(path.relative_to(ROOT)), module))
                elif isinstance(inner, ast.Import):
                    found.update((str(path.relative_to(ROOT)), alias.name) for alias in inner.names)
    return found


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    base = package[:len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def test_no_import_is_deferred_to_dodge_a_cycle() -> None:
    deferred = _deferred_imports()
    unexplained = sorted(item for item in deferred if item not in DEFERRED)
    assert unexplained == [], "imports inside functions with no reason given in DEFERRED"


def test_no_module_imports_another_s_private_names() -> None:
    """A name with a leading underscore is its module's own: another module
    that needs it needs a public name (``from x import _y`` is refused)."""
    found = []
    for path in sorted([*(ROOT / "everystep").rglob("*.py"), *(ROOT / "supervisor").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                found += [f"{path.relative_to(ROOT)}: {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []
