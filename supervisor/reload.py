"""A reload (HUP or ``ctl reload``): re-import the app modules, then
replace every child.

Only the ``--app`` modules themselves are re-imported, in the parent; what
they import stays as it was (restart for a full deploy). A module that fails
to import leaves the running code in place, and the failure is reported in
one line with the file and line where it happened. The arbiter replaces the
children (``Arbiter.replace_children``): idle ones at once, busy ones at
their next step boundary; each new child forks from the re-imported parent.
The new code is imported with the garbage collector off and frozen before
any replacement child is forked (``heap``), so it is shared like the first.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from everystep import versions
from everystep.errors import describe

from . import heap
from .protocol import ErrorReply, ReloadReply, Reply
from .reporting import plural, status_line
from .states import ByeReason

if TYPE_CHECKING:
    from .view import Operable

logger = logging.getLogger("everystep.supervisor")


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


def reload(arbiter: Operable, who: str) -> Reply:
    """Re-import the app modules, then replace every child. A module that
    fails to import leaves everything as it was, and says so."""
    if arbiter.stopping:
        return ErrorReply("the supervisor is stopping")
    arbiter.notifier.reloading()
    heap.reloading()
    try:
        modules = reimport(arbiter.config.app)
    except ReloadFailed as exc:
        heap.reloaded(imported=False)
        logger.error("%s: %s; keeping the running code (%s)", arbiter.who, exc, who,
                     exc_info=exc.__cause__ is not None and logger.isEnabledFor(logging.DEBUG))
        arbiter.notifier.ready(status_line(arbiter))
        return ErrorReply(f"{exc}; keeping the running code")
    took = heap.reloaded(imported=True)
    logger.debug("%s: old code collected, new code frozen in %.1f ms", arbiter.who, took * 1000)
    arbiter.loop.refresh_names()
    arbiter.loop.serve_versions(versions.served(arbiter.config.serve_versions))
    replacing = arbiter.replace_children(ByeReason.RELOAD)
    arbiter.notifier.ready(status_line(arbiter))
    logger.info("%s: reloaded %s; replacing %s (%s)", arbiter.who, ", ".join(modules) or "no modules",
                plural(replacing, "child", "children"), who)
    return ReloadReply(modules=modules, replacing=replacing)
