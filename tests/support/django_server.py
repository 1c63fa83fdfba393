"""The example Django project served by a real server process.

``django_server(project, "asgi")`` runs uvicorn on the project's ASGI
application, ``"wsgi"`` runs ``manage.py runserver --noreload`` (Django's
threaded WSGI server), each on a free loopback port with the project's
settings module, and yields the base URL once the server answers. The
server's output goes to a log file, shown when it fails to start.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from tests.support.django_project import MANAGE, Project

START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def django_server(project: Project, kind: str, settings_module: str | None = None) -> Iterator[str]:
    port = free_port()
    if kind == "asgi":
        command = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--port", str(port), "--log-level",
                   "warning", "--timeout-graceful-shutdown", "1", "shopsite.asgi:application"]
    else:
        command = [sys.executable, str(MANAGE), "runserver", "--noreload", "--skip-checks", f"127.0.0.1:{port}"]
    env = dict(project.env)
    if settings_module is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings_module
    log_path = project.directory / f"server-{kind}-{port}.log"
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, env=env, cwd=project.directory, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(url + "/admin/login/", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the {kind} server did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
