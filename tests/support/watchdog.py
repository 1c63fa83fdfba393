"""A last line of defence against a test that pytest-timeout cannot stop.

pytest-timeout interrupts a test with SIGALRM, which Python handles only
when the main thread gets back to the interpreter: a test stuck inside C
(a driver waiting on a socket without checking for signals, a throttled
process) would then hold the whole run until the CI job's own deadline,
and print nothing about where it was. This watchdog thread gives such a
test its own timeout and then a long grace on top (the grace counts from
the test's timeout, so a test allowed 900 s is never bitten at 600), then
prints every thread's stack and the process tree below pytest, and ends
the run with a failure at once.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from typing import Any

import psutil

DEFAULT_GRACE_SECONDS = 300.0
EXIT_CODE = 70


class Watchdog:
    def __init__(self, grace: float, capture: Any) -> None:
        self.grace = grace
        self.capture = capture
        self.current: tuple[str, float, float] | None = None
        self._thread = threading.Thread(target=self._watch, name="test-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def entering(self, nodeid: str, timeout: float) -> None:
        """``timeout``: the test's own (pytest-timeout's), 0 for none."""
        self.current = (nodeid, time.monotonic(), max(timeout, 0.0) + self.grace)

    def leaving(self) -> None:
        self.current = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(5.0, self.grace / 4))
            current = self.current
            if current is not None and time.monotonic() - current[1] > current[2]:
                self._bite(current[0], current[2])

    def _bite(self, nodeid: str, limit: float) -> None:
        if self.capture is not None:
            try:
                self.capture.suspend_global_capture(in_=True)
            except Exception:  # the report below matters more than the capture's state
                pass
        err = sys.__stderr__ or sys.stderr
        err.write(f"\n!!! watchdog: {nodeid} has run for over {limit:.0f} s "
                  "and pytest-timeout could not stop it; stacks and processes follow\n")
        err.flush()
        faulthandler.dump_traceback(file=err, all_threads=True)
        for proc in psutil.Process().children(recursive=True):
            try:
                err.write(f"  pid {proc.pid} ppid {proc.ppid()} {proc.status()}: {' '.join(proc.cmdline())[:200]}\n")
            except psutil.Error:
                continue
        err.flush()
        os._exit(EXIT_CODE)


def grace_from_environment() -> float:
    raw = os.environ.get("EVERYSTEP_TEST_WATCHDOG_SECONDS", "")
    try:
        return float(raw) if raw else DEFAULT_GRACE_SECONDS
    except ValueError:
        return DEFAULT_GRACE_SECONDS


def timeout_of(item: Any) -> float:
    """The timeout pytest-timeout applies to ``item``: its marker's, else
    the configured one; 0 for none."""
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
        if value is not None:
            return float(value)
    try:
        return float(item.config.getini("timeout") or 0)
    except (ValueError, KeyError):
        return 0.0
