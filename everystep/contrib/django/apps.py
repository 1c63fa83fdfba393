"""The Django app: wires everystep into the project when Django starts."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db.models.signals import post_migrate

from everystep.provider import set_connection_provider
from everystep.transactional import set_transaction_provider


class EverystepConfig(AppConfig):
    name = "everystep.contrib.django"
    label = "everystep"
    verbose_name = "everystep"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Import ``EVERYSTEP["APPS"]`` (so workflows are registered in every
        process Django starts), lend Django's connection to ``schedule()``
        and have ``migrate`` apply everystep's schema. Safe to call again."""
        from . import checks, conf, migrate, provider, steps  # noqa: F401 - checks registers itself

        for module in conf.get().apps:
            try:
                importlib.import_module(module)
            except ImportError as exc:
                raise ImproperlyConfigured(f"EVERYSTEP['APPS'] names {module!r}, which cannot be imported: {exc}") from exc
        set_connection_provider(provider.django_connection)
        set_transaction_provider(steps.django_step_transaction)
        post_migrate.connect(migrate.migrate_schema, sender=self, dispatch_uid="everystep.contrib.django.migrate")
