"""The ``EVERYSTEP`` setting, read at each use so ``override_settings`` works.

Keys: ``DATABASE`` (the ``DATABASES`` alias holding everystep's tables,
default ``"default"``), ``APPS`` (modules defining workflows, imported when
Django starts) and ``MIGRATE`` (whether ``manage.py migrate`` applies
everystep's schema, default ``True``; turn it off when the schema is managed
with ``everystep migrate`` alone) and ``CONSOLE_STREAM`` (whether the
mounted console streams live updates: ``None``, the default, streams when
Django is served over ASGI and polls under WSGI, where each open page would
hold a worker thread; ``True`` streams under both; ``False`` always polls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from everystep.errors import EverystepError

DEFAULTS: dict[str, Any] = {"DATABASE": "default", "APPS": [], "MIGRATE": True, "CONSOLE_STREAM": None}


class UnsupportedDatabase(EverystepError, ImproperlyConfigured):
    """The configured Django database is one everystep cannot use."""


@dataclass(frozen=True)
class EverystepSettings:
    database: str
    apps: tuple[str, ...]
    migrate: bool
    console_stream: bool | None = None


def get() -> EverystepSettings:
    """The validated ``EVERYSTEP`` setting; ``ImproperlyConfigured`` says what is wrong."""
    raw = getattr(settings, "EVERYSTEP", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"settings.EVERYSTEP must be a dict, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"settings.EVERYSTEP has unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(DEFAULTS)}"
        )
    values = {**DEFAULTS, **raw}
    database = values["DATABASE"]
    if not isinstance(database, str) or not database:
        raise ImproperlyConfigured("settings.EVERYSTEP['DATABASE'] must be a DATABASES alias (a string)")
    apps = values["APPS"]
    if isinstance(apps, str) or not isinstance(apps, (list, tuple)) or not all(
        isinstance(module, str) and module for module in apps
    ):
        raise ImproperlyConfigured("settings.EVERYSTEP['APPS'] must be a list of module names")
    if not isinstance(values["MIGRATE"], bool):
        raise ImproperlyConfigured("settings.EVERYSTEP['MIGRATE'] must be True or False")
    if values["CONSOLE_STREAM"] is not None and not isinstance(values["CONSOLE_STREAM"], bool):
        raise ImproperlyConfigured("settings.EVERYSTEP['CONSOLE_STREAM'] must be None (stream under ASGI only), "
                                   "True or False")
    return EverystepSettings(database=database, apps=tuple(apps), migrate=values["MIGRATE"],
                             console_stream=values["CONSOLE_STREAM"])
