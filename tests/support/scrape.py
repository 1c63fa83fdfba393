"""Reading a real process's ``/metrics`` and ``/healthz`` over real HTTP.

The metrics tests start supervisors and workers with ``--metrics-port`` on a
free loopback port (``free_port``, ``metrics_args``) and read what they
serve: ``http_get`` returns error statuses as answers, ``try_get`` says None
while nothing listens yet, and ``Scrape`` parses one exposition page into
samples a test looks up by name and labels. ``scrape_until`` polls until a
page satisfies a predicate and quotes the last page when it never does.

Every wait polls with a generous deadline; nothing asserts on timing.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.support.waiting import wait_until

DEADLINE = 60.0
LOCALHOST = "127.0.0.1"


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

