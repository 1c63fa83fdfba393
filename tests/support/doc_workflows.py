"""The documentation's example workflows, imported as modules of their own.

A test of what the docs show takes the page's own code, so the example it
checks cannot drift from the one users copy: ``load_example`` finds the
page's first Python block holding a given text, keeps its definitions (a
complete example stops before the part that runs it, ``worker =
Worker(...)``), prepends what a fragment leaves out (``prelude``: the steps
it calls) and imports the result from ``directory`` as module ``name``, so
its workflows register as ``name.<function>`` and their source is readable
(the console's graph reads it).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Callable
from pathlib import Path

from tests.test_doc_examples import ROOT, blocks

#: Where a complete example starts running what it defined.
RUNS_FROM = "worker = Worker("
#: The steps the deploy page's patch fragment calls and does not define.
PATCH_STEPS = '''from everystep import step


@step
def reserve(o):
    return o["sku"]


@step
def add_tax(o):
    return o["amount"] // 10


@step
def charge(o):
    return o["amount"]


@step
def ship(o):
    return f"shipped {o['sku']}"


'''


def example_source(page: str, contains: str) -> str:
    """The definitions of the first Python block of ``docs/<page>`` holding ``contains``."""
    for block in blocks(ROOT / "docs" / page):
        if block.language == "python" and contains in block.source:
            lines = block.source.splitlines()
            end = next((index for index, line in enumerate(lines) if line.startswith(RUNS_FROM)), len(lines))
            return "\n".join(lines[:end]) + "\n"
    raise AssertionError(f"docs/{page} has no Python block holding {contains!r}")


def load_example(page: str, contains: str, name: str, directory: Path, prelude: str = "",
                 change: Callable[[str], str] | None = None) -> types.ModuleType:
    """Import the example (its source through ``change``, if given) as module ``name``."""
    source = example_source(page, contains)
    if change is not None:
        source = change(source)
    path = directory / f"{name}.py"
    path.write_text(prelude + source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
