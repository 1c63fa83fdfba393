"""The ``everystep`` command run inside the test process.

A fresh interpreter per command costs about half a second, mostly imports;
a test that checks what a command does to the database, its output and its
exit code needs none of it. ``run_in_process`` calls ``everystep.cli.main``
with the given arguments, environment and working directory, and answers
as ``subprocess.run`` would: exit code, stdout and stderr as text. Tests of
what only a process shows (the installed console script, signals, a
long-running worker) still start one.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from everystep.store import close_default_stores


@contextlib.contextmanager
def _environment(env: Mapping[str, str], cwd: Path) -> Iterator[None]:
    """``os.environ`` replaced by ``env`` and the working directory by
    ``cwd``, both given back afterwards."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _logging_left_as_found() -> Iterator[None]:
    """The command configures the root logger for a process of its own;
    the test process gets its handlers and level back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def run_in_process(args: Sequence[str], env: Mapping[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``everystep ARGS`` in this process, as a subprocess would run."""
    from everystep.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with _environment(env, cwd), _logging_left_as_found(), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=stderr)
        finally:
            close_default_stores()  # as the process's exit would
    return subprocess.CompletedProcess(["everystep", *args], code, stdout.getvalue(), stderr.getvalue())
