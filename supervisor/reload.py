"""Re-importing the app modules for a reload (HUP or ``ctl reload``).

Only the ``--app`` modules themselves are re-imported, in the parent; what
they import stays as it was (restart for a full deploy). A module that fails
to import leaves the running code in place, and the failure is reported in
one line with the file and line where it happened.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from everystep.errors import describe


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
