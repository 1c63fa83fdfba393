"""The memory of a process tree, as case 17 reports it: RSS, PSS and USS
of a parent and of each of its children (``psutil.memory_full_info()``,
from ``/proc/PID/smaps_rollup``), in bytes."""

from __future__ import annotations

from typing import Any

import psutil


def of(process: psutil.Process) -> dict[str, int]:
    info = process.memory_full_info()
    return {"pid": process.pid, "rss": info.rss, "pss": info.pss, "uss": info.uss}


def tree(pid: int, exclude: set[int] | None = None) -> dict[str, Any]:
    """``{"parent": {...}, "children": [{...}, ...]}``: the parent and its
    direct children (but ``exclude``), each read once."""
    parent = psutil.Process(pid)
    kids = []
    for kid in parent.children():
        if kid.pid in (exclude or set()):
            continue
        try:
            kids.append(of(kid))
        except psutil.NoSuchProcess:
            continue
    return {"parent": of(parent), "children": kids}
