"""MkDocs hook: expand ``<!-- generated: NAME -->`` placeholders into the
Markdown that ``supervisor.docgen.GENERATED[NAME]`` renders from the live
code (parsers, metrics registry, enums, migrated schema), so the reference
cannot drift from the code. An unknown name fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[2]
# `mkdocs build` documents this checkout, not a copy installed elsewhere.
# MkDocs restores sys.path once this module is loaded: import now.
if sys.path[:1] != [str(ROOT)]:
    sys.path.insert(0, str(ROOT))

from supervisor.docgen import GENERATED  # noqa: E402

PLACEHOLDER = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$", re.MULTILINE)


def expand(markdown: str, where: str = "") -> str:
    """``markdown`` with every placeholder replaced by its generated text."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATED:
            raise PluginError(f"{where}: unknown placeholder <!-- generated: {name} -->; known: {', '.join(GENERATED)}")
        return GENERATED[name]().rstrip("\n")

    return PLACEHOLDER.sub(replace, markdown)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    return expand(markdown, page.file.src_uri)
