"""The optional integrations the runner always reports to: Prometheus
metrics, OpenTelemetry traces and Sentry, each a no-op when its package is
absent (or, for Sentry, not initialised)."""

from __future__ import annotations

from functools import cache

from . import traces
from .metrics import MetricsObserver
from .context import Observer
from .sentry import SentryObserver


@cache
def default_observers() -> tuple[Observer, ...]:
    observers: list[Observer] = [MetricsObserver(), SentryObserver()]
    if traces.available():
        observers.append(traces.TracingObserver())
    return tuple(observers)
