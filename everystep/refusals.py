"""Functions a workflow body must not call, refused where they are defined.

``refused_in_body`` declares a function ``refused`` (``everystep.body_rules``)
and enforces it: called from a body it raises ``BodyCallRefused`` naming the
call to use instead, before anything is written. From a step's own code or
outside a workflow the function runs as always.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from .body_rules import BodyRule, declare
from .context import recording_context
from .errors import BodyCallRefused

F = TypeVar("F", bound=Callable[..., Any])


def refused_in_body(instead: str, note: str) -> Callable[[F], F]:
    """Declare the decorated function refused in a workflow body and enforce
    it: called from a body (not from a step's own code, nor outside a
    workflow), it raises ``BodyCallRefused`` naming ``instead``, before
    anything is written."""
    def refusing(fn: F) -> F:
        def refuse() -> None:
            if recording_context() is not None:
                raise BodyCallRefused(f"everystep.{fn.__name__}() must not be called in a workflow body: "
                                      f"{note.rstrip('.')}; use {instead}")

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def refused_async(*args: Any, **kwargs: Any) -> Any:
                refuse()
                return await fn(*args, **kwargs)
            wrapper: Any = refused_async
        else:
            @functools.wraps(fn)
            def refused(*args: Any, **kwargs: Any) -> Any:
                refuse()
                return fn(*args, **kwargs)
            wrapper = refused
        return declare(BodyRule.REFUSED, note, instead=instead)(wrapper)  # type: ignore[no-any-return]

    return refusing



__all__ = ["refused_in_body"]
