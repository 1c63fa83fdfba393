"""Finding and preparing a cgroup per child (``supervisor/cgroups.py``).

The kernel's cgroup v1 memory hierarchy exists on the machine that runs
this suite, and ``test_step_budgets.py`` drives it with real supervisors.
A cgroup v2 memory controller cannot exist here at the same time (a
controller lives in one hierarchy), so what the supervisor reads and writes
on v2 is checked against a directory tree laid out like
``/sys/fs/cgroup`` and the ``/proc`` files that point to it: the same paths,
file names and contents, without the kernel behind them.
"""

from __future__ import annotations

import os
from pathlib import Path

from supervisor.cgroups import CgroupTree, ChildGroup, own_cgroup

PID = 4321


def fake_host(tmp_path: Path, membership: str, mount: str) -> tuple[str, str]:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(membership)
    (proc / "mountinfo").write_text(mount)
    return str(proc / "cgroup"), str(proc / "mountinfo")


def v2_host(tmp_path: Path, procs: str = f"{PID}\n", controllers: str = "cpuset cpu io memory pids") -> tuple[
        Path, str, str]:
    service = tmp_path / "cgroup" / "system.slice" / "es.service"
    service.mkdir(parents=True)
    (service / "cgroup.controllers").write_text(controllers + "\n")
    (service / "cgroup.subtree_control").write_text("")
    (service / "cgroup.procs").write_text(procs)
    files = fake_host(
        tmp_path, "0::/system.slice/es.service\n",
        f"24 1 0:21 / /proc rw - proc proc rw\n"
        f"30 23 0:26 / {tmp_path / 'cgroup'} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
    )
    return service, *files


def test_v2_delegated_the_supervisor_moves_into_a_leaf_and_hands_memory_to_its_children(tmp_path: Path) -> None:
    service, cgroup_file, mountinfo = v2_host(tmp_path)

    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)

    assert why == "" and tree is not None
    assert (tree.version, tree.base, tree.own) == (2, str(service), str(service / "supervisor"))
    assert (service / "supervisor" / "cgroup.procs").read_text() == str(PID)
    assert (service / "cgroup.subtree_control").read_text() == "+memory"
    group = tree.create(3)
    assert group == ChildGroup(2, str(service / "child-3-1"))
    assert (service / "child-3-1" / "memory.oom.group").read_text() == "1"
    assert tree.create(3).path.endswith("child-3-2")  # a fresh one for each child

    tree.close()
    # Back where it started, with the controller it enabled disabled again.
    assert (service / "cgroup.procs").read_text() == str(PID)
    assert (service / "cgroup.subtree_control").read_text() == "-memory"


def test_v2_where_memory_is_already_handed_down_nothing_moves(tmp_path: Path) -> None:
    service, cgroup_file, mountinfo = v2_host(tmp_path, procs=f"1\n{PID}\n")
    (service / "cgroup.subtree_control").write_text("cpu memory\n")

    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)

    assert why == "" and tree is not None
    assert tree.base == str(service / f"everystep-{PID}") and tree.own == str(service)
    assert (service / f"everystep-{PID}" / "cgroup.subtree_control").read_text() == "+memory"
    assert (service / "cgroup.procs").read_text() == f"1\n{PID}\n"  # nobody moved


def test_v2_files_the_parent_reads(tmp_path: Path) -> None:
    group = ChildGroup(2, str(tmp_path))
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 1\n")
    (tmp_path / "memory.peak").write_text("268697600\n")
    (tmp_path / "memory.current").write_text("1048576\n")
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n")
    (tmp_path / "cgroup.procs").write_text("77\n78\n")
    assert (group.oom_kills(), group.peak(), group.usage(), group.cpu_seconds(), group.procs()) == (
        1, 268697600, 1048576, 2.5, [77, 78])
    assert (group.limit_file, group.unlimited) == ("memory.max", b"max")


def test_v1_files_the_parent_reads(tmp_path: Path) -> None:
    group = ChildGroup(1, str(tmp_path))
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    (tmp_path / "memory.max_usage_in_bytes").write_text("268435456\n")
    assert (group.oom_kills(), group.peak(), group.cpu_seconds()) == (2, 268435456, None)
    assert (group.limit_file, group.unlimited) == ("memory.limit_in_bytes", b"-1")
    assert ChildGroup(1, str(tmp_path / "gone")).oom_kills() == 0


def test_v2_shared_with_other_processes_is_left_alone(tmp_path: Path) -> None:
    service, cgroup_file, mountinfo = v2_host(tmp_path, procs=f"{PID}\n999\n")

    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)

    assert tree is None
    assert why == (f"other processes share this process's cgroup {service}; give the supervisor a cgroup of its "
                   "own (systemd: a service with Delegate=yes)")
    assert not (service / "supervisor").exists()
    assert (service / "cgroup.subtree_control").read_text() == ""


def test_v2_without_the_memory_controller_says_to_delegate_it(tmp_path: Path) -> None:
    service, cgroup_file, mountinfo = v2_host(tmp_path, controllers="cpu pids")
    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)
    assert tree is None
    assert why == (f"the memory controller is not delegated to this process's cgroup {service} "
                   "(systemd: Delegate=yes)")


def test_v1_inside_a_container_whose_mount_root_is_its_own_cgroup(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    (memory / "worker").mkdir(parents=True)
    # Left by a supervisor that was SIGKILLed (no such pid now), and one
    # whose owner lives (this process).
    (memory / "worker" / "everystep-99999999" / "child-1-1").mkdir(parents=True)
    (memory / "worker" / f"everystep-{os.getpid()}").mkdir()
    cgroup_file, mountinfo = fake_host(
        tmp_path, "12:pids:/docker/abc\n4:memory:/docker/abc/worker\n0::/\n",
        f"41 31 0:38 /docker/abc {memory} rw,relatime - cgroup cgroup rw,memory\n")
    assert own_cgroup(cgroup_file, mountinfo) == (1, str(memory / "worker"), "/docker/abc/worker")

    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)

    assert why == "" and tree is not None
    assert tree.base == str(memory / "worker" / f"everystep-{PID}") and os.path.isdir(tree.base)
    assert sorted(os.listdir(memory / "worker")) == sorted([f"everystep-{PID}", f"everystep-{os.getpid()}"])


def test_hosts_without_a_memory_cgroup_say_why(tmp_path: Path) -> None:
    cgroup_file, mountinfo = fake_host(tmp_path, "1:name=systemd:/\n", "24 1 0:21 / /proc rw - proc proc rw\n")
    assert CgroupTree.open(PID, cgroup_file, mountinfo) == (None, "no memory cgroup controller on this host")
    cgroup_file = str(tmp_path / "absent")
    tree, why = CgroupTree.open(PID, cgroup_file, mountinfo)
    assert tree is None and why.startswith(f"cannot read {cgroup_file}")
    (tmp_path / "h").mkdir()
    hidden, mountinfo = fake_host(tmp_path / "h", "4:memory:/elsewhere\n",
                                  f"41 31 0:38 /mine {tmp_path} rw - cgroup cgroup rw,memory\n")
    assert CgroupTree.open(PID, hidden, mountinfo) == (
        None, "the cgroup v1 memory hierarchy is not mounted where this process can see its cgroup")
