"""OpenTelemetry tracing; a no-op unless ``opentelemetry-api`` is installed.

One span per run execution (named after the workflow), one child span per
executed step (replayed steps are not re-traced) and one per ``parallel``
fork, with the branches' steps nested under it across threads (branch
threads start in a copy of the caller's context). The supervisor parent
injects its trace context into the run it hands to a child, and the child
extracts it, so a run's trace continues across the process hop.

Failed runs and steps end with an error status; ``Terminal`` does not.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from .errors import Terminal
from .models import FAILED
from .context import Observer

if TYPE_CHECKING:
    from .context import Context
    from .models import Run

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Status, StatusCode

    _AVAILABLE = True
except ImportError:  # pragma: no cover - exercised when the extra is absent
    # The names above stay unbound: every use is behind available().
    _AVAILABLE = False

TRACER_NAME = "everystep"


def available() -> bool:
    return _AVAILABLE


def _tracer() -> Any:
    return trace.get_tracer(TRACER_NAME)


def _configured() -> bool:
    """Whether the host set a tracer provider; until it does, spans would be
    no-ops, and skipping them keeps the per-step cost at nothing."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


def _start(name: str, attributes: dict[str, Any]) -> tuple[Any, Any] | None:
    if not _configured():
        return None
    span = _tracer().start_span(name, attributes=attributes)
    token = otel_context.attach(trace.set_span_in_context(span))
    return span, token


def _end(handle: tuple[Any, Any] | None, error: BaseException | None, failed: bool) -> None:
    if handle is None:
        return
    span, token = handle
    if failed and error is not None and not isinstance(error, Terminal):
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"[:200]))
    try:
        span.end()
    finally:
        otel_context.detach(token)


class TracingObserver(Observer):
    def run_started(self, run: Run, ctx: Context) -> Any:
        return _start(run.name, {"everystep.workflow.id": run.id, "everystep.workflow.name": run.name})

    def run_finished(self, run: Run, ctx: Context, status: str, error: BaseException | None, token: Any) -> None:
        if token is not None:
            token[0].set_attribute("everystep.workflow.status", status)
        _end(token, error, failed=status == FAILED)

    def step_started(self, ctx: Context, step_id: str, name: str, timeout: float | None, unsafe: bool) -> Any:
        return _start(name, {"everystep.step.id": step_id, "everystep.step.name": name,
                             "everystep.workflow.id": ctx.workflow_id})

    def step_finished(self, ctx: Context, step_id: str, name: str, status: str,
                      error: BaseException | None, token: Any) -> None:
        if token is not None:
            token[0].set_attribute("everystep.step.status", status)
        _end(token, error, failed=error is not None)

    def fork_started(self, ctx: Context, fork_id: str, branches: int) -> Any:
        return _start(f"parallel {fork_id}", {"everystep.fork.id": fork_id, "everystep.fork.branches": branches,
                                              "everystep.workflow.id": ctx.workflow_id})

    def fork_finished(self, ctx: Context, fork_id: str, error: BaseException | None, token: Any) -> None:
        _end(token, error, failed=error is not None)


def inject() -> dict[str, str]:
    """The current trace context as W3C headers (empty without OTel)."""
    carrier: dict[str, str] = {}
    if _AVAILABLE and _configured():
        propagate.inject(carrier)
    return carrier


def attach_remote(carrier: dict[str, str] | None) -> Any:
    """Make ``carrier``'s trace context current; returns a token for ``detach``."""
    if not _AVAILABLE or not carrier:
        return None
    return otel_context.attach(propagate.extract(carrier))


def detach(token: Any) -> None:
    if token is not None:
        otel_context.detach(token)


def dispatch_span(run: Run) -> Any:
    """A short span in the supervisor parent around handing ``run`` to a child."""
    if not _AVAILABLE or not _configured():
        return nullcontext()
    return _tracer().start_as_current_span(
        f"dispatch {run.name}", attributes={"everystep.workflow.id": run.id, "everystep.workflow.name": run.name}
    )
