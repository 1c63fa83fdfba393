"""Read-only Django models over everystep's own tables (unmanaged).

``everystep_workflow`` and ``everystep_step`` belong to everystep: its
migrations create them and only everystep writes them (every transition is
a compare-and-set the ORM knows nothing about), so these models never save
or delete, and Django never alters their tables. They exist for the admin
and for queries in your own code (``Run.objects.filter(status="blocked")``).

Run ids are ``uuid`` on PostgreSQL but hyphenated text on SQLite, where
Django's ``UUIDField`` would compare 32 bare hex digits and match nothing:
``RunIdField`` speaks each database's form, and its text lookups
(``icontains``, ``startswith``…) compare the hyphenated form on both.
Statuses carry no ``choices``: everystep's vocabulary (``everystep.models``)
is the one list, and a new status needs no Django migration. JSON columns are ``json`` on PostgreSQL (which psycopg parses) and text on
SQLite: ``StoredJSONField`` yields the stored JSON value either way (tagged
values such as datetimes stay tagged; ``decoded()`` rebuilds them).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db import models
from django.db.models import lookups

from everystep import serde


class RunIdField(models.UUIDField):
    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if value is None:
            return None
        if not isinstance(value, uuid.UUID):
            value = self.to_python(value)
        return value if connection.features.has_native_uuid_field else str(value)


# The plain text lookups, not UUIDField's (which strip hyphens on SQLite):
# PostgreSQL casts uuid to hyphenated text for them, SQLite stores it so.
for _lookup in (lookups.IExact, lookups.Contains, lookups.IContains, lookups.StartsWith,
                lookups.IStartsWith, lookups.EndsWith, lookups.IEndsWith):
    RunIdField.register_lookup(_lookup)


class StoredJSONField(models.TextField):
    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None or connection.vendor == "postgresql":
            return value  # psycopg parsed the json column (a JSON string is a str)
        return json.loads(value)


class ReadOnly(models.Model):
    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"{type(self).__name__} rows are written by everystep only; "
                        "use everystep.schedule() and everystep.admin")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{type(self).__name__} rows are written by everystep only")


class Run(ReadOnly):
    id = RunIdField(primary_key=True, editable=False)
    name = models.TextField("workflow")
    args = StoredJSONField()
    idempotency_key = models.TextField(null=True, blank=True)
    status = models.TextField()
    claimed_by = models.TextField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    result = StoredJSONField(null=True, blank=True)
    error = StoredJSONField(null=True, blank=True)
    created_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        managed = False
        db_table = "everystep_workflow"
        ordering = ["-created_at", "-id"]
        default_permissions = ("view",)
        permissions = [
            ("resolve_step", "Can resolve the uncertain step of a blocked run"),
            ("operate_console", "Can act in the everystep console (resolve, requeue, cancel, run again, kill, scale)"),
        ]

    def __str__(self) -> str:
        return f"{self.name} {self.id}"

    def decoded(self, column: str) -> Any:
        """``args`` or ``result`` as the workflow saw it (tagged values rebuilt)."""
        return serde.from_jsonable(getattr(self, column))

    @property
    def exception(self) -> BaseException | None:
        return serde.decode_exception(self.error)


class Step(ReadOnly):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.DO_NOTHING, db_column="workflow_id", db_constraint=False,
                            related_name="steps")
    step_id = models.TextField("step")
    name = models.TextField("function")
    args = StoredJSONField(null=True, blank=True)
    kwargs = StoredJSONField(null=True, blank=True)
    status = models.TextField()
    result = StoredJSONField(null=True, blank=True)
    error = StoredJSONField(null=True, blank=True)
    started_at = models.DateTimeField()
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        managed = False
        db_table = "everystep_step"
        ordering = ["-id"]
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"step {self.step_id} of {self.run_id}"

    def decoded(self, column: str) -> Any:
        return serde.from_jsonable(getattr(self, column))
