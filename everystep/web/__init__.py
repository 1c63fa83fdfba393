"""The operations console: a web UI over the database.

``everystep.web.app(database_url=...)`` builds the ASGI application (extra
``everystep[ui]``; mount it in a host, or run ``everystep ui``). Django
projects mount the same console with ``everystep.contrib.django.console``,
which needs no ASGI stack. See ``handlers`` for what each URL does, ``app``
for the ASGI routes, ``views`` for what each page shows, ``live`` for what
keeps pages current, ``actions`` for what an operator can do and
``security`` for who may.
"""

from __future__ import annotations

from typing import Any

from ..errors import EverystepError

try:
    from .app import create_app as app
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.partition(".")[0] != "starlette":
        raise
    _missing = exc

    def app(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
        """Stands in for the ASGI app when Starlette is not installed."""
        raise EverystepError("the console's ASGI app needs the ui extra: pip install 'everystep[ui]'") from _missing

__all__ = ["app"]
