"""A cgroup per child, where the host lets the supervisor make one.

A child in a memory cgroup of its own gives three things rlimits cannot:
the kernel bounds the *resident* memory of the child and of every process
its steps start (``memory.max``; cgroup v1: ``memory.limit_in_bytes``), the
parent learns for certain that the kernel's out-of-memory killer ended a
child (``oom_kill`` in ``memory.events``; v1: ``memory.oom_control``),
whatever limit triggered it, and on cgroup v2 the CPU of those processes is
counted too (``cpu.stat``).

Where one can be made (``CgroupTree.open`` says why not, in one line):

- **cgroup v2** (the unified hierarchy: systemd's default). The
  supervisor's own cgroup must be delegated to it (systemd ``Delegate=yes``,
  a container with a private cgroup namespace) and offer the memory
  controller (``cgroup.controllers``). The kernel hands controllers to
  child cgroups only from a cgroup holding no process, so the supervisor
  moves itself into a leaf ``supervisor`` of its own cgroup first, which it
  does only if no other process shares that cgroup; the children go in
  siblings ``child-SLOT-N``, and at exit it moves back and disables what it
  enabled, so the cgroup can hold a process again (systemd restarting the
  service). Where its cgroup already hands memory down (the host's root
  cgroup), nothing moves: children go in ``everystep-PID/child-SLOT-N``.
- **cgroup v1** (the memory controller on its own hierarchy: older
  distributions, some VMs and CI machines). The memory hierarchy must be
  writable at the supervisor's cgroup; children go in
  ``everystep-PID/child-SLOT-N`` under it. CPU is counted per process.

The parent creates a child's cgroup before forking it; the child moves
itself in first thing (``ChildGroup.join``) and bounds its steps through
``OpenGroup``; after reaping it the parent reads its ``oom_kill`` count and
removes it (processes a step left behind are moved to the supervisor's own
cgroup first, so the directory can go).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from dataclasses import dataclass, field

logger = logging.getLogger("everystep.supervisor")

PROC_CGROUP = "/proc/self/cgroup"
PROC_MOUNTINFO = "/proc/self/mountinfo"


class CgroupError(OSError):
    """A cgroup operation failed; the text says which and why."""


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


@dataclass(frozen=True)
class ChildGroup:
    """One child's cgroup (a directory), on cgroup ``version`` 1 or 2."""

    version: int
    path: str

    @property
    def usage_file(self) -> str:
        return "memory.current" if self.version == 2 else "memory.usage_in_bytes"

    @property
    def limit_file(self) -> str:
        return "memory.max" if self.version == 2 else "memory.limit_in_bytes"

    @property
    def peak_file(self) -> str:
        return "memory.peak" if self.version == 2 else "memory.max_usage_in_bytes"

    @property
    def events_file(self) -> str:
        return "memory.events" if self.version == 2 else "memory.oom_control"

    @property
    def unlimited(self) -> bytes:
        return b"max" if self.version == 2 else b"-1"

    @property
    def counts_cpu(self) -> bool:
        """Whether ``cpu.stat`` counts the CPU of everything in the group."""
        return self.version == 2

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def join(self) -> None:
        """Move the calling process into this cgroup (the child, at boot)."""
        try:
            _write(self.file("cgroup.procs"), "0")
        except OSError as exc:
            raise CgroupError(exc.errno, f"cannot join cgroup {self.path}: {exc.strerror}") from None

    def oom_kills(self) -> int:
        """Processes of this group the kernel's OOM killer ended (0 if unreadable)."""
        try:
            text = _read(self.file(self.events_file))
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def peak(self) -> int | None:
        """The group's peak memory in bytes (None where the kernel keeps none)."""
        return _read_int(self.file(self.peak_file))

    def usage(self) -> int | None:
        return _read_int(self.file(self.usage_file))

    def cpu_seconds(self) -> float | None:
        """CPU of every process in the group, dead ones included (v2 only)."""
        if not self.counts_cpu:
            return None
        try:
            return _usage_usec(_read(self.file("cpu.stat")))
        except OSError:
            return None

    def procs(self) -> list[int]:
        try:
            return [int(line) for line in _read(self.file("cgroup.procs")).split() if line.isdigit()]
        except OSError:
            return []


def _read_int(path: str) -> int | None:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _usage_usec(text: str) -> float | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return None


class OpenGroup:
    """A child's own cgroup files, opened once after it joined, so bounding
    a step costs a system call per file rather than an open and a close."""

    def __init__(self, group: ChildGroup) -> None:
        self.group = group
        self._usage = os.open(group.file(group.usage_file), os.O_RDONLY | os.O_CLOEXEC)
        self._limit = os.open(group.file(group.limit_file), os.O_WRONLY | os.O_CLOEXEC)
        self._peak: int | None = None
        # v1 resets its peak on a write of 0; v2 (Linux 6.12+) resets it for
        # the writer's own descriptor, which is the one read back here.
        try:
            self._peak = os.open(group.file(group.peak_file), os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            pass
        self._cpu: int | None = None
        if group.counts_cpu:
            try:
                self._cpu = os.open(group.file("cpu.stat"), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass

    def usage(self) -> int:
        return int(os.pread(self._usage, 64, 0).split()[0])

    def set_limit(self, limit: int | None) -> None:
        """Bound the group's memory at ``limit`` bytes (None: unbounded)."""
        os.pwrite(self._limit, str(limit).encode() if limit is not None else self.group.unlimited, 0)

    def reset_peak(self) -> None:
        if self._peak is None:
            return
        try:
            os.pwrite(self._peak, b"0" if self.group.version == 1 else b"reset", 0)
        except OSError:
            pass  # a kernel without a resettable peak: the peak since the child started

    def peak(self) -> int | None:
        if self._peak is None:
            return None
        try:
            return int(os.pread(self._peak, 64, 0).split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def cpu_seconds(self) -> float | None:
        if self._cpu is None:
            return None
        return _usage_usec(os.pread(self._cpu, 4096, 0).decode())


@dataclass
class CgroupTree:
    """Where the parent makes its children's cgroups, and what it must
    remove when it stops."""

    version: int
    base: str  # child cgroups are created here
    own: str  # the supervisor's own cgroup now (leftover processes go there)
    made: list[str] = field(default_factory=list)  # directories this supervisor created, to remove at close
    #: (cgroup, pid): the supervisor moved itself from that cgroup into a
    #: leaf of it, to put back at close with the controllers it enabled.
    leaf: tuple[str, int] | None = None
    _busy: list[ChildGroup] = field(default_factory=list)
    _serial: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def describe(self) -> str:
        return f"cgroup v{self.version} under {self.base}"

    @classmethod
    def open(cls, pid: int | None = None, cgroup_file: str = PROC_CGROUP,
             mountinfo_file: str = PROC_MOUNTINFO) -> tuple[CgroupTree | None, str]:
        """The tree for this supervisor, or None and the reason there is none."""
        pid = os.getpid() if pid is None else pid
        own = own_cgroup(cgroup_file, mountinfo_file)
        if isinstance(own, str):
            return None, own
        version, where, _ = own
        if version == 1:
            return cls._open_v1(where, pid)
        return cls._open_v2(where, pid)

    @classmethod
    def _open_v1(cls, own: str, pid: int) -> tuple[CgroupTree | None, str]:
        remove_stale(own)
        base = os.path.join(own, f"everystep-{pid}")
        try:
            os.mkdir(base)
        except OSError as exc:
            return None, f"cannot create a cgroup under {own}: {exc.strerror}"
        return cls(version=1, base=base, own=own, made=[base]), ""

    @classmethod
    def _open_v2(cls, own: str, pid: int) -> tuple[CgroupTree | None, str]:
        try:
            available = _read(os.path.join(own, "cgroup.controllers")).split()
            enabled = _read(os.path.join(own, "cgroup.subtree_control")).split()
        except OSError as exc:
            return None, f"cannot read {exc.filename}: {exc.strerror}"
        if "memory" not in available:
            return None, (f"the memory controller is not delegated to this process's cgroup {own} "
                          "(systemd: Delegate=yes)")
        if "memory" in enabled:
            # Only the root cgroup holds processes and hands out controllers:
            # our children's cgroups go in one of our own below it.
            remove_stale(own)
            base = os.path.join(own, f"everystep-{pid}")
            try:
                os.mkdir(base)
                _write(os.path.join(base, "cgroup.subtree_control"), "+memory")
            except OSError as exc:
                _rmdir_quietly(base)
                return None, f"cannot create a cgroup with the memory controller under {own}: {exc.strerror}"
            return cls(version=2, base=base, own=own, made=[base]), ""
        procs = [line for line in _read(os.path.join(own, "cgroup.procs")).split() if line.strip()]
        if procs != [str(pid)]:
            return None, (f"other processes share this process's cgroup {own}; give the supervisor a cgroup "
                          "of its own (systemd: a service with Delegate=yes)")
        leaf = os.path.join(own, "supervisor")
        try:
            os.makedirs(leaf, exist_ok=True)
            _write(os.path.join(leaf, "cgroup.procs"), str(pid))
        except OSError as exc:
            return None, f"cannot move into a leaf cgroup {leaf}: {exc.strerror}"
        tree = cls(version=2, base=own, own=leaf, leaf=(own, pid))
        try:
            _write(os.path.join(own, "cgroup.subtree_control"), "+memory")
        except OSError as exc:
            tree.close()
            return None, f"cannot enable the memory controller for {own}'s children: {exc.strerror}"
        return tree, ""

    def create(self, slot: int) -> ChildGroup:
        """A fresh cgroup for the child about to be forked into ``slot``."""
        name = f"child-{slot}-{next(self._serial)}"
        group = ChildGroup(self.version, os.path.join(self.base, name))
        try:
            os.mkdir(group.path)
        except OSError as exc:
            raise CgroupError(exc.errno, f"cannot create cgroup {group.path}: {exc.strerror}") from None
        if self.version == 2:
            try:
                # One out-of-memory kill takes the child and whatever its
                # step started, as one unit.
                _write(group.file("memory.oom.group"), "1")
            except OSError:
                pass
        return group

    def remove(self, group: ChildGroup) -> bool:
        """Remove a dead child's cgroup; processes its steps left behind move
        to the supervisor's own cgroup first. False if it is still busy
        (retried at ``close``)."""
        for pid in group.procs():
            try:
                _write(os.path.join(self.own, "cgroup.procs"), str(pid))
            except OSError:
                pass
        try:
            os.rmdir(group.path)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                self._busy.append(group)
                return False
            logger.warning("cannot remove cgroup %s: %s", group.path, exc.strerror)
            return False
        return True

    def close(self) -> None:
        """Remove what this supervisor created (children first)."""
        busy, self._busy = self._busy, []
        for group in busy:
            if not self.remove(group):
                logger.warning("cgroup %s still holds processes %s; leaving it", group.path, group.procs())
        for path in reversed(self.made):
            _rmdir_quietly(path)
        self.made.clear()
        if self.leaf is not None:
            # Leave the cgroup as we found it, so whatever starts there next
            # (systemd restarting the service) can hold processes in it.
            parent, pid = self.leaf
            self.leaf = None
            for name, text in (("cgroup.subtree_control", "-memory"), ("cgroup.procs", str(pid))):
                try:
                    _write(os.path.join(parent, name), text)
                except OSError as exc:
                    logger.warning("cannot restore cgroup %s (%s): %s", parent, name, exc.strerror)
            _rmdir_quietly(self.own)


def own_cgroup(cgroup_file: str = PROC_CGROUP, mountinfo_file: str = PROC_MOUNTINFO) -> tuple[int, str, str] | str:
    """(cgroup version, directory, path within the hierarchy) of this
    process's memory cgroup, or the reason it has none it can see."""
    try:
        memberships = _memberships(_read(cgroup_file))
        mounts = _mounts(_read(mountinfo_file))
    except OSError as exc:
        return f"cannot read {exc.filename}: {exc.strerror}"
    if "memory" in memberships:
        where = _locate(memberships["memory"], mounts.get("memory"))
        if where is None:
            return "the cgroup v1 memory hierarchy is not mounted where this process can see its cgroup"
        return 1, where, memberships["memory"]
    if "" in memberships and "" in mounts:
        where = _locate(memberships[""], mounts[""])
        if where is None:
            return "this process's cgroup v2 directory is not visible in its mount namespace"
        return 2, where, memberships[""]
    return "no memory cgroup controller on this host"


def remove_stale(parent: str) -> None:
    """A SIGKILLed supervisor cannot remove its cgroups: the next one
    removes those whose owner is gone (and whose processes are gone too)."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return
    for name in entries:
        owner = name.removeprefix("everystep-")
        if owner == name or not owner.isdigit() or _alive(int(owner)):
            continue
        path = os.path.join(parent, name)
        try:
            for child in os.listdir(path):
                if child.startswith("child-"):
                    _rmdir_quietly(os.path.join(path, child))
        except OSError:
            continue
        _rmdir_quietly(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _rmdir_quietly(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _memberships(text: str) -> dict[str, str]:
    """``/proc/self/cgroup``: ``{"memory": path}`` for the v1 memory
    hierarchy, ``{"": path}`` for the unified one."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            found[""] = path
        elif "memory" in controllers.split(","):
            found["memory"] = path
    return found


def _mounts(text: str) -> dict[str, tuple[str, str]]:
    """``/proc/self/mountinfo``: (root within the hierarchy, mount point) of
    the v1 memory hierarchy (``"memory"``) and of cgroup2 (``""``)."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        dash = fields.index("-")
        if dash < 5 or len(fields) < dash + 3:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        fstype, options = fields[dash + 1], fields[dash + 3].split(",") if len(fields) > dash + 3 else []
        if fstype == "cgroup2":
            found.setdefault("", (root, point))
        elif fstype == "cgroup" and "memory" in options:
            found.setdefault("memory", (root, point))
    return found


def _unescape(text: str) -> str:
    return text.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _locate(path: str, mount: tuple[str, str] | None) -> str | None:
    """The directory of cgroup ``path`` under its hierarchy's mount, or
    None if it is not visible there."""
    if mount is None:
        return None
    root, point = mount
    if root == "/":
        relative = path
    elif path == root or path.startswith(root.rstrip("/") + "/"):
        relative = path[len(root.rstrip("/")):]
    else:
        return None
    directory = os.path.normpath(point + "/" + relative.lstrip("/"))
    return directory if os.path.isdir(directory) else None


__all__ = ["CgroupError", "CgroupTree", "ChildGroup", "OpenGroup", "own_cgroup", "remove_stale"]
