"""``everystep ui`` as a real process: its address on the first line, bad
command lines refused in one line with exit 2, loopback-only host names,
and a prompt clean exit on SIGTERM even with live streams open."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.timeout(120)


def ui(db_url: str, env: dict[str, str], *args: str, **options: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "everystep.cli", "ui", "--database", db_url, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)


def refused(db_url: str, env: dict[str, str], *args: str) -> str:
    process = ui(db_url, env, *args)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("everystep: error: "), err
    return lines[0]


def test_bad_command_lines(db_url: str, subprocess_env: dict[str, str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in refused(db_url, subprocess_env, "--port", str(port))
    assert "70000 is out of range: must be between 0 and 65535" in refused(db_url, subprocess_env, "--port", "70000")
    assert "would expose the console" in refused(db_url, subprocess_env, "--bind", "::")
    assert "cannot import app module" in refused(db_url, subprocess_env, "--app", "no.such.module")


def test_serves_then_stops_cleanly_with_streams_open(db_url: str, subprocess_env: dict[str, str]) -> None:
    process = ui(db_url, subprocess_env, "--port", "0", "--app", "tests.apps.shapes")
    try:
        first = process.stdout.readline()
        assert first.startswith("everystep console on http://127.0.0.1:"), first + process.stderr.read()
        url = first.split()[3]
        with httpx.Client(base_url=url, timeout=30) as client:
            meta = client.get("/api/meta").json()
            assert "tests.apps.shapes.linear" in meta["workflows"] and meta["code_loaded"]
            rebound = client.get("/api/meta", headers={"host": "evil.example"})
            assert rebound.status_code == 400
            assert client.get("/api/meta", headers={"host": "localhost:1234"}).status_code == 200
            opened = threading.Event()

            def listen() -> None:
                try:
                    with client.stream("GET", "/api/stream", params={"view": "runs"}) as stream:
                        for _ in stream.iter_lines():
                            opened.set()
                except httpx.HTTPError:
                    pass

            reader = threading.Thread(target=listen, daemon=True)
            reader.start()
            assert opened.wait(30), "the stream did not open"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            reader.join(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
