"""A deploy, inside the test process: the workflows of one release module
take their registered names, as a supervisor started on that code would
see them. Tests of code changing under runs in flight (check-deploy,
patches, fork, replay) swap releases this way."""

from __future__ import annotations

import types

from everystep import registry
from everystep.api import WorkflowFunction


def deploy(module: types.ModuleType) -> None:
    """Register every workflow ``module`` defines under its name."""
    for value in vars(module).values():
        if isinstance(value, WorkflowFunction):
            registry.register_workflow(value.name, value)
