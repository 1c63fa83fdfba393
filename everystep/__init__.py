"""everystep: durable workflows for Python, recorded step by step in SQL.

A run survives crashes, deploys and restarts by replaying its workflow from
the top and skipping the steps already recorded.
"""

from __future__ import annotations

from .api import (
    StepFunction,
    WorkflowFunction,
    call,
    get_event,
    get_run,
    get_steps,
    parallel,
    recv,
    schedule,
    send,
    set_event,
    sleep,
    sleep_until,
    start,
    step,
    wait,
    workflow,
)
from .errors import (
    Cancelled,
    ChildFailed,
    ChildTimeout,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    RecvTimeout,
    RunNotFound,
    SendRefused,
    SimulatedCrash,
    StepFailure,
    StepKilled,
    StepResourceExceeded,
    StepTimeout,
    StoreMisconfigured,
    StoreUnavailable,
    Terminal,
    WaitTimeout,
    WorkflowArgumentsError,
    WorkflowCodeError,
)
from .models import Run, StepRecord
from .patches import deprecate_patch, patched
from .waits import ChildHandle
from .provider import set_connection_provider
from .transactional import step_connection

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "ChildFailed",
    "ChildHandle",
    "ChildTimeout",
    "RecvTimeout",
    "SendRefused",
    "WaitTimeout",
    "call",
    "get_event",
    "recv",
    "send",
    "set_event",
    "start",
    "ClaimLost",
    "DrainOrphan",
    "EffectUncertain",
    "EverystepError",
    "Run",
    "RunNotFound",
    "SimulatedCrash",
    "StepFailure",
    "StepFunction",
    "StepKilled",
    "StepRecord",
    "StepResourceExceeded",
    "StepTimeout",
    "StoreMisconfigured",
    "StoreUnavailable",
    "Terminal",
    "WorkflowArgumentsError",
    "WorkflowCodeError",
    "WorkflowFunction",
    "get_run",
    "get_steps",
    "deprecate_patch",
    "parallel",
    "patched",
    "schedule",
    "set_connection_provider",
    "sleep",
    "sleep_until",
    "step",
    "step_connection",
    "wait",
    "workflow",
]
