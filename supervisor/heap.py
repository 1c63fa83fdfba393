"""Keeping the app's heap shared between the parent and its children.

The parent imports the app, then forks: every child starts with the app's
objects on pages it shares with the parent, copy-on-write. CPython's cyclic
garbage collector writes to the header of every object it tracks when it
examines it; the first full collection in a child would touch every page
holding an app object, and the kernel would copy each one into the child.
A 270 MB app then costs about 270 MB per child instead of a few.

So the supervisor follows the recipe of ``gc.freeze()``'s documentation:

- **at start**, the collector is disabled before the app is imported
  (``hold``), so no collection frees objects and leaves holes that later
  allocations would fill, in the child, on shared pages;
- **right before each fork** (``before_fork``) every tracked object is
  moved to the permanent generation, which no collection ever examines:
  the app's objects, and what the parent made since;
- **in the child** the collector is enabled at once (``in_child``): it
  collects the child's own objects normally and never the frozen ones.

The parent goes on allocating as it claims and hands out runs. So that
nothing it allocates per run piles up in the frozen set, the parent's own
collector runs between forks (``after_fork``), and a fork that follows
parent activity collects first (frozen objects are not examined, so this
costs only the parent's own young objects), then freezes what is alive. A
reload imports the new code with the collector off (``reloading``), then
(``reloaded``) unfreezes, collects the old code's objects in one full
collection and freezes the new code before any replacement child is forked.
"""

from __future__ import annotations

import gc
import time


def hold() -> None:
    """Before the app is imported: no collection until the first fork."""
    gc.disable()


def before_fork() -> float:
    """Freeze every tracked object, for the fork about to happen; returns
    the seconds it took (a collection first, if the parent has run since)."""
    started = time.perf_counter()
    if gc.isenabled():
        gc.disable()
        gc.collect()  # the parent's garbage since the last fork, not frozen for good
    gc.freeze()
    return time.perf_counter() - started


def after_fork() -> None:
    """In the parent, after its forks: collect its own objects again."""
    gc.enable()


def in_child() -> None:
    """First thing in a child: collect its own objects from its start (the
    frozen ones, shared with the parent, are never examined)."""
    gc.enable()


def reloading() -> None:
    """Before re-importing the app: the new code is imported with the
    collector off (as at start)."""
    gc.disable()


def reloaded(imported: bool) -> float:
    """After re-importing the app. If it was imported, the old code's
    objects are collected (one full collection, the frozen ones included)
    and the new code frozen, before any replacement child is forked; returns
    the seconds that took. Either way the parent collects again from here."""
    started = time.perf_counter()
    if imported:
        gc.unfreeze()
        gc.collect()
        gc.freeze()
    gc.enable()
    return time.perf_counter() - started


def frozen() -> int:
    """Objects in the permanent generation (``gc.get_freeze_count``)."""
    return gc.get_freeze_count()
