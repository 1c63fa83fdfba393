"""The operations console: a web UI over the database (extra ``everystep[ui]``).

``everystep.web.app(database_url=...)`` builds the ASGI application (mount
it in a host, or run ``everystep ui``). See ``app`` for the routes,
``views`` for what each page shows, ``live`` for what keeps pages current,
``actions`` for what an operator can do and ``security`` for who may.
"""

from __future__ import annotations

from .app import create_app as app

__all__ = ["app"]
