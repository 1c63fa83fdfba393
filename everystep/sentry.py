"""Sentry reporting of failed runs; a no-op unless ``sentry_sdk`` is
importable *and* initialised by the host application.

Only genuine failures are reported: a run that ends ``failed`` (from inside
the runner) and engine-level failures (a run failed after its process kept
crashing, a run that crashed outside the runner). Never ``Terminal`` stops,
blocked runs, drain requeues or simulated crashes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .models import FAILED
from .context import Observer

if TYPE_CHECKING:
    from .context import Context
    from .models import Run

try:
    import sentry_sdk

    _AVAILABLE = True
except ImportError:  # pragma: no cover - exercised when the extra is absent
    # ``sentry_sdk`` stays unbound: every use is behind _active().
    _AVAILABLE = False


def _active() -> bool:
    if not _AVAILABLE:
        return False
    get_client = getattr(sentry_sdk, "get_client", None)
    if get_client is not None:
        return bool(get_client().is_active())
    return sentry_sdk.Hub.current.client is not None  # sentry-sdk 1.x


def report_failure(exc: BaseException, run_id: str, workflow: str, **extra: Any) -> None:
    """Capture ``exc`` with the run in an ``everystep`` context."""
    if not _active():
        return
    with sentry_sdk.new_scope() as scope:
        scope.set_context("everystep", {"run_id": run_id, "workflow": workflow, **extra})
        scope.set_tag("everystep.workflow", workflow)
        sentry_sdk.capture_exception(exc)


class SentryObserver(Observer):
    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        if status == FAILED and error is not None:
            report_failure(error, run.id, run.name)
