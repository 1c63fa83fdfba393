"""OpenTelemetry spans of runs and steps.

In-process, against an SDK tracer provider with an in-memory exporter: the
span tree of a run with a parallel fork, replayed steps not traced again,
failed runs and steps ending in error, a ``Terminal`` stop not an error, and
an injected trace context becoming the run span's parent. Across the
supervisor's process hop, through the file ``tests/apps/observed.py``
writes spans to when the test sets ``EVERYSTEP_TEST_SPANS``: the child's run
span continues the parent's dispatch span.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from everystep import runner, schedule, traces
from everystep.errors import SimulatedCrash
from everystep.models import COMPLETED, FAILED, STOPPED
from tests.apps import observed
from tests.apps.observed import APP, read_lines
from tests.support.outcomes import (  # noqa: F401 - reset_probes is an autouse fixture
    CALLS, failing, reset_probes, stopping, t_branch, t_step, traced,
)
from tests.support.runs import claim_run, crash_at, execute_run
from tests.support.scrape import wait_for
from tests.support.supervisor import supervisors, wait_run  # noqa: F401 - supervisors is a fixture

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


class _SwitchedSpanProcessor(SimpleSpanProcessor):
    """Exports only while a test here is watching, so other test modules
    sharing the session's tracer provider never fill the exporter."""

    enabled = False

    def on_end(self, span: ReadableSpan) -> None:
        if self.enabled:
            super().on_end(span)


@pytest.fixture(scope="session")
def _session_spans() -> tuple[InMemorySpanExporter, _SwitchedSpanProcessor]:
    """The global tracer provider can be set once per process: do it once."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        trace.set_tracer_provider(TracerProvider())
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider), provider
    exporter = InMemorySpanExporter()
    processor = _SwitchedSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return exporter, processor


@pytest.fixture
def spans(_session_spans: tuple[InMemorySpanExporter, _SwitchedSpanProcessor]) -> Iterator[InMemorySpanExporter]:
    exporter, processor = _session_spans
    exporter.clear()
    processor.enabled = True
    try:
        yield exporter
    finally:
        processor.enabled = False
        exporter.clear()


def spans_of(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans()
            if (span.attributes or {}).get("everystep.workflow.id") == run_id]


def run_span(found: list[ReadableSpan], name: str) -> ReadableSpan:
    roots = [span for span in found if span.name == name and "everystep.step.id" not in (span.attributes or {})
             and "everystep.fork.id" not in (span.attributes or {})]
    assert len(roots) == 1, [span.name for span in found]
    return roots[0]


def step_spans(found: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    by_id: dict[str, ReadableSpan] = {}
    for span in found:
        step_id = (span.attributes or {}).get("everystep.step.id")
        if step_id is not None:
            assert step_id not in by_id, f"step {step_id} traced twice"
            by_id[str(step_id)] = span
    return by_id


def test_spans_form_the_documented_tree_with_a_parallel_fork(store, spans):
    run = schedule(traced, "tree", database=store)
    assert execute_run(store, run.id) == COMPLETED
    result = store.get_run(run.id).result

    found = spans_of(spans, run.id)
    root = run_span(found, traced.name)
    assert root.attributes["everystep.workflow.id"] == run.id
    assert root.attributes["everystep.workflow.status"] == COMPLETED
    assert root.status.status_code != StatusCode.ERROR
    steps = step_spans(found)
    assert set(steps) == {"1", "2.0.1", "2.1.1", "3"}
    forks = [span for span in found if span.name == "parallel 2"]
    assert len(forks) == 1
    fork = forks[0]
    assert fork.parent.span_id == root.context.span_id
    for step_id in ("1", "3"):
        assert steps[step_id].name == t_step.name
        assert steps[step_id].parent.span_id == root.context.span_id
    for step_id in ("2.0.1", "2.1.1"):
        assert steps[step_id].name == t_branch.name
        assert steps[step_id].parent.span_id == fork.context.span_id, "branch steps nest under their fork"
    # The branch steps ran on their own threads, not the body's.
    assert result[1] != threading.current_thread().name and result[2] != threading.current_thread().name
    assert result[1] != result[2]
    assert {span.context.trace_id for span in found} == {root.context.trace_id}
    assert all(span.status.status_code != StatusCode.ERROR for span in found)
    # Every span ended inside the run span.
    assert all(root.start_time <= span.start_time <= span.end_time <= root.end_time for span in found)


def test_replayed_steps_are_not_traced_again(store, spans):
    run = schedule(traced, "replay", database=store)
    crash_at("3")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    first = step_spans(spans_of(spans, run.id))
    assert set(first) == {"1", "2.0.1", "2.1.1", "3"}
    spans.clear()

    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == COMPLETED

    again = spans_of(spans, run.id)
    root = run_span(again, traced.name)
    assert root.attributes["everystep.workflow.status"] == COMPLETED
    steps = step_spans(again)
    assert set(steps) == {"3"}, "only the step without a record executes, and only it is traced"
    assert steps["3"].parent.span_id == root.context.span_id
    assert CALLS.count("replay:first") == 1 and CALLS.count("replay:last") == 2


def test_failed_run_and_step_spans_end_in_error(store, spans):
    run = schedule(failing, "bad", database=store)
    assert execute_run(store, run.id) == FAILED

    found = spans_of(spans, run.id)
    root = run_span(found, failing.name)
    steps = step_spans(found)
    assert root.attributes["everystep.workflow.status"] == FAILED
    assert root.status.status_code == StatusCode.ERROR
    assert "ValueError" in (root.status.description or "")
    assert steps["2"].status.status_code == StatusCode.ERROR
    assert any(event.name == "exception" for event in steps["2"].events)
    assert steps["1"].status.status_code != StatusCode.ERROR


def test_a_terminal_stop_is_not_an_error_span(store, spans):
    run = schedule(stopping, "halt", database=store)
    assert execute_run(store, run.id) == STOPPED

    found = spans_of(spans, run.id)
    root = run_span(found, stopping.name)
    assert root.attributes["everystep.workflow.status"] == STOPPED
    assert set(step_spans(found)) == {"1", "2"}, "no step starts after the Terminal"
    assert all(span.status.status_code != StatusCode.ERROR for span in found)


def test_injected_trace_context_becomes_the_run_spans_parent(store, spans):
    tracer = trace.get_tracer("tests")
    run = claim_run(store, schedule(traced, "remote", database=store).id)
    with tracer.start_as_current_span("dispatch here") as dispatch:
        carrier = traces.inject()
    assert "traceparent" in carrier
    token = traces.attach_remote(carrier)
    try:
        assert runner.execute(store, run, claimer="tester") == COMPLETED
    finally:
        traces.detach(token)
    root = run_span(spans_of(spans, run.id), traced.name)
    assert root.context.trace_id == dispatch.get_span_context().trace_id
    assert root.parent.span_id == dispatch.get_span_context().span_id
    assert traces.attach_remote({}) is None and traces.attach_remote(None) is None


def test_trace_context_crosses_from_the_supervisor_to_its_child(db_url, store, supervisors, subprocess_env,
                                                                tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    env = {**subprocess_env, observed.SPANS_ENV: str(spans_file)}
    sup = supervisors(db_url, procs=1, app=APP, env=env).start()
    run = schedule(observed.quick, {"dir": str(tmp_path)}, database=store)
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    child_pid = store.get_steps(run.id)[0].result

    def spans_of_run() -> dict[str, dict[str, Any]] | None:
        mine = [line for line in read_lines(spans_file) if line["attributes"].get("everystep.workflow.id") == run.id]
        by_name = {line["name"]: line for line in mine}
        wanted = {f"dispatch {observed.quick.name}", observed.quick.name, observed.ping.name}
        return by_name if wanted <= set(by_name) else None

    by_name = wait_for(spans_of_run, "the dispatch, run and step spans",
                       detail=lambda: f"\n--- spans ---\n{read_lines(spans_file)}\n--- log ---\n{sup.log()}")
    dispatch = by_name[f"dispatch {observed.quick.name}"]
    run_line = by_name[observed.quick.name]
    step_line = by_name[observed.ping.name]
    assert dispatch["pid"] == sup.pid
    assert run_line["pid"] == step_line["pid"] == child_pid != sup.pid
    assert run_line["trace_id"] == dispatch["trace_id"] == step_line["trace_id"]
    assert run_line["parent_id"] == dispatch["span_id"], "the child's run span continues the parent's trace"
    assert step_line["parent_id"] == run_line["span_id"]
    assert run_line["attributes"]["everystep.workflow.status"] == COMPLETED
    assert sup.stop() == 0, sup.log()
