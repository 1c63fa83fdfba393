"""The shipped systemd units keep the promises DESIGN.md makes about them.

Parsed with configparser, which is close enough to systemd's format for
these files: full-line ``#`` comments, ``[Section]`` headers, ``Key=value``
lines.  systemd allows a key to repeat (``EnvironmentFile=`` twice), so the
parser collects every occurrence instead of keeping the last.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

UNIT_DIR = Path(__file__).resolve().parent.parent / "systemd"
PLAIN = UNIT_DIR / "everystep-supervisor.service"
TEMPLATE = UNIT_DIR / "everystep-supervisor@.service"
BINARY = "/usr/local/bin/everystep-supervisor"

Unit = dict[str, dict[str, list[str]]]


class _Occurrences(dict):
    """Section storage that extends a repeated key instead of replacing it.

    configparser stores each raw value as a one-element list and later joins
    the lists with newlines; extending on a repeat keeps every occurrence.
    Unit files never use configparser's indented continuation lines, so each
    joined line is one occurrence.
    """

    def __setitem__(self, key: str, value: object) -> None:
        if isinstance(value, list) and key in self and isinstance(self[key], list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def parse_unit(path: Path) -> Unit:
    parser = configparser.ConfigParser(
        strict=False,
        interpolation=None,
        dict_type=_Occurrences,
        delimiters=("=",),
        comment_prefixes=("#", ";"),
        empty_lines_in_values=False,
        default_section="\0none",  # systemd has no [DEFAULT] section
    )
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(path, encoding="utf-8")
    return {
        section: {
            key: parser.get(section, key).split("\n")
            for key in parser.options(section)
        }
        for section in parser.sections()
    }


def single(unit: Unit, key: str, section: str = "Service") -> str:
    values = unit[section][key]
    assert len(values) == 1, f"{key}= given {len(values)} times: {values}"
    return values[0]


def parse_timespan(text: str) -> float:
    """Seconds in a systemd time span ("45", "45s", "1min 30s", "500ms")."""
    units = {
        "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3,
        "": 1.0, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
        "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
        "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    }
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts, f"not a time span: {text!r}"
    for number, unit in parts:
        assert unit in units, f"unknown time unit {unit!r} in {text!r}"
        total += float(number) * units[unit]
    return total


def exec_start_options(unit: Unit) -> tuple[list[str], dict[str, str]]:
    argv = shlex.split(single(unit, "ExecStart"))
    options: dict[str, str] = {}
    for flag, value in zip(argv[1:], argv[2:]):
        if flag.startswith("--") and not value.startswith("--"):
            options[flag] = value
    return argv, options


@pytest.fixture(params=[PLAIN, TEMPLATE], ids=["plain", "template"])
def unit(request: pytest.FixtureRequest) -> Unit:
    return parse_unit(request.param)


def test_repeated_keys_are_all_kept() -> None:
    env_files = parse_unit(TEMPLATE)["Service"]["EnvironmentFile"]
    assert env_files == [
        "-/etc/everystep/everystep.env",
        "-/etc/everystep/%i.env",
    ]
    assert parse_unit(PLAIN)["Service"]["EnvironmentFile"] == [
        "-/etc/everystep/everystep.env"
    ]


def test_notify_type_and_access(unit: Unit) -> None:
    assert single(unit, "Type") == "notify"
    assert single(unit, "NotifyAccess") == "main"
    assert parse_timespan(single(unit, "WatchdogSec")) > 0


def test_kill_mode_mixed(unit: Unit) -> None:
    assert single(unit, "KillMode") == "mixed"
    assert single(unit, "KillSignal") == "SIGTERM"
    assert single(unit, "ExecReload") == "/bin/kill -HUP $MAINPID"


def test_stop_timeout_exceeds_drain(unit: Unit) -> None:
    argv, options = exec_start_options(unit)
    assert argv[0] == BINARY
    drain = parse_timespan(options["--drain"])
    assert drain > 0
    assert parse_timespan(single(unit, "TimeoutStopSec")) > drain


def test_socket_lives_in_runtime_directory(unit: Unit) -> None:
    runtime_dirs = single(unit, "RuntimeDirectory").split()
    assert runtime_dirs
    assert single(unit, "RuntimeDirectoryMode") == "0750"
    _, options = exec_start_options(unit)
    socket_path = options["--socket"]
    assert socket_path.startswith("%t/")
    socket_dir = os.path.dirname(socket_path.removeprefix("%t/"))
    assert socket_dir in runtime_dirs


def test_state_directory_and_user(unit: Unit) -> None:
    assert single(unit, "User") == "everystep"
    assert single(unit, "Group") == "everystep"
    assert single(unit, "StateDirectory") == "everystep"
    assert single(unit, "WorkingDirectory") == "/var/lib/everystep"
    assert "/var/lib/everystep" in single(unit, "ReadWritePaths").split()
    assert single(unit, "Restart") == "on-failure"


def test_hardening(unit: Unit) -> None:
    expected = {
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "RestrictRealtime": "yes",
        "RestrictNamespaces": "yes",
        "SystemCallArchitectures": "native",
    }
    assert {key: single(unit, key) for key in expected} == expected


def test_plain_unit_has_no_instance_specifiers() -> None:
    text = PLAIN.read_text(encoding="utf-8")
    body = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    assert "%i" not in body and "%I" not in body
    _, options = exec_start_options(parse_unit(PLAIN))
    assert options["--socket"] == "%t/everystep/control.sock"
    assert single(parse_unit(PLAIN), "RuntimeDirectory") == "everystep"


def test_template_is_per_instance() -> None:
    unit = parse_unit(TEMPLATE)
    _, options = exec_start_options(unit)
    assert options["--name"] == "%i"
    assert options["--socket"] == "%t/everystep/%i/control.sock"
    assert single(unit, "RuntimeDirectory") == "everystep/%i"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # nothing to run it with; the parsing tests above still apply
    # The supervisor need not be installed where the tests run: point
    # ExecStart at an executable stub so verify checks everything else.
    binary = BINARY
    if not os.access(BINARY, os.X_OK):
        stub = tmp_path / "everystep-supervisor"
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        binary = str(stub)
    targets = []
    for source, name in [
        (PLAIN, "everystep-supervisor.service"),
        # An instance of the template, so %i has a value.
        (TEMPLATE, "everystep-supervisor@verify.service"),
    ]:
        target = tmp_path / name
        target.write_text(
            source.read_text(encoding="utf-8").replace(BINARY, binary),
            encoding="utf-8",
        )
        targets.append(str(target))
    result = subprocess.run(
        [analyze, "verify", "--man=no", *targets],
        capture_output=True,
        text=True,
        timeout=25,
    )
    # verify exits 0 even for unknown keys or unparsable values, so look at
    # what it printed about these units (it may warn about unrelated ones).
    output = result.stdout + result.stderr
    complaints = [l for l in output.splitlines() if "everystep-supervisor" in l]
    assert result.returncode == 0, output
    assert complaints == [], output
