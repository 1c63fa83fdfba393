"""Case 17's control: ``everystep-supervisor`` with its ``gc.freeze()``
recipe turned off (``supervisor.heap`` made inert), as the supervisor ran
before it froze its heap. For measurement only.

``python -m bench.nofreeze SUPERVISOR-ARGS…``
"""

from __future__ import annotations

import gc
import sys

from supervisor import cli, heap


def _nothing(*args: object, **kwargs: object) -> float:
    return 0.0


for _name in ("hold", "before_fork", "after_fork", "in_child", "reloading", "reloaded"):
    setattr(heap, _name, _nothing)
gc.enable()

if __name__ == "__main__":
    sys.exit(cli.main())
