"""The HTTP server a supervisor or a threaded worker serves with
``--metrics-port``: ``/healthz`` and the worker's ``/metrics``.

A real ``everystep worker --metrics-port`` is scraped while it executes runs
of ``tests/apps/observed.py``. ``/healthz`` is watched, for a supervisor
and for a worker, while a private PostgreSQL cluster (owned by this module,
so it can be stopped) goes away and comes back. A port already taken is a
one-line error with exit code 2. The supervisor's selector-driven server
(``supervisor.http.LoopHTTPServer``) is driven in-process, over a store
whose ping can be made to fail, to show that it answers 503 in one line,
refuses what it does not serve and never stalls on a silent client.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import contextlib
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

from everystep import exposition, metrics, schedule
from everystep.errors import StoreUnavailable
from everystep.models import COMPLETED, FAILED
from everystep.store import connect
from supervisor.http import LoopHTTPServer
from tests.apps import observed
from tests.apps.observed import APP
from tests.support.pgserver import PgServer, start_server
from tests.support.scrape import (
    DEADLINE, LOCALHOST, free_port, http_get, metrics_args, scrape, scrape_until, try_get, wait_for,
)
from tests.support.supervisor import (  # noqa: F401 - supervisors is a fixture
    Supervisor,
    short_socket_dir,
    supervisor_command,
    supervisors,
    wait_run,
)

pytestmark = [pytest.mark.timeout(240), pytest.mark.backends("sqlite", "postgres")]


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
