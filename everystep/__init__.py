"""everystep: durable workflows for Python, recorded step by step in SQL.

A run survives crashes, deploys and restarts by replaying its workflow from
the top and skipping the steps already recorded.
"""

from __future__ import annotations

from .api import (
    StepFunction,
    WorkflowFunction,
    get_run,
    get_steps,
    parallel,
    schedule,
    sleep,
    sleep_until,
    step,
    wait,
    workflow,
)
from .errors import (
    Cancelled,
    ClaimLost,
    DrainOrphan,
    EffectUncertain,
    EverystepError,
    RunNotFound,
    SimulatedCrash,
    StepFailure,
    StepKilled,
    StepResourceExceeded,
    StepTimeout,
    StoreMisconfigured,
    StoreUnavailable,
    Terminal,
    WorkflowArgumentsError,
    WorkflowCodeError,
)
from .models import Run, StepRecord
from .patches import deprecate_patch, patched
from .provider import set_connection_provider
from .transactional import step_connection

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
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
