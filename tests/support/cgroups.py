"""A small memory cgroup for a test to run a supervisor in.

``small_cgroup(limit)`` makes a cgroup under the test process's own memory
cgroup with ``limit`` bytes of memory and no swap, yields its directory and
removes it afterwards (moving back anything left in it). It skips the test,
with the reason, where the host allows none: no write access to the memory
hierarchy, or cgroup v2 with the test process sharing a cgroup that cannot
hand out the memory controller. ``run_inside(path, command)`` wraps a
command so that the process it starts joins the cgroup before it execs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest

from supervisor.cgroups import own_cgroup


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


@contextmanager
def small_cgroup(limit: int) -> Iterator[str]:
    own = own_cgroup()
    if isinstance(own, str):
        pytest.skip(f"no cgroup can be made here: {own}")
    version, parent, _ = own
    if version == 2:
        try:
            with open(os.path.join(parent, "cgroup.subtree_control"), encoding="utf-8") as handle:
                delegated = "memory" in handle.read().split()
        except OSError as exc:
            pytest.skip(f"no cgroup can be made here: {exc}")
        if not delegated:
            pytest.skip(f"no cgroup can be made here: cgroup v2 {parent} holds this test process, so it cannot "
                        "hand the memory controller to a child cgroup")
    path = os.path.join(parent, f"es-test-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        pytest.skip(f"no cgroup can be made here: cannot create {path}: {exc.strerror}")
    try:
        if version == 1:
            _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
            swap = os.path.join(path, "memory.memsw.limit_in_bytes")
            if os.path.exists(swap):
                _write(swap, str(limit))
        else:
            _write(os.path.join(path, "memory.max"), str(limit))
            swap = os.path.join(path, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
        yield path
    finally:
        _remove(path, os.path.join(parent, "cgroup.procs"))


def _remove(path: str, parent_procs: str) -> None:
    for root, directories, _ in os.walk(path, topdown=False):
        for name in directories:
            _remove_one(os.path.join(root, name), parent_procs)
    _remove_one(path, parent_procs)


def _remove_one(path: str, parent_procs: str) -> None:
    try:
        with open(os.path.join(path, "cgroup.procs"), encoding="utf-8") as handle:
            for pid in handle.read().split():
                try:
                    _write(parent_procs, pid)
                except OSError:
                    pass
        os.rmdir(path)
    except OSError:
        pass


def run_inside(path: str, command: Sequence[str]) -> list[str]:
    """``command``, started so that its process joins cgroup ``path`` first."""
    procs = os.path.join(path, "cgroup.procs")
    return ["/bin/sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *command]


def probe() -> str | None:
    """None if a supervisor started from this test process can make its
    children's cgroups here (as ``supervisor.cgroups`` would), else why not."""
    own = own_cgroup()
    if isinstance(own, str):
        return own
    version, parent, relative = own
    if version == 2 and relative != "/":
        return "cgroup v2: the supervisor would share the test process's cgroup"
    path = os.path.join(parent, f"es-probe-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(path)
    except OSError as exc:
        return f"cannot create {path}: {exc.strerror}"
    os.rmdir(path)
    return None
