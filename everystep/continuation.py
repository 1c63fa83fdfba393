"""``continue_as_new``: a run hands its work on to a new run, its history left behind.

A workflow that loops for ever (a subscription handling messages, an
account's lifecycle) replays its whole history on every resume, and that
history grows with every message. At a point of its choosing (every 500
messages, say) the body calls ``continue_as_new(*args, **kwargs)``: the body stops
there, and the run ends ``continued`` while a new run of the same workflow
starts with ``args``, in one transaction with the run's end
(``Store.continue_run``: queue, priority, concurrency key, parent, deadline
and idempotency key carried over, unconsumed messages moved, events
copied). The new run starts from an empty history.

It is called at the body's own top level only: not in a step's own code
(a step is recorded as a whole), not in a ``parallel`` branch (the other
branches would be cut off mid-flight), not outside a workflow. Its
arguments are checked against the workflow's signature and serialized
before anything is written; nothing after the call runs.
"""

from __future__ import annotations

from typing import Any, NoReturn

from . import new_run, serde
from .body_rules import BodyRule, declare
from .context import current, recording_context
from .errors import ContinuedAsNew, EverystepError


@declare(BodyRule.RECORDED, "Ends the run: its successor is started in the transaction that ends it, with the "
                            "unconsumed messages; nothing after the call runs.")
def continue_as_new(*args: Any, **kwargs: Any) -> NoReturn:
    """End this run ``continued`` and start a new run of its workflow with
    ``args`` and ``kwargs`` (see the module): a body's last act. Keywords
    are placed by the workflow's signature (a run's arguments are
    positional; the defaults of the parameters before them are filled in)."""
    ctx = recording_context()
    if ctx is None or ctx.prefix:
        where = ("in a step's own code" if current() is not None and ctx is None
                 else "in a parallel branch" if ctx is not None else "outside a workflow")
        raise EverystepError(f"continue_as_new() was called {where}: it may only be called in a workflow's body, "
                             "at its top level (it ends the run)")
    ex = ctx.execution
    ex.check_interrupt()
    arguments = new_run.positional(ex.run.name, args, kwargs)
    raise ContinuedAsNew(serde.dumps(arguments, f"arguments of the run continuing {ex.run.id}"))


__all__ = ["continue_as_new"]
