"""Observability: Prometheus metrics across processes, /healthz, OpenTelemetry
spans, Sentry reports and JSON logs.

The metrics tests scrape real processes over real HTTP: an
``everystep-supervisor --metrics-port`` whose children execute runs of
``tests/apps/observed.py`` (each step returns the pid that ran it), and an
``everystep worker --metrics-port``. ``/healthz`` is watched while a private
PostgreSQL cluster (owned by this module, so it can be stopped) goes away
and comes back. Tracing and Sentry run in-process against an SDK tracer
provider with an in-memory exporter and a capturing Sentry transport, and
across the supervisor's process hop through files the app module writes
when told to by environment variables.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from sentry_sdk.transport import Transport

from everystep import exposition, metrics, parallel, runner, schedule, sentry, step, traces, workflow
from everystep.errors import ChildCrashed, SimulatedCrash, StoreUnavailable, Terminal
from everystep.models import BLOCKED, COMPLETED, FAILED, STOPPED
from everystep.store import Store, connect
from supervisor.http import LoopHTTPServer
from tests.apps import observed
from tests.apps.observed import read_lines
from tests.support.pgserver import PgServer, start_server
from tests.support.runs import claim_run, crash_at, execute_run
from tests.support.waiting import wait_until
from tests.support.supervisor import (  # noqa: F401 - supervisors is a fixture
    Supervisor,
    short_socket_dir,
    supervisor_command,
    supervisors,
    wait_for_pids_gone,
    wait_run,
)

# Processes and subprocesses: MariaDB runs the engine modules only.
pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]

APP = "tests.apps.observed"
THREE_STEPS = observed.three_steps.name
STEP_NAMES = [observed.rendezvous.name, observed.held.name, observed.finish.name]
DEADLINE = 60.0
LOCALHOST = "127.0.0.1"


# -- helpers: waiting, HTTP, the exposition format ----------------------------------


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = DEADLINE,
             detail: Callable[[], str] = lambda: "") -> Any:
    """Poll until ``predicate()`` is truthy; return that value."""
    return wait_until(predicate, what, timeout, 0.1, detail)


def free_port() -> int:
    """A port nobody listens on right now (port 0 is not logged in a parseable way)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 15.0) -> tuple[int, str, str]:
    """(status, content type, body) of a GET; error statuses are answers too."""
    try:
        with urllib.request.urlopen(f"http://{LOCALHOST}:{port}{path}", timeout=timeout) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def try_get(port: int, path: str) -> tuple[int, str, str] | None:
    """Like ``http_get``, None while nothing answers yet."""
    try:
        return http_get(port, path)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


class Scrape:
    """One parsed ``/metrics`` page."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples: list[Sample] = [sample for family in self.families.values() for sample in family.samples]

    def matching(self, name: str, **labels: str) -> list[Sample]:
        return [sample for sample in self.samples
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample with exactly these labels (besides ``le``), or None."""
        found = [sample for sample in self.samples if sample.name == name
                 and {k: v for k, v in sample.labels.items()} == labels]
        assert len(found) <= 1, f"several samples of {name}{labels}: {found}"
        return found[0].value if found else None

    def total(self, name: str, **labels: str) -> float:
        return sum(sample.value for sample in self.matching(name, **labels))

    def label_values(self) -> set[str]:
        return {value for sample in self.samples if sample.name.startswith("everystep_")
                for value in sample.labels.values()}

    def type_of(self, family: str) -> str | None:
        return self.families[family].type if family in self.families else None


def scrape(port: int) -> Scrape:
    status, content_type, body = http_get(port, "/metrics")
    assert status == 200, body
    assert content_type.startswith("text/plain"), content_type
    return Scrape(body)


def scrape_until(port: int, predicate: Callable[[Scrape], Any], what: str,
                 timeout: float = DEADLINE, log: Callable[[], str] = lambda: "") -> Scrape:
    last: list[Scrape] = []

    def check() -> Scrape | None:
        current = scrape(port)
        last[:] = [current]
        return current if predicate(current) else None

    return wait_for(check, what, timeout,
                    lambda: f"\n--- last scrape ---\n{last[0].text if last else ''}{log()}")


def metrics_args(port: int) -> list[str]:
    return ["--metrics-port", str(port), "--metrics-bind", LOCALHOST]


def step_pids(store: Store, run_ids: list[str]) -> set[int]:
    return {record.result for run_id in run_ids for record in store.get_steps(run_id)}


# -- 1. a live supervisor, scraped ----------------------------------------------------


def test_supervisor_metrics_aggregate_both_children_and_the_queue(db_url, store, supervisors, tmp_path):
    port = free_port()
    began = time.time()
    sup = supervisors(db_url, procs=2, app=APP, args=metrics_args(port)).start()
    name = sup.name
    children = {child["pid"] for child in sup.status()["children"]}
    assert len(children) == 2

    # Ten runs; each waits at its first step until both children hold one,
    # then at its second step until the gate opens.
    work = {"dir": str(tmp_path), "children": 2, "gate": "go"}
    runs = [schedule(observed.three_steps, work, database=store) for _ in range(10)]
    run_ids = [run.id for run in runs]
    sup.wait_status(lambda s: sorted(c["step_id"] or "" for c in s["children"]) == ["2", "2"],
                    "both children held in step 2")

    # While runs execute in both children.
    during = scrape_until(port, lambda s: s.value("everystep_worker_inflight", runner=name) == 2,
                          "two runs in flight", log=sup.log)
    assert during.value("everystep_step_runs_total", workflow=THREE_STEPS, step=STEP_NAMES[0], status="done") == 2
    assert during.value("everystep_workflows_running") == 2
    assert during.value("everystep_workflows_pending") == 8
    # Every (workflow, status) series exists from the start, at 0 until a run ends.
    assert {sample.value for sample in during.matching("everystep_workflow_runs_total", workflow=THREE_STEPS)} == {0}

    (tmp_path / "go").touch()
    for run_id in run_ids:
        assert wait_run(store, run_id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    after = scrape_until(
        port, lambda s: s.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=COMPLETED) == 10
        and s.value("everystep_worker_inflight", runner=name) == 0,
        "ten completed runs counted and nothing in flight", log=sup.log)

    # Both children executed steps, and each step was counted exactly once.
    assert step_pids(store, run_ids) == children
    assert after.total("everystep_workflow_runs_total") == 10
    for step_name in STEP_NAMES:
        assert after.value("everystep_step_runs_total", workflow=THREE_STEPS, step=step_name, status="done") == 10
        assert after.value("everystep_step_duration_seconds_count", workflow=THREE_STEPS, step=step_name) == 10
        assert after.value("everystep_step_duration_seconds_bucket",
                           workflow=THREE_STEPS, step=step_name, le="+Inf") == 10
    assert after.total("everystep_step_runs_total") == 30
    assert after.type_of("everystep_workflow_duration_seconds") == "histogram"
    assert after.type_of("everystep_step_duration_seconds") == "histogram"
    assert after.value("everystep_workflow_duration_seconds_count", workflow=THREE_STEPS, status=COMPLETED) == 10
    # Durations are real seconds (a timezone slip would make them hours).
    elapsed = time.time() - began
    assert 0 < after.value("everystep_workflow_duration_seconds_sum", workflow=THREE_STEPS,
                           status=COMPLETED) <= 10 * elapsed
    assert 0 < after.total("everystep_step_duration_seconds_sum") <= 30 * elapsed
    assert after.value("everystep_worker_pool_size", runner=name) == 2
    assert after.value("everystep_worker_claims_total", runner=name) == 10
    # The claim after the last run finished found nothing, and says so.
    scrape_until(port, lambda s: (s.value("everystep_worker_empty_claims_total", runner=name) or 0) >= 1,
                 "an empty claim counted", log=sup.log)
    assert began - 5 <= after.value("everystep_worker_started_at_seconds", runner=name) <= time.time()
    assert after.value("everystep_supervisor_children", runner=name) == 2
    assert after.value("everystep_workflows_running") == 0
    assert after.value("everystep_workflows_blocked") == 0

    # Queue gauges are read from the database at scrape time: runs of a
    # workflow nobody serves stay pending.
    waiting = [schedule("no.such.workflow", {"n": n}, database=db_url).id for n in range(3)]
    queued = scrape_until(port, lambda s: s.value("everystep_workflows_pending") == 3
                          and s.value("everystep_workflows_oldest_pending_age_seconds") > 0,
                          "three pending runs with an age", log=sup.log)
    assert queued.value("everystep_workflows_running") == 0
    assert queued.value("everystep_workflows_blocked") == 0
    waiting += [schedule("no.such.workflow", {"n": n}, database=db_url).id for n in range(3, 5)]
    assert scrape(port).value("everystep_workflows_pending") == 5

    # A child killed -9 is replaced and counted as a crash; the counters it
    # wrote survive its death.
    victim = sorted(children)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for_pids_gone([victim])
    sup.wait_status(lambda s: len(s["children"]) == 2 and victim not in {c["pid"] for c in s["children"]}
                    and all(c["state"] == "idle" for c in s["children"]), "a replacement child")
    restarted = scrape_until(
        port, lambda s: s.value("everystep_supervisor_child_restarts_total", runner=name, reason="crash") == 1
        and s.value("everystep_supervisor_children", runner=name) == 2,
        "the crash counted and two children alive again", log=sup.log)
    assert restarted.total("everystep_supervisor_child_restarts_total") == 1
    assert restarted.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=COMPLETED) == 10
    assert restarted.total("everystep_step_runs_total") == 30

    # Control requests by command; an unknown command is "invalid", never
    # the string the client sent.
    before = scrape(port)
    for _ in range(2):
        assert sup.ctl({"cmd": "scale", "procs": 2})["ok"]
    assert not sup.ctl({"cmd": "kill", "run": "no-such-run"})["ok"]
    for junk in ("frobnicate", f"shutdown-{run_ids[0]}", "x" * 500):
        assert not sup.ctl({"cmd": junk})["ok"]
    counted = scrape(port)

    def delta(command: str) -> float:
        labels = {"runner": name, "command": command}
        return (counted.value("everystep_supervisor_control_requests_total", **labels) or 0) - (
            before.value("everystep_supervisor_control_requests_total", **labels) or 0)

    assert delta("scale") == 2
    assert delta("kill") == 1
    assert delta("invalid") == 3
    assert counted.value("everystep_supervisor_control_requests_total", runner=name, command="status") >= 1
    commands = {sample.labels["command"] for sample in counted.matching("everystep_supervisor_control_requests_total")}
    assert commands <= {"status", "kill", "scale", "reload", "drain", "invalid"}, commands

    # Labels never carry run ids.
    assert not counted.label_values() & set(run_ids + waiting)
    assert sup.stop() == 0, sup.log()


def test_supervisor_counts_timeouts_and_restarts_by_reason(db_url, store, supervisors, tmp_path):
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, args=metrics_args(port)).start()
    name = sup.name
    work = {"dir": str(tmp_path), "children": 1}

    timed_out = schedule(observed.sleepy_flow, work, database=store)
    assert wait_run(store, timed_out.id, (COMPLETED, FAILED), supervisor=sup).status == FAILED

    killed = schedule(observed.three_steps, {**work, "gate": "never-opened"}, database=store)
    busy = sup.busy_child(killed.id, "2")
    assert sup.ctl({"cmd": "kill", "run": killed.id})["ok"]
    assert wait_run(store, killed.id, (COMPLETED, FAILED), supervisor=sup).status == FAILED
    wait_for_pids_gone([busy["pid"]])

    idle = sup.wait_idle()["children"][0]["pid"]
    assert sup.ctl({"cmd": "reload"})["ok"]
    wait_for_pids_gone([idle])
    sup.wait_idle()

    page = scrape_until(
        port, lambda s: s.value("everystep_supervisor_child_restarts_total", runner=name, reason="recycle") == 1,
        "the reload counted as a recycle", log=sup.log)
    assert page.value("everystep_supervisor_child_restarts_total", runner=name, reason="timeout") == 1
    assert page.value("everystep_supervisor_child_restarts_total", runner=name, reason="kill") == 1
    assert page.total("everystep_supervisor_child_restarts_total") == 3
    assert page.value("everystep_supervisor_step_timeouts_total", runner=name) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.sleepy_flow.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=THREE_STEPS, status=FAILED) == 1
    assert page.value("everystep_supervisor_children", runner=name) == 1
    assert not page.label_values() & {timed_out.id, killed.id}
    assert sup.stop() == 0, sup.log()


def test_supervisor_counts_a_run_its_child_requeued_at_a_step_boundary(db_url, store, supervisors, tmp_path):
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, args=metrics_args(port)).start()
    run = schedule(observed.three_steps, {"dir": str(tmp_path), "children": 1, "gate": "go"}, database=store)
    busy = sup.busy_child(run.id, "2")
    assert sup.ctl({"cmd": "reload"})["ok"]  # the busy child drains: requeue after step 2
    (tmp_path / "go").touch()
    assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    pids = [record.result for record in sorted(store.get_steps(run.id), key=lambda r: r.step_id)]
    assert pids[:2] == [busy["pid"]] * 2 and pids[2] != busy["pid"], "requeued, then resumed in a new child"
    page = scrape_until(port, lambda s: s.value("everystep_workflow_runs_total", workflow=THREE_STEPS,
                                                status=COMPLETED) == 1, "the completed run", log=sup.log)
    assert page.value("everystep_worker_requeued_total", runner=sup.name) == 1


# -- 2. /healthz and the threaded worker --------------------------------------------------


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PgServer]:
    """A cluster this module owns (never an external server): tests stop it."""
    server = start_server(env_var="NO_SUCH_VAR_EVERYSTEP_OBSERVABILITY")
    assert server.owned
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def private_pg_url(private_pg: PgServer) -> Iterator[str]:
    private_pg.start()  # a no-op unless a previous test left it stopped
    url = private_pg.create_database()
    store = connect(url)
    try:
        store.migrate()
    finally:
        store.close()
    try:
        yield url
    finally:
        private_pg.start()
        private_pg.drop_database(url)


def everystep_command() -> list[str]:
    script = Path(sys.executable).parent / "everystep"
    return [str(script)] if script.exists() else [sys.executable, "-m", "everystep.cli"]


@contextlib.contextmanager
def worker_process(db_url: str, env: dict[str, str], workdir: Path, port: int, name: str,
                   pool: int = 2) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A real ``everystep worker --metrics-port``, killed with its group at the end."""
    log_path = workdir / f"worker-{name}.log"
    command = [*everystep_command(), "worker", "--app", APP, "--database", db_url, "--pool", str(pool),
               "--poll", "0.1", "--name", name, *metrics_args(port)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, log_path
    finally:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def _log_of(path: Path) -> Callable[[], str]:
    return lambda: f"\n--- log ---\n{path.read_text(errors='replace') if path.exists() else ''}"


def test_worker_serves_metrics_and_healthz(db_url, store, subprocess_env, tmp_path):
    port = free_port()
    name = "obs-worker"
    began = time.time()
    with worker_process(db_url, subprocess_env, tmp_path, port, name) as (proc, log_path):
        log = _log_of(log_path)
        assert wait_for(lambda: try_get(port, "/healthz"), "the worker's metrics server", detail=log) \
            == (200, "text/plain; charset=utf-8", "ok\n")
        runs = [schedule(observed.quick, {"dir": str(tmp_path)}, database=store) for _ in range(3)]
        for run in runs:
            assert wait_run(store, run.id, (COMPLETED, FAILED)).status == COMPLETED
        pending = [schedule("no.such.workflow", database=store).id for _ in range(2)]
        page = scrape_until(port, lambda s: s.value("everystep_workflow_runs_total",
                                                     workflow=observed.quick.name, status=COMPLETED) == 3,
                            "three completed runs counted", log=log)
        assert page.value("everystep_step_runs_total", workflow=observed.quick.name, step=observed.ping.name,
                          status="done") == 3
        assert page.value("everystep_worker_pool_size", runner=name) == 2
        assert page.value("everystep_worker_claims_total", runner=name) == 3
        assert began - 5 <= page.value("everystep_worker_started_at_seconds", runner=name) <= time.time()
        assert page.value("everystep_workflows_pending") == 2
        assert page.value("everystep_workflow_duration_seconds_count", workflow=observed.quick.name,
                          status=COMPLETED) == 3
        assert not page.label_values() & {*[run.id for run in runs], *pending}
        assert http_get(port, "/nope")[0] == 404
        # The worker's server is threaded: a client that connects and says
        # nothing does not keep others from being answered.
        with socket.create_connection((LOCALHOST, port), timeout=10):
            assert http_get(port, "/healthz")[:2] == (200, "text/plain; charset=utf-8")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE) == 0, log()


def _outage_runner(kind: str, url: str, env: dict[str, str], workdir: Path, port: int,
                   supervisors: Callable[..., Supervisor]) -> contextlib.AbstractContextManager[Any]:
    if kind == "worker":
        return worker_process(url, env, workdir, port, "outage-worker")

    @contextlib.contextmanager
    def supervisor() -> Iterator[Supervisor]:
        yield supervisors(url, procs=1, app=APP, args=metrics_args(port)).start()

    return supervisor()


@pytest.mark.parametrize("kind", ["supervisor", "worker"])
def test_healthz_flips_to_503_while_the_database_is_away(kind, private_pg, private_pg_url, subprocess_env,
                                                         tmp_path, supervisors):
    port = free_port()
    with _outage_runner(kind, private_pg_url, subprocess_env, tmp_path, port, supervisors) as handle:
        log = handle.log if isinstance(handle, Supervisor) else _log_of(handle[1])
        assert wait_for(lambda: try_get(port, "/healthz"), "the metrics server", detail=log)[0::2] == (200, "ok\n")

        alive = handle.alive if isinstance(handle, Supervisor) else lambda: handle[0].poll() is None

        def outage_reported() -> tuple[int, str, str] | None:
            assert alive(), f"the {kind} died when the database went away{log()}"
            answer = try_get(port, "/healthz")
            return answer if answer and answer[0] == 503 else None

        private_pg.stop()
        status, content_type, body = wait_for(outage_reported, "/healthz to report the outage", detail=log)
        assert content_type.startswith("text/plain")
        assert body.endswith("\n") and body.count("\n") == 1, repr(body)
        assert body.startswith("database unreachable"), body
        # The process serving it is alive, and so is /metrics.
        assert scrape(port).value("everystep_worker_pool_size", runner=handle.name if isinstance(
            handle, Supervisor) else "outage-worker") is not None

        private_pg.start()
        wait_for(lambda: (try_get(port, "/healthz") or (0,))[0] == 200, "/healthz to recover", detail=log)
        assert http_get(port, "/healthz")[0::2] == (200, "ok\n")
        assert alive(), log()
        if isinstance(handle, Supervisor):
            assert handle.stop() == 0, log()
        else:
            handle[0].send_signal(signal.SIGTERM)
            assert handle[0].wait(timeout=DEADLINE) == 0, log()


@pytest.mark.parametrize("kind", ["supervisor", "worker"])
def test_a_metrics_port_in_use_is_a_one_line_error(kind, db_url, subprocess_env, tmp_path):
    socket_dir = short_socket_dir()  # tmp_path may be too long for a Unix socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
            taken.bind((LOCALHOST, 0))
            taken.listen()
            port = taken.getsockname()[1]
            if kind == "supervisor":
                command = [*supervisor_command(), "--app", APP, "--database", db_url, "--procs", "1",
                           "--socket", str(socket_dir / "ctl.sock"), *metrics_args(port)]
            else:
                command = [*everystep_command(), "worker", "--app", APP, "--database", db_url,
                           *metrics_args(port)]
            done = subprocess.run(command, env=subprocess_env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=DEADLINE, start_new_session=True)
        assert not list(socket_dir.iterdir()), "the control socket is removed"
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [errors[-1]] and f"cannot serve metrics on {LOCALHOST}:{port}" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


def test_the_supervisors_loop_server_answers_503_with_one_line_and_never_stalls(store, monkeypatch):
    """``supervisor.http.LoopHTTPServer`` driven by a selector loop like the
    arbiter's, in-process, over a store whose ping can be made to fail."""
    selector = selectors.DefaultSelector()
    server = LoopHTTPServer(LOCALHOST, 0, selector, lambda path: exposition.respond(path, store), timeout=1.0)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for key, mask in selector.select(0.05):
                key.data(mask)
            server.sweep(time.monotonic())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        assert http_get(server.port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        assert http_get(server.port, "/health?probe=1")[0] == 200

        def unreachable() -> None:
            raise StoreUnavailable("connection refused\n\tIs the server running on that host?")

        monkeypatch.setattr(store, "ping", unreachable)
        monkeypatch.setattr(store, "queue_stats", unreachable)
        status, content_type, body = http_get(server.port, "/healthz")
        assert status == 503 and content_type.startswith("text/plain")
        assert body == "database unreachable: connection refused\n"
        # /metrics still renders (without fresh queue gauges) while the database is away.
        metrics.get()
        assert scrape(server.port).type_of("everystep_workflows_pending") == "gauge"
        monkeypatch.undo()
        assert http_get(server.port, "/healthz")[0] == 200

        assert http_get(server.port, "/elsewhere")[0] == 404
        request = urllib.request.Request(f"http://{LOCALHOST}:{server.port}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=15)
        assert refused.value.code == 405
        # A client that connects and never sends a request neither blocks
        # the others nor stays connected past the timeout.
        with socket.create_connection((LOCALHOST, server.port), timeout=15) as dawdler:
            assert http_get(server.port, "/healthz")[0] == 200
            assert dawdler.recv(1) == b"", "dropped after the timeout"
        assert wait_for(lambda: server.fds() == [server.listener.fileno()], "every connection closed")
    finally:
        stop.set()
        thread.join(timeout=30)
        server.close()
        selector.close()


# -- 3. the host-application helper ---------------------------------------------------------


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


CALLS: list[str] = []
PROBE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset_probes() -> Iterator[None]:
    CALLS.clear()
    PROBE.clear()
    yield
    runner.fault = None


@step
def t_step(label: str) -> str:
    CALLS.append(label)
    return label


@step
def t_branch(label: str) -> str:
    CALLS.append(label)
    return threading.current_thread().name


@step
def t_boom(label: str) -> None:
    CALLS.append(label)
    raise ValueError(f"boom: {label}")


@step
def t_stop(label: str) -> None:
    CALLS.append(label)
    raise Terminal("customer cancelled", {"label": label})


@step(unsafe_to_repeat=True)
def t_charge(label: str) -> str:
    CALLS.append(label)
    return f"charged {label}"


@step
def t_drain_here(label: str) -> str:
    CALLS.append(label)
    PROBE["draining"].set()
    return label


@workflow
def traced(label: str) -> list[str]:
    first = t_step(f"{label}:first")
    left, right = parallel(lambda: t_branch(f"{label}:left"), lambda: t_branch(f"{label}:right"))
    last = t_step(f"{label}:last")
    return [first, left, right, last]


@workflow
def failing(label: str) -> None:
    t_step(f"{label}:first")
    t_boom(label)


@workflow
def stopping(label: str) -> None:
    t_step(f"{label}:first")
    t_stop(label)
    t_step(f"{label}:never")


@workflow
def charging(label: str) -> str:
    t_step(f"{label}:first")
    return t_charge(label)


@workflow
def draining(label: str) -> list[str]:
    return [t_drain_here(f"{label}:first"), t_step(f"{label}:second")]


def make_blocked(store: Store, label: str) -> str:
    """A run blocked the real way: a crash in its unsafe step's effect
    window, then a replay."""
    run = schedule(charging, label, database=store)
    crash_at("2")
    with pytest.raises(SimulatedCrash):
        execute_run(store, run.id)
    assert store.requeue(store.get_run(run.id).claim_as("tester"))
    assert execute_run(store, run.id) == BLOCKED
    return run.id


def test_refresh_queue_gauges_reads_the_database_for_a_host_app(store):
    blocked = make_blocked(store, "gauges")
    held = schedule(traced, "held", database=store)
    claim_run(store, held.id)  # running, not executed
    for n in range(3):
        schedule("no.such.workflow", n, database=store)
    wait_for(lambda: store.queue_stats()["oldest_pending_age_seconds"] > 0, "a measurable queue age")

    metrics.refresh_queue_gauges(store)

    assert sample("everystep_workflows_pending") == 3
    assert sample("everystep_workflows_running") == 1
    assert sample("everystep_workflows_blocked") == 1
    assert sample("everystep_workflows_oldest_pending_age_seconds") > 0
    assert store.get_run(blocked).status == BLOCKED

    # Refreshed again after the database changed, not accumulated.
    schedule("no.such.workflow", 4, database=store)
    metrics.refresh_queue_gauges(store)
    assert sample("everystep_workflows_pending") == 4
    assert sample("everystep_workflows_running") == 1


def test_run_and_step_counters_by_status_in_process(store):
    def counts() -> dict[str, float]:
        return {
            "completed": sample("everystep_workflow_runs_total", workflow=traced.name, status=COMPLETED),
            "failed": sample("everystep_workflow_runs_total", workflow=failing.name, status=FAILED),
            "stopped": sample("everystep_workflow_runs_total", workflow=stopping.name, status=STOPPED),
            "blocked": sample("everystep_workflow_runs_total", workflow=charging.name, status=BLOCKED),
            "charging-failed": sample("everystep_workflow_runs_total", workflow=charging.name, status=FAILED),
            "boom": sample("everystep_step_runs_total", workflow=failing.name, step=t_boom.name, status="failed"),
            "branches": sample("everystep_step_runs_total", workflow=traced.name, step=t_branch.name, status="done"),
            "draining": sample("everystep_workflow_runs_total", workflow=draining.name, status="requeued"),
        }

    before = counts()
    assert execute_run(store, schedule(traced, "count", database=store).id) == COMPLETED
    assert execute_run(store, schedule(failing, "count", database=store).id) == FAILED
    assert execute_run(store, schedule(stopping, "count", database=store).id) == STOPPED
    make_blocked(store, "count")
    PROBE["draining"] = threading.Event()
    assert execute_run(store, schedule(draining, "count", database=store).id,
                       draining=PROBE["draining"]) == runner.REQUEUED
    after = counts()

    assert after["completed"] - before["completed"] == 1
    assert after["failed"] - before["failed"] == 1
    assert after["stopped"] - before["stopped"] == 1
    assert after["blocked"] - before["blocked"] == 1
    assert after["charging-failed"] == before["charging-failed"], "a simulated crash is not a failure"
    assert after["boom"] - before["boom"] == 1
    assert after["branches"] - before["branches"] == 2
    assert after["draining"] == before["draining"] == 0, "requeued is not a terminal status"


# -- 4. OpenTelemetry ------------------------------------------------------------------------


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


# -- 5. Sentry ---------------------------------------------------------------------------------


class CapturingTransport(Transport):
    """Keeps every envelope in memory instead of sending it."""

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.envelopes: list[Any] = []

    def capture_envelope(self, envelope: Any) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[dict[str, Any]]:
        return [event for envelope in self.envelopes for item in envelope.items
                if (event := item.get_event()) is not None]


@contextlib.contextmanager
def sentry_capturing() -> Iterator[CapturingTransport]:
    sentry_sdk.init(dsn="https://public@o0.ingest.sentry.io/0", transport=CapturingTransport)
    client = sentry_sdk.get_client()
    transport = client.transport
    assert isinstance(transport, CapturingTransport)
    try:
        yield transport
    finally:
        client.close()
        sentry_sdk.get_global_scope().set_client(None)
        assert not sentry_sdk.get_client().is_active()


@pytest.fixture
def sentry_events() -> Iterator[CapturingTransport]:
    with sentry_capturing() as transport:
        yield transport


def exception_types(event: dict[str, Any]) -> list[str]:
    return [value["type"] for value in event.get("exception", {}).get("values", [])]


def test_sentry_captures_a_failed_run_with_its_everystep_context(store, sentry_events):
    run = schedule(failing, "sentry", database=store)
    assert execute_run(store, run.id) == FAILED

    events = sentry_events.events()
    assert len(events) == 1, events
    event = events[0]
    assert event["contexts"]["everystep"] == {"run_id": run.id, "workflow": failing.name}
    assert event["tags"]["everystep.workflow"] == failing.name
    assert exception_types(event)[-1] == "ValueError"
    assert "boom: sentry" in event["exception"]["values"][-1]["value"]


def test_sentry_hears_nothing_of_stops_blocks_drains_or_simulated_crashes(store, sentry_events):
    assert execute_run(store, schedule(stopping, "stop", database=store).id) == STOPPED
    blocked = make_blocked(store, "block")  # a SimulatedCrash, then a blocked replay
    PROBE["draining"] = threading.Event()
    drained = schedule(draining, "drain", database=store)
    assert execute_run(store, drained.id, draining=PROBE["draining"]) == runner.REQUEUED
    crashed = schedule(traced, "crash", database=store)
    crash_at("1")
    with pytest.raises(SimulatedCrash):
        execute_run(store, crashed.id)

    assert store.get_run(blocked).status == BLOCKED
    assert CALLS.count("drain:first") == 1 and "drain:second" not in CALLS, "drained after its first step"
    assert sentry_events.events() == []
    assert sentry_events.envelopes == []


def test_sentry_not_initialised_is_a_quiet_no_op(store):
    assert not sentry_sdk.get_client().is_active()
    run = schedule(failing, "no-sentry", database=store)
    assert execute_run(store, run.id) == FAILED
    sentry.report_failure(ValueError("nobody listens"), run.id, failing.name)


def test_report_failure_carries_engine_level_failures(sentry_events):
    crash = ChildCrashed("the process running this run died 3 times; last: killed by SIGKILL")
    sentry.report_failure(crash, "run-123", "app.flows.provision", runner="sup-a")

    [event] = sentry_events.events()
    assert event["contexts"]["everystep"] == {"run_id": "run-123", "workflow": "app.flows.provision",
                                              "runner": "sup-a"}
    assert exception_types(event)[-1] == "ChildCrashed"
    # The scope is per report: nothing leaks into the next event.
    sentry_sdk.capture_message("unrelated")
    assert "everystep" not in sentry_events.events()[-1].get("contexts", {})


def test_supervisor_reports_child_and_engine_failures_to_sentry(db_url, store, supervisors, subprocess_env,
                                                                 tmp_path):
    events_file = tmp_path / "sentry.jsonl"
    env = {**subprocess_env, observed.SENTRY_ENV: str(events_file)}
    port = free_port()
    sup = supervisors(db_url, procs=1, app=APP, env=env, args=["--max-crashes", "1", *metrics_args(port)]).start()
    work = {"dir": str(tmp_path)}
    failed = schedule(observed.fails, work, database=store)
    stopped = schedule(observed.stops, work, database=store)
    crashed = schedule(observed.suicide_flow, work, database=store)
    assert wait_run(store, failed.id, (COMPLETED, FAILED, STOPPED), supervisor=sup).status == FAILED
    assert wait_run(store, stopped.id, (COMPLETED, FAILED, STOPPED), supervisor=sup).status == STOPPED
    dead = wait_run(store, crashed.id, (COMPLETED, FAILED, STOPPED), supervisor=sup)
    assert dead.status == FAILED and dead.error["type"] == "everystep.errors.ChildCrashed"

    lines = wait_for(lambda: (lambda found: found if len(found) >= 2 else None)(read_lines(events_file)),
                     "two Sentry events", detail=lambda: f"\n--- log ---\n{sup.log()}")
    sup.wait_idle()
    lines = read_lines(events_file)
    by_run = {line["event"]["contexts"]["everystep"]["run_id"]: line for line in lines}
    assert len(lines) == 2 and set(by_run) == {failed.id, crashed.id}, lines
    child_report = by_run[failed.id]
    assert child_report["pid"] != sup.pid, "a failure inside the runner is reported by the child"
    assert child_report["event"]["contexts"]["everystep"]["workflow"] == observed.fails.name
    assert exception_types(child_report["event"])[-1] == "ValueError"
    engine_report = by_run[crashed.id]
    assert engine_report["pid"] == sup.pid, "a crash is reported by the parent"
    assert engine_report["event"]["contexts"]["everystep"] == {
        "run_id": crashed.id, "workflow": observed.suicide_flow.name, "runner": sup.name}
    assert exception_types(engine_report["event"])[-1] == "ChildCrashed"
    # The parent counts the run it failed; the child counted the others.
    page = scrape(port)
    assert page.value("everystep_workflow_runs_total", workflow=observed.suicide_flow.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.fails.name, status=FAILED) == 1
    assert page.value("everystep_workflow_runs_total", workflow=observed.stops.name, status=STOPPED) == 1
    assert page.value("everystep_supervisor_child_restarts_total", runner=sup.name, reason="crash") == 1
    assert sup.stop() == 0, sup.log()


# -- 6. JSON logs ------------------------------------------------------------------------------


def test_supervisor_json_logs_carry_run_workflow_and_child_pid(db_url, store, supervisors, tmp_path):
    # Completed runs are logged at DEBUG (a burst must not flood the log).
    sup = supervisors(db_url, procs=2, app=APP, args=["--log-format", "json", "--log-level", "debug"]).start()
    children = {child["pid"] for child in sup.status()["children"]}
    runs = [schedule(observed.quick, {"dir": str(tmp_path)}, database=store) for _ in range(3)]
    for run in runs:
        assert wait_run(store, run.id, (COMPLETED, FAILED), supervisor=sup).status == COMPLETED
    assert sup.stop() == 0

    lines = [line for line in sup.log().splitlines() if line.strip()]
    records = []
    for line in lines:
        record = json.loads(line)
        assert isinstance(record, dict), line
        assert {"level", "message", "pid"} <= set(record), line
        assert record["level"] in {"debug", "info", "warning", "error", "critical"}
        records.append(record)
    for run in runs:
        ran_in = store.get_steps(run.id)[0].result
        [done] = [record for record in records if record.get("run_id") == run.id
                  and record.get("event") == "run_completed"]
        assert done["workflow"] == observed.quick.name
        assert done["pid"] == sup.pid, "the parent logs the lifecycle"
        assert done["child_pid"] == ran_in
        assert ran_in in children
        assert run.id in done["message"]
    started = {record["child_pid"] for record in records if record.get("event") == "child_started"}
    assert children <= started
