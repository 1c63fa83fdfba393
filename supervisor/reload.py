"""Re-importing the app modules for a reload (HUP or ``ctl reload``).

Only the ``--app`` modules themselves are re-imported, in the parent; what
they import stays as it was (restart for a full deploy). A module that fails
to import leaves the running code in place, and the failure is reported in
one line with the file and line where it happened.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Sequence


class ReloadFailed(Exception):
    """A module could not be re-imported; the message is one line."""


def reimport(modules: Sequence[str]) -> list[str]:
    """Re-import ``modules`` in order; returns them, or raises ``ReloadFailed``."""
    for module in modules:
        try:
            if module in sys.modules:
                importlib.reload(sys.modules[module])
            else:
                importlib.import_module(module)
        except Exception as exc:
            raise ReloadFailed(f"reload of {module} failed: {describe(exc)}") from exc
    return list(modules)


def describe(exc: BaseException) -> str:
    """``Type: message (file:line)``, where the line is the deepest frame of
    the failure (or a SyntaxError's own position)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        text = exc.msg
        where = f"{exc.filename}:{exc.lineno}"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    return f"{type(exc).__name__}: {text}" + (f" ({where})" if where else "")
