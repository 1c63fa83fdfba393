"""Workflows for the observability tests, imported by real supervisor and
worker processes (``--app tests.apps.observed``).

Every step returns the pid of the process that ran it, so a test can tell
which child did what from the step rows. Every workflow takes one ``spec``
dict whose ``"dir"`` is a directory shared with the test:

- ``three_steps``: ``rendezvous`` (drops ``<dir>/child-<pid>`` and waits
  until ``spec["children"]`` distinct processes dropped one, so the runs
  are spread over that many children), ``held`` (waits for the file
  ``<dir>/<spec["gate"]>`` when a gate is named), ``finish``;
- ``quick``: one step;
- ``suicide_flow``: a step that SIGKILLs its own process, every time;
- ``sleepy_flow``: a step with ``timeout=1`` that sleeps far past it;
- ``fails``: a step raises ``ValueError`` and the run fails;
- ``stops``: a step raises ``Terminal`` and the run stops.

Optional telemetry, configured at import (so in the supervisor parent,
before it forks) when the test sets these environment variables:

- ``EVERYSTEP_TEST_SPANS=<file>``: an OpenTelemetry SDK tracer provider
  whose exporter appends one JSON object per finished span to ``<file>``
  (synchronously, one ``write`` per line, from any process);
- ``EVERYSTEP_TEST_SENTRY=<file>``: ``sentry_sdk.init`` with a transport
  that appends one JSON object per captured event to ``<file>``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from everystep import Terminal, step, workflow

#: What ``--app`` names to load this module in a supervisor or a worker.
APP = "tests.apps.observed"
SPANS_ENV = "EVERYSTEP_TEST_SPANS"
SENTRY_ENV = "EVERYSTEP_TEST_SENTRY"
POLL_SECONDS = 0.02
#: Waits inside steps must end even if a test forgets them.
GIVE_UP_SECONDS = 300.0


def _append_line(path: str, data: dict[str, Any]) -> None:
    line = (json.dumps(data, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line)  # one write per line: lines from several processes never interleave
    finally:
        os.close(fd)


def _wait(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + GIVE_UP_SECONDS
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what}")
        time.sleep(POLL_SECONDS)


# -- workflows ------------------------------------------------------------------


@step
def rendezvous(spec: dict[str, Any]) -> int:
    directory = Path(spec["dir"])
    (directory / f"child-{os.getpid()}").touch()
    wanted = int(spec.get("children", 1))
    _wait(lambda: len(list(directory.glob("child-*"))) >= wanted, f"{wanted} processes at the rendezvous")
    return os.getpid()


@step
def held(spec: dict[str, Any]) -> int:
    gate = spec.get("gate")
    if gate:
        path = Path(spec["dir"]) / gate
        _wait(path.exists, f"gate {path}")
    return os.getpid()


@step
def finish(spec: dict[str, Any]) -> int:
    return os.getpid()


@workflow
def three_steps(spec: dict[str, Any]) -> list[int]:
    return [rendezvous(spec), held(spec), finish(spec)]


@step
def ping(spec: dict[str, Any]) -> int:
    return os.getpid()


@workflow
def quick(spec: dict[str, Any]) -> int:
    return ping(spec)


@step
def suicide(spec: dict[str, Any]) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@workflow
def suicide_flow(spec: dict[str, Any]) -> str:
    suicide(spec)
    return "survived"


@step(timeout=1)
def sleepy(spec: dict[str, Any]) -> int:
    time.sleep(float(spec.get("sleep", 120.0)))
    return os.getpid()


@workflow
def sleepy_flow(spec: dict[str, Any]) -> int:
    return sleepy(spec)


@step
def explode(spec: dict[str, Any]) -> None:
    raise ValueError(f"exploded in pid {os.getpid()}")


@workflow
def fails(spec: dict[str, Any]) -> None:
    ping(spec)
    explode(spec)


@step
def halt(spec: dict[str, Any]) -> None:
    raise Terminal("nothing left to do", {"pid": os.getpid()})


@workflow
def stops(spec: dict[str, Any]) -> None:
    halt(spec)
    ping(spec)


# -- optional telemetry, for subprocesses ------------------------------------------


def _configure_tracing(path: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class JsonLinesSpanExporter(SpanExporter):
        """Synchronous and thread-free, so it survives the supervisor's fork."""

        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            for span in spans:
                parent = span.parent
                _append_line(path, {
                    "name": span.name,
                    "trace_id": format(span.context.trace_id, "032x"),
                    "span_id": format(span.context.span_id, "016x"),
                    "parent_id": format(parent.span_id, "016x") if parent is not None else None,
                    "pid": os.getpid(),
                    "attributes": dict(span.attributes or {}),
                    "status": span.status.status_code.name,
                })
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter()))
    trace.set_tracer_provider(provider)


def _configure_sentry(path: str) -> None:
    import sentry_sdk
    from sentry_sdk.transport import Transport

    class JsonLinesTransport(Transport):
        """Writes each event synchronously: no background thread to fork."""

        def capture_envelope(self, envelope: Any) -> None:
            for item in envelope.items:
                event = item.get_event()
                if event is not None:
                    _append_line(path, {"pid": os.getpid(), "event": event})

    sentry_sdk.init(
        dsn="https://public@o0.ingest.sentry.io/0",
        transport=JsonLinesTransport,
        default_integrations=False,
        auto_session_tracking=False,
    )


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The JSON lines written so far (the test side of both files)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


if os.environ.get(SPANS_ENV):
    _configure_tracing(os.environ[SPANS_ENV])
if os.environ.get(SENTRY_ENV):
    _configure_sentry(os.environ[SENTRY_ENV])
