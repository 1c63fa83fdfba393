"""Step budgets and costs in the engine, in-process: declaring limits, the
threaded worker refusing them, the cost a child's meter measures around a
step (``supervisor.meter.ChildMeter`` run here without any budget, so this
process's limits stay untouched), the cost columns on both backends and
``everystep show``. The supervisor's enforcement is tested with real
processes in ``test_step_budgets.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from everystep import cli, registry, schedule, step, workflow
from everystep.errors import EverystepError, StepResourceExceeded
from everystep.models import STEP_DONE
from everystep.resources import (
    Resource,
    exceeded_message,
    format_cpu,
    format_size,
    parse_cpu,
    parse_size,
    run_cost,
)
from everystep.serde import decode_exception, encode_exception
from everystep.store import Store
from everystep.worker import Worker
from supervisor.meter import ChildMeter
from tests.support.runs import execute_run

MIB = 1 << 20


# -- declaring limits ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "size"), [
    ("512M", 512 * MIB), ("1.5G", 1536 * MIB), ("256MiB", 256 * MIB), ("2gb", 2 << 30), ("64k", 64 << 10),
    ("4096", 4096), (4096, 4096), (" 1T ", 1 << 40),
])
def test_sizes_are_powers_of_1024(text: Any, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1M", "0", 0, "1.5.2G", "12X", True, None, 1.5])
def test_bad_sizes_are_refused_with_the_expected_form(text: Any) -> None:
    with pytest.raises(EverystepError, match="memory_limit must be|more than 0 bytes"):
        parse_size(text)


@pytest.mark.parametrize("value", [0, -1, "soon", float("inf"), float("nan"), True])
def test_bad_cpu_limits_are_refused(value: Any) -> None:
    with pytest.raises(EverystepError, match="cpu_limit must be a positive number of CPU seconds"):
        parse_cpu(value)


def test_sizes_read_back_for_people() -> None:
    assert [format_size(n) for n in (100, 64 << 10, 256 * MIB, 1536 * MIB, 300 * MIB + 1)] == [
        "100 B", "64 KiB", "256 MiB", "1.5 GiB", "300.0 MiB"]


@pytest.fixture
def own_limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Steps declared with limits here stay out of the process-wide registry
    (a threaded worker started by another test would refuse them)."""
    monkeypatch.setattr(registry, "_limited_steps", {})
    yield


def test_a_step_declares_its_budget_and_the_registry_knows_it(own_limits: None) -> None:
    @step(memory_limit="512M", cpu_limit=30)
    def resize(path: str) -> str:
        return path

    assert (resize.memory_limit, resize.cpu_limit) == (512 * MIB, 30.0)
    assert resize("x.png") == "x.png"  # outside a workflow: a plain call
    assert registry.limited_steps() == {resize.name: "memory_limit=512 MiB, cpu_limit=30s"}

    @step(timeout=5)
    def plain() -> None: ...

    assert plain.memory_limit is None and plain.cpu_limit is None
    assert plain.name not in registry.limited_steps()
    with pytest.raises(EverystepError, match="memory_limit must be a size like 512M or 2G, not 'half'"):
        step(memory_limit="half")
    with pytest.raises(EverystepError, match="cpu_limit must be a positive number"):
        step(cpu_limit=0)


def test_the_threaded_worker_refuses_to_start_while_a_step_declares_a_limit(own_limits: None, tmp_path) -> None:
    @step(cpu_limit=1)
    def bounded() -> None: ...

    worker = Worker(database=f"sqlite:///{tmp_path / 'w.db'}", name="refusing")
    with pytest.raises(EverystepError) as caught:
        worker.run()
    assert str(caught.value) == (
        "the threaded worker cannot enforce step resource limits (its runs share one process): "
        f"{bounded.name} (cpu_limit=1s); run these workflows with everystep-supervisor")
    try:
        assert worker.store.list_runners() == []  # it refused before taking its name
    finally:
        worker.store.close()


def test_the_error_round_trips_with_its_resource_limit_and_peak() -> None:
    message = exceeded_message("2", "app.hog", Resource.MEMORY, 256 * MIB, 300 * MIB, "killed")
    assert message == "step 2 (app.hog) exceeded its memory limit of 256 MiB (peak 300 MiB above its start): killed"
    error = StepResourceExceeded(message, "memory", 256 * MIB, 300 * MIB)
    back = decode_exception(encode_exception(error))
    assert isinstance(back, StepResourceExceeded) and str(back) == message
    assert (back.resource, back.limit, back.peak) == ("memory", 256 * MIB, 300 * MIB)


# -- measuring --------------------------------------------------------------------------


@step
def burn(seconds: float) -> float:
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass
    return time.thread_time() - start


@step
def touch(mb: int) -> int:
    block = bytearray(mb * MIB)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    return len(block)


@step(unsafe_to_repeat=True)
def touch_once(mb: int) -> int:
    return int(touch.fn(mb))


@workflow
def measured(spec: dict[str, Any]) -> list[Any]:
    return [burn(spec["cpu"]), touch(spec["mb"]), touch_once(spec["mb"])]


@pytest.fixture
def meter() -> Iterator[ChildMeter]:
    meter = ChildMeter()
    try:
        yield meter
    finally:
        meter.close()


def test_a_meter_measures_every_step_and_the_rows_keep_it(store: Store, meter: ChildMeter) -> None:
    run = schedule(measured, {"cpu": 0.3, "mb": 48}, database=store)

    # In a child the meter sees the step alone; here it shares the test
    # process with whatever other threads run, so it is bounded by the CPU
    # the whole process used meanwhile, not by a guess on a loaded machine.
    before = time.process_time()
    assert execute_run(store, run.id, meter=meter) == "completed"
    used = time.process_time() - before

    burned, touched, once = store.get_steps(run.id)
    assert 0.2 <= burned.cpu_seconds <= used + 0.05, (burned.cpu_seconds, used)
    assert burned.peak_rss_bytes < 8 * MIB
    # The unsafe step's cost is written with its outcome, onto its started row.
    for record in (touched, once):
        assert record.status == STEP_DONE
        assert 40 * MIB <= record.peak_rss_bytes <= 80 * MIB, record.peak_rss_bytes
        assert record.cpu_seconds is not None and record.cpu_seconds <= used + 0.05
    cost = run_cost([burned, touched, once])
    assert cost is not None and cost.measured_steps == 3
    assert cost.cpu_seconds == pytest.approx(burned.cpu_seconds + touched.cpu_seconds + once.cpu_seconds)
    assert cost.peak_rss_bytes == max(touched.peak_rss_bytes, once.peak_rss_bytes)


def test_without_a_meter_nothing_is_measured(store: Store) -> None:
    run = schedule(measured, {"cpu": 0.01, "mb": 1}, database=store)
    assert execute_run(store, run.id) == "completed"
    assert [(r.cpu_seconds, r.peak_rss_bytes) for r in store.get_steps(run.id)] == [(None, None)] * 3
    assert run_cost(store.get_steps(run.id)) is None


def test_show_prints_each_step_cost_and_the_run_total(store: Store, meter: ChildMeter, capsys) -> None:
    run = schedule(measured, {"cpu": 0.05, "mb": 8}, database=store)
    execute_run(store, run.id, meter=meter)
    steps = store.get_steps(run.id)

    assert cli.main(["show", run.id, "--database", store.url, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(s["cpu_seconds"], s["peak_rss_bytes"]) for s in shown["steps"]] == [
        (s.cpu_seconds, s.peak_rss_bytes) for s in steps]
    assert shown["cost"] == {"cpu_seconds": pytest.approx(sum(s.cpu_seconds or 0 for s in steps)),
                             "peak_rss_bytes": max(s.peak_rss_bytes or 0 for s in steps), "measured_steps": 3}

    assert cli.main(["show", run.id, "--database", store.url]) == 0
    text = capsys.readouterr().out
    total = run_cost(steps)
    assert total is not None
    assert f"cost       {format_cpu(total.cpu_seconds)} CPU in 3 measured step(s); largest peak RSS growth " \
           f"{format_size(total.peak_rss_bytes)}" in text
    rows = [line.split() for line in text.splitlines()[text.splitlines().index("") + 1:]]
    assert rows[0] == ["STEP", "STATUS", "FUNCTION", "CPU", "PEAK", "RSS", "OUTCOME"]
    assert [row[0] for row in rows[1:]] == ["1", "2", "3"]


def test_show_leaves_the_cost_out_where_nothing_measured(store: Store, capsys) -> None:
    run = schedule(measured, {"cpu": 0.01, "mb": 1}, database=store)
    execute_run(store, run.id)
    assert cli.main(["show", run.id, "--database", store.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["cost"] is None
    assert cli.main(["show", run.id, "--database", store.url]) == 0
    text = capsys.readouterr().out
    assert "cost " not in text and "STEP  STATUS  FUNCTION" in text and "CPU" not in text
