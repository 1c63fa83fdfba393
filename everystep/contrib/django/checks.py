"""``manage.py check``: the EVERYSTEP setting and the database it names."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from . import conf, database


@checks.register()
def check_everystep_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        settings = conf.get()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="everystep.E001")]
    if settings.database not in connections.settings:
        return [checks.Error(
            f"EVERYSTEP['DATABASE'] is {settings.database!r}, which is not in DATABASES",
            hint=f"Use one of: {', '.join(connections.settings)}", id="everystep.E002",
        )]
    try:
        database.check_supported(connections[settings.database])
    except conf.UnsupportedDatabase as exc:
        return [checks.Error(str(exc), id="everystep.E003")]
    return []
